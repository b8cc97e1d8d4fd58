"""Kind ``rate``: events per second from a counter, Prometheus ``rate`` over a window.

Example: preemptions per engine (vLLM's ``vllm:num_preemptions_total``, SGLang's retractions
``sglang:num_retracted_requests_total``: docs/metrics.md section 7). An engine preempts a running
request when its KV pool cannot hold the next step's blocks: the request's KV is freed and
recomputed (or swapped) later. A few are normal under load; a sustained rate is the step before
the avalanche (latency, then OOM and errors), and no engine alerts on it.

``rate``, never ``deriv`` or ``increase``: the source is a counter, which ``rate`` reads across
restarts (a reset is a restart, not a fall), and a counter that does not move gives 0, never no
sample. The kind refuses a source whose name is not a counter's (``_total``): SGLang's older
``sglang:num_retracted_reqs`` is a gauge of the last batch's retractions, which ``rate`` would
misread as resets (docs/metrics.md section 7).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusebox import conventions as C
from fusebox.spec.units import format_duration, format_number

from .base import Err, InputSeries, Kind, Rule, Synth, by, check_scrapes, engine_labels, label_str, metric_of, segments, selector, window_word

if TYPE_CHECKING:
    from fusebox.spec.normalised import Signal, Spec
    from fusebox.spec.schema import RawSource


# Where the generated tests' counters start: far from 0, so Prometheus extrapolates the rate to
# the window's start as it does in production (a counter near 0 limits the extrapolation).
COUNTER_BASE = 1000.0


class Rate(Kind):
    name = "rate"
    # rate() needs two samples in its window; four or more is safer.
    window_min_scrapes = 2
    metric_only = True
    growth_only = True

    # -- spec --------------------------------------------------------------------------
    def source_dimension(self, dim: str) -> str | None:
        """Per second: a counter's rate."""
        return {"size": "rate", "count": "count"}.get(dim)

    def check_source(self, backend: str, src: RawSource, spath: tuple, err: Err) -> None:
        super().check_source(backend, src, spath, err)
        if src.metric and not src.metric.endswith("_total"):
            err(spath + ("metric",), f"a rate signal reads a counter, and {src.metric} is not one (no _total suffix)",
                "name the counter (e.g. sglang:num_retracted_requests_total, not the gauge sglang:num_retracted_reqs); "
                "for a gauge's growth use kind: deriv")

    def check_window(self, window: float, scrape: float, path: tuple, err: Err) -> None:
        check_scrapes(window, scrape, 2, "rate", "rate needs two samples; 4 intervals or more is safer", path, err)

    # -- rules -------------------------------------------------------------------------
    def records(self, sig: Signal) -> dict[str, str]:
        """``value``: events per second, ``LEVEL:fusebox_NAME:rateWINDOW`` (``engine:fusebox_preemption_rate:rate2m``)."""
        return {"value": C.record_name(sig.level, f"fusebox_{sig.name}", f"rate{window_word(sig.window_s)}")}

    def diagnosis(self, sig: Signal, spec: Spec) -> list[tuple[str, str]]:
        return [(f"{sig.source.metric} per second per {sig.level}, rate over {format_duration(sig.window_s)} (the alert reads it)",
                 self.records(sig)["value"])]

    def rules(self, sig: Signal, spec: Spec) -> list[Rule]:
        """The counter's rate, summed by the signal's ``by`` (an engine's TP ranks are one engine)."""
        src = sig.source
        inner = f"rate({selector(metric_of(sig), spec, backend=src.backend)}[{format_duration(sig.window_s)}])"
        if src.scale != 1.0:
            inner = f"{inner} * {format_number(src.scale)}"
        inner = engine_labels(inner, sig)
        expr = f"sum by ({by(sig.by)}) ({inner})" if sig.by else inner
        return [{"record": self.records(sig)["value"], "expr": expr}]

    # -- generated tests -----------------------------------------------------------------
    def first_true(self, sig: Signal, interval: float) -> float:
        """The rate reads the target value once the window holds only the phase's samples."""
        return sig.window_s

    def series(self, synth: Synth, phases: list[tuple[int, float]]) -> list[InputSeries]:
        """A counter climbing at each phase's target rate (events per second) from :data:`COUNTER_BASE`."""
        segs, level = [], COUNTER_BASE
        for n, per_s in phases:
            step = per_s * synth.interval / synth.sig.source.scale
            segs.append((n, level, step))
            level += step * n
        return [{"series": metric_of(synth.sig) + label_str(synth.labels), "values": segments(segs)}]

    def result_labels(self, synth: Synth) -> dict[str, str]:
        if not synth.sig.by:
            return dict(synth.labels)
        return {k: v for k, v in synth.labels.items() if k in synth.sig.by}

    # -- panels --------------------------------------------------------------------------
    # No drill-down of its own: the overview draws the value record against the tiers, and the
    # runbook's queries (KV blocks in use, requests waiting) are what one looks at beside it.


KIND = Rate()
