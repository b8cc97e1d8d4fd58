"""Export: readings -> OpenTelemetry SDK -> OTLP (bounded queue, bounded retry), Prometheus
text (``--once``) and an optional prometheus-client ``/metrics`` endpoint.

:class:`Pipeline` owns one ``MeterProvider`` per collector process. Collectors hand it their
:class:`~fusebox.collectors._model.Reading` lists (:meth:`Pipeline.set_readings`); observable
instruments report the latest list whenever a reader collects. The alignment-latency
histogram is a synchronous instrument whose buckets come from a ``View`` with
``ExplicitBucketHistogramAggregation`` (the spec's boundaries, docs/pitfalls.md P2).

Exemplars (docs/exemplars.md): the provider's exemplar filter is the SDK's trace-based one, so a
histogram observation recorded inside a sampled span keeps that span's trace and span id with
the bucket it falls in (the SDK's aligned-bucket reservoir: the last one per bucket). OTLP pushes
them on the histogram points; ``/metrics`` serves them as OpenMetrics exemplars
(``trace_id``/``span_id``) when the scraper asks for ``application/openmetrics-text``, and the
classic text format, which has none, otherwise.

Names: instruments carry the OTel names of :data:`fusebox.conventions.OTEL`; the Prometheus
text rendered here uses :func:`fusebox.conventions.otel_to_prometheus`, i.e. the names the
Collector's prometheus exporter produces (``hw_gpu_memory_usage_bytes``,
``fusebox_alignment_duration_seconds_bucket`` ...), and attribute keys with ``.`` -> ``_``
(``hw.id`` -> ``hw_id``). Resource attributes ``host.name`` and ``cluster`` become labels, as
the Collector config's ``resource_to_telemetry_conversion`` does.
"""

from __future__ import annotations

import bisect
import collections
import math
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from fusebox import conventions as C

from ._alignment import alignment_histogram, latency_view
from ._model import Reading

A = C.ATTR
DEFAULT_OTLP_HTTP = "http://127.0.0.1:4318"
DEFAULT_OTLP_GRPC = "http://127.0.0.1:4317"
# Resource attributes promoted to labels in the --once text and /metrics.
RESOURCE_LABELS = (A["host"], A["cluster"])


def _label(key: str) -> str:
    out = re.sub(r"[^a-zA-Z0-9_]+", "_", key)
    return "_" + out if out[:1].isdigit() else out


# ------------------------------------------------------------------------- bounded OTLP
class BoundedExporter:
    """Wraps an OTLP ``MetricExporter``: a bounded queue (oldest batch dropped and counted
    when full) drained by one thread that retries each batch a bounded number of times.

    ``export`` never blocks the collection loop. ``dropped`` counts batches lost to a full
    queue or to exhausted retries; ``sent`` counts batches the receiver accepted.
    """

    def __init__(self, inner: Any, *, max_queue: int = 32, max_attempts: int = 3, backoff_s: float = 0.5,
                 log: Callable[[str], None] | None = None):
        from opentelemetry.sdk.metrics.export import MetricExporter

        self.inner = inner
        self.max_attempts = max(1, max_attempts)
        self.backoff_s = backoff_s
        self.queue: collections.deque = collections.deque()
        self.max_queue = max(1, max_queue)
        self.dropped = 0
        self.sent = 0
        self.failures = 0
        self.log = log
        self._cv = threading.Condition()
        self._stop = False
        self._busy = False
        self._thread = threading.Thread(target=self._run, name="fusebox-otlp", daemon=True)
        self._thread.start()
        outer = self

        class _Adapter(MetricExporter):  # what the SDK reader talks to
            def __init__(self) -> None:
                super().__init__(
                    preferred_temporality=getattr(inner, "_preferred_temporality", None),
                    preferred_aggregation=getattr(inner, "_preferred_aggregation", None),
                )

            def export(self, metrics_data, timeout_millis: float = 10_000, **kw):
                return outer.enqueue(metrics_data)

            def force_flush(self, timeout_millis: float = 10_000) -> bool:
                return outer.flush(timeout_millis / 1000)

            def shutdown(self, timeout_millis: float = 30_000, **kw) -> None:
                outer.shutdown()

        self.adapter = _Adapter()

    def enqueue(self, metrics_data: Any):
        from opentelemetry.sdk.metrics.export import MetricExportResult

        with self._cv:
            if len(self.queue) >= self.max_queue:
                self.queue.popleft()
                self.dropped += 1
            self.queue.append(metrics_data)
            self._cv.notify()
        return MetricExportResult.SUCCESS

    def _run(self) -> None:
        from opentelemetry.sdk.metrics.export import MetricExportResult

        while True:
            with self._cv:
                while not self.queue and not self._stop:
                    self._cv.wait()
                if self._stop and not self.queue:
                    return
                batch = self.queue.popleft()
                self._busy = True
            ok = False
            for attempt in range(self.max_attempts):
                try:
                    ok = self.inner.export(batch) == MetricExportResult.SUCCESS
                except Exception:  # noqa: BLE001 -- a peer failing must not kill the thread
                    ok = False
                if ok or self._stop:
                    break
                time.sleep(min(self.backoff_s * (2**attempt), 5.0))
            with self._cv:
                self._busy = False
                if ok:
                    self.sent += 1
                else:
                    self.failures += 1
                    self.dropped += 1
                    if self.log and self.failures in (1, 10, 100) or self.failures % 1000 == 0:
                        if self.log:
                            self.log(f"otlp: export failed {self.failures} time(s); batches dropped: {self.dropped}")
                self._cv.notify_all()

    def flush(self, timeout_s: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self.queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=5)
        try:
            self.inner.shutdown()
        except Exception:  # noqa: BLE001
            pass


def otlp_exporter(endpoint: str | None, protocol: str = "http", timeout_s: float = 5.0) -> Any:
    """The OTLP metric exporter for ``protocol`` (``http`` = http/protobuf, or ``grpc``).

    Raises:
        SystemExit-style RuntimeError: gRPC asked for but its extra is not installed.
    """
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        except ImportError as e:
            raise RuntimeError("--otlp-protocol grpc needs the grpc extra: pip install 'fusebox[grpc]'") from e
        return OTLPMetricExporter(endpoint=endpoint or DEFAULT_OTLP_GRPC, insecure=True, timeout=timeout_s)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    url = (endpoint or DEFAULT_OTLP_HTTP).rstrip("/")
    if not re.search(r"https?://[^/]+/.+", url):
        url += "/v1/metrics"
    return OTLPMetricExporter(endpoint=url, timeout=timeout_s)


# ------------------------------------------------------------------------- the pipeline
def default_instance_id(host: str, service_name: str, *parts: str | None) -> str:
    """``<host>/<service.name>[/<part>...]``: the stable ``service.instance.id`` of a collector.

    ``parts`` (e.g. the engine id of a per-engine collector) keep two collectors of one kind on
    one host apart; None or empty parts are left out.
    """
    return "/".join([host, service_name, *(p for p in parts if p)])


def resolve_instance_id(explicit: str | None, host: str, service_name: str, *parts: str | None) -> str:
    """``explicit`` (``--instance-id``), else ``service.instance.id`` from the standard
    ``OTEL_RESOURCE_ATTRIBUTES`` environment variable, else :func:`default_instance_id`."""
    if explicit:
        return explicit
    from opentelemetry.sdk.resources import OTELResourceDetector

    from_env = OTELResourceDetector().detect().attributes.get(A["instance_id"])
    if from_env:
        return str(from_env)
    return default_instance_id(host, service_name, *parts)


class Pipeline:
    """One collector process's metrics pipeline.

    Args:
        service: key of :data:`fusebox.conventions.SERVICE` (``gpu``, ``kv``, ``latency``,
            ``scenario``) or a literal service name.
        keys: the :data:`~fusebox.conventions.OTEL` keys fed by readings (observable
            instruments are created for them).
        histogram_buckets: boundaries (seconds) of the alignment-latency histogram; when
            given, :attr:`alignment` is the histogram instrument.
        histograms: other histograms, :data:`~fusebox.conventions.OTEL` key -> boundaries (in
            the instrument's unit); each is created with its view, in :attr:`histograms` by key.
        host, cluster: resource attributes ``host.name`` (default: this host) and ``cluster``.
        instance_id: resource attribute ``service.instance.id``, which the Collector's
            prometheus exporter turns into the ``instance`` label. Default: the
            ``service.instance.id`` of ``OTEL_RESOURCE_ATTRIBUTES`` if set, else
            :func:`default_instance_id` (``<host.name>/<service.name>``), stable across
            restarts -- never the SDK's random per-process UUID.
        otlp_endpoint / otlp_protocol: where to push; None disables OTLP.
        exporter: an already built exporter (tests); overrides the OTLP arguments.
    """

    def __init__(
        self,
        service: str,
        keys: Sequence[str] = (),
        *,
        histogram_buckets: Sequence[float] | None = None,
        histograms: Mapping[str, Sequence[float]] | None = None,
        host: str | None = None,
        cluster: str | None = None,
        instance_id: str | None = None,
        otlp_endpoint: str | None = None,
        otlp_protocol: str = "http",
        exporter: Any = None,
        max_queue: int = 32,
        max_attempts: int = 3,
        log: Callable[[str], None] | None = None,
    ):
        from opentelemetry.metrics import Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader, PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        service_name = C.SERVICE.get(service, service)
        host_name = host or socket.gethostname()
        attrs = {A["service"]: service_name, A["host"]: host_name}
        if cluster:
            attrs[A["cluster"]] = cluster
        # The SDK would set a random UUID per process (ServiceInstanceIdResourceDetector): a
        # restarted collector would then export new series under a new `instance`.
        attrs[A["instance_id"]] = resolve_instance_id(instance_id, host_name, service_name)
        self.resource_attrs = attrs
        self._readings: dict[str, list[Reading]] = {k: [] for k in keys}
        self._lock = threading.Lock()
        self.memory_reader = InMemoryMetricReader()
        readers: list[MetricReader] = [self.memory_reader]
        self.bounded: BoundedExporter | None = None
        self.otlp_reader = None
        if exporter is None and otlp_endpoint is not None:
            exporter = otlp_exporter(otlp_endpoint, otlp_protocol)
            # the SDK exporter logs every failed attempt; BoundedExporter reports drops itself
            import logging

            logging.getLogger("opentelemetry.exporter.otlp").setLevel(logging.CRITICAL)
        if exporter is not None:
            self.bounded = BoundedExporter(exporter, max_queue=max_queue, max_attempts=max_attempts, log=log)
            # math.inf: no timer thread; each collection round pushes once (export_round)
            self.otlp_reader = PeriodicExportingMetricReader(self.bounded.adapter, export_interval_millis=math.inf)
            readers.append(self.otlp_reader)
        views = []
        if histogram_buckets is not None:
            views.append(latency_view(histogram_buckets))
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

        for hkey, bounds in (histograms or {}).items():
            views.append(View(instrument_name=C.OTEL[hkey][0],
                              aggregation=ExplicitBucketHistogramAggregation(boundaries=list(bounds))))
        # Trace-based, explicitly (the SDK's default too, unless OTEL_METRICS_EXEMPLAR_FILTER says
        # otherwise): only an observation inside a sampled span is offered as an exemplar, so every
        # exemplar names a trace the tracing backend kept.
        from opentelemetry.sdk.metrics import TraceBasedExemplarFilter

        self.provider = MeterProvider(resource=Resource.create(attrs), metric_readers=readers, views=views,
                                      exemplar_filter=TraceBasedExemplarFilter())
        self.meter = self.provider.get_meter("fusebox.collectors")
        self.alignment = None
        if histogram_buckets is not None:
            self.alignment = alignment_histogram(self.meter)
        self.histograms: dict[str, Any] = {}
        for hkey in histograms or {}:
            hname, hunit, _ = C.OTEL[hkey]
            self.histograms[hkey] = self.meter.create_histogram(hname, unit=hunit, description=_DESCRIPTIONS.get(hkey, ""))

        def make_cb(key: str):
            def cb(options: Any) -> Iterable[Any]:
                with self._lock:
                    rs = list(self._readings.get(key, ()))
                return [Observation(float(r.value), dict(r.attrs)) for r in rs]

            return cb

        for key in keys:
            name, unit, kind = C.OTEL[key]
            create = {
                "updowncounter": self.meter.create_observable_up_down_counter,
                "gauge": self.meter.create_observable_gauge,
                "counter": self.meter.create_observable_counter,
            }[kind]
            create(name, callbacks=[make_cb(key)], unit=unit, description=_DESCRIPTIONS.get(key, ""))
        # self-metrics: dropped export batches and endpoint errors
        self._self_counts: dict[tuple[str, tuple], float] = {}
        # the last exemplar of each histogram bucket series served: the SDK hands an exemplar to
        # one collection only, a /metrics scrape keeps showing it until a newer one replaces it
        self._exemplars: dict[tuple[str, tuple], Any] = {}
        self._render_lock = threading.Lock()
        for skey in ("export_dropped", "scrape_errors", "scrape_refused", "scrape_dropped", "kv_incomplete",
                     "gpu_errors", "discovery_skipped", "discovery_errors", "pcie_skipped", "conns_skipped",
                     "conns_errors"):
            name, unit, _kind = C.OTEL_SELF[skey]
            self.meter.create_observable_counter(name, callbacks=[self._self_cb(skey)], unit=unit,
                                                 description=_DESCRIPTIONS.get(skey, ""))

    def _self_cb(self, skey: str):
        from opentelemetry.metrics import Observation

        def cb(options: Any) -> Iterable[Any]:
            out = []
            if skey == "export_dropped":
                out.append(Observation(self.bounded.dropped if self.bounded else 0, {}))
            for (k, attrs), v in list(self._self_counts.items()):
                if k == skey:
                    out.append(Observation(v, dict(attrs)))
            return out

        return cb

    def _set_self(self, skey: str, items: Iterable[tuple[dict, int]]) -> None:
        """Replace the counts of self-metric ``skey``: an attribute set left out is no longer
        exported (an engine that went away takes its counts with it)."""
        new = {(skey, tuple(sorted(attrs.items()))): n for attrs, n in items}
        with self._lock:
            self._self_counts = {k: v for k, v in self._self_counts.items() if k[0] != skey} | new

    def set_errors(self, items: Iterable[tuple[dict, int]]) -> None:
        """Endpoint error counts, e.g. from :meth:`KvCollector.error_readings` (all of them: replaces)."""
        self._set_self("scrape_errors", items)

    def set_refused(self, items: Iterable[tuple[dict, int]]) -> None:
        """Refused-scrape counts by endpoint and reason, e.g. :meth:`KvCollector.refused_readings`."""
        self._set_self("scrape_refused", items)

    def set_dropped(self, items: Iterable[tuple[dict, int]]) -> None:
        """Sample lines dropped at a cap by endpoint and reason, e.g. :meth:`KvCollector.dropped_readings`."""
        self._set_self("scrape_dropped", items)

    def set_incomplete(self, items: Iterable[tuple[dict, int]]) -> None:
        """Incomplete KV rounds by engine and reason, e.g. :meth:`KvCollector.incomplete_readings`."""
        self._set_self("kv_incomplete", items)

    def set_gpu_errors(self, items: Iterable[tuple[dict, int]]) -> None:
        """GPU collection-error counts by GPU and reason, from :meth:`GpuCollector.error_readings`."""
        self._set_self("gpu_errors", items)

    def set_pcie_skipped(self, items: Iterable[tuple[dict, int]]) -> None:
        """GPUs whose PCIe topology was not followed, by GPU and reason (:meth:`PcieTopology.skipped`)."""
        self._set_self("pcie_skipped", items)

    def set_discovery(self, skipped: Iterable[tuple[dict, int]], errors: Iterable[tuple[dict, int]]) -> None:
        """Engine discovery's counts: pods skipped by engine and reason, its sources' errors by
        endpoint and reason (:class:`~fusebox.collectors.discover.Discovery`)."""
        self._set_self("discovery_skipped", skipped)
        self._set_self("discovery_errors", errors)

    def set_conns(self, skipped: Iterable[tuple[dict, int]], errors: Iterable[tuple[dict, int]]) -> None:
        """The connections collector's counts: connections left out by reason, netlink dumps that
        failed by reason (:class:`~fusebox.collectors.conns.ConnCollector`)."""
        self._set_self("conns_skipped", skipped)
        self._set_self("conns_errors", errors)

    def forget_alignment(self, keep: Callable[[dict], bool]) -> int:
        """Stop exporting the alignment histogram's series whose attributes ``keep`` refuses (an
        engine pod that was deleted); returns how many were dropped.

        The OTel SDK has no public way to end a synchronous instrument's series (a cumulative
        histogram keeps every attribute set it ever saw), so this removes them from the SDK's
        per-reader aggregation tables (``MeterProvider._measurement_consumer._reader_storages``
        -> ``_instrument_view_instrument_matches`` -> ``_attributes_aggregation``, SDK 1.2x-1.4x;
        tests/collectors/test_collectors_discover.py holds it to the rendered output, so an SDK that moved them
        fails there). Series recorded later under the same attributes start again from zero.
        """
        from ._alignment import HIST_NAME

        dropped = 0
        consumer = getattr(self.provider, "_measurement_consumer", None)
        for storage in list(getattr(consumer, "_reader_storages", {}).values()):
            for instrument, matches in list(getattr(storage, "_instrument_view_instrument_matches", {}).items()):
                if getattr(instrument, "name", "") != HIST_NAME:
                    continue
                for m in matches:
                    with m._lock:  # noqa: SLF001 -- see the docstring
                        table = m._attributes_aggregation  # noqa: SLF001
                        for k in [k for k, agg in table.items() if not keep(dict(getattr(agg, "_attributes", {}) or {}))]:
                            del table[k]
                            dropped += 1
        return dropped

    def set_readings(self, readings: Sequence[Reading]) -> None:
        """Replace the current readings (grouped by key). Keys not in ``keys`` raise KeyError."""
        grouped: dict[str, list[Reading]] = {k: [] for k in self._readings}
        for r in readings:
            grouped[r.key].append(r)
        with self._lock:
            self._readings = grouped

    def export_round(self, timeout_s: float = 10.0) -> None:
        """Collect once for the OTLP reader (queued; never blocks on the network)."""
        if self.otlp_reader is not None:
            self.otlp_reader.collect(timeout_millis=timeout_s * 1000)

    def families(self) -> list:
        """One collection as prometheus-client ``Metric`` families (:func:`prometheus_families`),
        each histogram bucket with the last exemplar it was given (kept across collections while
        its series is exported)."""
        with self._render_lock:
            return prometheus_families(self.memory_reader.get_metrics_data(), exemplars=self._exemplars)

    def prometheus_text(self) -> str:
        """One collection in Prometheus text exposition format (0.0.4, no exemplars), final
        Prometheus names."""
        from prometheus_client.exposition import generate_latest

        return generate_latest(_Families(self.families())).decode("utf-8")

    def serve_metrics(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Start a prometheus-client HTTP server on ``addr:port`` serving this pipeline.

        The format follows the request's ``Accept`` header (prometheus-client's
        ``choose_encoder``): OpenMetrics 1.0 with the buckets' exemplars for
        ``application/openmetrics-text`` (what Prometheus asks for first), else the classic text
        format 0.0.4, which carries no exemplars."""
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_PromClientBridge(self))
        return start_http_server(port, addr=addr, registry=registry)

    def shutdown(self) -> None:
        if self.bounded is not None:
            self.bounded.flush(5.0)
        try:
            self.provider.shutdown()
        except Exception:  # noqa: BLE001
            pass


_DESCRIPTIONS = {
    "gpu_memory_usage": "GPU memory in use, total - free (NVML v2), bytes",
    "gpu_memory_limit": "GPU memory total, bytes",
    "gpu_memory_ratio": "GPU memory in use over total, (total - free) / total (NVML v2), 0-1",
    "gpu_memory_reserved": "GPU memory reserved by the driver (NVML v2), bytes",
    "gpu_utilization": "GPU busy time share, 0-1",
    "gpu_memory_bandwidth_utilization": "Device-memory interface busy share (NVML utilization.memory / 100), 0-1",
    "gpu_pcie_utilization": "PCIe link utilization, max(tx, rx) / link maximum, 0-1",
    "gpu_io": "PCIe bytes transferred (integrated NVML throughput)",
    "gpu_power": "GPU power draw, watts",
    "gpu_up": "1 while NVML answers for the device, 0 when it is lost or errors",
    "pcie_upstream_utilization": "PCIe link several GPUs share: max(sum tx, sum rx) of the GPUs below it over its "
                                 "trained capacity (sysfs speed x width), 0-1",
    "kv_cache_usage": "KV-cache bytes in use (engine usage fraction x pool bytes / tp)",
    "kv_cache_limit": "KV-cache pool bytes (num_gpu_blocks x block_size x bytes/token / tp)",
    "alignment_duration": "Vision-encoder to language-decoder hand-off time, seconds",
    "connection_idle_time": "The longest idle time (no data sent or received, kernel TCP_INFO) among the followed "
                            "connections to a peer, seconds",
    "connection_idle_before_use": "Idle time of a connection when it was used again (TCP_INFO, at the poll before the "
                                  "use), seconds; its count is the uses seen",
    "connection_cold_starts": "Uses of a connection after more than connections.cold_after idle",
    "conns_skipped": "Connections matching the spec not followed, per round, by reason (over_cap)",
    "conns_errors": "inet_diag netlink dumps that failed, by reason (deadline, netlink)",
    "export_dropped": "OTLP export batches dropped (queue full or retries exhausted)",
    "scrape_errors": "Engine /metrics fetches that failed, by endpoint and reason",
    "scrape_refused": "Engine /metrics fetches refused at a cap or the deadline, by endpoint and reason",
    "scrape_dropped": "Sample lines of engine /metrics dropped before parsing (label_too_long, series_limit, model_limit), "
                      "by endpoint and reason",
    "kv_incomplete": "KV rounds with incomplete output, by engine and reason (no_gpu: no hw_id; no_capacity: no pool "
                     "size; model_config: --model-config not the served model's; unknown_model: a discovered engine's "
                     "model is not in the engines file)",
    "gpu_errors": "GPU collection rounds that failed for a device (NVML error), by GPU and reason",
    "pcie_skipped": "GPUs whose PCIe topology (sysfs) was not followed, by GPU and reason",
    "discovery_skipped": "Rounds in which a discovered engine pod was not scraped, by engine and reason (no_pod_ip, "
                         "no_port, over_cap)",
    "discovery_errors": "Engine discovery's sources failing (the kubelet's pod-resources socket, the Kubernetes API), "
                        "by endpoint and reason",
}


# ------------------------------------------------------------------------- rendering
def _fmt(v: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(v)


def exemplar_of(exemplar: Any) -> Any:
    """The prometheus-client ``Exemplar`` of an OTel SDK exemplar: labels ``trace_id`` (32 lowercase
    hex digits) and ``span_id`` (16), the observed value, its time (Unix seconds). None when it
    names no valid trace (an id missing or zero) or its labels pass OpenMetrics' 128 characters
    (:data:`fusebox.conventions.EXEMPLAR_MAX_CHARS`; these two labels take 63)."""
    from prometheus_client.samples import Exemplar

    if not exemplar.trace_id or not exemplar.span_id:
        return None
    labels = {C.EXEMPLAR_TRACE_ID_LABEL: format(exemplar.trace_id, "032x"),
              C.EXEMPLAR_SPAN_ID_LABEL: format(exemplar.span_id, "016x")}
    if sum(len(k) + len(v) for k, v in labels.items()) > C.EXEMPLAR_MAX_CHARS:
        return None
    return Exemplar(labels, float(exemplar.value), exemplar.time_unix_nano / 1e9)


def _bucket_exemplars(point: Any) -> dict[int, Any]:
    """Bucket index -> prometheus-client exemplar of a histogram point's exemplars: the bucket an
    exemplar's value falls in, ``value <= bound`` (Prometheus' ``le``, the SDK's reservoir)."""
    out = {}
    for e in point.exemplars or ():
        ex = exemplar_of(e)
        if ex is not None:
            out[bisect.bisect_left(list(point.explicit_bounds), e.value)] = ex
    return out


def iter_families(metrics_data: Any, exemplars: dict | None = None
                  ) -> Iterable[tuple[str, str, str, list[tuple[str, dict, float, Any]]]]:
    """(name, type, help, [(sample name, labels, value, exemplar or None)]) per metric,
    Prometheus names; a histogram bucket's exemplar is a prometheus-client ``Exemplar``
    (:func:`exemplar_of`).

    ``exemplars``: the last exemplar per bucket series (sample name, sorted labels), updated in
    place: a bucket without a new exemplar keeps its last one; series no longer exported are
    dropped from it. None: only the exemplars of this collection.
    """
    from opentelemetry.sdk.metrics.export import Gauge, Histogram, Sum

    fams: dict[str, tuple[str, str, list]] = {}
    kept: dict[tuple[str, tuple], Any] = {}
    if metrics_data is None:
        return []
    for rm in metrics_data.resource_metrics:
        res = {
            _label(k): str(v) for k, v in rm.resource.attributes.items() if k in RESOURCE_LABELS
        }
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                data = m.data
                if isinstance(data, Histogram):
                    kind, ptype = "histogram", "histogram"
                elif isinstance(data, Sum):
                    kind = "counter" if data.is_monotonic else "updowncounter"
                    ptype = "counter" if data.is_monotonic else "gauge"
                elif isinstance(data, Gauge):
                    kind, ptype = "gauge", "gauge"
                else:
                    continue
                name = C.otel_to_prometheus(m.name, m.unit or "", kind)
                _, _, samples = fams.setdefault(name, (ptype, m.description or "", []))
                for p in data.data_points:
                    labels = {**res, **{_label(k): str(v) for k, v in (p.attributes or {}).items()}}
                    if kind == "histogram":
                        cum = 0
                        fresh = _bucket_exemplars(p)
                        for i, (bound, count) in enumerate(zip(list(p.explicit_bounds) + [math.inf], p.bucket_counts,
                                                               strict=False)):
                            cum += count
                            blabels = {**labels, "le": _fmt(bound)}
                            key = (name + "_bucket", tuple(sorted(blabels.items())))
                            ex = fresh.get(i) or (exemplars or {}).get(key)
                            if ex is not None:
                                kept[key] = ex
                            samples.append((name + "_bucket", blabels, float(cum), ex))
                        samples.append((name + "_sum", labels, float(p.sum), None))
                        samples.append((name + "_count", labels, float(p.count), None))
                    else:
                        samples.append((name, labels, float(p.value), None))
    if exemplars is not None:
        exemplars.clear()
        exemplars.update(kept)
    return [(n, t, h, s) for n, (t, h, s) in sorted(fams.items())]


def prometheus_families(metrics_data: Any, exemplars: dict | None = None) -> list:
    """prometheus-client ``Metric`` families of an OTel ``MetricsData`` (final Prometheus
    names; a counter's family name drops ``_total``, which the exposition adds back), histogram
    buckets with their exemplars (``exemplars``: see :func:`iter_families`)."""
    from prometheus_client.metrics_core import Metric

    out = []
    for name, ptype, help_, samples in iter_families(metrics_data, exemplars):
        fam = name[: -len("_total")] if ptype == "counter" and name.endswith("_total") else name
        m = Metric(fam, help_, ptype)
        for sname, labels, value, exemplar in samples:
            m.add_sample(sname, labels, value, exemplar=exemplar)
        out.append(m)
    return out


class _Families:
    """A prometheus-client collector yielding fixed families (one rendering)."""

    def __init__(self, families: list):
        self.families = families

    def collect(self) -> list:
        return self.families


def render_prometheus(metrics_data: Any) -> str:
    """Prometheus text exposition (0.0.4) of an OTel ``MetricsData``, rendered by
    prometheus-client's ``generate_latest`` (the same code that serves ``/metrics``)."""
    from prometheus_client.exposition import generate_latest

    return generate_latest(_Families(prometheus_families(metrics_data))).decode("utf-8")


class _PromClientBridge:
    """prometheus-client collector serving a :class:`Pipeline`'s current values."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline

    def collect(self):
        yield from self.pipeline.families()


def log_stderr(msg: str) -> None:
    print(f"fusebox: {msg}", file=sys.stderr, flush=True)
