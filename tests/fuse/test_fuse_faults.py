"""Fault tests over real HTTP: the service (uvicorn) calling the reference gateway, which logs
every control call as a JSON line. Each test asserts the count of calls the gateway saw."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
from _fuse_support import SPEC, TOKEN, LiveService, alert, free_port, payload, wait_for

from fusebox.demo.gateway import ReferenceGateway, read_log

GPU = {"cluster": "a", "hw_id": "GPU-1"}
T0 = time.time() - 60


def calls(log, duplicate=None):
    return [(r["state"], r["level"], r["action"]) for r in read_log(log)
            if duplicate is None or r["duplicate"] == duplicate]


def test_the_same_notification_three_times_makes_one_gateway_call(tmp_path):
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    try:
        with LiveService(tmp_path / "s.sqlite", gw.url) as svc:
            body = payload(alert("GPUMemoryUtilizationHigh", starts=T0, **GPU))
            assert [svc.post(body).status_code for _ in range(3)] == [200, 200, 200]
            wait_for(lambda: svc.state()["pending_actions"] == 0, what="outbox drained")
            time.sleep(0.2)  # anything else would have been sent by now
    finally:
        gw.stop()
    assert calls(tmp_path / "gw.jsonl") == [("trip", 1, "freeze_admissions")]


def test_a_gateway_down_for_10s_then_up_gets_the_decision_applied_once(tmp_path):
    down_s = float(os.environ.get("FUSEBOX_TEST_GATEWAY_DOWN_S", "10"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with LiveService(tmp_path / "s.sqlite", url, backoff_s=0.05, backoff_max_s=0.5) as svc:
        t_fire = time.monotonic()
        assert svc.post(payload(alert("KVCacheGrowthRateHigh", starts=T0, cluster="a", engine="e0"))).status_code == 200
        time.sleep(down_s)
        assert svc.state()["pending_actions"] == 1  # not lost, not applied
        gw = ReferenceGateway("127.0.0.1", port, tmp_path / "gw.jsonl").start()
        try:
            wait_for(lambda: svc.state()["pending_actions"] == 0, 5, what="applied after the gateway came up")
            time.sleep(0.3)
            failures = httpx.get(svc.url + "/metrics").text
        finally:
            gw.stop()
    assert calls(tmp_path / "gw.jsonl") == [("trip", 3, "kv_cache_eviction")]
    assert time.monotonic() - t_fire >= down_s
    # retried while down: with backoff 0.05 s doubling to 0.5 s, 10 s makes at least 15 attempts
    n = float(failures.split('fusebox_fuse_action_failures_total{adapter="gateway"} ')[1].split()[0])
    assert n >= (15 if down_s >= 10 else 2)


def _serve(state, gw_url, port, token_file):
    return subprocess.Popen(
        [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen", f"127.0.0.1:{port}",
         "--state", str(state), "--token-file", str(token_file), "--gateway-url", gw_url, "--hold", "0.3",
         "--tick", "0.05", "--retry-backoff", "0.05", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _post(port, body):
    return httpx.post(f"http://127.0.0.1:{port}/alertmanager", json=body,
                      headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)


def _up(port):
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_restart_between_firing_and_resolved_makes_one_trip_and_one_release(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    state = tmp_path / "s.sqlite"
    firing = payload(alert("AlignmentLatencyP95High", starts=T0, cluster="a", host_name="h1", engine="e0"))
    resolved = payload(alert("AlignmentLatencyP95High", "resolved", starts=T0, cluster="a", host_name="h1", engine="e0"))
    try:
        port = free_port()
        p = _serve(state, gw.url, port, token_file)
        try:
            wait_for(lambda: _up(port), 20, 0.1, "service start")
            assert _post(port, firing).status_code == 200
            wait_for(lambda: len(read_log(tmp_path / "gw.jsonl")) == 1, 5, what="trip applied")
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(10)
        port = free_port()
        p = _serve(state, gw.url, port, token_file)
        try:
            wait_for(lambda: _up(port), 20, 0.1, "service restart")
            state = httpx.get(f"http://127.0.0.1:{port}/state", headers={"Authorization": f"Bearer {TOKEN}"}).json()
            assert state["levels"] == {
                '{cluster="a",host_name="h1",engine="e0"}': 2}
            assert _post(port, firing).status_code == 200  # Alertmanager's repeat after the restart
            assert _post(port, resolved).status_code == 200
            wait_for(lambda: len(read_log(tmp_path / "gw.jsonl")) >= 2, 5, what="release applied")
            time.sleep(0.3)
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(10)
    finally:
        gw.stop()
    assert calls(tmp_path / "gw.jsonl") == [("trip", 2, "text_only_fallback"), ("release", 2, "text_only_fallback")]


def test_resolved_then_a_stale_firing_does_not_trip_again(tmp_path):
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    try:
        with LiveService(tmp_path / "s.sqlite", gw.url, hold_s=0.2) as svc:
            svc.post(payload(alert("GPUMemoryUtilizationHigh", starts=T0, **GPU)))
            svc.post(payload(alert("GPUMemoryUtilizationHigh", "resolved", starts=T0, **GPU)))
            wait_for(lambda: len(read_log(tmp_path / "gw.jsonl")) == 2, 5, what="trip and release")
            assert svc.post(payload(alert("GPUMemoryUtilizationHigh", starts=T0, **GPU))).status_code == 200  # stale
            time.sleep(0.5)
            assert svc.state()["levels"] == {}
    finally:
        gw.stop()
    assert calls(tmp_path / "gw.jsonl") == [("trip", 1, "freeze_admissions"), ("release", 1, "freeze_admissions")]


def test_a_flapping_signal_trips_at_most_once_per_hold_time(tmp_path):
    """Fires and clears every 0.1 s for 2 s (new startsAt each time), hold 1 s: one trip, then one
    release once it stays quiet for the hold time."""
    hold = 1.0
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    try:
        with LiveService(tmp_path / "s.sqlite", gw.url, hold_s=hold) as svc:
            t_start = time.monotonic()
            for i in range(20):
                s = T0 + i
                svc.post(payload(alert("GPUMemoryUtilizationHigh", starts=s, **GPU)))
                time.sleep(0.05)
                svc.post(payload(alert("GPUMemoryUtilizationHigh", "resolved", starts=s, **GPU)))
                time.sleep(0.05)
            elapsed = time.monotonic() - t_start
            wait_for(lambda: len(read_log(tmp_path / "gw.jsonl")) == 2, 5, what="the release after the flapping")
            time.sleep(0.2)
    finally:
        gw.stop()
    log = calls(tmp_path / "gw.jsonl")
    assert log.count(("trip", 1, "freeze_admissions")) <= int(elapsed / hold) + 1
    assert log == [("trip", 1, "freeze_admissions"), ("release", 1, "freeze_admissions")]
