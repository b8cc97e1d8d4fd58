"""Benchmark of the fuse service. Prints figures; asserts nothing.

1. The pure breaker: notifications per second (in memory, no I/O).
2. `fusebox fuse serve` (a separate process, SQLite synchronous=FULL) over HTTP: notifications
   per second it absorbs with N concurrent senders, and the p50/p99 request latency (the
   decision is committed before the 200, so this is the decision latency).
3. Decision latency from the request to the gateway call: the time from sending a notification
   that trips a level to the reference gateway receiving the control call.
4. A row per adapter (the reference gateway via --gateway-url, the real SGLang Model Gateway, the
   real vLLM router, HAProxy's runtime API, each on loopback in front of stand-in engines, in the
   same run):
   notification -> adapter call applied (p50/p99), the call itself (what the gateway takes, from
   the audit's ``call_s``), what the fuse adds (the difference) and the ratio to the reference.

Usage: python bench/bench_fuse.py [--notifications 3000] [--concurrency 8] [--trips 100] [--adapter-trips 40]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _fuse_support import SPEC, TOKEN, alert, free_port, payload, wait_for  # noqa: E402

from _gateways import StandInEngine, sglang_gateway, vllm_router  # noqa: E402

from fusebox.fuse import Breaker, FuseRules, parse_payload  # noqa: E402
from fusebox.fuse.store import Store  # noqa: E402
from fusebox.fuse.gateway import ReferenceGateway, read_log  # noqa: E402
from fusebox.spec import load_spec  # noqa: E402


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def bench_breaker(n: int) -> float:
    rules = FuseRules.from_spec(load_spec(SPEC))
    b = Breaker(rules, 60)
    t0 = 1_700_000_000.0
    notes = [parse_payload(payload(alert("GPUMemoryUtilizationHigh", starts=t0, cluster="a", hw_id=f"GPU-{i % 64}")), t0)
             for i in range(n)]
    start = time.perf_counter()
    for i, nt in enumerate(notes):
        b.on_notification(nt, t0 + i * 0.001)
    return n / (time.perf_counter() - start)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--notifications", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--trips", type=int, default=100)
    ap.add_argument("--adapter-trips", type=int, default=40)
    ap.add_argument("--only-adapters", action="store_true", help="run only the per-adapter rows")
    args = ap.parse_args()
    if args.only_adapters:
        return bench_adapters(args.adapter_trips)

    rate_pure = bench_breaker(20000)
    print(f"breaker (pure, in memory): {rate_pure:,.0f} notifications/s")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "token").write_text(TOKEN)
        gw = ReferenceGateway("127.0.0.1", 0, tmp / "gw.jsonl").start()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen", f"127.0.0.1:{port}",
             "--state", str(tmp / "s.sqlite"), "--token-file", str(tmp / "token"), "--gateway-url", gw.url,
             "--hold", "3600", "--tick", "0.05", "--retry-backoff", "0.01", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            def up():
                try:
                    return httpx.get(url + "/healthz", timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(up, 30, 0.1, "service start")
            headers = {"Authorization": f"Bearer {TOKEN}"}
            local = threading.local()

            def send(body):
                c = getattr(local, "c", None) or httpx.Client(headers=headers, timeout=30)
                local.c = c
                t = time.perf_counter()
                r = c.post(url + "/alertmanager", json=body)
                assert r.status_code == 200, r.text
                return time.perf_counter() - t

            # Absorption: the realistic load is repeats (group_interval / repeat_interval resends)
            # of alerts already holding a level, plus HA duplicates; 1 in 50 is a new scope (a trip).
            t0 = time.time() - 60
            bodies = []
            for i in range(args.notifications):
                scope = {"cluster": "a", "hw_id": f"GPU-{i // 50}"}
                bodies.append(payload(alert("GPUMemoryUtilizationHigh", starts=t0, **scope)))
            start = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as ex:
                lat = list(ex.map(send, bodies))
            wall = time.perf_counter() - start
            n_trips = len({b["alerts"][0]["labels"]["hw_id"] for b in bodies})
            print(f"service over HTTP, {args.concurrency} senders: {args.notifications / wall:,.0f} notifications/s "
                  f"({n_trips} trips among {args.notifications}); request latency p50 {pct(lat, .5) * 1e3:.1f} ms, "
                  f"p99 {pct(lat, .99) * 1e3:.1f} ms")
            print(f"ratio pure breaker / service: {rate_pure / (args.notifications / wall):,.0f}x")
            wait_for(lambda: len(read_log(tmp / "gw.jsonl")) >= n_trips, 60, 0.05, "trips applied")

            # Request -> gateway call, one trip at a time (idle service).
            base = len(read_log(tmp / "gw.jsonl"))
            e2e = []
            c = httpx.Client(headers=headers, timeout=30)
            for i in range(args.trips):
                body = payload(alert("KVCacheGrowthRateHigh", starts=t0, cluster="b", host_name="h", engine=f"e{i}"))
                sent = time.time()
                assert c.post(url + "/alertmanager", json=body).status_code == 200
                wait_for(lambda: len(read_log(tmp / "gw.jsonl")) >= base + i + 1, 10, 0.0005, "gateway call")
                e2e.append(read_log(tmp / "gw.jsonl")[-1]["at"] - sent)
            print(f"decision latency request -> gateway call ({args.trips} trips): p50 {statistics.median(e2e) * 1e3:.1f} ms, "
                  f"p99 {pct(e2e, .99) * 1e3:.1f} ms")
            dup = sum(r["duplicate"] for r in read_log(tmp / "gw.jsonl"))
            print(f"gateway calls: {len(read_log(tmp / 'gw.jsonl'))} (expected {n_trips + args.trips}), duplicates {dup}")
        finally:
            proc.terminate()
            proc.wait(10)
            gw.stop()
    return bench_adapters(args.adapter_trips)


def _serve(tmp: Path, spec: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(spec), "--listen", f"127.0.0.1:{port}",
         "--state", str(tmp / "s.sqlite"), "--token-file", str(tmp / "token"), "--hold", "3600", "--tick", "0.05",
         "--retry-backoff", "0.01", "--log-level", "warning", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up():
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, 30, 0.1, "service start")
    return proc, url


def _adapter_row(tmp: Path, spec: Path, extra: list[str], trips: int) -> tuple[list[float], list[float]]:
    """(notification -> applied, call) seconds per trip, one trip at a time on engines e0..e<trips-1>."""
    (tmp / "token").write_text(TOKEN)
    proc, url = _serve(tmp, spec, extra)
    store = Store(tmp / "s.sqlite")
    try:
        c = httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
        e2e, call = [], []
        t0 = time.time() - 60
        for i in range(trips):
            sent = time.time()
            r = c.post(url + "/alertmanager", json=payload(alert("GPUMemoryUtilizationHigh", starts=t0, engine=f"e{i}")))
            did = r.json()["decisions"][0]["decision_id"]

            def applied():
                return next((a for a in store.audit_log(5, kinds=("applied", "failed")) if a["decision_id"] == did), None)

            row = wait_for(applied, 30, 0.0005, "adapter call applied")
            assert row["kind"] == "applied", row
            e2e.append(row["at"] - sent)
            call.append(row["detail"]["call_s"])
        return e2e, call
    finally:
        proc.terminate()
        proc.wait(10)
        store.close()


def bench_adapters(trips: int) -> int:
    import yaml

    engines = [StandInEngine() for _ in range(trips)]
    targets = [{"match": {"engine": f"e{i}"}, "worker_url": e.url} for i, e in enumerate(engines)]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)

        def spec_with(adapters: dict) -> Path:
            data = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
            data["fuse"]["adapters"] = adapters
            p = tmp / f"spec-{len(rows)}.yaml"
            p.write_text(yaml.safe_dump(data), encoding="utf-8")
            return p

        ref = ReferenceGateway("127.0.0.1", 0, tmp / "gw.jsonl").start()
        try:
            (tmp / "ref").mkdir()
            rows["reference gateway"] = _adapter_row(tmp / "ref", SPEC, ["--gateway-url", ref.url], trips)
        finally:
            ref.stop()
        for kind, start in (("sglang_gateway", sglang_gateway), ("vllm_router", vllm_router)):
            d = tmp / kind
            d.mkdir()
            gw = start([e.url for e in engines], d / "gateway.log")
            try:
                spec = spec_with({kind: {"kind": kind, "url": gw.url, "actions": ["freeze_admissions"], "timeout": "10s",
                                         "targets": targets}})
                rows[kind] = _adapter_row(d, spec, [], trips)
            finally:
                gw.stop()
        hap = shutil.which("haproxy")
        if hap:  # a server per engine; the fuse drains it through the runtime API
            d = tmp / "haproxy"
            d.mkdir()
            sock = d / "admin.sock"
            servers = "".join(f"    server e{i} {e.url.removeprefix('http://')}\n" for i, e in enumerate(engines))
            (d / "haproxy.cfg").write_text(f"global\n    stats socket {sock} level admin\ndefaults\n    mode http\n"
                                           "    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n"
                                           f"backend be_llm\n{servers}")
            proc = subprocess.Popen([hap, "-f", str(d / "haproxy.cfg"), "-db"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            try:
                wait_for(sock.exists, 10, 0.05, "haproxy's socket")
                spec = spec_with({"lb": {"kind": "haproxy", "socket": str(sock), "actions": ["freeze_admissions"],
                                         "targets": [{"match": {"engine": f"e{i}"}, "server": f"be_llm/e{i}"}
                                                     for i in range(len(engines))]}})
                rows["haproxy"] = _adapter_row(d, spec, [], trips)
            finally:
                proc.terminate()
                proc.wait(10)
        else:
            print("haproxy not installed (make tools): no haproxy row")
    for e in engines:
        e.stop()
    ref_p99 = pct(rows["reference gateway"][0], .99)
    print(f"notification -> adapter call applied, {trips} trips one at a time (loopback):")
    for name, (e2e, call) in rows.items():
        added = [a - b for a, b in zip(e2e, call)]
        print(f"  {name:18s} p50 {statistics.median(e2e) * 1e3:6.1f} ms  p99 {pct(e2e, .99) * 1e3:6.1f} ms"
              f"  | the call itself p50 {statistics.median(call) * 1e3:6.1f} ms p99 {pct(call, .99) * 1e3:6.1f} ms"
              f"  | fuse adds p50 {statistics.median(added) * 1e3:5.1f} ms p99 {pct(added, .99) * 1e3:5.1f} ms"
              f"  | p99 / reference {pct(e2e, .99) / ref_p99:4.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
