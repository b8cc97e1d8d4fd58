"""bench/bench_generate.py runs from a checkout and prints its paired table: the baseline revision
and the current tree on one spec (the baseline's own, pinned in bench/). No timing here (speed
lives in bench/)."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml
from _support import ROOT

BENCH = ROOT / "bench" / "bench_generate.py"
BASELINE = "5db6eb6"
PINNED = ROOT / "bench" / "fixtures" / f"baseline-{BASELINE}.yaml"
ROW = re.compile(r"^(shipped|10 signals|today's spec)\s+(\d+)\s+(\d+)\s+[\d.]+ \|\s+([\d.]+)\s+[\d.]+ \|.*\|\s+(\S+)\s+(\S+) \|")


def test_pinned_spec_is_the_baseline_revisions_own():
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{BASELINE}:fusebox.yaml"], capture_output=True, text=True, check=True)
    assert PINNED.read_text() == shown.stdout


def test_quick_run_exits_0_and_prints_a_row_per_spec_with_the_baseline_beside_it():
    r = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = {m[1]: m for m in map(ROW.match, r.stdout.splitlines()) if m}
    assert list(rows) == ["shipped", "10 signals", "today's spec"], r.stdout
    pinned_signals = len(yaml.safe_load(PINNED.read_text())["signals"])
    today_signals = len(yaml.safe_load((ROOT / "fusebox.yaml").read_text())["signals"])
    assert int(rows["shipped"][2]) == pinned_signals
    assert int(rows["10 signals"][2]) == 10
    assert int(rows["today's spec"][2]) == today_signals
    # both revisions measured on the two shared specs: a baseline time and an "N.Nx" ratio
    for label in ("shipped", "10 signals"):
        assert float(rows[label][5]) > 0 and re.fullmatch(r"\d+\.\dx", rows[label][6]), r.stdout
    # today's spec is read by the current tree only
    assert rows["today's spec"].group(5, 6) == ("-", "-")
