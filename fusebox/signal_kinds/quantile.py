"""Kind ``quantile``: a quantile of a classic histogram, ``histogram_quantile`` over summed bucket rates.

Example: P95 cross-modal alignment latency (seed: warning 0.85 s, critical 1.28 s). Every
threshold must be a bucket bound: between bounds a quantile is only interpolated. Because it is
one, the alert reads the share of observations slower than the threshold, from the threshold's
bucket and the count alone (2 series per engine per tier instead of every bucket):
``Pq >= T`` exactly when ``share over T >= 1 - q``. ``histogram_quantile`` finds the first bucket
whose cumulative count reaches ``q * count``; ``Pq > T`` when the bucket at ``T`` holds fewer, and
at exactly ``q * count`` it interpolates to the bucket's upper bound, ``Pq == T``, where the share is
``1 - q`` up to float rounding, which the alert allows for (:data:`SHARE_EPSILON`): both fire (the
generated tests drive each threshold exactly). The quantile records (P50,
Pq, P99 over every bucket) feed only panels and run in the signal's slow group.
Zero traffic gives no quantile sample at all, never an alert
(docs/pitfalls.md P1): ``histogram_quantile`` alone would give NaN on Prometheus and nothing on
VictoriaMetrics (MetricsQL drops NaN), so the records keep only series with traffic, the same on both;
the share divides by a positive count rate, so it has no sample either.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

from fusebox import conventions as C
from fusebox import promsim
from fusebox.spec import mmstages
from fusebox.spec.units import format_duration, format_number

from .base import (
    OBS_PER_STEP,
    UNITS,
    DashboardDef,
    Err,
    InputSeries,
    Kind,
    PanelDef,
    Query,
    Rule,
    ScenarioModel,
    Synth,
    TestGroup,
    by,
    check_scrapes,
    engine_labels,
    kept_by,
    label_str,
    le_regex,
    metric_of,
    pod_engine,
    quantile_of,
    reads_alignment_histogram,
    segments,
    sel,
    selector,
    signal_legend,
    signal_sel,
    window_word,
)

if TYPE_CHECKING:
    from fusebox.spec.budget import Budget
    from fusebox.spec.normalised import Signal, Spec, Tier
    from fusebox.spec.schema import RawSignal

# Rounding allowance of the share comparison (:meth:`Quantile.alert_expr`).
SHARE_EPSILON = 1e-12

# What fusebox's alignment histogram measured, by its `source` label (conventions.ALIGNMENT_SOURCES,
# docs/collectors.md "Alignment latency"): (short name, what it is, what to do when the alert reads it).
ALIGNMENT_MEASURED = {
    "handoff": ("the hand-off",
                "the instrumented vision-encoder -> language-decoder hand-off (alignment_timer, record_alignment), "
                "what the thresholds are meant for",
                "Follow the SOP below as written."),
    "encoder": ("the encoder stage",
                "the engine's own encoder / multimodal-stage histogram (fusebox collect latency), "
                "compared with thresholds meant for the hand-off",
                "Read it as the encoder's own time, close to the hand-off but not it: batch size, image sizes and GPU "
                "contention explain it, and the SOP below applies."),
    "ttft": ("time to first token",
             "time to first token (stand-in: queueing + prefill + encoder, where the engine publishes no encoder "
             "timing), compared with thresholds meant for the hand-off",
             "It is an upper bound of the hand-off, not the hand-off: before acting on the encoder, check the engine's "
             "queue (`vllm:num_requests_waiting`, `sglang:num_queue_reqs`) and its prompt lengths, since queueing or a "
             "long prefill alone trips it; an alert with an empty queue and short prompts points at the encoder. To "
             "measure the hand-off itself, instrument it (`alignment_timer`) or give `fusebox collect latency` the "
             "engine's encoder histogram (`--encoder-metric NAME`); until then expect it to fire under load the "
             "hand-off thresholds were never meant for."),
}


class Quantile(Kind):
    name = "quantile"
    scale_cannot_help = False  # (that note speaks of pools and scales; a histogram's fix is another metric)

    def time_left(self, sig: Signal, tier: Tier, budget: Budget, growth_bps: float | None) -> tuple[float | None, str]:
        return None, f"n/a: a latency ({sig.unit}) exhausts no resource"

    # rate() needs two samples in its window; four or more is safer.
    window_min_scrapes = 2
    metric_only = True
    growth_only = True
    variable_source: ClassVar[tuple[str, int] | None] = ("engine", 0)
    # The alert reads the share over the threshold's bucket: the generated tests also drive the
    # quantile to exactly each threshold (Pq == T fires, as the share == 1 - q does).
    edge_tested = True

    # -- spec --------------------------------------------------------------------------
    def check_window(self, window: float, scrape: float, path: tuple, err: Err) -> None:
        check_scrapes(window, scrape, 2, "rate", "rate needs two samples; 4 intervals or more is safer", path, err)

    def check_fields(self, raw: RawSignal, path: tuple, err: Err) -> tuple[float, ...]:
        if raw.quantile is None or not 0 < raw.quantile < 1:
            err(path + ("quantile",), "a quantile signal needs 'quantile' between 0 and 1", "e.g. 'quantile: 0.95'")
        if not raw.buckets:
            err(path, "a quantile signal needs 'buckets'", "list the histogram's bucket bounds in seconds, with every threshold among them")
            return ()
        buckets = tuple(float(b) for b in raw.buckets)
        if list(buckets) != sorted(set(buckets)):
            err(path + ("buckets",), "buckets must be strictly increasing", "sort them and drop repeats")
        return buckets

    def check_threshold(self, threshold: float, buckets: tuple[float, ...], tp: tuple, err: Err) -> None:
        if not buckets:
            return
        if not any(abs(threshold - b) < 1e-12 for b in buckets):
            err(tp, f"threshold {format_number(threshold)}s is not a histogram bucket boundary",
                f"add {format_number(threshold)} to 'buckets' (a quantile between bounds is only interpolated)")
        elif abs(threshold - buckets[-1]) < 1e-12:
            err(tp, f"threshold {format_number(threshold)}s is the highest bucket bound: a quantile can never exceed it",
                "add a larger bucket bound after it (thresholds need neighbours on both sides)")

    # -- rules -------------------------------------------------------------------------
    def records(self, sig: Signal) -> dict[str, str]:
        """``value`` (the quantile; panels only, the alert reads ``over_threshold``), ``p50``, ``p99``, ``rate`` (observations/s), ``bucket_rate``
        (summed bucket rates), ``over_threshold`` (share of observations above each threshold, label ``le``)."""
        w = window_word(sig.window_s)
        hist, lvl = metric_of(sig), sig.level
        return {
            "value": C.record_name(lvl, f"fusebox_{sig.name}", f"rate{w}"),
            "p50": C.record_name(lvl, hist, f"p50_rate{w}"),
            "p99": C.record_name(lvl, hist, f"p99_rate{w}"),
            "rate": C.record_name(lvl, hist, f"count_rate{w}"),
            "bucket_rate": C.record_name(lvl, f"{hist}_bucket", f"rate{w}"),
            "over_threshold": C.record_name(lvl, f"fusebox_{sig.name}_over_threshold", f"ratio_rate{w}"),
        }

    def diagnosis(self, sig: Signal, spec: Spec) -> list[tuple[str, str]]:
        """The quantile, the share over each threshold (what the alert reads) and the observations per second."""
        names, w = self.records(sig), format_duration(sig.window_s)
        where = f"per {sig.level}"
        return [(f"P{format_number(quantile_of(sig) * 100)} {where} over {w}", names["value"]),
                (f"Share of observations slower than each threshold (label le), {where} (the alert reads it)",
                 names["over_threshold"]),
                (f"Observations per second, {where}", names["rate"])] + (self._stage_diagnosis(spec) if reads_alignment_histogram(sig) else [])

    # -- the multimodal stages (fusebox/spec/mmstages.py): the alignment signal broken down --
    @staticmethod
    def _stage_relabel(alias: mmstages.StageAlias, expr: str) -> str:
        """An engine's series named as the signals name engines (``engine`` = NAMESPACE/POD,
        ``model`` = model_name); the gateway's and fusebox's own series keep their labels."""
        return pod_engine(expr) if alias.producer in ("vllm", "sglang") else expr

    def _stage_rate(self, alias: mmstages.StageAlias, metric: str, spec: Spec, w: str) -> str:
        """``sum by (engine...) (rate(metric[w]))``, both SGLang spellings where SGLang writes it."""
        names = C.sglang_names(metric) if alias.producer == "sglang" else (metric,)
        backend = alias.producer if alias.producer in ("vllm", "sglang") else "fusebox"
        rates = " or ".join(f"rate({selector(n, spec, extra=dict(alias.matchers), backend=backend)}[{w}])" for n in names)
        extra = ("le",) if metric.endswith("_bucket") else ()
        return f"sum by ({by(mmstages.STAGE_BY, extra)}) ({self._stage_relabel(alias, rates if len(names) == 1 else f'({rates})')})"

    def stage_rules(self, spec: Spec) -> list[Rule]:
        """The stage records (:func:`fusebox.spec.mmstages.records`), one rule per published alias
        the spec's producers publish: each timed stage's P95 per engine over the dashboard rate
        window (no sample without traffic, as the quantile's own records), label ``stage``; each
        cache's hit ratio (hits over lookups, or over hits + misses), label ``cache``. Each also
        carries ``producer`` (vllm, sglang, smg, fusebox): two producers timing one stage of one
        engine stay two series. One rule per record, its aliases joined by ``or`` (their label
        sets differ by ``stage``/``cache`` and ``producer``)."""
        w = format_duration(C.DASHBOARD_RATE_WINDOW_S)
        names = mmstages.records(window_word(C.DASHBOARD_RATE_WINDOW_S))
        keep = by(mmstages.STAGE_BY)
        stages: list[str] = []
        caches: list[str] = []

        def labelled(expr: str, label: str, value: str, producer: str) -> str:
            expr = f'label_replace({expr}, "{label}", "{value}", "", "")'
            return f'label_replace({expr}, "{mmstages.PRODUCER_LABEL}", "{producer}", "", "")'

        for a in mmstages.read_aliases(spec):
            if a.stage == "cache":
                hits = self._stage_rate(a, a.metric, spec, w)
                den = self._stage_rate(a, a.total, spec, w) if a.total else f"{hits} + {self._stage_rate(a, a.misses or '', spec, w)}"
                caches.append(labelled(f"{hits}\n    / (({den}) > 0)", mmstages.CACHE_LABEL, a.cache_id, a.producer))
            else:
                q = f"histogram_quantile({format_number(mmstages.STAGE_QUANTILE)}, {self._stage_rate(a, a.metric + '_bucket', spec, w)})"
                traffic = f"and on ({keep}) ({self._stage_rate(a, a.metric + '_count', spec, w)} > 0)"
                stages.append(labelled(f"({q}\n    {traffic})", mmstages.STAGE_LABEL, a.stage, a.producer))
        out: list[Rule] = []
        if stages:
            out.append({"record": names["stage_p95"], "expr": "\n  or ".join(stages)})
        if caches:
            out.append({"record": names["cache_hit"], "expr": "\n  or ".join(caches)})
        return out

    def dashboard_records(self, sigs: list[Signal], spec: Spec) -> list[Rule]:
        """The stage records, when a signal reads fusebox's alignment histogram."""
        return self.stage_rules(spec) if any(reads_alignment_histogram(s) for s in sigs) else []

    def _stage_diagnosis(self, spec: Spec) -> list[tuple[str, str]]:
        """A query per stage the spec's producers time, the stage whose P95 grew most, the caches' hit ratios."""
        names = mmstages.records(window_word(C.DASHBOARD_RATE_WINDOW_S))
        read = mmstages.read_aliases(spec)
        r, out = names["stage_p95"], []
        for stage in mmstages.TIMED_STAGES:
            who = sorted({a.producer for a in read if a.stage == stage})
            if who:
                out.append((f"P95 of the {stage} stage per engine (from {', '.join(who)}; docs/metrics.md section 8)",
                            f'{r}{{{mmstages.STAGE_LABEL}="{stage}"}}'))
        if out:
            out.append(("The stage whose P95 grew most in the last hour, per engine (label stage: look there first)",
                        f"topk by (cluster, host_name, engine) (1, {r} - {r} offset 1h)"))
        if any(a.stage == "cache" for a in read):
            out.append(("Encoder / embedding cache hit ratio per cache (label cache; a fall sends more work to the encoder)",
                        names["cache_hit"]))
        return out

    def kept_labels(self, sig: Signal) -> tuple[str, ...] | None:
        # summed by them (none at all without by), `source` kept on fusebox's alignment
        # histogram: base.kept_by
        return kept_by(sig)

    def measured(self, sig: Signal) -> list[tuple[str, str, str, str]]:
        """On fusebox's alignment histogram, its ``source`` values (:data:`ALIGNMENT_MEASURED`)."""
        if not reads_alignment_histogram(sig) or C.ALIGNMENT_SOURCE_LABEL not in kept_by(sig):
            return []  # not that histogram, or summed by nothing: no alert carries the label
        return [(v, *ALIGNMENT_MEASURED[v]) for v in C.ALIGNMENT_SOURCES]

    def raw_metrics(self, sig: Signal) -> list[str]:
        # `_count` alone: the buckets are exported with it, so its absence says the same as an
        # absent() over every bucket series, at a fraction of the cost.
        return [f"{sig.source.metric}_count"]

    def rules(self, sig: Signal, spec: Spec) -> list[Rule]:
        """The count rate and, per tier, the share of observations over its threshold: the
        threshold's bucket and the count, never the other buckets."""
        names = self.records(sig)
        w = format_duration(sig.window_s)
        count = selector(f"{sig.source.metric}_count", spec, backend=sig.source.backend)
        out: list[Rule] = [
            {"record": names["rate"], "expr": f"sum by ({by(kept_by(sig))}) ({engine_labels(f'rate({count}[{w}])', sig)})"},
        ]
        # The share of observations above each threshold. Pq >= T exactly when this share >= 1 - q,
        # because T is a bucket bound (module docstring); the alert reads it.
        for t in sig.tiers:
            bucket = selector(f"{sig.source.metric}_bucket", spec, regex={"le": le_regex(t.threshold)}, backend=sig.source.backend)
            out.append({
                "record": names["over_threshold"],
                "expr": (f"1 - sum by ({by(kept_by(sig))}) ({engine_labels(f'rate({bucket}[{w}])', sig)})\n"
                         f"  / ({names['rate']} > 0)"),  # no traffic: no sample, as the quantile
                "labels": {"le": format_number(t.threshold)},
            })
        return out

    def alert_expr(self, sig: Signal, tier: Tier, spec: Spec) -> str:
        """The tier's share record (without its ``le`` label, so the alert's labels are the
        quantile's) at or over ``1 - q``, less :data:`SHARE_EPSILON`: the same condition as
        ``Pq >= threshold``. At exactly ``q * count`` in the threshold's bucket histogram_quantile
        returns the bound (fires) while ``1 - bucket / count`` may round one ulp under ``1 - q``
        (0.04999999999999993 at 1.28 s in the generated edge test); the epsilon absorbs that
        rounding and is far under one observation in a window (a share of 1e-12)."""
        share = f"{self.records(sig)['over_threshold']}{{le=\"{format_number(tier.threshold)}\"}}"
        return f"max without (le) ({share}) >= {format_number(round(1 - quantile_of(sig), 12))} - {SHARE_EPSILON:g}"

    def panel_rules(self, sig: Signal, spec: Spec) -> list[Rule]:
        """Every bucket's rate and P50 / Pq / P99 over them, for the quantile panel."""
        names = self.records(sig)
        w = format_duration(sig.window_s)
        bucket = selector(f"{sig.source.metric}_bucket", spec, backend=sig.source.backend)
        # Only where observations arrived: with zero traffic histogram_quantile is NaN on Prometheus
        # and absent on VictoriaMetrics; `and` on a positive rate makes it absent on both (P1).
        traffic = f"and on ({by(kept_by(sig))}) ({names['rate']} > 0)"
        return [
            {"record": names["bucket_rate"], "expr": f"sum by ({by(kept_by(sig), ('le',))}) ({engine_labels(f'rate({bucket}[{w}])', sig)})"},
            {"record": names["value"], "expr": f"histogram_quantile({format_number(quantile_of(sig))}, {names['bucket_rate']})\n  {traffic}"},
            {"record": names["p50"], "expr": f"histogram_quantile(0.5, {names['bucket_rate']})\n  {traffic}"},
            {"record": names["p99"], "expr": f"histogram_quantile(0.99, {names['bucket_rate']})\n  {traffic}"},
        ]

    def scenario_series(self, sig: Signal, scenario: ScenarioModel, times: list[float]) -> dict[str, list[float]]:
        """The signal's quantile of each engine's hand-off histogram over its window, when it reads
        the fusebox alignment histogram; seconds (NaN without traffic)."""
        if sig.source.backend != "fusebox" or sig.source.metric != C.PROM["alignment_duration"]:
            return {}
        return {e: scenario.quantile_series(e, times, quantile_of(sig), sig.buckets, sig.window_s) for e in scenario.engine_ids}

    # -- generated tests -----------------------------------------------------------------
    def distribution(self, synth: Synth, v: float) -> list[float]:
        """Per-step cumulative counts per bucket (+Inf last) whose quantile lies near ``v``.

        v is a threshold * (1 +/- DELTA), the threshold itself, or "safe"/idle. Just above a
        bound T: 94% of observations at or below T, so the 95th lies in the next bucket; just
        below: 96%; at T: exactly 95%, so the quantile is T and the share over T exactly 5%.
        """
        sig = synth.sig
        bounds = list(sig.buckets)
        if math.isnan(v):
            return [0.0] * (len(bounds) + 1)
        # the bucket bound nearest to v is the threshold (validated to be a bound)
        t = min(bounds, key=lambda b: abs(b - v))
        i = bounds.index(t)
        if v < min(x.threshold for x in sig.tiers) * 0.9:  # safe: everything in the first bucket
            return [OBS_PER_STEP] * (len(bounds) + 1)
        share_above = (1 - quantile_of(sig)) + (0.01 if v > t else -0.01 if v < t else 0.0)
        at_or_below = round(OBS_PER_STEP * (1 - share_above))
        return [0.0] * i + [at_or_below] * (1) + [OBS_PER_STEP] * (len(bounds) - i)

    def alert_value(self, synth: Synth, tier: Tier, v: float) -> float:
        """The share of observations over the tier's threshold (what the alert reads, not the quantile)."""
        cum = self.distribution(synth, v)
        bounds = list(synth.sig.buckets)
        i = bounds.index(min(bounds, key=lambda b: abs(b - tier.threshold)))
        return 1 - cum[i] / cum[-1]

    def exact(self, synth: Synth, v: float) -> float:
        return promsim.histogram_quantile(quantile_of(synth.sig), list(synth.sig.buckets), self.distribution(synth, v))

    def series(self, synth: Synth, phases: list[tuple[int, float]], start: list[float] | None = None) -> list[InputSeries]:
        bounds = list(synth.sig.buckets)
        les = [format_number(b) for b in bounds] + ["+Inf"]
        per_le: list[list[tuple[int, float, float]]] = [[] for _ in les]
        level = list(start) if start else [0.0] * len(les)
        for n, v in phases:
            cum = self.distribution(synth, v)
            for j in range(len(les)):
                per_le[j].append((n, level[j], cum[j]))
                level[j] += cum[j] * n
        metric = synth.sig.source.metric
        out: list[InputSeries] = []
        for j, le in enumerate(les):
            out.append({"series": f"{metric}_bucket" + label_str({**synth.labels, "le": le}),
                        "values": segments(per_le[j])})
        out.append({"series": f"{metric}_count" + label_str(synth.labels), "values": segments(per_le[-1])})
        return out

    def result_labels(self, synth: Synth) -> dict[str, str]:
        return {k: v for k, v in synth.labels.items() if k in kept_by(synth.sig)}

    def extra_tests(self, synth: Synth) -> list[tuple[str, TestGroup]]:
        """Zero traffic: buckets frozen at earlier counts, every rate 0; no P50/P95/P99 sample at
        all (absent, not NaN: the same on Prometheus and VictoriaMetrics) and no alert. The
        generator adds the absent-signal check (none for these metrics: their series are there)."""
        sig, interval = synth.sig, synth.interval
        n = int((sig.window_s * 2) // interval) + 1
        frozen = [40.0 * OBS_PER_STEP / 1000 * (j + 1) for j in range(len(sig.buckets) + 1)]
        series = self.series(synth, [(n, math.nan)], start=frozen)
        t_eval = format_duration((n - 2) * interval)
        names = self.records(sig)
        return [(f"{sig.alert}: zero traffic gives no quantile sample (absent, not NaN) and no alert", {
            "interval": format_duration(interval), "input_series": series,
            "alert_rule_test": [{"eval_time": t_eval, "alertname": sig.alert, "exp_alerts": []}],
            "promql_expr_test": [{"expr": f"absent({names[r]})", "eval_time": t_eval,
                                  "exp_samples": [{"labels": "{}", "value": 1}]} for r in ("p50", "value", "p99")],
        })]

    # -- panels --------------------------------------------------------------------------
    def _stage_panels(self, spec: Spec, sig: Signal) -> list[PanelDef]:
        """One row under the alignment quantiles: P95 per multimodal stage, and the caches' hit ratios."""
        names = mmstages.records(window_word(C.DASHBOARD_RATE_WINDOW_S))
        read = mmstages.read_aliases(spec)
        timed = ", ".join(sorted({f"{a.stage} ({a.producer})" for a in read if a.stage != "cache"}))
        caches = ", ".join(a.cache_id for a in read if a.stage == "cache")
        w = format_duration(C.DASHBOARD_RATE_WINDOW_S)
        return [
            PanelDef("Multimodal stages: P95 per stage",
                     f"The alignment signal broken down: P95 over {w} of each stage an engine or fusebox times ({timed}), "
                     "label stage (download, decode, encoder, handoff; docs/metrics.md section 8 lists every engine's name "
                     "for each, published or proposed). The stage that rose with the alignment P95 is where to look.",
                     (Query(sel(names["stage_p95"], "engine"), "{{stage}} ({{producer}}) {{host_name}} {{engine}}"),),
                     UNITS["seconds"], (sig.alert,), width=16),
            PanelDef("Encoder / embedding caches: hit ratio",
                     f"Hits over lookups per cache ({caches}), over {w}: a hit skips the encoder, so a falling ratio "
                     "sends more work to it.",
                     (Query(sel(names["cache_hit"], "engine"), "{{cache}} {{host_name}} {{engine}}"),),
                     "percentunit", (sig.alert,), width=8, soft_max=1.0),
        ]

    def variable_record(self, sig: Signal) -> str:
        """The observation rate: a series per engine whenever its histogram exists (0 without
        traffic), where the quantiles have none without traffic."""
        return self.records(sig)["rate"]

    def dashboard(self, spec: Spec, sigs: list[Signal]) -> DashboardDef | None:
        if not sigs:
            return None
        panels: list[PanelDef] = []
        for sig in sigs:
            r = self.records(sig)
            q = int(round(quantile_of(sig) * 100))
            lg, per, measured = signal_legend(sig), "per engine", ""
            if self.measured(sig):  # what was measured: base.kept_by keeps it apart (the legend ends with it)
                per = f"per engine and {C.ALIGNMENT_SOURCE_LABEL}"
                measured = (f"Label {C.ALIGNMENT_SOURCE_LABEL} (last in each legend) says what was measured: "
                            + "; ".join(f"{v}: {what}" for v, _short, what, _todo in self.measured(sig)) + ". ")
            panels.append(PanelDef(
                f"{sig.alert}: P50 / P{q} / P99 {per}",
                f"{sig.description} {measured}Lines at {', '.join(f'{t.name} {t.threshold_text}' for t in sig.tiers)}; "
                f"The alert reads the share over each threshold's bucket (next panel), the same condition as P{q} at or over it; "
                f"these lines are recorded every slow evaluation interval. A gap means no traffic (no sample: docs/pitfalls.md P1).",
                (Query(signal_sel(sig, r["p50"]), "P50 " + lg),
                 Query(signal_sel(sig, r["value"]), f"P{q} " + lg),
                 Query(signal_sel(sig, r["p99"]), "P99 " + lg)),
                UNITS[sig.unit], (sig.alert,), sig.tiers, width=24,
            ))
            if reads_alignment_histogram(sig) and sig is next(s for s in sigs if reads_alignment_histogram(s)):
                panels += self._stage_panels(spec, sig)
            panels.append(PanelDef(
                "Share of observations over each threshold",
                "Fraction of observations slower than each tier's threshold (label le), over the rule window: what the alert reads. "
                f"At or above {1 - quantile_of(sig):g} at a threshold means P{q} is at or above it.",
                (Query(signal_sel(sig, r["over_threshold"]), "> {{le}}s " + lg),),
                "percentunit", (sig.alert,), soft_max=1.0,
            ))
            panels.append(PanelDef(
                "Observations per second", f"Rate of observations {per}: zero traffic explains a gap in the quantiles.",
                (Query(signal_sel(sig, r["rate"]), lg),), "ops", (sig.alert,),
            ))
        return DashboardDef("alignment-latency", f"fusebox / {spec.name} / alignment latency",
                            "Alignment latency quantiles and the share of observations over each threshold.", tuple(panels))


KIND = Quantile()
