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
from fusebox.fuse.adapters.gateway import DryRun, HttpGateway, VllmResetPrefixCache

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
    assert [(p.state, p.action) for p in dry.seen] == [("trip", "freeze_admissions")]
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
    from fusebox.fuse.adapters.gateway import bearer_matches

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


# ------------------------------------------------------------------ connections and the plain send
@pytest.mark.process
def test_the_reference_gateway_keeps_the_connection_and_stop_closes_it(tmp_path):
    """Two calls on one HTTP/1.1 connection are both applied (no reconnect: the same socket); a call
    whose body was not read (401) closes it; after stop() a kept connection is closed too, so the
    next call fails as against a gateway that is down."""
    import http.client
    import json

    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl", token=GW_TOKEN).start()
    conn = http.client.HTTPConnection(gw.host, gw.port, timeout=5)
    try:
        auth = {"Authorization": f"Bearer {GW_TOKEN}", "Content-Type": "application/json"}
        first = None
        for i in range(2):
            body = {"action": "freeze_admissions", "level": 1, "state": "trip", "reason": "r",
                    "scope": {"cluster": "a"}, "decision_id": f"d{i}"}
            conn.request("POST", "/v1/control/fuse", json.dumps(body), auth)
            r = conn.getresponse()
            assert (r.status, json.loads(r.read())) == (200, {"applied": True, "duplicate": False})
            assert r.version == 11 and not r.will_close
            first = first or conn.sock
            assert conn.sock is first  # the same connection
        conn.request("POST", "/v1/control/fuse", b'{"x": 1}', {"Authorization": "Bearer wrong"})
        r = conn.getresponse()
        assert r.status == 401 and r.will_close and r.getheader("Connection") == "close"
        r.read()
        conn.request("POST", "/v1/control/fuse", json.dumps({**body, "decision_id": "d2"}), auth)
        assert conn.getresponse().read() and conn.sock is not first  # a new connection
        gw.stop()
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            conn.request("POST", "/v1/control/fuse", json.dumps({**body, "decision_id": "d3"}), auth)
            conn.getresponse()
    finally:
        conn.close()
        gw.stop()
    assert [r["decision_id"] for r in read_log(tmp_path / "gw.jsonl")] == ["d0", "d1", "d2"]


@pytest.mark.process
def test_an_adapter_client_sends_credentials_of_its_url_and_keeps_cookies_as_httpx_does():
    """deadline_client's client (httpx's, with the deadline's network backend): a URL with a user
    and password is sent with Basic auth (RFC 7617: base64 of ``user:pass``); a cookie an answer sets
    is sent back on the next request."""
    import base64

    from fusebox.fuse.adapters.transport import deadline_client

    seen: list[dict] = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(200)
            self.send_header("Set-Cookie", "lane=b; Path=/")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        c = deadline_client(5)
        assert c.get(f"http://127.0.0.1:{port}/x").text == "ok"
        assert c.get(f"http://127.0.0.1:{port}/y").status_code == 200
        assert deadline_client(5).get(f"http://u:p@127.0.0.1:{port}/z").status_code == 200
    finally:
        server.shutdown()
        server.server_close()
    assert "cookie" not in seen[0] and seen[1]["cookie"] == "lane=b"
    assert "authorization" not in seen[1]
    assert seen[2]["authorization"] == "Basic " + base64.b64encode(b"u:p").decode()
