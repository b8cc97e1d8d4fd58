"""The COST-QoS frontier and choice (fusebox/costqos/frontier.py, policy.py), against the table
worked out by hand in tests/_costqos_support.py."""

from __future__ import annotations

import math

import pytest
from _costqos_support import CHOICES, FRONTIER, GROUPS, POINTS, PRICE, QOS, series
from hypothesis import given, settings
from hypothesis import strategies as st

from fusebox.costqos.frontier import BUDGET_CAPPED, MET, NOTHING_WITHIN_BUDGET, Constraints, Point, choose, pareto, points_from_samples, quantile
from fusebox.costqos.policy import PolicyError, decide, duration_s, parse_policy


def _points():
    return points_from_samples(*series(1_700_000_000), PRICE)


def _c(budget: float, lo: int = 1, hi: int = 8) -> Constraints:
    return Constraints(QOS["p95LatencyMs"], QOS["errorRatePct"], budget, lo, hi, PRICE)


def test_each_replica_count_is_one_point_the_p95_of_its_latencies_and_the_mean_of_its_error_ratios():
    got = _points()
    assert [p.replicas for p in got] == [p[0] for p in POINTS]
    for p, (n, usd, ms, pct) in zip(got, POINTS, strict=True):
        assert (p.replicas, p.samples) == (n, 21)
        assert p.cost_per_hour == usd
        assert p.p95_latency_ms == pytest.approx(ms, abs=1e-9)
        assert p.error_rate_pct == pytest.approx(pct, abs=1e-9)


def test_the_quantile_is_prometheus_quantile_over_time():
    # rank q * (n - 1), linear between neighbours: 0.95 of 1..5 is 4 + 0.8 * (5 - 4)
    assert quantile(0.95, [5, 1, 4, 2, 3]) == pytest.approx(4.8)
    assert quantile(0.5, [1, 2, 3, 4]) == 2.5
    assert quantile(0.95, [7.0]) == 7.0
    assert math.isnan(quantile(0.95, []))
    # 21 readings: the second largest, exactly
    assert quantile(0.95, GROUPS[4][0]) == 0.15


def test_the_dominated_point_leaves_the_frontier_and_only_it():
    assert [(p.replicas, p.cost_per_hour) for p in pareto(_points())] == [(f[0], f[1]) for f in FRONTIER]


@pytest.mark.parametrize("a,b,dominates", [
    ((1.0, 100.0, 0.5), (2.0, 100.0, 0.5), True),   # cheaper, equal otherwise
    ((1.0, 100.0, 0.5), (1.0, 100.0, 0.5), False),  # equal: neither dominates
    ((1.0, 90.0, 0.6), (2.0, 100.0, 0.5), False),   # worse in errors
    ((2.0, 90.0, 0.4), (1.0, 100.0, 0.5), False),   # dearer
])
def test_a_point_dominates_when_no_worse_in_all_three_and_better_in_one(a, b, dominates):
    assert Point(1, *a).dominates(Point(2, *b)) is dominates


@pytest.mark.parametrize("budget", sorted(CHOICES))
def test_the_choice_for_each_budget_is_the_one_worked_out_by_hand(budget):
    replicas, usd, reason, unmet = CHOICES[budget]
    ch = choose(pareto(_points()), _c(float(budget)))
    assert (ch.replicas, ch.cost_per_hour, ch.reason, int(ch.qos_unmet)) == (replicas, usd, reason, unmet)


def test_the_choice_is_clamped_to_the_replica_bounds():
    front = pareto(_points())
    top = choose(front, _c(1.0, hi=3))  # 4 meets QoS, max is 3
    assert (top.replicas, top.cost_per_hour, top.reason) == (3, 0.63, MET) and "clamped to 3" in top.message
    floor = choose(front, _c(0.10, lo=2))  # nothing within the budget: min, 2
    assert (floor.replicas, floor.cost_per_hour, floor.reason) == (2, 0.42, NOTHING_WITHIN_BUDGET)
    low = choose(front, _c(0.70, lo=4))  # capped at 3, min 4
    assert (low.replicas, low.reason) == (4, BUDGET_CAPPED)


def test_timestamps_missing_a_series_and_counts_under_one_are_left_out():
    reps = [(0.0, 2.0), (60.0, 2.0), (120.0, 0.0), (180.0, 2.4)]
    lat = [(0.0, 0.1), (120.0, 0.3), (180.0, 0.2)]
    err = [(0.0, 0.01), (60.0, 0.5), (120.0, 0.0), (180.0, float("nan"))]
    assert points_from_samples(reps, lat, err, 1.0) == [Point(2, 2.0, 100.0, 1.0, 1)]


def _spec(budget="1.00", **over):
    spec = {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-llava"}, "costBudget": budget,
            "qosConstraints": dict(QOS), "replicas": {"min": 1, "max": 8}, "pricePerReplicaHour": "0.21",
            "metrics": {"replicas": "r", "p95LatencySeconds": "l", "errorRatio": "e"}, "lookback": "6h"}
    spec.update(over)
    return spec


def test_the_status_holds_the_frontier_the_choice_and_three_conditions():
    p = parse_policy("inference", "llava", 3, _spec("0.70"))
    d = decide(p, *series(0), old_conditions=None, now="2026-12-05T10:00:00Z")
    assert d is not None
    s = d.status
    assert s["observedGeneration"] == 3
    assert [(f["replicas"], f["costPerHour"], f["p95LatencyMs"], f["errorRatePct"]) for f in s["frontier"]] == FRONTIER
    assert s["choice"] == {"replicas": 3, "costPerHour": 0.63, "reason": "BudgetCapped"}
    assert {c["type"]: (c["status"], c["reason"]) for c in s["conditions"]} == {
        "QoSMet": ("False", "BudgetCapped"), "BudgetCapped": ("True", "BudgetCapped"), "MetricsAvailable": ("True", "Read")}
    # a later round with the same outcome keeps each condition's transition time
    again = decide(p, *series(0), old_conditions=s["conditions"], now="2026-12-05T11:00:00Z")
    assert again is not None and {c["lastTransitionTime"] for c in again.status["conditions"]} == {"2026-12-05T10:00:00Z"}


def test_no_shared_sample_is_no_decision():
    p = parse_policy("inference", "llava", 1, _spec())
    assert decide(p, [], [], [], None, "2026-12-05T10:00:00Z") is None


@pytest.mark.parametrize("text,seconds", [("6h", 21600.0), ("1h30m", 5400.0), ("90s", 90.0), ("500ms", 0.5)])
def test_lookback_is_a_prometheus_duration(text, seconds):
    assert duration_s(text) == seconds


@pytest.mark.parametrize("over,words", [
    ({"lookback": "6 hours"}, "not a Prometheus duration"),
    ({"costBudget": "cheap"}, "spec.costBudget 'cheap' is not a number"),
    ({"replicas": {"min": 5, "max": 2}}, "min 5 > max 2"),
    ({"metrics": {"replicas": "r"}}, "spec lacks p95LatencySeconds"),
])
def test_an_unusable_spec_names_the_field_and_the_fix(over, words):
    with pytest.raises(PolicyError, match=words) as e:
        parse_policy("inference", "llava", 1, _spec(**over))
    assert " -- " in str(e.value)


_point = st.builds(lambda r, lat, err: Point(r, round(r * PRICE, 8), lat, err),
                   st.integers(1, 12), st.floats(1, 2000, allow_nan=False), st.floats(0, 10, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(st.lists(_point, min_size=1, max_size=12, unique_by=lambda p: p.replicas), st.floats(0, 3), st.integers(1, 4),
       st.integers(4, 12))
def test_the_frontier_and_choice_hold_their_definitions_on_any_points(points, budget, lo, hi):
    front = pareto(points)
    # nothing on the frontier is dominated, everything off it is
    assert all(not q.dominates(p) for p in front for q in points)
    assert all(any(q.dominates(p) for q in points) for p in points if p not in front)
    c = _c(budget, lo, hi)
    ch = choose(front, c)
    assert lo <= ch.replicas <= hi and ch.cost_per_hour == round(ch.replicas * PRICE, 8)
    meeting = [p for p in points if p.cost_per_hour <= budget and c.meets_qos(p)]
    assert ch.qos_met == bool(meeting)
    if meeting:  # the cheapest of ALL points meeting both within the budget is on the frontier, and chosen
        assert ch.point is not None and ch.point.cost_per_hour == min(p.cost_per_hour for p in meeting)
    elif any(p.cost_per_hour <= budget for p in front):
        assert ch.reason == BUDGET_CAPPED and ch.point == max((p for p in front if p.cost_per_hour <= budget), key=lambda p: p.replicas)
    else:
        assert ch.reason == NOTHING_WITHIN_BUDGET and ch.replicas == lo
