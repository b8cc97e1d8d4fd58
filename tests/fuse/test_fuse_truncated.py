"""Notifications Alertmanager truncated (webhook ``max_alerts``: ``truncatedAlerts`` = the alerts it
left out) are acted on as sent, and the truncation is recorded: counted in /metrics, an audit row of
kind ``truncated``, and a line on the status page."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime

import httpx
import pytest
from _fuse_support import TOKEN, LiveService, alert, am_config, payload, wait_for

from fusebox import conventions as C
from fusebox.demo.gateway import ReferenceGateway, read_log

AUTH = {"Authorization": f"Bearer {TOKEN}"}
GPU = {"cluster": "a", "hw_id": "GPU-1"}
T0 = 1_700_000_000.0
COUNTER = C.FUSE_METRICS["truncated_alerts"]


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


# group_wait 2s: Alertmanager flushes a new group once its first alert has waited group_wait, so all
# five (posted in one call, received within milliseconds) are in the one notification.
AM_CONFIG = am_config("alertname, cluster, hw_id", "2s", "1h", max_alerts=2)


@pytest.mark.tools
def test_a_real_alertmanager_with_max_alerts_2_and_5_alerts_sends_truncated_alerts_3(tmp_path, alertmanager):
    """Five alerts of one group (one GPU, five replicas of the rule's sender), max_alerts 2:
    Alertmanager sends two and says truncatedAlerts 3; the fuse trips level 1 once and records 3."""
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    try:
        with LiveService(tmp_path / "s.sqlite", gw.url, hold_s=60) as svc:
            am = alertmanager(svc.url, AM_CONFIG)
            # startsAt now: an alert older than group_wait is flushed at once, on arrival (Alertmanager's
            # dispatcher), which sent the first two or three alone, untruncated, and the group's next
            # flush was an hour away (a full run failed so: its debug log showed the flush of two)
            start = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            labels = [{"alertname": "GPUMemoryUtilizationHigh", "severity": "critical",
                       "signal": "gpu_memory_utilization", "fuse_action": "freeze_admissions", "fuse_level": "1",
                       "replica": f"r{i}", **GPU} for i in range(5)]
            body = [{"labels": lb, "startsAt": start} for lb in labels]
            assert httpx.post(am + "/api/v2/alerts", json=body, timeout=5).status_code == 200
            # generous: on a loaded machine Alertmanager's first flush and the webhook's commit can take a while
            try:
                wait_for(lambda: svc.service.store.audit_log(kinds=("truncated",)), 60, 0.1, "a truncated notification")
            except AssertionError as e:
                raise AssertionError(f"{e}; the fuse's audit: {svc.service.store.audit_log()[-5:]}; alertmanager log: "
                                     f"{(tmp_path / 'am.log').read_text()[-3000:]}") from None
            wait_for(lambda: read_log(tmp_path / "gw.jsonl"), 10, 0.05, "the trip")
            rows = svc.service.store.audit_log(kinds=("truncated",))
            metrics = httpx.get(svc.url + "/metrics", timeout=5).text
    finally:
        gw.stop()
    assert [(r["detail"]["truncated_alerts"], r["detail"]["alerts"]) for r in rows] == [(3, 2)]
    assert _metric(metrics, COUNTER) == 3.0
    assert [(r["state"], r["level"]) for r in read_log(tmp_path / "gw.jsonl")] == [("trip", 1)]
