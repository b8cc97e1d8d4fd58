"""What a ``--once`` run must have shown, and the check of an observed event log against it.

Expected, for each primary signal with a fuse: its warning fires before its critical; the
critical's fuse level is tripped exactly once, on the scope of the entity the scenario breaches
(GPU UUID for GPU memory, engine id for the engine signals); released exactly once, after the
scenario's recovery phase began; and the gateway is told nothing else. With the SGLang Model
Gateway in the loop, its own worker list (GET /workers) lost a worker while a fuse held it and
had every worker back at the end. With Jaeger in the loop (traces), the exemplar on the slowest
alignment bucket is the scenario's slowest hand-off, and Jaeger holds its trace with the
``mm.handoff`` span that lasted as long.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusebox import conventions as C

from .watch import Event, primary_signals

__all__ = ["Expectation", "expectations", "verify"]


@dataclass(frozen=True)
class Expectation:
    signal: str
    alert: str
    action: str
    level: int
    scope_label: str  # hw_id or engine
    entity: str  # GPU UUID or engine id the scenario breaches


def expectations(spec, scenario) -> list[Expectation]:
    """One per primary signal whose critical tier trips a fuse. The entity comes from the
    scenario's own prediction (``Scenario.predict``), not from what the stack reports."""
    fires = {c.signal: c.entity for c in scenario.predict(spec) if c.tier == "critical" and c.event == "fires"}
    out = []
    for sig in primary_signals(spec):
        tier = next((t for t in sig.tiers if t.fuse), None)
        if tier is None or sig.name not in fires:
            continue
        label = C.LABEL["gpu_id"] if sig.level == "gpu" else C.LABEL["engine"]
        out.append(Expectation(sig.name, sig.alert, tier.fuse, spec.actions[tier.fuse].level, label, fires[sig.name]))
    return out


def _first(events: list[Event], **match) -> float | None:
    for e in events:
        if all((getattr(e, k) if k in ("kind", "what") else e.detail.get(k)) == v for k, v in match.items()):
            return e.at
    return None


def _sglang_problems(events: list[Event]) -> list[str]:
    """The SGLang Model Gateway's own worker list lost a worker, and had it back at the end."""
    views = [e for e in events if e.kind == "workers"]
    if not any(e.detail.get("out") for e in views):
        return ["the SGLang gateway's worker list never lost a worker"]
    if views[-1].detail.get("out"):
        return ["the SGLang gateway's worker list ended without " + ", ".join(views[-1].detail["out"])]
    return []


def _alert_problems(x: Expectation, events: list[Event]) -> tuple[list[str], float | None]:
    """Problems with the alert's tiers firing, and when its critical tier fired (None: never)."""
    problems: list[str] = []
    w = _first(events, kind="alert", what="firing", alertname=x.alert, severity="warning")
    c = _first(events, kind="alert", what="firing", alertname=x.alert, severity="critical")
    if w is None:
        problems.append(f"{x.alert} warning never fired")
    if c is None:
        problems.append(f"{x.alert} critical never fired")
    # the same evaluation is fine: at the spec's own intervals the critical tier's shorter `for`
    # can bring both on one tick (ALERTS is polled: 1 s of granularity)
    if w is not None and c is not None and c < w - 1.0:
        problems.append(f"{x.alert}: critical fired {w - c:.1f}s before warning")
    return problems, c


def _fuse_problems(x: Expectation, calls: list[Event], critical: float | None, recovery: float | None) -> list[str]:
    """Problems with the fuse level's calls: one trip and one release, on the breached entity,
    after the critical tier fired (``critical``) and after the recovery phase began (``recovery``)."""
    problems: list[str] = []
    mine = [e for e in calls if e.detail.get("action") == x.action and e.detail.get("level") == x.level]
    trips = [e for e in mine if e.what == "trip"]
    rels = [e for e in mine if e.what == "release"]
    if len(trips) != 1:
        problems.append(f"level {x.level} ({x.action}) tripped {len(trips)} times, expected once")
    if len(rels) != 1:
        problems.append(f"level {x.level} ({x.action}) released {len(rels)} times, expected once")
    for e in trips + rels:
        got = e.detail.get("scope", {}).get(x.scope_label)
        if got != x.entity:
            problems.append(f"level {x.level} {e.what} on {x.scope_label}={got!r}, expected {x.entity!r}")
    if trips and critical is not None and trips[0].at < critical - 1.0:  # poll granularity: ALERTS is sampled
        problems.append(f"level {x.level} tripped before {x.alert} critical fired")
    if trips and rels and rels[0].at <= trips[0].at:
        problems.append(f"level {x.level} released before it tripped")
    if rels and recovery is not None and rels[0].at < recovery:
        problems.append(f"level {x.level} released before the recovery phase")
    return problems


def _call_problems(calls: list[Event], exp: list[Expectation]) -> list[str]:
    """Gateway calls no expectation asks for, and duplicate ones."""
    problems: list[str] = []
    expected_calls = {(x.action, x.level) for x in exp}
    for e in calls:
        if (e.detail.get("action"), e.detail.get("level")) not in expected_calls:
            problems.append(f"unexpected gateway call: {e.text}")
        if e.detail.get("duplicate"):
            problems.append(f"duplicate gateway call: {e.text}")
    return problems


def slowest_handoff(spec, scenario) -> tuple[float, float]:
    """The scenario's slowest hand-off (seconds, over every engine and tick) and the upper bound of
    the spec's alignment bucket it falls in (the lowest bound at or above it; inf past the last)."""
    from fusebox.collectors.latency import alignment_signal

    ticks = scenario.ticks(scenario.duration_s)
    slowest = max(v for e in scenario.engines for k in range(ticks) for v in scenario.alignment_observations(e.id, k))
    return slowest, next((float(b) for b in alignment_signal(spec).buckets if slowest <= b), math.inf)


def _trace_problems(events: list[Event], spec, scenario) -> list[str]:
    found = [e for e in events if e.kind == "trace"]
    if not found:
        return ["no exemplar on the slowest alignment bucket led to a trace in Jaeger"]
    t = found[0].detail
    slowest, le = slowest_handoff(spec, scenario)
    problems = []
    if float(t["le"]) != le or abs(t["value"] - slowest) > 1e-9:
        problems.append(f"the slowest bucket's exemplar is {t['value']:g} s on le={t['le']}, expected the "
                        f"scenario's slowest hand-off, {slowest:g} s on le={le:g}")
    # the span lasted as long as the hand-off it timed (Jaeger keeps microseconds)
    if t["span"] != "mm.handoff" or abs(t["duration_s"] - slowest) > 2e-6:
        problems.append(f"trace {t['trace_id']}: span {t['span']} of {t['duration_s']:g} s, expected mm.handoff of {slowest:g} s")
    return problems


def verify(events: list[Event], spec, scenario, *, sglang: bool = False, traces: bool = False) -> list[str]:
    """Problems with ``events`` (an ordered log of one scenario run); empty means OK. ``sglang``:
    the SGLang Model Gateway was in the loop (its ``workers`` events are checked too); ``traces``:
    Jaeger was (a ``trace`` event must show the slowest hand-off's trace)."""
    problems: list[str] = _sglang_problems(events) if sglang else []
    if traces:
        problems += _trace_problems(events, spec, scenario)
    exp = expectations(spec, scenario)
    want = len(primary_signals(spec))
    if len(exp) != want:
        problems.append(f"the scenario breaches {len(exp)} fused signals, expected {want} "
                        f"({', '.join(e.signal for e in exp)})")
    recovery = _first(events, kind="phase", what="recovery")
    if recovery is None:
        problems.append("the scenario never reached its recovery phase")
    calls = [e for e in events if e.kind == "fuse"]
    for x in exp:
        alert_problems, critical = _alert_problems(x, events)
        problems += alert_problems + _fuse_problems(x, calls, critical, recovery)
    return problems + _call_problems(calls, exp)
