"""Scenario: one YAML file drives a synthetic multimodal cluster through a breach and back.

A scenario (``kind: FuseboxScenario``) names GPUs, engines and **phases**. Each phase has a
duration and targets; the synthetic cluster it describes is collected through the real
collector code paths:

* GPUs: :class:`~fusebox.collectors.replay.SyntheticNvml` answers NVML calls from the
  scenario's state at time t, read by :class:`~fusebox.collectors.gpu.GpuCollector`;
* KV cache: each engine serves vLLM-style ``/metrics`` text (``vllm:kv_cache_usage_perc``
  and ``vllm:cache_config_info``), parsed by :class:`~fusebox.collectors.kvcache.KvCollector`;
* alignment latency: observations are recorded into the spec-bucketed histogram of
  :mod:`fusebox.collectors.latency`.

Targets (see docs/collectors.md for the full format):

``gpu_memory``  {GPU index or UUID: ratio}: memory in use on the GPU **outside** KV pools
    (weights, activations, vision-encoder buffers) at the phase's end, ramped linearly from
    the previous phase's end. An engine's KV pool is preallocated on its GPUs (as vLLM
    does), so device usage = this ratio x total + pool shares, and the **effective** ratio
    the alert reads, (usage - KV free) / total, = this ratio + KV used / total.
``gpu_utilization``, ``memory_bandwidth`` {GPU: ratio}: ramped likewise.
``kv_growth``   {engine: rate, e.g. "18 MB/s"}: constant over the phase (negative frees).
``alignment_p95`` {engine: seconds}: P95 of the phase's hand-off times (observations are
    spread evenly over [0, p95 / 0.95], whose 95th percentile is p95).
``alignment_rate`` {engine: observations per second}.
``cold_starts`` {engine: ratio}: the share of the engine's requests (one per hand-off) that
    reach it over a gateway connection idle past ``connections.cold_after`` (the idle histogram of
    ``fusebox collect conns``, recorded when the runner is given the spec's ``cold_after``).

Keys a phase leaves out keep their previous value. :func:`load_scenario` returns a
:class:`Scenario` whose :meth:`Scenario.timeline` lists the phases and whose
:meth:`Scenario.predict` says when each alert expression of the spec crosses its
thresholds, evaluated the way Prometheus does (samples every scrape interval, ``deriv``
least squares over the window, ``histogram_quantile`` over bucket increases).

The package's parts: :mod:`.shape` (what a file may hold, a pydantic model), :mod:`.load` (the
file read, its shape then its meaning checked), :mod:`.model` (the scenario's state over time and
its predictions) and :mod:`.runner` (the scenario driven through the collectors).
"""

from __future__ import annotations

from .load import DEFAULT_SCENARIO, ScenarioError, default_scenario_path, load_scenario
from .model import Crossing, Phase, Scenario, ScenarioEngine, ScenarioGpu
from .runner import ScenarioRunner
from .shape import RawScenario

__all__ = ["DEFAULT_SCENARIO", "Crossing", "Phase", "RawScenario", "Scenario", "ScenarioEngine", "ScenarioError", "ScenarioGpu",
           "ScenarioRunner", "default_scenario_path", "load_scenario"]
