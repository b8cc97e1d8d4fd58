"""The scenario as loaded: its GPUs, engines and phases, the state of the synthetic cluster at any
time, and the alert crossings that state predicts (:meth:`Scenario.predict`)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fusebox import promsim
from fusebox.signal_kinds import kind_of

from ..gpu import KB
from ..kvcache import KvGeometry
from ..pcie import PCIE_LANE_BYTES_PER_S
from ..replay import DeviceState


@dataclass(frozen=True)
class ScenarioGpu:
    uuid: str
    index: int
    name: str
    total: int  # bytes
    reserved: int
    pcie_gen: int = 5
    pcie_width: int = 16
    power_idle_w: float = 70.0
    power_max_w: float = 700.0
    role: str = ""
    pci_bus_id: str | None = None  # NVML's, "00000000:1B:00.0": where the GPU sits in the scenario's sysfs


@dataclass(frozen=True)
class ScenarioEngine:
    id: str
    model: str
    gpus: tuple[str, ...]
    geometry: KvGeometry
    block_size: int
    num_gpu_blocks: int
    kv_start: float  # bytes in use at t = 0

    @property
    def pool_bytes(self) -> float:
        return float(self.num_gpu_blocks * self.block_size * self.geometry.bytes_per_token)

    @property
    def tp(self) -> int:
        return max(1, len(self.gpus))


@dataclass(frozen=True)
class Phase:
    """One phase: ``[start_s, end_s)`` in scenario seconds, with the targets in force.

    ``gpu_memory`` etc. are the values at the phase's END (ramped from ``*_from``, the
    previous phase's end); ``kv_growth`` (bytes/s), ``alignment_p95`` (s) and
    ``alignment_rate`` (1/s) hold for the whole phase.
    """

    name: str
    start_s: float
    end_s: float
    description: str = ""
    gpu_memory: dict[str, float] = field(default_factory=dict)
    gpu_memory_from: dict[str, float] = field(default_factory=dict)
    gpu_utilization: dict[str, float] = field(default_factory=dict)
    gpu_utilization_from: dict[str, float] = field(default_factory=dict)
    memory_bandwidth: dict[str, float] = field(default_factory=dict)
    memory_bandwidth_from: dict[str, float] = field(default_factory=dict)
    kv_growth: dict[str, float] = field(default_factory=dict)
    alignment_p95: dict[str, float] = field(default_factory=dict)
    alignment_rate: dict[str, float] = field(default_factory=dict)
    # busier-direction PCIe throughput per GPU, as a share of its own link (NVML's max gen x width);
    # a GPU without one moves a few GB/s with its utilization
    pcie: dict[str, float] = field(default_factory=dict)
    cold_starts: dict[str, float] = field(default_factory=dict)  # share 0-1 of the engine's requests after long idle

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def as_dict(self) -> dict:
        return {
            "name": self.name, "start_s": self.start_s, "end_s": self.end_s, "description": self.description,
            "gpu_memory": self.gpu_memory, "kv_growth_bytes_per_s": self.kv_growth,
            "alignment_p95_s": self.alignment_p95, "alignment_rate_per_s": self.alignment_rate,
        }  # fmt: skip


@dataclass(frozen=True)
class Crossing:
    """A predicted alert-expression event (Prometheus semantics, no scrape jitter).

    ``event`` is ``above`` (expression first > threshold), ``fires`` (above for the tier's
    ``for``), ``below`` (back under) or ``resolves`` (below + ``keep_firing_for``, only after
    it fired). ``entity`` is a GPU UUID or an engine id.
    """

    time_s: float
    signal: str
    tier: str
    event: str
    entity: str
    threshold: float
    value: float
    phase: str

    def as_dict(self) -> dict:
        return self.__dict__.copy()


@dataclass
class Scenario:
    name: str
    description: str
    cluster: str
    host: str
    tick_s: float
    gpus: list[ScenarioGpu]
    engines: list[ScenarioEngine]
    phases: list[Phase]
    path: str = ""
    sysfs: str | None = None  # the sysfs tree the GPUs' PCIe topology is read from (pci_bus_id)

    @property
    def gpu_ids(self) -> tuple[str, ...]:
        """The GPUs' UUIDs (``hw_id``), in the file's order."""
        return tuple(g.uuid for g in self.gpus)

    @property
    def engine_ids(self) -> tuple[str, ...]:
        """The engines' ids (``engine``), in the file's order."""
        return tuple(e.id for e in self.engines)

    # -- time ------------------------------------------------------------------------
    @property
    def duration_s(self) -> float:
        return self.phases[-1].end_s

    def phase_at(self, t: float) -> Phase:
        """The phase in force at scenario time ``t`` (the last one after the end)."""
        for p in self.phases:
            if p.start_s <= t < p.end_s:
                return p
        return self.phases[-1] if t >= self.duration_s else self.phases[0]

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase {name!r}; phases: {', '.join(p.name for p in self.phases)}")

    def _ramp(self, attr: str, key: str, t: float) -> float:
        p = self.phase_at(t)
        end, start = getattr(p, attr).get(key, 0.0), getattr(p, attr + "_from").get(key, 0.0)
        if p.duration_s <= 0:
            return end
        f = min(1.0, max(0.0, (t - p.start_s) / p.duration_s))
        return start + (end - start) * f

    def gpu(self, ref: str | int) -> ScenarioGpu:
        for g in self.gpus:
            if str(ref) in (g.uuid, str(g.index)):
                return g
        raise KeyError(f"no GPU {ref!r}")

    def engine(self, eid: str) -> ScenarioEngine:
        for e in self.engines:
            if e.id == eid:
                return e
        raise KeyError(f"no engine {eid!r}")

    # -- state -----------------------------------------------------------------------
    def other_memory_ratio(self, gpu: str, t: float) -> float:
        """Non-KV memory in use on ``gpu`` at ``t``, ratio of total."""
        return self._ramp("gpu_memory", self.gpu(gpu).uuid, t)

    def kv_used_bytes(self, eid: str, t: float) -> float:
        """Engine-wide KV bytes in use at ``t`` (clamped to [0, pool])."""
        e = self.engine(eid)
        used = e.kv_start
        for p in self.phases:
            if t <= p.start_s:
                break
            dt = min(t, p.end_s) - p.start_s
            used = min(e.pool_bytes, max(0.0, used + p.kv_growth.get(eid, 0.0) * dt))
        return used

    def _pool_share(self, gpu_uuid: str, t: float | None) -> tuple[float, float]:
        """(pool bytes, KV used bytes) of every engine on ``gpu_uuid``."""
        pool = used = 0.0
        for e in self.engines:
            if gpu_uuid in e.gpus:
                pool += e.pool_bytes / e.tp
                if t is not None:
                    used += self.kv_used_bytes(e.id, t) / e.tp
        return pool, used

    def device_usage_bytes(self, gpu: str, t: float) -> float:
        g = self.gpu(gpu)
        pool, _ = self._pool_share(g.uuid, None)
        return self.other_memory_ratio(g.uuid, t) * g.total + pool

    def device_memory_ratio(self, gpu: str, t: float) -> float:
        """(total - free) / total as NVML would report it."""
        g = self.gpu(gpu)
        return self.device_usage_bytes(g.uuid, t) / g.total

    def effective_memory_ratio(self, gpu: str, t: float) -> float:
        """(usage - KV pool free) / total: what the GPU-memory alert reads."""
        g = self.gpu(gpu)
        pool, used = self._pool_share(g.uuid, t)
        return (self.device_usage_bytes(g.uuid, t) - (pool - used)) / g.total

    def device_states(self, t: float) -> list[DeviceState]:
        out = []
        for g in self.gpus:
            usage = int(round(self.device_usage_bytes(g.uuid, t)))
            util = self._ramp("gpu_utilization", g.uuid, t)
            bw = self._ramp("memory_bandwidth", g.uuid, t)
            share = self.phase_at(t).pcie.get(g.uuid)
            # KB/s, as NVML reports: the phase's share of the link (receive: host-to-device uploads
            # of images and KV, transmit half of it), else a few GB/s of image uploads
            rx = share * PCIE_LANE_BYTES_PER_S[g.pcie_gen] * g.pcie_width / KB if share is not None else util * 4e6
            tx = rx / 2 if share is not None else util * 2e6
            out.append(
                DeviceState(
                    uuid=g.uuid, index=g.index, name=g.name, total=g.total, free=g.total - usage,
                    used=max(0, usage - g.reserved), reserved=g.reserved,
                    util_gpu=100 * util, util_mem=100 * bw,
                    power_w=g.power_idle_w + (g.power_max_w - g.power_idle_w) * util,
                    pcie_gen_max=g.pcie_gen, pcie_width_max=g.pcie_width,
                    tx_kbps=tx, rx_kbps=rx, pci_bus_id=g.pci_bus_id,
                )  # fmt: skip
            )
        return out

    def vllm_text(self, eid: str, t: float) -> str:
        """What the engine's vLLM ``/metrics`` would say at ``t`` (KV families only)."""
        e = self.engine(eid)
        frac = self.kv_used_bytes(eid, t) / e.pool_bytes
        return (
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="{e.model}"}} {frac!r}\n'
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{e.block_size}",cache_dtype="auto",engine="0",'
            f'num_gpu_blocks="{e.num_gpu_blocks}"}} 1.0\n'
        )

    def alignment_observations(self, eid: str, tick: int) -> list[float]:
        """Hand-off times recorded in tick ``tick`` (the interval ending at (tick+1) x tick_s)."""
        t_end = (tick + 1) * self.tick_s
        p = self.phase_at(t_end - 1e-9)
        p95 = p.alignment_p95.get(eid)
        rate = p.alignment_rate.get(eid, 0.0)
        if not p95 or rate <= 0:
            return []
        n = int(round(rate * self.tick_s))
        top = p95 / 0.95
        return [top * (i + 0.5) / n for i in range(n)]

    def connection_idle_observations(self, eid: str, tick: int, cold_after_s: float) -> list[float]:
        """Idle times before the uses of the gateway's connections to engine ``eid`` in tick
        ``tick``: one use per request (``alignment_rate``), the phase's ``cold_starts`` share of
        them after ``cold_after_s`` + 5 s idle (a cold start, under the 45 s keep-alive line), the
        rest after 0.2 s. The cold ones are spread evenly (a running count, rounded down)."""
        t_end = (tick + 1) * self.tick_s
        p = self.phase_at(t_end - 1e-9)
        n = int(round(p.alignment_rate.get(eid, 0.0) * self.tick_s))
        share = p.cold_starts.get(eid, 0.0)
        before = math.floor(share * n * tick + 1e-9)
        cold = math.floor(share * n * (tick + 1) + 1e-9) - before
        return [cold_after_s + 5.0] * cold + [0.2] * (n - cold)

    def ticks(self, t: float) -> int:
        """Number of whole ticks completed by scenario time ``t``."""
        return int(math.floor(t / self.tick_s + 1e-9))

    # -- timeline and predictions -----------------------------------------------------
    def timeline(self) -> list[dict]:
        return [p.as_dict() for p in self.phases]

    def predict(self, spec: Any, *, scrape_s: float | None = None) -> list[Crossing]:
        """Predicted crossings of the alert expressions the scenario drives, in time order.

        The scenario models GPU device memory, KV-cache bytes and alignment hand-offs, so it
        predicts every primary (not ``secondary``) signal of the spec that reads them, whatever
        it is called: a ``gpu_memory`` signal (effective ratio per GPU), a ``deriv`` signal over
        the KV-cache usage gauge and a ``quantile`` signal over the alignment histogram (per
        engine), with the spec's thresholds, ``for``, windows, quantile and buckets.

        Args:
            spec: a loaded :class:`fusebox.spec.Spec`.
            scrape_s: sample spacing; default the spec's scrape interval.
        """
        step = scrape_s or spec.scrape_interval_s
        times = [i * step for i in range(int(self.duration_s // step) + 1)]
        series: dict[tuple[str, str], list[float]] = {}
        signals = {}
        for sig in spec.signals:
            if sig.secondary:
                continue
            per_entity = kind_of(sig).scenario_series(sig, self, times)
            if not per_entity:
                continue  # not something this scenario models
            for entity, values in per_entity.items():
                series[(sig.name, entity)] = values
            signals[sig.name] = sig
        out: list[Crossing] = []
        for (name, entity), values in series.items():
            sig = signals[name]
            for tier in sig.tiers:
                out.extend(self._events(sig, tier, entity, times, values))
        out.sort(key=lambda c: (c.time_s, c.signal, c.tier, c.entity))
        return out

    def _events(self, sig, tier, entity, times, values) -> list[Crossing]:
        out = []
        above_since = None
        fired = False
        thr, for_s, kff = tier.threshold, tier.for_s, tier.keep_firing_for_s
        for t, v in zip(times, values, strict=False):
            # as the generated alert compares (`expr >= threshold`); NaN (no traffic) never
            # breaches (docs/pitfalls.md P1)
            is_above = promsim.breaches(v, thr, sig.direction)
            if is_above and above_since is None:
                above_since = t
                out.append(Crossing(t, sig.name, tier.name, "above", entity, thr, v, self.phase_at(t).name))
            if is_above and not fired and t - above_since >= for_s:
                fired = True
                out.append(Crossing(t, sig.name, tier.name, "fires", entity, thr, v, self.phase_at(t).name))
            if not is_above and above_since is not None:
                out.append(Crossing(t, sig.name, tier.name, "below", entity, thr, v, self.phase_at(t).name))
                if fired:
                    out.append(Crossing(t + kff, sig.name, tier.name, "resolves", entity, thr, v,
                                        self.phase_at(t + kff).name))
                above_since, fired = None, False
        return out

    def cumulative_buckets(self, eid: str, t: float, buckets: Sequence[float]) -> list[float]:
        """Cumulative histogram counts (le each bound, then +Inf) of observations up to ``t``;
        ``buckets`` ascending, as a histogram's bounds are."""
        return self._cumulative_at(eid, [t], buckets)[0]

    def _cumulative_at(self, eid: str, times: Sequence[float], buckets: Sequence[float]) -> list[list[float]]:
        """:meth:`cumulative_buckets` at each of ``times``, in one pass over the ticks (the times
        in any order; each observation counted once, in the first bucket whose bound it does not
        exceed, then summed up the bounds)."""
        bounds = list(buckets)
        per_bucket = [0.0] * (len(bounds) + 1)  # the last: above every bound (+Inf only)
        out: list[list[float]] = [[] for _ in times]
        done = 0  # ticks counted so far
        for i in sorted(range(len(times)), key=times.__getitem__):
            upto = self.ticks(times[i])
            while done < upto:
                for v in self.alignment_observations(eid, done):
                    per_bucket[bisect.bisect_left(bounds, v)] += 1
                done += 1
            out[i] = list(itertools.accumulate(per_bucket))
        return out

    def quantile_series(self, eid: str, times: list[float], q: float, buckets: Sequence[float],
                         window: float) -> list[float]:
        """``histogram_quantile(q, increase over window)`` of the engine's hand-offs at each time."""
        cum = self._cumulative_at(eid, times, buckets)
        step = times[1] - times[0] if len(times) > 1 else 1.0
        back = int(round(window / step))
        out = []
        for i in range(len(times)):
            j = max(0, i - back)
            inc = [a - b for a, b in zip(cum[i], cum[j], strict=False)]
            out.append(promsim.histogram_quantile(q, list(buckets), inc))
        return out
