"""The ``slos:`` section: service-level objectives on latency histograms (docs/slo.md).

One entry per SLO: which histogram (a latency ``signal:`` of the spec, whose source, buckets and
labels it reuses, or a ``metric:`` of an engine or of the OpenTelemetry GenAI conventions), the
good-event threshold (an observation at or under it is good: it must be one of the histogram's
bucket bounds, because ``rate(..._bucket{le=T})`` counts exactly the observations at or under a
bound and nothing between bounds), the objective (99 %) and the window (30d). The generator turns
each into error-ratio records over the SRE workbook's alerting windows, an error-budget record and
the multiwindow, multi-burn-rate page and ticket alerts (generator/render_slo.py).

Why a section rather than a ``slo:`` block under a signal: an SLO is a promise about requests, not
an alert on a value; the shipped TTFT objective reads vLLM's histogram, which no signal alerts on,
and one histogram may carry several objectives. An SLO on a signal's histogram names it
(``signal:``) and so stays one source of truth for the buckets.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, FiniteFloat, StrictStr

from fusebox import conventions as C

from . import units
from .checking import LABEL, LABEL_FIX

__all__ = ["RawSlo", "RawBurnTier", "Slo", "BurnTier", "normalise_slos", "BURN_WINDOWS", "KNOWN_HISTOGRAMS",
           "otel_prometheus_name", "burn_factor", "RATIO_WINDOWS", "ratio_record", "budget_record", "slo_records"]

Err = Callable[..., None]
_Value = Annotated[str | int | float, BeforeValidator(units.reject_bool)]
_Number = Annotated[FiniteFloat, BeforeValidator(units.reject_bool)]

# The SRE workbook's multiwindow, multi-burn-rate alerts (Beyer et al., The Site Reliability
# Workbook, O'Reilly 2018, chapter 5 "Alerting on SLOs", table 5-8): (severity, share of the
# window's error budget spent, long window, short window). The burn factor is that share times
# the SLO window over the long window: 14.4, 6, 3 and 1 for a 30-day window.
BURN_WINDOWS: tuple[tuple[str, float, float, float], ...] = (
    ("page", 0.02, 3600.0, 300.0),
    ("page", 0.05, 6 * 3600.0, 1800.0),
    ("ticket", 0.10, 86400.0, 7200.0),
    ("ticket", 0.10, 3 * 86400.0, 6 * 3600.0),
)

# The windows the alerts read, shortest first (every long and short window of BURN_WINDOWS).
RATIO_WINDOWS = (300.0, 1800.0, 3600.0, 7200.0, 6 * 3600.0, 86400.0, 3 * 86400.0)


def ratio_record(name: str, window_s: float) -> str:
    """``slo:fusebox_<name>_errors:ratio_rate<w>``: the share of bad events over the window (0-1)."""
    return C.record_name("slo", f"fusebox_{name}_errors", f"ratio_rate{units.format_duration(window_s)}")


def budget_record(name: str) -> str:
    """``slo:fusebox_<name>_error_budget:remaining_ratio``: the budget left over the SLO window (1 = untouched, <0 = overspent)."""
    return C.record_name("slo", f"fusebox_{name}_error_budget", "remaining_ratio")


def slo_records(names: list[str]) -> list[str]:
    """Every record the SLOs ``names`` write (generator/render_slo.py)."""
    return [r for n in names for r in (*(ratio_record(n, w) for w in RATIO_WINDOWS), budget_record(n))]


_SNAKE = re.compile(r"[a-z][a-z0-9_]*")

# Histograms whose bucket bounds are known (docs/metrics.md): an SLO on one may leave out `buckets`.
_VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
              20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_GENAI_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_GENAI_DURATION = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
_GENAI_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
KNOWN_HISTOGRAMS: dict[str, tuple[float, ...]] = {
    "vllm:time_to_first_token_seconds": _VLLM_TTFT,
    "gen_ai.server.time_to_first_token": _GENAI_TTFT,
    "gen_ai.server.request.duration": _GENAI_DURATION,
    "gen_ai.server.time_per_output_token": _GENAI_TPOT,
}


def otel_prometheus_name(metric: str) -> str:
    """The Prometheus name of an OpenTelemetry histogram in seconds (``gen_ai.server.time_to_first_token``
    -> ``gen_ai_server_time_to_first_token_seconds``: dots to underscores, unit ``s`` as ``_seconds``,
    as the Collector's prometheus exporter writes it); a name without dots is returned as it is."""
    if "." not in metric:
        return metric
    return metric.replace(".", "_") + "_seconds"


def burn_factor(budget_share: float, window_s: float, long_s: float) -> float:
    """The burn rate at which ``budget_share`` of an SLO window's budget is spent over ``long_s``
    seconds: ``budget_share * window_s / long_s`` (0.02 * 30d / 1h = 14.4)."""
    return round(budget_share * window_s / long_s, 9)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RawBurnTier(_Strict):
    """``page:`` or ``ticket:`` of an SLO: the house severity its alert carries and, optionally, a
    fuse action it requests (routed like a threshold tier's)."""

    severity: str | None = None
    fuse: str | None = None


class RawSlo(_Strict):
    """One SLO: an objective over a window on a latency histogram, good events at or under ``threshold``."""

    description: str = ""
    alert: str | None = None
    signal: str | None = None
    metric: str | None = None
    source: str | None = None
    # le bounds as numbers (seconds), or durations ('1.28s')
    buckets: list[Annotated[FiniteFloat | StrictStr, BeforeValidator(units.reject_bool)]] | None = None
    by: list[str] | None = None
    threshold: _Value
    objective: _Value
    window: _Value = "30d"
    page: RawBurnTier = RawBurnTier()
    ticket: RawBurnTier = RawBurnTier()


@dataclass(frozen=True)
class BurnTier:
    """One burn-rate alert of an SLO: ``name`` page or ticket, its house ``severity``, its fuse
    action and level (None / 0 without), and its (factor, long window s, short window s) pairs."""

    name: str
    severity: str
    fuse: str | None
    fuse_level: int
    windows: tuple[tuple[float, float, float], ...]


@dataclass(frozen=True)
class Slo:
    """A normalised SLO. ``threshold`` in seconds (a bucket bound), ``objective`` a ratio (0.99),
    ``window_s`` in seconds; ``metric`` is the Prometheus histogram name (without ``_bucket``)."""

    name: str
    alert: str
    description: str
    metric: str
    backend: str
    buckets: tuple[float, ...]
    by: tuple[str, ...]
    threshold: float
    objective: float
    window_s: float
    tiers: tuple[BurnTier, ...]
    path: tuple

    @property
    def budget(self) -> float:
        """The error budget: the share of events allowed to be bad, ``1 - objective``."""
        return round(1.0 - self.objective, 12)


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


def _nearest(threshold: float, buckets: tuple[float, ...]) -> str:
    below = [b for b in buckets if b < threshold]
    above = [b for b in buckets if b > threshold]
    parts = []
    if below:
        parts.append(units.format_number(max(below)))
    if above:
        parts.append(units.format_number(min(above)))
    return " and ".join(parts)


def _bucket_values(raw: list[float | str], path: tuple, err: Err) -> tuple[float, ...] | None:
    """``buckets:`` in seconds: a number is an ``le`` bound as the histogram writes it, a string a
    duration ('1.28s', '250ms'); None after reporting one that is neither."""
    out = []
    for i, b in enumerate(raw):
        if isinstance(b, str):
            try:
                b = units.parse_quantity(b, "seconds")
            except ValueError as e:
                err(path + (i,), f"bucket {b!r}: {getattr(e, 'what', str(e))}", "an le bound, e.g. 1.28, or a duration, e.g. '1.28s'")
                return None
        out.append(float(b))
    return tuple(out)


def _histogram(name: str, raw: RawSlo, signals: dict[str, Any], written: set[str],
               err: Err) -> tuple[str, str, tuple[float, ...], tuple[str, ...]] | None:
    """(metric, backend, buckets, by) of the SLO's histogram, or None after reporting (nothing
    reported for a signal the spec writes that failed to load: its own problem says why)."""
    path = ("slos", name)
    bad = [lb for lb in raw.by or () if not LABEL.match(lb)]
    if bad:
        err(path + ("by",), f"invalid label name {bad[0]!r}", LABEL_FIX)
        return None
    # `le` is on the buckets only (a ratio by it divides by a count that has none: always empty);
    # `__`-prefixed names are Prometheus' own; a name twice is a typo
    odd = [lb for lb in raw.by or () if lb == "le" or lb.startswith("__")]
    twice = sorted({lb for lb in raw.by or () if list(raw.by or ()).count(lb) > 1})
    if odd or twice:
        err(path + ("by",), f"'by' lists {odd[0]!r}, which the ratio cannot be grouped by" if odd
            else f"'by' lists {twice[0]!r} twice",
            "group by labels the histogram's _bucket and _count series share, each once, e.g. [cluster, model_name]")
        return None
    if raw.signal is not None:
        if raw.metric is not None:
            err(path + ("metric",), "an SLO names either a signal or a metric", "drop 'metric': the signal's source is read")
            return None
        sig = signals.get(raw.signal)
        if sig is None and raw.signal in written:
            return None
        if sig is None:
            err(path + ("signal",), f"unknown signal {raw.signal!r}", f"name one of {', '.join(sorted(signals)) or 'the signals'}")
            return None
        if not sig.buckets or not sig.source.metric:
            err(path + ("signal",), f"signal {raw.signal!r} reads no histogram", "name a quantile signal, or give 'metric' and 'buckets'")
            return None
        by = tuple(raw.by) if raw.by is not None else sig.by
        return sig.source.metric, sig.source.backend, tuple(sig.buckets), by
    if raw.metric is None:
        err(path, "an SLO needs 'signal' (a quantile signal of the spec) or 'metric' (a histogram)",
            "e.g. 'metric: vllm:time_to_first_token_seconds'", key=True)
        return None
    if raw.buckets is not None and not raw.buckets:
        err(path + ("buckets",), "the bucket list is empty",
            "list the histogram's le bounds, e.g. [0.5, 1, 1.28, 2.5] or ['500ms', '1s', '1.28s', '2.5s']")
        return None
    if raw.buckets is not None:
        buckets = _bucket_values(raw.buckets, path + ("buckets",), err)
        if buckets is None:
            return None
    else:
        buckets = KNOWN_HISTOGRAMS.get(raw.metric)
    if not buckets:
        err(path + ("metric",), f"the bucket bounds of {raw.metric!r} are not known", "list them under 'buckets'")
        return None
    if list(buckets) != sorted(set(buckets)):
        err(path + ("buckets",), "buckets must be increasing, each once", "sort them")
        return None
    backend = raw.source or ("otel" if "." in raw.metric else raw.metric.split(":")[0] if ":" in raw.metric else "fusebox")
    return otel_prometheus_name(raw.metric), backend, buckets, tuple(raw.by or ("cluster",))


def _tiers(name: str, raw: RawSlo, window_s: float, actions: dict[str, int], err: Err) -> tuple[BurnTier, ...]:
    out = []
    for tier, house in (("page", "critical"), ("ticket", "warning")):
        r: RawBurnTier = getattr(raw, tier)
        level = 0
        if r.fuse is not None:
            if r.fuse not in actions:
                err(("slos", name, tier, "fuse"), f"unknown fuse action {r.fuse!r}",
                    f"name one of fuse.actions: {', '.join(sorted(actions)) or '(none)'}")
            level = actions.get(r.fuse, 0)
        windows = tuple((burn_factor(share, window_s, long_s), long_s, short_s)
                        for sev, share, long_s, short_s in BURN_WINDOWS if sev == tier)
        out.append(BurnTier(tier, r.severity or house, r.fuse, level, windows))
    return tuple(out)


def normalise_slos(raw: dict[str, RawSlo], signals: dict[str, Any], written: set[str], actions: dict[str, int],
                   duration: Callable[[Any, tuple], float], err: Err) -> tuple[Slo, ...]:
    """The ``slos:`` section checked and normalised, in the spec's order.

    ``signals``: name -> normalised Signal; ``written``: every signal the spec writes (one that
    failed to load adds no problem here); ``actions``: fuse action -> level. Reports through
    ``err(path, what, fix)``: a name that is no snake_case word, an unknown signal or fuse action,
    neither or both of ``signal`` and ``metric``, a metric of unknown buckets without ``buckets``, a
    threshold that is no bucket bound (naming the nearest bounds), a ``by`` that is no label name, an objective outside (0, 1), a
    window shorter than the longest alerting window (3d), a fuse on a tier whose ``by`` has no scope
    label but cluster (:data:`fusebox.conventions.SCOPE_LABELS`)."""
    out = []
    for name, r in raw.items():
        path = ("slos", name)
        if not _SNAKE.fullmatch(name):  # ASCII: the name goes into record names and PromQL
            err(path, f"SLO name {name!r} is no snake_case word", "e.g. time_to_first_token", key=True)
            continue
        hist = _histogram(name, r, signals, written, err)
        try:
            threshold = units.parse_quantity(r.threshold, "seconds")
        except ValueError as e:
            err(path + ("threshold",), f"threshold: {e}", "a latency, e.g. '1.28s' or '500ms'")
            continue
        try:
            objective = units.parse_quantity(r.objective, "ratio")
        except ValueError as e:
            err(path + ("objective",), f"objective: {e}", "a share of good events, e.g. '99%'")
            continue
        if not 0 < objective < 1:
            err(path + ("objective",), f"objective {units.format_number(objective * 100)} % is not above 0 % and below 100 %",
                "e.g. '99%' (100 % leaves no error budget to burn)")
            continue
        window_s = duration(r.window, path + ("window",))
        if units.is_duration(r.window) and window_s < BURN_WINDOWS[-1][2]:
            err(path + ("window",), f"window {units.format_duration(window_s)} is shorter than the longest alerting window (3d)",
                "use the SLO window you report on, e.g. 30d or 28d")
        if hist is None:
            continue
        metric, backend, buckets, by = hist
        if threshold not in buckets:
            near = _nearest(threshold, buckets)
            err(path + ("threshold",), f"threshold {units.format_number(threshold)}s is not a bucket bound of {metric}"
                + (f" (nearest: {near})" if near else ""),
                f"use a bound ({near}): between bounds the good events cannot be counted, only interpolated")
            continue
        tiers = _tiers(name, r, window_s, actions, err)
        scopes = [lb for lb in C.SCOPE_LABELS if lb != C.LABEL["cluster"]]
        if not set(by) & set(scopes):
            for t in tiers:
                if t.fuse is not None:  # the fuse scopes a trip by the alert's labels: cluster alone is a whole cluster
                    err(path + (t.name, "fuse"), f"the SLO is by [{', '.join(by)}], which has no fuse scope label "
                        f"({', '.join(scopes)}): its {t.name} would trip {t.fuse} on "
                        + ("its whole cluster" if C.LABEL["cluster"] in by else "no scope (the fuse refuses it)"),
                        "add engine or host_name to 'by' (the histogram must carry it), or remove the fuse")
        top = max((f for t in tiers for f, _, _ in t.windows), default=0.0)
        budget = round(1.0 - objective, 12)
        if top * budget >= 1:
            err(path + ("objective",), f"objective {units.format_number(objective * 100)} % leaves an error budget of "
                f"{units.format_number(budget * 100)} %: the page's {units.format_number(top)}x burn needs an error ratio of "
                f"{units.format_number(top * budget)}, and a ratio never exceeds 1, so it could never fire",
                f"an objective above {(1 - 1 / top) * 100:.2f} % (e.g. '99%'); a ratio is written as '99%' or 0.99")
            continue
        out.append(Slo(name=name, alert=r.alert or f"{_camel(name)}ErrorBudgetBurn", description=" ".join(r.description.split()),
                       metric=metric, backend=backend, buckets=buckets, by=by, threshold=threshold, objective=objective,
                       window_s=window_s, tiers=tiers, path=path))
    return tuple(out)
