"""The COST-QoS controller's test series and the frontier worked out from them by hand.

One workload's history, one sample a minute, 21 minutes at each replica count 1..6 in turn
(126 samples per series). 21 readings a group make Prometheus' 0.95 quantile land on a rank:
``0.95 * (21 - 1) = 19``, the second largest of the 21 (no interpolation); the error rate is the
mean of the 21 ratios. Price 0.21 USD per replica-hour.

| replicas | latency readings (s)              | p95    | error ratios               | mean    | USD/h |
|---|---|---|---|---|---|
| 1 | 19 x 0.40, 0.52, 0.90             | 520 ms | 21 x 0.02                  | 2.0 %   | 0.21 |
| 2 | 18 x 0.22, 0.25, 0.27, 0.60       | 270 ms | 14 x 0.005, 7 x 0.011      | 0.7 %   | 0.42 |
| 3 | 19 x 0.17, 0.19, 0.35             | 190 ms | 21 x 0.006                 | 0.6 %   | 0.63 |
| 4 | 19 x 0.14, 0.15, 0.50             | 150 ms | 20 x 0.003, 0.024          | 0.4 %   | 0.84 |
| 5 | 19 x 0.15, 0.16, 0.20             | 160 ms | 21 x 0.004                 | 0.4 %   | 1.05 |
| 6 | 21 x 0.11                         | 110 ms | 21 x 0.002                 | 0.2 %   | 1.26 |

(2: (14 x 0.005 + 7 x 0.011) / 21 = 0.147 / 21 = 0.007; 4: (20 x 0.003 + 0.024) / 21 = 0.084 / 21 =
0.004.) Frontier: 5 is dominated by 4 (0.84 < 1.05 USD/h, 150 < 160 ms, 0.4 = 0.4 %); every other
point is cheaper than each point with a lower latency or error rate, so none else is. Group 4 keeps
a 0.50 s reading and a 2.4 % step: a maximum would rule 4 out, the 95th percentile does not. Group 6
is last and constant, so the copies of its last sample a range query repeats for Prometheus'
5-minute lookback change nothing.

Under QoS p95 <= 200 ms and errors <= 0.5 %, replicas 1..8:
* budget 1.00 USD/h: within it 1-4; 4 is the cheapest meeting both (3 fails errors, 0.6 > 0.5): 4;
* budget 0.70 USD/h: within it 1-3, none meets both: the budget-capped point, the most replicas
  within it: 3 (0.63 USD/h), qos_unmet 1;
* budget 0.10 USD/h: no point within it: replicas.min, 1 (0.21 USD/h), qos_unmet 1.
"""

from __future__ import annotations

PRICE = 0.21
STEP_S = 60
GROUPS: dict[int, tuple[list[float], list[float]]] = {
    1: ([0.40] * 19 + [0.52, 0.90], [0.02] * 21),
    2: ([0.22] * 18 + [0.25, 0.27, 0.60], [0.005] * 14 + [0.011] * 7),
    3: ([0.17] * 19 + [0.19, 0.35], [0.006] * 21),
    4: ([0.14] * 19 + [0.15, 0.50], [0.003] * 20 + [0.024]),
    5: ([0.15] * 19 + [0.16, 0.20], [0.004] * 21),
    6: ([0.11] * 21, [0.002] * 21),
}
# (replicas, USD/h, p95 ms, error %), worked out above
POINTS = [(1, 0.21, 520.0, 2.0), (2, 0.42, 270.0, 0.7), (3, 0.63, 190.0, 0.6), (4, 0.84, 150.0, 0.4),
          (5, 1.05, 160.0, 0.4), (6, 1.26, 110.0, 0.2)]
FRONTIER = [p for p in POINTS if p[0] != 5]
QOS = {"p95LatencyMs": 200, "errorRatePct": 0.5}
# budget (USD/h) -> (replicas, USD/h, reason, qos_unmet)
CHOICES = {"1.00": (4, 0.84, "CheapestMeetingQoS", 0), "0.70": (3, 0.63, "BudgetCapped", 1),
           "0.10": (1, 0.21, "NoPointWithinBudget", 1)}


def interleaved(start: float) -> list[tuple[float, int, float, float]]:
    """``(unix s, replicas, latency s, error ratio)`` a minute apart from ``start``, group by group.
    Within a group the readings are spread (the outliers first) so that no window is sorted."""
    out, t = [], float(start)
    for n, (lat, err) in GROUPS.items():
        order = list(reversed(range(len(lat))))
        for i in order:
            out.append((t, n, lat[i], err[i]))
            t += STEP_S
    return out


def series(start: float) -> tuple[list[tuple[float, float]], list[tuple[float, float]], list[tuple[float, float]]]:
    """The three series (replicas, p95 latency s, error ratio) as ``[(unix s, value)]``."""
    rows = interleaved(start)
    return [(t, float(n)) for t, n, _, _ in rows], [(t, v) for t, _, v, _ in rows], [(t, e) for t, _, _, e in rows]


def openmetrics(start: float, names: tuple[str, str, str], labels: str) -> str:
    """The three series as OpenMetrics text (gauges, seconds timestamps) for
    ``promtool tsdb create-blocks-from openmetrics``: ``names`` = (replicas, latency, errors)."""
    rows = interleaved(start)
    out = []
    for name, col in zip(names, (1, 2, 3), strict=True):
        out.append(f"# TYPE {name} gauge")
        out += [f"{name}{{{labels}}} {r[col]!r} {int(r[0])}" for r in rows]
    return "\n".join(out) + "\n# EOF\n"
