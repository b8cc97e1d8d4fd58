"""The spec's ``otelcol.traces:`` block: the Collector's traces pipeline and its span metrics.

Raw (pydantic) shape, checks and the frozen value generator/render_otelcol.py reads. Field names are
the Collector's own (the ``otlp_grpc`` exporter's ``endpoint`` and ``tls.insecure``; the
``span_metrics`` connector's ``dimensions``, ``histogram.explicit.buckets`` and
``metrics_flush_interval``); durations are written as elsewhere in the spec ("1.28s", "250ms").

Absent: no traces pipeline, and the generated Collector config is what it was without it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr

from . import units
from .k8snames import Err

# The dimensions the span_metrics connector always adds (and refuses as duplicates).
INTRINSIC_DIMENSIONS = ("service.name", "span.name", "span.kind", "status.code", "collector.instance.id")
_ATTRIBUTE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")
# host:port, or gRPC's dns:///host:port (grpc/doc/naming.md: the client's resolver keeps every address
# of the name, e.g. a headless Service's pods, for the Collector's gRPC balancer to pick from). A scheme (http://) is refused: with the
# Collector's otlp_grpc exporter it decides TLS over tls.insecure, which this block sets.
_HOST_PORT = re.compile(r"(?:dns:///)?(?:[A-Za-z0-9][-A-Za-z0-9.]*|\[[0-9A-Fa-f:.]+\]):(\d{1,5})")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class RawDimension(_Strict):
    name: StrictStr
    default: StrictStr | None = None  # the value where a span lacks the attribute; None: no label then


class RawSpanMetrics(_Strict):
    enabled: StrictBool = True
    dimensions: list[StrictStr | RawDimension] = []  # span or resource attributes added as labels
    buckets: list[Any] | None = None  # durations, ascending; None: the connector's defaults
    metrics_flush_interval: Any | None = None  # a duration; None: global.scrape_interval


class RawTraces(_Strict):
    endpoint: StrictStr  # OTLP gRPC host:port (or dns:///host:port) of the trace backend (Jaeger v2: 4317)
    insecure: StrictBool = False  # plaintext gRPC (no TLS), e.g. inside docker-compose's network
    span_metrics: RawSpanMetrics | None = None


@dataclass(frozen=True)
class SpanMetrics:
    """``otelcol.traces.span_metrics``: ``dimensions`` (attribute name, default or None),
    ``buckets_s`` (seconds, ascending; None: the connector's defaults), ``flush_interval_s``."""

    dimensions: tuple[tuple[str, str | None], ...] = ()
    buckets_s: tuple[float, ...] | None = None
    flush_interval_s: float = 5.0


@dataclass(frozen=True)
class Traces:
    """``otelcol.traces``: where the Collector sends spans (OTLP gRPC ``host:port``), whether
    without TLS, and the span metrics (None: no span_metrics connector)."""

    endpoint: str
    insecure: bool = False
    span_metrics: SpanMetrics | None = None


def normalise_traces(t: RawTraces | None, scrape_interval_s: float, duration: Callable[[Any, tuple], float],
                     err: Err) -> Traces | None:
    """Check ``otelcol.traces``; ``err(path, what, fix)`` records each problem. ``scrape_interval_s``
    is the default span-metrics flush interval (seconds)."""
    if t is None:
        return None
    p = ("otelcol", "traces")
    m = _HOST_PORT.fullmatch(t.endpoint)
    if m and not 1 <= int(m.group(1)) <= 65535:
        err(p + ("endpoint",), f"port {int(m.group(1))} of {t.endpoint[:100]!r} is not in 1-65535",
            "the trace backend's OTLP gRPC port, e.g. jaeger:4317 (Jaeger v2's)")
    elif not m:
        err(p + ("endpoint",), f"{t.endpoint[:100]!r} is not host:port",
            "the trace backend's OTLP gRPC address without a scheme, e.g. jaeger:4317 (Jaeger v2's OTLP gRPC port), "
            "or dns:///jaeger-headless:4317 for gRPC to keep every address the name resolves to")
    sm = t.span_metrics
    if sm is None or not sm.enabled:
        return Traces(endpoint=t.endpoint, insecure=t.insecure)
    return Traces(endpoint=t.endpoint, insecure=t.insecure,
                  span_metrics=_span_metrics(sm, p + ("span_metrics",), scrape_interval_s, duration, err))


def _span_metrics(sm: RawSpanMetrics, p: tuple, scrape_interval_s: float, duration: Callable[[Any, tuple], float],
                  err: Err) -> SpanMetrics:
    dims: list[tuple[str, str | None]] = []
    for i, d in enumerate(sm.dimensions):
        name, default = (d, None) if isinstance(d, str) else (d.name, d.default)
        if not _ATTRIBUTE.fullmatch(name):
            err(p + ("dimensions", i), f"{name[:100]!r} is not an attribute name",
                "a span or resource attribute, e.g. engine or gen_ai.request.model")
        elif name in INTRINSIC_DIMENSIONS:
            err(p + ("dimensions", i), f"{name!r} is on every span metric already",
                f"remove it (the connector always adds {', '.join(INTRINSIC_DIMENSIONS)})")
        elif name in (n for n, _ in dims):
            err(p + ("dimensions", i), f"dimension {name!r} is listed twice", "list each attribute once")
        dims.append((name, default))
    buckets = None if sm.buckets is None else _buckets(sm.buckets, p + ("buckets",), err)
    flush = scrape_interval_s
    if sm.metrics_flush_interval is not None:
        flush = duration(sm.metrics_flush_interval, p + ("metrics_flush_interval",))
        if flush <= 0 and units.is_duration(sm.metrics_flush_interval):  # a malformed one is reported already
            err(p + ("metrics_flush_interval",), "metrics_flush_interval must be positive",
                "e.g. 15s, or leave it out for global.scrape_interval")
    return SpanMetrics(dimensions=tuple(dims), buckets_s=buckets, flush_interval_s=flush)


def _buckets(raw: list[Any], p: tuple, err: Err) -> tuple[float, ...]:
    out: list[float] = []
    if not raw:
        err(p, "the bucket list is empty", "list upper bounds with their unit, e.g. ['250ms', '1s', '1.28s', '2.5s'], "
            "or leave buckets out for the connector's defaults")
    for i, b in enumerate(raw):
        if isinstance(b, bool) or not isinstance(b, (str, int, float)):  # a list, a mapping, null (the fuzz test)
            err(p + (i,), f"bucket {str(b)[:40]} is not a duration", "a duration with its unit, e.g. '1.28s' or '250ms'")
            continue
        try:
            v = units.parse_quantity(b, "seconds")
        except ValueError as e:
            err(p + (i,), f"bucket {b!r}: {getattr(e, 'what', str(e))}",
                getattr(e, "fix", None) or "a duration with its unit, e.g. '1.28s' or '250ms'")
            continue
        ns = v * 1e9
        if ns > 0 and abs(ns - round(ns)) > 1e-6 * max(1.0, ns):  # the Collector's durations are whole nanoseconds
            err(p + (i,), f"bucket {b!r} is not a whole number of nanoseconds",
                "the Collector would round it (1.5ns to 2ns): write whole nanoseconds or a coarser unit")
            continue
        v = round(ns) / 1e9
        if v <= 0 or (out and v <= out[-1]):
            err(p + (i,), f"bucket {b!r} is not above the one before it" if v > 0 else f"bucket {b!r} is not positive",
                "list positive upper bounds in ascending order, each once")
            continue
        out.append(v)
    return tuple(out)
