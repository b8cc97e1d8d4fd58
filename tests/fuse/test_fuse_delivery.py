"""Outbox delivery: ordered per (adapter, scope), never held up by another adapter or scope,
failures classified (permanent 4xx, bounded best-effort vLLM resets, gateway retried until it
accepts), and a dispatcher that survives its store failing.

The gateway and the vLLM engines are the user's systems, absent here: stand-ins over real HTTP
answer what each test scripts and record every request. Backoffs are 10-50 ms, so no test sleeps
long; every test asserts the number of calls each side saw."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from _fuse_support import SPEC, alert, free_port, payload, wait_for

from fusebox import conventions as C
from fusebox.demo.gateway import ReferenceGateway, read_log
from fusebox.fuse.adapters.gateway import HttpGateway, VllmResetPrefixCache
from fusebox.fuse.adapters.protocol import ActionError, is_permanent
from fusebox.fuse.intake.payload import parse_payload
from fusebox.fuse.rules import FuseRules
from fusebox.fuse.service import FuseService
from fusebox.fuse.store import Store, StoreError
from fusebox.spec import load_spec

M = C.FUSE_METRICS
E0 = {"cluster": "c", "host_name": "h1", "engine": "e0"}
GPU_Z = {"cluster": "c", "host_name": "h2", "hw_id": "GPU-Z"}
A = {"cluster": "a", "hw_id": "GPU-1"}
B = {"cluster": "b", "hw_id": "GPU-2"}
T0 = time.time() - 60


class Stub:
    """An HTTP server answering ``answer(path, body, n) -> status`` (n: 0-based request count) and
    recording ``(path, state, action, level, scope, decision_id, status)`` per request. ``hold``
    (an Event), when given, keeps every request waiting until it is set (an engine that hangs)."""

    def __init__(self, answer=lambda path, body, n: 200, hold: threading.Event | None = None):
        self.requests: list[tuple] = []
        lock = threading.Lock()
        stub = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else {}
                if hold is not None:
                    hold.wait(10)
                with lock:
                    code = answer(self.path, body, len(stub.requests))
                    stub.requests.append((self.path, body.get("state"), body.get("action"), body.get("level"),
                                          body.get("scope"), body.get("decision_id"), code))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def make_service(tmp_path, adapters, clock=time.time, hold_s=0.05):
    return FuseService(FuseRules.from_spec(load_spec(SPEC)), Store(tmp_path / "s.sqlite"), adapters,
                       hold_s=hold_s, backoff_s=0.01, backoff_max_s=0.05, tick_s=0.01, clock=clock)


def fire(svc, name, status="firing", **scope):
    return svc.handle(parse_payload(payload(alert(name, status, starts=T0, **scope)), svc.clock()))


def sample(svc, metric, **labels):
    return svc.metrics.registry.get_sample_value(metric, labels) or 0.0


def outbox(svc, adapter):
    return [(r["status"], r["attempts"]) for r in svc.store.outbox() if r["adapter"] == adapter]


def gateway_calls(stub):
    return [(state, action, status) for _, state, action, _, _, _, status in stub.requests]


# ------------------------------------------------------------------ the reviewer's reproduction
@pytest.mark.process
def test_a_dead_vllm_url_does_not_delay_the_gateway_call_for_another_gpu(tmp_path):
    """Level-3 trip on e0 with its vLLM engine down, then a level-1 trip on another GPU: the gateway
    gets both trips at once while the vLLM reset is still being retried."""
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    dead = VllmResetPrefixCache(f"http://127.0.0.1:{free_port()}", max_attempts=10_000, timeout_s=1)
    svc = make_service(tmp_path, [dead, HttpGateway(gw.url, timeout_s=1)])
    svc.start()
    try:
        t = time.monotonic()
        fire(svc, "KVCacheGrowthRateHigh", **E0)
        fire(svc, "GPUMemoryUtilizationHigh", **GPU_Z)
        wait_for(lambda: len(read_log(tmp_path / "gw.jsonl")) == 2, 2, what="both trips at the gateway")
        took = time.monotonic() - t
        wait_for(lambda: outbox(svc, dead.name)[0][1] >= 3, 2, what="vLLM reset retried")
        assert outbox(svc, dead.name)[0][0] == "pending"  # still retried: not lost, not blocking
        # the gateway logs a call before its answer reaches the fuse, which then marks the row applied
        wait_for(lambda: outbox(svc, "gateway") == [("applied", 1), ("applied", 1)], 2, what="both gateway rows applied")
        assert sample(svc, M["oldest_pending_age"]) > 0
        assert sample(svc, M["action_failures"], adapter="gateway") == 0
    finally:
        svc.stop()
        gw.stop()
    assert [(r["state"], r["action"], r["scope"]) for r in read_log(tmp_path / "gw.jsonl")] == [
        ("trip", "kv_cache_eviction", E0), ("trip", "freeze_admissions", GPU_Z)]
    assert took < 1.0  # the old dispatcher had sent nothing to the gateway after 3 s


def test_a_vllm_engine_that_hangs_does_not_delay_the_gateway(tmp_path):
    hang = threading.Event()
    vllm = Stub(hold=hang)
    gw = Stub()
    reset = VllmResetPrefixCache(vllm.url, timeout_s=5)
    svc = make_service(tmp_path, [reset, HttpGateway(gw.url, timeout_s=1)])
    svc.start()
    try:
        fire(svc, "KVCacheGrowthRateHigh", **E0)
        fire(svc, "GPUMemoryUtilizationHigh", **GPU_Z)
        wait_for(lambda: len(gw.requests) == 2, 2, what="both trips at the gateway while vLLM hangs")
        assert vllm.requests == []  # the reset is still waiting for its answer
        hang.set()
        wait_for(lambda: outbox(svc, reset.name) == [("applied", 1)], 5, what="the reset applied")
    finally:
        hang.set()
        svc.stop()
        gw.stop()
        vllm.stop()
    assert gateway_calls(gw) == [("trip", "kv_cache_eviction", 200), ("trip", "freeze_admissions", 200)]
    assert [r[0] for r in vllm.requests] == ["/reset_prefix_cache"]


def test_a_vllm_404_without_dev_mode_is_audited_failed_after_one_attempt(tmp_path):
    vllm = Stub(lambda path, body, n: 404)
    gw = Stub()
    reset = VllmResetPrefixCache(vllm.url, max_attempts=5)
    svc = make_service(tmp_path, [reset, HttpGateway(gw.url)])
    svc.start()
    try:
        fire(svc, "KVCacheGrowthRateHigh", **E0)
        wait_for(lambda: svc.store.pending_count() == 0, 3, what="outbox drained")
        failed = svc.store.audit_log(kinds=("failed",))
    finally:
        svc.stop()
        gw.stop()
        vllm.stop()
    assert len(vllm.requests) == 1  # 404 is permanent: no retry
    assert outbox(svc, reset.name) == [("failed", 1)]
    assert len(failed) == 1 and "HTTP 404" in failed[0]["reason"] and "VLLM_SERVER_DEV_MODE=1" in failed[0]["reason"]
    assert failed[0]["detail"]["status"] == 404
    assert sample(svc, M["action_failures"], adapter="vllm:*") == 1
    assert sample(svc, M["actions_given_up"], adapter="vllm:*", reason="permanent") == 1
    assert gateway_calls(gw) == [("trip", "kv_cache_eviction", 200)]


def test_a_dead_vllm_url_is_given_up_after_its_retry_budget(tmp_path):
    reset = VllmResetPrefixCache(f"http://127.0.0.1:{free_port()}", max_attempts=3, timeout_s=1)
    gw = Stub()
    svc = make_service(tmp_path, [reset, HttpGateway(gw.url)])
    svc.start()
    try:
        fire(svc, "KVCacheGrowthRateHigh", **E0)
        wait_for(lambda: svc.store.pending_count() == 0, 3, what="outbox drained")
        time.sleep(0.1)  # a fourth attempt would be due by now (backoff cap 50 ms)
        failed = svc.store.audit_log(kinds=("failed",))
    finally:
        svc.stop()
        gw.stop()
    assert outbox(svc, reset.name) == [("failed", 3)]
    assert [(f["kind"], f["level"], f["action"]) for f in failed] == [("failed", 3, "kv_cache_eviction")]
    assert "retries exhausted" in failed[0]["reason"] and "ConnectError" in failed[0]["reason"]
    assert sample(svc, M["action_failures"], adapter="vllm:*") == 3
    assert sample(svc, M["actions_given_up"], adapter="vllm:*", reason="retries_exhausted") == 1
    assert sample(svc, M["oldest_pending_age"]) == 0


# ------------------------------------------------------------------ order per scope
def test_trip_then_release_of_one_scope_stay_in_order_when_the_trip_first_fails(tmp_path):
    """Both decisions are in the outbox before the dispatcher starts; the gateway answers 503 to
    scope A's first two calls. A's release waits for A's trip; B's trip does not wait for A."""
    now = [T0 + 30]
    fails = {"n": 0}

    def answer(path, body, n):
        if body["scope"] == A and fails["n"] < 2:
            fails["n"] += 1
            return 503
        return 200

    gw = Stub(answer)
    svc = make_service(tmp_path, [HttpGateway(gw.url)], clock=lambda: now[0], hold_s=5)
    fire(svc, "GPUMemoryUtilizationHigh", **A)
    fire(svc, "GPUMemoryUtilizationHigh", "resolved", **A)
    now[0] += 6  # past the hold time
    assert [d["state"] for d in svc.tick()] == ["release"]
    fire(svc, "KVCacheGrowthRateHigh", **B)
    svc.start()
    try:
        wait_for(lambda: svc.store.pending_count() == 0, 3, what="outbox drained")
    finally:
        svc.stop()
        gw.stop()
    a = [(state, status) for _, state, _, _, scope, _, status in gw.requests if scope == A]
    b = [(state, status) for _, state, _, _, scope, _, status in gw.requests if scope == B]
    assert a == [("trip", 503), ("trip", 503), ("trip", 200), ("release", 200)]
    assert b == [("trip", 200)]
    assert gw.requests[0][4] == A and gw.requests[1][4] == B  # B went while A was backing off
    assert outbox(svc, "gateway") == [("applied", 3), ("applied", 1), ("applied", 1)]
    assert sample(svc, M["action_failures"], adapter="gateway") == 2


# ------------------------------------------------------------------ failure classes
def test_a_400_from_the_gateway_is_audited_failed_and_the_next_decision_goes_through(tmp_path):
    gw = Stub(lambda path, body, n: 400 if body["level"] == 1 else 200)
    svc = make_service(tmp_path, [HttpGateway(gw.url)])
    svc.start()
    try:
        fire(svc, "GPUMemoryUtilizationHigh", cluster="c", host_name="h1", engine="e0")  # level 1: 400
        fire(svc, "KVCacheGrowthRateHigh", **E0)  # level 3 on the same scope
        wait_for(lambda: svc.store.pending_count() == 0, 3, what="outbox drained")
        time.sleep(0.1)  # a retry of the 400 would be due by now
        failed = svc.store.audit_log(kinds=("failed",))
        applied = svc.store.audit_log(kinds=("applied",))
    finally:
        svc.stop()
        gw.stop()
    assert gateway_calls(gw) == [("trip", "freeze_admissions", 400), ("trip", "kv_cache_eviction", 200)]
    assert outbox(svc, "gateway") == [("failed", 1), ("applied", 1)]
    assert [(f["level"], f["source"], f["detail"]["status"]) for f in failed] == [(1, "gateway", 400)]
    assert "HTTP 400" in failed[0]["reason"] and "permanent" in failed[0]["reason"]
    assert [a["level"] for a in applied] == [3]
    assert sample(svc, M["action_failures"], adapter="gateway") == 1
    assert sample(svc, M["actions_given_up"], adapter="gateway", reason="permanent") == 1


@pytest.mark.parametrize("status,permanent", [
    (400, True), (401, True), (403, True), (404, True), (409, True), (422, True),
    (408, False), (425, False), (429, False), (500, False), (502, False), (503, False), (None, False)])
def test_4xx_but_408_425_429_are_permanent_5xx_and_no_answer_are_retried(status, permanent):
    assert is_permanent(status) is permanent
    assert ActionError("x", status).permanent is permanent


def test_a_429_from_the_gateway_is_retried_until_accepted(tmp_path):
    gw = Stub(lambda path, body, n: 429 if n < 3 else 200)
    svc = make_service(tmp_path, [HttpGateway(gw.url)])
    svc.start()
    try:
        fire(svc, "GPUMemoryUtilizationHigh", **A)
        wait_for(lambda: svc.store.pending_count() == 0, 3, what="applied")
    finally:
        svc.stop()
        gw.stop()
    assert [s for *_, s in gw.requests] == [429, 429, 429, 200]
    assert outbox(svc, "gateway") == [("applied", 4)]
    assert sample(svc, M["actions_given_up"], adapter="gateway", reason="permanent") == 0


@pytest.mark.process
def test_a_gateway_down_then_up_gets_exactly_one_call_per_decision(tmp_path):
    port = free_port()
    svc = make_service(tmp_path, [HttpGateway(f"http://127.0.0.1:{port}", timeout_s=1)], hold_s=0.05)
    svc.start()
    gw = None
    try:
        fire(svc, "GPUMemoryUtilizationHigh", **A)
        fire(svc, "KVCacheGrowthRateHigh", cluster="b", engine="e1")
        fire(svc, "GPUMemoryUtilizationHigh", "resolved", **A)  # A released after the 50 ms hold
        wait_for(lambda: svc.store.pending_count() == 3, 2, what="the release decided")
        wait_for(lambda: sample(svc, M["action_failures"], adapter="gateway") >= 6, 3, what="retries while down")
        assert svc.store.pending_count() == 3  # nothing lost while down
        gw = ReferenceGateway("127.0.0.1", port, tmp_path / "gw.jsonl").start()
        wait_for(lambda: svc.store.pending_count() == 0, 3, what="applied once up")
        time.sleep(0.1)  # a repeat would have been sent by now
    finally:
        svc.stop()
        if gw:
            gw.stop()
    log = read_log(tmp_path / "gw.jsonl")
    assert [(r["state"], r["level"], r["scope"], r["duplicate"]) for r in log if r["scope"] == A] == [
        ("trip", 1, A, False), ("release", 1, A, False)]
    assert len(log) == 3 and len({r["decision_id"] for r in log}) == 3
    assert not any(r["duplicate"] for r in log)
    assert sample(svc, M["actions_given_up"], adapter="gateway", reason="permanent") == 0


# ------------------------------------------------------------------ a robust loop
def _fail_once(obj, name, exc):
    real = getattr(obj, name)
    state = {"failed": 0}

    def wrapper(*args, **kw):
        if not state["failed"]:
            state["failed"] = 1
            raise exc
        return real(*args, **kw)

    setattr(obj, name, wrapper)
    return state


def test_store_errors_inside_the_dispatcher_are_counted_and_the_loop_goes_on(tmp_path):
    """The outbox read, the record of a failed attempt and the record of an applied one each fail
    once. The dispatcher counts three errors, keeps running, and the gateway still gets exactly one
    accepted call per decision (an applied call whose record failed is recorded, not sent again)."""
    gw = Stub(lambda path, body, n: 503 if n == 0 else 200)
    svc = make_service(tmp_path, [HttpGateway(gw.url)])
    fired = {
        "pending": _fail_once(svc.store, "pending", sqlite3.OperationalError("database is locked")),
        "mark_failed": _fail_once(svc.store, "mark_failed", StoreError("disk I/O error")),
        "mark_applied": _fail_once(svc.store, "mark_applied", StoreError("database or disk is full")),
    }
    svc.start()
    try:
        fire(svc, "GPUMemoryUtilizationHigh", **A)
        wait_for(lambda: svc.store.pending_count() == 0, 3, what="the first decision recorded as applied")
        fire(svc, "GPUMemoryUtilizationHigh", **B)
        wait_for(lambda: svc.store.pending_count() == 0, 3, what="the second decision applied")
        time.sleep(0.1)
        alive = [t.is_alive() for t in svc._threads if t.name == "fuse-dispatch-gateway"]
    finally:
        svc.stop()
        gw.stop()
    assert {k: v["failed"] for k, v in fired.items()} == {"pending": 1, "mark_failed": 1, "mark_applied": 1}
    assert alive == [True]
    assert sample(svc, M["dispatcher_errors"], adapter="gateway") == 3
    assert [(scope, status) for _, _, _, _, scope, _, status in gw.requests] == [(A, 503), (A, 200), (B, 200)]
    assert [(r["status"]) for r in svc.store.outbox()] == ["applied", "applied"]
    assert len(svc.store.audit_log(kinds=("applied",))) == 2


@pytest.mark.process
def test_the_oldest_pending_age_gauge_follows_the_clock_and_is_0_when_drained(tmp_path):
    now = [1_800_000_000.0]
    svc = make_service(tmp_path, [HttpGateway(f"http://127.0.0.1:{free_port()}")], clock=lambda: now[0])
    assert sample(svc, M["oldest_pending_age"]) == 0
    fire(svc, "GPUMemoryUtilizationHigh", **A)  # not started: the row stays pending
    now[0] += 42.5
    assert sample(svc, M["oldest_pending_age"]) == 42.5
    fire(svc, "GPUMemoryUtilizationHigh", **B)  # newer: the oldest still counts
    now[0] += 1
    assert sample(svc, M["oldest_pending_age"]) == 43.5
