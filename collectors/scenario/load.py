"""Loading a scenario file, in fusebox's one validation style: the shape first
(:class:`~.shape.RawScenario`, ``extra="forbid"``, each error at the user's line by
:mod:`fusebox.spec.validation`), then the meaning, by :class:`_Normaliser`: one method per
section (tick, GPUs, engines, phases, sysfs), every problem reported at once.

The normaliser reads the document as written, not the shape model's values: pydantic's lax mode
turns ``true`` into 1 and ``"32.0"`` into 32, which the meaning checks refuse in the user's terms.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from fusebox.spec.errors import Problem, SpecError, unreadable
from fusebox.spec.positions import Positions, load
from fusebox.spec.units import QuantityError, parse_duration, parse_quantity
from fusebox.spec.validation import pydantic_problem

from ..kvcache import DTYPE_BYTES, KvGeometry
from ..pcie import sysfs_bus_id
from .model import Phase, Scenario, ScenarioEngine, ScenarioGpu
from .shape import RawScenario

DEFAULT_SCENARIO = "breach"
REFERENCE = "collectors/scenarios/breach.yaml"
# a phase's targets: key, unit (fusebox.spec.units), an example for the fix, and what it is keyed by
TARGETS = (
    ("gpu_memory", "ratio", "'76%'", "gpu"), ("gpu_utilization", "ratio", "'60%'", "gpu"),
    ("memory_bandwidth", "ratio", "'40%'", "gpu"), ("kv_growth", "bytes_per_second", "'18 MB/s'", "engine"),
    ("alignment_p95", "seconds", "'1.6s'", "engine"), ("alignment_rate", "rate", "20", "engine"),
    ("pcie", "ratio", "'48%'", "gpu"),
    ("cold_starts", "ratio", "'25%'", "engine"),
)  # fmt: skip
# the targets ramped from the previous phase's end (Phase.<key>_from)
RAMPED = ("gpu_memory", "gpu_utilization", "memory_bandwidth")


class ScenarioError(ValueError):
    """An invalid scenario file; ``str()`` lists ``file:line:col: what -- fix`` lines."""


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


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class _Normaliser:
    """The meaning of a scenario whose shape :class:`RawScenario` accepted: ``raw`` is the document
    as written, ``pos`` its positions, ``file`` its path (``sysfs`` is relative to it)."""

    def __init__(self, file: Path, raw: dict[str, Any], pos: Positions):
        self.file, self.raw, self.pos = file, raw, pos
        self.problems: list[Problem] = []
        self.gpus: list[ScenarioGpu] = []
        self.engine_ids: list[str] = []

    def bad(self, where: tuple, what: str, fix: str) -> None:
        self.problems.append(self.pos.problem(where, what, fix))

    # -- values ----------------------------------------------------------------------
    def dur(self, v: Any, where: tuple) -> float:
        """Seconds of a duration (a number of seconds or a Prometheus duration); 0 if invalid."""
        if _is_number(v) and v >= 0:
            return float(v)
        try:
            return parse_duration(v)
        except ValueError as e:
            self.bad(where, str(e), "write a duration such as '45s' or '2m'")
            return 0.0

    def qty(self, v: Any, unit: str, where: tuple, example: str) -> float:
        """``v`` in ``unit``'s base unit (a ratio 0..1, seconds, bytes, bytes/s; ``rate``: a plain
        number per second); 0 if invalid."""
        if unit == "ratio" and _is_number(v):
            if not 0 <= v <= 1:
                self.bad(where, f"ratio {v} outside 0..1", f"write a fraction or a percentage, e.g. {example}")
            return float(v)
        if unit == "rate":
            if _is_number(v):
                return float(v)
            self.bad(where, f"{v!r} is not a number", f"write observations per second, e.g. {example}")
            return 0.0
        if unit == "seconds" and _is_number(v):
            return float(v)
        try:
            return parse_quantity(v, unit, signed=True)
        except QuantityError as e:
            self.bad(where, e.what, e.fix or f"write e.g. {example}")
            return 0.0

    def gpu_key(self, k: Any, where: tuple) -> str | None:
        """The UUID of the GPU that ``k`` (an index or a UUID) names, or None (reported)."""
        for g in self.gpus:
            if str(k) in (g.uuid, str(g.index)):
                return g.uuid
        uuids = ", ".join(sorted({g.uuid for g in self.gpus}))
        self.bad(where, f"unknown GPU {k!r}", f"use a GPU index or UUID from 'gpus:' ({uuids})")
        return None

    def engine_key(self, k: Any, where: tuple) -> str | None:
        """``k`` as an engine id of 'engines:', or None (reported)."""
        if str(k) in self.engine_ids:
            return str(k)
        ids = ", ".join(sorted(set(self.engine_ids)))
        self.bad(where, f"unknown engine {k!r}", f"use an engine id from 'engines:' ({ids})")
        return None

    # -- sections --------------------------------------------------------------------
    def kind(self) -> None:
        if self.raw.get("kind") != "FuseboxScenario":
            self.bad(("kind",), f"kind is {self.raw.get('kind')!r}", "write 'kind: FuseboxScenario'")

    def tick(self) -> float:
        tick = self.dur(self.raw.get("tick", "1s"), ("tick",))
        if tick <= 0:
            self.bad(("tick",), "tick must be positive", "write e.g. 'tick: 1s'")
            tick = 1.0
        return tick

    def gpu(self, i: int, g: dict[str, Any]) -> ScenarioGpu:
        w = ("gpus", i)
        if g.get("pci_bus_id") is not None and sysfs_bus_id(str(g["pci_bus_id"])) is None:
            self.bad(w + ("pci_bus_id",), f"{g['pci_bus_id']!r} is not a PCI bus id", "write it as NVML does, e.g. '00000000:1B:00.0'")
        pcie = g.get("pcie") or {}
        return ScenarioGpu(
            uuid=str(g["uuid"]), index=int(g.get("index", i)), name=str(g.get("name", "Synthetic GPU")),
            total=int(self.qty(g["memory"], "bytes", w + ("memory",), "'81559 MiB'")),
            reserved=int(self.qty(g.get("reserved", "0 MiB"), "bytes", w + ("reserved",), "'479 MiB'")),
            pcie_gen=int(pcie.get("gen", 5)), pcie_width=int(pcie.get("width", 16)),
            power_idle_w=float(g.get("power_idle_w", 70)), power_max_w=float(g.get("power_max_w", 700)),
            role=str(g.get("role", "")), pci_bus_id=g.get("pci_bus_id"),
        )  # fmt: skip

    def all_gpus(self) -> None:
        self.gpus = [self.gpu(i, g) for i, g in enumerate(self.raw.get("gpus") or [])]
        if not self.gpus:
            self.bad(("gpus",), "no GPUs", "list at least one GPU under 'gpus:'")

    def geometry(self, geo: dict[str, Any], where: tuple) -> KvGeometry | None:
        try:
            return KvGeometry(int(geo["layers"]), int(geo["kv_heads"]), int(geo["head_dim"]),
                              DTYPE_BYTES[str(geo.get("dtype", "float16"))], "scenario")
        except (KeyError, ValueError, TypeError):
            self.bad(where, "kv_geometry needs layers, kv_heads, head_dim and a known dtype",
                     "e.g. {layers: 32, kv_heads: 32, head_dim: 128, dtype: float16}")
            return None

    def engine(self, i: int, e: dict[str, Any]) -> ScenarioEngine | None:
        w = ("engines", i)
        on = [self.gpu_key(x, w + ("gpus", j)) for j, x in enumerate(e.get("gpus") or [])]
        geo = self.geometry(e.get("kv_geometry") or {}, w + ("kv_geometry",))
        if geo is None:
            return None
        block = int(e.get("block_size", 16))
        pool = self.qty(e.get("kv_pool", "0 GB"), "bytes", w + ("kv_pool",), "'40 GiB'")
        blocks = int(pool // (block * geo.bytes_per_token))
        if blocks <= 0:
            self.bad(w + ("kv_pool",), "kv_pool holds no block", "give the pool size, e.g. 'kv_pool: 40 GiB'")
        return ScenarioEngine(str(e["id"]), str(e.get("model", e["id"])), tuple(x for x in on if x), geo, block,
                              blocks, self.qty(e.get("kv_start", "0 GB"), "bytes", w + ("kv_start",), "'8 GB'"))

    def all_engines(self) -> list[ScenarioEngine]:
        engines = [e for i, raw in enumerate(self.raw.get("engines") or []) if (e := self.engine(i, raw)) is not None]
        self.engine_ids = [e.id for e in engines]
        return engines

    def targets(self, ph: dict[str, Any], w: tuple, last: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        """A phase's targets by key: the previous phase's values, updated with the ones it gives
        (one value, not a mapping, is given to every GPU or engine)."""
        vals: dict[str, dict[str, float]] = {}
        for key, unit, example, keyer in TARGETS:
            cur = dict(last[key])
            given = ph.get(key) or {}
            if not isinstance(given, dict):
                given = dict.fromkeys([g.uuid for g in self.gpus] if keyer == "gpu" else self.engine_ids, given)
            for k, v in given.items():
                kk = self.gpu_key(k, w + (key, k)) if keyer == "gpu" else self.engine_key(k, w + (key, k))
                if kk:
                    cur[kk] = self.qty(v, unit, w + (key, k), example)
            vals[key] = cur
        return vals

    def all_phases(self) -> list[Phase]:
        phases: list[Phase] = []
        t = 0.0
        last: dict[str, dict[str, float]] = {key: {} for key, *_ in TARGETS}
        for i, ph in enumerate(self.raw.get("phases") or []):
            w = ("phases", i)
            d = self.dur(ph["duration"], w + ("duration",))
            vals = self.targets(ph, w, last)
            ramp_from = {f"{key}_from": dict(last[key]) if phases else vals[key] for key in RAMPED}
            phases.append(Phase(name=str(ph["name"]), start_s=t, end_s=t + d, description=str(ph.get("description", "")),
                                **vals, **ramp_from))
            last = vals
            t += d
        if not phases:
            self.bad(("phases",), "no phases", "list at least one phase under 'phases:'")
        names = [p.name for p in phases]
        for i, n in enumerate(names):
            if names.index(n) != i:
                self.bad(("phases", i, "name"), f"phase name {n!r} used twice", "give each phase its own name")
        return phases

    def sysfs(self) -> str | None:
        if self.raw.get("sysfs") is None:
            return None
        sysfs = str((self.file.parent / str(self.raw["sysfs"])).resolve())  # relative to the scenario file
        if not Path(sysfs, "devices").is_dir():
            self.bad(("sysfs",), f"{sysfs} holds no devices/ folder", "give a sysfs tree (a copy of /sys with devices/pci*), "
                     "relative to the scenario file, e.g. 'sysfs: sysfs-a300-8'")
        return sysfs

    def run(self) -> Scenario:
        """The scenario, or :class:`ScenarioError` with every problem of its meaning."""
        self.kind()
        tick = self.tick()
        self.all_gpus()
        engines = self.all_engines()
        phases = self.all_phases()
        sysfs = self.sysfs()
        if self.problems:
            raise ScenarioError("\n".join(str(pr) for pr in self.problems))
        raw, p = self.raw, self.file
        meta = raw.get("metadata") or {}
        sc = Scenario(str(meta.get("name", p.stem)), str(meta.get("description", "")), str(raw.get("cluster", "")),
                      str(raw.get("host", "fusebox-scenario")), tick, self.gpus, engines, phases, str(p), sysfs)
        self.fits(sc)
        return sc

    def fits(self, sc: Scenario) -> None:
        """Physical sanity: a GPU's usage may never exceed the card, at any whole second."""
        for g in sc.gpus:
            for k in range(int(sc.duration_s) + 1):
                if sc.device_usage_bytes(g.uuid, k) > g.total:
                    raise ScenarioError(f"{self.file}:{self.pos.at(('gpus',))[0]}:1: GPU {g.uuid} would use more than its memory "
                                        f"at t={k}s -- lower gpu_memory targets or the engines' kv_pool on it")


def _read(p: Path, path: str | Path | None) -> tuple[Any, Positions]:
    """The YAML document at ``p`` and its positions (``path``: as the user gave it)."""
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise ScenarioError(unreadable(path if path is not None else p, err,
                                       f"pass a scenario file, or the name of a packaged one ({', '.join(_packaged())})")) from None
    try:
        return load(text, str(p))
    except SpecError as err:
        raise ScenarioError(str(err)) from None


def _check_shape(p: Path, raw: Any, pos: Positions) -> None:
    """Raise :class:`ScenarioError` unless ``raw`` has the shape of :class:`RawScenario`."""
    if not isinstance(raw, dict):
        raise ScenarioError(f"{p}:1:1: a scenario is a mapping -- start from {REFERENCE}")
    try:
        RawScenario.model_validate(raw)
    except ValidationError as invalid:
        shape: dict[tuple[int, int], Problem] = {}  # a union's members each object: the first one says it
        for detail in invalid.errors():
            pr = pydantic_problem(detail, pos, RawScenario, document="the scenario", reference=REFERENCE)
            shape.setdefault((pr.line, pr.col), pr)
        raise ScenarioError("\n".join(str(pr) for pr in shape.values())) from None


def load_scenario(path: str | Path | None = None) -> Scenario:
    """Load and validate a scenario file (or the packaged one by name, default ``breach``).

    Raises:
        ScenarioError: every problem, as ``file:line:col: what -- how to fix it`` lines.
    """
    p = _scenario_path(path)
    raw, pos = _read(p, path)
    _check_shape(p, raw, pos)
    return _Normaliser(p, raw, pos).run()
