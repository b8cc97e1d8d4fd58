"""A real Alertmanager (Debian's prometheus-alertmanager) fires real notifications at the service.

Alerts are posted to Alertmanager's v2 API; Alertmanager groups them and calls the webhook with
the bearer token from ``http_config.authorization.credentials_file``, as the generated config does.
The first tests route every alert to the fuse (the service's own handling); the last one runs the
generated routing (``render_alertmanager``), foreign alerts included.
"""

from __future__ import annotations

import subprocess
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from _fuse_support import CRITICAL, TOKEN, LiveService, free_port, need_tool, wait_for

from fusebox.demo.gateway import ReferenceGateway, read_log
from fusebox.fuse import fingerprint

pytestmark = pytest.mark.tools

CONFIG = """
route:
  receiver: fusebox-fuse
  group_by: [alertname, cluster, host_name, instance, hw_id, engine]
  group_wait: 100ms
  group_interval: 500ms
  repeat_interval: 1h
receivers:
  - name: fusebox-fuse
    webhook_configs:
      - url: {url}/alertmanager
        send_resolved: true
        max_alerts: 0
        http_config:
          authorization:
            credentials_file: {token_file}
"""


def _labels():
    scopes = {
        "GPUMemoryUtilizationHigh": {"cluster": "prod-a", "hw_id": "GPU-5f3c"},
        "AlignmentLatencyP95High": {"cluster": "prod-a", "host_name": "node-7", "engine": "vllm-0"},
        "KVCacheGrowthRateHigh": {"cluster": "prod-a", "host_name": "node-7", "engine": "vllm-0"},
    }
    out = []
    for name, (signal, action, level) in CRITICAL.items():
        out.append({"alertname": name, "severity": "critical", "signal": signal, "fuse_action": action,
                    "fuse_level": str(level), **scopes[name]})
        out.append({"alertname": name, "severity": "warning", "signal": signal, **scopes[name]})  # trips nothing
    out.append({"alertname": "FuseboxSignalAbsent", "severity": "warning", "signal": "gpu_memory_utilization",
                "cluster": "prod-a"})
    return out


def _rfc3339(dt):
    return dt.isoformat().replace("+00:00", "Z")


@pytest.fixture
def alertmanager(tmp_path):
    exe = need_tool("prometheus-alertmanager", "alertmanager")
    procs = []

    def start(service_url, config=CONFIG, args=()):
        token_file = tmp_path / "am-token"
        token_file.write_text(TOKEN + "\n")
        cfg = tmp_path / "alertmanager.yml"
        cfg.write_text(config.format(url=service_url, token_file=token_file))
        port = free_port()
        p = subprocess.Popen([exe, f"--config.file={cfg}", f"--storage.path={tmp_path / 'am-data'}",
                              f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                              "--log.level=warn", *args], stdout=subprocess.DEVNULL, stderr=open(tmp_path / "am.log", "wb"))
        procs.append(p)
        url = f"http://127.0.0.1:{port}"

        def ready():
            try:
                return httpx.get(url + "/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 20, 0.1, "alertmanager ready")
        return url

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def test_real_alertmanager_trips_each_level_once_and_releases_after_recovery(tmp_path, alertmanager):
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    try:
        with LiveService(tmp_path / "s.sqlite", gw.url, hold_s=0.5) as svc:
            am = alertmanager(svc.url)
            labels = _labels()
            start = datetime.now(UTC) - timedelta(seconds=5)
            body = [{"labels": lb, "startsAt": _rfc3339(start)} for lb in labels]
            assert httpx.post(am + "/api/v2/alerts", json=body, timeout=5).status_code == 200
            wait_for(lambda: len(read_log(tmp_path / "gw.jsonl")) >= 3, 15, 0.1, "three trips")
            # Alertmanager re-notifies the groups meanwhile; nothing more may reach the gateway.
            time.sleep(1.5)
            state = svc.state()
            assert state["levels"] == {'{cluster="prod-a",hw_id="GPU-5f3c"}': 1,
                                       '{cluster="prod-a",host_name="node-7",engine="vllm-0"}': 3}
            # the fingerprints Alertmanager computed are the ones we compute from the labels
            held = {a for sc in state["scopes"] for lv in sc["levels"].values() for a in lv["alerts"]}
            assert held == {f"{lb['alertname']}/{fingerprint(lb)}" for lb in labels if "fuse_action" in lb}

            end = datetime.now(UTC)
            body = [{"labels": lb, "startsAt": _rfc3339(start), "endsAt": _rfc3339(end)} for lb in labels]
            assert httpx.post(am + "/api/v2/alerts", json=body, timeout=5).status_code == 200
            wait_for(lambda: len(read_log(tmp_path / "gw.jsonl")) >= 6, 15, 0.1, "three releases")
            time.sleep(1.0)
            assert svc.state()["levels"] == {}
    finally:
        gw.stop()
    log = read_log(tmp_path / "gw.jsonl")
    assert sorted((r["state"], r["level"], r["action"]) for r in log) == [
        ("release", 1, "freeze_admissions"), ("release", 2, "text_only_fallback"), ("release", 3, "kv_cache_eviction"),
        ("trip", 1, "freeze_admissions"), ("trip", 2, "text_only_fallback"), ("trip", 3, "kv_cache_eviction")]
    assert not any(r["duplicate"] for r in log)
    assert {r["level"]: r["scope"] for r in log if r["state"] == "trip"}[3] == {
        "cluster": "prod-a", "host_name": "node-7", "engine": "vllm-0"}


def test_real_alertmanager_without_the_right_token_changes_nothing(tmp_path, alertmanager):
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    try:
        with LiveService(tmp_path / "s.sqlite", gw.url, hold_s=0.5) as svc:
            am = alertmanager(svc.url)
            (tmp_path / "am-token").write_text("not-the-token\n")  # Alertmanager re-reads it per request
            lb = _labels()[0]
            body = [{"labels": lb, "startsAt": _rfc3339(datetime.now(UTC))}]
            assert httpx.post(am + "/api/v2/alerts", json=body, timeout=5).status_code == 200
            wait_for(lambda: 'outcome="http_401"' in httpx.get(svc.url + "/metrics").text, 15, 0.1, "a 401")
            assert svc.state()["levels"] == {}
    finally:
        gw.stop()
    assert read_log(tmp_path / "gw.jsonl") == []


class _People:
    """The people's receiver: a loopback webhook that records the alert names it is sent (``got``:
    (alertname, fusebox marker)) and every alert as sent (``alerts``: Alertmanager's webhook
    payload's alerts, labels and status)."""

    def __init__(self):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        got = self.got = set()
        alerts: list[dict] = []
        self.alerts = alerts

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 -- http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                got.update((a["labels"]["alertname"], a["labels"].get("fusebox", "")) for a in body["alerts"])
                alerts.extend(body["alerts"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/people"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_generated_routing_sends_only_fusebox_fuse_tiers_to_the_fuse(tmp_path, alertmanager):
    """The generated config (shipped spec, short group waits): a fuse-tier alert with the marker
    trips its level; the same labels without the marker, or with another spec's marker, would trip
    the fuse if they reached it (their alert and action are the spec's), but Alertmanager sends them
    to the people only; warnings and other teams' criticals reach the people only as well."""
    from _support import SPEC

    from fusebox.generator.render_alertmanager import render_alertmanager
    from fusebox.generator.yamlout import dump_yaml
    from fusebox.spec import parse_spec

    people = _People()
    text = SPEC.read_text()
    for old, new in (("group_wait_critical: 5s", "group_wait_critical: 100ms"), ("group_wait: 30s", "group_wait: 100ms"),
                     ("group_interval: 1m", "group_interval: 500ms"),
                     ("  human_receiver:\n    name: oncall\n",
                      f"  human_receiver:\n    name: oncall\n    webhook_configs: [{{url: '{people.url}'}}]\n")):
        assert old in text
        text = text.replace(old, new, 1)
    spec = parse_spec(text.replace("webhook_url: http://127.0.0.1:9095/alertmanager", "webhook_url: URL", 1)
                      .replace("credentials_file: /etc/alertmanager/fusebox-fuse.token", "credentials_file: TOKEN_FILE", 1),
                      "fusebox.yaml")
    config = dump_yaml(render_alertmanager(spec)).replace("URL", "{url}/alertmanager").replace("TOKEN_FILE", "{token_file}")
    gpu = {"alertname": "GPUMemoryUtilizationHigh", "severity": "critical", "signal": "gpu_memory_utilization",
           "fuse_action": "freeze_admissions", "fuse_level": "1", "cluster": "prod-a"}
    labels = [
        {**gpu, "fusebox": spec.name, "hw_id": "GPU-ours"},
        {**gpu, "hw_id": "GPU-no-marker"},
        {**gpu, "fusebox": "someone-else", "hw_id": "GPU-other-spec"},
        {"alertname": "KVCacheGrowthRateHigh", "severity": "warning", "signal": "kv_cache_growth_rate",
         "fusebox": spec.name, "cluster": "prod-a", "engine": "vllm-0"},
        {"alertname": "KubePodCrashLooping", "severity": "critical", "namespace": "inference", "pod": "vllm-0"},
    ]
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    try:
        with LiveService(tmp_path / "s.sqlite", gw.url, hold_s=0.5) as svc:
            am = alertmanager(svc.url, config)
            start = datetime.now(UTC) - timedelta(seconds=5)
            body = [{"labels": lb, "startsAt": _rfc3339(start)} for lb in labels]
            assert httpx.post(am + "/api/v2/alerts", json=body, timeout=5).status_code == 200
            wait_for(lambda: len(people.got) >= 5 and read_log(tmp_path / "gw.jsonl"), 15, 0.1, "the people and the fuse told")
            time.sleep(1.5)  # re-notifications meanwhile change nothing
            assert svc.state()["levels"] == {'{cluster="prod-a",hw_id="GPU-ours"}': 1}
    finally:
        gw.stop()
        people.close()
    assert [(r["state"], r["level"], r["scope"]) for r in read_log(tmp_path / "gw.jsonl")] == [
        ("trip", 1, {"cluster": "prod-a", "hw_id": "GPU-ours"})]
    assert people.got == {("GPUMemoryUtilizationHigh", spec.name), ("GPUMemoryUtilizationHigh", ""),
                          ("GPUMemoryUtilizationHigh", "someone-else"), ("KVCacheGrowthRateHigh", spec.name),
                          ("KubePodCrashLooping", "")}
