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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fusebox import conventions as C
from fusebox import promsim
from fusebox.signal_kinds import kind_of

from .gpu import KB
from .kvcache import KvCollector, KvGeometry
from .pcie import PCIE_LANE_BYTES_PER_S, sysfs_bus_id
from .replay import DeviceState, SyntheticNvml

A = C.ATTR
DEFAULT_SCENARIO = "breach"
class ScenarioError(ValueError):
    """An invalid scenario file; ``str()`` lists ``file:line:col: what -- fix`` lines."""


# ------------------------------------------------------------------------- model
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
        """Cumulative histogram counts (le each bound, then +Inf) of observations up to ``t``."""
        counts = [0.0] * (len(buckets) + 1)
        for k in range(self.ticks(t)):
            for v in self.alignment_observations(eid, k):
                for i, b in enumerate(buckets):
                    if v <= b:
                        counts[i] += 1
                counts[-1] += 1
        return counts

    def quantile_series(self, eid: str, times: list[float], q: float, buckets: Sequence[float],
                         window: float) -> list[float]:
        """``histogram_quantile(q, increase over window)`` of the engine's hand-offs at each time."""
        cum = [self.cumulative_buckets(eid, t, buckets) for t in times]
        step = times[1] - times[0] if len(times) > 1 else 1.0
        back = int(round(window / step))
        out = []
        for i in range(len(times)):
            j = max(0, i - back)
            inc = [a - b for a, b in zip(cum[i], cum[j], strict=False)]
            out.append(promsim.histogram_quantile(q, list(buckets), inc))
        return out


# ------------------------------------------------------------------------- loading
def _scenario_path(path: str | Path | None) -> Path:
    if path is None or str(path) == DEFAULT_SCENARIO or (not Path(str(path)).exists() and "/" not in str(path)
                                                         and not str(path).endswith((".yaml", ".yml"))):
        name = DEFAULT_SCENARIO if path is None else str(path)
        ref = resources.files("fusebox.collectors") / "scenarios" / f"{name}.yaml"
        return Path(str(ref))
    return Path(path)


def _packaged() -> list[str]:
    """The names of the packaged scenarios (collectors/scenarios/NAME.yaml)."""
    folder = resources.files("fusebox.collectors") / "scenarios"
    return sorted(f.name.removesuffix(".yaml") for f in folder.iterdir() if f.name.endswith(".yaml"))


def default_scenario_path() -> Path:
    """Path of the packaged default scenario (``collectors/scenarios/breach.yaml``)."""
    return _scenario_path(None)


# ------------------------------------------------------------------------- the file's shape
# What a scenario file may hold, checked first (unknown keys, a mapping where a list belongs) with
# the spec's own error placement (fusebox.spec.validation); load_scenario then checks the meaning.
Scalar = str | int | float
PerEntity = dict[str | int, Scalar] | Scalar  # {GPU index/UUID or engine id: value}, or one value for all


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RawPcie(_Shape):
    gen: int = 5
    width: int = 16


class RawScenarioGpu(_Shape):
    uuid: str
    memory: Scalar
    index: int | None = None
    name: str = "Synthetic GPU"
    role: str = ""
    reserved: Scalar = "0 MiB"
    pcie: RawPcie | None = None
    pci_bus_id: str | None = None
    power_idle_w: float = 70
    power_max_w: float = 700


class RawKvGeometry(_Shape):
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "float16"


class RawScenarioEngine(_Shape):
    id: str
    model: str | None = None
    gpus: list[str | int] = Field(default_factory=list)
    kv_geometry: RawKvGeometry
    block_size: int = 16
    kv_pool: Scalar = "0 GB"
    kv_start: Scalar = "0 GB"


class RawPhase(_Shape):
    name: str
    duration: Scalar
    description: str = ""
    gpu_memory: PerEntity | None = None
    gpu_utilization: PerEntity | None = None
    memory_bandwidth: PerEntity | None = None
    kv_growth: PerEntity | None = None
    alignment_p95: PerEntity | None = None
    alignment_rate: PerEntity | None = None
    pcie: PerEntity | None = None
    cold_starts: PerEntity | None = None


class RawMetadata(_Shape):
    name: str | None = None
    description: str = ""


class RawScenario(_Shape):
    """A scenario file as written (collectors/scenarios/breach.yaml is the reference)."""

    apiVersion: str | None = None  # noqa: N815 - the key as written
    kind: str
    metadata: RawMetadata | None = None
    cluster: str = ""
    host: str = "fusebox-scenario"
    tick: Scalar = "1s"
    sysfs: str | None = None
    gpus: list[RawScenarioGpu] = Field(default_factory=list)
    engines: list[RawScenarioEngine] = Field(default_factory=list)
    phases: list[RawPhase] = Field(default_factory=list)


def load_scenario(path: str | Path | None = None) -> Scenario:
    """Load and validate a scenario file (or the packaged one by name, default ``breach``).

    Raises:
        ScenarioError: every problem, as ``file:line:col: what -- how to fix it`` lines.
    """
    from fusebox.spec.errors import Problem, SpecError, unreadable
    from fusebox.spec.positions import load
    from fusebox.spec.units import QuantityError, parse_duration, parse_quantity
    from fusebox.spec.validation import pydantic_problem

    p = _scenario_path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise ScenarioError(unreadable(path if path is not None else p, err,
                                       f"pass a scenario file, or the name of a packaged one ({', '.join(_packaged())})")) from None
    try:
        raw, pos = load(text, str(p))
    except SpecError as err:
        raise ScenarioError(str(err)) from None
    problems: list[Problem] = []

    def bad(where: tuple, what: str, fix: str) -> None:
        problems.append(pos.problem(where, what, fix))

    if not isinstance(raw, dict):
        raise ScenarioError(f"{p}:1:1: a scenario is a mapping -- start from collectors/scenarios/breach.yaml")
    try:
        RawScenario.model_validate(raw)
    except ValidationError as invalid:
        shape: dict[tuple[int, int], Problem] = {}  # a union's members each object: the first one says it
        for detail in invalid.errors():
            pr = pydantic_problem(detail, pos, RawScenario, document="the scenario", reference="collectors/scenarios/breach.yaml")
            shape.setdefault((pr.line, pr.col), pr)
        raise ScenarioError("\n".join(str(pr) for pr in shape.values())) from None
    if raw.get("kind") != "FuseboxScenario":
        bad(("kind",), f"kind is {raw.get('kind')!r}", "write 'kind: FuseboxScenario'")

    def dur(v: Any, where: tuple) -> float:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
            return float(v)
        try:
            return parse_duration(v)
        except ValueError as e:
            bad(where, str(e), "write a duration such as '45s' or '2m'")
            return 0.0

    def qty(v: Any, unit: str, where: tuple, example: str) -> float:
        if unit == "ratio" and isinstance(v, (int, float)) and not isinstance(v, bool):
            if not 0 <= v <= 1:
                bad(where, f"ratio {v} outside 0..1", f"write a fraction or a percentage, e.g. {example}")
            return float(v)
        if unit == "rate" and isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        if unit == "rate":
            bad(where, f"{v!r} is not a number", f"write observations per second, e.g. {example}")
            return 0.0
        try:
            if unit == "seconds" and isinstance(v, (int, float)) and not isinstance(v, bool):
                return float(v)
            return parse_quantity(v, unit, signed=True)
        except QuantityError as e:
            bad(where, e.what, e.fix or f"write e.g. {example}")
            return 0.0

    tick = dur(raw.get("tick", "1s"), ("tick",))
    if tick <= 0:
        bad(("tick",), "tick must be positive", "write e.g. 'tick: 1s'")
        tick = 1.0
    gpus: list[ScenarioGpu] = []
    for i, g in enumerate(raw.get("gpus") or []):
        w = ("gpus", i)
        if not isinstance(g, dict) or "uuid" not in g or "memory" not in g:
            bad(w, "a GPU needs uuid and memory", "e.g. {uuid: GPU-..., index: 0, memory: 81559 MiB}")
            continue
        if g.get("pci_bus_id") is not None and sysfs_bus_id(str(g["pci_bus_id"])) is None:
            bad(w + ("pci_bus_id",), f"{g['pci_bus_id']!r} is not a PCI bus id", "write it as NVML does, e.g. '00000000:1B:00.0'")
        gpus.append(
            ScenarioGpu(
                uuid=str(g["uuid"]), index=int(g.get("index", i)), name=str(g.get("name", "Synthetic GPU")),
                total=int(qty(g["memory"], "bytes", w + ("memory",), "'81559 MiB'")),
                reserved=int(qty(g.get("reserved", "0 MiB"), "bytes", w + ("reserved",), "'479 MiB'")),
                pcie_gen=int((g.get("pcie") or {}).get("gen", 5)), pcie_width=int((g.get("pcie") or {}).get("width", 16)),
                power_idle_w=float(g.get("power_idle_w", 70)), power_max_w=float(g.get("power_max_w", 700)),
                role=str(g.get("role", "")), pci_bus_id=g.get("pci_bus_id"),
            )  # fmt: skip
        )
    if not gpus:
        bad(("gpus",), "no GPUs", "list at least one GPU under 'gpus:'")
    uuids = {g.uuid for g in gpus}

    def gpu_key(k: Any, where: tuple) -> str | None:
        for g in gpus:
            if str(k) in (g.uuid, str(g.index)):
                return g.uuid
        bad(where, f"unknown GPU {k!r}", f"use a GPU index or UUID from 'gpus:' ({', '.join(sorted(uuids))})")
        return None

    engines: list[ScenarioEngine] = []
    for i, e in enumerate(raw.get("engines") or []):
        w = ("engines", i)
        if not isinstance(e, dict) or "id" not in e:
            bad(w, "an engine needs an id", "e.g. {id: llava-0, model: ..., gpus: [0], kv_geometry: {...}}")
            continue
        eg = [gpu_key(x, w + ("gpus", j)) for j, x in enumerate(e.get("gpus") or [])]
        geo_raw = e.get("kv_geometry") or {}
        try:
            from .kvcache import DTYPE_BYTES

            geo = KvGeometry(int(geo_raw["layers"]), int(geo_raw["kv_heads"]), int(geo_raw["head_dim"]),
                             DTYPE_BYTES[str(geo_raw.get("dtype", "float16"))], "scenario")
        except (KeyError, ValueError, TypeError):
            bad(w + ("kv_geometry",), "kv_geometry needs layers, kv_heads, head_dim and a known dtype",
                "e.g. {layers: 32, kv_heads: 32, head_dim: 128, dtype: float16}")
            continue
        block = int(e.get("block_size", 16))
        pool = qty(e.get("kv_pool", "0 GB"), "bytes", w + ("kv_pool",), "'40 GiB'")
        blocks = int(pool // (block * geo.bytes_per_token))
        if blocks <= 0:
            bad(w + ("kv_pool",), "kv_pool holds no block", "give the pool size, e.g. 'kv_pool: 40 GiB'")
        engines.append(ScenarioEngine(str(e["id"]), str(e.get("model", e["id"])), tuple(x for x in eg if x), geo, block,
                                      blocks, qty(e.get("kv_start", "0 GB"), "bytes", w + ("kv_start",), "'8 GB'")))
    eids = {e.id for e in engines}

    phases: list[Phase] = []
    t = 0.0
    last: dict[str, dict[str, float]] = {k: {} for k in ("gpu_memory", "gpu_utilization", "memory_bandwidth",
                                                          "kv_growth", "alignment_p95", "alignment_rate", "pcie",
                                                          "cold_starts")}
    for i, ph in enumerate(raw.get("phases") or []):
        w = ("phases", i)
        if not isinstance(ph, dict) or "name" not in ph or "duration" not in ph:
            bad(w, "a phase needs name and duration", "e.g. {name: breach, duration: 90s, ...}")
            continue
        d = dur(ph["duration"], w + ("duration",))
        vals: dict[str, dict[str, float]] = {}
        for key, unit, example, keyer in (
            ("gpu_memory", "ratio", "'76%'", "gpu"), ("gpu_utilization", "ratio", "'60%'", "gpu"),
            ("memory_bandwidth", "ratio", "'40%'", "gpu"), ("kv_growth", "bytes_per_second", "'18 MB/s'", "engine"),
            ("alignment_p95", "seconds", "'1.6s'", "engine"), ("alignment_rate", "rate", "20", "engine"),
            ("pcie", "ratio", "'48%'", "gpu"),
            ("cold_starts", "ratio", "'25%'", "engine"),
        ):  # fmt: skip
            cur = dict(last[key])
            given = ph.get(key) or {}
            if not isinstance(given, dict):
                given = {g.uuid: given for g in gpus} if keyer == "gpu" else {e: given for e in eids}
            for k, v in given.items():
                if keyer == "gpu":
                    kk = gpu_key(k, w + (key, k))
                else:
                    kk = str(k) if str(k) in eids else None
                    if kk is None:
                        bad(w + (key, k), f"unknown engine {k!r}", f"use an engine id from 'engines:' ({', '.join(sorted(eids))})")
                if kk:
                    cur[kk] = qty(v, unit, w + (key, k), example)
            vals[key] = cur
        phases.append(
            Phase(
                name=str(ph["name"]), start_s=t, end_s=t + d, description=str(ph.get("description", "")),
                gpu_memory=vals["gpu_memory"], gpu_memory_from=dict(last["gpu_memory"]) if phases else vals["gpu_memory"],
                gpu_utilization=vals["gpu_utilization"],
                gpu_utilization_from=dict(last["gpu_utilization"]) if phases else vals["gpu_utilization"],
                memory_bandwidth=vals["memory_bandwidth"],
                memory_bandwidth_from=dict(last["memory_bandwidth"]) if phases else vals["memory_bandwidth"],
                kv_growth=vals["kv_growth"], alignment_p95=vals["alignment_p95"], alignment_rate=vals["alignment_rate"],
                pcie=vals["pcie"],
                cold_starts=vals["cold_starts"],
            )  # fmt: skip
        )
        last = vals
        t += d
    if not phases:
        bad(("phases",), "no phases", "list at least one phase under 'phases:'")
    names = [p.name for p in phases]
    for i, n in enumerate(names):
        if names.index(n) != i:
            bad(("phases", i, "name"), f"phase name {n!r} used twice", "give each phase its own name")
    sysfs = None
    if raw.get("sysfs") is not None:  # relative to the scenario file
        sysfs = str((p.parent / str(raw["sysfs"])).resolve())
        if not Path(sysfs, "devices").is_dir():
            bad(("sysfs",), f"{sysfs} holds no devices/ folder", "give a sysfs tree (a copy of /sys with devices/pci*), "
                "relative to the scenario file, e.g. 'sysfs: sysfs-a300-8'")
    if problems:
        raise ScenarioError("\n".join(str(pr) for pr in problems))
    meta = raw.get("metadata") or {}
    sc = Scenario(str(meta.get("name", p.stem)), str(meta.get("description", "")), str(raw.get("cluster", "")),
                  str(raw.get("host", "fusebox-scenario")), tick, gpus, engines, phases, str(p), sysfs)
    # physical sanity: usage may never exceed the card
    for g in gpus:
        for k in range(int(sc.duration_s) + 1):
            if sc.device_usage_bytes(g.uuid, k) > g.total:
                raise ScenarioError(f"{p}:{pos.at(('gpus',))[0]}:1: GPU {g.uuid} would use more than its memory at "
                                    f"t={k}s -- lower gpu_memory targets or the engines' kv_pool on it")
    return sc


# ------------------------------------------------------------------------- the runner
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

    def __init__(self, scenario: Scenario, pipeline: Any, *, cold_after_s: float | None = None):
        """``cold_after_s``: the spec's ``connections.cold_after``; with it (and a pipeline holding
        the connection idle histogram) the phases' ``cold_starts`` are recorded too."""
        from .gpu import GpuCollector

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
                for v in self.sc.alignment_observations(e.id, k):
                    hist.record(v, {A["engine"]: e.id, A["model"]: e.model})
                if idle is not None and cold_after:
                    for v in self.sc.connection_idle_observations(e.id, k, cold_after):
                        idle.record(v, {A["peer_service"]: e.id})
        self._ticks_done = max(self._ticks_done, done)
        readings = self.gpu.collect()
        for kv in self.kv.values():
            readings.extend(kv.collect())
        self.pipeline.set_readings(readings)
        return readings

    def run(self, *, speed: float = 1.0, clock: Callable[[], float] | None = None,
            sleep: Callable[[float], None] | None = None, say: Callable[[str], None] = print,
            until: float | None = None) -> None:
        """Real-time loop: one step per tick (wall tick = tick / speed), exporting each round."""
        import time as _time

        clock = clock or _time.monotonic
        sleep = sleep or _time.sleep
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
