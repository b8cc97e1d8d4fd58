"""The spec's ``scaling:`` section: the engine workloads ``fusebox generate`` writes autoscaling for,
from the same safe levels as the alerts (docs/scaling.md).

Shape::

    scaling:
      prometheus_address: http://prometheus-operated.monitoring.svc:9090   # what KEDA's trigger queries
      keda: {enabled: true, polling_interval: 15s, cooldown_period: 300s}
      hpa: {enabled: false, sync_period: 15s, scale_up_stabilization: 0s, scale_down_stabilization: 300s}
      workloads:
        - name: llava-7b                     # a DNS-1123 label: the `workload` label of its records
          target: {kind: Deployment, name: vllm-llava, namespace: inference}
          model: llava-hf/llava-1.5-7b-hf    # the model label its signals' series are scoped by
          replicas: {min: 1, max: 8}
          price_per_replica_hour: 0.21       # USD
          pod_start: 90s                     # image pull + model load until Ready
          signals: [kv_cache_growth_rate]    # the signals that drive it; set point: each one's safe level
          cost_qos: {cost_budget: 0.42, p95_latency: 200ms, error_rate: 0.5%}   # optional: a policy

The set point of a driving signal is its safe level, the threshold of its ``warning`` tier: the
scaler adds replicas while the fast path (the shedders) and the fuse still wait
(:func:`order_problems` is the check that it does). Every problem is a
:class:`~fusebox.spec.errors.Problem` at its line (exit 2 in the CLI).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictBool, StrictStr

from fusebox import conventions as C

from . import units
from .k8snames import DNS_LABEL, DNS_SUBDOMAIN

if TYPE_CHECKING:  # the normalised spec holds a Scaling: for the signatures only
    from .normalised import Signal, Spec

__all__ = ["RawScaling", "Scaling", "Workload", "CostQoS", "DrivingSignal", "normalise_scaling", "order_problems",
           "TARGET_KINDS", "DEFAULT_PROMETHEUS"]

Err = Callable[..., None]
_Value = Annotated[str | int | float, BeforeValidator(units.reject_bool)]
_Int = Annotated[int, BeforeValidator(units.reject_bool)]
# kube-prometheus-stack's Prometheus, as the Prometheus Operator names its governing Service.
DEFAULT_PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
# What a ScaledObject's scaleTargetRef and an HPA's scaleTargetRef may name here (apps/v1, /scale).
TARGET_KINDS = ("Deployment", "StatefulSet")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RawKeda(_Strict):
    """``scaling.keda``: ScaledObjects (KEDA v2). Defaults: KEDA's own (30 s polling, 300 s cooldown)."""

    enabled: StrictBool = True
    polling_interval: _Value = "30s"
    cooldown_period: _Value = "300s"


class RawHpa(_Strict):
    """``scaling.hpa``: plain autoscaling/v2 HPAs where KEDA is not installed (``enabled``), and the
    HPA controller's timing either way (KEDA scales through an HPA too). Defaults: Kubernetes' own
    (kube-controller-manager --horizontal-pod-autoscaler-sync-period 15s; behavior: scale up at
    once, scale down over a 300 s window; kube-controller-manager --horizontal-pod-autoscaler-tolerance
    0.1: the controller leaves the count alone while the load is within 10 % of the target)."""

    enabled: StrictBool = False
    sync_period: _Value = "15s"
    scale_up_stabilization: _Value = "0s"
    scale_down_stabilization: _Value = "300s"
    tolerance: _Value = "10%"


class RawTarget(_Strict):
    kind: Literal["Deployment", "StatefulSet"] = "Deployment"
    name: StrictStr
    namespace: StrictStr


class RawReplicas(_Strict):
    min: _Int = 1
    max: _Int


class RawCostQoS(_Strict):
    """The seed's COST-QoS constraints: a USD/hour ceiling, the P95 latency and error rate to meet."""

    cost_budget: _Value
    p95_latency: _Value
    error_rate: _Value


class RawWorkload(_Strict):
    name: StrictStr
    target: RawTarget
    model: StrictStr
    replicas: RawReplicas
    price_per_replica_hour: _Value | None = None
    pod_start: _Value
    signals: list[StrictStr]
    cost_qos: RawCostQoS | None = None


class RawScaling(_Strict):
    """``scaling``: the engine workloads to scale from the spec's safe levels (docs/scaling.md)."""

    prometheus_address: StrictStr = DEFAULT_PROMETHEUS
    keda: RawKeda = RawKeda()
    hpa: RawHpa = RawHpa()
    workloads: list[RawWorkload] = []


@dataclass(frozen=True)
class DrivingSignal:
    """A signal driving a workload: its name, unit and set point (its safe level, base unit)."""

    name: str
    unit: str
    set_point: float
    set_point_text: str  # as the spec wrote it
    set_point_key: str  # the spec key it comes from: signals.NAME.tiers.warning.threshold


@dataclass(frozen=True)
class CostQoS:
    """``cost_qos``, normalised: USD/hour, seconds, a ratio 0-1."""

    cost_budget: float
    p95_latency_s: float
    error_ratio: float


@dataclass(frozen=True)
class Workload:
    """One scaled workload, normalised (durations in seconds, prices in USD per hour)."""

    name: str
    target_kind: str
    target_name: str
    namespace: str
    model: str
    min_replicas: int
    max_replicas: int
    price_per_replica_hour: float | None
    pod_start_s: float
    signals: tuple[DrivingSignal, ...]
    cost_qos: CostQoS | None = None
    path: tuple = ()


@dataclass(frozen=True)
class Scaling:
    """``scaling``, normalised: seconds; which objects scale (``keda`` ScaledObjects, else HPAs)."""

    prometheus_address: str
    keda: bool
    polling_interval_s: float
    cooldown_period_s: float
    sync_period_s: float
    scale_up_stabilization_s: float
    scale_down_stabilization_s: float
    workloads: tuple[Workload, ...]
    tolerance: float = 0.1  # the HPA controller's: it scales out once the load passes (1 + tolerance) x target


def _key(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _durations(raw: RawScaling, duration: Callable[[object, tuple], float], err: Err) -> dict[str, float]:
    out = {}
    for section, key, positive in (("keda", "polling_interval", True), ("keda", "cooldown_period", False),
                                   ("hpa", "sync_period", True), ("hpa", "scale_up_stabilization", False),
                                   ("hpa", "scale_down_stabilization", False)):
        path = ("scaling", section, key)
        v = duration(getattr(getattr(raw, section), key), path)
        if positive and not v > 0:
            err(path, f"scaling.{section}.{key} must be a positive duration", "e.g. '15s'")
        elif v != int(v):
            err(path, f"scaling.{section}.{key} {format(v, 'g')} s is not whole seconds", "KEDA and the HPA take whole seconds, e.g. '30s'")
        out[key] = v
    return out


def _signal(wpath: tuple, i: int, name: str, signals: dict[str, Signal], written: set[str], err: Err) -> DrivingSignal | None:
    """The driving signal ``name`` or None (reported, unless the signal's own problem is)."""
    path = wpath + ("signals", i)
    sig = signals.get(name)
    if sig is None:
        if name not in written:
            err(path, f"unknown signal {name!r}", f"use one of: {', '.join(signals) or '(the spec has no signals)'}")
        return None
    if sig.direction != "above":
        err(path, f"signal {name!r} alerts below its threshold (direction: below): its value falls as load rises, so "
            "value / safe level is no load", "drive the workload with a signal that grows with load (KV growth, a latency)")
        return None
    if C.LABEL["model"] not in sig.by:
        err(path, f"signal {name!r} keeps no {C.LABEL['model']!r} label (by: {list(sig.by)}): its series cannot be "
            "scoped to the workload's model", "add model to the signal's by, or drive the workload with a per-engine signal "
            "(a GPU's memory is a poor scaling signal anyway: vLLM preallocates about 90 % of it)")
        return None
    warning = sig.safe_level
    if warning is None:
        err(path, f"signal {name!r} has no warning tier: no safe level to scale at", "add a warning tier (its safe level) to the signal")
        return None
    if not warning.threshold > 0:
        err(path, f"signal {name!r}'s safe level {warning.threshold_text} is not positive: value / safe level is no load",
            "give the signal a positive warning threshold")
        return None
    return DrivingSignal(name, sig.unit, warning.threshold, warning.threshold_text, _key(warning.path + ("threshold",)))


def _cost_qos(raw: RawCostQoS, path: tuple, err: Err) -> CostQoS | None:
    vals: dict[str, float] = {}
    for key, unit, example in (("cost_budget", "count", "0.42 (USD per hour)"), ("p95_latency", "seconds", "'200ms'"),
                               ("error_rate", "ratio", "'0.5%'")):
        try:
            vals[key] = units.parse_quantity(getattr(raw, key), unit)
        except ValueError as e:
            err(path + (key,), f"{key}: {getattr(e, 'what', str(e))}", f"e.g. {example}")
            continue
        if not vals[key] > 0 or (unit == "ratio" and vals[key] >= 1):
            err(path + (key,), f"{key} {getattr(raw, key)!r} is out of range", f"a positive value, e.g. {example}"
                + (", under 100%" if unit == "ratio" else ""))
            del vals[key]
    if len(vals) < 3:
        return None
    return CostQoS(vals["cost_budget"], vals["p95_latency"], vals["error_rate"])


def _workload(i: int, raw: RawWorkload, signals: dict[str, Signal], written: set[str], keda: bool,
              duration: Callable[[object, tuple], float], err: Err) -> Workload | None:
    path = ("scaling", "workloads", i)
    ok = True
    if not DNS_LABEL.match(raw.name):
        err(path + ("name",), f"workload name {raw.name!r} is not a DNS-1123 label", "lower-case letters, digits and '-', "
            "at most 63, alphanumeric at both ends (it names the ScaledObject and the `workload` label)")
        ok = False
    if not DNS_LABEL.match(raw.target.namespace):
        err(path + ("target", "namespace"), f"namespace {raw.target.namespace!r} is not a DNS-1123 label", "e.g. inference")
        ok = False
    if not DNS_SUBDOMAIN.match(raw.target.name):
        err(path + ("target", "name"), f"{raw.target.kind} name {raw.target.name!r} is not a DNS-1123 subdomain", "e.g. vllm-llava")
        ok = False
    if not raw.model.strip() or '"' in raw.model or "\\" in raw.model:
        err(path + ("model",), f"model {raw.model!r} is empty or holds a quote or backslash", "the served model name, "
            "as the engines' model_name label carries it, e.g. llava-hf/llava-1.5-7b-hf")
        ok = False
    lo, hi = raw.replicas.min, raw.replicas.max
    if lo < 1:
        err(path + ("replicas", "min"), f"replicas.min {lo} is under 1: "
            + ("at 0 replicas no engine of the workload exports its driving signals, so its load has no series, and "
               "KEDA's trigger (ignoreNullValues 'false') reports an error instead of activating it: it never scales up"
               if keda else "an autoscaling/v2 HPA keeps at least 1 replica"), "use min: 1")
        ok = False
    if hi < max(lo, 1):
        err(path + ("replicas", "max"), f"replicas.max {hi} is under replicas.min {lo} (or under 1)", "give max >= min, e.g. {min: 1, max: 8}")
        ok = False
    start = duration(raw.pod_start, path + ("pod_start",))
    if not start > 0:
        err(path + ("pod_start",), "pod_start must be a positive duration", "how long a new engine pod takes to Ready "
            "(image pull + model load), e.g. '90s'")
        ok = False
    price = None
    if raw.price_per_replica_hour is not None:
        try:
            price = units.parse_quantity(raw.price_per_replica_hour, "count")
        except ValueError:
            err(path + ("price_per_replica_hour",), f"price_per_replica_hour {str(raw.price_per_replica_hour).strip()!r} "
                "is not a plain number", "a price in USD per hour, e.g. 0.21")
            ok = False
        else:
            if not price > 0:
                err(path + ("price_per_replica_hour",), f"price_per_replica_hour {price:g} is not positive", "e.g. 0.21 (USD per hour)")
                ok = False
    if not raw.signals:
        err(path + ("signals",), f"workload {raw.name!r} names no signal to scale on", "list signals of the spec, e.g. [kv_cache_growth_rate]")
        ok = False
    driving = [_signal(path, j, name, signals, written, err) for j, name in enumerate(raw.signals)]
    for j, name in enumerate(raw.signals):
        if name in raw.signals[:j]:
            err(path + ("signals", j), f"signal {name!r} is listed twice", "list each driving signal once")
            ok = False
    qos = None
    if raw.cost_qos is not None:
        qos = _cost_qos(raw.cost_qos, path + ("cost_qos",), err)
        ok = ok and qos is not None
        if raw.price_per_replica_hour is None:
            err(path + ("cost_qos",), "cost_qos needs price_per_replica_hour: the policy prices each replica count",
                "add price_per_replica_hour (USD), e.g. 0.21", key=True)
            ok = False
        elif qos is not None and price is not None and qos.cost_budget < lo * price:
            err(path + ("cost_qos", "cost_budget"), f"cost_budget {qos.cost_budget:g} USD/h does not pay for replicas.min "
                f"{lo} x {price:g} USD/h = {lo * price:g} USD/h", "raise the budget or lower replicas.min")
            ok = False
    if not ok or any(d is None for d in driving):
        return None
    return Workload(name=raw.name, target_kind=raw.target.kind, target_name=raw.target.name, namespace=raw.target.namespace,
                    model=raw.model, min_replicas=lo, max_replicas=hi, price_per_replica_hour=price, pod_start_s=start,
                    signals=tuple(d for d in driving if d is not None), cost_qos=qos, path=path)


def normalise_scaling(raw: RawScaling | None, signals: dict[str, Signal], written: set[str],
                      duration: Callable[[object, tuple], float], err: Err) -> Scaling | None:
    """``raw`` checked against the spec's ``signals`` (name -> normalised Signal); ``written`` names
    every signal the spec writes (one that failed to load adds no problem here). None without a
    ``scaling:`` section.

    Reports through ``err(path, what, fix)``: an unknown signal, one that alerts below its threshold,
    keeps no ``model`` label or has no warning tier (no safe level); a workload or namespace name
    Kubernetes refuses, two workloads of one name or of one target, ``replicas.min`` under 1 (an HPA
    keeps 1; KEDA would never activate a workload from 0: its load comes from the workload's own
    engines), min over max, a non-positive ``pod_start`` or
    price, a ``cost_qos`` without a price or whose budget does not pay for ``replicas.min``; KEDA and
    the HPA both enabled, or neither; a ``prometheus_address`` that is no http(s) URL."""
    if raw is None:
        return None
    d = _durations(raw, duration, err)
    if raw.keda.enabled == raw.hpa.enabled:
        err(("scaling", "keda" if raw.keda.enabled else "hpa", "enabled"),
            "scaling.keda and scaling.hpa are both " + ("enabled: KEDA's own HPA and a second one would fight over the replicas"
                                                        if raw.keda.enabled else "disabled: nothing would scale"),
            "enable one: keda (ScaledObjects) where KEDA runs, else hpa (autoscaling/v2 with a Prometheus adapter)")
    if not raw.prometheus_address.startswith(("http://", "https://")):
        err(("scaling", "prometheus_address"), f"prometheus_address {raw.prometheus_address!r} is no http(s) URL",
            f"where KEDA's Prometheus trigger queries, e.g. {DEFAULT_PROMETHEUS}")
    if not raw.workloads:
        err(("scaling", "workloads"), "scaling names no workload", "list the engine workloads to scale, or drop the section")
    tolerance = _tolerance(raw.hpa.tolerance, err)
    workloads = []
    for i, w in enumerate(raw.workloads):
        if w.name in [x.name for x in raw.workloads[:i]]:
            err(("scaling", "workloads", i, "name"), f"workload {w.name!r} is named twice", "give each workload its own name")
        first = next((x for x in raw.workloads[:i] if x.target == w.target), None)
        if first is not None:
            err(("scaling", "workloads", i, "target"), f"workload {w.name!r} targets {w.target.kind} "
                f"{w.target.namespace}/{w.target.name}, as workload {first.name!r} does: their two autoscalers would fight "
                "over its replicas", "scale one target from one workload: list every driving signal in that workload's signals", key=True)
        one = _workload(i, w, signals, written, raw.keda.enabled, duration, err)
        if one is not None:
            workloads.append(one)
    return Scaling(prometheus_address=raw.prometheus_address, keda=raw.keda.enabled,
                   polling_interval_s=d["polling_interval"], cooldown_period_s=d["cooldown_period"],
                   sync_period_s=d["sync_period"], scale_up_stabilization_s=d["scale_up_stabilization"],
                   scale_down_stabilization_s=d["scale_down_stabilization"], workloads=tuple(workloads),
                   tolerance=tolerance)


def _tolerance(value: _Value, err: Err) -> float:
    """``scaling.hpa.tolerance`` as a ratio in [0, 1) (0.1 when refused, after the report)."""
    path = ("scaling", "hpa", "tolerance")
    try:
        v = units.parse_quantity(value, "ratio")
    except ValueError as e:
        err(path, f"tolerance: {getattr(e, 'what', str(e))}", "the HPA controller's --horizontal-pod-autoscaler-tolerance "
            "as a percentage, e.g. '10%' (its default)")
        return 0.1
    if not 0 <= v < 1:
        err(path, f"tolerance {value!r} is out of range", "a share in [0%, 100%), e.g. '10%' (the HPA controller's default)")
        return 0.1
    return v


# --- three speeds in order: scaler, shedder, fuse ----------------------------------------------------
def _quantity(sig: Signal) -> tuple:
    """What a signal measures, beyond its name: two signals of one kind over one source series (KV
    growth and KV OOM both deriv fusebox_kv_cache_usage_bytes) are one quantity."""
    return (sig.kind, sig.unit, sig.source.backend, sig.source.metric or sig.source.expr, sig.quantile, sig.window_s)


def order_problems(spec: Spec) -> list[str]:
    """Each driving signal whose set point is not strictly before the shedders and the fuses on the
    same quantity, one line each naming both numbers: a shedder's ``shed_at`` or smg's worker
    overload veto at or under the set point (it refuses work, or takes workers out of routing,
    before the scaler adds replicas), or a fuse tier's threshold at or under it (the fuse trips
    first). The scaler acts above ``set point x (1 + scaling.hpa.tolerance)``: the HPA controller keeps
    the count while the load is within its tolerance of the target (Kubernetes' HPA algorithm,
    "tolerance", default 0.1), so that product is what must come first. ``spec``: the normalised
    Spec; [] without ``scaling``."""
    if spec.scaling is None:
        return []
    sigs = {s.name: s for s in spec.signals}
    out = []
    for w in spec.scaling.workloads:
        for d in w.signals:
            q = _quantity(sigs[d.name])
            same = [s for s in spec.signals if _quantity(s) == q]
            names = {s.name for s in same}
            # The HPA adds a replica once the load passes (1 + tolerance) x the target, not at the target.
            acts = d.set_point * (1 + spec.scaling.tolerance)
            level = units.humanize(acts, d.unit)
            where = (f"scaling workload {w.name!r} scales on {d.name!r} at {d.set_point_text} ({d.set_point_key}), "
                     f"adding a replica above {level} (the HPA's tolerance "
                     f"{format(spec.scaling.tolerance * 100, 'g')}%: scaling.hpa.tolerance)")
            need = f"above {level} (set point x (1 + scaling.hpa.tolerance))"
            for sh in spec.inpath.shedders:
                if sh.signal in names and not acts < sh.shed_at:
                    out.append(f"{where}, not before inpath.shedders.{sh.name}, which sheds at {sh.shed_at_text} "
                               f"({sh.shed_at_key}): the shedder refuses work before a replica is added -- shed {need}: "
                               f"inpath.shedders.{sh.name}.shed_at, or scale on another signal")
                # smg's worker overload veto (spec/overload.py) takes a worker out of routing: a shedder too
                for v in (sh.overload.vetoes if sh.overload is not None else ()):
                    if names & set(v.signals) and not acts < v.at:
                        out.append(f"{where}, not before inpath.shedders.{sh.name}'s worker overload veto at "
                                   f"{units.humanize(v.at, d.unit)} ({v.key}): smg takes workers out of routing before a replica "
                                   f"is added -- set the veto {need}: "
                                   f"inpath.shedders.{sh.name}.overload, or scale on another signal")
            for s in same:
                for t in s.tiers:
                    if t.fuse and not acts < t.threshold:
                        out.append(f"{where}, not before the fuse of {s.alert} {t.name} at {t.threshold_text} "
                                   f"({_key(t.path + ('threshold',))}): the fuse trips before a replica is added -- keep the "
                                   "safe level under every fuse tier's threshold")
    return out
