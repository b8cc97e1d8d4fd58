"""Input the fuse cannot store (lone surrogates, label values that are not strings) is refused with
400 and changes nothing; a change that fails while being stored is rolled back, in memory and on disk,
so the service keeps answering."""

from __future__ import annotations

import json

import pytest
from _fuse_support import PEOPLE, SPEC, TOKEN, alert, fuse_client, payload

from fusebox.fuse.adapters.gateway import DryRun
from fusebox.fuse.intake.breaker import OverrideError
from fusebox.fuse.intake.payload import AlertEvent, Notification, PayloadError, parse_payload
from fusebox.fuse.rules import FuseRules
from fusebox.fuse.service import FuseService
from fusebox.fuse.store import Store
from fusebox.spec import load_spec

WEBHOOK = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
PERSON = {"Authorization": f"Bearer {PEOPLE['alice']}", "Content-Type": "application/json"}
GPU = {"cluster": "a", "hw_id": "GPU-1"}
T0 = 1_700_000_000.0
LONE = "\udfff"  # a lone low surrogate: valid in a JSON string (\udfff), not encodable as UTF-8


@pytest.fixture
def client(svc):
    # a server error is answered 500, as uvicorn would, instead of raised into the test
    return fuse_client(svc, raise_server_exceptions=False)


def _raw(doc: dict) -> bytes:
    """JSON with non-ASCII escaped (``\\udfff``), as a sender would put a lone surrogate on the wire."""
    return json.dumps(doc, ensure_ascii=True).encode("ascii")


def _override(**change) -> dict:
    body = {"scope": dict(GPU), "level": 1, "mode": "trip", "reason": "maintenance", "expires_in_s": 600}
    body.update(change)
    return body


def _service_still_works(client, svc) -> None:
    """/state, / and a valid notification answer as usual; the valid notification is stored."""
    assert client.get("/state", headers=WEBHOOK).status_code == 200
    assert client.get("/", headers=WEBHOOK).status_code == 200
    r = client.post("/alertmanager", content=_raw(payload(alert("GPUMemoryUtilizationHigh", starts=T0, **GPU))),
                    headers=WEBHOOK)
    assert r.status_code == 200, r.text
    assert [d["state"] for d in r.json()["decisions"]] == ["trip"]
    assert client.get("/state", headers=WEBHOOK).json()["levels"] == {'{cluster="a",hw_id="GPU-1"}': 1}
    assert [(a["kind"], a["scope_key"]) for a in svc.store.audit_log()] == [("trip", '{cluster="a",hw_id="GPU-1"}')]


OVERRIDES = {
    "a lone surrogate as a scope value": (_override(scope={"cluster": "a", "hw_id": LONE}), "scope.hw_id"),
    "a lone surrogate as a scope label name": (_override(scope={"cluster": "a", LONE: "x"}), "scope"),
    "a lone surrogate in the reason": (_override(reason="disk " + LONE), "reason"),
}


@pytest.mark.parametrize("body,field", list(OVERRIDES.values()), ids=list(OVERRIDES))
def test_an_override_with_a_lone_surrogate_is_400_and_the_service_keeps_working(client, svc, body, field):
    r = client.post("/override", content=_raw(body), headers=PERSON)
    assert r.status_code == 400, r.text
    assert r.json()["field"].startswith(field) and r.json()["error"].startswith(field)
    assert svc.store.snapshot() is None and svc.store.audit_log() == []
    _service_still_works(client, svc)


WEBHOOK_LABELS = {
    "a lone surrogate as a label value": {"hw_id": LONE},
    "a lone surrogate as a label name": {LONE: "x"},
}


@pytest.mark.parametrize("labels", list(WEBHOOK_LABELS.values()), ids=list(WEBHOOK_LABELS))
def test_a_notification_with_a_lone_surrogate_is_400_and_the_service_keeps_working(client, svc, labels):
    a = alert("GPUMemoryUtilizationHigh", starts=T0, **GPU)
    a["labels"].update(labels)
    del a["fingerprint"]
    r = client.post("/alertmanager", content=_raw(payload(a)), headers=WEBHOOK)
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith("alerts.0.labels")
    assert svc.store.snapshot() is None and svc.store.audit_log() == []
    _service_still_works(client, svc)


def test_the_service_refuses_an_override_it_could_not_store_before_changing_anything(svc):
    """Called without the HTTP layer (whatever pydantic accepts): the fuse's own check refuses."""
    for scope, reason in (({"cluster": "a", "hw_id": LONE}, "x"), (dict(GPU), "x" + LONE)):
        with pytest.raises(OverrideError, match="surrogate"):
            svc.override(scope, 1, "trip", reason, 600)
    assert svc.state()["scopes"] == [] and svc.store.audit_log() == []


def test_a_change_that_fails_while_being_stored_is_rolled_back_and_the_next_one_is_stored(tmp_path):
    """A notification built by hand (no parser to refuse it) whose audit row cannot be written: the
    store's transaction is rolled back and the breaker goes back to what is on disk, including the
    holder the failed notification had removed, so the next notification is applied and stored."""
    path = tmp_path / "fuse.sqlite"
    rules = FuseRules.from_spec(load_spec(SPEC))
    first = FuseService(rules, Store(path), [DryRun()], hold_s=60, dry_run=True)
    held = parse_payload(payload(alert("GPUMemoryUtilizationHigh", starts=T0, **GPU)), T0)
    assert len(first.handle(held)["decisions"]) == 1
    first.store.close()

    svc = FuseService(rules, Store(path), [DryRun()], hold_s=60, dry_run=True)  # restored from disk
    resolved = parse_payload(payload(alert("GPUMemoryUtilizationHigh", "resolved", starts=T0, **GPU)), T0)
    bad_labels = {**held.alerts[0].labels, "hw_id": LONE}
    bad = AlertEvent("firing", bad_labels, "00000000000000ff", T0, None)
    note = Notification("4", "firing", "", "", 0, (resolved.alerts[0], bad))
    with pytest.raises(UnicodeEncodeError):
        svc.handle(note)
    view = svc.state()
    json.dumps(view, ensure_ascii=False).encode("utf-8")  # what /state answers is encodable again
    assert view["levels"] == {'{cluster="a",hw_id="GPU-1"}': 1}
    assert view["scopes"][0]["levels"]["1"]["alerts"] == [f"GPUMemoryUtilizationHigh/{held.alerts[0].fingerprint}"]
    # the next notification is applied and committed (no transaction left open)
    other = parse_payload(payload(alert("KVCacheGrowthRateHigh", starts=T0, cluster="a", engine="e0")), T0)
    assert [d["state"] for d in svc.handle(other)["decisions"]] == ["trip"]
    assert sorted(Store(path).snapshot()["scopes"]) == ['{cluster="a",engine="e0"}', '{cluster="a",hw_id="GPU-1"}']
    svc.store.close()


def test_a_store_commit_that_fails_midway_keeps_nothing_and_the_next_commit_works(tmp_path):
    store = Store(tmp_path / "fuse.sqlite")
    with pytest.raises(UnicodeEncodeError):
        store.commit({"version": 1, "scopes": {}}, [], [{"at": T0, "kind": "override", "reason": LONE}])
    assert store.snapshot() is None and store.audit_log() == []
    store.commit({"version": 1, "scopes": {}, "resolved": {}}, [], [{"at": T0, "kind": "override", "reason": "ok"}])
    assert [a["reason"] for a in store.audit_log()] == ["ok"]
    store.close()


NOT_STRINGS = {
    "an object": {"a": [1, 2]},
    "a list": ["GPU-1", "GPU-2"],
    "a number": 7,
    "a boolean": True,
    "null": None,
}


@pytest.mark.parametrize("value", list(NOT_STRINGS.values()), ids=list(NOT_STRINGS))
def test_a_label_value_that_is_not_a_string_is_a_payload_error_naming_the_label(value):
    a = alert("GPUMemoryUtilizationHigh", starts=T0, **GPU)
    a["labels"]["hw_id"] = value
    with pytest.raises(PayloadError, match=r"alerts\[0\]\.labels\.hw_id: label values are strings"):
        parse_payload(payload(a), T0)


@pytest.mark.parametrize("value", list(NOT_STRINGS.values()), ids=list(NOT_STRINGS))
def test_a_label_value_that_is_not_a_string_is_400_and_nothing_is_recorded(client, svc, value):
    a = alert("GPUMemoryUtilizationHigh", starts=T0, **GPU)
    a["labels"]["hw_id"] = value
    r = client.post("/alertmanager", content=_raw(payload(a)), headers=WEBHOOK)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == "alerts.0.labels.hw_id"
    assert r.json()["error"].startswith("alerts.0.labels.hw_id must be a")
    assert "string, got " in r.json()["error"]
    assert svc.store.snapshot() is None and svc.store.audit_log() == [] and svc.state()["scopes"] == []
    assert 'fusebox_fuse_notifications_total{outcome="http_400"} 1.0' in client.get("/metrics").text


# ------------------------------------------------------------------ one bad alert costs only itself (issue 22)
def _alerts_total(svc, result: str) -> float:
    return svc.metrics.registry.get_sample_value("fusebox_fuse_alerts_total", {"result": result}) or 0.0


def test_an_alert_with_a_label_over_256_characters_is_refused_alone_and_the_alert_beside_it_trips(client, svc):
    long_value = "h" * 257  # MAX_LABEL_VALUE + 1
    bad = alert("KVCacheGrowthRateHigh", starts=T0, cluster="a", host_name=long_value, engine="e0")
    bad_name = alert("KVCacheGrowthRateHigh", starts=T0, cluster="a", engine="e1")
    bad_name["labels"]["x" * 300] = "v"
    good = alert("GPUMemoryUtilizationHigh", starts=T0, **GPU)
    r = client.post("/alertmanager", json=payload(bad, good, bad_name), headers=WEBHOOK)
    assert r.status_code == 200, r.text
    assert r.json()["alerts"] == {"label_too_long": 2, "tripped": 1}
    assert [d["state"] for d in r.json()["decisions"]] == ["trip"]
    assert svc.state()["levels"] == {'{cluster="a",hw_id="GPU-1"}': 1}
    assert _alerts_total(svc, "label_too_long") == 2
    ignored = svc.store.audit_log(kinds=("ignored",))
    assert sorted(a["detail"]["fingerprint"] for a in ignored) == sorted([bad["fingerprint"], bad_name["fingerprint"]])
    assert all(a["detail"]["result"] == "label_too_long" for a in ignored)
    assert long_value not in json.dumps(ignored)  # the audit names the label and its length, not the value
    assert any("'host_name'" in a["reason"] and "257 characters" in a["reason"] for a in ignored), ignored


def test_a_refused_alert_is_audited_once_per_episode_not_per_re_notification(client, svc):
    """10 re-notifications of 40 refused alerts (20 untrusted: no fuse labels the spec generates;
    20 over the label cap): 40 audit rows, then 40 more for a new episode (a new startsAt)."""
    def note(starts):
        untrusted = [alert("GPUMemoryUtilizationHigh", starts=starts, cluster="a", hw_id=f"GPU-{i}") for i in range(20)]
        for a in untrusted:
            a["labels"]["fuse_action"] = "not_an_action"
            a["fingerprint"] = ""  # computed from the labels, as Alertmanager does
        long = [alert("GPUMemoryUtilizationHigh", starts=starts, cluster="a", hw_id=f"G{i}" + "x" * 300)
                for i in range(20)]
        return payload(*untrusted, *long)

    for _ in range(10):
        r = client.post("/alertmanager", json=note(T0), headers=WEBHOOK)
        assert r.status_code == 200, r.text
        assert r.json()["alerts"] == {"untrusted": 20, "label_too_long": 20}, r.json()
    assert len(svc.store.audit_log(1000, kinds=("ignored",))) == 40
    assert _alerts_total(svc, "untrusted") == 200 and _alerts_total(svc, "label_too_long") == 200  # counted each time
    assert client.post("/alertmanager", json=note(T0 + 600), headers=WEBHOOK).status_code == 200
    assert len(svc.store.audit_log(1000, kinds=("ignored",))) == 80


def test_a_restarted_service_does_not_audit_a_refused_episode_again(tmp_path):
    rules = FuseRules.from_spec(load_spec(SPEC))
    long = alert("GPUMemoryUtilizationHigh", starts=T0, cluster="a", hw_id="G" + "x" * 300)
    for _ in range(2):  # the same notification before and after a restart
        svc = FuseService(rules, Store(tmp_path / "fuse.sqlite"), [DryRun()], hold_s=60, dry_run=True)
        assert svc.handle(parse_payload(payload(long), T0))["alerts"] == {"label_too_long": 1}
        rows = svc.store.audit_log(100, kinds=("ignored",))
        svc.store.close()
        assert len(rows) == 1, rows


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain"])
def test_a_notification_sent_without_the_json_content_type_is_told_to_send_it_as_json(client, svc, content_type):
    # curl -d sends application/x-www-form-urlencoded unless told otherwise; the body is Alertmanager's JSON
    body = _raw(payload(alert("GPUMemoryUtilizationHigh", starts=T0, **GPU)))
    r = client.post("/alertmanager", content=body, headers={**WEBHOOK, "Content-Type": content_type})
    assert r.status_code == 400
    assert r.json()["error"] == ("body must be sent as JSON with Content-Type: application/json "
                                 f"(this request's Content-Type: {content_type})")
    assert svc.store.audit_log() == []
    # with the JSON content type, a body that is not JSON is still answered 400 as such
    r = client.post("/alertmanager", content=b"version=4", headers=WEBHOOK)
    assert r.status_code == 400 and r.json()["error"].startswith("body is not JSON"), r.text
    _service_still_works(client, svc)
