"""End to end through the real Collector: OTLP in, Prometheus exporter out, a real Prometheus scraping.

A small pusher built on opentelemetry-sdk sends the fusebox instruments (conventions.OTEL) the
way the collectors do. Expected values are the P6 GPU of docs/pitfalls.md, worked out by hand:
used = total - free = 80000 - 17200 = 62800 MiB = 65,850,572,800 B; total 80000 MiB =
83,886,080,000 B; reserved 600 MiB = 629,145,600 B. Alignments 0.3 s x3, 0.9 s, 1.5 s: count 5,
3 at or under 0.85 s, 4 at or under 1.28 s, sum 3.3 s.
"""

from __future__ import annotations

import time

import pytest
from _dashboards_support import ROOT, collector_setup, process, prometheus, query, serve_text, wait_http

from fusebox import conventions as C

pytestmark = [pytest.mark.otelcol, pytest.mark.tools]

MIB = 1_048_576
RESOURCE = {"host.name": "gpu-node-1", "cluster": "lab-a", "service.name": "fusebox-test-pusher"}
GPU = {"hw.id": "GPU-8f1c2a5e", "hw.gpu.index": "0"}
ENGINE = {"engine": "vllm-0", "model": "llava-1.5-7b"}
BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 0.85, 1.0, 1.28, 1.5, 2.0, 2.5, 5.0, 10.0)  # fusebox.yaml

EXPECTED = {  # PROM key -> (extra label matchers, value)
    "gpu_memory_usage": ('hw_id="GPU-8f1c2a5e"', 62_800 * MIB),
    "gpu_memory_limit": ('hw_id="GPU-8f1c2a5e"', 80_000 * MIB),
    "gpu_memory_ratio": ('hw_id="GPU-8f1c2a5e"', 0.785),  # 62,800 / 80,000 MiB
    "gpu_memory_reserved": ('hw_id="GPU-8f1c2a5e"', 600 * MIB),
    "gpu_memory_bandwidth_utilization": ('hw_id="GPU-8f1c2a5e"', 0.5),
    "gpu_pcie_utilization": ('hw_id="GPU-8f1c2a5e"', 0.25),
    "gpu_up": ('hw_id="GPU-8f1c2a5e"', 1),
    "gpu_power": ('hw_id="GPU-8f1c2a5e"', 300),
    "kv_cache_usage": ('engine="vllm-0", model="llava-1.5-7b"', 2_000_000_000),
    "kv_cache_limit": ('engine="vllm-0", model="llava-1.5-7b"', 4_000_000_000),
}


def _push(endpoint: str) -> None:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.metrics import Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
    from opentelemetry.sdk.resources import Resource

    name, unit, _ = C.OTEL["alignment_duration"]
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint + "/v1/metrics"), export_interval_millis=1000)
    provider = MeterProvider(resource=Resource.create(RESOURCE), metric_readers=[reader],
                             views=[View(instrument_name=name, aggregation=ExplicitBucketHistogramAggregation(BUCKETS))])
    meter = provider.get_meter("fusebox.test")
    values = {k: v for k, (_, v) in EXPECTED.items()}
    for key, v in values.items():
        otel_name, otel_unit, kind = C.OTEL[key]
        attrs = ENGINE if key.startswith("kv_") else GPU
        cb = (lambda v, attrs: lambda _opts: [Observation(v, attrs)])(v, attrs)  # noqa: B023 - bound by the outer lambda
        if kind == "gauge":
            meter.create_observable_gauge(otel_name, [cb], unit=otel_unit)
        else:
            meter.create_observable_up_down_counter(otel_name, [cb], unit=otel_unit)
    hist = meter.create_histogram(name, unit=unit)
    for x in (0.3, 0.3, 0.3, 0.9, 1.5):
        hist.record(x, ENGINE)
    return provider


def test_the_names_the_rules_read_arrive_in_prometheus_with_values_and_host_label(tmp_path):
    binary, cfg, ports, env, log = collector_setup(tmp_path)
    with process([str(binary), f"--config={cfg}"], log, env=env) as col:
        wait_http(f"http://127.0.0.1:{ports['health']}/", col, log=log)
        provider = _push(f"http://127.0.0.1:{ports['http']}")
        try:
            prom_cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                        "scrape_configs": [{"job_name": "otelcol", "honor_labels": True,
                                            "static_configs": [{"targets": [f"127.0.0.1:{ports['prom']}"]}]}]}
            with prometheus(tmp_path, prom_cfg) as base:
                hist = C.PROM["alignment_duration"]
                deadline = time.monotonic() + 45
                while time.monotonic() < deadline:
                    if query(base, f"{hist}_count") and all(query(base, C.PROM[k]) for k in EXPECTED):
                        break
                    time.sleep(0.5)
                for key, (matchers, value) in EXPECTED.items():
                    name = C.PROM[key]
                    res = query(base, f'{name}{{host_name="gpu-node-1", cluster="lab-a", {matchers}}}')
                    assert len(res) == 1, (name, query(base, name), log.read_text()[-2000:])
                    assert float(res[0]["value"][1]) == pytest.approx(value), name
                sel = 'host_name="gpu-node-1", cluster="lab-a", engine="vllm-0", model="llava-1.5-7b"'
                assert float(query(base, f"{hist}_count{{{sel}}}")[0]["value"][1]) == 5
                assert float(query(base, f"{hist}_sum{{{sel}}}")[0]["value"][1]) == pytest.approx(3.3)
                assert float(query(base, f'{hist}_bucket{{{sel}, le="0.85"}}')[0]["value"][1]) == 3
                assert float(query(base, f'{hist}_bucket{{{sel}, le="1.28"}}')[0]["value"][1]) == 4
        finally:
            provider.shutdown()


def test_engine_metrics_scraped_by_the_collector_carry_host_and_cluster(tmp_path):
    """The scrape option: vLLM's /metrics through the prometheus receiver, stamped by `resource`."""
    from fusebox.generator.render_otelcol import OtelcolOptions

    body = (b"# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            b"# TYPE vllm:kv_cache_usage_perc gauge\n"
            b'vllm:kv_cache_usage_perc{engine="0",model_name="llava-1.5-7b"} 0.42\n')

    engine = serve_text(body)
    opts = OtelcolOptions(scrape_targets=(f"127.0.0.1:{engine.server_address[1]}",), scrape_interval_s=1)
    binary, cfg, ports, env, log = collector_setup(tmp_path, opts, HOSTNAME="gpu-node-7", FUSEBOX_CLUSTER="lab-b")
    try:
        with process([str(binary), f"--config={cfg}"], log, env=env) as col:
            wait_http(f"http://127.0.0.1:{ports['health']}/", col, log=log)
            prom_cfg = {"global": {"scrape_interval": "1s"},
                        "scrape_configs": [{"job_name": "otelcol", "honor_labels": True,
                                            "static_configs": [{"targets": [f"127.0.0.1:{ports['prom']}"]}]}]}
            with prometheus(tmp_path, prom_cfg) as base:
                sel = 'vllm:kv_cache_usage_perc{host_name="gpu-node-7", cluster="lab-b", model_name="llava-1.5-7b"}'
                deadline = time.monotonic() + 45
                res = []
                while time.monotonic() < deadline and not res:
                    res = query(base, sel)
                    time.sleep(0.5)
                assert res, (query(base, "vllm:kv_cache_usage_perc"), log.read_text()[-2000:])
                assert float(res[0]["value"][1]) == pytest.approx(0.42)
    finally:
        engine.shutdown()
        engine.server_close()


def test_the_fusebox_gpu_collector_replaying_a_capture_arrives_through_the_collector(tmp_path):
    """`fusebox collect gpu --replay` (the real collector, an RTX 4090 nvidia-smi -q -x capture)
    -> OTLP -> Collector -> Prometheus. From the capture's fb_memory_usage, by hand:
    total 24564 MiB = 25,757,220,864 B; used = total - free = 24564 - 24214 = 350 MiB =
    367,001,600 B (docs/pitfalls.md P6); reserved 346 MiB = 362,807,296 B; the ratio 350 / 24564."""
    import subprocess
    import sys

    fixture = ROOT / "tests" / "fixtures" / "collectors" / "netdata_rtx-4090-driver-535_nvidia-smi-q-x.xml"
    if not fixture.exists():
        pytest.skip("collectors fixtures not merged yet")
    binary, cfg, ports, env, log = collector_setup(tmp_path)
    gpu = 'hw_id="GPU-71d1acc2-662d-2166-bf9f-65272d2fc437", host_name="replay-node", cluster="lab-c"'
    expected = {C.PROM["gpu_memory_limit"]: 24_564 * MIB, C.PROM["gpu_memory_usage"]: 350 * MIB,
                C.PROM["gpu_memory_reserved"]: 346 * MIB, C.PROM["gpu_memory_ratio"]: 350 / 24_564}
    with process([str(binary), f"--config={cfg}"], log, env=env) as col:
        wait_http(f"http://127.0.0.1:{ports['health']}/", col, log=log)
        prom_cfg = {"global": {"scrape_interval": "1s"},
                    "scrape_configs": [{"job_name": "otelcol", "honor_labels": True,
                                        "static_configs": [{"targets": [f"127.0.0.1:{ports['prom']}"]}]}]}
        with prometheus(tmp_path, prom_cfg) as base:
            run = subprocess.run(
                [sys.executable, "-m", "fusebox.cli", "collect", "gpu", "--replay", str(fixture), "--interval", "1",
                 "--rounds", "4", "--otlp-endpoint", f"http://127.0.0.1:{ports['http']}", "--host-name", "replay-node",
                 "--cluster", "lab-c"], capture_output=True, text=True, timeout=60)
            assert run.returncode == 0, run.stdout + run.stderr
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(query(base, f"{n}{{{gpu}}}") for n in expected):
                time.sleep(0.5)
            for name, value in expected.items():
                res = query(base, f"{name}{{{gpu}}}")
                assert res, (name, query(base, name), log.read_text()[-2000:])
                assert float(res[0]["value"][1]) == value, name
            # A second collector process (a restart): the Collector keeps the first one's series
            # for metric_expiration (1 m), so a per-process `instance` would make two series per
            # GPU -- two alerts, two fuse scopes. service.instance.id is HOST/SERVICE in both.
            run = subprocess.run(
                [sys.executable, "-m", "fusebox.cli", "collect", "gpu", "--replay", str(fixture), "--interval", "1",
                 "--rounds", "3", "--otlp-endpoint", f"http://127.0.0.1:{ports['http']}", "--host-name", "replay-node",
                 "--cluster", "lab-c"], capture_output=True, text=True, timeout=60)
            assert run.returncode == 0, run.stdout + run.stderr
            time.sleep(3)  # two scrapes after the last push
            usage = C.PROM["gpu_memory_usage"]
            series = query(base, f"last_over_time({usage}{{{gpu}}}[1m])")
            assert [(s["metric"].get("instance"), s["metric"].get("job")) for s in series] == [
                ("replay-node/fusebox-gpu-collector", "fusebox-gpu-collector")], series
