"""``otelcol.traces``: the traces pipeline's backend and span metrics as the spec writes them, and a
bad value reported at its line with how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusebox.spec import parse_spec
from fusebox.spec.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = (ROOT / "fusebox.yaml").read_text()
TRACES_AT = SHIPPED.index("  traces:\n    endpoint:")
TRACES_END = SHIPPED.index("\n\n", TRACES_AT) + 1


def with_traces(block: str) -> str:
    """The shipped spec with its ``otelcol.traces`` block replaced by ``block`` (YAML at 2 spaces)."""
    return SHIPPED[:TRACES_AT] + block + SHIPPED[TRACES_END:]


def test_the_shipped_spec_sends_traces_to_jaeger_with_span_metrics_on_the_alignment_buckets():
    t = parse_spec(SHIPPED, "fusebox.yaml").otelcol.traces
    assert (t.endpoint, t.insecure) == ("jaeger:4317", True)
    assert t.span_metrics.dimensions == (("gen_ai.request.model", None),)
    # the alignment histogram's boundaries (fusebox.yaml's alignment signal), written as durations
    assert t.span_metrics.buckets_s == (0.05, 0.1, 0.25, 0.5, 0.75, 0.85, 1.0, 1.28, 1.5, 2.0, 2.5, 5.0, 10.0)
    assert t.span_metrics.flush_interval_s == 5.0  # global.scrape_interval: 5s


def test_without_the_block_there_are_no_traces():
    assert parse_spec(with_traces(""), "fusebox.yaml").otelcol.traces is None


def test_the_defaults_tls_on_no_span_metrics():
    t = parse_spec(with_traces("  traces: {endpoint: otel-gw.tracing:4317}\n"), "fusebox.yaml").otelcol.traces
    assert (t.endpoint, t.insecure, t.span_metrics) == ("otel-gw.tracing:4317", False, None)


def test_a_grpc_dns_target_is_an_endpoint():
    """gRPC's naming (grpc/doc/naming.md): dns:///name:port keeps every address of the name."""
    t = parse_spec(with_traces("  traces: {endpoint: 'dns:///jaeger-headless.tracing:4317'}\n"),
                   "fusebox.yaml").otelcol.traces
    assert t.endpoint == "dns:///jaeger-headless.tracing:4317"


def test_span_metrics_fields_as_the_collector_names_them():
    t = parse_spec(with_traces(
        "  traces:\n    endpoint: '[::1]:4317'\n    span_metrics:\n"
        "      dimensions: [engine, {name: gen_ai.request.model, default: unknown}]\n"
        "      buckets: ['0.5s', 750ms, 1.28s]\n      metrics_flush_interval: 30s\n"), "fusebox.yaml").otelcol.traces
    sm = t.span_metrics
    assert sm.dimensions == (("engine", None), ("gen_ai.request.model", "unknown"))
    assert sm.buckets_s == (0.5, 0.75, 1.28) and sm.flush_interval_s == 30.0
    off = parse_spec(with_traces("  traces:\n    endpoint: jaeger:4317\n    span_metrics: {enabled: false}\n"), "fusebox.yaml")
    assert off.otelcol.traces.span_metrics is None


@pytest.mark.parametrize("block, bad_line, what, fix", [
    ("  traces:\n    endpoint: http://jaeger:4317\n", "    endpoint: http://jaeger:4317",
     "'http://jaeger:4317' is not host:port", "e.g. jaeger:4317"),
    ("  traces:\n    endpoint: jaeger:99999\n", "    endpoint: jaeger:99999", "port 99999 of 'jaeger:99999' is not in 1-65535",
     "OTLP gRPC port"),
    ("  traces:\n    endpoint: jaeger:0\n", "    endpoint: jaeger:0", "port 0 of 'jaeger:0' is not in 1-65535", "OTLP gRPC port"),
    ("  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      buckets: [1s, 2]\n",
     "      buckets: [1s, 2]", "bucket 2: a bare number is ambiguous", "e.g. '2s'"),
    ("  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      buckets: [2s, 1.28s]\n",
     "      buckets: [2s, 1.28s]", "bucket '1.28s' is not above the one before it", "ascending order"),
    # the Collector's durations are whole nanoseconds: 0.5ns would be written 0s, 1.5ns 2ns (new users' trials)
    ("  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      buckets: [0.5ns, 1s]\n",
     "      buckets: [0.5ns, 1s]", "bucket '0.5ns' is not a whole number of nanoseconds", "1.5ns to 2ns"),
    # the fuzz test: a list in the bucket list ended generate in a TypeError
    ("  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      buckets: [[], 1s]\n",
     "      buckets: [[], 1s]", "bucket [] is not a duration", "e.g. '1.28s'"),
    ("  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      buckets: [1ns, 1.5ns, 1s]\n",
     "      buckets: [1ns, 1.5ns, 1s]", "bucket '1.5ns' is not a whole number of nanoseconds", "coarser unit"),
    ("  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      buckets: [1 GB]\n",
     "      buckets: [1 GB]", "is bytes (GB), not seconds", "e.g. '1.28s'"),
    ("  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      buckets: []\n",
     "      buckets: []", "the bucket list is empty", "connector's defaults"),
    ("  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      dimensions: [span.name]\n",
     "      dimensions: [span.name]", "'span.name' is on every span metric already", "remove it"),
    ("  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      dimensions: [engine, engine]\n",
     "      dimensions: [engine, engine]", "dimension 'engine' is listed twice", "list each attribute once"),
    ("  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      dimensions: ['a b']\n",
     "      dimensions: ['a b']", "'a b' is not an attribute name", "e.g. engine"),
    ("  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      metrics_flush_interval: 0s\n",
     "      metrics_flush_interval: 0s", "metrics_flush_interval must be positive", "e.g. 15s"),
    ("  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      metrics_flush_interval: soon\n",
     "      metrics_flush_interval: soon", "malformed duration", "ms, s, m"),
])
def test_a_bad_traces_block_is_an_error_at_its_line(block, bad_line, what, fix):
    text = with_traces(block)
    line = text.splitlines().index(bad_line) + 1
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    (problem,) = e.value.problems
    msg = str(problem)
    assert msg.startswith(f"fusebox.yaml:{line}:"), msg
    head, _, how = msg.partition(" -- ")
    assert what in head and fix in how, msg


@pytest.mark.parametrize("block, what", [
    ("  traces: {insecure: true}\n", "endpoint"),           # the backend is required
    ("  traces: {endpoint: jaeger:4317, tls: off}\n", "tls"),  # an unknown field
    ("  traces: {endpoint: jaeger:4317, insecure: 'yes'}\n", "insecure"),
])
def test_a_malformed_traces_block_is_a_schema_error_naming_the_field(block, what):
    text = with_traces(block)
    line = text.splitlines().index(block.rstrip("\n")) + 1
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    msg = "\n".join(str(p) for p in e.value.problems)
    assert f"fusebox.yaml:{line}:" in msg and what in msg, msg


@pytest.mark.parametrize("dims, problems", [
    # a misspelt key: the unknown key and the missing one, not also "should be a valid string" (the
    # union's other member) nor the model's class name (a new user's trial: three lines with RawDimension)
    ("[{nam: x}]", ["missing required key 'name' in otelcol.traces.span_metrics.dimensions.0 -- add 'name:' here",
                    "unknown key 'nam' in otelcol.traces.span_metrics.dimensions.0 -- remove it"]),
    # neither member: one line naming both
    ("[7]", ["otelcol.traces.span_metrics.dimensions.0: 7 is not a string or a mapping -- see the shipped fusebox.yaml"]),
])
def test_a_dimension_of_the_wrong_shape_is_one_clear_problem_per_fault(dims, problems):
    text = with_traces(f"  traces:\n    endpoint: jaeger:4317\n    span_metrics:\n      dimensions: {dims}\n")
    line = text.splitlines().index(f"      dimensions: {dims}") + 1
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    got = [str(p) for p in e.value.problems]
    assert len(got) == len(problems), got
    for msg, want in zip(got, problems, strict=True):
        assert msg.startswith(f"fusebox.yaml:{line}:") and want in msg, got
    assert "RawDimension" not in "\n".join(got)
