"""Kind ``time_to_full``: seconds until a pool (an engine's KV cache, a GPU's memory) is full at
its current growth.

    (capacity - used) / deriv(used[window])      only where deriv(used) > 0

Where the pool is flat or shrinking the record has **no sample** (never +Inf, never a negative
number), so the alert cannot fire; an engine that restarts (used drops to about 0) gives a
negative growth for one window, hence no sample either, and its alert resolves. A pool already
over its capacity (a collector glitch) counts as full: 0 s.

The comparison runs the other way from a level's: the alert fires when the time left is **at or
below** the threshold (``threshold: 60s`` = "full within a minute"). The spec says so itself:
a time_to_full signal must write ``direction: below`` and ``unit: seconds``, and anything else
is refused.

A source names the amount in use (``metric``) and the pool, in the same unit:

* ``capacity: METRIC``: the pool's size (fusebox_kv_cache_limit_bytes beside
  fusebox_kv_cache_usage_bytes; hw_gpu_memory_limit_bytes beside hw_gpu_memory_usage_bytes;
  SGLang's max_total_num_tokens beside num_used_tokens);
* ``free: METRIC``: the pool's free part (dcgm-exporter's FB_FREE beside FB_USED, both MiB;
  driver-reserved memory is never free, docs/pitfalls.md P7);
* neither, when ``metric`` is a fraction 0-1 of the pool (vLLM's kv_cache_usage_perc, SGLang's
  token_usage): the headroom is ``1 - metric``.

One value per raw series, then the soonest (``min``) per ``by`` labels (per GPU without target
labels for a GPU-level signal without ``by``): an engine whose pool is split over tensor-parallel
GPUs is full when its first share is.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from fusebox import conventions as C
from fusebox.spec import sourceunits
from fusebox.spec.units import format_duration, format_number

from .base import (
    KV_BASE_BYTES,
    TARGET,
    DashboardDef,
    Err,
    InputSeries,
    Kind,
    Rule,
    Synth,
    TestGroup,
    by,
    check_scrapes,
    dcgm_labels,
    engine_labels,
    label_str,
    metric_of,
    segments,
    selector,
    signal_legend,
    signal_panel,
    signal_sel,
    tier_text,
    window_word,
)
from .gpu_memory import KIND as GPU_MEMORY

if TYPE_CHECKING:
    from fusebox.spec.budget import Budget
    from fusebox.spec.normalised import Signal, Spec, Tier
    from fusebox.spec.schema import RawSignal, RawSource


_METRIC = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
# Growth of the synthetic pools of the generated tests, per second, in the metric's own unit.
TEST_GROWTH = {"bytes": 10_000_000.0, "mebibytes": 10.0}
TEST_GROWTH_OTHER = 1000.0  # tokens, or a unit the name does not tell
TEST_BASE = {"bytes": float(KV_BASE_BYTES), "mebibytes": 2000.0}
TEST_BASE_OTHER = 20_000.0


def _selectors(sig: Signal, spec: Spec) -> tuple[str, str | None, str | None]:
    """The source's selectors: the amount in use, the pool's size and its free part (None where not given)."""
    src = sig.source
    capacity, free = (selector(m, spec, backend=src.backend) if m else None for m in (src.capacity, src.free))
    return selector(metric_of(sig), spec, backend=src.backend), capacity, free


class TimeToFull(Kind):
    name = "time_to_full"
    # deriv needs two samples in its window; as for kind deriv, four or more.
    window_min_scrapes = 4
    metric_only = True
    takes_pool = True  # the sources' 'capacity' / 'free' (refused on every other kind)

    def source_dimension(self, dim: str) -> str | None:
        """(capacity - used) / deriv(used): the pool's unit cancels out, seconds are left."""
        return "time" if dim in ("size", "count", "fraction") else None

    def made_of(self, metric: str) -> str:
        return f"(capacity - {metric}) / deriv({metric})"

    def time_left(self, sig: Signal, tier: Tier, budget: Budget, growth_bps: float | None) -> tuple[float | None, str]:
        """The tier's threshold is the time left."""
        return tier.threshold, f"the tier's threshold ({tier.threshold_text})"
    required_direction = "below"  # fires when the time left is at or below the threshold

    # -- spec --------------------------------------------------------------------------
    def check_source(self, backend: str, src: RawSource, spath: tuple, err: Err) -> None:
        super().check_source(backend, src, spath, err)
        for key in ("capacity", "free"):
            value = getattr(src, key)
            if value is not None and not _METRIC.match(value):
                err(spath + (key,), f"{value!r} is not a valid Prometheus metric name", "metric names match [a-zA-Z_:][a-zA-Z0-9_:]*")
        if src.metric is not None:
            bad = sourceunits.check_pool(src.metric, src.capacity, src.free)
            if bad:
                err(spath + (bad[0],), bad[1], bad[2])

    def check_window(self, window: float, scrape: float, path: tuple, err: Err) -> None:
        check_scrapes(window, scrape, 4, "deriv", "deriv needs several samples to fit a slope", path, err)

    def check_fields(self, raw: RawSignal, path: tuple, err: Err) -> tuple[float, ...]:
        if raw.unit != "seconds":
            err(path + ("unit",), f"a time_to_full signal is in seconds, not {raw.unit}", "write 'unit: seconds'")
        if raw.direction != "below":
            err(path + ("direction",) if "direction" in raw.model_fields_set else path,
                "a time_to_full signal fires when the time left is at or BELOW its threshold: say so",
                "write 'direction: below'")
        return ()

    def check_threshold(self, threshold: float, buckets: tuple[float, ...], tp: tuple, err: Err) -> None:
        if threshold <= 0:
            err(tp, "a time-to-full threshold must be positive: the value is never below 0 s",
                "give the time left it should fire at, e.g. 60s")

    # -- rules -------------------------------------------------------------------------
    def records(self, sig: Signal) -> dict[str, str]:
        """``value``: seconds until the pool is full (no sample where it does not grow)."""
        return {"value": C.record_name(sig.level, f"fusebox_{sig.name}", f"seconds_deriv{window_word(sig.window_s)}")}

    def diagnosis(self, sig: Signal, spec: Spec) -> list[tuple[str, str]]:
        """The time left (what the alert reads), then the pool's share in use and its growth per
        second from the source's own series (every series, before the per-``by`` minimum)."""
        src = sig.source
        used, capacity, free = _selectors(sig, spec)
        # already a fraction 0-1 of the pool without capacity or free
        share = f"{used} / {capacity}" if capacity else f"{used} / ({used} + {free})" if free else used
        w = format_duration(sig.window_s)
        return [(f"Seconds until the pool is full, per {sig.level} (no sample while it does not grow)", self.records(sig)["value"]),
                (f"Share of the pool in use (0-1), per series of {src.metric}", share),
                (f"Growth of {src.metric} per second, deriv over {w}", f"deriv({used}[{w}])")]

    def raw_metrics(self, sig: Signal) -> list[str]:
        src = sig.source
        return [metric_of(sig)] + [m for m in (src.capacity, src.free) if m]

    def rules(self, sig: Signal, spec: Spec) -> list[Rule]:
        used, capacity, free = _selectors(sig, spec)
        if capacity:
            head = f"clamp_min({capacity} - {used}, 0)"
        elif free:
            head = f"clamp_min({free}, 0)"
        else:  # a fraction 0-1 of the pool
            head = f"clamp_min(1 - {used}, 0)"
        # `> 0` keeps growing series only: flat, shrinking or restarted pools give no sample.
        expr = f"{head} / (deriv({used}[{format_duration(sig.window_s)}]) > 0)"
        if metric_of(sig).startswith("DCGM_"):
            expr = dcgm_labels(expr)
        expr = engine_labels(expr, sig)
        if sig.by:
            expr = f"min by ({by(sig.by)}) ({expr})"
        elif sig.level == "gpu":  # one series per GPU whoever sent it, as the other GPU-level kinds
            expr = f"min without ({TARGET}) ({expr})"
        return [{"record": self.records(sig)["value"], "expr": expr}]

    # -- generated tests -----------------------------------------------------------------
    def testable(self, sig: Signal) -> bool:
        """A pool with a size or free metric; a fraction's headroom (1 - used) cannot hold a time
        left constant while it grows, so it gets no generated cases."""
        src = sig.source
        return bool(src.capacity or src.free)

    def _unit(self, sig: Signal) -> str | None:
        return sourceunits.metric_unit(metric_of(sig))

    def _rate(self, sig: Signal) -> float:
        return TEST_GROWTH.get(self._unit(sig) or "", TEST_GROWTH_OTHER)

    def _labels(self, synth: Synth) -> dict[str, str]:
        if metric_of(synth.sig).startswith("DCGM_"):
            return GPU_MEMORY._dcgm_labels(synth)
        return synth.labels

    def _pool(self, synth: Synth, segs: list[tuple[int, float, float, float, float]]) -> list[InputSeries]:
        """segs: [(n, used start, used step, capacity start, capacity step)] -> the used series and
        the capacity (or free = capacity - used) series."""
        src, lab = synth.sig.source, label_str(self._labels(synth))
        out: list[InputSeries] = [{"series": metric_of(synth.sig) + lab, "values": segments([(n, u, du) for n, u, du, _, _ in segs])}]
        if src.capacity:
            out.append({"series": src.capacity + lab, "values": segments([(n, c, dc) for n, _, _, c, dc in segs])})
        else:
            out.append({"series": (src.free or "") + lab, "values": segments([(n, c - u, dc - du) for n, u, du, c, dc in segs])})
        return out

    def series(self, synth: Synth, phases: list[tuple[int, float]]) -> list[InputSeries]:
        """Used grows at a constant rate r the whole time; each phase holds the headroom at
        target x r (the capacity grows with it), so deriv is r and the time left is the target
        from the second sample on, and it changes at once at a phase boundary."""
        sig, step_t = synth.sig, synth.interval
        r = self._rate(sig)
        used = TEST_BASE.get(self._unit(sig) or "", TEST_BASE_OTHER)
        segs = []
        for n, target in phases:
            head = round(target * r, 6)
            segs.append((n, used, r * step_t, used + head, r * step_t))
            used += r * step_t * n
        return self._pool(synth, segs)

    def result_labels(self, synth: Synth) -> dict[str, str]:
        s = synth.sig
        if s.by:
            return {k: v for k, v in synth.labels.items() if k in s.by}
        if metric_of(s).startswith("DCGM_"):
            return GPU_MEMORY.result_labels(synth)
        if s.level == "gpu":  # GPU-level records drop every target label of the scraper (see rules)
            return {k: v for k, v in synth.labels.items() if k not in C.TARGET_LABELS}
        return dict(synth.labels)

    def extra_tests(self, synth: Synth) -> list[tuple[str, TestGroup]]:
        """Steady, shrinking and idle pools give no sample and no alert; a restarted engine
        (used drops to about 0) resolves its alert: no sample while the drop is in the window,
        a time left far above every tier after."""
        sig, I = synth.sig, synth.interval
        value = self.records(sig)["value"]
        r = self._rate(sig)
        base = TEST_BASE.get(self._unit(sig) or "", TEST_BASE_OTHER)
        lowest = min(t.threshold for t in sig.tiers)
        n = int((sig.window_s * 2) // I) + 1
        t_eval = format_duration((n - 2) * I)
        cap = base + lowest * r * 4  # a pool with little room: a growth would fire at once

        def quiet(title: str, segs: list[tuple[int, float, float, float, float]]) -> tuple[str, TestGroup]:
            return (f"{sig.alert}: {title}: no time-to-full sample (not +Inf, not negative) and no alert", {
                "interval": format_duration(I), "input_series": self._pool(synth, segs),
                "alert_rule_test": [{"eval_time": t_eval, "alertname": sig.alert, "exp_alerts": []}],
                "promql_expr_test": [{"expr": f"absent({value})", "eval_time": t_eval,
                                      "exp_samples": [{"labels": "{}", "value": 1}]}],
            })

        groups = [
            quiet("a steady pool", [(n, base, 0, cap, 0)]),
            quiet("a shrinking pool", [(n, base, -r * I, cap, 0)]),
            quiet("no traffic (an empty, idle pool)", [(n, 0, 0, cap, 0)]),
        ]
        # Restart: grow with half the lowest threshold left (every tier fires), then used drops to
        # about 0 at t_drop and grows 1/100 as fast; the pool keeps its size.
        max_for = max(t.for_s for t in sig.tiers)
        max_kff = max(t.keep_firing_for_s for t in sig.tiers)
        n_a = int((max_for + sig.window_s + 6 * I) // I) + 1
        n_b = int((sig.window_s + max_kff + 6 * I) // I) + 1
        t_drop = n_a * I
        head = round(lowest / 2 * r, 6)
        used_end = base + r * I * n_a
        pool = used_end + head
        low = r * I / 10
        segs = [(n_a, base, r * I, base + head, r * I), (n_b, low, r * I / 100, pool, 0)]
        groups.append((f"{sig.alert}: an engine restart (used drops to about 0) removes the time-to-full sample "
                       "and resolves the alert", {
                           "interval": format_duration(I), "input_series": self._pool(synth, segs),
                           "alert_rule_test": [{"eval_time": format_duration(t_drop + sig.window_s + max_kff + 2 * I),
                                                "alertname": sig.alert, "exp_alerts": []}],
                           "promql_expr_test": [
                               {"expr": f"count({value} < {format_number(lowest)})", "eval_time": format_duration(t_drop - I),
                                "exp_samples": [{"labels": "{}", "value": 1}]},
                               {"expr": f"absent({value})", "eval_time": format_duration(t_drop + I),
                                "exp_samples": [{"labels": "{}", "value": 1}]},
                               {"expr": f"count({value} > {format_number(max(t.threshold for t in sig.tiers) * 10)})",
                                "eval_time": format_duration(t_drop + sig.window_s + 2 * I),
                                "exp_samples": [{"labels": "{}", "value": 1}]},
                           ]}))
        return groups

    # -- panels --------------------------------------------------------------------------
    def dashboard(self, spec: Spec, sigs: list[Signal]) -> DashboardDef | None:
        """One panel per signal, seconds left per engine or GPU, red below the critical line."""
        panels = tuple(signal_panel(
            s, f"{s.alert}: seconds until full",
            f"{s.description} The alert fires when the time left is at or below {tier_text(s)}. "
            "No line where the pool is flat, shrinking or just restarted (no sample, not +Inf).",
            signal_sel(s, self.records(s)["value"]), signal_legend(s)) for s in sigs)
        return DashboardDef("time-to-full", f"fusebox / {spec.name} / time to full",
                            "Seconds until each KV pool and GPU memory is full at its current growth.", panels) if panels else None


KIND = TimeToFull()
