"""What a scenario file may hold, checked first (unknown keys, a mapping where a list belongs)
with the spec's own error placement (:mod:`fusebox.spec.validation`); :mod:`.load` then checks the
meaning. ``collectors/scenarios/breach.yaml`` is the reference file."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

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
