"""Kind ``gauge``: a value read as it is (a raw gauge, or a PromQL expression of your own).

Examples: memory-bandwidth saturation, PCIe link utilization. The value record keeps one series
per GPU (or per ``by`` labels) whoever sent it, so every GPU-level alert scopes its fuse alike.
An alert that fires above its line filters the series first and aggregates what is over it
(``max without (...) (x >= 0.92)``): the same GPUs at the same evaluation as the value record
``>= 0.92``, without every GPU's series recorded at the evaluation interval (the record serves
the panels, at the slow interval).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusebox import conventions as C
from fusebox.spec.units import format_number

from .base import (
    LEGEND,
    TARGET,
    DashboardDef,
    InputSeries,
    Kind,
    PanelDef,
    Query,
    Rule,
    Synth,
    by,
    dashboard_records,
    dcgm_labels,
    engine_labels,
    label_str,
    metric_of,
    segments,
    sel,
    selector,
    signal_legend,
    signal_panel,
    signal_sel,
    tier_text,
)

if TYPE_CHECKING:
    from fusebox.spec.normalised import Signal, Spec, Tier


class Gauge(Kind):
    name = "gauge"
    needs_base_unit = True  # compared as read

    def records(self, sig: Signal) -> dict[str, str]:
        return {"value": C.record_name(sig.level, f"fusebox_{sig.name}", "ratio" if sig.unit == "ratio" else sig.unit)}

    def diagnosis(self, sig: Signal, spec: Spec) -> list[tuple[str, str]]:
        unit = "0-1" if sig.unit == "ratio" else sig.unit.replace("_per_second", "/s").replace("_", " ")
        return [(f"{sig.name.replace('_', ' ').capitalize()} per {sig.level} ({unit})", self.records(sig)["value"])]

    def _value_expr(self, sig: Signal, spec: Spec) -> tuple[str, str | None]:
        """(the value's expression before its aggregation, the aggregation or None)."""
        src = sig.source
        expr = src.expr if src.expr else selector(metric_of(sig), spec, backend=src.backend)
        if src.scale != 1.0:
            expr = f"({expr}) * {format_number(src.scale)}"
        if src.metric and src.metric.startswith("DCGM_"):
            expr = dcgm_labels(expr)
        expr = engine_labels(expr, sig)
        if sig.by:
            return expr, f"max by ({by(sig.by)})"
        if sig.level == "gpu":
            # As for GPU memory: one series per GPU whoever sent it, so every GPU-level signal
            # scopes its fuse as {cluster, host_name, hw_id} and one level is held or released
            # for the same GPU by every alert.
            return expr, f"max without ({TARGET})"
        return expr, None

    def _record(self, sig: Signal, spec: Spec) -> Rule:
        expr, agg = self._value_expr(sig, spec)
        return {"record": self.records(sig)["value"], "expr": f"{agg} ({expr})" if agg else expr}

    @staticmethod
    def filters_first(sig: Signal) -> bool:
        """Whether the alerts compare the series before aggregating them (``direction: above``).

        ``max(x) >= T`` holds exactly where some series of the group is ``>= T``, so
        ``max by (...) (x >= T)`` fires for the same groups at the same evaluation with the same
        value (the max). The alert then reads no record: the value record (every GPU's series,
        for the panels) moves to the slow interval, and on vmalert, where a record is stored only
        after its group's evaluation, the alert fires one evaluation sooner. A below-direction
        alert fires when the max is under the line, i.e. when *every* series is, which a filter
        cannot say: it reads the value record, as the other kinds do."""
        return sig.direction == "above"

    def rules(self, sig: Signal, spec: Spec) -> list[Rule]:
        return [] if self.filters_first(sig) else [self._record(sig, spec)]

    def alert_expr(self, sig: Signal, tier: Tier, spec: Spec) -> str:
        """Above: the series over the threshold, then aggregated as the value record is
        (:meth:`filters_first`); below: the value record against the threshold."""
        if not self.filters_first(sig):
            return super().alert_expr(sig, tier, spec)
        expr, agg = self._value_expr(sig, spec)
        if sig.source.expr:  # a user's expression may end in `or` / `and`: compare all of it
            expr = f"({expr})"
        cond = f"{expr} >= {format_number(tier.threshold)}"
        return f"{agg} ({cond})" if agg else cond

    def panel_rules(self, sig: Signal, spec: Spec) -> list[Rule]:
        """The value record, for panels and runbooks, when no alert reads it (:meth:`filters_first`):
        in ``fusebox-<signal>-panels`` at ``global.slow_evaluation_interval``."""
        return [self._record(sig, spec)] if self.filters_first(sig) else []

    # -- generated tests -----------------------------------------------------------------
    def testable(self, sig: Signal) -> bool:
        return not sig.source.expr  # custom expression: no generic way to synthesise its inputs

    def series(self, synth: Synth, phases: list[tuple[int, float]]) -> list[InputSeries]:
        s = synth.sig
        return [{"series": metric_of(s) + label_str(synth.labels),
                 "values": segments([(n, v / s.source.scale, 0) for n, v in phases])}]

    def result_labels(self, synth: Synth) -> dict[str, str]:
        s = synth.sig
        if s.by:
            return {k: v for k, v in synth.labels.items() if k in s.by}
        if s.level == "gpu":
            # GPU-level records drop every target label of the scraper (see rules)
            return {k: v for k, v in synth.labels.items() if k not in C.TARGET_LABELS}
        return dict(synth.labels)

    # -- panels --------------------------------------------------------------------------
    def dashboard(self, spec: Spec, sigs: list[Signal]) -> DashboardDef | None:
        """Always made: beside the gauges it shows energy per token and prefix-cache hit rate."""
        panels: list[PanelDef] = []
        for sig in sigs:
            r = self.records(sig)
            panels.append(signal_panel(sig, f"{sig.alert}: {sig.name.replace('_', ' ')}",
                                       f"{sig.description} Lines at {tier_text(sig)}.",
                                       signal_sel(sig, r["value"]), signal_legend(sig)))
        # Not spec signals (no alert of their own): linked to the alert whose diagnosis uses them --
        # energy per token to the first GPU-level gauge (memory bandwidth in the shipped spec), the
        # prefix-cache hit rate to the first growth (deriv) signal.
        first = spec.signals[0].alert
        gpu_gauge = next((s.alert for s in sigs if s.level == "gpu"), first)
        growth = next((s.alert for s in spec.signals if s.kind == "deriv"), first)
        d = dashboard_records()
        panels += [
            PanelDef("Energy per generated token",
                     "GPU power (hw.power, W) per host over generated tokens per second (vLLM, SGLang; 5m rate): joules per token.",
                     (Query(sel(d["energy_per_token"], "host"), LEGEND["host"]),), "joule", (gpu_gauge,)),
            PanelDef("Prefix-cache hit rate",
                     "Prefix-cache hits over queries (vLLM counters, 5m rate), or SGLang's cache_hit_rate gauge; a drop speeds up KV growth.",
                     tuple(Query(sel(d[f"prefix_hit_{e}"], "host"), f"{label} {{{{host_name}}}} {{{{model_name}}}}")
                           for e, label in (("vllm", "vLLM"), ("sglang", "SGLang")) if e in spec.engines),
                     "percentunit", (growth,), soft_max=1.0),
        ]
        shown = [s.name.replace("_", " ") for s in sigs] + ["energy per token", "prefix-cache hit rate"]
        return DashboardDef("secondary", f"fusebox / {spec.name} / secondary signals",
                            ", ".join(shown).capitalize() + ".", tuple(panels))


KIND = Gauge()
