"""What a whole ``fusebox demo --once`` run must show, shared by the end-to-end runs on each rule
engine (tests/e2e/test_demo_e2e.py on Prometheus, tests/e2e/test_vm_e2e.py on VictoriaMetrics).

Expected events, worked out from collectors/scenarios/breach.yaml and fusebox.yaml (not from the
demo's own checker): GPU 0 (GPU-5ca1ab1e-...-000000000000, the vision encoder) climbs past 72 %
then 78.3 % -> level 1 freeze_admissions on that GPU; engine llava-decoder-0's alignment P95
passes 0.85 s then 1.28 s -> level 2 text_only_fallback, and its KV growth passes 9.2 then
14.7 MB/s -> level 3 kv_cache_eviction, both on the engine. Each warning fires before its
critical; each level trips once and is released once after recovery; the gateway's own log
holds those six calls and nothing else. The real SGLang Model Gateway, in front of one stand-in
engine per scenario GPU, lists GPU 0's worker out of rotation while level 1 holds it and GPU 1's
(the engine's) while level 3 holds it, and both back at the end: read from its own GET /workers.
"""

from __future__ import annotations

import re
from pathlib import Path

from _support import ROOT, missing

GPU0 = "GPU-5ca1ab1e-0000-4000-8000-000000000000"
ENGINE = "llava-decoder-0"
EXPECTED = {  # level -> (action, scope label, entity, alert)
    1: ("freeze_admissions", "hw_id", GPU0, "GPUMemoryUtilizationHigh"),
    2: ("text_only_fallback", "engine", ENGINE, "AlignmentLatencyP95High"),
    3: ("kv_cache_eviction", "engine", ENGINE, "KVCacheGrowthRateHigh"),
}


def run_demo(tmp_path_factory, name: str, **opts):
    """One ``--once`` run of the whole demo with the shipped spec and breach scenario;
    ``opts``: further StackOptions (engine, replicas) and run() keywords (on_poll). Fails under
    CI / skips elsewhere when a tool is missing. The result gains ``view_log`` (the plain view's
    text: every line the demo said, the stop lines with each pid among them)."""
    from rich.console import Console

    from fusebox.demo import StackOptions, ToolMissing, find_tools, run
    from fusebox.demo.view import DemoView

    run_kw = {k: opts.pop(k) for k in ("on_poll", "stop_when") if k in opts}
    try:
        find_tools(opts.get("engine", "prometheus"))
    except ToolMissing as e:
        missing(f"demo tools: {e}")
    log = tmp_path_factory.mktemp(f"{name}-view") / "view.txt"
    with open(log, "w") as f:
        view = DemoView(Console(file=f, width=200), live=False)
        res = run(StackOptions(workdir=tmp_path_factory.mktemp(name) / "work", spec=ROOT / "fusebox.yaml", **opts),
                  once=True, view=view, **run_kw)
    res.view_log = log
    return res


def first(result, kind, what, **detail):
    """Wall time of the first event of ``kind``/``what`` whose detail has ``detail``, else None."""
    for e in result.events:
        if e.kind == kind and e.what == what and all(e.detail.get(k) == v for k, v in detail.items()):
            return e.at
    return None


def gateway_calls(result) -> list[dict]:
    """The reference gateway's own log of the run (each control call it received)."""
    from fusebox.demo.gateway import read_log

    return read_log(result.workdir / "gateway.jsonl")


def assert_sglang_worker_list_lost_each_fused_worker_and_got_it_back(result):
    views = [e for e in result.events if e.kind == "workers"]
    assert views, "no GET /workers view of the SGLang gateway"
    full = set(views[0].detail["urls"])
    assert len(full) == 2  # breach.yaml: two GPUs, one stand-in engine each
    gone = [set(e.detail["out"]) for e in views]
    out_texts = [e.text.split("out of rotation: ")[-1] for e in views if e.detail["out"]]
    assert any("GPU 0" in t for t in out_texts), out_texts  # level 1 on GPU 0
    assert any("llava-decoder-0" in t for t in out_texts), out_texts  # level 3 on the engine (GPU 1)
    assert gone[-1] == set() and set(views[-1].detail["urls"]) == full


def assert_warning_fired_before_critical(result, level):
    alert = EXPECTED[level][3]
    warn = first(result, "alert", "firing", alertname=alert, severity="warning")
    crit = first(result, "alert", "firing", alertname=alert, severity="critical")
    assert warn is not None and crit is not None, (alert, result.view_log.read_text()[-3000:])
    assert warn < crit


def assert_gateway_log_holds_each_level_tripped_once_then_released_once(result):
    calls = gateway_calls(result)
    assert len(calls) == 6, calls
    assert not any(c["duplicate"] for c in calls)
    for level, (action, label, entity, _alert) in EXPECTED.items():
        mine = [c for c in calls if c["level"] == level]
        assert [c["state"] for c in mine] == ["trip", "release"], mine
        assert all(c["action"] == action and c["scope"].get(label) == entity for c in mine), mine
        assert mine[0]["at"] < mine[1]["at"]


def assert_trips_follow_their_critical_and_releases_follow_recovery(result):
    recovery = first(result, "phase", "recovery")
    breach = first(result, "phase", "breach")
    assert breach is not None and recovery is not None
    for level, (action, _label, _entity, alert) in EXPECTED.items():
        crit = first(result, "alert", "firing", alertname=alert, severity="critical")
        trip = first(result, "fuse", "trip", level=level)
        release = first(result, "fuse", "release", level=level)
        assert trip is not None and release is not None, action
        # the alerts API is polled every 0.5 s, the gateway stamps its own log: allow one poll of skew
        assert breach < trip and crit - 1.0 < trip, (action, crit, trip)
        assert recovery < release, action


def demo_pids(result) -> list[int]:
    """Every pid the demo named when it stopped something (the view's stop lines)."""
    return [int(p) for p in re.findall(r"\(pid (\d+)\)", result.view_log.read_text())]


def assert_every_process_gone(result, at_least: int):
    # each child led its own process group, named by its pid in the view's stop line
    pids = demo_pids(result)
    assert len(pids) >= at_least, result.view_log.read_text()[-2000:]
    for pid in pids:
        assert not alive(pid), pid


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
