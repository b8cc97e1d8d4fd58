"""Who publishes each metric the generated rules read: an exporter the spec names, or something k8s/ deploys.

A rule over a metric nobody publishes never fires, and its ``FuseboxSignalAbsent`` fires for
good. :func:`unproduced` lists such reads; ``fusebox generate`` warns about each (naming the
signal), and the tests check the rules of a spec mechanically against exporter captures.

Producers (:func:`producers`), by metric-name prefix:

* Prometheus itself (``up``, ``ALERTS`` ...) and Alertmanager (``alertmanager_*``): the stack the
  rules run on;
* the fuse service (``fusebox_fuse_*``): ``k8s/fuse.yml``, or the one ``fuse.webhook_url`` names;
* dcgm-exporter (``DCGM_FI_*``) when a signal reads its ``dcgm`` source or ``global.selectors``
  names it; vLLM (``vllm:``) and SGLang (``sglang:``, ``sglang_``) per :attr:`Spec.engines`;
* the fusebox collectors (``k8s/collectors.yml``) when ``kubernetes.collectors.enabled``, each
  collector of ``kubernetes.collectors.run`` for its own series: ``gpu`` the GPU series
  (``hw_*``, ``fusebox_gpu_*``), ``kv`` ``fusebox_kv_cache_*`` when discovery covers it
  (``kubernetes.engines`` with at least one of ``models``: an engine whose model has no geometry
  gives no bytes), ``latency`` the alignment histogram (``kubernetes.engines``: the spec refuses
  ``kv`` or ``latency`` without it); their ``fusebox_collector_*`` self-metrics wherever
  :attr:`Spec.fusebox_collectors` expects them (the self-monitoring alerts on them exist only then);
* the SGLang Model Gateway (``smg_``) when ``inpath.shedders`` names one (``smg``, ``sglang_router``):
  its refusal, overload and breaker series (generator/shedding.py), scraped on its ``--prometheus-port``;
* the CostQoS controller (``fusebox_costqos_``) when a ``scaling`` workload has ``cost_qos``: the
  policies it reconciles are generated (generator/render_scaling.py).

A signal with every tier disabled is not reported: it keeps its records, but nothing of it fires;
where nothing publishes its source either, :func:`fed_spec` leaves it out of the rules and the
dashboards (no empty group, no panel bound to stay empty).

Each producer also says which labels its series carry once scraped (:attr:`Producer.labels`), and
for the labels a record joins on that it may lack, how to get them (:attr:`Producer.label_fixes`):
what :mod:`.tracing` follows from a panel's query down to its producers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fusebox import conventions as C
from fusebox.signal_kinds import kind_of
from fusebox.signal_kinds.base import DCGM, FUSEBOX
from fusebox.spec import Spec
from fusebox.spec.inpath import GATEWAY_KINDS
from fusebox.spec.promql import vector_selectors

from .deadselectors import SYNTHETIC

# What each fusebox collector publishes (its metric-name prefixes).
COLLECTOR_PREFIXES = {
    "gpu": ("hw_", "fusebox_gpu_"),
    "kv": ("fusebox_kv_cache_",),
    "latency": (C.PROM["alignment_duration"] + "_",),
}
# How to get each collector's series, for the warning.
_HOW = {
    "gpu": "enable kubernetes.collectors (run: {gpu: []}), or give the signal its dcgm source",
    "kv": ("neither vLLM nor SGLang publishes KV bytes (docs/metrics.md): run the KV collector, which discovers the "
           "engine pods on its node (kubernetes.collectors.run: {kv: []} with kubernetes.engines: their selector, port "
           "and models, each with its config.json or geometry; docs/kubernetes.md), or beside each engine "
           "(`fusebox collect kv --endpoint URL --model-config FILE --gpu UUID --engine-id ID`), and scrape it; or disable "
           "the signal"),
    "latency": ("no engine publishes an alignment histogram (docs/metrics.md): record it in the engine process "
                "(fusebox.collectors.latency) or run the latency collector, which discovers the engine pods on its node "
                "(kubernetes.collectors.run: {latency: []} with kubernetes.engines), and scrape it; or disable the signal"),
}


# Labels every scraped series carries (conventions.TARGET_LABELS: what the Prometheus Operator's monitors add).
_TARGET = frozenset(C.TARGET_LABELS)
# What each fusebox collector labels its series with (collectors/export.py; `--cluster` and
# `--host-name` are set by k8s/collectors.yml).
COLLECTOR_LABELS = {
    # and, on the shared PCIe links' series (collectors/pcie.py), the root complex, port and NUMA node
    "gpu": frozenset({"cluster", "host_name", "hw_id", "hw_gpu_index", "pcie_root_complex", "pcie_port", "numa_node"}),
    "kv": frozenset({"cluster", "host_name", "hw_id", "engine", "model"}),
    "latency": frozenset({"cluster", "host_name", "engine", "model"}),
}
# dcgm-exporter's own labels (its default counters; `Hostname` since #655), no cluster.
DCGM_LABELS = frozenset({"UUID", "gpu", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"})
# The engines' own: vLLM's model_name and engine (an index from about 0.10), SGLang's model_name.
ENGINE_LABELS = frozenset({"model_name", "engine"})
ENGINES_FIX = ("set kubernetes.engines (its PodMonitor adds host_name from the pod's node, and cluster), or give your "
               "own ServiceMonitor/PodMonitor of the engines the same relabelings (docs/kubernetes.md)")


@dataclass(frozen=True)
class Producer:
    """Something that publishes metrics: ``what`` for people, the metric-name ``prefixes`` and exact
    ``names``; ``labels``, the labels its series carry as Prometheus stores them (a histogram's
    ``_bucket`` series ``le`` too); ``label_fixes``, for a label it lacks that a record may group
    or join on, how to get it."""

    what: str
    prefixes: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()
    labels: frozenset[str] = _TARGET
    label_fixes: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    def publishes(self, metric: str) -> bool:
        return metric in self.names or metric.startswith(self.prefixes)

    def labels_of(self, metric: str) -> frozenset[str]:
        return self.labels | {"le"} if metric.endswith("_bucket") else self.labels


def gpu_power_backend(spec: Spec) -> str:
    """Where GPU power per host comes from: the GPU-memory signal's backend (the first signal
    whose kind :attr:`~fusebox.signal_kinds.base.Kind.reads_gpu_series`; without one: the
    fusebox collectors where :attr:`Spec.fusebox_collectors` expects them, else dcgm-exporter)."""
    gpu = next((s for s in spec.signals if kind_of(s).reads_gpu_series), None)
    return gpu.source.backend if gpu else (FUSEBOX if spec.fusebox_collectors else DCGM)


def engine_labels(spec: Spec) -> frozenset[str]:
    """The labels the engines' series carry: their own and the scrape's, plus what the PodMonitor
    of ``kubernetes.engines`` adds (generator/render_k8s.py): ``host_name`` from the node, and
    ``cluster`` unless GPU power comes from dcgm-exporter (whose series carry none to join with)."""
    out = ENGINE_LABELS | _TARGET
    if spec.kubernetes.engines is not None:
        out |= {C.LABEL["host"]} | ({C.LABEL["cluster"]} if gpu_power_backend(spec) != DCGM else set())
    return out


def configured_backends(spec: Spec) -> set[str]:
    """Source backends the spec names: every signal's selected source, ``global.selectors``' keys
    and the engines (:attr:`Spec.engines`)."""
    return {s.source.backend for s in spec.signals} | set(spec.selectors) | set(spec.engines)


def producers(spec: Spec) -> list[Producer]:
    """Everything that publishes a metric the rules may read, for this spec (see the module doc)."""
    # ALERTS carries its alert's labels; fusebox_fuse_level its scope's.
    out = [Producer("Prometheus", names=SYNTHETIC, labels=_TARGET | {"alertname", "alertstate", "severity"}),
           Producer("Alertmanager", ("alertmanager_",)),
           Producer("the fuse service", ("fusebox_fuse_",), labels=_TARGET | set(C.SCOPE_LABELS))]
    backends = configured_backends(spec)
    if DCGM in backends:
        out.append(Producer("dcgm-exporter", ("DCGM_FI_",), labels=_TARGET | DCGM_LABELS))
    engines = engine_labels(spec)
    fixes = {label: ENGINES_FIX for label in (C.LABEL["host"], C.LABEL["cluster"]) if label not in engines}
    if "vllm" in backends:
        out.append(Producer("vLLM", ("vllm:",), labels=engines, label_fixes=fixes))
    if "sglang" in backends:
        out.append(Producer("SGLang", C.SGLANG_PREFIXES, labels=engines, label_fixes=fixes))
    if spec.kubernetes.collectors.enabled:
        for name in spec.kubernetes.collectors.run:
            if name == "kv" and not (spec.kubernetes.engines and spec.kubernetes.engines.models):
                continue  # it discovers engines but knows no model's geometry: no KV bytes
            out.append(Producer(f"the fusebox {name} collector (k8s/)", COLLECTOR_PREFIXES.get(name, ()),
                                labels=_TARGET | COLLECTOR_LABELS.get(name, frozenset())))
    if any(s.kind in GATEWAY_KINDS for s in spec.inpath.shedders):
        out.append(Producer("the SGLang Model Gateway (inpath.shedders)", (C.GATEWAY_PREFIX,)))
    if spec.fusebox_collectors:  # their self-metrics come with them, wherever they run
        out.append(Producer("the fusebox collectors", ("fusebox_collector_",)))
    if spec.scaling is not None and any(w.cost_qos for w in spec.scaling.workloads):
        # the policies k8s/ applies are the controller's to reconcile; it publishes per policy
        out.append(Producer("the CostQoS controller (scaling.workloads[].cost_qos)", ("fusebox_costqos_",),
                            labels=_TARGET | {"namespace", "policy"}))
    return out


def producer_of(metric: str, spec: Spec) -> Producer | None:
    return next((p for p in producers(spec) if p.publishes(metric)), None)


def _collector_for(metric: str) -> str | None:
    return next((name for name, pre in COLLECTOR_PREFIXES.items() if metric.startswith(pre)), None)


def rule_reads(exprs: list[str], recorded: set[str]) -> list[str]:
    """The raw metric names ``exprs`` select (records of ``recorded`` left out), in order, once each."""
    seen: dict[str, None] = {}
    for expr in exprs:
        for v in vector_selectors(expr):
            if v.name and v.name not in recorded:
                seen.setdefault(v.name, None)
    return list(seen)


def unproduced(spec: Spec, groups: list[dict]) -> list[tuple[str, str, str]]:
    """``(reader, metric, how to fix)`` for each raw metric the rule ``groups`` read that no
    :func:`producers` entry publishes. ``reader`` is ``signal 'NAME'`` for a signal's own
    rules, else the rule's name (a dashboard record, a self-monitoring alert)."""
    rules = [r for g in groups for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    out: list[tuple[str, str, str]] = []
    done: set[str] = set()
    for sig in spec.signals:
        exprs = [r["expr"] for r in kind_of(sig).rules(sig, spec) + kind_of(sig).panel_rules(sig, spec)]
        for metric in rule_reads(exprs, recorded):
            done.add(metric)
            # a signal with every tier disabled is kept for its records only: nothing of it can fire
            if sig.tiers and producer_of(metric, spec) is None:
                out.append((f"signal {sig.name!r}", metric, _HOW.get(_collector_for(metric) or "", "")))
    for r in rules:
        for metric in rule_reads([r["expr"]], recorded):
            if metric not in done and producer_of(metric, spec) is None:
                done.add(metric)
                out.append((r.get("record") or r["alert"], metric, _HOW.get(_collector_for(metric) or "", "")))
    return out


def how_to_publish(metric: str) -> str:
    """How to get ``metric`` published when nothing does: its fusebox collector's advice, else a generic line."""
    return _HOW.get(_collector_for(metric) or "", "") or "deploy what publishes it, or read another source"


def unfed_disabled(spec: Spec) -> list[tuple[str, str]]:
    """``(signal, metric)`` for each signal with every tier disabled whose source reads a metric
    nothing publishes (the first such metric): nothing of it can fire, and nothing can draw it."""
    out: list[tuple[str, str]] = []
    disabled = [s for s in spec.signals if not s.tiers]
    if not disabled:
        return out
    ps = producers(spec)
    for sig in disabled:
        missing = next((m for m in kind_of(sig).raw_metrics(sig) if not any(p.publishes(m) for p in ps)), None)
        if missing is not None:
            out.append((sig.name, missing))
    return out


def fed_spec(spec: Spec) -> Spec:
    """``spec`` without the signals of :func:`unfed_disabled` (``spec`` itself when there are none):
    what the rules and dashboards are rendered from. Such a signal (PCIe with ``global.source:
    dcgm`` and no GPU collector, disabled as docs/spec.md says) would otherwise leave an empty
    rule group, a record over nothing and panels bound to stay empty (docs/dashboards.md)."""
    dead = {name for name, _ in unfed_disabled(spec)}
    if not dead:
        return spec
    return dataclasses.replace(spec, signals=tuple(s for s in spec.signals if s.name not in dead))
