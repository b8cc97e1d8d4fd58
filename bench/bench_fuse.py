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

Usage: python bench/bench_fuse.py [--notifications 3000] [--concurrency 8] [--no-postgresql]
"""

from __future__ import annotations

import argparse
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

from fusebox.fuse import Breaker, FuseRules, parse_payload  # noqa: E402
from fusebox.fuse.gateway import read_log  # noqa: E402
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
    args = ap.parse_args()

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
