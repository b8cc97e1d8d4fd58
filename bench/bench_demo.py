"""Breach-to-fuse latency on the real stack (the demo's): Prometheus 2.42, Alertmanager 0.25, the
OpenTelemetry Collector, the scenario collector, the fuse service and the reference gateway.

For each of the three primary signals: from the moment the replayed signal crosses its critical
threshold to the gateway's control call (the timestamp in the reference gateway's log).

* The crossing moment comes from the scenario timeline: ``Scenario.predict(spec, scrape_s=tick)``
  evaluates the alert expression on the replayed data, one sample per collection tick, the way
  Prometheus does (deriv least squares, histogram_quantile over bucket increases), and gives the
  first tick at or above the threshold; scenario time is mapped to wall time from the moment the
  scenario player printed t=0 (speed 1).
* The floor the configuration implies: scrape interval + evaluation interval + the critical
  tier's ``for`` + the critical route's ``group_wait``. The scrape and evaluation phases are
  random, so a run lands anywhere from ``for + group_wait`` to the floor, plus the collector's
  push (one tick) and the Collector's batch timeout (1 s).

Configurations: the demo's fast intervals (several runs) and the shipped spec's own intervals
(fusebox.yaml: 5 s scrape, 5 s evaluation, for 30 s, group_wait 5 s; one run). Each run stops
at the last of the three trips (about 2.5 and 3 minutes).

    python bench/bench_demo.py [--runs 2] [--default-runs 1] [--spec fusebox.yaml]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIGNALS = ("gpu_memory_utilization", "alignment_latency_p95", "kv_cache_growth_rate")


def one_run(spec_path: Path, timing, workdir: Path, label: str) -> list[dict]:
    from rich.console import Console

    from fusebox.demo import StackOptions, floor_s, run
    from fusebox.demo.view import DemoView

    def all_tripped(w) -> bool:
        return len({c["level"] for c in w.gateway_calls if c["state"] == "trip"}) >= 3

    quiet = DemoView(Console(file=open(workdir.parent / f"{workdir.name}.view.txt", "w"), width=200), live=False)
    res = run(StackOptions(workdir=workdir, spec=spec_path, speed=1.0, timing=timing), once=False, view=quiet,
              stop_when=all_tripped, max_wall_s=420)
    if res.error or res.scenario_t0 is None:
        raise SystemExit(f"bench_demo: run {label} failed: {res.error}")
    spec, sc = res.spec, res.scenario
    above = {}
    for c in sc.predict(spec, scrape_s=sc.tick_s):
        if c.tier == "critical" and c.event == "above" and c.signal not in above:
            above[c.signal] = c.time_s
    rows = []
    for name in SIGNALS:
        sig = spec.signal(name)
        tier = next(t for t in sig.tiers if t.fuse)
        level = spec.actions[tier.fuse].level
        trip = next((e for e in res.events if e.kind == "fuse" and e.what == "trip" and e.detail.get("level") == level), None)
        if trip is None:
            raise SystemExit(f"bench_demo: run {label}: level {level} never tripped")
        crossing = res.scenario_t0 + above[name] / res.speed
        rows.append({"config": label, "signal": name, "crossing_s": above[name], "latency_s": trip.at - crossing,
                     "floor_s": floor_s(spec, name), "for_s": tier.for_s, "group_wait_s": spec.group_wait_critical_s})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="runs on the demo's fast intervals (default 2)")
    ap.add_argument("--default-runs", type=int, default=1, help="runs on the spec's own intervals (default 1)")
    ap.add_argument("--spec", default=str(ROOT / "fusebox.yaml"))
    args = ap.parse_args(argv)
    from fusebox.demo import FAST, ToolMissing, find_tools

    try:
        find_tools()
    except ToolMissing as e:
        print(f"bench_demo: {e}", file=sys.stderr)
        return 2
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="fusebox-bench-demo-") as tmp:
        plan = [("fast", FAST)] * args.runs + [("default", None)] * args.default_runs
        for i, (label, timing) in enumerate(plan):
            print(f"run {i + 1}/{len(plan)}: {label} intervals ...", flush=True)
            rows += one_run(Path(args.spec), timing, Path(tmp) / f"run{i}", label)
    print()
    print(f"{'config':8s} {'signal':24s} {'crossing':>9s} {'latency':>8s} {'floor':>6s} {'lat-floor':>9s}")
    for r in rows:
        print(f"{r['config']:8s} {r['signal']:24s} {r['crossing_s']:8.0f}s {r['latency_s']:7.2f}s "
              f"{r['floor_s']:5.0f}s {r['latency_s'] - r['floor_s']:+8.2f}s")
    print()
    print("summary (breach -> gateway call, all signals and runs):")
    for label in ("fast", "default"):
        mine = [r for r in rows if r["config"] == label]
        if not mine:
            continue
        lat = [r["latency_s"] for r in mine]
        over = [r["latency_s"] - r["floor_s"] for r in mine]
        fl = sorted({r["floor_s"] for r in mine})
        print(f"  {label:8s} n={len(mine)}  latency mean {statistics.mean(lat):6.2f}s  max {max(lat):6.2f}s  "
              f"floor {', '.join(f'{f:g}s' for f in fl)}  worst latency-floor {max(over):+.2f}s  "
              f"{'within 1 s of the floor' if max(over) <= 1.0 else 'MORE than 1 s over the floor'}")
    fast = [r["latency_s"] for r in rows if r["config"] == "fast"]
    default = [r["latency_s"] for r in rows if r["config"] == "default"]
    if fast and default:
        print(f"  default / fast mean latency: {statistics.mean(default) / statistics.mean(fast):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
