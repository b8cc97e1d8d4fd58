"""Prometheus' arithmetic, once: what the generated rules compute, for code that must predict it.

The promtool tests the generator writes (expected values) and the scenario player (predicted
alert crossings) both need the numbers Prometheus will produce from a series. They share these
functions so that the two predictions cannot disagree with each other; each follows the
Prometheus source it names.

A leaf module: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["histogram_quantile", "deriv", "deriv_series", "breaches", "for_elapsed"]


def histogram_quantile(q: float, bounds: Sequence[float], cum: Sequence[float]) -> float:
    """Prometheus' ``histogram_quantile`` over one classic histogram.

    Follows ``bucketQuantile`` in promql/quantile.go: the rank ``q * count`` is located in the
    first bucket whose cumulative count reaches it and interpolated linearly inside it (the
    lowest bucket starts at 0 when its upper bound is positive); a rank in the ``+Inf`` bucket
    returns the highest finite bound.

    Args:
        q: the quantile, 0..1 (outside it: -Inf / +Inf, as Prometheus).
        bounds: finite upper bounds (``le``), ascending, seconds or any unit; an ``inf`` last
            entry is accepted and ignored.
        cum: cumulative counts per bound, then the ``+Inf`` bucket last
            (``len(cum) == len(finite bounds) + 1``).

    Returns:
        The quantile in the bounds' unit; NaN when the histogram holds no observation (zero
        traffic: no alert can fire on it, docs/pitfalls.md P1).
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    finite = [b for b in bounds if not math.isinf(b)]
    if len(cum) != len(finite) + 1:
        raise ValueError(f"{len(cum)} cumulative counts for {len(finite)} finite bounds: expected one more (+Inf)")
    total = cum[-1]
    if len(cum) < 2 or total == 0 or math.isnan(total):
        return math.nan
    rank = q * total
    # sort.Search over every bucket but +Inf: the first whose count reaches the rank.
    b = next((i for i in range(len(finite)) if cum[i] >= rank), len(finite))
    if b == len(finite):
        return finite[-1]
    if b == 0 and finite[0] <= 0:
        return finite[0]
    start, end, count = 0.0, finite[b], cum[b]
    if b > 0:
        start = finite[b - 1]
        count -= cum[b - 1]
        rank -= cum[b - 1]
    if count == 0:
        return math.nan
    return start + (end - start) * (rank / count)


def deriv(points: Sequence[tuple[float, float]]) -> float:
    """Prometheus' ``deriv``: the least-squares slope of the samples in the range, per second.

    Args:
        points: ``(time_s, value)`` samples inside the range window, oldest first.
            Prometheus 3 selects ``(t - window, t]``, Prometheus 2 ``[t - window, t]``: the caller
            chooses the samples.

    Returns:
        The slope (value units per second); NaN with fewer than two samples (Prometheus returns
        no sample).
    """
    n = len(points)
    if n < 2:
        return math.nan
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return math.nan
    return sum((p[0] - mx) * (p[1] - my) for p in points) / sxx


def deriv_series(times: Sequence[float], values: Sequence[float], window: float) -> list[float]:
    """Prometheus 3's ``deriv(x[window])`` evaluated at each of ``times`` over the samples
    ``(times[i], values[i])``: the slope of those in ``(t - window, t]``, per second (NaN where
    fewer than two)."""
    return [deriv([(tt, v) for tt, v in zip(times[: i + 1], values[: i + 1], strict=True) if tt > t - window])
            for i, t in enumerate(times)]


def breaches(value: float, threshold: float, direction: str = "above") -> bool:
    """Whether the generated alert expression holds: ``value >= threshold`` for an upper bound,
    ``value <= threshold`` for a lower one (the rules' operators). NaN never breaches."""
    if math.isnan(value):
        return False
    if direction == "above":
        return value >= threshold
    if direction == "below":
        return value <= threshold
    raise ValueError(f"direction must be 'above' or 'below', not {direction!r}")


def for_elapsed(for_s: float, interval_s: float) -> float:
    """Seconds from the evaluation at which an alert's condition first holds (it goes pending) to
    the evaluation at which it fires, the condition holding at each: the tier's ``for`` rounded up
    to a whole number of its group's evaluation intervals.

    Follows ``AlertingRule.Eval`` in rules/alerting.go: a pending alert fires at the first
    evaluation where ``ts.Sub(a.ActiveAt) >= r.holdDuration``, and evaluations come every
    ``interval_s``; vmalert's ``AlertingRule.exec`` compares the same way. ``for: 15s`` in a group
    evaluated every 30 s fires 30 s after it went pending, not 15 s; ``for: 0s`` fires at once.
    A ``for`` within a microsecond over a whole number of intervals counts as that number.
    """
    if for_s <= 0:
        return 0.0
    if interval_s <= 0:
        return for_s
    return math.ceil(for_s / interval_s - 1e-6) * interval_s
