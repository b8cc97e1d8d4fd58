"""Jaeger v2, the trace backend the generated Grafana datasource links exemplars to (issue 35): the
pinned build (tools/build-jaeger.sh) started from tools/jaeger/loopback.yaml on free loopback ports
stores a span posted to its OTLP/HTTP receiver and serves it, by trace id, on its query API."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from _dashboards_support import http_get, jaeger

TRACE_ID = "5b8efff798038103d269b633813fc60c"  # 16 bytes, hex: OTLP/JSON's encoding of a trace id
SPAN_ID = "eee19b7ec3c1b174"


def _span_request(start_ns: int) -> bytes:
    """One OTLP/JSON ExportTraceServiceRequest: service ``fusebox-test``, span ``handoff`` of 250 ms."""
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "fusebox-test"}}]},
        "scopeSpans": [{"scope": {"name": "fusebox.tests"}, "spans": [{
            "traceId": TRACE_ID, "spanId": SPAN_ID, "name": "handoff", "kind": 2,
            "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(start_ns + 250_000_000),
        }]}],
    }]}).encode()


def _trace(base: str, bound_s: float = 30.0) -> dict:
    """The trace TRACE_ID from the query API, once it is stored (the batch processor holds it up to 100 ms)."""
    end = time.monotonic() + bound_s
    while True:
        try:
            return json.loads(http_get(f"{base}/api/traces/{TRACE_ID}"))["data"][0]
        except urllib.error.HTTPError as e:
            if e.code != 404 or time.monotonic() > end:
                raise
        time.sleep(0.2)


def test_jaeger_stores_an_otlp_span_and_serves_it_by_trace_id(tmp_path):
    with jaeger(tmp_path) as ep:
        start_ns = time.time_ns()
        req = urllib.request.Request(f"http://{ep['otlp_http']}/v1/traces", data=_span_request(start_ns),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - loopback only
            assert r.status == 200
        trace = _trace(ep["query"])
        services = json.loads(http_get(f"{ep['query']}/api/services"))["data"]
    assert trace["traceID"] == TRACE_ID
    (span,) = trace["spans"]
    assert (span["spanID"], span["operationName"]) == (SPAN_ID, "handoff")
    # the query API's times are microseconds
    assert (span["startTime"], span["duration"]) == (start_ns // 1000, 250_000)
    assert trace["processes"][span["processID"]]["serviceName"] == "fusebox-test"
    assert "fusebox-test" in services


def test_the_jaeger_binary_is_found_by_its_version_folder_or_named_missing(tmp_path, monkeypatch):
    from fusebox.tooling import JAEGER_VERSION, ToolMissing, jaeger_tool

    monkeypatch.setenv("FUSEBOX_TOOLS", str(tmp_path))
    with pytest.raises(ToolMissing) as e:
        jaeger_tool()
    where = tmp_path / "jaeger-v1.75.0" / "jaeger"
    assert str(e.value) == (f"missing jaeger v1.75.0 ({where}): run `make tools` "
                            "(tools/build-jaeger.sh builds it with Go)")
    where.parent.mkdir()
    where.write_text("#!/bin/sh\n")
    with pytest.raises(ToolMissing):  # there, but not executable
        jaeger_tool()
    where.chmod(0o755)
    assert (jaeger_tool(), JAEGER_VERSION) == (where, "v1.75.0")
