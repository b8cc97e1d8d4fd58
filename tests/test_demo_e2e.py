"""The demo's --once machinery on the real stack: Prometheus 2.42, Alertmanager 0.25, the built
OpenTelemetry Collector, the scenario collector, the fuse service and the reference gateway.

Expected events, worked out from collectors/scenarios/breach.yaml and fusebox.yaml (not from the
demo's own checker): GPU 0 (GPU-5ca1ab1e-...-000000000000, the vision encoder) climbs past 72 %
then 78.3 % -> level 1 freeze_admissions on that GPU; engine llava-decoder-0's alignment P95
passes 0.85 s then 1.28 s -> level 2 text_only_fallback, and its KV growth passes 9.2 then
14.7 MB/s -> level 3 kv_cache_eviction, both on the engine. Each warning fires before its
critical; each level trips once and is released once after recovery; the gateway's own log
holds those six calls and nothing else. The real SGLang Model Gateway, in front of one stand-in
engine per scenario GPU, lists GPU 0's worker out of rotation while level 1 holds it and GPU 1's
(the engine's) while level 3 holds it, and both back at the end: read from its own GET /workers.
One run takes about 4 minutes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def missing(what: str, how: str):
    msg = f"{what} not found: {how}"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(msg)
    pytest.skip(msg)

pytestmark = [pytest.mark.tools, pytest.mark.otelcol]

ROOT = Path(__file__).resolve().parents[1]
GPU0 = "GPU-5ca1ab1e-0000-4000-8000-000000000000"
ENGINE = "llava-decoder-0"
EXPECTED = {  # level -> (action, scope label, entity, alert)
    1: ("freeze_admissions", "hw_id", GPU0, "GPUMemoryUtilizationHigh"),
    2: ("text_only_fallback", "engine", ENGINE, "AlignmentLatencyP95High"),
    3: ("kv_cache_eviction", "engine", ENGINE, "KVCacheGrowthRateHigh"),
}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    from fusebox.demo import StackOptions, ToolMissing, find_tools, run
    from fusebox.demo.view import DemoView

    try:
        find_tools()
    except ToolMissing as e:
        missing("demo tools", str(e))
    from rich.console import Console

    log = tmp_path_factory.mktemp("demo-view") / "view.txt"
    with open(log, "w") as f:
        view = DemoView(Console(file=f, width=200), live=False)
        res = run(StackOptions(workdir=tmp_path_factory.mktemp("demo") / "work", spec=ROOT / "fusebox.yaml"),
                  once=True, view=view)
    res.view_log = log
    return res


def test_the_sglang_gateways_own_worker_list_loses_each_fused_worker_and_gets_it_back(result):
    views = [e for e in result.events if e.kind == "workers"]
    assert views, "no GET /workers view of the SGLang gateway"
    full = set(views[0].detail["urls"])
    assert len(full) == 2  # breach.yaml: two GPUs, one stand-in engine each
    gone = [set(e.detail["out"]) for e in views]
    out_texts = [e.text.split("out of rotation: ")[-1] for e in views if e.detail["out"]]
    assert any("GPU 0" in t for t in out_texts), out_texts  # level 1 on GPU 0
    assert any("llava-decoder-0" in t for t in out_texts), out_texts  # level 3 on the engine (GPU 1)
    assert gone[-1] == set() and set(views[-1].detail["urls"]) == full


def test_the_run_finishes_without_a_process_dying_and_in_under_five_minutes(result):
    assert result.error is None, result.error
    assert result.wall_s < 300, result.wall_s


def _first(result, kind, what, **detail):
    for e in result.events:
        if e.kind == kind and e.what == what and all(e.detail.get(k) == v for k, v in detail.items()):
            return e.at
    return None


@pytest.mark.parametrize("level", [1, 2, 3])
def test_each_signal_warns_before_its_critical_fires(result, level):
    alert = EXPECTED[level][3]
    warn = _first(result, "alert", "firing", alertname=alert, severity="warning")
    crit = _first(result, "alert", "firing", alertname=alert, severity="critical")
    assert warn is not None and crit is not None, (alert, result.view_log.read_text()[-3000:])
    assert warn < crit


def test_the_gateway_log_holds_each_level_tripped_once_then_released_once_and_nothing_else(result):
    from fusebox.fuse.gateway import read_log

    calls = read_log(result.workdir / "gateway.jsonl")
    assert len(calls) == 6, calls
    assert not any(c["duplicate"] for c in calls)
    for level, (action, label, entity, _alert) in EXPECTED.items():
        mine = [c for c in calls if c["level"] == level]
        assert [c["state"] for c in mine] == ["trip", "release"], mine
        assert all(c["action"] == action and c["scope"].get(label) == entity for c in mine), mine
        assert mine[0]["at"] < mine[1]["at"]


def test_fuses_trip_after_their_critical_fires_and_release_after_recovery_begins(result):
    recovery = _first(result, "phase", "recovery")
    breach = _first(result, "phase", "breach")
    assert breach is not None and recovery is not None
    for level, (action, _label, _entity, alert) in EXPECTED.items():
        crit = _first(result, "alert", "firing", alertname=alert, severity="critical")
        trip = _first(result, "fuse", "trip", level=level)
        release = _first(result, "fuse", "release", level=level)
        assert trip is not None and release is not None, action
        # ALERTS is polled every 0.5 s, the gateway stamps its own log: allow one poll of skew
        assert breach < trip and crit - 1.0 < trip, (action, crit, trip)
        assert recovery < release, action


def test_the_demos_own_verdict_agrees(result):
    assert result.ok and result.problems == [], result.problems


def test_every_process_the_demo_started_is_gone(result):
    for log in (result.workdir / "logs").glob("*.log"):
        assert log.stat().st_size >= 0
    # each child led its own process group, named by its pid in the view's stop line
    import re

    text = result.view_log.read_text()
    pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", text)]
    assert len(pids) >= 6, text[-2000:]
    for pid in pids:
        assert not _alive(pid), pid


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
