"""Exemplars to traces: the alignment histogram's buckets carry the trace id of the sampled span a
hand-off was timed in (OpenMetrics on /metrics when asked for, OTLP on the histogram points), none
outside a span or in an unsampled one; a real Prometheus with exemplar storage keeps them."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from fusebox.collectors.export import Pipeline, exemplar_of
from fusebox.collectors.latency import EngineHistogramFallback, alignment_timer, record_alignment, spec_buckets

ROOT = Path(__file__).resolve().parents[2]
HIST = "fusebox_alignment_duration_seconds"
# The W3C Trace Context example ids (www.w3.org/TR/trace-context, "traceparent"); the leading 0
# checks the 32-digit padding.
TRACE_HEX, SPAN_HEX = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


def span(sampled: bool = True) -> NonRecordingSpan:
    """A span with the W3C example ids, sampled or not (as a remote parent's traceparent gives)."""
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return NonRecordingSpan(SpanContext(int(TRACE_HEX, 16), int(SPAN_HEX, 16), is_remote=True, trace_flags=flags))


@pytest.fixture
def pipe():
    p = Pipeline("latency", (), histogram_buckets=spec_buckets(ROOT / "fusebox.yaml"), host="h")
    yield p
    p.shutdown()


def timed(pipe, seconds: float) -> None:
    with alignment_timer(engine="e1", model="m1", meter=pipe.meter, clock=iter([0.0, seconds]).__next__):
        pass


def bucket_exemplars(pipe) -> dict[str, object]:
    """le -> exemplar (None where the bucket has none) of engine e1's alignment buckets."""
    out = {}
    for fam in pipe.families():
        for s in fam.samples:
            if s.name == HIST + "_bucket" and s.labels.get("engine") == "e1":
                out[s.labels["le"]] = s.exemplar
    return out


def test_a_hand_off_in_a_sampled_span_is_the_exemplar_of_the_bucket_it_falls_in(pipe):
    with trace.use_span(span()):
        timed(pipe, 1.4)
    ex = bucket_exemplars(pipe)
    # fusebox.yaml's alignment buckets ... 1.0, 1.28, 1.5, 2.0 ...: 1.4 s is in (1.28, 1.5], le="1.5"
    assert ex["1.5"].labels == {"trace_id": TRACE_HEX, "span_id": SPAN_HEX}
    assert ex["1.5"].value == 1.4
    assert abs(ex["1.5"].timestamp - time.time()) < 60  # the observation's time, Unix seconds
    assert [le for le, e in ex.items() if e is not None] == ["1.5"]  # not in the cumulative buckets above


def test_record_alignment_in_a_sampled_span_carries_it_too(pipe):
    with trace.use_span(span()):
        record_alignment(0.9, engine="e1", model="m1", meter=pipe.meter)  # (0.85, 1.0]
    ex = bucket_exemplars(pipe)
    assert ex["1.0"].labels["trace_id"] == TRACE_HEX and [le for le, e in ex.items() if e] == ["1.0"]


def test_no_exemplar_outside_a_span_or_in_an_unsampled_one(pipe):
    timed(pipe, 1.4)
    with trace.use_span(span(sampled=False)):
        timed(pipe, 1.4)
    with TracerProvider(sampler=ALWAYS_OFF).get_tracer("t").start_as_current_span("handoff"):
        timed(pipe, 1.4)
    ex = bucket_exemplars(pipe)
    assert ex and all(e is None for e in ex.values())
    (point,) = [p for m in _metrics(pipe) for p in m.data.data_points]
    assert point.count == 3


def test_the_span_current_when_the_timer_entered_owns_the_observation(pipe):
    # the hand-off began inside the request's span; the span ends before the timer does
    t = alignment_timer(engine="e1", model="m1", meter=pipe.meter, clock=iter([0.0, 2.2]).__next__)
    with trace.use_span(span()):
        t.__enter__()
    t.__exit__(None, None, None)
    assert bucket_exemplars(pipe)["2.5"].labels["trace_id"] == TRACE_HEX  # 2.2 s in (2.0, 2.5]


def test_a_served_exemplar_stays_until_a_newer_one_in_its_bucket_replaces_it(pipe):
    with trace.use_span(span()):
        timed(pipe, 1.4)
    assert bucket_exemplars(pipe)["1.5"].labels["trace_id"] == TRACE_HEX
    assert bucket_exemplars(pipe)["1.5"].labels["trace_id"] == TRACE_HEX  # a second scrape still sees it
    tracer = TracerProvider(sampler=ALWAYS_ON).get_tracer("t")
    with tracer.start_as_current_span("handoff") as s:
        timed(pipe, 1.3)  # also (1.28, 1.5]
    newer = format(s.get_span_context().trace_id, "032x")
    assert newer != TRACE_HEX
    assert bucket_exemplars(pipe)["1.5"].labels["trace_id"] == newer
    assert bucket_exemplars(pipe)["1.5"].value == 1.3


def test_openmetrics_text_carries_the_exemplar_and_the_classic_text_none(pipe):
    with trace.use_span(span()):
        timed(pipe, 1.4)

    class Fams:
        def collect(self):
            return pipe.families()

    om = openmetrics.generate_latest(Fams()).decode()
    line = next(l for l in om.splitlines() if l.startswith(HIST + "_bucket") and 'le="1.5"' in l)
    assert f' 1.0 # {{span_id="{SPAN_HEX}",trace_id="{TRACE_HEX}"}} 1.4 ' in line
    assert om.count(" # {") == 1 and om.endswith("# EOF\n")
    (fam,) = [f for f in text_string_to_metric_families(om) if f.name == HIST]
    (ex,) = [s.exemplar for s in fam.samples if s.exemplar]
    assert ex.labels == {"trace_id": TRACE_HEX, "span_id": SPAN_HEX} and ex.value == 1.4
    classic = generate_latest(Fams()).decode()
    assert " # " not in classic and TRACE_HEX not in classic
    assert TRACE_HEX not in pipe.prometheus_text()


def _metrics(pipe):
    return _metrics_of(pipe.memory_reader.get_metrics_data())


def test_the_sdk_puts_the_trace_on_the_histogram_point_and_otlp_carries_it(pipe):
    # the provider's trace-based exemplar filter: what the OTLP reader pushes (same provider)
    with trace.use_span(span()):
        timed(pipe, 1.4)
    data = pipe.memory_reader.get_metrics_data()
    (point,) = [p for m in _metrics_of(data) for p in m.data.data_points]
    (ex,) = point.exemplars
    assert (format(ex.trace_id, "032x"), format(ex.span_id, "016x"), ex.value) == (TRACE_HEX, SPAN_HEX, 1.4)
    req = encode_metrics(data)
    (otlp_point,) = [p for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                     if m.name == "fusebox.alignment.duration" for p in m.histogram.data_points]
    (otlp_ex,) = otlp_point.exemplars
    assert otlp_ex.trace_id.hex() == TRACE_HEX and otlp_ex.span_id.hex() == SPAN_HEX and otlp_ex.as_double == 1.4


def _metrics_of(data):
    return [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.name == "fusebox.alignment.duration"]


def test_the_engine_fallback_never_takes_the_pollers_span(pipe):
    ttft = "vllm:time_to_first_token_seconds_bucket"
    page = ('# TYPE vllm:time_to_first_token_seconds histogram\n'
            f'{ttft}{{model_name="m1",le="1.0"}} {{n}}\n{ttft}{{model_name="m1",le="+Inf"}} {{n}}\n')
    pages = iter([page.replace("{n}", "0"), page.replace("{n}", "3")])
    fb = EngineHistogramFallback(pipe.alignment, engine="e1", fetch=lambda _e, _t: next(pages))
    with trace.use_span(span()):
        fb.poll()
        assert fb.poll() == 3
    ex = bucket_exemplars(pipe)
    assert ex["1.0"] is None and all(e is None for e in ex.values())
    assert trace.get_current_span() is trace.INVALID_SPAN  # the poll left the context as it was


def test_exemplar_labels_are_the_hex_ids_within_openmetrics_128_characters():
    class E:
        trace_id, span_id, value, time_unix_nano = 2**128 - 1, 2**64 - 1, 0.5, 1_700_000_000_000_000_000

    ex = exemplar_of(E())
    assert ex.labels == {"trace_id": "f" * 32, "span_id": "f" * 16}
    assert sum(len(k) + len(v) for k, v in ex.labels.items()) == 63 <= 128
    assert ex.timestamp == 1_700_000_000.0
    E.trace_id = 0  # no trace: no exemplar
    assert exemplar_of(E()) is None


# --- the real thing: /metrics negotiated by Accept, scraped by Prometheus with exemplar storage -------
def _get(url: str, accept: str | None = None) -> tuple[str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310 - loopback only
        return r.headers["Content-Type"], r.read().decode()


@pytest.mark.process
def test_metrics_serves_openmetrics_with_exemplars_only_when_asked(pipe):
    from fusebox.tooling import free_port

    with trace.use_span(span()):
        timed(pipe, 1.4)
    port = free_port()
    server, thread = pipe.serve_metrics(port)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        ctype, om = _get(url, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
        plain_type, plain = _get(url)
    finally:
        server.shutdown()
    assert ctype.startswith("application/openmetrics-text; version=1.0.0")
    assert f'# {{span_id="{SPAN_HEX}",trace_id="{TRACE_HEX}"}} 1.4' in om and om.endswith("# EOF\n")
    assert plain_type.startswith("text/plain; version=0.0.4") and TRACE_HEX not in plain
    assert plain == pipe.prometheus_text()


@pytest.mark.process
def test_prometheus_keeps_the_slowest_hand_offs_trace_id_on_its_bucket(pipe, tmp_path):
    from _dashboards_support import free_port, http_get, prometheus, wait_scrapes

    tracer = TracerProvider(sampler=ALWAYS_ON).get_tracer("fusebox.test")
    for _ in range(5):
        with tracer.start_as_current_span("handoff"):
            timed(pipe, 0.3)  # (0.25, 0.5]
    with tracer.start_as_current_span("handoff") as slow:
        timed(pipe, 2.2)  # the slowest: (2.0, 2.5], le="2.5"
    slow_trace = format(slow.get_span_context().trace_id, "032x")
    slow_span = format(slow.get_span_context().span_id, "016x")
    port = free_port()
    server, _thread = pipe.serve_metrics(port)
    config = {"global": {"scrape_interval": "1s"},
              "scrape_configs": [{"job_name": "latency", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}
    try:
        with prometheus(tmp_path, config, extra_args=("--enable-feature=exemplar-storage",)) as base:
            since = time.time()
            wait_scrapes(base, since, n=2)
            params = {"query": f'{HIST}_bucket{{le="2.5"}}', "start": f"{since - 60:.3f}", "end": f"{time.time() + 60:.3f}"}
            body = json.loads(http_get(f"{base}/api/v1/query_exemplars?{urllib.parse.urlencode(params)}"))
            inf = dict(params, query=f'{HIST}_bucket{{le="+Inf"}}')
            none_on_inf = json.loads(http_get(f"{base}/api/v1/query_exemplars?{urllib.parse.urlencode(inf)}"))
    finally:
        server.shutdown()
    assert body["status"] == "success", body
    print(json.dumps(body["data"]))  # the exemplar Prometheus returned (pytest -s shows it)
    (series,) = body["data"]
    assert series["seriesLabels"]["le"] == "2.5" and series["seriesLabels"]["engine"] == "e1"
    assert series["seriesLabels"]["job"] == "latency"
    (ex,) = {(e["labels"]["trace_id"], e["labels"]["span_id"], e["value"]) for e in series["exemplars"]}
    assert ex == (slow_trace, slow_span, "2.2")
    assert none_on_inf["data"] == []  # the exemplar is on the bucket the value fell in, not above it


@pytest.mark.process
def test_the_otlp_push_carries_the_exemplar_to_a_receiver():
    import http.server
    import threading

    from test_collectors_export import _Receiver

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    _Receiver.got = []
    try:
        p = Pipeline("latency", (), histogram_buckets=spec_buckets(ROOT / "fusebox.yaml"), host="h",
                     otlp_endpoint=f"http://127.0.0.1:{srv.server_address[1]}")
        with trace.use_span(span()):
            timed(p, 1.4)
        timed(p, 0.3)  # outside a span: counted, no exemplar
        p.export_round()
        assert p.bounded.flush(10)
        p.shutdown()
    finally:
        srv.shutdown()
    (_path, _ctype, req), *_ = _Receiver.got
    (point,) = [dp for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                if m.name == "fusebox.alignment.duration" for dp in m.histogram.data_points]
    assert point.count == 2
    (ex,) = point.exemplars
    assert (ex.trace_id.hex(), ex.span_id.hex(), ex.as_double) == (TRACE_HEX, SPAN_HEX, 1.4)
