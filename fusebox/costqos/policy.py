"""A CostQoSScalingPolicy's spec as read from the API server, and the status it gets: pure.

:func:`parse_policy` turns the object's ``spec`` (a dict, already checked for shape by the CRD's
schema, ``fusebox/data/costqos-crd.yaml``) into a :class:`Policy`; :func:`decide` turns the three
series into the status (frontier, choice, conditions) and :func:`unavailable` into the status of a
round whose metrics could not be read (conditions only: the last choice stays).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .frontier import MET, Choice, Constraints, Point, Sample, choose, pareto, points_from_samples

__all__ = ["Policy", "PolicyError", "parse_policy", "decide", "unavailable", "conditions", "Decision", "duration_s",
           "QOS_MET", "BUDGET_CAPPED_TYPE", "METRICS_AVAILABLE"]

QOS_MET, BUDGET_CAPPED_TYPE, METRICS_AVAILABLE = "QoSMet", "BudgetCapped", "MetricsAvailable"
DEFAULT_LOOKBACK = "6h"
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


class PolicyError(ValueError):
    """A spec the controller cannot use (what is wrong -- how to fix it)."""


@dataclass(frozen=True)
class Policy:
    """A policy: its namespace and name, generation, constraints, the three PromQL expressions
    and the lookback in seconds."""
    namespace: str
    name: str
    generation: int
    constraints: Constraints
    replicas_query: str
    latency_query: str
    error_query: str
    lookback_s: float


@dataclass(frozen=True)
class Decision:
    """One round's result: the status fields to write (the frontier among them) and the choice
    to publish."""
    status: dict[str, Any]
    choice: Choice


def duration_s(text: str) -> float:
    """A Prometheus duration (``6h``, ``1h30m``, ``90s``) in seconds; PolicyError otherwise."""
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise PolicyError(f"lookback {text!r} is not a Prometheus duration -- write it as 6h, 90m or 1h30m")
    return float(sum(int(n) * _UNITS[u] for n, u in parts))


def _money(spec: Mapping[str, Any], key: str) -> float:
    v = spec.get(key)
    try:
        out = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise PolicyError(f"spec.{key} {v!r} is not a number -- write USD per hour as a decimal string, e.g. \"0.42\"") from None
    if out < 0:
        raise PolicyError(f"spec.{key} {v!r} is negative -- write USD per hour, >= 0")
    return out


def parse_policy(namespace: str, name: str, generation: int, spec: Mapping[str, Any]) -> Policy:
    """The :class:`Policy` of one object's ``spec``; PolicyError naming the field when one is
    missing or unusable (the CRD's schema refuses most of these before they get here)."""
    try:
        qos, reps, metrics = spec["qosConstraints"], spec["replicas"], spec["metrics"]
        c = Constraints(float(qos["p95LatencyMs"]), float(qos["errorRatePct"]), _money(spec, "costBudget"),
                        int(reps["min"]), int(reps["max"]), _money(spec, "pricePerReplicaHour"))
        queries = (str(metrics["replicas"]), str(metrics["p95LatencySeconds"]), str(metrics["errorRatio"]))
    except KeyError as e:
        raise PolicyError(f"spec lacks {e.args[0]} -- see the CRD (kubectl explain costqosscalingpolicy.spec)") from None
    if c.min_replicas > c.max_replicas:
        raise PolicyError(f"spec.replicas.min {c.min_replicas} > max {c.max_replicas} -- make min <= max")
    return Policy(namespace, name, generation, c, *queries, duration_s(str(spec.get("lookback") or DEFAULT_LOOKBACK)))


def _condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message}


def conditions(old: Sequence[Mapping[str, Any]] | None, new: Sequence[dict[str, str]], now: str) -> list[dict[str, str]]:
    """``new`` merged over ``old`` by type: ``lastTransitionTime`` kept where the status did not
    change, ``now`` (RFC 3339) where it did; old types not in ``new`` kept as they are."""
    before = {c.get("type"): c for c in old or ()}
    out = {}
    for c in new:
        prev = before.get(c["type"])
        same = prev is not None and prev.get("status") == c["status"] and prev.get("lastTransitionTime")
        out[c["type"]] = {**c, "lastTransitionTime": str(prev["lastTransitionTime"]) if same and prev else now}
    for kind, prev in before.items():
        if kind not in out and kind:
            out[str(kind)] = dict(prev)
    order = (QOS_MET, BUDGET_CAPPED_TYPE, METRICS_AVAILABLE)
    return sorted(out.values(), key=lambda c: order.index(c["type"]) if c["type"] in order else len(order))


def _point(p: Point) -> dict[str, Any]:
    return {"replicas": p.replicas, "costPerHour": p.cost_per_hour, "p95LatencyMs": round(p.p95_latency_ms, 6),
            "errorRatePct": round(p.error_rate_pct, 6)}


def decide(policy: Policy, replicas: Sequence[Sample], latency_s: Sequence[Sample], error_ratio: Sequence[Sample],
           old_conditions: Sequence[Mapping[str, Any]] | None, now: str) -> Decision | None:
    """The status of a round whose three series were read; None when they share no timestamp
    with a replica count >= 1 (nothing to build a point from: :func:`unavailable` then)."""
    points = points_from_samples(replicas, latency_s, error_ratio, policy.constraints.price_per_replica_hour)
    if not points:
        return None
    front = pareto(points)
    ch = choose(front, policy.constraints)
    capped = not ch.qos_met
    conds = [_condition(QOS_MET, ch.qos_met, MET if ch.qos_met else ch.reason, ch.message),
             _condition(BUDGET_CAPPED_TYPE, capped, ch.reason if capped else "WithinBudget", ch.message),
             _condition(METRICS_AVAILABLE, True, "Read", f"{sum(p.samples for p in points)} samples over "
                        f"{len(points)} replica counts in the last {policy.lookback_s:g} s")]
    status = {"observedGeneration": policy.generation, "frontier": [_point(p) for p in front],
              "choice": {"replicas": ch.replicas, "costPerHour": ch.cost_per_hour, "reason": ch.reason},
              "conditions": conditions(old_conditions, conds, now)}
    return Decision(status, ch)


def unavailable(policy: Policy, reason: str, message: str, old_conditions: Sequence[Mapping[str, Any]] | None,
                now: str) -> dict[str, Any]:
    """The status fields of a round whose metrics could not be read: MetricsAvailable False with
    ``reason``; frontier and choice are left as they were (not in the patch)."""
    return {"observedGeneration": policy.generation,
            "conditions": conditions(old_conditions, [_condition(METRICS_AVAILABLE, False, reason, message)], now)}

