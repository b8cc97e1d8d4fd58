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
  its refusal, overload and breaker series (generator/shedding.py), scraped on its ``--prometheus-port``.

A signal with every tier disabled is not reported: it keeps its records, but nothing of it fires.
"""

from __future__ import annotations

from dataclasses import dataclass

from fusebox import conventions as C
from fusebox.spec import Spec
from fusebox.spec.inpath import GATEWAY_KINDS
from fusebox.spec.kinds import kind_of
from fusebox.spec.kinds.base import DCGM
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


@dataclass(frozen=True)
class Producer:
    """Something that publishes metrics: ``what`` for people, the metric-name ``prefixes`` and exact ``names``."""

    what: str
    prefixes: tuple[str, ...] = ()
    names: frozenset[str] = frozenset()

    def publishes(self, metric: str) -> bool:
        return metric in self.names or metric.startswith(self.prefixes)


def configured_backends(spec: Spec) -> set[str]:
    """Source backends the spec names: every signal's selected source, ``global.selectors``' keys
    and the engines (:attr:`Spec.engines`)."""
    return {s.source.backend for s in spec.signals} | set(spec.selectors) | set(spec.engines)


def producers(spec: Spec) -> list[Producer]:
    """Everything that publishes a metric the rules may read, for this spec (see the module doc)."""
    out = [Producer("Prometheus", names=SYNTHETIC), Producer("Alertmanager", ("alertmanager_",)),
           Producer("the fuse service", ("fusebox_fuse_",))]
    backends = configured_backends(spec)
    if DCGM in backends:
        out.append(Producer("dcgm-exporter", ("DCGM_FI_",)))
    if "vllm" in backends:
        out.append(Producer("vLLM", ("vllm:",)))
    if "sglang" in backends:
        out.append(Producer("SGLang", C.SGLANG_PREFIXES))
    if spec.kubernetes.collectors.enabled:
        for name in spec.kubernetes.collectors.run:
            if name == "kv" and not (spec.kubernetes.engines and spec.kubernetes.engines.models):
                continue  # it discovers engines but knows no model's geometry: no KV bytes
            out.append(Producer(f"the fusebox {name} collector (k8s/)", COLLECTOR_PREFIXES.get(name, ())))
    if any(s.kind in GATEWAY_KINDS for s in spec.inpath.shedders):
        out.append(Producer("the SGLang Model Gateway (inpath.shedders)", (C.GATEWAY_PREFIX,)))
    if spec.fusebox_collectors:  # their self-metrics come with them, wherever they run
        out.append(Producer("the fusebox collectors", ("fusebox_collector_",)))
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
