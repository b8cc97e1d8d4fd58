"""What the on-call uses besides the page: ``fusebox fuse override`` against a real ``fusebox fuse
serve`` subprocess, ``/readyz``, ``--log-format json``, /state's ISO-8601 times, the dry-run gauge
and the dry-run audit wording."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime

import httpx
import pytest
from _fuse_support import PEOPLE, SPEC, TOKEN, alert, free_port, payload, wait_for, wait_ok
from fastapi.testclient import TestClient

from fusebox.cli import main
from fusebox.fuse.adapters.gateway import DryRun
from fusebox.fuse.http.app import create_app
from fusebox.fuse.rules import FuseRules
from fusebox.fuse.service import FuseService
from fusebox.fuse.store import Store
from fusebox.fuse.tokens import Tokens
from fusebox.spec import load_spec

HOOK = {"Authorization": f"Bearer {TOKEN}"}
KV = {"cluster": "prod-a", "host_name": "node-7", "engine": "vllm-0"}
KV_KEY = '{cluster="prod-a",host_name="node-7",engine="vllm-0"}'
GPU = {"cluster": "prod-a", "hw_id": "GPU-1"}
GPU_KEY = '{cluster="prod-a",hw_id="GPU-1"}'
T0 = 1_800_000_000.0


def utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------ a real `fusebox fuse serve`
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``fusebox fuse serve --dry-run --log-format json`` with alice and bob's override tokens, a
    KV-cache alert tripped on KV_KEY; yields (url, tmp folder, the process); its stderr lines are
    read by the log test after the module's other tests."""
    tmp = tmp_path_factory.mktemp("serve")
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / "people").write_text("".join(f"{n} {t}\n" for n, t in PEOPLE.items()))
    (tmp / "alice.token").write_text(PEOPLE["alice"] + "\n")
    for f in ("token", "people", "alice.token"):
        os.chmod(tmp / f, 0o600)
    port = free_port()
    err = open(tmp / "stderr.log", "w")
    p = subprocess.Popen([sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC),
                          "--listen", f"127.0.0.1:{port}", "--state", str(tmp / "s.sqlite"), "--token-file",
                          str(tmp / "token"), "--override-tokens", str(tmp / "people"), "--dry-run",
                          "--log-format", "json"], stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ok(url + "/readyz", p)
        r = httpx.post(url + "/alertmanager", json=payload(alert("KVCacheGrowthRateHigh", **KV)), headers=HOOK)
        assert r.status_code == 200
        yield url, tmp, p
    finally:
        p.terminate()
        p.wait(timeout=30)
        err.close()


def override(capsys, url, *args, token_file=None, env_token=None):
    """Run ``fusebox fuse override ARGS --url URL`` in this process: (exit status, stdout, stderr)."""
    old = os.environ.pop("FUSEBOX_FUSE_TOKEN", None)
    if env_token:
        os.environ["FUSEBOX_FUSE_TOKEN"] = env_token
    try:
        argv = ["fuse", "override", *args, "--url", url]
        if token_file:
            argv += ["--token-file", str(token_file)]
        code = main(argv)
    finally:
        os.environ.pop("FUSEBOX_FUSE_TOKEN", None)
        if old is not None:
            os.environ["FUSEBOX_FUSE_TOKEN"] = old
    out = capsys.readouterr()
    return code, out.out, out.err


def levels(url) -> dict:
    return httpx.get(url + "/state", headers=HOOK).json()["levels"]


def test_override_list_numbers_the_scopes_of_state(served, capsys):
    url, tmp, _ = served
    code, out, err = override(capsys, url, "list", token_file=tmp / "alice.token")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "DRY RUN: this service applies nothing"
    row = next(line for line in lines if line.endswith(KV_KEY))
    assert row.split()[:2] == ["1", "3"]  # number 1, level 3 tripped


def test_override_trip_by_labels_and_release_by_number_with_a_reason(served, capsys):
    url, tmp, _ = served
    code, out, err = override(capsys, url, "trip", "--scope", "cluster=prod-a,hw_id=GPU-1", "--level", "1",
                              "--reason", "GPU-1 ECC errors", "--for", "30m", "--new-scope",
                              env_token=PEOPLE["alice"])
    assert code == 0, err
    assert out.strip() == f"trip level 1 of {GPU_KEY} for 30 min: trip freeze_admissions"
    assert levels(url) == {KV_KEY: 3, GPU_KEY: 1}
    # the scopes are listed sorted by key: GPU_KEY is number 1 now
    state = httpx.get(url + "/state", headers=HOOK).json()
    number = [s["key"] for s in state["scopes"]].index(GPU_KEY) + 1
    code, out, err = override(capsys, url, "release", str(number), "--reason", "ECC cleared",
                              token_file=tmp / "alice.token")
    assert code == 0, err
    assert out.strip() == f"release level 1 of {GPU_KEY} for 1 h: release freeze_admissions"
    assert levels(url) == {KV_KEY: 3}
    audit = [json.loads(line) for line in (tmp / "stderr.log").read_text().splitlines() if line.strip()]
    ov = [a for a in audit if a["message"].startswith("override ")]
    assert [(a["state"], a["scope"], a["fuse_level"]) for a in ov][-2:] == [("trip", GPU_KEY, 1), ("release", GPU_KEY, 1)]
    assert " by alice " in ov[-1]["message"]


def test_override_release_by_key_without_level_releases_every_tripped_level(served, capsys, tmp_path):
    url, tmp, _ = served
    code, out, err = override(capsys, url, "trip", KV_KEY, "--level", "1", "--reason", "belt and braces",
                              token_file=tmp / "alice.token")
    assert code == 0, err
    assert levels(url) == {KV_KEY: 3}  # levels 1 and 3 tripped; the highest is 3
    code, out, err = override(capsys, url, "release", KV_KEY, "--reason", "drill over", "--for", "10m",
                              token_file=tmp / "alice.token")
    assert code == 0, err
    assert out.splitlines() == [f"release level 1 of {KV_KEY} for 10 min: release freeze_admissions",
                                f"release level 3 of {KV_KEY} for 10 min: release kv_cache_eviction"]
    assert levels(url) == {}


def test_override_unknown_scope_is_a_usage_error_naming_the_known_ones(served, capsys):
    url, tmp, _ = served
    code, out, err = override(capsys, url, "release", "--scope", "engine=vllm-0", "--reason", "x",
                              token_file=tmp / "alice.token")
    assert code == 2 and out == ""
    assert err.startswith('fusebox fuse override: unknown scope {engine="vllm-0"}: ')
    assert f"scopes that contain it: {KV_KEY}" in err
    code, _, err = override(capsys, url, "trip", "99", "--level", "1", "--reason", "x",
                            token_file=tmp / "alice.token")
    assert code == 2 and "no scope number 99" in err


def test_override_with_a_reader_token_is_a_readable_401(served, capsys, tmp_path):
    url, _, _ = served
    (tmp_path / "hook.token").write_text(TOKEN)  # the webhook token reads /state but may not override
    code, out, err = override(capsys, url, "trip", KV_KEY, "--level", "2", "--reason", "x",
                              token_file=tmp_path / "hook.token")
    assert code == 1 and out == ""
    assert err.startswith("fusebox fuse override: 401 from ") and "the token was refused" in err
    (tmp_path / "wrong.token").write_text("nope")
    code, _, err = override(capsys, url, "list", token_file=tmp_path / "wrong.token")
    assert code == 1 and "401" in err and "Traceback" not in err


def test_override_without_token_or_reason_or_service(served, capsys):
    url, tmp, _ = served
    code, _, err = override(capsys, url, "list")
    assert code == 2 and "no token: pass --token-file PATH or set FUSEBOX_FUSE_TOKEN" in err
    with pytest.raises(SystemExit) as e:
        main(["fuse", "override", "trip", "1", "--level", "1", "--url", url])
    assert e.value.code == 2 and "--reason" in capsys.readouterr().err
    dead = f"http://127.0.0.1:{free_port()}"
    code, _, err = override(capsys, dead, "list", token_file=tmp / "alice.token")
    assert code == 3
    assert err.strip() == (f"fusebox fuse override: cannot reach the fuse service at {dead}/state: connection "
                           "refused -- is `fusebox fuse serve` running there? check --url or FUSEBOX_FUSE_URL")


def test_override_cli_as_a_command(served, tmp_path):
    """The installed entry point, as the on-call types it."""
    url, tmp, _ = served
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "fuse", "override", "list", "--url", url,
                        "--token-file", str(tmp / "alice.token")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "TRIPPED SINCE (UTC)" in r.stdout


def _gpu_decision(served, **scope) -> tuple[str, list[dict]]:
    """POST a GPU memory alert on ``scope`` to the served fuse; (its decision_id, every stderr line as
    JSON once the decision's dry-run call is logged)."""
    url, tmp, _ = served
    r = httpx.post(url + "/alertmanager", json=payload(alert("GPUMemoryUtilizationHigh", **scope)), headers=HOOK)
    assert r.status_code == 200
    did = r.json()["decisions"][0]["decision_id"]
    # the served fixture is shared: wait for THIS decision's dry-run call, not an earlier test's
    wait_for(lambda: any(did in line and "not applied (dry-run)" in line for line in (tmp / "stderr.log").read_text().splitlines()),
             10, what="the decision and its dry-run call logged")
    lines = [line for line in (tmp / "stderr.log").read_text().splitlines() if line.strip()]
    return did, [json.loads(line) for line in lines]  # every line is one JSON object


def test_json_logs_one_object_per_line_with_decision_fields(served):
    did, docs = _gpu_decision(served, cluster="c9", hw_id="G9")
    assert all({"time", "level", "logger", "message"} <= d.keys() for d in docs)
    # the start-up lines are JSON too (the store's migrations come first, then the listening line)
    assert any(d["message"].startswith("fusebox fuse serve: listening on ") for d in docs[:8]), docs[:8]
    mine = [d for d in docs if d.get("decision_id") == did]
    trip = next(d for d in mine if "source" in d and d["source"] == "alert")
    assert (trip["level"], trip["logger"], trip["scope"], trip["action"], trip["fuse_level"], trip["state"]) == \
        ("info", "fusebox.fuse", '{cluster="c9",hw_id="G9"}', "freeze_admissions", 1, "trip")
    call = next(d for d in mine if d.get("adapter") == "dry-run" and "not applied" in d["message"])
    assert call["attempt"] == 1 and call["scope"] == '{cluster="c9",hw_id="G9"}'
    datetime.strptime(trip["time"], "%Y-%m-%dT%H:%M:%S.%fZ")  # UTC ISO-8601


def test_the_dry_run_would_line_carries_the_decision_fields_and_the_scope_key(served):
    did, docs = _gpu_decision(served, cluster="c8", hw_id="G8")
    (would,) = [d for d in docs if d["message"].startswith("dry-run: would") and "G8" in d["message"]]
    key = '{cluster="c8",hw_id="G8"}'  # the scope key as docs/fuse.md "Logs" writes it, labels in scope order
    assert (would["decision_id"], would["scope"], would["action"], would["fuse_level"], would["state"],
            would["adapter"]) == (did, key, "freeze_admissions", 1, "trip", "dry-run")
    assert would["message"].startswith(f"dry-run: would trip freeze_admissions (level 1) on {key}: "), would


def test_text_logs_stay_the_default():
    from fusebox.fuse.logs import setup

    buf = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        setup("info", "text", stream=buf)
        logging.getLogger("fusebox.fuse").info("hello %s", "there", extra={"scope": "{a=\"b\"}"})
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert buf.getvalue().rstrip().endswith(" INFO fusebox.fuse: hello there")


# ------------------------------------------------------------------ /readyz, /state, dry-run
def _service(tmp_path, adapters=None, dry_run=True):
    return FuseService(FuseRules.from_spec(load_spec(SPEC)), Store(tmp_path / "fuse.sqlite"),
                       [DryRun()] if adapters is None else adapters, hold_s=60, dry_run=dry_run, clock=lambda: T0)


def test_readyz_ready_then_503_with_a_reason_when_the_store_is_closed(tmp_path):
    svc = _service(tmp_path)
    c = TestClient(create_app(svc, Tokens(webhook=TOKEN)))
    r = c.get("/readyz")
    assert (r.status_code, r.json()) == (200, {"status": "ready", "adapters": ["dry-run"], "dry_run": True})
    svc.store.close()
    r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["status"] == "not ready"
    assert r.json()["reason"].startswith("store not reachable: ProgrammingError: ")
    assert c.get("/healthz").status_code == 200  # liveness: the process still answers


def test_readyz_503_when_the_store_file_is_gone(tmp_path):
    svc = _service(tmp_path)
    c = TestClient(create_app(svc, Tokens(webhook=TOKEN)))
    assert c.get("/readyz").status_code == 200
    os.remove(tmp_path / "fuse.sqlite")  # the volume went away under the service
    r = c.get("/readyz")
    assert r.status_code == 503
    assert r.json()["reason"] == (f"store file {tmp_path / 'fuse.sqlite'} is missing or not readable and "
                                  "writable by this process")
    svc.store.close()


def test_readyz_503_without_an_adapter(tmp_path):
    svc = _service(tmp_path, adapters=[], dry_run=False)
    r = TestClient(create_app(svc, Tokens(webhook=TOKEN))).get("/readyz")
    assert r.status_code == 503 and r.json()["reason"].startswith("no adapter configured")
    svc.store.close()


def test_state_gives_iso_times_beside_the_numbers_and_the_dry_run_gauge(tmp_path):
    svc = _service(tmp_path)
    c = TestClient(create_app(svc, Tokens(webhook=TOKEN)))
    assert c.post("/alertmanager", json=payload(alert("GPUMemoryUtilizationHigh", **GPU)), headers=HOOK).status_code == 200
    st = c.get("/state", headers=HOOK).json()
    lvl = st["scopes"][0]["levels"]["1"]
    assert (lvl["tripped_at"], lvl["tripped_at_iso"], lvl["tripped_for_s"]) == (T0, "2027-01-15T08:00:00Z", 0.0)
    assert (lvl["release_at"], lvl["release_at_iso"]) == (None, None)
    assert (st["now"], st["now_iso"]) == (T0, utc(T0))
    assert st["levels"] == {GPU_KEY: 1}  # what the demo and the tests read is unchanged
    assert "fusebox_fuse_dry_run 1.0" in c.get("/metrics").text.splitlines()
    svc.store.close()
    live = _service(tmp_path / "live", adapters=[DryRun()], dry_run=False)
    assert "fusebox_fuse_dry_run 0.0" in TestClient(create_app(live, Tokens(webhook=TOKEN))).get("/metrics").text
    live.store.close()


def test_dry_run_calls_are_audited_as_not_applied(tmp_path):
    svc = _service(tmp_path)
    svc.start()
    try:
        c = TestClient(create_app(svc, Tokens(webhook=TOKEN)))
        assert c.post("/alertmanager", json=payload(alert("GPUMemoryUtilizationHigh", **GPU)), headers=HOOK).status_code == 200
        wait_for(lambda: svc.store.pending_count() == 0, 5, what="dry-run call audited")
    finally:
        svc.stop()
    rows = svc.store.audit_log(kinds=("dry_run", "applied"))
    assert [(r["kind"], r["reason"], r["source"]) for r in rows] == [("dry_run", "trip not applied (dry-run)", "dry-run")]
    svc.store.close()


def test_the_dashboard_link_of_alerts_and_of_the_status_page_is_the_overview_dashboards_uid():
    """Alerts' dashboard_url annotation and the status page link to the UID the overview dashboard
    really has (dashboards/fusebox-overview.json), not a name no dashboard carries."""
    import dataclasses

    from fusebox import conventions as C
    from fusebox.fuse.http.status import StatusLinks
    from fusebox.generator.render_rules import alert_annotations

    uid = json.loads((SPEC.parent / "dashboards" / "fusebox-overview.json").read_text())["uid"]
    spec = dataclasses.replace(load_spec(SPEC), dashboard_base_url="https://grafana.example.org/")
    sig = next(s for s in spec.signals if s.tiers)
    assert alert_annotations(sig, sig.tiers[0], spec)["dashboard_url"] == f"https://grafana.example.org/d/{uid}"
    assert StatusLinks.from_spec(spec).dashboard == f"https://grafana.example.org/d/{uid}"
    assert C.dashboard_uid(spec.name, C.OVERVIEW_DASHBOARD) == uid


def test_alertmanager_links_come_from_the_option_else_the_notifications_external_url_and_only_http(tmp_path):
    svc = _service(tmp_path)
    c = TestClient(create_app(svc, Tokens(webhook=TOKEN)))
    body = payload(alert("GPUMemoryUtilizationHigh", **GPU))
    assert c.post("/alertmanager", json={**body, "externalURL": "https://am.example.org/"}, headers=HOOK).status_code == 200
    page = c.get("/", headers=HOOK).text
    assert 'href="https://am.example.org/#/alerts?silenced=true&amp;inhibited=true&amp;filter=' \
           '%7Balertname%3D%22GPUMemoryUtilizationHigh%22%2Ccluster%3D%22prod-a%22%2Chw_id%3D%22GPU-1%22%7D"' in page
    # a later notification with a URL that is not http(s) changes nothing: it never becomes a link
    assert c.post("/alertmanager", json={**body, "externalURL": "javascript:alert(1)"}, headers=HOOK).status_code == 200
    page = c.get("/", headers=HOOK).text
    assert "javascript:" not in page and 'href="https://am.example.org/#/alerts"' in page
    # --alertmanager-url wins over what Alertmanager sends
    from fusebox.fuse.http.status import StatusLinks

    c2 = TestClient(create_app(svc, Tokens(webhook=TOKEN), links=StatusLinks(alertmanager="http://am.internal:9093")))
    assert c2.post("/alertmanager", json=body, headers=HOOK).status_code == 200
    page = c2.get("/", headers=HOOK).text
    assert 'href="http://am.internal:9093/#/alerts"' in page and "http://alertmanager:9093" not in page
    svc.store.close()
