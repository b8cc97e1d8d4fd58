"""Alignment-latency instrumentation: time the vision-encoder -> language-decoder hand-off.

Records ``fusebox.alignment.duration`` (seconds, histogram; Prometheus
``fusebox_alignment_duration_seconds_{bucket,sum,count}``) with attributes ``engine``,
``model`` and ``source`` (:data:`fusebox.conventions.ALIGNMENT_SOURCE_LABEL`: what was measured,
``handoff`` here, ``encoder`` or ``ttft`` from :class:`EngineHistogramFallback`).
Buckets are the spec's (those of the quantile signal that reads this histogram,
:func:`alignment_signal`; default spec ``fusebox.yaml``): every threshold (0.85 s, 1.28 s) is a bucket boundary with neighbours on
both sides, so ``histogram_quantile`` can neither invent nor hide a breach (docs/pitfalls.md P2).
The OTel SDK default buckets (0, 5, 10, 25 ...) are shaped for milliseconds and are never
used: :func:`fusebox.collectors._alignment.latency_view` installs ``ExplicitBucketHistogramAggregation(boundaries)``.

Use::

    provider = install(spec_path="fusebox.yaml")          # once, at start-up
    with alignment_timer(engine="llava-0", model="llava-1.5-7b"):
        embeddings = projector(vision_encoder(images))      # the hand-off

    @alignment_timer(engine="llava-0", model="llava-1.5-7b")
    def align(images): ...

For servers that cannot be instrumented, :class:`EngineHistogramFallback` derives the signal
from an engine histogram (vLLM / SGLang time to first token) and says which one it used.

Exemplars (docs/exemplars.md): a hand-off timed or recorded inside a sampled OpenTelemetry span
(the span current when :class:`alignment_timer` entered, or when :func:`record_alignment` was
called) keeps that span's trace id as the exemplar of the bucket it falls in; outside a span, or
in an unsampled one, it carries none. The fallback's observations are re-bucketed engine counts,
no request's: they never carry one.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fusebox import conventions as C
from fusebox.spec import load_spec

from ._alignment import alignment_histogram
from .export import Pipeline

A = C.ATTR


def alignment_signal(spec: Any) -> Any:
    """The spec's signal over the alignment histogram this module records: the first
    ``quantile`` signal whose fusebox source reads ``fusebox_alignment_duration_seconds``.

    Raises:
        ValueError: no signal of the spec reads the alignment histogram.
    """
    hist = C.PROM["alignment_duration"]
    for sig in spec.signals:
        src = sig.sources.get("fusebox")
        if sig.kind == "quantile" and src is not None and src.metric == hist:
            return sig
    raise ValueError(f"{spec.file}: no quantile signal reads {hist} from the fusebox source -- "
                     f"add one (kind: quantile, sources.fusebox.metric: {hist}) to give the histogram its buckets")


def spec_buckets(spec_path: str | Path = "fusebox.yaml") -> tuple[float, ...]:
    """Bucket boundaries (seconds) of the spec's alignment-latency signal (:func:`alignment_signal`).

    Raises:
        fusebox.spec.errors.SpecError: the spec is invalid (file:line:col messages).
        ValueError: no signal reads the alignment histogram.
    """
    return tuple(float(b) for b in alignment_signal(load_spec(str(spec_path))).buckets)


def install(spec_path: str | Path = "fusebox.yaml", *, buckets: Sequence[float] | None = None,
            otlp_endpoint: str | None = None, host: str | None = None, cluster: str | None = None,
            instance_id: str | None = None):
    """Set the global MeterProvider up for alignment timing and return the
    :class:`~fusebox.collectors.export.Pipeline` behind it (OTLP push when an endpoint is
    given; call ``pipeline.export_round()`` periodically, or use ``--metrics-port``).
    ``instance_id`` (``service.instance.id``, the ``instance`` label) defaults to
    ``<host>/fusebox-latency``; give each server process on a host its own."""
    from opentelemetry import metrics

    pipe = Pipeline("latency", (), histogram_buckets=tuple(buckets or spec_buckets(spec_path)),
                    otlp_endpoint=otlp_endpoint, host=host, cluster=cluster, instance_id=instance_id)
    metrics.set_meter_provider(pipe.provider)
    return pipe


def record_alignment(seconds: float, *, engine: str, model: str, meter: Any = None, context: Any = None) -> None:
    """Record one hand-off duration (seconds) for ``engine``/``model`` (``source="handoff"``).

    ``context``: the OpenTelemetry ``Context`` whose span the observation belongs to (default:
    the current one); inside a sampled span, its trace id becomes the bucket's exemplar.
    """
    if meter is None:
        from opentelemetry import metrics

        meter = metrics.get_meter("fusebox.collectors.latency")
    alignment_histogram(meter).record(seconds, {A["engine"]: engine, A["model"]: model,
                                                A["alignment_source"]: "handoff"}, context=context)


class alignment_timer:
    """Context manager and decorator timing the hand-off with ``time.perf_counter``.

    The duration is recorded also when the timed block raises (a failed hand-off took that
    long too). Works on plain and ``async`` functions. The observation belongs to the
    OpenTelemetry context current on entry: its sampled span's trace id is the exemplar.
    """

    def __init__(self, *, engine: str, model: str, meter: Any = None, clock: Callable[[], float] = time.perf_counter):
        self.engine, self.model, self.meter, self.clock = engine, model, meter, clock
        self.elapsed: float | None = None
        self._t0 = 0.0
        self._context: Any = None

    def __enter__(self) -> alignment_timer:
        from opentelemetry import context

        self._context = context.get_current()
        self._t0 = self.clock()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.elapsed = self.clock() - self._t0
        record_alignment(self.elapsed, engine=self.engine, model=self.model, meter=self.meter, context=self._context)

    def __call__(self, func: Callable) -> Callable:
        if asyncio.iscoroutinefunction(func):

            @functools.wraps(func)
            async def awrapper(*args: Any, **kw: Any) -> Any:
                with alignment_timer(engine=self.engine, model=self.model, meter=self.meter, clock=self.clock):
                    return await func(*args, **kw)

            return awrapper

        @functools.wraps(func)
        def wrapper(*args: Any, **kw: Any) -> Any:
            with alignment_timer(engine=self.engine, model=self.model, meter=self.meter, clock=self.clock):
                return func(*args, **kw)

        return wrapper


# ------------------------------------------------------------------------- fallback
# Engine histograms read in place of the hand-off, in order of preference: encoder /
# multimodal-stage timings first (source="encoder"), then time to first token (source="ttft", an
# upper bound: queueing + prefill + encoder). Stock vLLM and SGLang publish no encoder timing
# (vLLM issue #25377): name one with --encoder-metric where an engine does.
FALLBACK_SOURCES = C.ENGINE_ENCODER_HISTOGRAMS + C.ENGINE_TTFT_HISTOGRAMS


def source_of(metric: str, encoder_metrics: Sequence[str] = ()) -> str:
    """The ``source`` attribute of observations read from engine histogram ``metric``: ``ttft``
    for a time-to-first-token histogram, ``encoder`` for an encoder / multimodal-stage one."""
    if metric in C.ENGINE_TTFT_HISTOGRAMS or (metric.endswith("time_to_first_token_seconds")
                                              and metric not in encoder_metrics):
        return "ttft"
    return "encoder"


class EngineHistogramFallback:
    """Derive alignment-latency observations from an engine's own histogram.

    Each :meth:`poll` reads the engine's cumulative buckets and takes, **per series** (all
    labels but ``le``: vLLM >= 0.10 labels each data-parallel engine core ``engine="0"``,
    ``engine="1"`` ...), the increase of every engine bucket ``(lo, hi]`` since the last
    poll. A series whose counts fell (a restart) counts from zero; a series seen for the
    first time is only a baseline. The increases of all series of one model are then summed
    per engine bucket and re-recorded into the spec-bucketed histogram, the ``n``
    observations of a bucket spread evenly inside it (the linear interpolation
    ``histogram_quantile`` itself assumes). The fused output carries ``engine`` = the
    ``engine`` argument (``--engine-id``) and ``model`` = the ``model`` argument or else the
    engine's ``model_name`` label; the engine's own ``engine`` (data-parallel rank) label is
    summed away. Histograms are tried in order: ``encoder_metrics`` (``--encoder-metric``) and
    :data:`fusebox.conventions.ENGINE_ENCODER_HISTOGRAMS` first, then time to first token; the
    first the engine publishes is used, :attr:`source` names it and every observation carries
    ``source`` = ``encoder`` or ``ttft`` (:func:`source_of`): a TTFT is an upper bound of the
    hand-off, and alerts, runbooks and panels can say which one they read.

    The fetch is bounded like the KV collector's (:class:`~fusebox.collectors.fetch.Fetcher`:
    byte caps, ``timeout_s`` as the deadline of the whole scrape). :attr:`errors` counts failed
    polls; :attr:`scrape_errors` and :attr:`refused` count them by ``(endpoint without
    userinfo, reason)``; ``log`` hears each change of state.
    """

    def __init__(self, histogram: Any, *, engine: str, model: str | None = None, metric: str | None = None,
                 fetch: Callable[[str, float], str] | None = None, endpoint: str = "", timeout_s: float = 2.0,
                 log: Callable[[str], None] | None = None, encoder_metrics: Sequence[str] = ()):
        from collections import Counter

        from .fetch import default_fetcher

        self.hist = histogram
        self.engine, self.model = engine, model
        self.metric = metric
        self.encoder_metrics = tuple(encoder_metrics)
        self.source: str | None = None
        self.fetch = fetch or default_fetcher
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.log = log
        # per series (metric name, sorted labels without le) -> sorted [(le, cumulative)]
        self._last: dict[tuple, list[tuple[float, float]]] = {}
        self.errors = 0
        self.problem = ""  # why the last poll failed ("" when it did not)
        self.scrape_errors: Counter = Counter()
        self.refused: Counter = Counter()
        self.dropped: Counter = Counter()  # (endpoint, reason) -> sample lines dropped at a cap
        self._state = "ok"

    def _report(self, state: str, detail: str = "") -> None:
        self.problem = "" if state == "ok" else f"{state}{': ' + detail if detail else ''}"
        if state != self._state and self.log:
            from .fetch import redact_url

            self.log(f"latency: {redact_url(self.endpoint)}: {state}{': ' + detail if detail else ''}"
                     if state != "ok" else f"latency: {redact_url(self.endpoint)}: ok again")
        self._state = state

    def error_readings(self):
        """``({endpoint, reason}, count)`` per failed-scrape reason."""
        for (ep, reason), n in sorted(self.scrape_errors.items()):
            yield {A["endpoint"]: ep, A["reason"]: reason}, n

    def dropped_readings(self):
        """``({endpoint, reason}, count)`` of sample lines dropped at a cap (:func:`fetch.bound_series`)."""
        from .fetch import counted_readings

        return counted_readings(self.dropped)

    def refused_readings(self):
        """``({endpoint, reason}, count)`` per refusal reason (a cap or the deadline)."""
        for (ep, reason), n in sorted(self.refused.items()):
            yield {A["endpoint"]: ep, A["reason"]: reason}, n

    def _buckets(self, text: str) -> dict[tuple, tuple[str, str, list[tuple[float, float]]]]:
        """Series key -> (metric name, model_name label, sorted [(le, cumulative count)])."""
        from .kvcache import parse_families

        fams = parse_families(text)
        wanted = (self.metric,) if self.metric else self.encoder_metrics + FALLBACK_SOURCES
        out: dict[tuple, tuple[str, str, list]] = {}
        for name in wanted:
            for fam in fams:
                for s in fam.samples:
                    if s.name != name + "_bucket" or "le" not in s.labels:
                        continue
                    labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                    key = (name, labels)
                    out.setdefault(key, (name, s.labels.get("model_name", ""), []))[2].append(
                        (float(s.labels["le"]), s.value))
            if out:
                break
        for _n, _m, b in out.values():
            b.sort()
        return out

    @staticmethod
    def _increases(prev: list[tuple[float, float]] | None, now: list[tuple[float, float]]) -> dict[tuple, float]:
        """Per-bucket ``(lo, hi)`` increase of one series (cumulative -> per bucket)."""
        prev_map = dict(prev or ())
        if any(c < prev_map.get(le, 0.0) for le, c in now):
            prev_map = {}  # counter reset: everything counted now is new
        out: dict[tuple, float] = {}
        lo, cum_before_now, cum_before_prev = 0.0, 0.0, 0.0
        for le, cum in now:
            before = prev_map.get(le, 0.0)
            inc = (cum - cum_before_now) - (before - cum_before_prev)
            cum_before_now, cum_before_prev = cum, before
            if inc > 0:
                out[(lo, le)] = out.get((lo, le), 0.0) + inc
            lo = le if le != float("inf") else lo
        return out

    def poll(self, *, since_start: bool = False) -> int:
        """Fetch, diff and re-record. Returns the number of observations recorded.

        ``since_start``: a series seen for the first time counts from zero (everything the
        engine counted since it started) instead of being only a baseline: ``--once``.
        """
        from .fetch import redact_url, scrape
        from .kvcache import MalformedMetrics

        log = self.log
        text, state, detail = scrape(self.fetch, self.endpoint, self.timeout_s, self.scrape_errors, self.refused,
                                     self.dropped, log=(lambda m: log(f"latency: {m}")) if log else None)
        if text is None:
            self.errors += 1
            self._report(state, detail)
            return 0
        try:
            hists = self._buckets(text)
        except (MalformedMetrics, ValueError) as e:  # a malformed engine is counted, never fatal
            self.errors += 1
            self.scrape_errors[(redact_url(self.endpoint), "malformed")] += 1
            self._report("malformed", str(e))
            return 0
        self._report("ok")
        fused: dict[str, dict[tuple, float]] = {}  # model -> (lo, hi) -> increase over all series
        seen = {}
        for key, (name, model_label, buckets) in hists.items():
            self.source = name
            prev = self._last.get(key)
            seen[key] = buckets
            if prev is None and not since_start:
                continue  # first sight: only a baseline
            acc = fused.setdefault(self.model or model_label, {})
            for interval, inc in self._increases(prev, buckets).items():
                acc[interval] = acc.get(interval, 0.0) + inc
        self._last = seen  # series that vanished start again from a baseline
        # re-bucketed engine counts belong to no request: an explicitly invalid span keeps the
        # SDK's trace-based filter from taking the poller's own span (an empty Context would not:
        # the SDK reads a falsy one as "the current one")
        from opentelemetry import context as otel_context
        from opentelemetry import trace

        token = otel_context.attach(trace.set_span_in_context(trace.INVALID_SPAN, otel_context.Context()))
        try:
            n_total = self._record(fused)
        finally:
            otel_context.detach(token)
        return n_total

    def _record(self, fused: dict[str, dict[tuple, float]]) -> int:
        """Record the fused per-bucket increases (model -> (lo, hi) -> count); returns how many."""
        n_total = 0
        for model, incs in fused.items():
            attrs = {A["engine"]: self.engine, A["model"]: model,
                     A["alignment_source"]: source_of(self.source or "", self.encoder_metrics)}
            for (lo, le), inc in sorted(incs.items()):
                n = int(round(inc))
                if n <= 0:
                    continue
                hi = le if le != float("inf") else max(lo * 2, lo + 1.0)
                for k in range(n):
                    self.hist.record(lo + (hi - lo) * (k + 0.5) / n, attrs)
                n_total += n
        return n_total
