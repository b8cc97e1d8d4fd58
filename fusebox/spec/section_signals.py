"""The ``signals:`` and ``overrides:`` sections, normalised: each signal's names, chosen source,
sources, level and ``by``, window, kind fields (its kind's hooks: :class:`fusebox.signal_kinds.base.Kind`),
tiers (:mod:`.section_tiers`) and runbook; then the records two signals share."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fusebox import conventions as C
from fusebox.signal_kinds.base import SGLANG, VLLM, Kind
from fusebox.signal_kinds.registry import KINDS

from . import sourceunits, units
from .checking import ALERT, LABEL, NAME, STANDARD_LEVELS, TIER_ORDER, Checker
from .normalised import FuseAction, Runbook, Signal, Source, Tier
from .schema import RawGlobal, RawOverride, RawSignal, RawSource
from .section_global import Defaults
from .section_tiers import Override, TierInputs, normalise_tiers

_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def normalise_overrides(ck: Checker, overrides: list[RawOverride]) -> dict[str, dict[str, Override]]:
    """``overrides:`` by alert, then by tier (``"*"``: an override without ``tier``)."""
    out: dict[str, dict[str, Override]] = {}
    for i, o in enumerate(overrides):
        key = o.tier or "*"
        if o.tier is not None and o.tier not in TIER_ORDER:
            ck.err(("overrides", i, "tier"), f"unknown tier {o.tier!r}", "use 'warning' or 'critical', or leave it out for both")
        if o.tier is not None and o.source is not None:  # one source per signal: a tier's would be ignored
            ck.err(("overrides", i, "source"), f"an override's source applies to the whole signal, not to tier {o.tier!r}",
                   f"move 'source: {o.source}' to an override of {o.alert} without 'tier'")
        if key in out.setdefault(o.alert, {}):
            ck.err(("overrides", i), f"a second override for {o.alert} tier {key}", "merge the two overrides into one")
        out[o.alert][key] = (o, i)
    return out


@dataclass(frozen=True)
class _Choice:
    name: str  # the key of `sources` the rules read
    path: tuple  # where it was chosen (the signal's `source`, or an override's)
    chosen: bool  # named (the signal's or an override's source, global.source) or the only one listed


def _choose_source(g: RawGlobal, s: RawSignal, path: tuple, ovr: dict[str, Override]) -> _Choice:
    """An override's source, else the signal's own, else global.source when listed, else the first listed."""
    whole = ovr.get("*")
    if whole and whole[0].source:
        return _Choice(whole[0].source, ("overrides", whole[1], "source"), True)
    name = s.source or (g.source if g.source in s.sources else next(iter(s.sources), ""))
    return _Choice(name, path + ("source",), bool(s.source) or g.source in s.sources or len(s.sources) == 1)


def _check_override_tiers(ck: Checker, name: str, s: RawSignal, ovr: dict[str, Override]) -> None:
    for tname, (_o, idx) in ovr.items():
        if tname in TIER_ORDER and tname not in s.tiers:  # it would change nothing
            ck.err(("overrides", idx, "tier"), f"override of {s.alert} tier {tname!r}: signal {name} has no {tname} tier",
                   f"use tier: {' or '.join(t for t in s.tiers if t in TIER_ORDER) or '(none)'}, "
                   f"or add a {tname} tier under signals.{name}.tiers")


def _source(ck: Checker, s: RawSignal, kind: Kind, backend: str, src: RawSource, spath: tuple) -> Source:
    """One entry of ``sources``: the kind's own checks, then PromQL, the metric's name and unit, the scale."""
    kind.check_raw_source(backend, src, spath, ck.err)
    if src.expr is not None:
        ck.promql(src.expr, spath + ("expr",))
    if src.metric is not None and not _METRIC.match(src.metric):
        ck.err(spath + ("metric",), f"{src.metric!r} is not a valid Prometheus metric name",
               "metric names match [a-zA-Z_:][a-zA-Z0-9_:]*")
    elif src.metric is not None:  # a unit the kind cannot turn into the signal's: never fires (or always)
        bad = sourceunits.check(kind, src.metric, s.unit, src.scale)
        if bad:
            ck.err(spath + ("metric",), *bad)
    if src.scale == 0:  # the rules divide by it
        ck.err(spath + ("scale",), "scale must not be 0", "leave it out for 1, or give the factor to base units")
    return Source(backend, src.metric, src.scale, src.expr, src.note, src.capacity, src.free)


def _sources(ck: Checker, s: RawSignal, path: tuple, kind: Kind, choice: _Choice) -> dict[str, Source]:
    if not s.sources:
        ck.err(path + ("sources",), "a signal needs at least one source",
               "add e.g. 'sources: {vllm: {metric: vllm:num_requests_waiting}}'")
    elif choice.name not in s.sources:
        ck.err(choice.path, f"source {choice.name!r} is not listed under sources", f"use one of: {', '.join(s.sources)}")
    return {backend: _source(ck, s, kind, backend, src, path + ("sources", backend)) for backend, src in s.sources.items()}


def _level(ck: Checker, s: RawSignal, path: tuple) -> tuple[str, ...]:
    """The ``by`` labels; the level a label name and, beyond gpu, engine and host, one of them; a
    fuse on such a level needs a scope label to trip."""
    by = tuple(s.by) if s.by is not None else ()
    ck.labels(by, path + ("by",))
    if not LABEL.match(s.level) or s.level.startswith("__"):
        ck.err(path + ("level",), f"level {s.level!r} is not a label name",
               f"use {', '.join(STANDARD_LEVELS)} or a label the signal is aggregated by (pod, model_name, namespace, ...)")
    elif s.level not in STANDARD_LEVELS and s.level not in by:
        ck.err(path + ("level",) if s.by is None else path + ("by",),
               f"level {s.level!r} is not one of the signal's 'by' labels",
               # without a by: the namespace and the level (docs/spec.md: cluster is never in 'by')
               f"aggregate by it: by: [{', '.join(by + (s.level,)) if by else ', '.join(dict.fromkeys(('namespace', s.level)))}]")
    scopes = [lb for lb in C.SCOPE_LABELS if lb != C.LABEL["cluster"]]
    if s.level not in STANDARD_LEVELS and not set(by) & set(scopes):
        for tname, t in s.tiers.items():
            if t.fuse is not None:  # the fuse service scopes a trip by these labels; cluster alone is a whole cluster
                ck.err(path + ("tiers", tname, "fuse"),
                       f"a {s.level}-level signal by [{', '.join(by)}] has no fuse scope label ({', '.join(scopes)})",
                       "add the engine or host_name label to 'by' (e.g. with label_replace in an expr), or remove the fuse")
    return by


def _window(ck: Checker, s: RawSignal, path: tuple, kind: Kind, scrape: float) -> float:
    """The window in seconds where the kind takes one (0.0 where it takes none)."""
    if kind.window_min_scrapes is None:
        if s.window is not None:
            ck.err(path + ("window",), f"'window' means nothing for a {s.kind} signal", "remove it")
        return 0.0
    if s.window is None:
        ck.err(path, f"a {s.kind} signal needs a 'window'",
               f"add e.g. 'window: 1m' (at least {kind.window_min_scrapes} scrape intervals)")
        return 0.0
    window = ck.duration(s.window, path + ("window",))
    kind.check_window(window, scrape, path, ck.err)
    return window


@dataclass(frozen=True)
class SignalInputs:
    """What every signal is normalised against: ``global``, ``defaults``, ``fuse.actions``, the
    overrides by alert, and the scrape interval in seconds."""

    g: RawGlobal
    defaults: Defaults
    actions: dict[str, FuseAction]
    overrides: dict[str, dict[str, Override]]
    scrape_s: float


def _signal(ck: Checker, name: str, s: RawSignal, path: tuple, si: SignalInputs) -> Signal | None:
    """One signal, or None when it has a problem (reported)."""
    n_before = len(ck.problems)
    ovr = si.overrides.get(s.alert, {})
    choice = _choose_source(si.g, s, path, ovr)
    _check_override_tiers(ck, name, s, ovr)
    kind = KINDS[s.kind]
    sources = _sources(ck, s, path, kind, choice)
    by = _level(ck, s, path)
    window = _window(ck, s, path, kind, si.scrape_s)
    buckets = kind.check_fields(s, path, ck.err)
    off: list[Tier] = []
    tiers = normalise_tiers(ck, TierInputs(name, s, path, ovr, si.defaults, si.actions, kind, buckets), off)
    if kind.growth_only and s.direction != "above":
        ck.err(path + ("direction",), f"a {s.kind} signal alerts on growth only", "remove 'direction: below'")
    for tname in s.runbook.sop:
        if tname not in TIER_ORDER:
            ck.err(path + ("runbook", "sop", tname), f"unknown tier {tname!r} in runbook.sop", "use 'warning' and/or 'critical'", key=True)
    if len(ck.problems) > n_before:
        return None
    rb = s.runbook
    return Signal(
        # ${window}: the signal's own window as the rules write it, so the text follows it
        name=name, alert=s.alert, description=s.description.strip().replace("${window}", units.format_duration(window)),
        kind=s.kind, unit=s.unit, level=s.level,
        direction=s.direction, by=by, window_s=window, quantile=s.quantile, buckets=buckets,
        source=sources[choice.name], sources=sources, tiers=tiers,
        safe_level=next((t for t in (*tiers, *off) if t.name == "warning"), None),
        runbook=Runbook(rb.symptom.strip(), rb.impact.strip(), tuple((d.title, d.query) for d in rb.diagnosis),
                        {k: tuple(v) for k, v in rb.sop.items()}),
        secondary=s.secondary, path=path, source_chosen=choice.chosen,
    )


def _check_shared_record(ck: Checker, g: RawGlobal, sig: Signal, earlier: list[Signal], path: tuple) -> None:
    """Signals whose value records share a name (two deriv signals over one gauge and window)
    share that record and its rule group, so they must compute it alike: the same label
    matchers (``global.selectors``), engine-label handling (vLLM / SGLang), ``by`` and scale."""

    def identity(s: Signal) -> tuple:
        b = s.source.backend
        return tuple(sorted(g.selectors.get(b, g.selector).items())), b in (VLLM, SGLANG), s.by, s.source.scale

    value = KINDS[sig.kind].records(sig)["value"]
    for other in earlier:
        if KINDS[other.kind].records(other)["value"] == value and identity(other) != identity(sig):
            ck.err(path + ("by",), f"{sig.name} and {other.name} read one metric over one window, so they share the record "
                   f"{value}, but compute it differently (source selectors, scale or by)",
                   f"give {sig.name} the same source and by as {other.name}, or a different window")


_LABEL_REF = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)")


def _check_advice_labels(ck: Checker, sig: Signal) -> None:
    """A tier's ``advice`` names only labels its alert keeps: one it lacks renders empty in every
    notification (an aggregation ``by`` without it drops it)."""
    kept = KINDS[sig.kind].kept_labels(sig)
    if kept is None:  # the source series' labels: not known here
        return
    for tier in sig.tiers:
        for label in dict.fromkeys(_LABEL_REF.findall(tier.advice or "")):
            if label not in kept:
                ck.err(tier.path + ("advice",), f"advice names label {label!r}, which the alert lacks (it keeps "
                       f"{', '.join(kept)}: the signal's by)", f"add {label} to the signal's by, or leave it out of the advice")


def _check_names(ck: Checker, name: str, s: RawSignal, path: tuple, alerts_seen: dict[str, str]) -> None:
    if not NAME.match(name):
        ck.err(path, f"signal name {name!r} is not snake_case", "use lower-case letters, digits and '_'", key=True)
    if not ALERT.match(s.alert):
        ck.err(path + ("alert",), f"alert name {s.alert!r} is not CamelCase",
               "use a CamelCase name with a component word, e.g. GPUMemoryUtilizationHigh")
    if s.alert in alerts_seen or s.alert in C.RESERVED_ALERTS:
        ck.err(path + ("alert",), f"duplicate alert name {s.alert!r} (also used by {alerts_seen.get(s.alert, 'fusebox itself')})",
               "one alert name per signal: rename one of them")
    alerts_seen[s.alert] = name


def normalise_signals(ck: Checker, raw: dict[str, RawSignal], si: SignalInputs) -> list[Signal]:
    """Every signal without a problem, in spec order; then the overrides naming no signal's alert."""
    signals: list[Signal] = []
    alerts_seen: dict[str, str] = {}
    for name, raw_sig in raw.items():
        path = ("signals", name)
        _check_names(ck, name, raw_sig, path, alerts_seen)
        sig = _signal(ck, name, raw_sig, path, si)
        if sig:
            _check_shared_record(ck, si.g, sig, signals, path)
            _check_advice_labels(ck, sig)
            signals.append(sig)
    for alert, per_tier in si.overrides.items():
        if alert not in alerts_seen:
            idx = per_tier[next(iter(per_tier))][1]
            ck.err(("overrides", idx, "alert"), f"override names unknown alert {alert!r}",
                   f"use one of: {', '.join(sorted(alerts_seen))}")
    return signals
