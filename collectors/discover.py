"""Engine discovery for ``fusebox collect kv|latency --discover FILE --node-name NODE``.

Each round, :class:`Discovery` turns what the pod watcher (:mod:`.podwatch`: the Kubernetes API)
and the kubelet (:mod:`.podresources`: which GPUs each pod holds) say into :class:`Target` s: one
per engine pod on this node, with its ``engine`` id ``namespace/pod``, its /metrics URL
``http://<pod IP>:<port><path>`` (a port name is looked up in the pod's container ports) and the
``hw.id`` s of its devices. At most ``max_engines`` are kept (sorted by namespace and name; the
rest are counted, reason ``over_cap``), a pod without an IP or without the named port is counted
and skipped (``no_pod_ip``, ``no_port``). Counts concern pods present now: a pod that is gone
takes its counts with it, so nothing grows with the churn of pods.

:class:`DiscoveredKv` keeps one :class:`~fusebox.collectors.kvcache.KvCollector` per target (the
same parsing and byte computation as ``--endpoint``, the model's geometry looked up in the engines
file by the engine's ``model_name``); :class:`DiscoveredLatency` one
:class:`~fusebox.collectors.latency.EngineHistogramFallback` per target. A target that is gone is
dropped in the round that no longer sees it, with its series and counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fusebox import conventions as C

from ._model import Reading
from .engines import EnginesConfig
from .kvcache import KvCollector
from .podresources import PodDevices
from .podwatch import PodInfo

A = C.ATTR
DEFAULT_MAX_ENGINES = 64  # per node: 8 GPUs x 7 MIG slices is 56; more is a wrong selector


@dataclass(frozen=True)
class Target:
    """One engine pod to scrape: ``engine`` = ``namespace/pod``, its pod ``uid``, the /metrics
    ``url`` and the ``hw.id`` s of the devices it holds (empty when the kubelet named none)."""

    engine: str
    uid: str
    url: str
    hw_ids: tuple[str, ...]


def metrics_url(pod: PodInfo, port: str | int, path: str) -> str | None:
    """``http://<pod IP>:<port><path>``; ``port`` a number or a container port name of the pod
    (None when the pod has no port of that name). An IPv6 pod IP is bracketed."""
    num = port if isinstance(port, int) else pod.ports.get(port)
    if num is None and isinstance(port, str) and port.isdigit():
        num = int(port)
    if num is None:
        return None
    host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
    return f"http://{host}:{num}{path}"


class Discovery:
    """The engine pods of this node each round (see the module docstring).

    Args:
        config: the engines file.
        watcher: a started :class:`~fusebox.collectors.podwatch.PodWatcher` (or anything with
            ``engines()``, ``without_ip()``, ``errors``).
        devices: ``() -> {(namespace, pod): PodDevices} | None`` (the kubelet's ``List``; None
            when it failed), or None for no device source.
        device_errors: ``() -> [({endpoint, reason}, count)]`` of that source.
        max_engines: the most engine pods scraped on this node.
        log: hears each pod that is skipped, once per pod and reason.
    """

    def __init__(self, config: EnginesConfig, watcher: Any, *,
                 devices: Callable[[], dict[tuple[str, str], PodDevices] | None] | None = None,
                 device_errors: Callable[[], Sequence[tuple[dict, int]]] | None = None,
                 max_engines: int = DEFAULT_MAX_ENGINES, log: Callable[[str], None] | None = None):
        self.config = config
        self.watcher = watcher
        self.devices = devices
        self.device_errors = device_errors
        self.max_engines = max_engines
        self.log = log
        self.skipped: Counter = Counter()  # (engine, reason) -> rounds
        self._known: dict[tuple[str, str], tuple[str, PodDevices]] = {}  # (ns, pod) -> (uid, devices)
        self._told: set[tuple[str, str]] = set()

    def _skip(self, engine: str, reason: str, message: str) -> None:
        self.skipped[(engine, reason)] += 1
        if (engine, reason) not in self._told:
            self._told.add((engine, reason))
            if self.log:
                self.log(f"discovery: pod {engine}: {message}")

    def targets(self) -> list[Target]:
        """This round's targets; counts the pods skipped."""
        pods: list[PodInfo] = list(self.watcher.engines())
        present = {p.engine_id for p in pods} | {p.engine_id for p in self.watcher.without_ip()}
        for p in self.watcher.without_ip():
            self._skip(p.engine_id, "no_pod_ip", f"{p.phase} without a pod IP yet: not scraped until it has one")
        devs = self.devices() if self.devices else None
        if devs is not None:
            self._known = {k: (uid, d) for k, (uid, d) in self._known.items() if k in devs}
        out: list[Target] = []
        for p in pods:
            url = metrics_url(p, self.config.port, self.config.path)
            if url is None:
                self._skip(p.engine_id, "no_port",
                           f"has no container port named {self.config.port!r} (its ports: "
                           f"{', '.join(sorted(p.ports)) or 'none'}) -- set kubernetes.engines.port to the port "
                           "serving /metrics")
                continue
            if len(out) >= self.max_engines:
                self._skip(p.engine_id, "over_cap",
                           f"over --max-engines {self.max_engines} engine pods on this node: not scraped -- check "
                           "kubernetes.engines.selector, or raise --max-engines")
                continue
            key = (p.namespace, p.name)
            if devs is not None and key in devs:
                self._known[key] = (p.uid, devs[key])
            known = self._known.get(key)
            # devices of a pod never change while it lives; a failed List keeps the last answer
            hw = known[1].hw_ids if known and known[0] == p.uid else ()
            out.append(Target(p.engine_id, p.uid, url, hw))
        # a pod that is gone takes its counts and its notice with it
        self.skipped = Counter({k: v for k, v in self.skipped.items() if k[0] in present})
        self._told = {k for k in self._told if k[0] in present}
        self._known = {k: v for k, v in self._known.items() if f"{k[0]}/{k[1]}" in present}
        return out

    def skipped_readings(self) -> list[tuple[dict, int]]:
        """``({engine, reason}, rounds)`` of the pods skipped (present pods only)."""
        return [({A["engine"]: e, A["reason"]: r}, n) for (e, r), n in sorted(self.skipped.items())]

    def error_readings(self) -> list[tuple[dict, int]]:
        """``({endpoint, reason}, count)``: the Kubernetes API's (endpoint ``kubernetes``) and the
        device source's failures."""
        out = [({A["endpoint"]: "kubernetes", A["reason"]: r}, n)
               for r, n in sorted(getattr(self.watcher, "errors", Counter()).items())]
        return out + list(self.device_errors() if self.device_errors else ())


NO_GPU_FIX = ("the kubelet's pod-resources API names no nvidia.com/gpu or nvidia.com/mig-* device for this pod: check "
              "that the pod requests its GPUs as resources and that the collector mounts "
              "/var/lib/kubelet/pod-resources (fusebox_collector_discovery_errors_total says when the socket fails)")


class _PerPod:
    """One scraper per pod in :attr:`per_pod` (uid -> (target, scraper)); their counts merged."""

    per_pod: dict[str, tuple[Target, Any]]

    def _merged(self, attr: str) -> list[tuple[dict, int]]:
        out: list[tuple[dict, int]] = []
        for _t, scraper in self.per_pod.values():
            out.extend(getattr(scraper, attr)())
        return out

    def error_readings(self) -> list[tuple[dict, int]]:
        """``({endpoint, reason}, count)`` of every pod's failed scrapes."""
        return self._merged("error_readings")

    def refused_readings(self) -> list[tuple[dict, int]]:
        """``({endpoint, reason}, count)`` of every pod's scrapes refused at a cap or the deadline."""
        return self._merged("refused_readings")

    def dropped_readings(self) -> list[tuple[dict, int]]:
        """``({endpoint, reason}, count)`` of every pod's sample lines dropped at a cap."""
        return self._merged("dropped_readings")


class DiscoveredKv(_PerPod):
    """KV bytes of every discovered engine: ``collect()`` -> readings, one KvCollector per pod.

    Args:
        discovery: the :class:`Discovery`.
        make: ``make(url) -> KvCollector`` (fetch limits, timeout, log), called once per new pod.
    """

    def __init__(self, discovery: Discovery, make: Callable[[str], KvCollector]):
        self.discovery = discovery
        self.make = make
        self.per_pod = {}  # pod uid -> (target, KvCollector)

    def collect(self) -> list[Reading]:
        targets = {t.uid: t for t in self.discovery.targets()}
        for uid in [u for u in self.per_pod if u not in targets]:
            del self.per_pod[uid]  # its readings and counts go with it
        out: list[Reading] = []
        for uid, t in targets.items():
            have = self.per_pod.get(uid)
            if have is None or have[0].url != t.url:
                col = self.make(t.url)
                col.engine_id = t.engine
                col.no_gpu_fix = NO_GPU_FIX
            else:
                col = have[1]
            col.gpus = list(t.hw_ids)
            col.tp = len(col.gpus) or 1
            self.per_pod[uid] = (t, col)
            out.extend(col.collect())
        return out

    def incomplete_readings(self) -> list[tuple[dict, int]]:
        return self._merged("incomplete_readings")


class DiscoveredLatency(_PerPod):
    """Alignment latency of every discovered engine from its own histograms (encoder timings
    first, else TTFT: :class:`~fusebox.collectors.latency.EngineHistogramFallback`), one per pod,
    ``engine`` = ``namespace/pod``. A pod that is gone: its fallback is dropped and its histogram
    series are no longer exported (``forget(keep)``, :meth:`Pipeline.forget_alignment`).

    Args:
        discovery: the :class:`Discovery`.
        make: ``make(engine, url) -> EngineHistogramFallback``.
        forget: ``forget(keep)`` ends the histogram series whose attributes ``keep`` refuses.
    """

    def __init__(self, discovery: Discovery, make: Callable[[str, str], Any],
                 forget: Callable[[Callable[[dict], bool]], int]):
        self.discovery = discovery
        self.make = make
        self.forget = forget
        self.per_pod = {}
        self.sources: dict[str, str] = {}  # engine -> the histogram it is read from

    def poll(self) -> int:
        """One round; returns the observations recorded."""
        targets = {t.uid: t for t in self.discovery.targets()}
        gone = [u for u in self.per_pod if u not in targets]
        for uid in gone:
            t, _fb = self.per_pod.pop(uid)
            self.sources.pop(t.engine, None)
        if gone:
            live = {t.engine for t in targets.values()}
            self.forget(lambda attrs: attrs.get(A["engine"]) in live)
        n = 0
        for uid, t in targets.items():
            have = self.per_pod.get(uid)
            fb = have[1] if have is not None and have[0].url == t.url else self.make(t.engine, t.url)
            self.per_pod[uid] = (t, fb)
            n += fb.poll()
            if fb.source:
                self.sources[t.engine] = fb.source
        return n


__all__ = ["Discovery", "DiscoveredKv", "DiscoveredLatency", "Target", "metrics_url", "DEFAULT_MAX_ENGINES"]
