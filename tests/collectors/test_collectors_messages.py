"""What a user sees when a collector is pointed at the wrong thing (found in a fresh-clone trial)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIX = Path(__file__).resolve().parents[1] / "fixtures"


def _fusebox(*args: str, timeout: float = 60, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fusebox.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


def test_replay_of_a_non_capture_lists_the_formats_it_reads():
    r = _fusebox("collect", "gpu", "--replay", str(FIX / "generator/datadog_vllm_metrics_fixture_opt-125m.txt"), "--once")
    assert r.returncode == 2
    assert "nvidia-smi -q -x" in r.stderr and "--query-gpu" in r.stderr and "Traceback" not in r.stderr


def test_scenario_once_at_outside_the_timeline_is_refused():
    r = _fusebox("collect", "scenario", "--once-at", "999")
    assert r.returncode == 2 and "outside the scenario (0..300 s" in r.stderr


def test_a_running_collector_says_where_its_data_goes():
    capture = next((FIX / "collectors").glob("*rtx-4090*.xml"))
    p = subprocess.Popen([sys.executable, "-m", "fusebox.cli", "collect", "gpu", "--replay", str(capture),
                          "--interval", "1", "--otlp-endpoint", "http://127.0.0.1:9/"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = p.stderr.readline()
    finally:
        p.kill()
        p.wait(timeout=30)
    assert line.startswith("fusebox collect gpu: every 1s -> OTLP http to http://127.0.0.1:9/"), line


@pytest.mark.parametrize("args, what", [
    (("collect", "latency", "--engine-id", "0", "--once", "--endpoint",
      str(FIX / "collectors/hardware-aware-router_vllm-v1_tinyllama-1.1b_idle_2025-11.txt")), "latency buckets"),
    (("collect", "scenario", "--timeline", "text"), "thresholds"),
])
def test_a_collector_run_outside_the_repository_without_spec_says_to_pass_it(tmp_path, args, what):
    """--spec defaults to fusebox.yaml in the current folder; from a folder without one the
    collector names the missing file and the flag, and exits 2 (not a bare errno line)."""
    r = _fusebox(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("fusebox collect: fusebox.yaml: no such file -- pass --spec FILE"), r.stderr
    assert f"it gives the {what}" in r.stderr and f"looked for in {tmp_path}" in r.stderr and "[Errno" not in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""
