"""Notifications Alertmanager truncated (webhook ``max_alerts``: ``truncatedAlerts`` = the alerts it
left out) are acted on as sent, and the truncation is recorded: counted in /metrics, an audit row of
kind ``truncated``, and a line on the status page."""

from __future__ import annotations

import html
import re
import subprocess
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from _fuse_support import PEOPLE, TOKEN, LiveService, alert, dry_run_service, free_port, need_tool, payload, wait_for
from fastapi.testclient import TestClient

from fusebox import conventions as C
from fusebox.demo.gateway import ReferenceGateway, read_log
from fusebox.fuse.http.app import create_app
from fusebox.fuse.tokens import Tokens

AUTH = {"Authorization": f"Bearer {TOKEN}"}
GPU = {"cluster": "a", "hw_id": "GPU-1"}
T0 = 1_700_000_000.0
COUNTER = C.FUSE_METRICS["truncated_alerts"]


@pytest.fixture
def svc(tmp_path):
    s = dry_run_service(tmp_path)
    yield s
    s.store.close()


@pytest.fixture
def client(svc):
    return TestClient(create_app(svc, Tokens(webhook=TOKEN, people=dict(PEOPLE))))


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_a_truncated_firing_trips_and_the_truncation_is_counted_audited_and_shown(client, svc):
    body = payload(alert("GPUMemoryUtilizationHigh", starts=T0, **GPU), truncated=3)
    body["groupKey"] = '{}/{fusebox="fusebox"}:{alertname="GPUMemoryUtilizationHigh"}'
    r = client.post("/alertmanager", json=body, headers=AUTH)
    assert r.status_code == 200
    assert [(d["state"], d["level"]) for d in r.json()["decisions"]] == [("trip", 1)]

    assert _metric(client.get("/metrics").text, COUNTER) == 3.0

    rows = svc.store.audit_log()
    trunc = [a for a in rows if a["kind"] == "truncated"]
    assert len(trunc) == 1
    assert trunc[0]["detail"] == {"truncated_alerts": 3, "alerts": 1, "group_key": body["groupKey"],
                                  "receiver": "fusebox-fuse"}
    assert "3 alert(s)" in trunc[0]["reason"]
    # the decision made from that notification says it too
    trip = next(a for a in rows if a["kind"] == "trip")
    assert trip["detail"]["truncated_alerts"] == 3

    page = client.get("/", headers=AUTH).text
    line = html.unescape(re.search(r'<p[^>]*id="truncated"[^>]*>(.*?)</p>', page, re.S).group(1))
    assert "left 3 alert(s) out" in line and "1 notification(s)" in line


def test_a_truncated_notification_that_changes_nothing_is_still_recorded(client, svc):
    a = alert("GPUMemoryUtilizationHigh", starts=T0, severity="warning", **GPU)  # trips nothing
    assert client.post("/alertmanager", json=payload(a, truncated=5), headers=AUTH).status_code == 200
    assert client.post("/alertmanager", json=payload(a, truncated=2), headers=AUTH).status_code == 200
    assert [a["detail"]["truncated_alerts"] for a in svc.store.audit_log(kinds=("truncated",))] == [2, 5]
    assert _metric(client.get("/metrics").text, COUNTER) == 7.0
    assert svc.state()["truncated"]["notifications"] == 2
    assert svc.state()["truncated"]["last"]["truncated_alerts"] == 2


def test_a_notification_not_truncated_records_no_truncation(client, svc):
    body = payload(alert("GPUMemoryUtilizationHigh", starts=T0, **GPU))
    assert client.post("/alertmanager", json=body, headers=AUTH).status_code == 200
    assert svc.store.audit_log(kinds=("truncated",)) == []
    assert _metric(client.get("/metrics").text, COUNTER) == 0.0
    page = client.get("/", headers=AUTH).text
    assert 'id="truncated"' not in page


AM_CONFIG = """
route:
  receiver: fusebox-fuse
  group_by: [alertname, cluster, hw_id]
  group_wait: 200ms
  group_interval: 1h
  repeat_interval: 1h
receivers:
  - name: fusebox-fuse
    webhook_configs:
      - url: {url}/alertmanager
        send_resolved: true
        max_alerts: 2
        http_config:
          authorization:
            credentials_file: {token_file}
"""


@pytest.mark.tools
def test_a_real_alertmanager_with_max_alerts_2_and_5_alerts_sends_truncated_alerts_3(tmp_path):
    """Five alerts of one group (one GPU, five replicas of the rule's sender), max_alerts 2:
    Alertmanager sends two and says truncatedAlerts 3; the fuse trips level 1 once and records 3."""
    exe = need_tool("prometheus-alertmanager", "alertmanager")
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    proc = None
    try:
        with LiveService(tmp_path / "s.sqlite", gw.url, hold_s=60) as svc:
            (tmp_path / "am-token").write_text(TOKEN + "\n")
            cfg = tmp_path / "alertmanager.yml"
            cfg.write_text(AM_CONFIG.format(url=svc.url, token_file=tmp_path / "am-token"))
            port = free_port()
            proc = subprocess.Popen([exe, f"--config.file={cfg}", f"--storage.path={tmp_path / 'am-data'}",
                                     f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                                     "--log.level=warn"], stdout=subprocess.DEVNULL,
                                    stderr=open(tmp_path / "am.log", "wb"))
            am = f"http://127.0.0.1:{port}"

            def ready():
                try:
                    return httpx.get(am + "/-/ready", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(ready, 20, 0.1, "alertmanager ready")
            start = (datetime.now(UTC) - timedelta(seconds=5)).isoformat().replace("+00:00", "Z")
            labels = [{"alertname": "GPUMemoryUtilizationHigh", "severity": "critical",
                       "signal": "gpu_memory_utilization", "fuse_action": "freeze_admissions", "fuse_level": "1",
                       "replica": f"r{i}", **GPU} for i in range(5)]
            body = [{"labels": lb, "startsAt": start} for lb in labels]
            assert httpx.post(am + "/api/v2/alerts", json=body, timeout=5).status_code == 200
            # generous: on a loaded machine Alertmanager's first flush and the webhook's commit can take a while
            try:
                wait_for(lambda: svc.service.store.audit_log(kinds=("truncated",)), 60, 0.1, "a truncated notification")
            except AssertionError as e:
                raise AssertionError(f"{e}; alertmanager log: {(tmp_path / 'am.log').read_text()[-2000:]}") from None
            wait_for(lambda: read_log(tmp_path / "gw.jsonl"), 10, 0.05, "the trip")
            rows = svc.service.store.audit_log(kinds=("truncated",))
            metrics = httpx.get(svc.url + "/metrics", timeout=5).text
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        gw.stop()
    assert [(r["detail"]["truncated_alerts"], r["detail"]["alerts"]) for r in rows] == [(3, 2)]
    assert _metric(metrics, COUNTER) == 3.0
    assert [(r["state"], r["level"]) for r in read_log(tmp_path / "gw.jsonl")] == [("trip", 1)]
