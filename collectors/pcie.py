"""PCIe topology from sysfs, and the utilization of the links several GPUs share.

A GPU's own link can be far from full while the link it shares with its neighbours is saturated:
four GPUs behind one PCIe switch each move 24 % of their own x16 link, and the switch's x16 link
up to the root port carries 96 %. NVML counts each GPU's own throughput
(``nvmlDeviceGetPcieThroughput``); this module says which links carry the sum.

**The walk.** ``/sys/bus/pci/devices/<bdf>`` links to the device's place in the hierarchy,
``/sys/devices/pci<domain>:<bus>/<root port>/<...>/<bdf>``: the first component is the root
complex's host bridge (``pci0000:17``, domain 0000, root bus 0x17), the next its root port, then
every bridge down to the GPU. Each parent is a folder up, so the path is the walk. In a PCIe
hierarchy ports alternate: the root port (on the root bus) faces down; below it sits a switch's
upstream port or an endpoint; below a switch's upstream port (on the switch's internal bus) sit its
downstream ports; and so on. A link therefore joins the components at positions 2k and 2k+1 of the
path after the host bridge (PCI Express Base Specification, "PCI Express Link" and "Switch";
the kernel's ``pci_upstream_bridge``). The GPU's own link is the last one; every link above it is a
link it shares with the GPUs below the same port.

**Each link's capacity** is read, never assumed: ``current_link_speed`` (``"8.0 GT/s PCIe"``,
older kernels ``"8 GT/s"``) and ``current_link_width`` of both ends (the smaller, should they
differ), then the per-lane bytes per second after line encoding
(:data:`PCIE_LANE_BYTES_PER_S`; 8b/10b at 2.5 and 5 GT/s, 128b/130b from
8 GT/s, as the kernel's ``PCIE_SPEED2MBS_ENC``; docs/collectors.md). ``max_link_speed`` /
``max_link_width`` are read too: a link trained below them is logged once (a x16 slot at x8 halves
what the GPUs behind it share). ``numa_node`` is the root port's (``-1`` where the platform gives
none).

The root port's link is always one of them, even where it is the GPU's own (a GPU alone under
its root port), so every root port with a GPU below has a series: the headroom the runbook points
to.

**Utilization of a shared link** = max(sum of the GPUs' transmit, sum of their receive) over the
link's capacity, 0-1, published per link as ``fusebox.gpu.pcie.upstream.utilization``
(``fusebox_gpu_pcie_upstream_utilization_ratio``) with ``pcie.root_complex``, ``pcie.port`` (the
downstream port at the top of the link: the root port for the link every GPU under it shares) and
``numa.node``. Two caveats, both from NVML's counters: traffic of other devices on the link (a NIC
beside the GPUs under a switch) is not counted, so the value is a floor; peer-to-peer traffic
between two GPUs under the same switch is counted though it never crosses the switch's upstream
link, so under heavy P2P the value overstates it.

**Bounds.** At most ``max_gpus`` GPUs are followed and ``max_depth`` components per path; reading
stops at ``deadline_s``. Each GPU not followed is counted by reason (:meth:`PcieTopology.skipped`:
``no_bus_id``, ``not_in_sysfs``, ``over_cap``, ``too_deep``, ``deadline``, ``unreadable``,
``no_upstream_link``: a GPU on the root bus, as in many virtual machines) and logged once per reason.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fusebox import conventions as C

from ._model import Reading

log = logging.getLogger(__name__)
A = C.ATTR

# Usable bytes per second per lane and direction, after line encoding, by PCIe generation: 8b/10b
# at 2.5 and 5 GT/s (generations 1-2), 128b/130b at 8, 16 and 32 GT/s (3-5), none at 64 GT/s
# (generation 6, PAM4 in FLIT mode: 1b/1b, its FLITs' CRC and FEC not subtracted), exactly as the
# Linux kernel's PCIE_SPEED2MBS_ENC (drivers/pci/pci.h) turns a link's speed into bandwidth
# (docs/collectors.md, "PCIe links several GPUs share").
PCIE_LANE_BYTES_PER_S = {
    1: 2.5e9 * 8 / 10 / 8,
    2: 5e9 * 8 / 10 / 8,
    3: 8e9 * 128 / 130 / 8,
    4: 16e9 * 128 / 130 / 8,
    5: 32e9 * 128 / 130 / 8,
    6: 64e9 / 8,
}
# GT/s per lane -> PCIe generation (the keys of PCIE_LANE_BYTES_PER_S).
GT_PER_S_GENERATION = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
MAX_GPUS = 64
MAX_DEPTH = 16
DEADLINE_S = 2.0
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_SPEED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")


def sysfs_bus_id(nvml_bus_id: str) -> str | None:
    """NVML's PCI bus id (``"00000000:1B:00.0"``, domain in 8 hex digits, upper case) as sysfs
    names the device (``"0000:1b:00.0"``); None for anything else."""
    m = re.match(r"^\s*([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])\s*$", nvml_bus_id or "")
    if not m:
        return None
    domain = int(m.group(1), 16)
    if domain > 0xFFFF:
        return None
    return f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def lane_bytes_per_s(speed: str) -> float | None:
    """Usable bytes per second per lane and direction of a sysfs link speed (``"16.0 GT/s PCIe"``,
    ``"8 GT/s"``), after line encoding; None for ``"Unknown"`` or a rate PCIe does not define."""
    m = _SPEED.match(speed or "")
    if not m:
        return None
    gen = GT_PER_S_GENERATION.get(float(m.group(1)))
    return PCIE_LANE_BYTES_PER_S[gen] if gen else None


@dataclass(frozen=True)
class Link:
    """One PCIe link above a GPU's own: ``port`` is the downstream port at its top (a root port or a
    switch's downstream port), ``device`` the component below it (a switch's upstream port).

    Attributes:
        capacity: usable bytes per second per direction at the trained speed and width.
        speed, width: as trained (``current_link_*``); max_speed, max_width: what the ends support.
    """

    root_complex: str
    port: str
    device: str
    numa_node: str
    capacity: float
    speed: str
    width: int
    max_speed: str
    max_width: int

    def attrs(self) -> dict[str, str]:
        return {A["pcie_root_complex"]: self.root_complex, A["pcie_port"]: self.port, A["numa_node"]: self.numa_node}


@dataclass
class PcieTopology:
    """The shared links above a set of GPUs, read once from sysfs (:meth:`read`).

    Attributes:
        links: every link above at least one GPU's own link, by its top port's BDF.
        gpus_below: link port -> the GPUs (their NVML UUIDs) whose traffic crosses it.
    """

    links: dict[str, Link] = field(default_factory=dict)
    gpus_below: dict[str, list[str]] = field(default_factory=dict)
    skip_counts: Counter = field(default_factory=Counter)  # (hw.id, reason) -> 1

    @classmethod
    def read(cls, gpus: Mapping[str, str | None], sysfs: str | os.PathLike = "/sys", *, max_gpus: int = MAX_GPUS,
             max_depth: int = MAX_DEPTH, deadline_s: float = DEADLINE_S,
             clock: Callable[[], float] = time.monotonic) -> PcieTopology:
        """Follow each GPU up to its root complex.

        Args:
            gpus: NVML UUID -> PCI bus id as NVML gives it (``nvmlDeviceGetPciInfo().busId``) or
                in sysfs form; None when NVML gave none.
            sysfs: the sysfs mount (a copied tree in tests).
            max_gpus, max_depth, deadline_s: the bounds (module docstring).

        Never raises for a missing or odd tree: what cannot be followed is counted in
        :meth:`skipped` and logged once per reason.
        """
        topo = cls()
        root = Path(sysfs)
        devices_dir = root / "devices"
        start = clock()
        logged: set[str] = set()
        found: dict[str, Path] | None = None  # BDF -> folder, when the tree has no /bus/pci/devices links

        def skip(uuid: str, reason: str, detail: str) -> None:
            topo.skip_counts[(uuid, reason)] += 1
            if reason not in logged:
                logged.add(reason)
                log.warning("PCIe topology: GPU %s not followed (%s): %s; further GPUs skipped for this reason "
                            "are counted in %s, not logged", uuid, reason, detail, C.PROM_SELF["pcie_skipped"])

        def locate(bdf: str) -> Path:
            """The device's folder: where its bus link points, or (a copied tree without the bus
            links: cp -r, a wheel) the folder of that name under devices/pci*."""
            nonlocal found
            link_path = root / "bus" / "pci" / "devices" / bdf
            if os.path.lexists(link_path):
                return Path(os.path.realpath(link_path))
            if found is None:
                found = _device_dirs(devices_dir, max_depth, start + deadline_s, clock)
            return found.get(bdf, link_path)

        for n, (uuid, raw_bus_id) in enumerate(gpus.items()):
            if n >= max_gpus:
                skip(uuid, "over_cap", f"more than {max_gpus} GPUs")
                continue
            if clock() - start > deadline_s:
                skip(uuid, "deadline", f"reading sysfs took over {deadline_s:g} s")
                continue
            bdf = sysfs_bus_id(raw_bus_id) if raw_bus_id else None
            if bdf is None:
                skip(uuid, "no_bus_id", f"NVML gave no PCI bus id ({raw_bus_id!r})")
                continue
            try:
                why = topo._follow(uuid, bdf, locate(bdf), devices_dir, max_depth)
            except OSError as e:  # a permission or I/O error in the tree
                why = ("unreadable", str(e))
            if why is not None:
                skip(uuid, *why)
        return topo

    def _follow(self, uuid: str, bdf: str, real: Path, devices_dir: Path, max_depth: int) -> tuple[str, str] | None:
        """Add the links above GPU ``uuid`` (at ``real``); (reason, detail) when it cannot be followed."""
        try:
            parts = real.relative_to(os.path.realpath(devices_dir)).parts
        except ValueError:
            return "not_in_sysfs", f"{bdf} is not a device under {devices_dir}"
        if not real.is_dir() or not parts or not _HOST_BRIDGE.match(parts[0]) or parts[-1] != bdf:
            return "not_in_sysfs", f"{bdf} does not lead to a PCI device under {devices_dir}"
        chain = parts[1:]  # root port ... GPU
        if len(chain) > max_depth:
            return "too_deep", f"{len(chain)} components under {parts[0]} (cap {max_depth})"
        if not all(_BDF.match(c) for c in chain):
            return "not_in_sysfs", f"a component of {'/'.join(parts)} is not a PCI device"
        # links: (chain[0], chain[1]), (chain[2], chain[3]) ...; the last one is the GPU's own,
        # kept only when it is the root port's (a GPU alone under its root port)
        shared = [(chain[i], chain[i + 1]) for i in range(0, len(chain) - 1, 2) if i == 0 or i + 2 < len(chain)]
        if not shared:
            return "no_upstream_link", f"{bdf} sits on the root bus of {parts[0]} (no root port above it)"
        for depth, (port, below) in enumerate(shared):
            if port in self.links:
                continue
            path = devices_dir.joinpath(parts[0], *chain[: 2 * depth + 1])
            link = _read_link(parts[0], port, below, path, devices_dir / parts[0] / chain[0])
            if link is None:
                return "unreadable", f"no link speed or width under {path}"
            self.links[port] = link
            if link.width < link.max_width or (lane_bytes_per_s(link.speed) or 0) < (lane_bytes_per_s(link.max_speed) or 0):
                log.warning("PCIe link %s -> %s trained at %s x%d, below its %s x%d: the GPUs behind it "
                            "share less than the slot offers", port, below, link.speed, link.width,
                            link.max_speed, link.max_width)
        for port, _below in shared:
            self.gpus_below.setdefault(port, []).append(uuid)
        return None

    def skipped(self) -> Iterable[tuple[dict, int]]:
        """``({hw.id, reason}, 1)`` per GPU not followed (the self-metric ``fusebox.collector.pcie.skipped``)."""
        for (uuid, reason), n in sorted(self.skip_counts.items()):
            yield {A["gpu_id"]: uuid, A["reason"]: reason}, n

    def readings(self, throughput: Mapping[str, tuple[float, float]]) -> list[Reading]:
        """One ``pcie_upstream_utilization`` reading per shared link.

        Args:
            throughput: NVML UUID -> (transmit, receive) bytes per second this round; a GPU left out
                (down, no PCIe counters) adds nothing, and a link none of whose GPUs answered
                has no reading.
        """
        out = []
        for port, uuids in self.gpus_below.items():
            seen = [throughput[u] for u in uuids if u in throughput]
            if not seen:
                continue
            link = self.links[port]
            tx, rx = sum(t for t, _ in seen), sum(r for _, r in seen)
            out.append(Reading("pcie_upstream_utilization", max(tx, rx) / link.capacity, link.attrs()))
        return out


def _device_dirs(devices_dir: Path, max_depth: int, deadline: float, clock: Callable[[], float]) -> dict[str, Path]:
    """BDF -> folder of every PCI device under ``devices_dir/pci*``, at most ``max_depth`` deep and
    until ``deadline`` (the fallback of a tree without ``bus/pci/devices``)."""
    out: dict[str, Path] = {}
    try:
        stack = [(p, 0) for p in devices_dir.iterdir() if _HOST_BRIDGE.match(p.name) and not p.is_symlink()]
    except OSError:
        return out
    while stack and clock() < deadline:
        folder, depth = stack.pop()
        if depth >= max_depth:
            continue
        try:
            children = [c for c in folder.iterdir() if _BDF.match(c.name) and c.is_dir() and not c.is_symlink()]
        except OSError:
            continue
        for c in children:
            out.setdefault(c.name, Path(os.path.realpath(c)))
            stack.append((c, depth + 1))
    return out


def _attr(path: Path, name: str) -> str | None:
    try:
        return (path / name).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int:
    try:
        return int(text or "")
    except ValueError:
        return 0


def _read_link(root_complex: str, port: str, below: str, port_path: Path, root_port_path: Path) -> Link | None:
    """The link from ``port`` (at ``port_path``) down to ``below``: speed and width read at both
    ends; the NUMA node of the root port (at ``root_port_path``)."""
    below_path = port_path / below
    ends = [p for p in (port_path, below_path) if p.is_dir()]
    caps, speeds, widths = [], [], []
    for p in ends:
        speed, width = _attr(p, "current_link_speed") or "", _int(_attr(p, "current_link_width"))
        lane = lane_bytes_per_s(speed)
        if lane and width > 0:
            caps.append(lane * width)
            speeds.append(speed)
            widths.append(width)
    if not caps:
        return None
    i = caps.index(min(caps))
    max_speeds = [s for s in (_attr(p, "max_link_speed") for p in ends) if s]
    max_widths = [w for w in (_int(_attr(p, "max_link_width")) for p in ends) if w > 0]
    max_speed = min(max_speeds, key=lambda s: lane_bytes_per_s(s) or 0.0) if max_speeds else speeds[i]
    numa = _attr(root_port_path, "numa_node") or "-1"
    return Link(root_complex, port, below, numa, caps[i], speeds[i], widths[i], max_speed,
                min(max_widths) if max_widths else widths[i])
