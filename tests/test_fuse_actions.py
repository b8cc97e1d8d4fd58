"""Action adapters: the vLLM /reset_prefix_cache call on level-3 trips only, and dry-run calls nothing.

The vLLM server is the user's own system, absent here: a stand-in records the POSTs it gets."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from _fuse_support import GW_TOKEN, LiveService, alert, payload, wait_for

from fusebox.demo.gateway import ReferenceGateway, read_log
from fusebox.fuse.actions import DryRun, HttpGateway, VllmResetPrefixCache

ENG = {"cluster": "a", "host_name": "h1", "engine": "vllm-0"}


def fake_vllm():
    seen = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, seen


def test_kv_eviction_trip_resets_the_prefix_cache_of_the_matching_engine_only(tmp_path):
    srv, seen = fake_vllm()
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    vurl = f"http://127.0.0.1:{srv.server_address[1]}"
    adapters = [HttpGateway(gw.url), VllmResetPrefixCache(vurl, engine="vllm-0"),
                VllmResetPrefixCache(vurl, engine="other-engine")]
    t0 = time.time() - 30
    try:
        with LiveService(tmp_path / "s.sqlite", adapters=adapters, hold_s=0.1) as svc:
            svc.post(payload(alert("KVCacheGrowthRateHigh", starts=t0, **ENG)))
            svc.post(payload(alert("AlignmentLatencyP95High", starts=t0, **ENG)))
            svc.post(payload(alert("KVCacheGrowthRateHigh", "resolved", starts=t0, **ENG)))
            wait_for(lambda: len(read_log(tmp_path / "gw.jsonl")) == 3, 5, what="trip 3, trip 2, release 3")
            wait_for(lambda: svc.state()["pending_actions"] == 0, 5, what="outbox drained")
    finally:
        gw.stop()
        srv.shutdown()
    assert seen == ["/reset_prefix_cache"]  # one level-3 trip on vllm-0; nothing for level 2 or the release


def test_dry_run_logs_and_calls_nothing(tmp_path):
    dry = DryRun()
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    try:
        with LiveService(tmp_path / "s.sqlite", adapters=[dry], dry_run=True) as svc:
            svc.post(payload(alert("GPUMemoryUtilizationHigh", cluster="a", hw_id="GPU-1")))
            wait_for(lambda: svc.state()["pending_actions"] == 0, 5, what="dry-run applied")
            assert svc.state()["levels"] == {'{cluster="a",hw_id="GPU-1"}': 1}
    finally:
        gw.stop()
    assert [(p["state"], p["action"]) for p in dry.seen] == [("trip", "freeze_admissions")]
    assert read_log(tmp_path / "gw.jsonl") == []


BEARER = {
    "the canonical scheme matches": ("Bearer tok", True),
    "a lower-case scheme matches (RFC 7235: schemes are case-insensitive)": ("bearer tok", True),
    "a mixed-case scheme with two spaces matches": ("bEaReR  tok", True),
    "a token differing in case does not match": ("Bearer TOK", False),
    "another scheme does not match": ("Basic tok", False),
    "the token without a scheme does not match": ("tok", False),
    "no header does not match": (None, False),
}


@pytest.mark.parametrize("header,ok", BEARER.values(), ids=BEARER.keys())
def test_bearer_matches(header, ok):
    from fusebox.fuse.actions import bearer_matches

    assert bearer_matches(header, "tok") is ok


@pytest.mark.process
def test_reference_gateway_accepts_a_lower_case_bearer_scheme(tmp_path):
    from fusebox.demo.gateway import ReferenceGateway

    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl", GW_TOKEN)
    gw.start()
    try:
        body = {"action": "freeze_admissions", "level": 1, "state": "trip", "reason": "r", "scope": {},
                "decision_id": "d1"}
        r = httpx.post(gw.url + "/v1/control/fuse", json=body, headers={"Authorization": f"bearer {GW_TOKEN}"}, timeout=5)
        assert r.status_code == 200
    finally:
        gw.stop()


@pytest.mark.process
def test_reference_gateway_answers_400_to_a_deeply_nested_body(tmp_path):
    from fusebox.demo.gateway import ReferenceGateway

    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl", GW_TOKEN)
    gw.start()
    try:
        r = httpx.post(gw.url + "/v1/control/fuse", content="[" * 100_000 + "]" * 100_000,
                       headers={"Authorization": f"Bearer {GW_TOKEN}"}, timeout=5)
        assert r.status_code == 400
        assert read_log(tmp_path / "gw.jsonl") == []
    finally:
        gw.stop()
