"""The COST-QoS frontier and the choice on it: pure, no I/O.

From three range-queried series of one workload (its replica count, its p95 request latency in
seconds, its error ratio 0-1, each a list of ``(unix time, value)`` at the query's step), one
point per replica count observed:

* the samples are grouped by the replica count at the same timestamp (rounded to the nearest
  integer; a timestamp missing any of the three series is left out);
* ``p95LatencyMs``: the 0.95 quantile of the group's latency readings, as Prometheus'
  ``quantile_over_time(0.95, ...)`` computes it (linear interpolation between the closest ranks).
  Each reading is already a p95 over its window; taking its 95th percentile over the time at that
  replica count says "this count held the p95 under X for 95 % of the time" -- a mean would let
  a bad half hour hide behind a quiet night, and the maximum would let one outlier (a pod start,
  a deploy) rule a count out forever;
* ``errorRatePct``: the mean of the group's error ratios, in percent. Errors are a budget spent
  over time (an error-rate SLO counts failed requests over all requests), and the mean of the
  ratios is that fraction where traffic is even across the samples; a quantile would turn a
  handful of failing steps into the count's error rate;
* ``costPerHour``: replicas x price per replica-hour (USD).

A point is dominated when another is <= in cost, latency and error rate and < in at least one
(Pareto); the frontier is what is left, by replica count. The choice (:func:`choose`):

1. the cheapest frontier point meeting both QoS constraints (latency <= p95 ceiling, error rate
   <= its ceiling) whose cost is within the budget: QoS met;
2. else the most capable frontier point within the budget -- the one with the most replicas: on
   the frontier each extra replica buys a strictly lower latency or error rate, so it is the
   nearest the budget gets to the QoS (condition BudgetCapped, ``qos_unmet`` 1);
3. else (no point is within the budget at all) ``replicas.min``, saying so (BudgetCapped,
   ``qos_unmet`` 1).

The count chosen is then clamped to ``[replicas.min, replicas.max]`` and its cost recomputed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["Point", "Choice", "Constraints", "points_from_samples", "pareto", "choose", "quantile", "Sample",
           "MET", "BUDGET_CAPPED", "NOTHING_WITHIN_BUDGET"]

Sample = tuple[float, float]  # (unix time in seconds, value)

LATENCY_QUANTILE = 0.95
# the choice's reasons (status.choice.reason and the conditions' reason)
MET = "CheapestMeetingQoS"
BUDGET_CAPPED = "BudgetCapped"
NOTHING_WITHIN_BUDGET = "NoPointWithinBudget"


@dataclass(frozen=True)
class Point:
    """One replica count's point: cost in USD/hour, p95 latency in ms, error rate in percent,
    and how many samples it was built from."""
    replicas: int
    cost_per_hour: float
    p95_latency_ms: float
    error_rate_pct: float
    samples: int = 0

    def dominates(self, other: Point) -> bool:
        """<= ``other`` in cost, latency and error rate, and < in at least one."""
        mine = (self.cost_per_hour, self.p95_latency_ms, self.error_rate_pct)
        theirs = (other.cost_per_hour, other.p95_latency_ms, other.error_rate_pct)
        return all(a <= b for a, b in zip(mine, theirs, strict=True)) and mine != theirs


@dataclass(frozen=True)
class Constraints:
    """What a policy asks: QoS ceilings (ms, percent), the budget (USD/hour), the replica bounds
    and the price of one replica (USD/hour)."""
    p95_latency_ms: float
    error_rate_pct: float
    cost_budget: float
    min_replicas: int
    max_replicas: int
    price_per_replica_hour: float

    def meets_qos(self, p: Point) -> bool:
        return p.p95_latency_ms <= self.p95_latency_ms and p.error_rate_pct <= self.error_rate_pct


@dataclass(frozen=True)
class Choice:
    """The replica count published, its cost (USD/hour), why (one of MET, BUDGET_CAPPED,
    NOTHING_WITHIN_BUDGET), whether QoS is met, the frontier point it came from (None for
    NOTHING_WITHIN_BUDGET) and a sentence for the conditions' message."""
    replicas: int
    cost_per_hour: float
    reason: str
    qos_met: bool
    point: Point | None
    message: str

    @property
    def qos_unmet(self) -> bool:
        """No frontier point within the budget meets the QoS (what fusebox_costqos_qos_unmet says)."""
        return not self.qos_met


def quantile(q: float, values: Sequence[float]) -> float:
    """Prometheus' ``quantile_over_time``: rank ``q * (n - 1)`` in the sorted values, linear
    between the two nearest; NaN for no value. ``q`` in 0..1."""
    if not values:
        return math.nan
    s = sorted(values)
    rank = q * (len(s) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)


def _by_time(samples: Iterable[Sample]) -> dict[float, float]:
    return {t: v for t, v in samples if math.isfinite(v)}


def points_from_samples(replicas: Iterable[Sample], p95_latency_s: Iterable[Sample], error_ratio: Iterable[Sample],
                        price_per_replica_hour: float) -> list[Point]:
    """One :class:`Point` per replica count observed (>= 1), by replica count; see the module's
    docstring for the reduction. Timestamps where any of the three has no finite value are left
    out; so are counts under 1 (a workload scaled to zero serves nothing to measure)."""
    lat, err = _by_time(p95_latency_s), _by_time(error_ratio)
    groups: dict[int, tuple[list[float], list[float]]] = {}
    for t, r in _by_time(replicas).items():
        if t in lat and t in err and round(r) >= 1:
            g = groups.setdefault(round(r), ([], []))
            g[0].append(lat[t])
            g[1].append(err[t])
    return [Point(n, _usd(n * price_per_replica_hour), quantile(LATENCY_QUANTILE, ls) * 1000.0,
                  sum(es) / len(es) * 100.0, len(ls))
            for n, (ls, es) in sorted(groups.items())]


def _usd(x: float) -> float:
    # 3 x 0.21 is 0.63000000000000001 in binary: a cent's millionth is far below any price
    return round(x, 8)


def pareto(points: Sequence[Point]) -> list[Point]:
    """The points no other point dominates, by replica count. O(n^2) over replica counts (tens)."""
    return sorted((p for p in points if not any(q.dominates(p) for q in points)), key=lambda p: p.replicas)


def choose(frontier: Sequence[Point], c: Constraints) -> Choice:
    """The replica count to publish from ``frontier`` (:func:`pareto`'s output) under ``c``; see
    the module's docstring. The count is clamped to ``[c.min_replicas, c.max_replicas]``."""
    within = [p for p in frontier if p.cost_per_hour <= c.cost_budget]
    meeting = [p for p in within if c.meets_qos(p)]
    if meeting:
        p = min(meeting, key=lambda p: (p.cost_per_hour, p.replicas))
        return _clamped(p.replicas, MET, True, p, c,
                        f"{p.replicas} replicas: the cheapest frontier point meeting p95 <= {c.p95_latency_ms:g} ms and "
                        f"errors <= {c.error_rate_pct:g} % ({p.p95_latency_ms:g} ms, {p.error_rate_pct:g} %) at "
                        f"{p.cost_per_hour:g} USD/h within the budget of {c.cost_budget:g} USD/h")
    if within:
        p = max(within, key=lambda p: p.replicas)
        return _clamped(p.replicas, BUDGET_CAPPED, False, p, c,
                        f"no frontier point within the budget of {c.cost_budget:g} USD/h meets p95 <= {c.p95_latency_ms:g} ms "
                        f"and errors <= {c.error_rate_pct:g} %: {p.replicas} replicas, the most the budget pays for "
                        f"({p.p95_latency_ms:g} ms, {p.error_rate_pct:g} % at {p.cost_per_hour:g} USD/h)")
    cheapest = f" (the cheapest point seen: {frontier[0].replicas} replicas at {frontier[0].cost_per_hour:g} USD/h)" if frontier else ""
    return _clamped(c.min_replicas, NOTHING_WITHIN_BUDGET, False, None, c,
                    f"no point is within the budget of {c.cost_budget:g} USD/h{cheapest}: replicas.min, {c.min_replicas}")


def _clamped(n: int, reason: str, met: bool, p: Point | None, c: Constraints, message: str) -> Choice:
    m = min(max(n, c.min_replicas), c.max_replicas)
    if m != n:
        message += f"; clamped to {m} (replicas {c.min_replicas}..{c.max_replicas})"
    return Choice(m, _usd(m * c.price_per_replica_hour), reason, met, p, message)
