"""Benchmark of the fuse service. Prints figures; asserts nothing.

1. The pure breaker: notifications per second (in memory, no I/O).
2. One row per store, in one run: `fusebox fuse serve` on SQLite (one replica, synchronous=FULL)
   and on PostgreSQL (two replicas on one database; a throwaway server started here with its
   default durability, fsync on), each fed over HTTP by N concurrent senders spread over the
   replicas (as a Kubernetes Service does):
   notifications/s absorbed; request latency p50/p99 (the decision is committed before the 200);
   notification -> gateway call p50/p99 for the notifications that trip (1 in 50: a new GPU), from
   sending it to the reference gateway (a separate process) logging the call; duplicates: gateway
   calls of a decision already applied plus trips decided more than once (must be 0).

3. A row per adapter (the reference gateway via --gateway-url, the real SGLang Model Gateway, the
   real vLLM router, HAProxy's runtime API, each on loopback in front of stand-in engines, in the
   same run): notification -> adapter call applied (p50/p99), the call itself (what the gateway
   takes, from the audit's ``call_s``), what the fuse adds (the difference) and the ratio to the
   reference.

Usage: python bench/bench_fuse.py [--notifications 3000] [--concurrency 8] [--no-postgresql]
       [--adapter-trips 40] [--no-adapters | --only-adapters]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _fuse_support import SPEC, TOKEN, alert, free_port, payload, wait_for  # noqa: E402
from _pg_support import PgServer  # noqa: E402

from _gateways import StandInEngine, sglang_gateway, vllm_router  # noqa: E402

from fusebox.fuse import Breaker, FuseRules, parse_payload  # noqa: E402
from fusebox.fuse.gateway import ReferenceGateway, read_log  # noqa: E402
from fusebox.fuse.store import Store  # noqa: E402
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


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _spawn(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fusebox.cli", *cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def run(store: str, replicas: int, tmp: Path, n: int, concurrency: int) -> dict:
    """One configuration: ``store`` (a --store URL), ``replicas`` services. Returns the figures."""
    (tmp / "token").write_text(TOKEN)
    gw_log = tmp / f"gw-{replicas}.jsonl"
    gw_port = free_port()
    procs = [_spawn(["fuse", "gateway", "--listen", f"127.0.0.1:{gw_port}", "--log", str(gw_log)])]
    urls = []
    try:
        wait_for(lambda: _up(f"http://127.0.0.1:{gw_port}"), 30, 0.1, "gateway start")
        for _ in range(replicas):
            port = free_port()
            procs.append(_spawn(["fuse", "serve", "--spec", str(SPEC), "--listen", f"127.0.0.1:{port}", "--store", store,
                                 "--token-file", str(tmp / "token"), "--gateway-url", f"http://127.0.0.1:{gw_port}",
                                 "--hold", "3600", "--tick", "0.05", "--retry-backoff", "0.01", "--log-level", "warning"]))
            urls.append(f"http://127.0.0.1:{port}")
        for u in urls:
            wait_for(lambda u=u: _up(u), 60, 0.1, "service start")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        local = threading.local()
        rr = itertools.count()
        sent: dict[str, float] = {}

        def send(body):
            c = getattr(local, "c", None) or httpx.Client(headers=headers, timeout=30)
            local.c = c
            url = urls[next(rr) % len(urls)]
            gpu = body["alerts"][0]["labels"]["hw_id"]
            t = time.perf_counter()
            sent.setdefault(gpu, time.time())
            r = c.post(url + "/alertmanager", json=body)
            assert r.status_code == 200, r.text
            return time.perf_counter() - t

        # The realistic load is repeats (group_interval / repeat_interval resends) of alerts already
        # holding a level, plus HA duplicates; 1 in 50 is a new GPU (a trip).
        t0 = time.time() - 60
        bodies = [payload(alert("GPUMemoryUtilizationHigh", starts=t0, cluster="a", hw_id=f"GPU-{i // 50}"))
                  for i in range(n)]
        n_trips = len({b["alerts"][0]["labels"]["hw_id"] for b in bodies})
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as ex:
            lat = list(ex.map(send, bodies))
        wall = time.perf_counter() - start
        wait_for(lambda: len(read_log(gw_log)) >= n_trips, 60, 0.05, "trips applied")
        time.sleep(1.0)  # a duplicate would come now
        log = read_log(gw_log)
        trips = [r for r in log if not r["duplicate"]]
        e2e = [r["at"] - sent[r["scope"]["hw_id"]] for r in trips]
        extra = len(trips) - len({r["scope"]["hw_id"] for r in trips})
        return {"rate": n / wall, "req50": pct(lat, .5), "req99": pct(lat, .99), "e2e50": statistics.median(e2e),
                "e2e99": pct(e2e, .99), "calls": len(log), "trips": n_trips,
                "duplicates": sum(r["duplicate"] for r in log) + extra}
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--notifications", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--no-postgresql", action="store_true", help="the SQLite row only")
    ap.add_argument("--adapter-trips", type=int, default=40)
    ap.add_argument("--no-adapters", action="store_true", help="leave out the per-adapter rows")
    ap.add_argument("--only-adapters", action="store_true", help="run only the per-adapter rows")
    args = ap.parse_args()
    if args.only_adapters:
        return bench_adapters(args.adapter_trips)

    rate_pure = bench_breaker(20000)
    print(f"breaker (pure, in memory): {rate_pure:,.0f} notifications/s")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        rows.append(("SQLite, 1 replica", run(f"sqlite:///{t / 's.sqlite'}", 1, t, args.notifications, args.concurrency)))
        if not args.no_postgresql:
            pg = PgServer(fsync=True)
            try:
                pg.start()
                url = pg.create_db("bench")
                rows.append(("PostgreSQL, 2 replicas", run(url, 2, t, args.notifications, args.concurrency)))
            finally:
                pg.close()
    print(f"{args.notifications} notifications, {args.concurrency} concurrent senders, 1 in 50 trips a level:")
    print(f"{'store':24} {'notif/s':>8} {'req p50':>8} {'req p99':>8} {'->gw p50':>9} {'->gw p99':>9} "
          f"{'calls':>6} {'dupl.':>6}")
    for name, r in rows:
        print(f"{name:24} {r['rate']:8.0f} {r['req50'] * 1e3:6.1f}ms {r['req99'] * 1e3:6.1f}ms "
              f"{r['e2e50'] * 1e3:7.1f}ms {r['e2e99'] * 1e3:7.1f}ms {r['calls']:6d} {r['duplicates']:6d}")
    print("->gw: from sending a notification that trips to the gateway logging the call; "
          "dupl.: repeated gateway calls plus trips decided twice (must be 0)")
    if not args.no_adapters:
        print()
        return bench_adapters(args.adapter_trips)
    return 0


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
