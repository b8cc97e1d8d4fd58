"""bench/bench_costqos.py at a small size runs whole against the real API server, Prometheus and
controller, and prints a row per size and the ratios; its history holds one series per workload
and metric. No timing is asserted (speed lives in bench/)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest
from _costqos_support import GROUPS
from _support import ROOT

sys.path.insert(0, str(ROOT / "bench"))
bench_costqos = importlib.import_module("bench_costqos")


def test_the_history_holds_each_workloads_three_series_at_every_minute():
    text = bench_costqos._history(3, 1_700_000_000)
    samples = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    per_series = sum(len(lat) for lat, _ in GROUPS.values())
    assert len(samples) == 3 * 3 * per_series == 3 * 3 * 126
    assert len({ln.rsplit(" ", 2)[0] for ln in samples}) == 3 * 3
    assert text.endswith("# EOF\n")


@pytest.mark.process
def test_a_small_run_prints_each_size_and_the_ratios():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_costqos.py"), "--policies", "4", "8", "--window", "6",
                          "--interval", "2"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-2000:]
    for n in (4, 8):
        block = out.stdout.split(f"\n{n} policies\n", 1)[1]
        assert re.search(r"in process, per reconcile: round [\d.]+ ms wall / [\d.]+ ms CPU", block), block
        rounds = re.search(r"(\d+) rounds in the window vs (\d+) asked", block)
        assert rounds and int(rounds[1]) >= 1, block
    assert "8 vs 4 policies, per reconcile" in out.stdout and "frontier + choice CPU" in out.stdout
