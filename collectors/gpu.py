"""GPU collector on NVML (nvidia-ml-py), one reading list per round.

The collector takes its NVML module as a parameter (``pynvml`` in production, the replay or
scenario backends of :mod:`fusebox.collectors.replay`, or a test fake): it only calls the
nvidia-ml-py functions listed in :data:`NVML_CALLS`.

Per GPU and per MIG instance it reports (OTel name, unit; Prometheus name after translation):

* ``hw.gpu.memory.usage`` (By) = total - free from the **v2** memory call (docs/pitfalls.md P6: the
  same GPU is above or below 78.3 % depending on the formula; total - free does not depend
  on the API version and includes the driver-reserved part);
* ``hw.gpu.memory.limit`` (By) = total; ``fusebox.gpu.memory.reserved`` (By) = v2 reserved;
* ``hw.gpu.memory.utilization`` (1) = (total - free) / total of that same call, so driver-reserved
  memory counts as used (P6): the ratio the GPU-memory rules read as one series instead of
  dividing the two above (absent while the total is 0);
* ``hw.gpu.utilization`` (1, ``hw.gpu.task=general``) = utilization.gpu / 100;
* ``fusebox.gpu.memory_bandwidth.utilization`` (1) = utilization.memory / 100;
* ``hw.gpu.io`` (By, counter, ``network.io.direction``) = PCIe throughput integrated over time;
* ``fusebox.gpu.pcie.utilization`` (1) = max(tx, rx) / (per-lane bandwidth of the link's max
  generation x max width);
* ``fusebox.gpu.pcie.upstream.utilization`` (1), with ``sysfs`` given: per PCIe link several GPUs
  share (up to their root port), max(sum tx, sum rx) / the link's trained capacity
  (:mod:`fusebox.collectors.pcie`; the topology is read from sysfs once, at :meth:`GpuCollector.open`);
* ``hw.power`` (W) = power usage / 1000;
* ``fusebox.gpu.up`` (1): 1 while NVML answers for the device, 0 when it is lost or errors;
  a down device drops every other series until it answers again.

Each round that fails for a device is counted (:meth:`GpuCollector.error_readings`, exported as
``fusebox.collector.gpu.errors``) with the device's ``hw.id`` and ``hw.gpu.index`` and a ``reason``:
the NVML error's name in snake case (``NVML_ERROR_GPU_IS_LOST`` -> ``gpu_is_lost``), ``unexpected``
for an exception that is not an NVML error (a broken binding).

MIG instances have no utilization, PCIe or power of their own (NVML says NOT_SUPPORTED);
those series are simply absent for them. Compute instances that share a GPU instance report
the same (shared) memory, as nvidia-smi does. A GPU in MIG mode exports no
``hw.gpu.memory.usage`` / ``.limit`` of its own: NVML reports its memory as the aggregate of
its instances, which already carry it (an engine pre-allocating 90 % of each instance would
put the parent at 90 % with no KV pool to correct it, since KV pools join on MIG UUIDs), nor
``hw.gpu.memory.utilization``: each instance reports its own ratio. The
parent keeps ``fusebox.gpu.up``, the reserved memory and its board-level series
(utilization where NVML gives it, PCIe, power).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fusebox import conventions as C

from ._model import Reading
from .pcie import PCIE_LANE_BYTES_PER_S, PcieTopology

A = C.ATTR

# NVML reports PCIe throughput in KB/s (nvmlDeviceGetPcieThroughput); KB = 1024 bytes.
KB = 1024

NVML_CALLS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
)


class NoGpuError(RuntimeError):
    """NVML could not be initialised (no driver, no libnvidia-ml, no device)."""


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass
class _Device:
    handle: Any
    uuid: str
    index: str
    name: str
    mig: bool = False
    parent: str | None = None
    mig_mode: bool = False  # a physical GPU in MIG mode: its instances carry the memory
    pcie_bytes_per_s: float | None = None
    up: bool = True
    last_error: str = ""
    last_reason: str = ""  # the reason label of last_error (error_readings)
    io_total: dict[str, float] = field(default_factory=lambda: {"transmit": 0.0, "receive": 0.0})
    throughput: tuple[float, float] | None = None  # (tx, rx) bytes/s of the last round, None when unread

    def attrs(self) -> dict[str, str]:
        a = {A["gpu_id"]: self.uuid, A["gpu_index"]: self.index, A["gpu_name"]: self.name}
        if self.mig:
            a[A["mig"]] = "true"
            a[A["gpu_parent"]] = self.parent or ""
        return a


class GpuCollector:
    """Collects GPU readings through an nvidia-ml-py-shaped module.

    Args:
        nvml: ``pynvml`` or any object with the functions in :data:`NVML_CALLS`, the
            ``NVMLError`` class and the ``nvmlMemory_v2``, ``NVML_PCIE_UTIL_TX_BYTES``,
            ``NVML_PCIE_UTIL_RX_BYTES``, ``NVML_DEVICE_MIG_ENABLE`` constants.
        clock: monotonic seconds, used to integrate PCIe throughput into ``hw.gpu.io``.
        sysfs: the sysfs mount to read the GPUs' PCIe topology from (``/sys``; a copied tree in
            tests), or None for no shared-link readings (:mod:`fusebox.collectors.pcie`).

    NVML is initialised once (:meth:`open`) and device handles are cached: re-initialising
    per poll multiplies its cost. :meth:`collect` never raises for a device
    error; it reports the device as down.

    Raises:
        NoGpuError: from :meth:`open` when NVML cannot be initialised or sees no device.
    """

    def __init__(self, nvml: Any, *, clock: Callable[[], float] = time.monotonic, sysfs: str | None = None):
        self.nvml = nvml
        self.clock = clock
        self.sysfs = sysfs
        self.topology: PcieTopology | None = None
        self.devices: list[_Device] = []
        self._opened = False
        self._last_t: float | None = None
        self.errors = 0  # failed device rounds, all GPUs
        self.error_counts: Counter = Counter()  # (hw.id, hw.gpu.index, reason) -> failed rounds

    # -- setup -------------------------------------------------------------------------
    def open(self) -> GpuCollector:
        if self._opened:
            return self
        nv = self.nvml
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, OSError ...
            raise NoGpuError(f"NVML could not be initialised: {e}") from e
        if count == 0:
            raise NoGpuError("NVML found no GPU")
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                dev = _Device(h, _s(nv.nvmlDeviceGetUUID(h)), str(i), _s(nv.nvmlDeviceGetName(h)))
            except nv.NVMLError as e:
                # keep a placeholder so the index is reported down rather than vanishing
                self.devices.append(_Device(None, f"unknown-gpu-{i}", str(i), "", up=False, last_error=str(e),
                                            last_reason=error_reason(nv, e)))
                continue
            dev.pcie_bytes_per_s = self._link_bandwidth(h)
            self.devices.append(dev)
            self.devices.extend(self._mig_devices(dev))
        if self.sysfs is not None:
            self.topology = PcieTopology.read(
                {d.uuid: self._bus_id(d.handle) for d in self.devices if not d.mig and d.handle is not None}, self.sysfs)
        self._opened = True
        return self

    def _bus_id(self, h: Any) -> str | None:
        try:
            return _s(self.nvml.nvmlDeviceGetPciInfo(h).busId)
        except Exception:  # NVMLError (NOT_SUPPORTED), a binding without the call: counted as no_bus_id
            return None

    def close(self) -> None:
        if self._opened:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self._opened = False

    def __enter__(self) -> GpuCollector:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _link_bandwidth(self, h: Any) -> float | None:
        nv = self.nvml
        try:
            gen = int(nv.nvmlDeviceGetMaxPcieLinkGeneration(h))
            width = int(nv.nvmlDeviceGetMaxPcieLinkWidth(h))
        except nv.NVMLError:
            return None
        lane = PCIE_LANE_BYTES_PER_S.get(gen)
        return lane * width if lane and width > 0 else None

    def _mig_devices(self, parent: _Device) -> list[_Device]:
        nv = self.nvml
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(parent.handle)
        except nv.NVMLError:
            return []  # not MIG capable (NOT_SUPPORTED)
        if current != nv.NVML_DEVICE_MIG_ENABLE:
            return []
        parent.mig_mode = True
        out = []
        try:
            n = nv.nvmlDeviceGetMaxMigDeviceCount(parent.handle)
        except nv.NVMLError:
            return []
        for j in range(n):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, j)
                uuid = _s(nv.nvmlDeviceGetUUID(mh))
                name = _s(nv.nvmlDeviceGetName(mh))
            except nv.NVMLError:
                continue  # slot not populated (NOT_FOUND)
            out.append(_Device(mh, uuid, f"{parent.index}:{j}", name, mig=True, parent=parent.uuid))
        return out

    # -- one round ----------------------------------------------------------------------
    def collect(self) -> list[Reading]:
        """One round of readings for every device, in device order.

        Returns:
            list of :class:`Reading`; a down device contributes only ``gpu_up`` = 0.
        """
        if not self._opened:
            self.open()
        now = self.clock()
        dt = 0.0 if self._last_t is None else max(0.0, now - self._last_t)
        self._last_t = now
        out: list[Reading] = []
        for dev in self.devices:
            dev.throughput = None
            out.extend(self._collect_device(dev, dt))
        if self.topology is not None:
            out.extend(self.topology.readings({d.uuid: d.throughput for d in self.devices if d.throughput}))
        return out

    def pcie_skipped(self) -> Iterable[tuple[dict, int]]:
        """GPUs whose PCIe topology was not followed, ``({hw.id, reason}, 1)`` (empty without ``sysfs``)."""
        return self.topology.skipped() if self.topology is not None else ()

    def _collect_device(self, dev: _Device, dt: float) -> list[Reading]:
        nv = self.nvml
        attrs = dev.attrs()
        if dev.handle is None:
            self.errors += 1
            self.error_counts[(dev.uuid, dev.index, dev.last_reason or "unexpected")] += 1
            return [Reading("gpu_up", 0.0, attrs)]
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(dev.handle, version=nv.nvmlMemory_v2)
            reserved = float(mem.reserved)
        except nv.NVMLError as e:
            if _code(nv, e) in _unsupported(nv):
                try:  # v1: total and free are still right; reserved is unknown
                    mem = nv.nvmlDeviceGetMemoryInfo(dev.handle)
                    reserved = None
                except nv.NVMLError as e2:
                    return self._down(dev, attrs, e2)
            else:
                return self._down(dev, attrs, e)
        except Exception as e:  # a broken binding must not kill the loop
            return self._down(dev, attrs, e)
        dev.up, dev.last_error = True, ""
        total, free = float(mem.total), float(mem.free)
        r = [Reading("gpu_up", 1.0, attrs)]
        if not dev.mig_mode:
            # a MIG-mode parent reports the aggregate of its instances; exporting it beside
            # them would double the memory signal, with no KV pool joined on the parent UUID
            r += [Reading("gpu_memory_usage", total - free, attrs), Reading("gpu_memory_limit", total, attrs)]
            if total > 0:  # the same division the rules made of the two series (IEEE, so the same value)
                r.append(Reading("gpu_memory_ratio", (total - free) / total, attrs))
        if reserved is not None:
            r.append(Reading("gpu_memory_reserved", reserved, attrs))
        try:
            util = nv.nvmlDeviceGetUtilizationRates(dev.handle)
            r.append(Reading("gpu_utilization", util.gpu / 100.0, {**attrs, A["gpu_task"]: "general"}))
            r.append(Reading("gpu_memory_bandwidth_utilization", util.memory / 100.0, attrs))
        except nv.NVMLError as e:
            if self._lost(nv, e):
                return self._down(dev, attrs, e)
        if not dev.mig:
            try:
                tx = float(nv.nvmlDeviceGetPcieThroughput(dev.handle, nv.NVML_PCIE_UTIL_TX_BYTES)) * KB
                rx = float(nv.nvmlDeviceGetPcieThroughput(dev.handle, nv.NVML_PCIE_UTIL_RX_BYTES)) * KB
                dev.throughput = (tx, rx)
                dev.io_total["transmit"] += tx * dt
                dev.io_total["receive"] += rx * dt
                for direction, total_b in dev.io_total.items():
                    r.append(Reading("gpu_io", total_b, {**attrs, A["io_direction"]: direction}))
                if dev.pcie_bytes_per_s:
                    r.append(Reading("gpu_pcie_utilization", max(tx, rx) / dev.pcie_bytes_per_s, attrs))
            except nv.NVMLError as e:
                if self._lost(nv, e):
                    return self._down(dev, attrs, e)
            try:
                r.append(Reading("gpu_power", float(nv.nvmlDeviceGetPowerUsage(dev.handle)) / 1000.0, attrs))
            except nv.NVMLError as e:
                if self._lost(nv, e):
                    return self._down(dev, attrs, e)
        return r

    def _lost(self, nv: Any, e: Exception) -> bool:
        return _code(nv, e) not in _unsupported(nv)

    def _down(self, dev: _Device, attrs: dict, e: Exception) -> list[Reading]:
        self.errors += 1
        dev.up, dev.last_error, dev.last_reason = False, str(e) or type(e).__name__, error_reason(self.nvml, e)
        self.error_counts[(dev.uuid, dev.index, dev.last_reason)] += 1
        return [Reading("gpu_up", 0.0, attrs)]

    def error_readings(self) -> Iterable[tuple[dict, int]]:
        """``({hw.id, hw.gpu.index, reason}, failed rounds)`` per GPU and reason, since start (a
        counter: a GPU that is back keeps its count)."""
        for (uuid, index, reason), n in sorted(self.error_counts.items()):
            yield {A["gpu_id"]: uuid, A["gpu_index"]: index, A["reason"]: reason}, n


def error_reason(nv: Any, e: Exception) -> str:
    """The ``reason`` label of a failed NVML call: the error's name in snake case.

    nvidia-ml-py raises a subclass per code (``NVMLError_GpuIsLost`` for NVML_ERROR_GPU_IS_LOST ->
    ``gpu_is_lost``; an unknown code is ``NVMLError_Unknown`` -> ``unknown``); a module without those
    subclasses is looked up by code among its ``NVML_ERROR_*`` constants; anything that is not an
    NVML error is ``unexpected``.
    """
    error_cls = getattr(nv, "NVMLError", None)
    if not (isinstance(error_cls, type) and isinstance(e, error_cls)):
        return "unexpected"
    name = type(e).__name__
    if name.startswith("NVMLError_"):
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.removeprefix("NVMLError_")).lower()
    code = _code(nv, e)
    for attr in dir(nv):
        if attr.startswith("NVML_ERROR_") and getattr(nv, attr) == code:
            return attr.removeprefix("NVML_ERROR_").lower()
    return "nvml_error"


def _code(nv: Any, e: Exception) -> int | None:
    return getattr(e, "value", None)


def _unsupported(nv: Any) -> tuple:
    return (
        getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3),
        getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13),
    )
