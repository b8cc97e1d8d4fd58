"""The ``global:`` and ``defaults:`` sections, normalised: the scrape and evaluation intervals,
label names, the per-backend selectors and the default source, the tiers' default durations."""

from __future__ import annotations

from dataclasses import dataclass

from fusebox import conventions as C
from fusebox.signal_kinds.base import KNOWN_BACKENDS

from .checking import Checker
from .schema import RawDefaults, RawGlobal, RawSignal, Scalar


@dataclass(frozen=True)
class Intervals:
    """``global``'s intervals in seconds (0.0 where malformed, reported)."""

    scrape_s: float
    evaluation_s: float
    slow_s: float  # global.slow_evaluation_interval as written (Spec takes the longer of it and evaluation_s)


@dataclass(frozen=True)
class Defaults:
    """``defaults:``: the tiers' ``for`` and ``keep_firing_for`` as written (each tier parses the
    one it takes, so a bad default is reported at the default), the absent alert's ``for`` in seconds."""

    for_: Scalar
    keep_firing_for: Scalar
    absent_for_s: float


def _positive(ck: Checker, g: RawGlobal) -> Intervals:
    scrape = ck.duration(g.scrape_interval, ("global", "scrape_interval"))
    evaluation = ck.duration(g.evaluation_interval, ("global", "evaluation_interval"))
    if scrape <= 0:
        ck.err(("global", "scrape_interval"), "scrape_interval must be positive", "e.g. '15s'")
    if evaluation <= 0:  # the rule group interval and the promtool test step
        ck.err(("global", "evaluation_interval"), "evaluation_interval must be positive", "e.g. '15s'")
    slow = ck.duration(g.slow_evaluation_interval, ("global", "slow_evaluation_interval"))
    if slow <= 0:
        ck.err(("global", "slow_evaluation_interval"), "slow_evaluation_interval must be positive", "e.g. '30s'")
    return Intervals(scrape, evaluation, slow)


def normalise_global(ck: Checker, g: RawGlobal, signals: dict[str, RawSignal]) -> Intervals:
    """Check ``global`` (``signals``: the raw signals, whose source backends key ``selectors``)."""
    intervals = _positive(ck, g)
    ck.labels(list(g.selector) + list(g.labels), ("global",))
    if C.LABEL["marker"] in g.labels:  # Alertmanager routes to the fuse on it: fusebox alone sets it
        ck.err(("global", "labels", C.LABEL["marker"]), f"label {C.LABEL['marker']!r} is set by fusebox on every alert "
               "(valued with metadata.name)", "remove it from global.labels; rename metadata.name to change its value",
               key=True)
    listed = {b for sig in signals.values() for b in sig.sources} | set(KNOWN_BACKENDS)
    for backend, matchers in g.selectors.items():
        if backend not in listed:
            ck.err(("global", "selectors", backend), f"no source backend is called {backend!r}",
                   f"key global.selectors like the signals' sources: {', '.join(sorted(listed))}", key=True)
        for k in matchers:
            ck.labels([k], ("global", "selectors", backend, k), key=True)
    if g.source not in listed:
        ck.err(("global", "source"), f"no signal lists a source {g.source!r}",
               f"use one of: {', '.join(sorted(listed))}")
    return intervals


def normalise_defaults(ck: Checker, d: RawDefaults) -> Defaults:
    """Check ``defaults``' durations (each once, at the default)."""
    ck.duration(d.for_, ("defaults", "for"))
    ck.duration(d.keep_firing_for, ("defaults", "keep_firing_for"))
    return Defaults(d.for_, d.keep_firing_for, ck.duration(d.absent.for_, ("defaults", "absent", "for")))
