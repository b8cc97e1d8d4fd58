"""Autoscaling from the spec's ``scaling:`` section (pure: returns data, no I/O; docs/scaling.md).

Nothing here renders anything for a spec without ``scaling:``. With it:

* :func:`place_rules`: per workload and driving signal ``fusebox:scaling_signal_load:ratio{workload,
  signal}``, the sum over the workload's series (its ``model``) of value / safe level, in the
  signal's own group; per workload ``fusebox:scaling_load:ratio{workload}``, the highest of them;
  and, where a workload has ``cost_qos``, the ``CostQoSBudgetCannotMeetQoS`` alert on the
  controller's ``fusebox_costqos_qos_unmet`` (group ``fusebox-scaling``);
* :func:`scaled_objects` (KEDA v2, ``keda.sh/v1alpha1``) or :func:`hpas` (``autoscaling/v2``):
  one per workload, targeting an average of 1 per replica on that record, so the replica count
  they want is ``ceil(load)``: every replica back at or under its safe level; where the workload
  has ``cost_qos``, a second metric, the controller's choice
  (``max(fusebox_costqos_desired_replicas{namespace, policy})``), and the HPA takes the larger;
* :func:`policies`: a ``CostQoSScalingPolicy`` per workload with ``cost_qos``, :func:`crd`, the
  CRD (``fusebox/data/costqos-crd.yaml``, which the controller reads too), and :func:`controller`,
  the controller's objects (``fusebox/data/costqos-controller.yaml`` filled in);
* :func:`outputs`: ``k8s/scaling.yml``, ``k8s/costqos-crd.yml``, ``k8s/costqos-policies.yml`` and
  ``k8s/costqos-controller.yml``.
"""

from __future__ import annotations

import copy
import functools
import math
import string
from importlib import resources
from typing import Any

import yaml

from fusebox import conventions as C
from fusebox.signal_kinds import kind_of, records
from fusebox.signal_kinds.base import Synth, kept_by, label_str, segments
from fusebox.spec import Spec
from fusebox.spec.scaling import Workload
from fusebox.spec.units import format_duration, format_number, humanize

from .yamlout import dump_yaml

__all__ = ["SCALING_FILE", "CRD_FILE", "POLICIES_FILE", "place_rules", "load_expr", "signal_load_expr", "scaled_objects", "hpas",
           "policies", "pod_regex", "crd", "controller", "outputs", "test_groups", "alert_rule", "runbook_facts",
           "EXTERNAL_METRICS", "POLICY_LOOKBACK", "UNMET_FOR_S"]

SCALING_FILE = "k8s/scaling.yml"
CRD_FILE = "k8s/costqos-crd.yml"
POLICIES_FILE = "k8s/costqos-policies.yml"
CONTROLLER_FILE = "k8s/costqos-controller.yml"
# The controller's rounds (`fusebox costqos run --interval`, `--step`), seconds: its own defaults.
CONTROLLER_INTERVAL_S, CONTROLLER_STEP_S = 30, 60
# How a Prometheus adapter exposes the two series as external metrics (its rules rename them:
# a metric name with colons is no name the external metrics API serves; docs/scaling.md).
EXTERNAL_METRICS = {"load": "fusebox_scaling_load_ratio", "desired": C.COSTQOS_METRICS["desired_replicas"]}
POLICY_LOOKBACK = "6h"  # the history a policy's points are built from
UNMET_FOR_S = 300.0  # CostQoSBudgetCannotMeetQoS's for: the controller's choice capped by the budget for 5 minutes
_RATE_WINDOW = "5m"  # the policy's latency and error-ratio queries


def _labels(spec: Spec, w: Workload) -> dict[str, str]:
    return {**spec.kubernetes.labels, "app.kubernetes.io/name": w.name, C.K8S_PART_OF[0]: C.K8S_PART_OF[1],
            "app.kubernetes.io/component": "scaling"}


def _meta(spec: Spec, w: Workload) -> dict[str, Any]:
    return {"name": w.name, "namespace": w.namespace, "labels": _labels(spec, w)}


def _target(w: Workload) -> dict[str, str]:
    return {"apiVersion": "apps/v1", "kind": w.target_kind, "name": w.target_name}


# ------------------------------------------------------------------------------ records
def signal_load_expr(spec: Spec, w: Workload, name: str) -> str:
    """The workload's load on one driving signal: over the series of the workload's model, the sum
    of value / set point, one value per ``by`` group (the highest where the kind keeps more apart,
    as the alignment histogram's ``source``). A negative value (a shrinking KV pool's deriv) counts
    0: one replica freeing blocks does not cancel another's growth; NaN is left out (``>= 0``)."""
    sig = spec.signal(name)
    d = next(x for x in w.signals if x.name == name)
    value = f'{records(sig)["value"]}{{{C.LABEL["model"]}="{w.model}"}}'
    return f"sum(max by ({', '.join(sig.by)}) (clamp_min({value}, 0) >= 0)) / {format_number(d.set_point)}"


def load_expr(w: Workload) -> str:
    """The workload's load: the highest of its driving signals' loads."""
    wl = C.SCALING_LABELS["workload"]
    return f'max by ({wl}) ({C.SCALING_SIGNAL_LOAD}{{{wl}="{w.name}"}})'


def alert_rule(spec: Spec) -> dict[str, Any]:
    """``CostQoSBudgetCannotMeetQoS``: a policy whose budget-capped point was chosen for 5 minutes."""
    return {
        "alert": C.COSTQOS_ALERT,
        "expr": f"max by (namespace, policy) ({C.COSTQOS_METRICS['qos_unmet']}) == 1",
        "for": format_duration(UNMET_FOR_S),
        "labels": {**spec.labels, C.LABEL["marker"]: spec.name, C.LABEL["severity"]: "warning"},
        "annotations": {
            "summary": "CostQoSScalingPolicy {{ $labels.namespace }}/{{ $labels.policy }}: no replica count within the "
                       "budget meets the QoS",
            "description": "For 5 minutes no point of the policy's frontier within its costBudget has met its "
                           "qosConstraints (P95 latency, error rate): the controller chose the budget-capped count. "
                           "Raise the budget, relax the constraints, or make each replica cheaper or faster.",
            "runbook_url": spec.runbook_url(C.COSTQOS_ALERT),
        },
    }


def runbook_facts(spec: Spec) -> dict[str, dict[str, Any]]:
    """alert name -> what ``runbook_self.md.j2`` renders: the CostQoS alert's runbook, where a
    workload has ``cost_qos`` (else {})."""
    if spec.scaling is None or not any(w.cost_qos for w in spec.scaling.workloads):
        return {}
    rule = alert_rule(spec)
    pols = ", ".join(f"`{w.namespace}/{w.name}`" for w in spec.scaling.workloads if w.cost_qos)
    return {C.COSTQOS_ALERT: {
        "description": rule["annotations"]["description"] + f" Policies of this spec: {pols}.",
        "means": "the CostQoS controller found no replica count whose cost fits the policy's costBudget and whose "
                 "P95 latency and error rate meet its qosConstraints, and chose the budget-capped point "
                 "(condition BudgetCapped on the policy)",
        "severity": rule["labels"][C.LABEL["severity"]], "route": f"the people (`{spec.human_receiver.get('name', 'oncall')}`), never the fuse",
        "rules": [{"expr": rule["expr"], "for": rule["for"]}],
        "diagnosis": [
            "The policy's frontier and choice: `kubectl get cqsp -n <namespace> <policy> -o yaml` (status.frontier, "
            "status.choice, status.conditions).",
            f"The controller's choice per policy: `{C.COSTQOS_METRICS['desired_replicas']}`; the autoscaler's own load: "
            f"`{C.SCALING_LOAD}` (ceil of it is the replica count the safe levels ask for).",
            "Which constraint fails: the policy's spec.metrics queries (P95 latency, error ratio) over its lookback.",
        ],
        "sop": [
            "Decide with the service owner: raise the policy's costBudget (scaling.workloads[].cost_qos.cost_budget in "
            "the spec, then `fusebox generate`), or relax p95_latency / error_rate.",
            "Make each replica go further: a cheaper or faster GPU (price_per_replica_hour), an fp8 KV cache, a smaller "
            "max_model_len, image resolution capped at the gateway.",
            "Until then the workload runs at the budget-capped count; the fuse and the shedders still guard its engines.",
        ],
    }}


def _home(groups: list[dict[str, Any]], record: str) -> dict[str, Any] | None:
    return next((g for g in groups for r in g["rules"] if r.get("record") == record), None)


def place_rules(spec: Spec, groups: list[dict[str, Any]], slow: str) -> None:
    """Add the scaling rules to ``groups`` (the rule groups as rendered, before their shaping for
    the rule engine), in place; nothing without ``scaling``.

    Each driving signal's load record goes into the group that records the signal's value, after
    it: rules in a group run in order, so the load is this evaluation's value, and the value is
    computed once (a KV deriv, a quantile over every bucket). A workload's load record reads them:
    it goes into their one group where they share one; else into the one of them that runs at
    ``global.slow_evaluation_interval`` (a quantile's or a filter-first gauge's panel records),
    which may read records of groups at the evaluation interval (their value is at most one of
    those intervals old); else into ``fusebox-scaling``, at the slow interval for the same reason.
    ``fusebox-scaling`` also holds the ``CostQoSBudgetCannotMeetQoS`` alert. A driving signal the
    rules leave out (every tier disabled and nothing publishes its source) adds no load."""
    if spec.scaling is None or not spec.scaling.workloads:
        return
    own: list[dict[str, Any]] = []
    for w in spec.scaling.workloads:
        homes: list[dict[str, Any]] = []
        for d in w.signals:
            home = _home(groups, records(spec.signal(d.name))["value"])
            if home is None:
                continue
            home["rules"].append({"record": C.SCALING_SIGNAL_LOAD, "expr": signal_load_expr(spec, w, d.name),
                                  "labels": {C.SCALING_LABELS["workload"]: w.name, C.SCALING_LABELS["signal"]: d.name}})
            if all(h is not home for h in homes):
                homes.append(home)
        final = {"record": C.SCALING_LOAD, "expr": load_expr(w)}
        slow_homes = [h for h in homes if h.get("interval") == slow]
        if len(homes) == 1:
            homes[0]["rules"].append(final)
        elif slow_homes:
            slow_homes[0]["rules"].append(final)
        elif homes:
            own.append(final)
    if any(w.cost_qos for w in spec.scaling.workloads):
        own.append(alert_rule(spec))
    if own:
        groups.append({"name": C.SCALING_GROUP, "interval": slow, "rules": own})


# ---------------------------------------------------------------------- generated tests
# Two replicas of the workload's model at 1.11 times a driving signal's safe level: the load is
# 2 x 1.11 = 2.22 (three replicas wanted). With the trip threshold as the set point instead the
# load would be under 2 (KV growth: 2 x 10.212 / 14.7 = 1.39), so the case fails on that mistake.
OVER_SAFE = 1.11
# A model the workload does not serve: its series (at 5 x the safe level) must add nothing.
_OTHER_MODEL = "other-model"
# Labels a workload's replicas share: two replicas differ in the others of a signal's ``by``.
_SHARED = ("namespace", C.LABEL["cluster"])


def _synth(spec: Spec, sig: Any, w: Workload, engine: str, model: str, replica: int = 0) -> Synth:
    """The synthetic input of one replica (``engine``) of ``model``. Replica ``replica`` > 0 differs
    from replica 0 in the labels of the signal's own ``by`` (other than ``model``) where ``engine``
    is none of them: the value record aggregates by those labels, and two replicas alike in all of
    them would be one series (the load half the case's). A replica's own labels (``pod``,
    ``instance``) differ, not the ones replicas share (``namespace``, ``cluster``), unless those
    are all the ``by`` has; a label the source's selector fixes stays."""
    base = Synth.of(sig, spec)
    labels = {**base.labels, C.LABEL["engine"]: engine, C.LABEL["model"]: model}
    fixed = spec.selector_for(sig.source.backend)
    apart = [label for label in kept_by(sig) if label != C.LABEL["model"] and label not in fixed]
    if replica and apart and C.LABEL["engine"] not in apart:
        own = [label for label in apart if label not in _SHARED] or apart[:1]
        labels.update({label: f"{labels[label]}-{replica}" for label in own})
    return Synth(sig, spec, base.interval, labels)


def test_groups(spec: Spec) -> list[tuple[str, dict[str, Any]]]:
    """promtool test groups: per workload and driving signal (its kind's synthetic series, the
    other drivers silent), the load at 1.11 x the safe level on two replicas (2.22), the midpoint
    between safe level and trip on one (over 1), another model's series counting nothing; and the
    CostQoS alert's ``for`` boundary. [] without ``scaling``."""
    if spec.scaling is None:
        return []
    interval = spec.test_interval_s
    out: list[tuple[str, dict[str, Any]]] = []
    wl = C.SCALING_LABELS["workload"]
    for w in spec.scaling.workloads:
        for d in w.signals:
            sig = spec.signal(d.name)
            kind = kind_of(sig)
            trip = min((t.threshold for t in sig.tiers if t.fuse), default=None)
            if not kind.testable(sig) or not sig.tiers:
                continue
            window = max(kind.window(sig), interval)
            # the workload's load may be recorded at the slow interval (place_rules): one of those after the window fills
            at = window + kind.first_true(sig, interval) + 2 * interval + spec.slow_evaluation_interval_s
            n = int(at / interval) + 3
            cases = []
            series: list[Any] = []
            over = d.set_point * OVER_SAFE
            two = [_synth(spec, sig, w, f"engine-{i}", w.model, i) for i in range(2)]
            for syn in two:
                series += kind.series(syn, [(n, over)])
            series += kind.series(_synth(spec, sig, w, "engine-9", _OTHER_MODEL), [(n, d.set_point * 5)])
            load = sum(kind.exact(syn, over) for syn in two) / d.set_point
            sel = f'{C.SCALING_LOAD}{{{wl}="{w.name}"}}'
            cases = [_replicas_case(sel, w, at, load)]
            if all(kind.exact(syn, over) == over for syn in two):  # the value itself where the rules compute it exactly
                cases.insert(0, {"expr": sel, "eval_time": format_duration(at), "exp_samples": [{"labels": sel, "value": load}]})
            out.append((f"Scaling {w.name} on {d.name}: two replicas at {format_number(OVER_SAFE)} x its safe level "
                        f"{d.set_point_text} make load {format_number(round(load, 6))}, {math.ceil(load)} replicas; "
                        "another model's series count nothing",
                        {"interval": format_duration(interval), "input_series": series, "alert_rule_test": [],
                         "promql_expr_test": cases}))
            if trip is None:
                continue
            mid = (d.set_point + trip) / 2
            one = _synth(spec, sig, w, "engine-0", w.model)
            load1 = kind.exact(one, mid) / d.set_point
            out.append((f"Scaling {w.name} on {d.name}: one replica midway between the safe level {d.set_point_text} and "
                        f"the fuse's {humanize(trip, sig.unit)} reads load {format_number(round(load1, 6))}, "
                        f"{math.ceil(load1)} replicas: the scaler acts before the fuse (the trip threshold as set point "
                        f"would read {format_number(round(kind.exact(one, mid) / trip, 6))}, {math.ceil(kind.exact(one, mid) / trip)} replica)",
                        {"interval": format_duration(interval), "input_series": kind.series(one, [(n, mid)]),
                         "alert_rule_test": [], "promql_expr_test": [_replicas_case(sel, w, at, load1)]}))
    out += _unmet_tests(spec)
    return out


def _replicas_case(sel: str, w: Workload, at: float, load: float) -> dict[str, Any]:
    """The replica count an AverageValue target of 1 asks for, ceil(load): an integer, exact on
    promtool and on vmalert-tool alike (VictoriaMetrics keeps 12 significant digits of a value).
    Aggregated by ``workload``: MetricsQL's ceil() keeps the metric name, PromQL's drops it."""
    wl = C.SCALING_LABELS["workload"]
    return {"expr": f"max by ({wl}) (ceil({sel}))", "eval_time": format_duration(at),
            "exp_samples": [{"labels": f'{{{C.SCALING_LABELS["workload"]}="{w.name}"}}', "value": math.ceil(load)}]}


def _unmet_tests(spec: Spec) -> list[tuple[str, dict[str, Any]]]:
    assert spec.scaling is not None
    pols = [w for w in spec.scaling.workloads if w.cost_qos]
    if not pols:
        return []
    w = pols[0]
    slow = spec.slow_evaluation_interval_s  # fusebox-scaling's interval
    base = {"instance": "fusebox-costqos:8080", "job": "fusebox-costqos"}
    n = int((UNMET_FOR_S + 2 * slow) / spec.test_interval_s) + 1
    unmet = {**base, "namespace": w.namespace, "policy": w.name}
    met = {**base, "namespace": w.namespace, "policy": f"{w.name}-met"}
    rule = alert_rule(spec)
    labels = {"namespace": w.namespace, "policy": w.name, **rule["labels"]}
    ann = {k: v.replace("{{ $labels.namespace }}", w.namespace).replace("{{ $labels.policy }}", w.name)
           for k, v in rule["annotations"].items()}
    before = UNMET_FOR_S - slow
    return [(f"{C.COSTQOS_ALERT}: a policy whose budget-capped point is chosen alerts after {format_duration(UNMET_FOR_S)} "
             f"(not at {format_duration(before)}); one that meets its QoS does not", {
                 "interval": format_duration(spec.test_interval_s),
                 "input_series": [{"series": C.COSTQOS_METRICS["qos_unmet"] + label_str(unmet), "values": segments([(n, 1, 0)])},
                                  {"series": C.COSTQOS_METRICS["qos_unmet"] + label_str(met), "values": segments([(n, 0, 0)])}],
                 "alert_rule_test": [
                     {"eval_time": format_duration(before), "alertname": C.COSTQOS_ALERT, "exp_alerts": []},
                     {"eval_time": format_duration(UNMET_FOR_S), "alertname": C.COSTQOS_ALERT,
                      "exp_alerts": [{"exp_labels": labels, "exp_annotations": ann}]}]})]


# ----------------------------------------------------------------------------- scalers
def _load_query(w: Workload) -> str:
    return f'{C.SCALING_LOAD}{{{C.SCALING_LABELS["workload"]}="{w.name}"}}'


def _desired_query(w: Workload) -> str:
    return f'max({C.COSTQOS_METRICS["desired_replicas"]}{{namespace="{w.namespace}",policy="{w.name}"}})'


def _behavior(spec: Spec) -> dict[str, Any]:
    s = spec.scaling
    assert s is not None
    return {"scaleUp": {"stabilizationWindowSeconds": int(s.scale_up_stabilization_s)},
            "scaleDown": {"stabilizationWindowSeconds": int(s.scale_down_stabilization_s)}}


def scaled_objects(spec: Spec) -> list[dict[str, Any]]:
    """One KEDA ScaledObject per workload: a Prometheus trigger on its load (AverageValue 1; an
    empty result is an error, ``ignoreNullValues: "false"``, so a load nothing records never reads as
    idle and scales nothing down), and where it has ``cost_qos`` one on the controller's choice (an
    empty result reads 0 there: no controller, no say)."""
    s = spec.scaling
    if s is None:
        return []
    out = []
    for w in s.workloads:
        triggers = [{"type": "prometheus", "name": "scaling-load", "metricType": "AverageValue",
                     "metadata": {"serverAddress": s.prometheus_address, "query": _load_query(w), "threshold": "1",
                                  "ignoreNullValues": "false"}}]
        if w.cost_qos is not None:
            triggers.append({"type": "prometheus", "name": "costqos-choice", "metricType": "AverageValue",
                             "metadata": {"serverAddress": s.prometheus_address, "query": _desired_query(w), "threshold": "1",
                                          "ignoreNullValues": "true"}})
        out.append({
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": _meta(spec, w),
            "spec": {"scaleTargetRef": _target(w), "pollingInterval": int(s.polling_interval_s),
                     "cooldownPeriod": int(s.cooldown_period_s), "minReplicaCount": w.min_replicas,
                     "maxReplicaCount": w.max_replicas,
                     "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(spec)}},
                     "triggers": triggers},
        })
    return out


def _external(name: str, match: dict[str, str]) -> dict[str, Any]:
    return {"type": "External", "external": {"metric": {"name": name, "selector": {"matchLabels": match}},
                                             "target": {"type": "AverageValue", "averageValue": "1"}}}


def hpas(spec: Spec) -> list[dict[str, Any]]:
    """One autoscaling/v2 HPA per workload, for clusters without KEDA: External metrics of the same
    series (:data:`EXTERNAL_METRICS`, as a Prometheus adapter's rules name them), AverageValue 1."""
    s = spec.scaling
    if s is None:
        return []
    out = []
    for w in s.workloads:
        metrics = [_external(EXTERNAL_METRICS["load"], {C.SCALING_LABELS["workload"]: w.name})]
        if w.cost_qos is not None:
            metrics.append(_external(EXTERNAL_METRICS["desired"], {"namespace": w.namespace, "policy": w.name}))
        out.append({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": _meta(spec, w),
            "spec": {"scaleTargetRef": _target(w), "minReplicas": w.min_replicas, "maxReplicas": w.max_replicas,
                     "metrics": metrics, "behavior": _behavior(spec)},
        })
    return out


# ---------------------------------------------------------------------------- policies
def _replicas_query(w: Workload) -> str:
    """One series: ``max`` over kube-state-metrics' (two during its restart, or one per HA replica;
    the controller takes exactly one series per query)."""
    if w.target_kind == "StatefulSet":
        return f'max(kube_statefulset_replicas{{namespace="{w.namespace}",statefulset="{w.target_name}"}})'
    return f'max(kube_deployment_spec_replicas{{namespace="{w.namespace}",deployment="{w.target_name}"}})'


def pod_regex(w: Workload) -> str:
    """The names of the target's own pods, as a PromQL regex (RE2, fully anchored; a ``.`` of the
    name escaped for the PromQL string): a Deployment's ReplicaSet pods ``NAME-HASH-XXXXX``, a
    StatefulSet's ``NAME-ORDINAL``. ``NAME-.*`` would take in another Deployment's pods whose name
    extends it (``vllm-llava-13b``'s for ``vllm-llava``)."""
    name = w.target_name.replace(".", "\\\\.")
    return f"{name}-[0-9]+" if w.target_kind == "StatefulSet" else f"{name}-[a-z0-9]+-[a-z0-9]{{5}}"


def _policy_metrics(w: Workload) -> dict[str, str]:
    """The policy's PromQL: replicas from kube-state-metrics (one series); P95 end-to-end latency from vLLM's
    histogram of the workload's model; the error ratio from the API server's HTTP counter
    (prometheus-fastapi-instrumentator, status grouped as 5xx) of the target's own pods (:func:`pod_regex`)."""
    model = f'namespace="{w.namespace}",model_name="{w.model}"'
    pods = f'namespace="{w.namespace}",pod=~"{pod_regex(w)}"'
    return {
        "replicas": _replicas_query(w),
        "p95LatencySeconds": (f"histogram_quantile(0.95, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket"
                              f"{{{model}}}[{_RATE_WINDOW}])))"),
        "errorRatio": (f'sum(rate(http_requests_total{{{pods},status="5xx"}}[{_RATE_WINDOW}])) / '
                       f"sum(rate(http_requests_total{{{pods}}}[{_RATE_WINDOW}]))"),
    }


def policies(spec: Spec) -> list[dict[str, Any]]:
    """A CostQoSScalingPolicy per workload with ``cost_qos``, named and namespaced as the workload."""
    if spec.scaling is None:
        return []
    out = []
    for w in spec.scaling.workloads:
        q = w.cost_qos
        if q is None or w.price_per_replica_hour is None:
            continue
        out.append({
            "apiVersion": f"{C.COSTQOS_CRD[0]}/{C.COSTQOS_CRD[1]}", "kind": C.COSTQOS_CRD[2], "metadata": _meta(spec, w),
            "spec": {"targetRef": _target(w), "costBudget": format_number(q.cost_budget),
                     "qosConstraints": {"p95LatencyMs": _num(q.p95_latency_s * 1000), "errorRatePct": _num(q.error_ratio * 100)},
                     "replicas": {"min": w.min_replicas, "max": w.max_replicas},
                     "pricePerReplicaHour": format_number(w.price_per_replica_hour),
                     "metrics": _policy_metrics(w), "lookback": POLICY_LOOKBACK},
        })
    return out


def _num(x: float) -> int | float:
    """A whole number as an int (200, not 200.0), else rounded to 9 digits (0.5)."""
    r = round(x, 9)
    return int(r) if r == int(r) else r


@functools.cache
def crd() -> dict[str, Any]:
    """The CostQoSScalingPolicy CRD, as ``fusebox/data/costqos-crd.yaml`` holds it."""
    text = resources.files("fusebox").joinpath("data", "costqos-crd.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    assert isinstance(doc, dict)
    return doc


def controller(spec: Spec) -> list[dict[str, Any]]:
    """The CostQoS controller's objects (``fusebox/data/costqos-controller.yaml``, its placeholders
    filled: ``kubernetes.namespace`` and ``kubernetes.image``, ``scaling.prometheus_address``, its
    default interval and step), each with ``kubernetes.labels`` beside its own (its own win)."""
    assert spec.scaling is not None
    k = spec.kubernetes
    docs = copy.deepcopy(_controller_docs(k.namespace, k.image, k.pull_policy, spec.scaling.prometheus_address))
    for d in docs:
        d["metadata"]["labels"] = {**k.labels, **d["metadata"]["labels"]}
    return docs


@functools.lru_cache(maxsize=16)
def _controller_docs(namespace: str, image: str, pull_policy: str, prometheus_url: str) -> list[dict[str, Any]]:
    """``fusebox/data/costqos-controller.yaml`` filled in and parsed, once per set of values
    (PyYAML's loader is pure Python; :func:`controller` copies it before adding labels)."""
    text = string.Template(resources.files("fusebox").joinpath("data", "costqos-controller.yaml").read_text(encoding="utf-8"))
    return [d for d in yaml.safe_load_all(text.substitute(
        namespace=namespace, image=image, pull_policy=pull_policy, prometheus_url=prometheus_url,
        interval=str(CONTROLLER_INTERVAL_S), step=str(CONTROLLER_STEP_S))) if d]


def outputs(spec: Spec, header: str) -> dict[str, str]:
    """``{path: text}``: ``k8s/scaling.yml`` (ScaledObjects, or HPAs with ``hpa.enabled``), and with
    any ``cost_qos`` the CRD, the policies and the controller that reconciles them
    (``k8s/costqos-controller.yml``, in ``kubernetes.namespace``); {} without ``scaling``."""
    s = spec.scaling
    if s is None or not s.workloads:
        return {}
    h = f"# {header}\n"
    docs = scaled_objects(spec) if s.keda else hpas(spec)
    out = {SCALING_FILE: h + "".join("---\n" + dump_yaml(d) for d in docs)}
    pols = policies(spec)
    if pols:
        out[CRD_FILE] = h + "---\n" + dump_yaml(crd())
        out[POLICIES_FILE] = h + "".join("---\n" + dump_yaml(p) for p in pols)
        out[CONTROLLER_FILE] = h + "".join("---\n" + dump_yaml(d) for d in controller(spec))
    return out
