"""The alignment-latency histogram as an OpenTelemetry instrument: its name, unit, bucket view.

Shared by :mod:`fusebox.collectors.export` (a :class:`~fusebox.collectors.export.Pipeline` built
with ``histogram_buckets`` installs the view and creates the histogram) and
:mod:`fusebox.collectors.latency` (which records into it); it imports neither, so the two need
not import each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fusebox import conventions as C

HIST_NAME, HIST_UNIT, _ = C.OTEL["alignment_duration"]  # fusebox.alignment.duration, "s"
_HISTOGRAMS: dict[int, Any] = {}


def latency_view(buckets: Sequence[float]) -> Any:
    """An OTel SDK ``View`` giving the alignment histogram exactly ``buckets`` (seconds, ascending)."""
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    return View(instrument_name=HIST_NAME, aggregation=ExplicitBucketHistogramAggregation(boundaries=list(buckets)))


def alignment_histogram(meter: Any) -> Any:
    """The ``fusebox.alignment.duration`` histogram (seconds) of ``meter`` (created once per meter)."""
    h = _HISTOGRAMS.get(id(meter))
    if h is None:
        h = meter.create_histogram(HIST_NAME, unit=HIST_UNIT, description="Vision-encoder to language-decoder hand-off time, seconds")
        _HISTOGRAMS[id(meter)] = h
    return h
