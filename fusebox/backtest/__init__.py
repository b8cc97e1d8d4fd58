"""``fusebox backtest``: the generated rules run by the real engines over a recorded window, and
the fuse's own breaker fed what they fired (docs/backtest.md).

Layer 3 (docs/architecture.md): it needs the generator's rules and Alertmanager routing and the
fuse's breaker, like the demo. :func:`backtest` is the whole run; :mod:`.cli` the command.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fuse import FuseEvent, run_fuse
from .recording import Recording, RecordingError, metric_names_in
from .replay import AlertEpisode, ReplayError, duration_s, episodes, replay, rule_timings

__all__ = ["Result", "backtest", "rule_groups", "RecordingError", "ReplayError"]


@dataclass
class Result:
    """One spec's backtest: the window (Unix s), the alert episodes and the fuse's decisions."""

    spec: str
    start: float
    end: float
    alerts: list[AlertEpisode]
    fuse: list[FuseEvent]

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "start": self.start, "end": self.end,
                "alerts": [a.to_dict() for a in self.alerts], "fuse": [f.to_dict() for f in self.fuse]}


def rule_groups(spec) -> list[dict]:
    """The groups ``fusebox generate`` writes for ``spec``, without fusebox's own path (the
    self-monitoring group: a recording of engines and GPUs says nothing of the fuse's health, and
    its always-firing heartbeat would only add noise) and without engine-only group keys."""
    from fusebox.generator.render_rules import render_rules
    from fusebox.generator.selfmon import GROUP as SELF_GROUP

    out = []
    for g in render_rules(spec).groups:
        name = str(g["name"])
        if name == SELF_GROUP or name.startswith(SELF_GROUP + "-"):
            continue
        out.append({"name": name, "interval": g.get("interval"), "rules": g["rules"]})
    return out


def window(rec: Recording, groups: list[dict], start: float | None = None,
           end: float | None = None) -> tuple[float, float]:
    """The replayed range, Unix s: from ``start`` (default: the first sample) rounded up to a whole
    multiple of the longest group interval (an evaluation grid every group shares), to ``end``
    (default: the last sample), whole seconds.

    Raises:
        RecordingError: the range is shorter than one evaluation interval."""
    first, last = rec.span_ms()
    step = max((duration_s(g.get("interval")) for g in groups), default=1.0) or 1.0
    lo = first / 1000.0 if start is None else start
    lo = -(-lo // step) * step
    hi = float(last // 1000) if end is None else float(int(end))
    if hi - lo < step:
        raise RecordingError(f"{rec.source}: the window spans {max(0.0, hi - lo):g} s from its first evaluation, less "
                             f"than one evaluation interval ({step:g} s) -- record (or ask for) a longer window")
    return lo, hi


def backtest(spec_path: str | Path, rec: Recording, *, hold_s: float, start: float | None = None,
             end: float | None = None, display: str | None = None) -> Result:
    """Replay ``spec_path``'s rules over ``rec`` and feed the fuse's breaker.

    ``start``/``end`` (Unix s) default to the recording's span (:func:`window`).

    Raises:
        fusebox.spec.SpecError: the spec is invalid.
        RecordingError: the recording holds no metric the rules read, or spans less than one
            evaluation.
        ReplayError, fusebox.tooling.ToolMissing: an engine failed or is not built.
    """
    from fusebox.spec import load_spec

    spec = load_spec(spec_path, display_path=display)
    groups = rule_groups(spec)
    read = metric_names_in(groups)
    if not rec.names() & read:
        have = ", ".join(sorted(rec.names())[:6])
        raise RecordingError(f"{rec.source}: none of its metrics ({have}{', ...' if len(rec.names()) > 6 else ''}) is "
                             "one the rules read -- record the GPUs' and engines' series the spec's sources name "
                             "(docs/backtest.md lists how)")
    start, end = window(rec, groups, start, end)
    series = replay(rec, groups, start, end)
    eps = episodes(series, rule_timings(groups), start, end)
    return Result(display or str(spec_path), start, end, eps, run_fuse(spec, eps, hold_s))
