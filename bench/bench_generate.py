"""Benchmark `fusebox generate`: the shipped spec and generated specs of 100 and 1,000 signals.

Prints seconds and peak memory (tracemalloc, Python heap) per spec size, and the cost per
signal, to show how cost grows. Each size runs in a fresh subprocess so peaks do not mix.

    python bench/bench_generate.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, tracemalloc, tempfile
from pathlib import Path
tracemalloc.start()
t0 = time.perf_counter()
from fusebox.spec import load_spec
from fusebox.generator.outputs import render_all
from fusebox.generator.writer import write_outputs
spec = load_spec(sys.argv[1])
t1 = time.perf_counter()
out = render_all(spec)
t2 = time.perf_counter()
with tempfile.TemporaryDirectory() as d:
    write_outputs(out, Path(d))
t3 = time.perf_counter()
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"signals": len(spec.signals), "files": len(out), "bytes": sum(len(v) for v in out.values()),
                  "load_s": t1 - t0, "render_s": t2 - t1, "write_s": t3 - t2, "total_s": t3 - t0, "peak_mib": peak / 2**20}))
"""


def make_spec(n: int, path: Path) -> None:
    base = yaml.safe_load((ROOT / "fusebox.yaml").read_text())
    templates = list(base["signals"].items())
    signals = {}
    for i in range(n):
        name, sig = templates[i % len(templates)]
        sig = json.loads(json.dumps(sig))
        sig["alert"] = f"{sig['alert']}N{i}"
        signals[f"{name}_{i}"] = sig
    base["signals"] = signals
    path.write_text(yaml.safe_dump(base, sort_keys=False))


def run(spec: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(spec)], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(r.stdout)


def main() -> None:
    rows = [("shipped", run(ROOT / "fusebox.yaml"))]
    with tempfile.TemporaryDirectory() as d:
        for n in (100, 1000):
            p = Path(d) / f"spec{n}.yaml"
            make_spec(n, p)
            rows.append((f"{n} signals", run(p)))
    print(f"{'spec':<12} {'signals':>7} {'files':>6} {'MiB out':>8} {'load s':>7} {'render s':>9} {'write s':>8} "
          f"{'total s':>8} {'peak MiB':>9} {'ms/signal':>10}")
    for label, r in rows:
        print(f"{label:<12} {r['signals']:>7} {r['files']:>6} {r['bytes'] / 2**20:>8.2f} {r['load_s']:>7.3f} "
              f"{r['render_s']:>9.3f} {r['write_s']:>8.3f} {r['total_s']:>8.3f} {r['peak_mib']:>9.1f} "
              f"{1000 * r['total_s'] / r['signals']:>10.2f}")
    base = rows[0][1]
    for label, r in rows[1:]:
        print(f"{label}: {r['signals'] / base['signals']:.0f}x the signals -> {r['total_s'] / base['total_s']:.1f}x the time, "
              f"{r['peak_mib'] / base['peak_mib']:.1f}x the peak memory")


if __name__ == "__main__":
    main()
