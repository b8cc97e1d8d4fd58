"""The scenario player: a :class:`~.model.Scenario` driven through the real collectors, in
scenario time (:meth:`ScenarioRunner.step`) or in real time (:meth:`ScenarioRunner.run`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fusebox import conventions as C

from ..gpu import GpuCollector
from ..kvcache import KvCollector
from ..replay import SyntheticNvml
from .model import Scenario

A = C.ATTR


class ScenarioRunner:
    """Drives a :class:`Scenario` through the real collectors into a
    :class:`~fusebox.collectors.export.Pipeline` (which must have the alignment histogram).

    :meth:`step` collects one round at scenario time ``t``; alignment observations of every
    tick completed by ``t`` and not yet recorded are recorded first, so ``step(T)`` alone
    gives the cumulative histogram of a run that reached T.
    """

    KEYS = ("gpu_up", "gpu_memory_usage", "gpu_memory_limit", "gpu_memory_ratio", "gpu_memory_reserved",
            "gpu_utilization", "gpu_memory_bandwidth_utilization", "gpu_pcie_utilization", "gpu_io", "gpu_power",
            "kv_cache_usage", "kv_cache_limit", "pcie_upstream_utilization")  # fmt: skip

    HANDOFF_SPAN = "mm.handoff"  # the hand-off span's name (docs/exemplars.md's instrumenting example)

    def __init__(self, scenario: Scenario, pipeline: Any, *, cold_after_s: float | None = None, tracer: Any = None):
        """``cold_after_s``: the spec's ``connections.cold_after``; with it (and a pipeline holding
        the connection idle histogram) the phases' ``cold_starts`` are recorded too. ``tracer``: an
        OpenTelemetry tracer; with it, each engine's slowest hand-off of each tick is recorded in a
        sampled ``mm.handoff`` span of its duration (ending when it is recorded), as an
        instrumented engine's would be, so its trace id becomes its bucket's exemplar."""
        self.tracer = tracer
        self.sc = scenario
        self.cold_after_s = cold_after_s
        self.pipeline = pipeline
        self.t = 0.0
        self.nvml = SyntheticNvml(lambda: self.sc.device_states(self.t))
        self.gpu = GpuCollector(self.nvml, clock=lambda: self.t, sysfs=scenario.sysfs).open()
        self.kv = {
            e.id: KvCollector([f"scenario://{e.id}/metrics"], e.geometry, gpus=e.gpus, engine_id=e.id, model=e.model,
                              fetch=self._engine_text(e.id))
            for e in scenario.engines
        }  # fmt: skip
        self._ticks_done = 0

    def _engine_text(self, eid: str) -> Callable[[str, float], str]:
        """The KV collector's ``fetch`` for one engine: its vLLM text at the current time."""
        return lambda _endpoint, _timeout_s: self.sc.vllm_text(eid, self.t)

    def step(self, t: float) -> list:
        self.t = t
        done = self.sc.ticks(t)
        hist = self.pipeline.alignment
        idle = getattr(self.pipeline, "histograms", {}).get("connection_idle_before_use")
        cold_after = self.cold_after_s
        for k in range(self._ticks_done, done):
            for e in self.sc.engines:
                obs = self.sc.alignment_observations(e.id, k)
                slowest = max(range(len(obs)), key=obs.__getitem__) if obs and self.tracer is not None else None
                for i, v in enumerate(obs):
                    attrs = {A["engine"]: e.id, A["model"]: e.model}
                    if i == slowest:
                        self._traced(hist, v, attrs)
                    else:
                        hist.record(v, attrs)
                if idle is not None and cold_after:
                    for v in self.sc.connection_idle_observations(e.id, k, cold_after):
                        idle.record(v, {A["peer_service"]: e.id})
        self._ticks_done = max(self._ticks_done, done)
        readings = self.gpu.collect()
        for kv in self.kv.values():
            readings.extend(kv.collect())
        self.pipeline.set_readings(readings)
        return readings

    def _traced(self, hist: Any, seconds: float, attrs: dict) -> None:
        """Record ``seconds`` inside an ``mm.handoff`` span that lasted as long, ending now."""
        from opentelemetry import trace

        end = time.time_ns()
        span = self.tracer.start_span(self.HANDOFF_SPAN, start_time=end - round(seconds * 1e9),
                                      attributes={**attrs, "gen_ai.request.model": attrs[A["model"]]})
        try:
            hist.record(seconds, attrs, context=trace.set_span_in_context(span))
        finally:
            span.end(end_time=end)

    def run(self, *, speed: float = 1.0, clock: Callable[[], float] | None = None,
            sleep: Callable[[float], None] | None = None, say: Callable[[str], None] = print,
            until: float | None = None) -> None:
        """Real-time loop: one step per tick (wall tick = tick / speed), exporting each round."""
        clock = clock or time.monotonic
        sleep = sleep or time.sleep
        end = self.sc.duration_s if until is None else until
        start = clock()
        phase = None
        k = 0
        while True:
            t = min(end, k * self.sc.tick_s)
            p = self.sc.phase_at(t)
            if p.name != phase:
                phase = p.name
                say(f"scenario t={t:.0f}s phase={p.name} ({p.start_s:.0f}s-{p.end_s:.0f}s) {p.description}".rstrip())
            self.step(t)
            self.pipeline.export_round()
            if t >= end:
                break
            k += 1
            wait = start + (k * self.sc.tick_s) / speed - clock()
            if wait > 0:
                sleep(wait)
        say(f"scenario t={end:.0f}s done")

