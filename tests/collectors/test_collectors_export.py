"""Export: the OTel -> Prometheus name contract (golden), --once text, OTLP to a real local
receiver (protobuf decoded), the bounded queue's drop counter, and /metrics."""

from __future__ import annotations

import http.server
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fusebox import conventions as C
from fusebox.collectors._model import Reading
from fusebox.collectors.export import Pipeline, otlp_exporter
from fusebox.tooling import free_port

# The metric contract the rules and dashboards read. Written out by hand: a change in the
# translation must fail here, not silently stop the rules (docs/metrics.md section 5).
GOLDEN = {
    "gpu_memory_usage": "hw_gpu_memory_usage_bytes",
    "gpu_memory_limit": "hw_gpu_memory_limit_bytes",
    "gpu_memory_ratio": "hw_gpu_memory_utilization_ratio",
    "gpu_utilization": "hw_gpu_utilization_ratio",
    "gpu_io": "hw_gpu_io_bytes_total",
    "gpu_power": "hw_power_watts",
    "gpu_memory_reserved": "fusebox_gpu_memory_reserved_bytes",
    "gpu_memory_bandwidth_utilization": "fusebox_gpu_memory_bandwidth_utilization_ratio",
    "gpu_pcie_utilization": "fusebox_gpu_pcie_utilization_ratio",
    "gpu_up": "fusebox_gpu_up",
    "pcie_upstream_utilization": "fusebox_gpu_pcie_upstream_utilization_ratio",
    "kv_cache_usage": "fusebox_kv_cache_usage_bytes",
    "kv_cache_limit": "fusebox_kv_cache_limit_bytes",
    "alignment_duration": "fusebox_alignment_duration_seconds",
    "connection_idle_time": "fusebox_connection_idle_time_seconds",
    "connection_idle_before_use": "fusebox_connection_idle_before_use_seconds",
    "connection_cold_starts": "fusebox_connection_cold_starts_total",
}
BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.85, 1.0, 1.28, 1.5, 2.0, 2.5, 5.0, 10.0)
GPU = {"hw.id": "GPU-1", "hw.gpu.index": "0", "hw.name": "H100"}
KV = {"engine": "e1", "model": "m1", "hw.id": "GPU-1"}


def test_golden_otel_to_prometheus_names():
    for key, prom in GOLDEN.items():
        assert C.otel_to_prometheus(*C.OTEL[key]) == prom, key
        assert C.PROM[key] == prom
    assert C.PROM_SELF == {"export_dropped": "fusebox_collector_export_dropped_total",
                           "scrape_errors": "fusebox_collector_scrape_errors_total",
                           "scrape_refused": "fusebox_collector_scrape_refused_total",
                           "scrape_dropped": "fusebox_collector_scrape_dropped_total",
                           "kv_incomplete": "fusebox_collector_kv_incomplete_total",
                           "gpu_errors": "fusebox_collector_gpu_errors_total",
                           "pcie_skipped": "fusebox_collector_pcie_skipped_total",
                           "discovery_skipped": "fusebox_collector_discovery_skipped_total",
                           "discovery_errors": "fusebox_collector_discovery_errors_total",
                           "conns_skipped": "fusebox_collector_conns_skipped_total",
                           "conns_errors": "fusebox_collector_conns_errors_total"}


def _pipe(**kw):
    keys = ("gpu_up", "gpu_memory_usage", "gpu_io", "gpu_utilization", "kv_cache_usage", "kv_cache_limit")
    return Pipeline("gpu", keys, histogram_buckets=BUCKETS, host="node-1", cluster="lab", **kw)


def _fill(p):
    p.set_readings([
        Reading("gpu_up", 1.0, GPU), Reading("gpu_memory_usage", 367_001_600, GPU),
        Reading("gpu_io", 4096.0, {**GPU, "network.io.direction": "transmit"}),
        Reading("gpu_utilization", 0.5, {**GPU, "hw.gpu.task": "general"}),
        Reading("kv_cache_usage", 1e9, KV), Reading("kv_cache_limit", 4e9, KV),
    ])  # fmt: skip
    for v in (0.3, 0.85, 0.9, 1.28, 1.3, 3.0):
        p.alignment.record(v, {"engine": "e1", "model": "m1"})


def test_once_text_uses_final_names_labels_and_spec_buckets():
    p = _pipe()
    _fill(p)
    text = p.prometheus_text()
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    res = (("cluster", "lab"), ("host_name", "node-1"))
    gpu = res + (("hw_gpu_index", "0"), ("hw_id", "GPU-1"), ("hw_name", "H100"))
    assert samples[("hw_gpu_memory_usage_bytes", tuple(sorted(gpu)))] == 367_001_600
    assert samples[("fusebox_gpu_up", tuple(sorted(gpu)))] == 1
    assert samples[("hw_gpu_io_bytes_total", tuple(sorted(gpu + (("network_io_direction", "transmit"),))))] == 4096
    assert samples[("hw_gpu_utilization_ratio", tuple(sorted(gpu + (("hw_gpu_task", "general"),))))] == 0.5
    kv = tuple(sorted(res + (("engine", "e1"), ("hw_id", "GPU-1"), ("model", "m1"))))
    assert samples[("fusebox_kv_cache_usage_bytes", kv)] == 1e9
    lat = res + (("engine", "e1"), ("model", "m1"))
    # every threshold is a bucket boundary, written as prometheus-client writes it (le="1.28", le="1.0")
    assert 'le="0.85"' in text and 'le="1.28"' in text and 'le="1.0"' in text
    # observations 0.3, 0.85, 0.9, 1.28, 1.3, 3.0: <= 0.85 -> 2, <= 1.28 -> 4, +Inf -> 6 (bounds inclusive)
    assert samples[("fusebox_alignment_duration_seconds_bucket", tuple(sorted(lat + (("le", "0.85"),))))] == 2
    assert samples[("fusebox_alignment_duration_seconds_bucket", tuple(sorted(lat + (("le", "1.28"),))))] == 4
    assert samples[("fusebox_alignment_duration_seconds_bucket", tuple(sorted(lat + (("le", "+Inf"),))))] == 6
    assert samples[("fusebox_alignment_duration_seconds_count", tuple(sorted(lat)))] == 6
    assert samples[("fusebox_alignment_duration_seconds_sum", tuple(sorted(lat)))] == pytest.approx(7.63)


class _Receiver(http.server.BaseHTTPRequestHandler):
    got: list = []

    def do_POST(self):  # noqa: N802
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = ExportMetricsServiceRequest()
        req.ParseFromString(body)
        type(self).got.append((self.path, self.headers.get("Content-Type"), req))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *a):
        pass


def test_otlp_http_protobuf_reaches_a_receiver_with_names_attributes_and_buckets():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Receiver.got = []
    try:
        p = _pipe(otlp_endpoint=f"http://127.0.0.1:{srv.server_address[1]}")
        _fill(p)
        p.export_round()
        assert p.bounded.flush(10)
        p.shutdown()
    finally:
        srv.shutdown()
    assert _Receiver.got, "nothing was pushed"
    path, ctype, req = _Receiver.got[0]
    assert path == "/v1/metrics" and ctype == "application/x-protobuf"
    rm = req.resource_metrics[0]
    res = {a.key: a.value.string_value for a in rm.resource.attributes}
    assert res["service.name"] == "fusebox-gpu-collector" and res["host.name"] == "node-1" and res["cluster"] == "lab"
    metrics = {m.name: m for sm in rm.scope_metrics for m in sm.metrics}
    usage = metrics["hw.gpu.memory.usage"]
    assert usage.unit == "By" and not usage.sum.is_monotonic
    dp = usage.sum.data_points[0]
    assert {a.key: a.value.string_value for a in dp.attributes} == GPU and dp.as_double == 367_001_600
    hist = metrics["fusebox.alignment.duration"].histogram.data_points[0]
    assert tuple(hist.explicit_bounds) == BUCKETS and hist.count == 6


@pytest.mark.process
def test_a_dead_receiver_fills_the_bounded_queue_and_drops_are_counted_without_blocking():
    exporter = otlp_exporter(f"http://127.0.0.1:{free_port()}", timeout_s=0.2)
    p = _pipe(exporter=exporter, max_queue=2, max_attempts=1)
    _fill(p)
    t0 = time.monotonic()
    for _ in range(10):
        p.export_round()
    assert time.monotonic() - t0 < 2.0  # the collection loop never waits on the network
    p.bounded.flush(10)
    assert p.bounded.dropped >= 8 and p.bounded.sent == 0
    text = p.prometheus_text()
    dropped = [s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "fusebox_collector_export_dropped_total"]
    assert dropped and dropped[0] == p.bounded.dropped
    p.shutdown()


@pytest.mark.process
def test_metrics_endpoint_serves_the_same_names():
    p = _pipe()
    _fill(p)
    port = free_port()
    server = p.serve_metrics(port)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        if isinstance(server, tuple):
            server[0].shutdown()
    assert 'fusebox_kv_cache_limit_bytes{cluster="lab",engine="e1",host_name="node-1",hw_id="GPU-1",model="m1"} 4e+09' in body
    assert "hw_gpu_io_bytes_total" in body and 'fusebox_alignment_duration_seconds_bucket' in body


@pytest.mark.process
def test_once_text_and_metrics_endpoint_are_one_rendering():
    # one renderer (prometheus-client's generate_latest) for --once and /metrics
    p = _pipe()
    _fill(p)
    p.set_errors([({"endpoint": "http://e/metrics", "reason": "down"}, 2)])
    port = free_port()
    server = p.serve_metrics(port)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        if isinstance(server, tuple):
            server[0].shutdown()
    assert body == p.prometheus_text()
    assert "# TYPE fusebox_collector_scrape_errors_total counter" in body
    assert 'fusebox_collector_scrape_errors_total{cluster="lab",endpoint="http://e/metrics",host_name="node-1",reason="down"} 2.0' in body


def test_grpc_without_its_extra_is_a_clear_error():
    try:
        import opentelemetry.exporter.otlp.proto.grpc  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match=r"fusebox\[grpc\]"):
            otlp_exporter(None, "grpc")
    else:
        assert otlp_exporter(None, "grpc") is not None


# --- service.instance.id: the `instance` label after the Collector's prometheus exporter -----------
def _instance_id(pipe) -> str:
    return pipe.provider._sdk_config.resource.attributes["service.instance.id"]


def test_instance_id_is_host_and_service_and_the_same_in_two_pipelines(monkeypatch):
    """Without it the SDK sets a random UUID per process, and a restarted collector exports new
    series (and new alerts, new fuse scopes) under a new `instance`."""
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    a, b = _pipe(), _pipe()
    assert _instance_id(a) == _instance_id(b) == "node-1/fusebox-gpu-collector"
    assert a.resource_attrs["service.instance.id"] == "node-1/fusebox-gpu-collector"


def test_instance_id_from_the_standard_env_then_the_argument(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=gpu-node-1-pod-a,team=ml")
    assert _instance_id(_pipe()) == "gpu-node-1-pod-a"
    assert _instance_id(_pipe(instance_id="explicit")) == "explicit"


def test_per_engine_collectors_default_to_distinct_instance_ids(monkeypatch):
    from fusebox.collectors.export import resolve_instance_id

    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert resolve_instance_id(None, "n1", "fusebox-kv-collector", "vllm-0") == "n1/fusebox-kv-collector/vllm-0"
    assert resolve_instance_id(None, "n1", "fusebox-kv-collector", None) == "n1/fusebox-kv-collector"
