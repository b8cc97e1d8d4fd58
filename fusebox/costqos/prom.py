"""Prometheus' ``/api/v1/query_range`` for the controller: one expression, one series.

:func:`query_range` returns the series' samples or raises :class:`MetricsError` with a reason
word the status' ``MetricsAvailable`` condition carries (``PrometheusUnreachable``,
``QueryFailed``, ``NotOneSeries``).
"""

from __future__ import annotations

import math

import httpx

from .frontier import Sample

__all__ = ["MetricsError", "query_range", "UNREACHABLE", "QUERY_FAILED", "NOT_ONE_SERIES", "NO_SAMPLES"]

UNREACHABLE, QUERY_FAILED, NOT_ONE_SERIES, NO_SAMPLES = "PrometheusUnreachable", "QueryFailed", "NotOneSeries", "NoSamples"


class MetricsError(Exception):
    """A query that gave no usable series: ``reason`` (one word), ``message`` (a sentence)."""

    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason, self.message = reason, message


async def query_range(client: httpx.AsyncClient, base_url: str, query: str, start: float, end: float,
                      step_s: float) -> list[Sample]:
    """The samples ``[(unix s, value)]`` of ``query`` from ``start`` to ``end`` (unix s) every
    ``step_s`` s; [] when the expression matches nothing. MetricsError when Prometheus cannot be
    reached, refuses the query (its own error text in the message) or returns more than one series
    (the expression should aggregate: ``max(...)``)."""
    url = base_url.rstrip("/") + "/api/v1/query_range"
    try:
        r = await client.post(url, data={"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"})
    except httpx.HTTPError as e:
        raise MetricsError(UNREACHABLE, f"{url}: {type(e).__name__}: {e}") from None
    try:
        body = r.json()
    except ValueError:
        raise MetricsError(QUERY_FAILED, f"{url} answered {r.status_code} with no JSON: {r.text[:200]!r}") from None
    if r.status_code != 200 or body.get("status") != "success":
        raise MetricsError(QUERY_FAILED, f"{query!r}: {body.get('errorType', r.status_code)}: {body.get('error', r.text[:200])}")
    result = body.get("data", {}).get("result", [])
    if len(result) > 1:
        raise MetricsError(NOT_ONE_SERIES, f"{query!r} returned {len(result)} series -- aggregate it to one, e.g. max(...)")
    if not result:
        return []
    out = []
    for t, v in result[0].get("values", []):
        x = float(v)
        if math.isfinite(x):
            out.append((float(t), x))
    return out
