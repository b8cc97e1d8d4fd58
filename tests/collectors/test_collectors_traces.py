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
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from _dashboards_support import collector_setup, free_port, http_get, jaeger, process, prometheus, query, wait_http
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
HIST = "fusebox_alignment_duration_seconds"
SPAN_HIST = "traces_span_metrics_duration_seconds"  # the span_metrics connector's duration, unit s
HANDOFF = "mm.handoff"
MODEL = "llava-hf/llava-1.5-7b-hf"
HANDOFFS = (0.3, 0.3, 1.4, 0.3, 2.2, 0.3)  # seconds; the slowest, 2.2, falls in (2.0, 2.5]
SLOWEST, SLOWEST_LE = 2.2, "2.5"
PROPAGATOR = TraceContextTextMapPropagator()


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


def _slowest_bucket_exemplar(base: str, since: float) -> tuple[str, dict]:
    """The alignment histogram's exemplars, every bucket, once all three the requests fill hold one:
    the slowest of those buckets (its le) and its exemplar."""
    def stored():
        got = [s for s in exemplars(base, f'{HIST}_bucket{{job="latency"}}', since) if s["exemplars"]]
        return got if len(got) == 3 else None  # (0.25, 0.5], (1.28, 1.5], (2.0, 2.5]
    slowest = max(wait_for("exemplars on three alignment buckets", stored), key=lambda s: float(s["seriesLabels"]["le"]))
    (ex,) = slowest["exemplars"]
    return slowest["seriesLabels"]["le"], ex


def _span_metrics(base: str, since: float) -> tuple[dict, list[float], set[str]]:
    """The connector's histogram for the hand-off span: its _count row, the count in (2.0, 2.5], the
    trace ids on its le="2.5" bucket's exemplars."""
    sel = f'{SPAN_HIST}_count{{span_name="{HANDOFF}", service_name="llava-engine"}}'
    (row,) = wait_for("span metrics counting every hand-off",
                      lambda: [r for r in query(base, sel) if float(r["value"][1]) == len(HANDOFFS)])
    in_slow = query(base, f'{SPAN_HIST}_bucket{{span_name="{HANDOFF}", le="2.5"}}'
                          f' - ignoring(le) {SPAN_HIST}_bucket{{span_name="{HANDOFF}", le="2.0"}}')
    span_ex = wait_for("the span histogram's exemplar", lambda: [
        e for s in exemplars(base, f'{SPAN_HIST}_bucket{{span_name="{HANDOFF}", le="2.5"}}', since) for e in s["exemplars"]])
    return row, [float(r["value"][1]) for r in in_slow], {e["labels"]["trace_id"] for e in span_ex}


def test_the_slowest_buckets_exemplar_opens_the_slow_requests_trace_in_jaeger(tmp_path):
    from fusebox.generator.render_otelcol import OtelcolOptions
    from fusebox.spec import load_spec

    spec = load_spec(ROOT / "fusebox.yaml", display_path="fusebox.yaml")
    options = OtelcolOptions.from_spec(spec)  # what `fusebox generate` renders otel/otelcol.yaml from
    assert options.traces is not None and options.traces.span_metrics is not None
    pipe = Pipeline("latency", (), histogram_buckets=spec_buckets(ROOT / "fusebox.yaml"), host="gpu-node-1")
    metrics_port = free_port()
    metrics_srv, _ = pipe.serve_metrics(metrics_port)
    closing = [metrics_srv.shutdown, pipe.shutdown]
    try:
        with jaeger(tmp_path) as jg:
            # the generated config as it is; the trace backend's address from the environment
            binary, cfg, ports, env, log = collector_setup(tmp_path, options, FUSEBOX_TRACES_ENDPOINT=jg["otlp_grpc"])
            otlp_http = f"http://127.0.0.1:{ports['http']}"
            engine_tp, client_tp = tracer_provider("llava-engine", otlp_http), tracer_provider("fusebox-test-client", otlp_http)
            engine = stand_in_engine(pipe, engine_tp)
            closing += [engine.shutdown, engine_tp.shutdown, client_tp.shutdown]
            prom_cfg = {"global": {"scrape_interval": "1s"}, "scrape_configs": [
                {"job_name": "latency", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]},
                {"job_name": "otelcol", "honor_labels": True, "static_configs": [{"targets": [f"127.0.0.1:{ports['prom']}"]}]}]}
            with process([str(binary), f"--config={cfg}"], log, env=env) as col, \
                    prometheus(tmp_path, prom_cfg, extra_args=("--enable-feature=exemplar-storage",)) as base:
                # Prometheus before the requests: the connector keeps a span's exemplar for one flush (5 s)
                wait_http(f"http://127.0.0.1:{ports['health']}/", col, log=log)
                since = time.time()
                url = f"http://127.0.0.1:{engine.server_address[1]}/v1/chat/completions"
                client = client_tp.get_tracer("fusebox.test.client")
                made = {s: post_traced(url, client, s)[0] for s in HANDOFFS}  # hand-off -> trace id (the slow ones unique)
                assert engine_tp.force_flush() and client_tp.force_flush()
                le, ex = _slowest_bucket_exemplar(base, since)
                span_row, in_slow_bucket, span_exemplar_traces = _span_metrics(base, since)
            trace_id, span_id, value = ex["labels"]["trace_id"], ex["labels"]["span_id"], float(ex["value"])
            print(f"exemplar on le={le}: trace_id={trace_id} span_id={span_id} value={value}")
            # Jaeger has the trace, with the hand-off span the exemplar names inside it
            (t,) = wait_for(f"trace {trace_id} in Jaeger", lambda: json.loads(http_get(f"{jg['query']}/api/traces/{trace_id}"))["data"])
    finally:
        for close in reversed(closing):
            close()
    # the exemplar: on the slowest bucket, the slow request's trace, the hand-off the test made slowest
    assert le == SLOWEST_LE
    assert trace_id == made[SLOWEST]  # the 2.2 s request's trace, as its client started it
    assert SLOWEST <= value < SLOWEST + 0.3  # the timed hand-off: the sleep and a little
    spans = {s["spanID"]: s for s in t["spans"]}
    handoff = spans[span_id]
    duration_s = handoff["duration"] / 1e6  # Jaeger's API: microseconds
    print(f"Jaeger trace {t['traceID']}: {handoff['operationName']} {span_id} {duration_s:.6f} s; "
          f"{len(spans)} spans: {sorted(s['operationName'] for s in spans.values())}")
    assert t["traceID"] == trace_id and handoff["operationName"] == HANDOFF
    assert value <= duration_s < SLOWEST + 0.3  # the span encloses the timed hand-off, the 2.2 s sleep
    (parent_ref,) = [r for r in handoff["references"] if r["refType"] == "CHILD_OF"]
    assert spans[parent_ref["spanID"]]["operationName"] == "POST /v1/chat/completions"
    assert t["processes"][handoff["processID"]]["serviceName"] == "llava-engine"
    assert sorted(s["operationName"] for s in spans.values()) == ["POST /v1/chat/completions", "llava request", HANDOFF]
    # the span metrics the connector derived from the same spans, through the Collector's exporter
    assert span_row["metric"]["gen_ai_request_model"] == MODEL  # the spec's dimension; count: every hand-off
    assert in_slow_bucket == [1.0]  # one hand-off in (2.0, 2.5]
    assert span_exemplar_traces == {trace_id}  # and the connector kept its trace id on that bucket
