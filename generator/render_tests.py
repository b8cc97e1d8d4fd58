"""promtool unit tests generated from the spec (pure: returns data, no I/O).

For every enabled tier of every signal: a value just above the threshold (alert pending on
the near side of ``for``, firing on the far side, still firing within ``keep_firing_for``
after the value falls, resolved after it), a value just below (never fires), and for
quantile signals zero traffic (NaN quantile, no alert: docs/pitfalls.md P1). One group with no data
at all checks that only the absent alert fires.

Expectations come from a small model of Prometheus' alert state machine. A check is emitted
only at times where that model is certain for every tier of the alert, one evaluation
interval away from each edge, so the tests hold under promtool 2.42 and 3.x alike (their
look-back and range-boundary rules differ; every series ends with ``stale``).
"""

from __future__ import annotations

import math
import re
from typing import Any

from fusebox import conventions as C

from .render_rules import (GPU_DOWN_FOR_S, Rules, absent_annotations, absent_labels, alert_annotations, alert_labels,
                           gpu_down_annotations, gpu_down_enabled, gpu_down_labels)
from fusebox.spec import Signal, Spec, Tier
from fusebox.spec.units import format_duration, format_number

DELTA = 0.001  # "just above/below": 0.1 % of the threshold
GPU_LIMIT_BYTES = 80_000_000_000
DCGM_TOTAL_MIB = 81_920
DCGM_RESERVED_MIB = 512
KV_BASE_BYTES = 2_000_000_000
OBS_PER_STEP = 1000

_GPU_LABELS = {"hw_id": "GPU-5a3c1f2e-0000-4000-8000-000000000001", "hw_gpu_index": "0",
               "host_name": "gpu-node-1", "cluster": "test", "instance": "gpu-node-1:9464", "job": "fusebox-gpu"}
_ENGINE_LABELS = {"engine": "engine-0", "model": "llava-1.5-7b", "host_name": "gpu-node-1", "cluster": "test",
                  "instance": "gpu-node-1:9464", "job": "fusebox-kv"}


def _num(x: float) -> str:
    return format_number(x)


def _label_str(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _segments(values: list[tuple[int, float, float]]) -> str:
    """[(n_samples, start, step)] -> promtool series notation, then ``stale``."""
    parts = []
    for n, start, step in values:
        if n <= 0:
            continue
        if step == 0:
            parts.append(f"{_num(start)}x{n - 1}" if n > 1 else _num(start))
        else:
            sign = "+" if step > 0 else "-"
            parts.append(f"{_num(start)}{sign}{_num(abs(step))}x{n - 1}")
    return " ".join(parts + ["stale"])


def histogram_quantile(q: float, bounds: list[float], cum: list[float]) -> float:
    """Prometheus' histogram_quantile on cumulative counts (``cum[-1]`` is +Inf)."""
    total = cum[-1]
    if total == 0:
        return math.nan
    rank = q * total
    for i, c in enumerate(cum):
        if c >= rank:
            if i == len(bounds):  # +Inf bucket
                return bounds[-1]
            lo = bounds[i - 1] if i > 0 else 0.0
            prev = cum[i - 1] if i > 0 else 0.0
            return lo + (bounds[i] - lo) * (rank - prev) / (c - prev)
    return bounds[-1]


class _Synth:
    """Turns target signal values into input series for one signal's active source."""

    def __init__(self, sig: Signal, spec: Spec):
        self.sig, self.spec = sig, spec
        self.interval = spec.evaluation_interval_s
        base = _ENGINE_LABELS if sig.level == "engine" else _GPU_LABELS
        self.labels = {**base, **spec.selector}

    # -- values -----------------------------------------------------------------------
    def target_value(self, tier: Tier, target: str) -> float:
        s = self.sig
        t = tier.threshold
        if target == "safe":
            lo = min(x.threshold for x in s.tiers)
            hi = max(x.threshold for x in s.tiers)
            return lo * 0.5 if s.direction == "above" else min(hi * 1.5, 1.0) if s.unit == "ratio" else hi * 1.5
        beyond = target == "above"
        if s.direction == "below":
            beyond = not beyond
        return t * (1 + DELTA) if beyond else t * (1 - DELTA)

    def exact(self, v: float) -> float:
        """The value the rules will compute when the series target ``v``."""
        s = self.sig
        if s.kind == "gpu_memory":
            if s.source.backend == "dcgm":
                free = round((1 - v) * DCGM_TOTAL_MIB)
                return 1 - free / DCGM_TOTAL_MIB
            return round(v * GPU_LIMIT_BYTES) / GPU_LIMIT_BYTES
        return v

    # -- series -----------------------------------------------------------------------
    def series(self, phases: list[tuple[int, float]]) -> list[dict[str, str]]:
        """phases: [(n_samples, target value)] -> promtool input_series."""
        s = self.sig
        if s.kind == "gpu_memory":
            if s.source.backend == "dcgm":
                lab = {"UUID": self.labels["hw_id"], "gpu": "0", "Hostname": "gpu-node-1",
                       "host_name": "gpu-node-1", "modelName": "NVIDIA H100 80GB HBM3", **self.spec.selector}
                free = [(n, round((1 - v) * DCGM_TOTAL_MIB), 0) for n, v in phases]
                used = [(n, DCGM_TOTAL_MIB - f - DCGM_RESERVED_MIB, 0) for n, f, _ in free]
                return [
                    {"series": C.DCGM["fb_used"] + _label_str(lab), "values": _segments(used)},
                    {"series": C.DCGM["fb_free"] + _label_str(lab), "values": _segments(free)},
                    {"series": C.DCGM["fb_reserved"] + _label_str(lab),
                     "values": _segments([(n, DCGM_RESERVED_MIB, 0) for n, _ in phases])},
                ]
            usage = [(n, round(v * GPU_LIMIT_BYTES), 0) for n, v in phases]
            return [
                {"series": C.PROM["gpu_memory_usage"] + _label_str(self.labels), "values": _segments(usage)},
                {"series": C.PROM["gpu_memory_limit"] + _label_str(self.labels),
                 "values": _segments([(n, GPU_LIMIT_BYTES, 0) for n, _ in phases])},
            ]
        if s.kind == "gauge":
            return [{"series": s.source.metric + _label_str(self.labels),
                     "values": _segments([(n, v / s.source.scale, 0) for n, v in phases])}]
        if s.kind == "deriv":
            segs, level = [], float(KV_BASE_BYTES)
            for n, rate in phases:
                step = rate * self.interval
                segs.append((n, level, step))
                level += step * n
            return [{"series": s.source.metric + _label_str(self.labels), "values": _segments(segs)}]
        if s.kind == "quantile":
            return self._histogram(phases)
        raise ValueError(s.kind)

    def distribution(self, v: float) -> list[float]:
        """Per-step cumulative counts per bucket (+Inf last) whose quantile lies near ``v``.

        v is a threshold * (1 +/- DELTA), or "safe"/idle. Just above a bound T: 94% of
        observations at or below T, so the 95th lies in the next bucket; just below: 96%.
        """
        bounds = list(self.sig.buckets)
        q = self.sig.quantile
        if math.isnan(v):
            return [0.0] * (len(bounds) + 1)
        # the bucket bound nearest to v is the threshold (validated to be a bound)
        t = min(bounds, key=lambda b: abs(b - v))
        i = bounds.index(t)
        if v < min(x.threshold for x in self.sig.tiers) * 0.9:  # safe: everything in the first bucket
            return [OBS_PER_STEP] * (len(bounds) + 1)
        share_above = (1 - q) + (0.01 if v > t else -0.01)
        at_or_below = round(OBS_PER_STEP * (1 - share_above))
        return [0.0] * i + [at_or_below] * (1) + [OBS_PER_STEP] * (len(bounds) - i)

    def quantile_of(self, v: float) -> float:
        cum = self.distribution(v)
        return histogram_quantile(self.sig.quantile, list(self.sig.buckets), cum)

    def _histogram(self, phases: list[tuple[int, float]], start: list[float] | None = None) -> list[dict[str, str]]:
        bounds = list(self.sig.buckets)
        les = [_num(b) for b in bounds] + ["+Inf"]
        per_le: list[list[tuple[int, float, float]]] = [[] for _ in les]
        level = list(start) if start else [0.0] * len(les)
        for n, v in phases:
            cum = self.distribution(v)
            for j in range(len(les)):
                per_le[j].append((n, level[j], cum[j]))
                level[j] += cum[j] * n
        metric = self.sig.source.metric
        out = []
        for j, le in enumerate(les):
            out.append({"series": f"{metric}_bucket" + _label_str({**self.labels, "le": le}),
                        "values": _segments(per_le[j])})
        out.append({"series": f"{metric}_count" + _label_str(self.labels), "values": _segments(per_le[-1])})
        return out

    def result_labels(self) -> dict[str, str]:
        s = self.sig
        if s.kind in ("deriv", "quantile") or (s.kind == "gauge" and s.by):
            return {k: v for k, v in self.labels.items() if k in s.by}
        if s.kind == "gpu_memory" and s.source.backend == "dcgm":
            return {"UUID": self.labels["hw_id"], "gpu": "0", "Hostname": "gpu-node-1", "host_name": "gpu-node-1",
                    "modelName": "NVIDIA H100 80GB HBM3", "hw_id": self.labels["hw_id"], **self.spec.selector}
        if s.kind == "gpu_memory" or (s.kind == "gauge" and s.level == "gpu"):
            # GPU-level records drop the sender's identity (render_rules)
            return {k: v for k, v in self.labels.items() if k not in (C.LABEL["instance"], C.LABEL["job"])}
        return dict(self.labels)

    @property
    def window(self) -> float:
        return self.sig.window_s if self.sig.kind in ("deriv", "quantile") else 0.0

    @property
    def first_true(self) -> float:
        # rate/deriv need two samples: the first result appears one interval in
        return self.interval if self.sig.kind in ("deriv", "quantile") else 0.0


def _expand(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


class _Expect:
    """Certain-or-unknown model of Prometheus' alert states for one signal's tiers."""

    def __init__(self, sig: Signal, synth: _Synth):
        self.sig, self.synth, self.I = sig, synth, synth.interval

    def state(self, tier: Tier, value_exact: float, t: float, t_drop: float) -> str | None:
        """'firing', 'quiet' or None (uncertain) at eval time t, when the signal holds
        ``value_exact`` on [0, t_drop) and a safe value after."""
        I, w = self.I, self.synth.window
        above = value_exact >= tier.threshold if self.sig.direction == "above" else value_exact <= tier.threshold
        if not above:
            return "quiet"
        F, K = tier.for_s, tier.keep_firing_for_s
        first_fire_latest = self.synth.first_true + F
        if t < t_drop:
            if t >= first_fire_latest + I:
                return "firing"
            if t <= F - I:
                return "quiet"
            return None
        # after the drop: true at least until t_drop - I, at most until t_drop + w
        if t_drop - I >= first_fire_latest + I and t <= t_drop - I + K - I:
            return "firing"
        if t >= t_drop + w + K + 2 * I:
            return "quiet"
        return None


def _alert_case(sig: Signal, spec: Spec, synth: _Synth, tiers_firing: list[Tier]) -> list[dict[str, Any]]:
    res = synth.result_labels()
    out = []
    for t in tiers_firing:
        labels = {**res, **alert_labels(sig, t, spec)}
        ann = {k: _expand(v, res) for k, v in alert_annotations(sig, t, spec).items()}
        out.append({"exp_labels": labels, "exp_annotations": ann})
    return out


def _checks(sig, spec, synth, value_exact, times, t_drop, comments) -> list[dict[str, Any]]:
    exp = _Expect(sig, synth)
    out = []
    for t, why in zip(times, comments):
        if t < 0:
            continue
        states = {tier.name: exp.state(tier, value_exact, t, t_drop) for tier in sig.tiers}
        if None in states.values():
            continue
        firing = [tier for tier in sig.tiers if states[tier.name] == "firing"]
        out.append({"eval_time": format_duration(t), "alertname": sig.alert,
                    "exp_alerts": _alert_case(sig, spec, synth, firing), "_why": why})
    return out


def _tier_groups(sig: Signal, spec: Spec) -> list[tuple[str, dict[str, Any]]]:
    synth = _Synth(sig, spec)
    I = synth.interval
    w = synth.window
    max_for = max(t.for_s for t in sig.tiers)
    max_kff = max(t.keep_firing_for_s for t in sig.tiers)
    n_a = int((max_for + w + 6 * I) // I) + 1
    n_b = int((w + max_kff + 6 * I) // I) + 1
    t_drop = n_a * I
    groups = []
    for tier in sig.tiers:
        for target in ("above", "below"):
            v = synth.target_value(tier, target)
            safe = synth.target_value(tier, "safe")
            phases = [(n_a, v), (n_b, safe)]
            v_exact = synth.quantile_of(v) if sig.kind == "quantile" else synth.exact(v)
            F, K = tier.for_s, tier.keep_firing_for_s
            if target == "above":
                times = [F - I, F + synth.first_true + I, t_drop + K - 2 * I, t_drop + w + max_kff + 2 * I]
                why = [f"{tier.name}: pending one interval before `for` ({format_duration(F)}) ends",
                       f"{tier.name}: firing once `for` has passed",
                       f"{tier.name}: still firing within keep_firing_for ({format_duration(K)}) after the value fell",
                       f"{tier.name}: resolved after keep_firing_for"]
                if F < I:
                    times[0] = -1
                if K < 2 * I:
                    times[2] = -1
            else:
                times = [t_drop - I]
                why = [f"{tier.name}: a value just inside {tier.threshold_text} never fires this tier"]
            checks = _checks(sig, spec, synth, v_exact, times, t_drop, why)
            if not checks:
                continue
            side = target if sig.direction == "above" else {"above": "below", "below": "above"}[target]
            title = (f"{sig.alert} {tier.name}: {sig.name} just {side} {tier.threshold_text} "
                     f"(signal {_num(v_exact)})")
            groups.append((title, {"interval": format_duration(I), "input_series": synth.series(phases),
                                   "alert_rule_test": checks}))
    if sig.kind == "quantile":
        n = int((sig.window_s * 2) // I) + 1
        # buckets frozen at earlier counts: every rate is 0, the quantile NaN (docs/pitfalls.md P1)
        frozen = [40.0 * OBS_PER_STEP / 1000 * (j + 1) for j in range(len(sig.buckets) + 1)]
        series = synth._histogram([(n, math.nan)], start=frozen)
        t_eval = format_duration((n - 2) * I)
        value = C.signal_records(sig)["value"]
        groups.append((f"{sig.alert}: zero traffic gives a NaN quantile and no alert", {
            "interval": format_duration(I), "input_series": series,
            "alert_rule_test": [{"eval_time": t_eval, "alertname": sig.alert, "exp_alerts": []}],
            "promql_expr_test": [{"expr": f"count({value} != {value})", "eval_time": t_eval,
                                  "exp_samples": [{"labels": "{}", "value": 1}]}],
        }))
    return groups


def _gpu_down_group(spec: Spec) -> tuple[str, dict[str, Any]]:
    """One GPU lost (up 0) beside a healthy one: the alert fires after its `for`, for the lost one only."""
    I = spec.evaluation_interval_s
    n = int((GPU_DOWN_FOR_S + 4 * I) // I) + 1
    lost = {**_GPU_LABELS, **spec.selector}
    ok = {**lost, "hw_id": "GPU-5a3c1f2e-0000-4000-8000-000000000002", "hw_gpu_index": "1"}
    res = {k: v for k, v in lost.items() if k not in (C.LABEL["instance"], C.LABEL["job"])}
    ann = {k: _expand(v, res) for k, v in gpu_down_annotations(spec).items()}
    checks = [{"eval_time": format_duration(GPU_DOWN_FOR_S - I), "alertname": C.GPU_DOWN_ALERT, "exp_alerts": []},
              {"eval_time": format_duration(GPU_DOWN_FOR_S + I), "alertname": C.GPU_DOWN_ALERT,
               "exp_alerts": [{"exp_labels": {**res, **gpu_down_labels(spec)}, "exp_annotations": ann}]}]
    return (f"{C.GPU_DOWN_ALERT}: a GPU the collector lost (up 0) alerts after "
            f"{format_duration(GPU_DOWN_FOR_S)}; a healthy one does not", {
                "interval": format_duration(I),
                "input_series": [{"series": C.PROM["gpu_up"] + _label_str(lost), "values": _segments([(n, 0, 0)])},
                                 {"series": C.PROM["gpu_up"] + _label_str(ok), "values": _segments([(n, 1, 0)])}],
                "alert_rule_test": checks})


def render_rule_tests(spec: Spec, rules: Rules, rule_file: str) -> list[tuple[str, dict[str, Any]]]:
    """Return [(comment, test group)] for promtool; ``rule_file`` is relative to the test file."""
    groups: list[tuple[str, dict[str, Any]]] = []
    for sig in spec.signals:
        if not sig.tiers:
            continue
        if sig.kind == "gauge" and sig.source.expr:
            continue  # custom expression: no generic way to synthesise its inputs
        groups += _tier_groups(sig, spec)
    if gpu_down_enabled(spec):
        groups.append(_gpu_down_group(spec))
    if spec.absent_enabled and rules.raw_metrics:
        I = spec.evaluation_interval_s
        t = spec.absent_for_s + I
        checks = [{"eval_time": format_duration(t), "alertname": C.ABSENT_ALERT, "exp_alerts": [
            {"exp_labels": {**{k: v for k, v in spec.selector.items()}, **absent_labels(m, sigs, spec)},
             "exp_annotations": absent_annotations(m, sigs, spec)}
            for m, sigs in sorted(rules.raw_metrics.items())]}]
        if spec.absent_for_s >= I:
            checks.insert(0, {"eval_time": format_duration(max(spec.absent_for_s - I, 0)),
                              "alertname": C.ABSENT_ALERT, "exp_alerts": []})
        for sig in spec.signals:
            checks.append({"eval_time": format_duration(t), "alertname": sig.alert, "exp_alerts": []})
        groups.append(("No data at all: only the absent alert fires, once per metric the rules read", {
            "interval": format_duration(I), "input_series": [], "alert_rule_test": checks}))
    return groups
