"""From the alignment histogram's slowest bucket to the request's trace, through real parts.

A client posts traced requests (W3C ``traceparent``) to an instrumented stand-in engine: an HTTP
server whose request span holds an ``mm.handoff`` span in which :func:`alignment_timer` times the
vision-encoder -> language-decoder hand-off. Only the encoder is a stand-in (it sleeps for the
hand-off the request asks for): the mock sits at the engine boundary. Spans go over OTLP to the real
``otelcol-fusebox`` running the config ``fusebox generate`` writes from the shipped spec
(``otelcol.traces``: traces to a trace backend, span metrics), pointed at a real Jaeger v2 (in-memory,
on free loopback ports). A real Prometheus with exemplar storage scrapes the alignment collector's
/metrics (OpenMetrics) and the Collector's exporter.

The requests' hand-offs: 0.3 s x4, 1.4 s, 2.2 s. With the shipped alignment buckets (..., 0.25, 0.5,
..., 1.28, 1.5, 2.0, 2.5, ...) they fall in (0.25, 0.5], (1.28, 1.5] and (2.0, 2.5]: the slowest bucket
holding an exemplar is le="2.5", and its exemplar is the 2.2 s request's trace.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from _dashboards_support import collector_setup, free_port, http_get, missing, process, prometheus, query, tools_dir, wait_http
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from fusebox.collectors.export import Pipeline
from fusebox.collectors.latency import alignment_timer, spec_buckets

pytestmark = [pytest.mark.otelcol, pytest.mark.tools, pytest.mark.process]

ROOT = Path(__file__).resolve().parents[2]
JAEGER_VERSION = "v1.75.0"  # the jaeger module's tag; its `jaeger` command is Jaeger v2.12.0
HIST = "fusebox_alignment_duration_seconds"
SPAN_HIST = "traces_span_metrics_duration_seconds"  # the span_metrics connector's duration, unit s
HANDOFF = "mm.handoff"
MODEL = "llava-hf/llava-1.5-7b-hf"
HANDOFFS = (0.3, 0.3, 1.4, 0.3, 2.2, 0.3)  # seconds; the slowest, 2.2, falls in (2.0, 2.5]
SLOWEST, SLOWEST_LE = 2.2, "2.5"
PROPAGATOR = TraceContextTextMapPropagator()


def jaeger_binary() -> Path:
    """Jaeger v2 built from the module proxy (tools/), or ``$FUSEBOX_JAEGER``."""
    p = Path(os.environ.get("FUSEBOX_JAEGER") or tools_dir() / f"jaeger-{JAEGER_VERSION}" / "jaeger")
    if not os.access(p, os.X_OK):
        missing(f"Jaeger {p}", f"run `make tools` (builds github.com/jaegertracing/jaeger/cmd/jaeger {JAEGER_VERSION})")
    return p


def jaeger_config(ports: dict) -> dict:
    """Jaeger v2 all-in-one (cmd/jaeger/internal/all-in-one.yaml), OTLP gRPC in, in-memory storage,
    every listener on a free loopback port and nothing else listening."""
    loop = "127.0.0.1:{}".format
    return {
        "service": {"extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
                    "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                             "exporters": ["jaeger_storage_exporter"]}},
                    "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "info"}}},
        "extensions": {
            "jaeger_storage": {"backends": {"mem": {"memory": {"max_traces": 10_000}}}},
            "jaeger_query": {"storage": {"traces": "mem"}, "http": {"endpoint": loop(ports["query"])},
                             "grpc": {"endpoint": loop(ports["query_grpc"])}},
            "healthcheckv2": {"use_v2": True, "http": {"endpoint": loop(ports["health"])}},
        },
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": loop(ports["otlp"])}}}},
        "processors": {"batch": {}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "mem"}},
    }


def tracer_provider(service: str, otlp_http: str) -> TracerProvider:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": service}), sampler=ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=otlp_http + "/v1/traces")))
    return provider


def stand_in_engine(pipe: Pipeline, provider: TracerProvider):
    """An engine's HTTP front instrumented as docs/exemplars.md says: the request's server span
    (parent from ``traceparent``), the hand-off span inside it, the alignment timer inside that.
    POST ``{"handoff_s": seconds}``; the vision encoder is the stand-in: it sleeps that long."""
    import http.server

    tracer = provider.get_tracer("fusebox.test.engine")

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            parent = PROPAGATOR.extract(self.headers)
            attrs = {"gen_ai.request.model": MODEL}
            with tracer.start_as_current_span("POST /v1/chat/completions", context=parent, kind=SpanKind.SERVER, attributes=attrs):
                with tracer.start_as_current_span(HANDOFF, attributes=attrs):
                    with alignment_timer(engine="llava-0", model=MODEL, meter=pipe.meter):
                        time.sleep(body["handoff_s"])  # the vision encoder and projector
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"choices": []}')

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def post_traced(url: str, tracer, handoff_s: float) -> tuple[str, str]:
    """One traced request; (trace id, client span id) in hex."""
    with tracer.start_as_current_span("llava request", kind=SpanKind.CLIENT) as span:
        headers = {"Content-Type": "application/json"}
        PROPAGATOR.inject(headers)
        req = urllib.request.Request(url, data=json.dumps({"handoff_s": handoff_s}).encode(), headers=headers)
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - loopback only
            assert r.status == 200
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def exemplars(base: str, selector: str, since: float) -> list[dict]:
    params = {"query": selector, "start": f"{since - 60:.3f}", "end": f"{time.time() + 60:.3f}"}
    body = json.loads(http_get(f"{base}/api/v1/query_exemplars?{urllib.parse.urlencode(params)}"))
    assert body["status"] == "success", body
    return body["data"]


def wait_for(what: str, fn, bound: float = 60.0):
    """``fn()`` until it returns something truthy; AssertionError naming ``what`` past ``bound`` s."""
    end, last = time.monotonic() + bound, None
    while time.monotonic() < end:
        try:
            last = fn()
        except OSError as e:  # not up yet, or a 404 for a trace not stored yet
            last = e
        else:
            if last:
                return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {bound:g} s (last: {last!r})")


def test_the_slowest_buckets_exemplar_opens_the_slow_requests_trace_in_jaeger(tmp_path):
    from fusebox.generator.render_otelcol import OtelcolOptions
    from fusebox.spec import load_spec

    spec = load_spec(ROOT / "fusebox.yaml", display_path="fusebox.yaml")
    options = OtelcolOptions.from_spec(spec)  # what `fusebox generate` renders otel/otelcol.yaml from
    assert options.traces is not None and options.traces.span_metrics is not None
    jports = {k: free_port() for k in ("otlp", "query", "query_grpc", "health")}
    jcfg = tmp_path / "jaeger.yaml"
    jcfg.write_text(yaml.safe_dump(jaeger_config(jports)))
    binary, cfg, ports, env, log = collector_setup(tmp_path, options, FUSEBOX_TRACES_ENDPOINT=f"127.0.0.1:{jports['otlp']}")
    jaeger_api = f"http://127.0.0.1:{jports['query']}/api"
    pipe = Pipeline("latency", (), histogram_buckets=spec_buckets(ROOT / "fusebox.yaml"), host="gpu-node-1")
    metrics_port = free_port()
    metrics_srv, _ = pipe.serve_metrics(metrics_port)
    engine_tp = tracer_provider("llava-engine", f"http://127.0.0.1:{ports['http']}")
    client_tp = tracer_provider("fusebox-test-client", f"http://127.0.0.1:{ports['http']}")
    engine = stand_in_engine(pipe, engine_tp)
    prom_cfg = {"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {"job_name": "latency", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]},
        {"job_name": "otelcol", "honor_labels": True, "static_configs": [{"targets": [f"127.0.0.1:{ports['prom']}"]}]}]}
    try:
        with process([str(jaeger_binary()), f"--config={jcfg}"], tmp_path / "jaeger.log") as jaeger, \
                process([str(binary), f"--config={cfg}"], log, env=env) as col:
            wait_http(f"{jaeger_api}/services", jaeger, log=tmp_path / "jaeger.log")
            wait_http(f"http://127.0.0.1:{ports['health']}/", col, log=log)
            # Prometheus first: the connector keeps a span's exemplar for one flush (5 s) only
            with prometheus(tmp_path, prom_cfg, extra_args=("--enable-feature=exemplar-storage",)) as base:
                since = time.time()
                client = client_tp.get_tracer("fusebox.test.client")
                url = f"http://127.0.0.1:{engine.server_address[1]}/v1/chat/completions"
                made = [(s, *post_traced(url, client, s)) for s in HANDOFFS]
                assert engine_tp.force_flush() and client_tp.force_flush()
                ((slow_trace, _client_span),) = [(t, c) for s, t, c in made if s == SLOWEST]

                # the alignment histogram's exemplars, every bucket; the slowest bucket holding one
                def stored():
                    got = [s for s in exemplars(base, f'{HIST}_bucket{{job="latency"}}', since) if s["exemplars"]]
                    return got if len(got) == 3 else None  # (0.25, 0.5], (1.28, 1.5], (2.0, 2.5]
                series = wait_for("exemplars on three alignment buckets", stored)
                slowest = max(series, key=lambda s: float(s["seriesLabels"]["le"]))
                (ex,) = slowest["exemplars"]
                trace_id, span_id, value = ex["labels"]["trace_id"], ex["labels"]["span_id"], float(ex["value"])
                print(f"exemplar on le={slowest['seriesLabels']['le']}: trace_id={trace_id} span_id={span_id} value={value}")
                assert slowest["seriesLabels"]["le"] == SLOWEST_LE
                assert trace_id == slow_trace  # the 2.2 s request's trace, as its client started it
                assert SLOWEST <= value < SLOWEST + 0.3  # the timed hand-off: the sleep and a little

                # the span metrics the connector derived from the same spans, through the Collector's exporter
                sel = f'{SPAN_HIST}_count{{span_name="{HANDOFF}", service_name="llava-engine"}}'
                counted = wait_for("span metrics counting every hand-off",
                                   lambda: [r for r in query(base, sel) if float(r["value"][1]) == len(HANDOFFS)])
                (row,) = counted
                assert row["metric"]["gen_ai_request_model"] == MODEL  # the spec's dimension
                in_slow = query(base, f'{SPAN_HIST}_bucket{{span_name="{HANDOFF}", le="2.5"}}'
                                      f' - ignoring(le) {SPAN_HIST}_bucket{{span_name="{HANDOFF}", le="2"}}')
                assert [float(r["value"][1]) for r in in_slow] == [1.0]  # one hand-off in (2.0, 2.5]
                span_ex = wait_for("the span histogram's exemplar", lambda: [
                    e for s in exemplars(base, f'{SPAN_HIST}_bucket{{span_name="{HANDOFF}", le="2.5"}}', since)
                    for e in s["exemplars"]])
                assert {e["labels"]["trace_id"] for e in span_ex} == {slow_trace}

            # Jaeger has the trace, and the hand-off span the exemplar names inside it
            trace = wait_for(f"trace {trace_id} in Jaeger", lambda: json.loads(http_get(f"{jaeger_api}/traces/{trace_id}"))["data"])
    finally:
        engine.shutdown()
        metrics_srv.shutdown()
        pipe.shutdown()
        engine_tp.shutdown()
        client_tp.shutdown()
    (t,) = trace
    spans = {s["spanID"]: s for s in t["spans"]}
    assert t["traceID"] == trace_id
    handoff = spans[span_id]
    duration_s = handoff["duration"] / 1e6  # Jaeger's API: microseconds
    print(f"Jaeger trace {trace_id}: {handoff['operationName']} {span_id} {duration_s:.6f} s; "
          f"{len(spans)} spans: {sorted(s['operationName'] for s in spans.values())}")
    assert handoff["operationName"] == HANDOFF
    # the span encloses the timed hand-off: at least the exemplar's value, and the 2.2 s sleep
    assert value <= duration_s < SLOWEST + 0.3
    (parent_ref,) = [r for r in handoff["references"] if r["refType"] == "CHILD_OF"]
    server = spans[parent_ref["spanID"]]
    assert server["operationName"] == "POST /v1/chat/completions"
    assert t["processes"][handoff["processID"]]["serviceName"] == "llava-engine"
    assert sorted(s["operationName"] for s in spans.values()) == ["POST /v1/chat/completions", "llava request", HANDOFF]
