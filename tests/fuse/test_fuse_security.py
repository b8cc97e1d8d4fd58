"""Issue 14: the fuse service's security faults, each reproduced (these tests failed before the fix).

Tokens: ``TOKEN`` is the webhook token (Alertmanager), ``PEOPLE`` the named override tokens, ``READ``
the optional read-only token.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import stat
import subprocess
import sys
import time

import httpx
import pytest
from _fuse_support import GW_TOKEN, PEOPLE, ROOT, SPEC, TOKEN, alert, free_port, payload, wait_for
from _support import finish, yaml_data
from fastapi.testclient import TestClient

from fusebox.fuse.adapters.gateway import DryRun
from fusebox.fuse.http.app import create_app
from fusebox.fuse.rules import FuseRules
from fusebox.fuse.service import FuseService
from fusebox.fuse.store import Store
from fusebox.spec import load_spec, parse_spec

HOOK = {"Authorization": f"Bearer {TOKEN}"}
ALICE = {"Authorization": f"Bearer {PEOPLE['alice']}"}
READ = "read-only-token-for-dashboards-0001"
SCOPE = {"cluster": "a", "host_name": "h1", "engine": "e0"}
MiB = 1 << 20


def Tokens(**kw):
    from fusebox.fuse.tokens import Tokens as T

    return T(**kw)


def _service(tmp_path, spec=None, adapters=None, **kw):
    spec = spec or load_spec(SPEC)
    return FuseService(FuseRules.from_spec(spec), Store(tmp_path / "fuse.sqlite"), adapters or [DryRun()],
                       hold_s=60, dry_run=adapters is None, **kw)


def _override(**changes):
    body = {"scope": {"cluster": "a", "engine": "e0"}, "level": 2, "mode": "trip", "reason": "canary",
            "expires_in_s": 600}
    body.update(changes)
    return body


# ------------------------------------------------------------------ 1. the status page
def test_a_label_value_over_256_characters_is_refused_alone_naming_the_cap_and_changes_nothing(client, svc):
    long = alert("KVCacheGrowthRateHigh", cluster="a", host_name="h" * 257, engine="e0")
    r = client.post("/alertmanager", json=payload(long), headers=HOOK)
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ok", "decisions": [], "alerts": {"label_too_long": 1}}
    assert svc.state()["scopes"] == []
    (row,) = svc.store.audit_log(kinds=("ignored",))
    assert "'host_name'" in row["reason"] and "256" in row["reason"], row
    ok = alert("KVCacheGrowthRateHigh", cluster="a", host_name="h" * 256, engine="e0")
    assert client.post("/alertmanager", json=payload(ok), headers=HOOK).json()["alerts"] == {"tripped": 1}


def test_placeholders_in_a_label_value_are_shown_as_text_not_expanded(client):
    host = "{{summary}}{{scopes}}{{decisions}}{{mode}}{{pending}}{{hold}}"
    a = alert("KVCacheGrowthRateHigh", cluster="a", host_name=host, engine="e0")
    assert client.post("/alertmanager", json=payload(a), headers=HOOK).status_code == 200
    page = client.get("/", headers=HOOK).text
    # two header rows, the one scope row, the one decision (the trip): nothing pasted in twice
    assert page.count("<tr") == 4, page
    assert "{{decisions}}" in page and "{{hold}}" in page


def test_the_page_lists_at_most_100_scope_rows_and_says_how_many_are_left_out(client):
    for i in range(130):
        body = _override(scope={"cluster": "a", "hw_id": f"GPU-{i:03d}"}, level=1)
        assert client.post("/override", json=body, headers=ALICE).status_code == 200
    page = client.get("/", headers=ALICE).text
    assert len(re.findall(r'<tr class="(?:tripped|ok)" data-scope=', page)) == 100
    assert "30 more scope rows" in page


def test_scopes_kept_are_capped_idle_ones_go_first_and_the_refusal_is_audited(tmp_path):
    s = _service(tmp_path, max_scopes=3)
    try:
        def fire(i, status="firing"):
            return s.handle(_note(alert("GPUMemoryUtilizationHigh", status, cluster="a", hw_id=f"GPU-{i}")))

        fire(0), fire(1), fire(2)
        s.breaker.hold_s = 0
        fire(0, "resolved")  # GPU-0 released at once: an idle scope, the first to go
        assert fire(3)["alerts"] == {"tripped": 1}
        assert fire(4)["alerts"] == {"scope_limit": 1}  # three scopes, all tripped: nothing to drop
        keys = {sc["key"] for sc in s.state()["scopes"]}
        assert keys == {'{cluster="a",hw_id="GPU-1"}', '{cluster="a",hw_id="GPU-2"}', '{cluster="a",hw_id="GPU-3"}'}
        ignored = s.store.audit_log(kinds=("ignored",))
        assert len(ignored) == 1 and "3 scopes" in ignored[0]["reason"], ignored
    finally:
        s.store.close()


def _note(*alerts):
    from fusebox.fuse.intake.payload import parse_payload

    return parse_payload(payload(*alerts), time.time())


def _rss_peak_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _limit_memory():  # a guard for the machine running the test, far above what the service needs
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def _get_capped(url, headers, cap):
    """GET ``url``, reading at most ``cap`` + 1 bytes: (status, size read)."""
    size = 0
    with httpx.stream("GET", url, headers=headers, timeout=60) as r:
        for chunk in r.iter_bytes():
            size += len(chunk)
            if size > cap:
                break
    return r.status_code, size


def test_a_hostile_alert_leaves_the_page_under_1_MB_and_the_service_under_300_MB(tmp_path):
    """The issue's reproduction: one 65 KB alert whose host_name repeats a placeholder 5,000 times,
    then the page; and 20 alerts at the label cap made of placeholders."""
    port = free_port()
    (tmp_path / "token").write_text(TOKEN + "\n")
    p = subprocess.Popen(
        [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen", f"127.0.0.1:{port}",
         "--state", str(tmp_path / "s.sqlite"), "--token-file", str(tmp_path / "token"), "--dry-run",
         "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_limit_memory)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(url), 30, 0.1, "fuse serve")
        hostile = alert("KVCacheGrowthRateHigh", cluster="a", host_name="{{decisions}}" * 5000, engine="e0")
        assert len(json.dumps(payload(hostile))) > 65_000
        r = httpx.post(url + "/alertmanager", json=payload(hostile), headers=HOOK, timeout=30)
        refused = (r.status_code, r.text[:300])
        codes = [httpx.post(url + "/alertmanager", headers=HOOK, timeout=30, json=payload(alert(
            "KVCacheGrowthRateHigh", cluster=f"c{i}", host_name=("{{decisions}}" * 20)[:256], engine="e0"))).status_code
            for i in range(20)]
        pages = [_get_capped(url + "/", HOOK, MiB) for _ in range(3)]  # the page reloads itself every 10 s
        rss = _rss_peak_kib(p.pid)
    finally:
        p.terminate()
        p.communicate(timeout=60)
    assert refused[0] == 200 and '"label_too_long":1' in refused[1], refused
    assert codes == [200] * 20
    assert all(code == 200 and size < MiB for code, size in pages), pages
    assert rss < 300 * 1024, f"peak RSS {rss} KiB"


def _up(url):
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# ------------------------------------------------------------------ 2. anonymous readers
@pytest.mark.parametrize("path", ["/state", "/", "/openapi.json"])
def test_without_a_token_state_page_and_api_description_answer_401(client, path):
    assert client.get(path).status_code == 401
    assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get(path, headers=HOOK).status_code == 200  # no read token configured: the webhook's reads
    assert client.get(path, headers=ALICE).status_code == 200  # people read what they override


@pytest.mark.parametrize("path,code", [("/healthz", 200), ("/metrics", 200), ("/docs", 404), ("/redoc", 404)])
def test_health_and_metrics_stay_open_docs_are_off(client, path, code):
    assert client.get(path).status_code == code


def test_a_read_token_reads_and_changes_nothing_the_webhook_token_then_no_longer_reads(svc):
    c = TestClient(create_app(svc, Tokens(webhook=TOKEN, people=dict(PEOPLE), read=READ)))
    rd = {"Authorization": f"Bearer {READ}"}
    assert c.get("/state", headers=rd).status_code == 200 and c.get("/", headers=rd).status_code == 200
    assert c.get("/state", headers=HOOK).status_code == 401
    assert c.post("/alertmanager", json=payload(alert("KVCacheGrowthRateHigh", **SCOPE)), headers=rd).status_code == 401
    assert c.post("/override", json=_override(), headers=rd).status_code == 401
    assert svc.store.audit_log() == []


def test_gateway_answers_and_internal_urls_stay_off_the_page_and_metrics_but_in_the_audit(tmp_path):
    from fusebox.fuse.adapters.gateway import HttpGateway, VllmResetPrefixCache

    secret = "db-password=hunter2 at http://10.1.2.3:5432"
    gw = HttpGateway("http://gateway.internal:8080", GW_TOKEN)
    gw._client = httpx.Client(transport=httpx.MockTransport(lambda req: httpx.Response(400, text=secret)))
    vllm = VllmResetPrefixCache("http://vllm-0.internal:8000", "e0", max_attempts=1)
    vllm._client = httpx.Client(transport=httpx.MockTransport(lambda req: httpx.Response(500, text=secret)))
    s = _service(tmp_path, adapters=[gw, vllm], backoff_s=0.01)
    s.start()
    try:
        c = TestClient(create_app(s, Tokens(webhook=TOKEN)))
        assert c.post("/alertmanager", json=payload(alert("KVCacheGrowthRateHigh", **SCOPE)), headers=HOOK).status_code == 200
        wait_for(lambda: len(s.store.audit_log(kinds=("failed",))) == 2, 10, what="both actions given up")
        page, metrics = c.get("/", headers=HOOK).text, c.get("/metrics").text
        audit = json.dumps(s.store.audit_log(kinds=("failed",)))
    finally:
        s.stop()
        s.store.close()
    # The one URL /metrics carries is the sender's: the externalURL Alertmanager puts in every
    # notification it sends anyone (fusebox_fuse_last_notification_timestamp_seconds{alertmanager}).
    sender = 'fusebox_fuse_last_notification_timestamp_seconds{alertmanager="http://alertmanager:9093"}'
    assert sender in metrics
    metrics = "\n".join(ln for ln in metrics.splitlines() if not ln.startswith(sender))
    for text in (page, metrics):
        for leak in ("hunter2", "10.1.2.3", "gateway.internal", "vllm-0.internal"):
            assert leak not in text, (leak, text[:3000])
    assert "http://" not in metrics
    # the page's only URLs are its links to Alertmanager (the notification's externalURL)
    assert {u.split("/#/")[0] for u in re.findall(r'https?://[^"<\s]+', page)} == {payload()["externalURL"]}
    assert 'fusebox_fuse_actions_given_up_total{adapter="vllm:e0",reason="retries_exhausted"} 1.0' in metrics
    assert "HTTP 400" in page  # what happened is still told
    assert "hunter2" in audit and "gateway.internal" in audit and "vllm-0.internal" in audit


# ------------------------------------------------------------------ 3. trusted alerts only
def test_an_alert_without_scope_labels_trips_nothing_and_the_audit_says_why(client, svc):
    anything = {"status": "firing", "labels": {"alertname": "AnythingAtAll", "fuse_action": "kv_cache_eviction"},
                "startsAt": "2026-01-01T00:00:00Z"}
    known = alert("KVCacheGrowthRateHigh")  # a spec alert, with its fuse labels, but no scope label
    r = client.post("/alertmanager", json=payload(anything, known), headers=HOOK)
    assert r.status_code == 200
    assert r.json()["decisions"] == [] and svc.state()["levels"] == {} and svc.state()["scopes"] == []
    reasons = sorted(a["reason"] for a in svc.store.audit_log(kinds=("ignored",)))
    assert len(reasons) == 2, reasons
    assert "AnythingAtAll" in reasons[0] and "not an alert the spec generates" in reasons[0], reasons
    assert "KVCacheGrowthRateHigh" in reasons[1] and "no scope label" in reasons[1] \
        and "fuse.allow_fleet_wide_alerts" in reasons[1], reasons


@pytest.mark.parametrize("labels", [
    {"alertname": "AnythingAtAll", "fuse_action": "kv_cache_eviction", **SCOPE},  # unknown name
    {"alertname": "GPUMemoryUtilizationHigh", "fuse_action": "kv_cache_eviction", **SCOPE},  # not its action
    {"alertname": "AnythingAtAll", "severity": "critical", **SCOPE},  # unknown name, no fuse label
], ids=["an unknown alert name", "a spec alert with another alert's action", "an unknown name without fuse label"])
def test_only_the_alert_and_action_pairs_the_spec_generates_trip(client, svc, labels):
    a = {"status": "firing", "labels": labels, "startsAt": "2026-01-01T00:00:00Z"}
    assert client.post("/alertmanager", json=payload(a), headers=HOOK).status_code == 200
    assert svc.state()["levels"] == {}
    if "fuse_action" in labels:
        (row,) = svc.store.audit_log(kinds=("ignored",))
        assert labels["alertname"] in row["reason"] and labels["fuse_action"] in row["reason"]


def _spec_text(value: str) -> str:
    text = SPEC.read_text()
    assert text.count("\n  allow_fleet_wide_alerts: false\n") == 1
    return text.replace("\n  allow_fleet_wide_alerts: false\n", f"\n  allow_fleet_wide_alerts: {value}\n")


def test_the_spec_can_allow_fleet_wide_alerts_and_validates_the_field(tmp_path):
    from fusebox.spec.errors import SpecError

    assert load_spec(SPEC).allow_fleet_wide_alerts is False
    spec = parse_spec(_spec_text("true"), "fusebox.yaml")
    assert spec.allow_fleet_wide_alerts is True
    s = _service(tmp_path, spec=spec)
    try:
        s.handle(_note(alert("KVCacheGrowthRateHigh")))
        assert s.state()["levels"] == {"{}": 3}
    finally:
        s.store.close()
    with pytest.raises(SpecError) as e:
        parse_spec(_spec_text("sometimes"), "fusebox.yaml")
    assert "allow_fleet_wide_alerts" in str(e.value)


# ------------------------------------------------------------------ 4. tokens: machines and people
def test_the_webhook_token_cannot_override_and_a_person_cannot_post_alerts(client, svc):
    assert client.post("/override", json=_override(), headers=HOOK).status_code == 401
    a = payload(alert("KVCacheGrowthRateHigh", **SCOPE))
    assert client.post("/alertmanager", json=a, headers=ALICE).status_code == 401
    assert svc.store.audit_log() == []


def test_each_override_audit_row_names_the_token_that_made_it_never_its_value(client, svc):
    bob = {"Authorization": f"Bearer {PEOPLE['bob']}"}
    assert client.post("/override", json=_override(), headers=ALICE).status_code == 200
    assert client.post("/override", json=_override(mode="release"), headers=bob).status_code == 200
    rows = svc.store.audit_log(kinds=("override",))
    assert [r["detail"]["token"] for r in rows] == ["bob", "alice"]
    dumped = json.dumps(svc.store.audit_log())
    assert PEOPLE["alice"] not in dumped and PEOPLE["bob"] not in dumped


def test_the_people_file_has_a_name_and_a_token_per_line(tmp_path):
    from fusebox.fuse.tokens import read_people_file

    f = tmp_path / "people"
    f.write_text("# who may override\nalice   tok-alice-0123456789-abcdefghijkl\n\n bob\ttok-bob-0123456789-abcdefghijklmn  \n")
    assert read_people_file(f) == {"alice": "tok-alice-0123456789-abcdefghijkl", "bob": "tok-bob-0123456789-abcdefghijklmn"}
    t1, t2 = "1" * 32, "2" * 32
    for bad, words in [("alice\n", "line 1"), ("alice a b\n", "line 1"), (f"alice {t1}\nalice {t2}\n", "line 2: alice"),
                       (f"alice {t1}\nbob {t1}\n", "line 2: the same token"), ("", "no token"),
                       (f"alice {t1}\nbob {'b' * 31}\n", "line 2: the token is 31 characters, at least 32")]:
        f.write_text(bad)
        with pytest.raises(ValueError, match=words):
            read_people_file(f)


def test_token_files_are_read_again_when_they_change(tmp_path, svc):
    from fusebox.fuse.tokens import TokenFiles

    hook, people = tmp_path / "hook", tmp_path / "people"
    hook.write_text(TOKEN + "\n")
    people.write_text(f"alice {PEOPLE['alice']}\n")
    files = TokenFiles(hook, people)
    c = TestClient(create_app(svc, files))
    assert c.post("/override", json=_override(), headers=ALICE).status_code == 200
    people.write_text("carol carol-token-0123456789-abcdefghij\n")
    os.utime(people, ns=(time.time_ns() + 10**9,) * 2)  # a later mtime, whatever the clock's resolution
    assert c.post("/override", json=_override(level=1), headers=ALICE).status_code == 401
    carol = {"Authorization": "Bearer carol-token-0123456789-abcdefghij"}
    assert c.post("/override", json=_override(level=1), headers=carol).status_code == 200
    people.write_text("carol\n")  # broken: the file is refused whole, carol's token with it (fail closed)
    os.utime(people, ns=(time.time_ns() + 2 * 10**9,) * 2)
    assert c.post("/override", json=_override(level=3), headers=carol).status_code == 401
    assert c.get("/state", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200  # the webhook's stays


def test_sighup_reads_the_token_files_again(tmp_path):
    port, url = free_port(), None
    hook, people = tmp_path / "hook", tmp_path / "people"
    hook.write_text(TOKEN + "\n")
    people.write_text("alice tok-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n")
    hook.chmod(0o600), people.chmod(0o600)
    p = subprocess.Popen(
        [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen", f"127.0.0.1:{port}",
         "--state", str(tmp_path / "s.sqlite"), "--webhook-token-file", str(hook), "--override-tokens", str(people),
         "--dry-run", "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"

    def override(token, level):
        return httpx.post(url + "/override", json=_override(level=level), timeout=10,
                          headers={"Authorization": f"Bearer {token}"}).status_code

    try:
        wait_for(lambda: _up(url), 30, 0.1, "fuse serve")
        assert override("tok-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 1) == 200
        st = people.stat()
        people.write_text("alice tok-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\n")  # same size, same inode; the old mtime put back
        os.utime(people, ns=(st.st_atime_ns, st.st_mtime_ns))  # the ctime still tells the change
        p.send_signal(signal.SIGHUP)
        wait_for(lambda: override("tok-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", 3) == 200, 10, 0.1, "the new token after SIGHUP")
        assert override("tok-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 2) == 401
        assert p.poll() is None
    finally:
        p.terminate()
        _, _, err = finish(p)
    assert "readable by group or others" not in err  # 0600 files: no warning


# ------------------------------------------------------------------ 5. log injection
def test_control_characters_in_labels_and_reasons_reach_the_log_escaped(client, caplog):
    caplog.set_level(logging.INFO, logger="fusebox")
    forged = "2026-01-01 00:00:00 CRITICAL fusebox.fuse: forged line"
    a = alert("KVCacheGrowthRateHigh", cluster="a", host_name="h1\r\x1b[2K" + forged, engine="e0")
    assert client.post("/alertmanager", json=payload(a), headers=HOOK).status_code == 200
    for r in caplog.records:
        assert not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", r.getMessage()), repr(r.getMessage())
    body = _override(scope={"cluster": "b", "engine": "e1"}, reason="canary\n" + forged + "\x1b[31m\u2028\x85")
    assert client.post("/override", json=body, headers=ALICE).status_code == 200
    unknown = {"status": "firing", "labels": {"alertname": "X\n" + forged, "fuse_action": "freeze_admissions",
                                              "cluster": "a"}, "startsAt": "2026-01-01T00:00:00Z"}
    assert client.post("/alertmanager", json=payload(unknown), headers=HOOK).status_code == 200
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("fusebox")]
    assert sum(forged in m for m in messages) >= 3, messages  # each one was logged
    for m in messages:
        assert not re.search(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", m), repr(m)
    text = "\n".join(messages)
    assert "\\r\\x1b[2K" in text and "canary\\n" in text and "\\x1b[31m\\u2028\\x85" in text


# ------------------------------------------------------------------ 6. file permissions
def test_the_state_file_and_its_journal_are_created_0600(tmp_path):
    old = os.umask(0o022)
    try:
        store = Store(tmp_path / "state" / "fuse.sqlite")
        store.commit({"version": 1}, [], [{"at": 1.0, "kind": "x"}])
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "state").iterdir()}
        store.close()
    finally:
        os.umask(old)
    assert modes and modes["fuse.sqlite"] == 0o600 and set(modes.values()) == {0o600}, modes


def test_a_token_file_readable_by_others_is_warned_about_at_start(tmp_path):
    port = free_port()
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")
    tok.chmod(0o644)
    p = subprocess.Popen(
        [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen", f"127.0.0.1:{port}",
         "--state", str(tmp_path / "s.sqlite"), "--token-file", str(tok), "--dry-run"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _up(f"http://127.0.0.1:{port}"), 30, 0.1, "fuse serve")
    finally:
        p.terminate()
        _, _, err = finish(p)
    assert f"{tok} is readable by group or others (mode 0644)" in err, err


def test_a_token_file_is_its_whole_content_and_one_line_as_help_says(tmp_path):
    from fusebox.fuse.tokens import read_token_file

    f = tmp_path / "token"
    f.write_text("  abc-token-0123456789-abcdefghijklm \n\n")
    assert read_token_file(f) == "abc-token-0123456789-abcdefghijklm"
    f.write_text("abc-token-0123456789-abcdefghijklm\nsecond-line\n")
    with pytest.raises(ValueError, match="one line"):
        read_token_file(f)
    helptext = subprocess.run([sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--help"],
                              capture_output=True, text=True).stdout
    assert "first line" not in helptext and "whole file" in " ".join(helptext.split())


# ------------------------------------------------------------------ 7. the trust boundary, documented
def test_docs_name_the_trust_boundary_and_compose_keeps_alertmanager_off_public_ports():
    import yaml

    doc = (ROOT / "docs" / "fuse.md").read_text()
    section = doc.split("## Security model", 1)[1].split("\n## ", 1)[0]
    for words in ("Alertmanager's API", "--web.config.file", "--override-tokens", "/healthz", "/metrics"):
        assert words in section, words
    text = (ROOT / "docker-compose.yml").read_text()
    compose = yaml.safe_load(text)
    am_ns = compose["services"]["fuse"]  # Alertmanager lives in the fuse service's network namespace
    assert compose["services"]["alertmanager"]["network_mode"] == "service:fuse"
    assert all(p.startswith("127.0.0.1:") for p in am_ns.get("ports", []))
    assert "--web.config.file" in text


def test_the_trusted_pairs_are_the_alerting_rules_the_generator_writes(generated):

    rules = yaml_data((generated / "rules" / "fusebox.rules.yml").read_text())
    written = {(r["alert"], r["labels"]["fuse_action"]) for g in rules["groups"] for r in g["rules"]
               if "alert" in r and "fuse_action" in r.get("labels", {})}
    raw = yaml_data(SPEC.read_text())  # the spec's tiers with a fuse, read without the loader
    fused = {(sig["alert"], t["fuse"]) for sig in raw["signals"].values() for t in sig["tiers"].values()
             if t.get("fuse") and t.get("enabled", True) is not False}
    # five signals' critical tiers, the two time-to-full ones (KV -> eviction, GPU -> freeze) and
    # the preemption rate's (freeze)
    assert ("KVCacheGrowthRateHigh", "kv_cache_eviction") in fused and len(fused) == 8
    assert ("EnginePreemptionsHigh", "freeze_admissions") in fused
    assert {("KVCacheTimeToFullLow", "kv_cache_eviction"), ("GPUMemoryTimeToFullLow", "freeze_admissions")} <= fused
    # a lost GPU holds the fuse of the GPU-level signals (level defaults to gpu in the schema)
    fused |= {("FuseboxGPUDown", t["fuse"]) for sig in raw["signals"].values() if sig.get("level", "gpu") == "gpu"
              for t in sig["tiers"].values() if t.get("fuse") and t.get("enabled", True) is not False}
    assert ("FuseboxGPUDown", "freeze_admissions") in fused and len(fused) == 9  # (the preemption rate is engine-level)
    assert written == fused
    assert FuseRules.from_spec(load_spec(SPEC)).trusted == written
