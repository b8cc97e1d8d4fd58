"""A call never outlives its claim: every adapter's timeout is a total deadline (a gateway that
trickles its answer a byte at a time is cut off), the lease is checked against the longest timeout,
results are recorded only by the claim's holder (fencing), and the labelled counters exist at 0
from start, where the generated promtool tests start them.

The slow peers are real servers on loopback (HTTP, and a UNIX socket for HAProxy's runtime API)
that send their answer one byte per ``GAP`` seconds; each counts the bytes it got out before the
client hung up, which is what the tests assert (not how long anything took)."""

from __future__ import annotations

import re
import time

import pytest
from _fuse_support import GW_TOKEN, SPEC, TOKEN, wait_for
from _slow_peers import BYTES, GAP, TrickleHttp, TrickleSocket
from _support import yaml_data, yaml_text

from fusebox.fuse.adapters import build_adapters
from fusebox.fuse.adapters.gateway import HttpGateway, VllmResetPrefixCache
from fusebox.fuse.adapters.protocol import ActionError
from fusebox.fuse.control import ControlCall
from fusebox.spec import load_spec

DEADLINE = 1.0  # seconds, the adapters' timeout in these tests
TRIP = ControlCall.from_json({"action": "freeze_admissions", "level": 1, "state": "trip", "reason": "test",
                              "decision_id": "d1", "scope": {"cluster": "c1", "engine": "engine-0"}})


def _spec_adapter(tmp_path, name: str, a: dict):
    data = yaml_data(SPEC.read_text(encoding="utf-8"))
    data["fuse"]["adapters"] = {name: a}
    p = tmp_path / "fusebox.yaml"
    p.write_text(yaml_text(data, sort_keys=False), encoding="utf-8")
    (adapter,) = build_adapters(load_spec(p).adapters)
    return adapter


TARGET = [{"match": {"engine": "engine-0"}, "worker_url": "http://127.0.0.1:9"}]
HTTP_ADAPTERS = {
    "the gateway (--gateway-url)": lambda url, tmp: HttpGateway(url, GW_TOKEN, timeout_s=DEADLINE),
    "vLLM's reset (--vllm-url)": lambda url, tmp: VllmResetPrefixCache(url, timeout_s=DEADLINE),
    "a spec http action": lambda url, tmp: _spec_adapter(tmp, "dyn", {
        "kind": "http", "actions": ["freeze_admissions"], "hosts": [url.removeprefix("http://")], "timeout": "1s",
        "targets": [{"match": {"engine": "engine-0"}}], "trip": {"method": "POST", "url": url + "/x"}}),
    "a spec SGLang gateway (GET /workers)": lambda url, tmp: _spec_adapter(tmp, "sg", {
        "kind": "sglang_gateway", "url": url, "actions": ["freeze_admissions"], "timeout": "1s", "targets": TARGET}),
    "a spec vLLM router": lambda url, tmp: _spec_adapter(tmp, "vr", {
        "kind": "vllm_router", "url": url, "actions": ["freeze_admissions"], "timeout": "1s", "targets": TARGET}),
}


@pytest.mark.parametrize("make", HTTP_ADAPTERS.values(), ids=HTTP_ADAPTERS.keys())
def test_an_answer_trickled_a_byte_at_a_time_is_cut_off_at_the_calls_deadline(tmp_path, make):
    """Each read gets a byte well within the timeout, so a per-read timeout never fires; the total
    deadline does: the call fails (transient, retried) and the gateway got only part of its
    answer out."""
    gw = TrickleHttp()
    try:
        adapter = make(gw.url, tmp_path)
        with pytest.raises(ActionError) as e:
            adapter.apply(TRIP)
        assert not e.value.permanent and adapter.timeout_s == DEADLINE
        wait_for(lambda: gw.sent, 30, what="the gateway's answer to end (sent in full, or cut off)")
    finally:
        gw.stop()
    # one request, cut off near the deadline (DEADLINE / GAP = 20 bytes), far from its BYTES = 200
    assert len(gw.sent) == 1 and gw.sent[0] < 2 * DEADLINE / GAP < BYTES


def test_haproxy_answering_a_byte_at_a_time_is_cut_off_at_the_calls_deadline(tmp_path):
    sock = TrickleSocket(tmp_path / "admin.sock")
    try:
        adapter = _spec_adapter(tmp_path, "lb", {
            "kind": "haproxy", "socket": sock.path, "actions": ["freeze_admissions"], "timeout": "1s",
            "targets": [{"match": {"engine": "engine-0"}, "server": "be_llm/engine0"}]})
        with pytest.raises(ActionError) as e:
            adapter.apply(TRIP)
        assert not e.value.permanent
        wait_for(lambda: sock.sent, 30, what="HAProxy's answer to end (sent in full, or cut off)")
    finally:
        sock.stop()
    assert len(sock.sent) == 1 and sock.sent[0] < 2 * DEADLINE / GAP < BYTES


# ------------------------------------------------------------------ a name the resolver never answers
class _SilentDns:
    """A DNS server (UDP port 53 of a 127.53.0.x address) that reads every query and answers none:
    the cluster's resolver down. :attr:`names` are the names it was asked for."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for last in range(2, 250):
            try:
                self.sock.bind((f"127.53.0.{last}", 53))
                break
            except OSError:
                continue
        else:
            pytest.fail("no free 127.53.0.x:53 for the test's DNS server")
        self.host, self.names = self.sock.getsockname()[0], []
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                query = self.sock.recv(512)
            except OSError:
                continue
            i, labels = 12, []  # the question's name follows the 12-byte header, label by label
            while i < len(query) and query[i]:
                labels.append(query[i + 1:i + 1 + query[i]].decode(errors="replace"))
                i += 1 + query[i]
            self.names.append(".".join(labels))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


# Runs in the child: one gateway call, how long it took and how it ended, as JSON.
_CALL = r"""
import json, sys, time
from fusebox.fuse.adapters.gateway import HttpGateway
from fusebox.fuse.adapters.protocol import ActionError
from fusebox.fuse.control import ControlCall
trip = ControlCall.from_json({"action": "freeze_admissions", "level": 1, "state": "trip", "reason": "test",
                              "decision_id": "d1", "scope": {"cluster": "c1", "engine": "engine-0"}})
t0 = time.monotonic()
try:
    HttpGateway(sys.argv[1], timeout_s=float(sys.argv[2])).apply(trip)
    out = {"error": None}
except ActionError as e:
    out = {"error": str(e), "permanent": e.permanent}
print(json.dumps({**out, "took_s": time.monotonic() - t0}))
"""


def _call_with_resolver(tmp_path, url: str, resolv: str, hosts: str) -> dict:
    """:data:`_CALL` to ``url`` in a process of its own mount namespace, where /etc/resolv.conf and
    /etc/hosts are ``resolv`` and ``hosts`` (the host's files are untouched). Needs root (or
    CAP_SYS_ADMIN), as the full-disk test does."""
    import json
    import subprocess
    import sys

    (tmp_path / "resolv.conf").write_text(resolv)
    (tmp_path / "hosts").write_text(hosts)
    r = subprocess.run(["unshare", "--mount", "sh", "-c",
                        'mount --bind "$1" /etc/resolv.conf && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"',
                        "sh", str(tmp_path / "resolv.conf"), str(tmp_path / "hosts"),
                        sys.executable, "-c", _CALL, url, str(DEADLINE)], capture_output=True, text=True, timeout=120)
    if r.returncode and "mount" in r.stderr and not r.stdout:
        pytest.fail(f"unshare/mount refused ({r.stderr.strip()}): run the test as root, or in a container with "
                    "CAP_SYS_ADMIN, to give the call a resolver of its own")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_gateway_name_the_resolver_never_answers_is_cut_off_at_the_calls_deadline(tmp_path):
    """The gateway's URL names a host; the resolver (a DNS server that reads and never answers,
    given 30 s per query) holds getaddrinfo far past --timeout, which bounds only socket steps. The
    call fails (transient, retried) at its deadline: not before it (it did wait), nor long after."""
    dns = _SilentDns()
    try:
        out = _call_with_resolver(tmp_path, "http://gateway.fuse.test:9",
                                  f"nameserver {dns.host}\noptions timeout:30 attempts:1\n", "127.0.0.1 localhost\n")
    finally:
        dns.stop()
    assert "gateway.fuse.test" in dns.names  # the time went to resolving the name
    assert out["error"] is not None and out["permanent"] is False, out
    assert "gateway.fuse.test" in out["error"] and "deadline" in out["error"], out
    assert DEADLINE <= out["took_s"] < DEADLINE + 0.5, out


def test_a_gateway_named_in_etc_hosts_is_resolved_and_called(tmp_path):
    """The same call by name when the name resolves (/etc/hosts): applied, once."""
    from fusebox.demo.gateway import ReferenceGateway, read_log

    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    try:
        port = gw.url.rsplit(":", 1)[1]
        out = _call_with_resolver(tmp_path, f"http://gateway.fuse.test:{port}", "nameserver 127.53.0.1\n",
                                  "127.0.0.1 localhost\n127.0.0.1 gateway.fuse.test\n")
    finally:
        gw.stop()
    assert out["error"] is None, out
    assert [r["decision_id"] for r in read_log(tmp_path / "gw.jsonl")] == ["d1"]


def _args(tmp_path, *extra, spec=SPEC):
    import argparse

    from fusebox.fuse import cli

    (tmp_path / "token").write_text(TOKEN + "\n")
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["fuse", "serve", "--spec", str(spec), "--state", str(tmp_path / "s.sqlite"),
                              "--token-file", str(tmp_path / "token"), *extra])


def test_the_lease_must_exceed_a_spec_adapters_own_timeout(tmp_path):
    """--timeout 2 and --lease 8, but the spec's SGLang adapter waits up to 10 s: refused at start,
    naming that adapter's timeout, the spec file and the line."""
    from fusebox.fuse.cli import build_service

    data = yaml_data(SPEC.read_text(encoding="utf-8"))
    data["fuse"]["adapters"] = {"sg": {"kind": "sglang_gateway", "url": "http://127.0.0.1:9", "timeout": "10s",
                                       "actions": ["freeze_admissions"], "targets": TARGET}}
    spec = tmp_path / "fusebox.yaml"
    spec.write_text(yaml_text(data, sort_keys=False), encoding="utf-8")
    with pytest.raises(ValueError) as e:
        build_service(_args(tmp_path, "--timeout", "2", "--lease", "8", spec=spec))
    msg = str(e.value)
    line = next(i for i, text in enumerate(spec.read_text().splitlines(), 1) if text.strip() == "timeout: 10s")
    assert "--lease 8" in msg and f"fuse.adapters.sg.timeout (10s) at {spec}:{line}" in msg, msg
    assert not (tmp_path / "s.sqlite").exists()  # nothing opened or written
    service, _ = build_service(_args(tmp_path, "--timeout", "2", "--lease", "11", spec=spec))
    service.store.close()


# ------------------------------------------------------------------------------------ fencing
def test_a_stale_claimer_cannot_record_its_result_over_the_replica_that_took_the_row_over(tmp_path):
    """A claims a row, its lease ends (its call outlived it), B takes it over and applies it; A's
    late result is not recorded: one ``applied`` audit row, the row B's."""
    from fusebox.fuse.control import ControlCall
    from fusebox.fuse.store import Store

    path = tmp_path / "fuse.sqlite"
    a, b = Store(path), Store(path)  # two connections on one file, as two processes would have
    try:
        a.commit(None, [("d1", "gateway", ControlCall("freeze_admissions", 1, "trip"), 100.0)], [])
        (seq,) = [r["seq"] for r in a.outbox()]
        (tok_a,) = a.claim_fenced([seq], "A", 5.0, now=100.0).values()
        (tok_b,) = b.claim_fenced([seq], "B", 5.0, now=106.0).values()  # A's lease ended at 105
        assert tok_b != tok_a
        row = {"at": 107.0, "kind": "applied", "decision_id": "d1", "source": "gateway"}
        assert a.mark_applied(seq, 107.0, {**row, "reason": "by A"}, ("A", tok_a)) is False
        assert a.mark_failed(seq, "late", 110.0, ("A", tok_a)) is False
        assert a.mark_given_up(seq, "late", {**row, "kind": "failed"}, ("A", tok_a)) is False
        assert b.mark_applied(seq, 107.5, {**row, "reason": "by B"}, ("B", tok_b)) is True
        # applied: no one records anything on it again, its holder included
        assert b.mark_applied(seq, 108.0, {**row, "reason": "again"}, ("B", tok_b)) is False
        assert [(r["kind"], r["reason"]) for r in a.audit_log(10)] == [("applied", "by B")]
        assert [(r["status"], r["attempts"], r["claimed_by"]) for r in a.outbox()] == [("applied", 1, "B")]
    finally:
        a.close()
        b.close()


@pytest.mark.process
def test_the_service_counts_a_result_it_could_not_record(tmp_path):
    """A service whose claim was taken over while its (real) gateway call was under way: the call
    returns, the result is not recorded, ``fusebox_fuse_stale_results_total`` counts it, and the
    row stays the other replica's."""
    from prometheus_client import generate_latest

    from fusebox.demo.gateway import ReferenceGateway, read_log
    from fusebox.fuse.rules import FuseRules
    from fusebox.fuse.service import FuseService
    from fusebox.fuse.store import Store

    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    path = tmp_path / "fuse.sqlite"
    other = Store(path)

    class TakenOverMidCall(HttpGateway):
        """The real gateway call, during which replica B takes the row over (A's lease ended)."""

        def apply(self, payload):
            (seq,) = [r["seq"] for r in other.outbox()]
            assert other.claim([seq], "B", time.time() + 3600, 30.0)  # past A's lease
            super().apply(payload)

    svc = FuseService(FuseRules.from_spec(load_spec(SPEC)), Store(path), [TakenOverMidCall(gw.url, timeout_s=2)],
                      hold_s=60, lease_s=5, replica="A")
    try:
        from _fuse_support import alert, payload

        from fusebox.fuse.intake.payload import parse_payload

        svc.handle(parse_payload(payload(alert("GPUMemoryUtilizationHigh", cluster="c1", hw_id="GPU-1")), time.time()))
        lanes: dict = {}
        svc._dispatch_once(svc.adapters["gateway"], lanes, {})
        text = generate_latest(svc.metrics.registry).decode()
        assert 'fusebox_fuse_stale_results_total{adapter="gateway"} 1.0' in text
        assert len(read_log(tmp_path / "gw.jsonl")) == 1  # the call was made
        assert [r["kind"] for r in svc.store.audit_log(10) if r["kind"] == "applied"] == []
        assert [(r["status"], r["claimed_by"]) for r in other.outbox()] == [("pending", "B")]
    finally:
        svc.store.close()
        other.close()
        gw.stop()


def test_a_batch_of_claims_is_renewed_before_a_call_its_lease_would_not_cover(tmp_path):
    """Three scopes' rows are claimed in one pass (lease 1.5 s); the gateway trickles, so each call
    runs to its 1 s deadline. Before each call, its row's lease (read from the database as the
    call starts) outlasts the call's deadline: the later calls run under a renewed lease, not the
    one the first call used up."""
    import sqlite3

    from _fuse_support import alert, payload

    from fusebox.fuse.intake.payload import parse_payload
    from fusebox.fuse.rules import FuseRules
    from fusebox.fuse.service import FuseService
    from fusebox.fuse.store import Store

    path = tmp_path / "fuse.sqlite"
    covered: list[bool] = []

    class Watched(HttpGateway):
        def apply(self, p):
            with sqlite3.connect(path) as db:
                ((lease_until,),) = db.execute("SELECT lease_until FROM outbox WHERE decision_id = ?",
                                               (p.decision_id,)).fetchall()
            covered.append(lease_until >= time.time() + self.timeout_s)
            super().apply(p)

    gw = TrickleHttp()
    svc = FuseService(FuseRules.from_spec(load_spec(SPEC)), Store(path), [Watched(gw.url, timeout_s=DEADLINE)],
                      hold_s=60, lease_s=1.5, replica="A")
    try:
        alerts = [alert("GPUMemoryUtilizationHigh", cluster="c1", hw_id=f"GPU-{i}") for i in range(3)]
        svc.handle(parse_payload(payload(*alerts), time.time()))
        svc._dispatch_once(svc.adapters["gateway"], {}, {})
    finally:
        svc.store.close()
        gw.stop()
    assert covered == [True, True, True]


# ------------------------------------------------------------------------------- counters at 0
def test_labelled_counters_exist_at_0_from_start_as_the_generated_tests_seed_them(tmp_path):
    """The generated promtool test of FuseboxFuseActionsFailing starts the given-up counter at 0
    and raises it to 1 (an increase); a fresh service publishes that very series at 0, so the first
    give-up is an increase in production too. Every adapter's labelled counters start at 0."""
    from prometheus_client import generate_latest

    from fusebox import conventions as C
    from fusebox.fuse.rules import FuseRules
    from fusebox.fuse.service import FuseService
    from fusebox.fuse.store import Store
    from fusebox.generator.selfmon import self_tests

    spec = load_spec(SPEC)
    svc = FuseService(FuseRules.from_spec(spec), Store(tmp_path / "f.sqlite"),
                      [HttpGateway("http://127.0.0.1:9", timeout_s=1), VllmResetPrefixCache("http://127.0.0.1:9", "e0")])
    try:
        text = generate_latest(svc.metrics.registry).decode()
    finally:
        svc.store.close()
    published = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line and not line.startswith("#")}
    given_up = C.FUSE_METRICS["actions_given_up"]
    seeded = [s for _, g in self_tests(spec) for s in g["input_series"] if s["series"].startswith(given_up + "{")]
    assert seeded, "the generated tests seed the given-up counter"
    scrape = {**spec.self_monitoring.fuse_selector, "instance": ""}  # labels Prometheus adds when it scrapes
    for s in seeded:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', s["series"]))
        own = {k: v for k, v in labels.items() if k not in scrape}
        assert set(own) == {"adapter", "reason"}, own
        series = f'{given_up}{{adapter="{own["adapter"]}",reason="{own["reason"]}"}}'
        assert published.get(series) == 0.0, (series, text)
        assert s["values"].split()[0].split("+")[0].split("x")[0] == "0"  # and the test starts it at 0
    for adapter in ("gateway", "vllm:e0"):
        for series in (f'{C.FUSE_METRICS["action_failures"]}{{adapter="{adapter}"}}',
                       f'{given_up}{{adapter="{adapter}",reason="permanent"}}',
                       f'{given_up}{{adapter="{adapter}",reason="retries_exhausted"}}',
                       f'{C.FUSE_METRICS["dispatcher_errors"]}{{adapter="{adapter}"}}',
                       f'{C.FUSE_METRICS["stale_results"]}{{adapter="{adapter}"}}',
                       f'{C.FUSE_METRICS["adapter_calls"]}{{adapter="{adapter}",outcome="ok"}}',
                       f'{C.FUSE_METRICS["adapter_calls"]}{{adapter="{adapter}",outcome="error"}}'):
            assert published.get(series) == 0.0, series


# ----------------------------------------------------------------------------------- SIGTERM
def test_sigterm_on_sqlite_releases_the_claim_closes_the_store_and_exits_0(tmp_path):
    """One replica on SQLite holds a claimed, pending call (the test-only wait after claiming) when
    SIGTERM comes: it exits 0, the row is still pending and no longer claimed (the next start
    calls it at once rather than after the lease), and the database is left consistent."""
    import os
    import signal
    import sqlite3
    import subprocess
    import sys

    import httpx
    from _fuse_support import alert, free_port, payload

    from fusebox.fuse.dispatch.dispatcher import TEST_HANG_ENV

    (tmp_path / "token").write_text(TOKEN + "\n")
    state, port = tmp_path / "fuse.sqlite", free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen", f"127.0.0.1:{port}",
         "--state", str(state), "--token-file", str(tmp_path / "token"), "--gateway-url", "http://127.0.0.1:9",
         "--lease", "600", "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "fuse.log", "wb"), env={**os.environ, TEST_HANG_ENV: "600"})

    def claimed():
        with sqlite3.connect(state) as db:
            return db.execute("SELECT claimed_by FROM outbox WHERE claimed_by IS NOT NULL").fetchall()

    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/healthz"), 30, 0.1, "fuse serve")
        r = httpx.post(f"http://127.0.0.1:{port}/alertmanager", json=payload(alert("GPUMemoryUtilizationHigh", **{
            "cluster": "c1", "hw_id": "GPU-1"})), headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert r.status_code == 200
        wait_for(claimed, 10, 0.02, "the call claimed")
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    with sqlite3.connect(state) as db:
        assert db.execute("SELECT status, claimed_by, lease_until, attempts FROM outbox").fetchall() == [
            ("pending", None, None, 0)]
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert "Traceback" not in (tmp_path / "fuse.log").read_text()


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
