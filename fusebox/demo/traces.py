"""What the demo shows with its trace backend (Jaeger v2 on loopback, :func:`.stack.jaeger_config`):
the trace behind the exemplar on the alignment histogram's slowest bucket.

With a Jaeger v2 binary (``make tools``) and a spec whose ``otelcol.traces`` is set, the demo runs
Jaeger (in-memory storage, all-in-one, its listeners on free loopback ports), points the Collector's
traces pipeline at it (``FUSEBOX_TRACES_ENDPOINT``), plays the scenario with ``--traces`` (each
tick's slowest hand-off in an ``mm.handoff`` span) and, once the breach is over, finds the exemplar
Prometheus stored on the slowest alignment bucket and that trace in Jaeger's API.
"""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from dataclasses import dataclass

from fusebox import conventions as C

from .stack import http_json

__all__ = ["SlowTrace", "slowest_exemplar_trace"]

HIST_BUCKET = C.PROM["alignment_duration"] + "_bucket"  # fusebox_alignment_duration_seconds_bucket


@dataclass(frozen=True)
class SlowTrace:
    """The exemplar on the slowest alignment bucket holding one, and its trace in Jaeger.

    ``le``: that bucket's bound (Prometheus' text, e.g. ``"2.0"``); ``value``: the exemplar's
    seconds; ``trace_id``/``span_id``: hex; ``span``: the span's name in Jaeger; ``duration_s``: its
    duration (Jaeger keeps microseconds); ``spans``: how many spans the trace holds; ``url``: the
    trace from Jaeger's query API (the UI's page is ``/trace/{id}`` where the UI is built in, as in
    the jaegertracing/jaeger image; the binary built from the Go module serves a placeholder there)."""

    le: str
    value: float
    trace_id: str
    span_id: str
    span: str
    duration_s: float
    spans: int
    url: str

    def text(self) -> str:
        return (f"slowest alignment bucket le={self.le}: exemplar {self.value:g} s, trace {self.trace_id} in Jaeger "
                f"({self.span} {self.duration_s:.3f} s): {self.url}")


def slowest_exemplar_trace(prometheus: str, jaeger: str, since: float, until: float | None = None) -> SlowTrace | None:
    """The exemplar Prometheus (base URL ``prometheus``) stored between ``since`` and ``until``
    (Unix seconds; default now) on the alignment histogram's slowest finite bucket holding one (the
    latest there), and its trace from Jaeger's query API (base URL ``jaeger``); None while either is
    missing (Jaeger's 404 included).

    Raises:
        OSError: Prometheus does not answer; ValueError: it answers with an error.
    """
    until = time.time() if until is None else until
    q = urllib.parse.urlencode({"query": HIST_BUCKET, "start": f"{since:.3f}", "end": f"{until:.3f}"})
    body = http_json(f"{prometheus}/api/v1/query_exemplars?{q}")
    if body.get("status") != "success":
        raise ValueError(f"{prometheus}: {body}")
    held = [s for s in body["data"] if s.get("exemplars") and math.isfinite(float(s["seriesLabels"].get("le", "inf")))]
    if not held:
        return None
    slowest = max(held, key=lambda s: float(s["seriesLabels"]["le"]))
    ex = max(slowest["exemplars"], key=lambda e: float(e["timestamp"]))
    trace_id, span_id = ex["labels"][C.EXEMPLAR_TRACE_ID_LABEL], ex["labels"][C.EXEMPLAR_SPAN_ID_LABEL]
    try:
        data = http_json(f"{jaeger}/api/traces/{trace_id}").get("data") or []
    except (OSError, json.JSONDecodeError):  # 404 until the trace is stored
        return None
    spans = {s["spanID"]: s for t in data for s in t["spans"]}
    span = spans.get(span_id)
    if span is None:
        return None
    return SlowTrace(le=slowest["seriesLabels"]["le"], value=float(ex["value"]), trace_id=trace_id, span_id=span_id,
                     span=span["operationName"], duration_s=span["duration"] / 1e6, spans=len(spans),
                     url=f"{jaeger}/api/traces/{trace_id}")
