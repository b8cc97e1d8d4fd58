"""A real Alertmanager (Debian's prometheus-alertmanager) fires real notifications at the service.

Alerts are posted to Alertmanager's v2 API; Alertmanager groups them and calls the webhook with
the bearer token from ``http_config.authorization.credentials_file``, as the generated config does.
"""

from __future__ import annotations

import subprocess
import time
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from _fuse_support import CRITICAL, TOKEN, LiveService, free_port, need_tool, wait_for

from fusebox.fuse import fingerprint
from fusebox.fuse.gateway import ReferenceGateway, read_log

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

    def start(service_url):
        token_file = tmp_path / "am-token"
        token_file.write_text(TOKEN + "\n")
        cfg = tmp_path / "alertmanager.yml"
        cfg.write_text(CONFIG.format(url=service_url, token_file=token_file))
        port = free_port()
        p = subprocess.Popen([exe, f"--config.file={cfg}", f"--storage.path={tmp_path / 'am-data'}",
                              f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                              "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=open(tmp_path / "am.log", "wb"))
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
            start = datetime.now(timezone.utc) - timedelta(seconds=5)
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

            end = datetime.now(timezone.utc)
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
            body = [{"labels": lb, "startsAt": _rfc3339(datetime.now(timezone.utc))}]
            assert httpx.post(am + "/api/v2/alerts", json=body, timeout=5).status_code == 200
            wait_for(lambda: 'outcome="http_401"' in httpx.get(svc.url + "/metrics").text, 15, 0.1, "a 401")
            assert svc.state()["levels"] == {}
    finally:
        gw.stop()
    assert read_log(tmp_path / "gw.jsonl") == []
