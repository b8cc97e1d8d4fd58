"""Replay backends: nvidia-smi captures (and the scenario) behind an NVML-shaped module.

The GPU collector runs unchanged on machines without a GPU: :class:`SyntheticNvml` answers
the nvidia-ml-py calls of :data:`fusebox.collectors.gpu.NVML_CALLS` from
:class:`DeviceState` records, which come from

* ``nvidia-smi -q -x`` XML (:func:`parse_smi_xml`; MIG devices from ``<mig_devices>``),
* ``nvidia-smi --query-gpu=... --format=csv`` output, with or without units in the header,
  with ``[N/A]`` fields and with an extra leading column such as ``time [s]``
  (:func:`parse_query_gpu_csv`; several rows for one UUID become successive frames),
* nvidia_gpu_exporter multi-section captures (:func:`parse_exporter_capture`): the
  ``query-gpu`` CSV of the ``load`` (or ``idle``) section, plus the MIG devices listed in
  that section's ``nvidia-smi -q`` text,
* the scenario (:mod:`fusebox.collectors.scenario`), which builds states itself.

All memory figures in captures are MiB and are multiplied by 1,048,576 (docs/pitfalls.md P7).
MIG devices in captures carry no UUID of their own; they get the driver's legacy MIG
identifier ``MIG-<GPU UUID>/<GPU instance id>/<compute instance id>``, which is unique.
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pynvml  # pure Python; it loads libnvidia-ml only in nvmlInit

MIB = 1_048_576


class ReplayError(ValueError):
    """A capture that cannot be replayed (unknown format, missing memory fields)."""


@dataclass(frozen=True)
class DeviceState:
    """What NVML would answer for one device at one moment. Bytes, percent, watts, KB/s."""

    uuid: str
    index: int
    name: str
    total: int
    free: int
    used: int | None = None
    reserved: int | None = None
    util_gpu: float | None = None  # percent 0-100
    util_mem: float | None = None  # percent 0-100
    power_w: float | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    tx_kbps: float | None = None  # KB/s, as NVML reports
    rx_kbps: float | None = None
    pci_bus_id: str | None = None  # as NVML gives it, "00000000:1B:00.0"
    mig: tuple[DeviceState, ...] = ()
    lost: bool = False


# ------------------------------------------------------------------------- parsing helpers
_NUM = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)")


def _num(text: str | None) -> float | None:
    """``"24564 MiB"`` -> 24564.0, ``"[N/A]"``/``"N/A"``/``""`` -> None."""
    if text is None:
        return None
    m = _NUM.match(text.strip())
    return float(m.group(1)) if m else None


def _mib(text: str | None) -> int | None:
    v = _num(text)
    return None if v is None else int(round(v * MIB))


def _width(text: str | None) -> int | None:
    v = _num((text or "").replace("x", ""))
    return None if v is None else int(v)


# ------------------------------------------------------------------------- nvidia-smi -q -x
def parse_smi_xml(text: str, source: str = "<xml>") -> list[DeviceState]:
    """Devices of one ``nvidia-smi -q -x`` document.

    Raises:
        ReplayError: not XML, or a GPU without ``fb_memory_usage`` total/free.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise ReplayError(f"{source}: not nvidia-smi XML ({e})") from e
    out = []
    for i, g in enumerate(root.findall("gpu")):
        uuid = (g.findtext("uuid") or "").strip()
        index = int(_num(g.findtext("minor_number")) or i)
        fb = g.find("fb_memory_usage")
        if fb is None:
            raise ReplayError(f"{source}: GPU {uuid or i} has no fb_memory_usage total/free")
        total, free = _mib(fb.findtext("total")), _mib(fb.findtext("free"))
        if total is None or free is None:
            raise ReplayError(f"{source}: GPU {uuid or i} has no fb_memory_usage total/free")
        migs = []
        for md in g.findall("mig_devices/mig_device"):
            # a MIG device without memory figures is left out, as in the exporter's -q text
            mfb = md.find("fb_memory_usage")
            if mfb is None:
                continue
            mtotal, mfree = _mib(mfb.findtext("total")), _mib(mfb.findtext("free"))
            if mtotal is None or mfree is None:
                continue
            gi, ci = md.findtext("gpu_instance_id", "").strip(), md.findtext("compute_instance_id", "").strip()
            migs.append(
                DeviceState(
                    uuid=f"MIG-{uuid}/{gi}/{ci}",
                    index=int(_num(md.findtext("index")) or 0),
                    name=f"{(g.findtext('product_name') or '').strip()} MIG {gi}/{ci}",
                    total=mtotal,
                    free=mfree,
                    used=_mib(mfb.findtext("used")),
                    reserved=_mib(mfb.findtext("reserved")),
                )
            )
        util = g.find("utilization")
        pci = g.find("pci")
        power = g.find("power_readings")
        if power is None:
            power = g.find("gpu_power_readings")
        out.append(
            DeviceState(
                uuid=uuid,
                index=index,
                name=(g.findtext("product_name") or "").strip(),
                total=total,
                free=free,
                used=_mib(fb.findtext("used")),
                reserved=_mib(fb.findtext("reserved")),
                util_gpu=_num(util.findtext("gpu_util")) if util is not None else None,
                util_mem=_num(util.findtext("memory_util")) if util is not None else None,
                power_w=_num(power.findtext("power_draw")) if power is not None else None,
                pcie_gen_max=int(_num(pci.findtext("pci_gpu_link_info/pcie_gen/max_link_gen")) or 0) or None
                if pci is not None
                else None,
                pcie_width_max=_width(pci.findtext("pci_gpu_link_info/link_widths/max_link_width"))
                if pci is not None
                else None,
                tx_kbps=_num(pci.findtext("tx_util")) if pci is not None else None,
                rx_kbps=_num(pci.findtext("rx_util")) if pci is not None else None,
                pci_bus_id=(pci.findtext("pci_bus_id") or "").strip() or None if pci is not None else None,
                mig=tuple(migs),
            )
        )
    if not out:
        raise ReplayError(f"{source}: no <gpu> element")
    return out


# ------------------------------------------------------------------------- --query-gpu CSV
def _field(row: dict[str, str], name: str) -> str | None:
    return row.get(name)


def parse_query_gpu_csv(text: str, source: str = "<csv>") -> list[list[DeviceState]]:
    """Frames of devices from ``nvidia-smi --query-gpu=... --format=csv`` output.

    Header names may carry units (``memory.used [MiB]``) and values may carry them too
    (``"59648 MiB"``); ``[N/A]`` reads as missing. Total memory comes from
    ``memory.total`` or, when the query left it out, from reserved + used + free (the P100
    capture). Each row for a UUID already seen starts a new frame.

    Raises:
        ReplayError: no ``uuid`` column, or no way to get total and free memory.
    """
    rows = list(csv.reader(io.StringIO(text.strip()), skipinitialspace=True))
    if not rows:
        raise ReplayError(f"{source}: empty CSV")
    header = [re.sub(r"\s*\[.*?\]\s*$", "", h.strip()) for h in rows[0]]
    if "uuid" not in header:
        raise ReplayError(f"{source}: line 1: no 'uuid' column in the --query-gpu header")
    frames: list[list[DeviceState]] = [[]]
    for lineno, raw in enumerate(rows[1:], start=2):
        if not raw or all(not c.strip() for c in raw):
            continue
        row = {h: v.strip() for h, v in zip(header, raw, strict=False)}
        total = _mib(row.get("memory.total"))
        free = _mib(row.get("memory.free"))
        used = _mib(row.get("memory.used"))
        reserved = _mib(row.get("memory.reserved"))
        if total is None and free is not None and used is not None and reserved is not None:
            total = free + used + reserved
        if total is None or free is None:
            raise ReplayError(
                f"{source}: line {lineno}: needs memory.total and memory.free "
                "(or memory.reserved + memory.used + memory.free) -- add them to --query-gpu"
            )
        tx = rx = None
        index = _num(row.get("index"))
        dev = DeviceState(
            uuid=row["uuid"],
            index=int(index) if index is not None else len(frames[-1]),
            name=row.get("name", ""),
            total=total,
            free=free,
            used=used,
            reserved=reserved,
            util_gpu=_num(row.get("utilization.gpu")),
            util_mem=_num(row.get("utilization.memory")),
            power_w=_num(row.get("power.draw")),
            pcie_gen_max=int(_num(row.get("pcie.link.gen.max")) or 0) or None,
            pcie_width_max=int(_num(row.get("pcie.link.width.max")) or 0) or None,
            tx_kbps=tx,
            rx_kbps=rx,
        )
        if any(d.uuid == dev.uuid for d in frames[-1]):
            frames.append([])
        frames[-1].append(dev)
    if not frames[0]:
        raise ReplayError(f"{source}: no data rows")
    return frames


# ------------------------------------------------------------------------- exporter capture
_SECTION = re.compile(r"^# (\w+) :: (.+)$")


def _sections(text: str) -> dict[str, str]:
    """``{"load :: query-gpu (csv, ...)": body}`` of an nvidia_gpu_exporter capture."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    cur: str | None = None
    body: list[str] = []
    for i, line in enumerate(lines):
        m = _SECTION.match(line)
        if m and i > 0 and lines[i - 1].startswith("####"):
            if cur:
                out[cur] = "\n".join(body)
            cur, body = f"{m.group(1)} :: {m.group(2)}", []
            continue
        if cur is not None and not line.startswith("####") and not line.startswith("# $"):
            body.append(line)
    if cur:
        out[cur] = "\n".join(body)
    return out


def _mig_from_q_text(text: str, parent_uuid: str, parent_name: str) -> list[DeviceState]:
    """MIG devices from ``nvidia-smi -q`` text (``MIG Device`` blocks)."""
    out = []
    for block in re.split(r"\n    MIG Device\n", text)[1:]:
        block = block.split("\n    Accounting Mode")[0]

        def get(label: str, within: str = block) -> str | None:
            m = re.search(rf"^\s*{re.escape(label)}\s*:\s*(.*)$", within, re.M)
            return m.group(1).strip() if m else None

        fb = block.split("FB Memory Usage", 1)[1] if "FB Memory Usage" in block else ""
        gi, ci = get("GPU Instance ID"), get("Compute Instance ID")
        total, free = _mib(get("Total", fb)), _mib(get("Free", fb))
        if total is None or free is None:
            continue
        out.append(
            DeviceState(
                uuid=f"MIG-{parent_uuid}/{gi}/{ci}",
                index=int(_num(get("Index")) or 0),
                name=f"{parent_name} MIG {gi}/{ci}",
                total=total,
                free=free,
                used=_mib(get("Used", fb)),
                reserved=_mib(get("Reserved", fb)),
            )
        )
    return out


def parse_exporter_capture(text: str, section: str = "load", source: str = "<capture>") -> list[DeviceState]:
    """Devices of one section (``load`` or ``idle``) of an nvidia_gpu_exporter capture.

    Raises:
        ReplayError: the capture has no ``<section> :: query-gpu`` part.
    """
    secs = _sections(text)
    key = next((k for k in secs if k.startswith(f"{section} :: query-gpu")), None)
    if key is None:
        raise ReplayError(f"{source}: no '{section} :: query-gpu' section (try section 'idle' or 'load')")
    devices = parse_query_gpu_csv(secs[key], source=f"{source} [{key}]")[0]
    qkey = next((k for k in secs if k.startswith(f"{section} :: query (-q)")), None)
    if qkey:
        devices = [
            replace(d, mig=tuple(_mig_from_q_text(secs[qkey], d.uuid, d.name))) if len(devices) == 1 else d
            for d in devices
        ]
    return devices


def load_replay(path: str | Path, section: str = "load") -> list[list[DeviceState]]:
    """Frames of device states from any supported capture file (format detected by content).

    Raises:
        ReplayError: unreadable or unsupported file, with the path in the message.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        from fusebox.spec.errors import unreadable

        raise ReplayError(unreadable(p, e, "pass --replay with a capture file (nvidia-smi -q -x XML or "
                                           "--query-gpu CSV; docs/collectors.md lists every format)")) from e
    head = text.lstrip()[:200]
    if head.startswith("<?xml") or head.startswith("<nvidia_smi_log"):
        return [parse_smi_xml(text, str(p))]
    if "nvidia_gpu_exporter GPU capture" in head or ":: query-gpu" in text:
        return [parse_exporter_capture(text, section, str(p))]
    first = head.splitlines()[0] if head else ""
    if "," not in first or "uuid" not in first.lower():
        raise ReplayError(
            f"{p}: not a capture this replay reads; it accepts `nvidia-smi -q -x` XML, "
            "`nvidia-smi --query-gpu=...,uuid,memory.total,memory.used,memory.free... --format=csv` output, "
            "or an nvidia_gpu_exporter capture")
    return parse_query_gpu_csv(text, str(p))


# ------------------------------------------------------------------------- NVML-shaped module
@dataclass
class _Handle:
    index: int
    mig: int | None = None


@dataclass
class _Mem:
    total: int
    free: int
    used: int
    reserved: int
    version: int = pynvml.nvmlMemory_v2


@dataclass
class _PciInfo:
    busId: str  # noqa: N815 -- nvmlPciInfo_t's field


@dataclass
class _Util:
    gpu: int
    memory: int


def _err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class SyntheticNvml:
    """An nvidia-ml-py-shaped module answering from ``states()``, a callable returning the
    current list of :class:`DeviceState` (the replay frame or the scenario's time).

    Missing fields answer ``NVMLError_NotSupported`` as the driver would; a state with
    ``lost=True`` answers ``NVMLError_GPUIsLost`` to every call on it. It is also the NVML fake
    of the tests: ``init_error`` (an ``NVML_ERROR_*`` code) makes ``nvmlInit`` fail as on a
    machine without the driver, ``legacy_bytes`` answers UUIDs and names as ``bytes`` as
    nvidia-ml-py before 11.515 did, and :attr:`memory_versions` records the ``version``
    argument of every ``nvmlDeviceGetMemoryInfo`` call (None = the v1 call).
    """

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_DEVICE_MIG_DISABLE = pynvml.NVML_DEVICE_MIG_DISABLE
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST

    def __init__(self, states: Callable[[], Sequence[DeviceState]], *, init_error: int | None = None,
                 legacy_bytes: bool = False):
        self._states = states
        self.init_error = init_error
        self.legacy_bytes = legacy_bytes
        self.calls = 0
        self.inits = 0
        self.memory_versions: list[int | None] = []

    # -- frame-driven constructors
    @classmethod
    def from_frames(cls, frames: list[list[DeviceState]]) -> SyntheticNvml:
        """Replays ``frames`` in order, one per :meth:`advance`, looping at the end."""
        pos = [0]
        nv = cls(lambda: frames[pos[0] % len(frames)])
        nv._pos = pos  # type: ignore[attr-defined]
        return nv

    def advance(self) -> None:
        pos = getattr(self, "_pos", None)
        if pos is not None:
            pos[0] += 1

    # -- helpers
    def _dev(self, h: _Handle) -> DeviceState:
        self.calls += 1
        states = self._states()
        if h.index >= len(states):
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        d = states[h.index]
        if h.mig is not None:
            if d.lost:
                raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
            if h.mig >= len(d.mig):
                raise _err(pynvml.NVML_ERROR_NOT_FOUND)
            d = d.mig[h.mig]
        if d.lost:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        return d

    # -- the nvidia-ml-py surface
    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise _err(self.init_error)

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self._states())

    def nvmlDeviceGetHandleByIndex(self, i: int) -> _Handle:
        if i >= len(self._states()):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(i)

    def nvmlDeviceGetUUID(self, h: _Handle) -> str | bytes:
        uuid = self._dev(h).uuid
        return uuid.encode() if self.legacy_bytes else uuid

    def nvmlDeviceGetName(self, h: _Handle) -> str | bytes:
        name = self._dev(h).name
        return name.encode() if self.legacy_bytes else name

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: int | None = None) -> _Mem:
        self.memory_versions.append(version)
        d = self._dev(h)
        reserved = d.reserved or 0
        used = d.used if d.used is not None else max(0, d.total - d.free - reserved)
        if not version:  # v1 folds reserved into used (docs/pitfalls.md P6)
            return _Mem(d.total, d.free, d.total - d.free, 0, 0)
        return _Mem(d.total, d.free, used, reserved)

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> _Util:
        d = self._dev(h)
        if h.mig is not None or d.util_gpu is None or d.util_mem is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _Util(int(round(d.util_gpu)), int(round(d.util_mem)))

    def nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        d = self._dev(h)
        v = d.tx_kbps if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else d.rx_kbps
        if h.mig is not None or v is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(v)

    def nvmlDeviceGetPciInfo(self, h: _Handle) -> _PciInfo:
        d = self._dev(h)
        if h.mig is not None or not d.pci_bus_id:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _PciInfo(d.pci_bus_id)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: _Handle) -> int:
        d = self._dev(h)
        if not d.pcie_gen_max:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return d.pcie_gen_max

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: _Handle) -> int:
        d = self._dev(h)
        if not d.pcie_width_max:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return d.pcie_width_max

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        d = self._dev(h)
        if h.mig is not None or d.power_w is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(round(d.power_w * 1000))

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        d = self._dev(h)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if d.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:
        return len(self._dev(h).mig)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, j: int) -> _Handle:
        d = self._dev(h)
        if j >= len(d.mig):
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(h.index, j)
