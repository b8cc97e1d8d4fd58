"""Kind ``deriv``: the growth rate of a gauge, Prometheus ``deriv`` over a window.

Example: KV-cache growth in bytes per second (seed: warning 9.2 MB/s, critical 14.7 MB/s).
``deriv``, not ``rate``: KV bytes is a gauge that falls when blocks are freed; ``rate`` would
read every fall as a counter reset and invent growth (docs/pitfalls.md P3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusebox import conventions as C
from fusebox import promsim
from fusebox.spec.units import format_duration, format_number, humanize

from .base import (
    KV_BASE_BYTES,
    LEGEND,
    DashboardDef,
    Err,
    InputSeries,
    Kind,
    PanelDef,
    Query,
    Rule,
    ScenarioModel,
    Synth,
    by,
    check_scrapes,
    dashboard_records,
    engine_labels,
    gigabytes,
    label_str,
    metric_of,
    segments,
    sel,
    selector,
    signal_legend,
    signal_panel,
    signal_sel,
    tier_text,
    window_word,
)

if TYPE_CHECKING:
    from fusebox.spec.budget import Budget
    from fusebox.spec.normalised import Signal, Spec, Tier


class Deriv(Kind):
    name = "deriv"
    # deriv fits a slope: it needs several samples in its window.
    window_min_scrapes = 4
    metric_only = True
    growth_only = True
    variable_source = ("engine", 1)

    def source_dimension(self, dim: str) -> str | None:
        """Per second: a gauge's slope."""
        return {"size": "rate", "count": "count"}.get(dim)

    def grows_pool_bytes(self, sig: Signal) -> bool:
        return sig.unit == "bytes_per_second"

    def time_left(self, sig: Signal, tier: Tier, budget: Budget, growth_bps: float | None) -> tuple[float | None, str]:
        """A byte growth fills the KV pool's free part (``budget.kv_pool``, ``budget.kv_fill``) at the threshold."""
        if not self.grows_pool_bytes(sig):
            return super().time_left(sig, tier, budget, growth_bps)
        free = budget.kv_pool_bytes * (1 - budget.kv_fill)
        return free / tier.threshold, (f"KV pool {gigabytes(budget.kv_pool_bytes)} at {format_number(budget.kv_fill * 100)}% full: "
                                       f"{gigabytes(free)} free / {humanize(tier.threshold, 'bytes_per_second')}")

    # -- spec --------------------------------------------------------------------------
    def check_window(self, window: float, scrape: float, path: tuple, err: Err) -> None:
        check_scrapes(window, scrape, 4, "deriv", "deriv needs several samples to fit a slope", path, err)

    # -- rules -------------------------------------------------------------------------
    def records(self, sig: Signal) -> dict[str, str]:
        """``value``: the gauge's slope over the window, named after the gauge, not the signal
        (``engine:fusebox_kv_cache_usage_bytes:deriv1m``), so two signals over one gauge and window
        (KV growth and KV OOM) share one record and one group: it is computed once."""
        return {"value": C.record_name(sig.level, metric_of(sig), f"deriv{window_word(sig.window_s)}")}

    def diagnosis(self, sig: Signal, spec: Spec) -> list[tuple[str, str]]:
        unit = sig.unit.replace("_per_second", "/s").replace("_", " ")
        return [(f"Growth of {sig.source.metric} per {sig.level} ({unit}), deriv over {format_duration(sig.window_s)}",
                 self.records(sig)["value"])]

    def rules(self, sig: Signal, spec: Spec) -> list[Rule]:
        inner = engine_labels(f"deriv({selector(metric_of(sig), spec, backend=sig.source.backend)}[{format_duration(sig.window_s)}])", sig)
        expr = f"sum by ({by(sig.by)}) ({inner})" if sig.by else inner
        return [{"record": self.records(sig)["value"], "expr": expr}]

    def dashboard_records(self, sigs: list[Signal], spec: Spec) -> list[Rule]:
        """KV-cache bytes and pool usage per engine, for the KV drill-down: from the fusebox KV
        collector, so none when the spec expects no collectors (``Spec.fusebox_collectors``)."""
        if not spec.fusebox_collectors:
            return []
        d = dashboard_records()
        engine_by = "cluster, host_name, engine, model"
        return [
            {"record": d["kv_usage"], "expr": f"sum by ({engine_by}) ({selector(C.PROM['kv_cache_usage'], spec)})"},
            {"record": d["kv_limit"], "expr": f"sum by ({engine_by}) ({selector(C.PROM['kv_cache_limit'], spec)})"},
            {"record": d["kv_ratio"], "expr": f"{d['kv_usage']} / {d['kv_limit']}"},
        ]

    def scenario_series(self, sig: Signal, scenario: ScenarioModel, times: list[float]) -> dict[str, list[float]]:
        """``deriv`` of each engine's KV-cache bytes over the signal's window (Prometheus 3's range),
        when the signal reads the fusebox KV gauge; bytes per second."""
        if sig.source.backend != "fusebox" or sig.source.metric != C.PROM["kv_cache_usage"]:
            return {}
        return {e: promsim.deriv_series(times, [scenario.kv_used_bytes(e, t) for t in times], sig.window_s)
                for e in scenario.engine_ids}

    # -- generated tests -----------------------------------------------------------------
    def series(self, synth: Synth, phases: list[tuple[int, float]]) -> list[InputSeries]:
        """A gauge climbing at each phase's target rate (bytes per second) from KV_BASE_BYTES."""
        segs, level = [], float(KV_BASE_BYTES)
        for n, rate in phases:
            step = rate * synth.interval
            segs.append((n, level, step))
            level += step * n
        return [{"series": metric_of(synth.sig) + label_str(synth.labels), "values": segments(segs)}]

    def result_labels(self, synth: Synth) -> dict[str, str]:
        if not synth.sig.by:  # deriv alone keeps every label of the gauge
            return dict(synth.labels)
        return {k: v for k, v in synth.labels.items() if k in synth.sig.by}

    # -- panels --------------------------------------------------------------------------
    def dashboard(self, spec: Spec, sigs: list[Signal]) -> DashboardDef | None:
        if not sigs:
            return None
        panels: list[PanelDef] = []
        for sig in sigs:
            r = self.records(sig)
            panels.append(signal_panel(sig, f"{sig.alert}: growth per engine",
                                       f"{sig.description} Lines at {tier_text(sig)} (SI: 1 MB = 10^6 B).",
                                       signal_sel(sig, r["value"]), signal_legend(sig)))
        alerts = tuple(s.alert for s in sigs)
        d = dashboard_records()
        panels += [] if not spec.fusebox_collectors else [
            PanelDef("KV-cache bytes per engine", "fusebox.kv_cache.usage: bytes of KV cache in use per engine (summed over its GPUs).",
                     (Query(sel(d["kv_usage"], "engine"), LEGEND["engine"]),), "decbytes", alerts),
            PanelDef("KV pool usage per engine", "KV bytes in use over the pool's bytes (0-1).",
                     (Query(sel(d["kv_ratio"], "engine"), LEGEND["engine"]),),
                     "percentunit", alerts, soft_max=1.0),
        ]
        return DashboardDef("kv-cache", f"fusebox / {spec.name} / KV cache",
                            "KV-cache bytes, pool usage and growth per engine.", tuple(panels))


KIND = Deriv()
