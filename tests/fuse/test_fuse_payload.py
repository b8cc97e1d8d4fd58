"""Webhook payloads from the corpus (tests/fixtures/fuse, copied from shared/corpus/alertmanager_webhooks).

Expected figures are read off the files by hand: alert counts, versions, times (converted with
`date -u -d ... +%s`) and the one fingerprint Alertmanager itself computed (infra-prometheus-webhook).
"""

from __future__ import annotations

import json

import pytest
from _fuse_support import FIXTURES, SPEC

from fusebox.fuse import Breaker, FuseRules, PayloadError, fingerprint, parse_payload
from fusebox.spec import load_spec

NOW = 1_800_000_000.0
RULES = FuseRules.from_spec(load_spec(SPEC))


def load(name):
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name,n,version,statuses", [
    ("alertmonitor_v4_firing_3alerts.json", 3, "4", {"firing"}),
    ("alertmonitor_v4_resolved_3alerts.json", 3, "4", {"resolved"}),  # endsAt stays Go's zero time
    ("infra-prometheus-webhook_v4_firing_regex_groupKey.json", 1, "4", {"firing"}),
    ("prom2teams_all_ok_multiple.json", 2, "4", {"resolved"}),
    ("prom2teams_with_common_items.json", 1, "4", {"resolved"}),
    ("prom2teams_without_fingerprint.json", 1, "4", {"resolved"}),
    ("prometheus-msteams_large_prom_post_request_nofingerprint.json", 19, "4", {"firing"}),  # no per-alert status
    ("prometheus-msteams_prom_post_request.json", 1, "4", {"firing"}),
    ("prometheus-webhook-dingtalk_PlaygroundDemoAlert_v3.json", 2, "3", {"firing"}),
    ("prometheus_bot_production_example_2017.json", 11, "0", {"firing"}),  # version 0 as an integer, no endsAt
])
def test_corpus_payload_parses(name, n, version, statuses):
    note = parse_payload((FIXTURES / name).read_bytes(), NOW)
    assert len(note.alerts) == n
    assert note.version == version
    assert {a.status for a in note.alerts} == statuses
    assert note.truncated_alerts == 0


def test_a_payload_without_alertname_is_rejected():
    with pytest.raises(PayloadError, match="alertname"):
        parse_payload((FIXTURES / "prom2teams_without_mandatory_field.json").read_bytes(), NOW)


def test_fingerprint_matches_the_one_alertmanager_sent():
    a = load("infra-prometheus-webhook_v4_firing_regex_groupKey.json")["alerts"][0]
    assert fingerprint(a["labels"]) == "4e4c4c3d872bf6d8" == a["fingerprint"]


def test_missing_fingerprint_is_computed_the_alertmanager_way():
    note = parse_payload((FIXTURES / "prom2teams_without_fingerprint.json").read_bytes(), NOW)
    assert note.alerts[0].fingerprint == fingerprint(load("prom2teams_without_fingerprint.json")["alerts"][0]["labels"])


@pytest.mark.parametrize("name,starts", [
    ("alertmonitor_v4_firing_3alerts.json", 1569601676.612666),  # 2019-09-27T16:27:56.612666101Z, ns cut to us
    ("prometheus_bot_production_example_2017.json", 1485437514.865),  # 2017-01-26T08:31:54.865-05:00
])
def test_times_with_nanoseconds_and_offsets(name, starts):
    assert parse_payload((FIXTURES / name).read_bytes(), NOW).alerts[0].starts_at == pytest.approx(starts, abs=1e-6)


def test_corpus_alerts_trip_nothing_with_the_shipped_spec():
    """None of the corpus alerts is a fusebox alert (no fuse_action, unknown alertname)."""
    b = Breaker(RULES, 60)
    for f in sorted(FIXTURES.glob("*.json")):
        if "without_mandatory" in f.name:
            continue
        assert b.on_notification(parse_payload(f.read_bytes(), NOW), NOW)[0] == [], f.name


def relabel(doc):
    for a in doc["alerts"]:
        a["labels"].update(alertname="GPUMemoryUtilizationHigh", severity="critical")
    return doc


def test_corpus_firing_then_resolved_shapes_trip_and_release_per_instance():
    """alertmonitor's Alarm/Clear pair, relabelled as our critical GPU memory alert (the spec maps it
    to freeze_admissions, level 1): 3 instances -> 3 trips; the clear -> 3 releases after the hold."""
    b = Breaker(RULES, 60)
    fire = parse_payload(relabel(load("alertmonitor_v4_firing_3alerts.json")), NOW)
    clear = parse_payload(relabel(load("alertmonitor_v4_resolved_3alerts.json")), NOW)
    trips = b.on_notification(fire, NOW)[0]
    assert sorted(d.scope_key for d in trips) == [
        '{instance="172.29.254.30"}', '{instance="172.29.254.50"}', '{instance="172.29.254.66"}']
    assert {(d.kind, d.level, d.action) for d in trips} == {("trip", 1, "freeze_admissions")}
    assert b.on_notification(clear, NOW + 5)[0] == []
    assert b.on_notification(fire, NOW + 6)[0] == []  # stale firing of the same start: ignored
    assert [d.kind for d in b.tick(NOW + 65)] == ["release"] * 3


@pytest.mark.parametrize("body,what", [
    (b"{not json", "not JSON"),
    (b"[]", "JSON object"),
    (b'{"alerts": 3}', "'alerts' must be a list"),
    (b'{"alerts": [{"labels": {"alertname": "X"}}]}', "startsAt"),
    (b'{"alerts": [{"labels": {"alertname": "X"}, "startsAt": "yesterday"}]}', "RFC 3339"),
    (b'{"alerts": [], "truncatedAlerts": -1}', "truncatedAlerts"),
    (b'{"alerts": [{"labels": {"alertname": "X"}, "startsAt": "2024-01-01T00:00:00Z", "status": "maybe"}]}', "status"),
])
def test_malformed_payloads_are_rejected_with_the_reason(body, what):
    with pytest.raises(PayloadError, match=what):
        parse_payload(body, NOW)


def test_unknown_fields_are_ignored():
    doc = load("infra-prometheus-webhook_v4_firing_regex_groupKey.json")
    doc["somethingNew"] = {"x": 1}
    doc["alerts"][0]["extra"] = [1, 2]
    assert len(parse_payload(doc, NOW).alerts) == 1


def test_nesting_deeper_than_the_recursion_limit_is_a_payload_error():
    with pytest.raises(PayloadError, match="nested"):
        parse_payload('{"alerts":' + "[" * 100_000 + "]" * 100_000 + "}", NOW)
