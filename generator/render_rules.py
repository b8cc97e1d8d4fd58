"""Prometheus recording and alerting rules from the spec (pure: returns data, no I/O).

One rule group per signal, recording rules first: rules in a group run in order, so the
alert reads this evaluation's recorded value, not the previous one (groups run
independently and would add one evaluation interval of delay).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from fusebox import conventions as C

from .promql import vector_selectors
from fusebox.spec import Signal, Spec, Tier
from fusebox.spec.units import format_duration, format_number, humanize

GROUP_PREFIX = "fusebox"


@dataclass
class Rules:
    """Rendered rules: ``groups`` as in a Prometheus rule file, plus what the tests need."""

    groups: list[dict[str, Any]]
    # metric name -> signals reading it (drives the absent alerts and their tests)
    raw_metrics: dict[str, list[str]] = field(default_factory=dict)


def selector(metric: str, spec: Spec, extra: dict[str, str] | None = None, regex: dict[str, str] | None = None) -> str:
    """``metric{k="v",...}`` with the spec's global selector, then ``extra`` and ``regex`` matchers."""
    parts = [f'{k}="{v}"' for k, v in sorted({**spec.selector, **(extra or {})}.items())]
    parts += [f'{k}=~"{v}"' for k, v in sorted((regex or {}).items())]
    return f"{metric}{{{','.join(parts)}}}" if parts else metric


def le_regex(bound: float) -> str:
    """Match a bucket bound whether written "1" (Prometheus 2, OTel exporter) or "1.0" (Prometheus 3)."""
    text = format_number(bound)
    if re.fullmatch(r"-?\d+", text):
        return f"{text}|{text}\\\\.0"
    return re.escape(text).replace("\\", "\\\\")


def _by(labels: tuple[str, ...], extra: tuple[str, ...] = ()) -> str:
    return ", ".join(labels + extra)


def signal_raw_metrics(sig: Signal) -> list[str]:
    """The raw metric names a signal's active source reads (for absent alerts)."""
    src = sig.source
    if sig.kind == "gpu_memory":
        if src.backend == "dcgm":
            base = [C.DCGM["fb_used"], C.DCGM["fb_free"], C.DCGM["fb_reserved"]]
        else:
            base = [C.PROM["gpu_memory_usage"], C.PROM["gpu_memory_limit"]]
        # The KV metrics only refine the signal (without them it falls back to device memory),
        # so their absence does not blind it: no absent alert on their account.
        return base
    if sig.kind == "quantile":
        return [f"{src.metric}_bucket", f"{src.metric}_count"]
    if src.metric:
        return [src.metric]
    return _metrics_in_expr(src.expr or "")


def _metrics_in_expr(expr: str) -> list[str]:
    """Metric names of the vector selectors in a PromQL expression."""
    return sorted({sel.name for sel in vector_selectors(expr) if sel.name})


def _dcgm_labels(expr: str) -> str:
    """dcgm-exporter's UUID and Hostname (hostname since #655) as fusebox's hw_id and host_name."""
    expr = f'label_replace({expr}, "hw_id", "$1", "UUID", "(.+)")'
    expr = f'label_replace({expr}, "host_name", "$1", "Hostname", "(.+)")'
    return f'label_replace({expr}, "host_name", "$1", "hostname", "(.+)")'


def _records(sig: Signal, spec: Spec) -> list[dict[str, Any]]:
    names = C.signal_records(sig)
    src = sig.source
    out: list[dict[str, Any]] = []
    if sig.kind == "gpu_memory":
        usage, limit = C.PROM["gpu_memory_usage"], C.PROM["gpu_memory_limit"]
        if src.backend == "dcgm":
            # dcgm-exporter speaks MiB, and USED + FREE is not the total (docs/pitfalls.md P7):
            # total = USED + FREE + RESERVED; used = total - FREE.
            u, f, r = (selector(C.DCGM[k], spec) for k in ("fb_used", "fb_free", "fb_reserved"))
            total = f"({u} + {f} + {r})"
            device = _dcgm_labels(f"1 - {f} / {total}")
            total_bytes = _dcgm_labels(f"{total} * {C.MIB}")
        else:
            # usage = total - free (NVML v2), so driver-reserved memory counts as used (docs/pitfalls.md P6).
            device = f"{selector(usage, spec)} / {selector(limit, spec)}"
            total_bytes = selector(limit, spec)
        # hw_id is unique cluster-wide: drop the sender's identity (instance, job), so one GPU is
        # one series -- one alert, one fuse scope {cluster, host_name, hw_id} -- whether its
        # exporter restarted (the Collector keeps the old process's series for a while; a
        # rescheduled dcgm-exporter has a new address) or two exporters report it; and the KV
        # join on hw_id below meets one total per GPU.
        sender = f"{C.LABEL['instance']}, {C.LABEL['job']}"
        device = f"max without ({sender}) ({device})"
        # The join key alone: two series of one GPU (say under an old and a new host_name after a
        # collector pod moved) must not make the one-to-one join below fail for every GPU.
        total_bytes = f"max by (hw_id) ({total_bytes})"
        # One value per pool (engine share on a GPU) whoever reported it, then summed per GPU, so a
        # rescheduled KV collector's lingering series are not counted twice.
        kv_free = (f"sum by (hw_id) (max without ({sender}, {C.LABEL['host']}) ("
                   f"clamp_min({selector(C.PROM['kv_cache_limit'], spec)}"
                   f" - {selector(C.PROM['kv_cache_usage'], spec)}, 0)))")
        out += [
            {"record": names["device"], "expr": device},
            {"record": names["total"], "expr": total_bytes},
            # Free bytes of the KV pools engines pre-allocated on each GPU (vLLM takes ~90%).
            {"record": names["kv_free"], "expr": kv_free},
            # Effective utilization: device memory minus the KV pool's free part where a pool is
            # known on the GPU; device memory alone elsewhere (`or` keeps the unmatched GPUs).
            {"record": names["value"], "expr": (
                f"{names['device']}\n"
                f"  - on (hw_id) group_left ()\n"
                f"    ({names['kv_free']} / on (hw_id) {names['total']})\n"
                f"or\n{names['device']}")},
        ]
    elif sig.kind == "gauge":
        expr = src.expr if src.expr else selector(src.metric, spec)
        if src.scale != 1.0:
            expr = f"({expr}) * {format_number(src.scale)}"
        if src.metric and src.metric.startswith("DCGM_"):
            expr = _dcgm_labels(expr)
        if sig.by:
            expr = f"max by ({_by(sig.by)}) ({expr})"
        elif sig.level == "gpu":
            # As for GPU memory: one series per GPU whoever sent it, so every GPU-level signal
            # scopes its fuse as {cluster, host_name, hw_id} and one level is held or released
            # for the same GPU by every alert.
            expr = f"max without ({C.LABEL['instance']}, {C.LABEL['job']}) ({expr})"
        out.append({"record": names["value"], "expr": expr})
    elif sig.kind == "deriv":
        w = format_duration(sig.window_s)
        # deriv, not rate: KV bytes is a gauge that falls when blocks are freed; rate() would
        # read every fall as a counter reset and invent growth (docs/pitfalls.md P3).
        inner = f"deriv({selector(src.metric, spec)}[{w}])"
        expr = f"sum by ({_by(sig.by)}) ({inner})" if sig.by else inner
        out.append({"record": names["value"], "expr": expr})
    elif sig.kind == "quantile":
        w = format_duration(sig.window_s)
        bucket = selector(f"{src.metric}_bucket", spec)
        count = selector(f"{src.metric}_count", spec)
        out.append({"record": names["bucket_rate"], "expr": f"sum by ({_by(sig.by, ('le',))}) (rate({bucket}[{w}]))"})
        out.append({"record": names["rate"], "expr": f"sum by ({_by(sig.by)}) (rate({count}[{w}]))"})
        out.append({"record": names["value"], "expr": f"histogram_quantile({format_number(sig.quantile)}, {names['bucket_rate']})"})
        out.append({"record": names["p50"], "expr": f"histogram_quantile(0.5, {names['bucket_rate']})"})
        out.append({"record": names["p99"], "expr": f"histogram_quantile(0.99, {names['bucket_rate']})"})
        # The exact form beside the interpolated quantile: the share of observations above each
        # threshold. P95 >= T exactly when this share >= 0.05, because T is a bucket bound.
        for t in sig.tiers:
            le = le_regex(t.threshold)
            out.append({
                "record": names["over_threshold"],
                "expr": (f"1 - sum by ({_by(sig.by)}) ({names['bucket_rate']}{{le=~\"{le}\"}})\n"
                         f"  / {names['rate']}"),
                "labels": {"le": format_number(t.threshold)},
            })
    return out


def _rate_or(names: tuple[str, ...], spec: Spec, w: str) -> str:
    """``rate(a[w]) or rate(b[w])``: one series per engine whichever name its version exports.

    ``rate`` drops the metric name, so an engine exporting both spellings matches itself on the
    right of ``or`` and is counted once (docs/pitfalls.md P4)."""
    return " or ".join(f"rate({selector(n, spec)}[{w}])" for n in names)


def _dashboard_records(spec: Spec) -> list[dict[str, Any]]:
    """The ``fusebox-dashboard`` group: what the drill-down panels read beyond the signals' records.

    Each record aggregates to fewer series or precomputes a rate, so a panel reads one short
    series per engine / host / model instead of every raw series over a window. Records that
    read records come after them (rules in a group run in order). Engine metrics (vLLM, SGLang)
    are optional: a record over a missing metric is empty, and no absent alert is made for it.
    """
    names = C.dashboard_records()
    w = format_duration(C.DASHBOARD_RATE_WINDOW_S)
    engine_by = "cluster, host_name, engine, model"
    host_by = "cluster, host_name"
    model_by = "cluster, host_name, model_name"
    out: list[dict[str, Any]] = []
    gpu_sig = next((s for s in spec.signals if s.kind == "gpu_memory"), None)
    if gpu_sig is not None:
        if gpu_sig.source.backend == "dcgm":
            # MiB; used = total - FREE = USED + RESERVED (docs/pitfalls.md P6, P7), like the signal's rules.
            u, r = selector(C.DCGM["fb_used"], spec), selector(C.DCGM["fb_reserved"], spec)
            used = _dcgm_labels(f"({u} + {r}) * {C.MIB}")
            reserved = _dcgm_labels(f"{r} * {C.MIB}")
        else:
            used, reserved = selector(C.PROM["gpu_memory_usage"], spec), selector(C.PROM["gpu_memory_reserved"], spec)
        # Per GPU, so no cheaper than the raw gauge; recorded so the panels read the same name
        # whichever backend the GPU-memory signal uses.
        out += [{"record": names["gpu_used"], "expr": used}, {"record": names["gpu_reserved"], "expr": reserved}]
    if any(s.kind == "deriv" for s in spec.signals):
        out += [
            {"record": names["kv_usage"], "expr": f"sum by ({engine_by}) ({selector(C.PROM['kv_cache_usage'], spec)})"},
            {"record": names["kv_limit"], "expr": f"sum by ({engine_by}) ({selector(C.PROM['kv_cache_limit'], spec)})"},
            {"record": names["kv_ratio"], "expr": f"{names['kv_usage']} / {names['kv_limit']}"},
        ]
    sglang_tokens = _rate_or(C.sglang_names(C.SGLANG_GENERATION_TOKENS), spec, w)
    out += [
        {"record": names["host_power"], "expr": f"sum by ({host_by}) ({selector(C.PROM['gpu_power'], spec)})"},
        # The engine-kind label keeps a vLLM and an SGLang engine with equal labels apart (`or`
        # would drop the second); within a kind, `or` picks one spelling per engine.
        {"record": names["host_tokens"], "expr": (
            f"sum by ({host_by}) (\n"
            f'  label_replace(rate({selector(C.VLLM_GENERATION_TOKENS, spec)}[{w}]), "engine_kind", "vllm", "", "")\n'
            f'  or label_replace({sglang_tokens}, "engine_kind", "sglang", "", "")\n'
            f")")},
        # W / (tokens/s) = J/token; a host that generated nothing has no sample rather than +Inf.
        {"record": names["energy_per_token"], "expr": f"{names['host_power']} / ({names['host_tokens']} > 0)"},
        {"record": names["prefix_hit_vllm"], "expr": (
            f"sum by ({model_by}) ({_rate_or((C.VLLM_PREFIX_CACHE_HITS, C.VLLM_PREFIX_CACHE_HITS_OLD), spec, w)})\n"
            f"  / (sum by ({model_by}) ({_rate_or((C.VLLM_PREFIX_CACHE_QUERIES, C.VLLM_PREFIX_CACHE_QUERIES_OLD), spec, w)}) > 0)")},
        {"record": names["prefix_hit_sglang"], "expr": (
            f"avg by ({model_by}) ({' or '.join(selector(n, spec) for n in C.sglang_names(C.SGLANG_CACHE_HIT_RATE))})")},
    ]
    return out


def alert_labels(sig: Signal, tier: Tier, spec: Spec) -> dict[str, str]:
    """Labels the alerting rule adds (the fuse service reads signal, fuse_action, fuse_level)."""
    labels = dict(spec.labels)
    labels[C.LABEL["severity"]] = tier.severity
    labels[C.LABEL["signal"]] = sig.name
    if tier.fuse:
        labels[C.LABEL["fuse_action"]] = tier.fuse
        labels[C.LABEL["fuse_level"]] = str(tier.fuse_level)
    return labels


_WHERE = {
    "gpu": "GPU {{ $labels.hw_id }} on {{ $labels.host_name }}",
    "engine": "engine {{ $labels.engine }} ({{ $labels.model }}) on {{ $labels.host_name }}",
}


def alert_annotations(sig: Signal, tier: Tier, spec: Spec) -> dict[str, str]:
    """Annotations use only ``$labels`` (no ``$value``), so generated promtool tests can state
    them exactly; the value is one click away on the dashboard linked from the runbook."""
    where = _WHERE.get(sig.level, "{{ $labels.instance }}")
    op = ">=" if sig.direction == "above" else "<="
    action = f" The fuse requests: {spec.actions[tier.fuse].description}" if tier.fuse else ""
    ann = {
        "summary": f"{sig.alert}: {sig.name} {op} {humanize(tier.threshold, sig.unit)} ({tier.name})",
        "description": (f"{sig.name} on {where} has been {op} {humanize(tier.threshold, sig.unit)} "
                        f"for {format_duration(tier.for_s)}.{action}"),
        "runbook_url": spec.runbook_url(sig.alert),
    }
    if spec.dashboard_base_url:
        ann["dashboard_url"] = f"{spec.dashboard_base_url.rstrip('/')}/d/fusebox-overview"
    return ann


def _alert(sig: Signal, tier: Tier, spec: Spec) -> dict[str, Any]:
    names = C.signal_records(sig)
    op = ">=" if sig.direction == "above" else "<="
    rule: dict[str, Any] = {
        "alert": sig.alert,
        "expr": f"{names['value']} {op} {format_number(tier.threshold)}",
    }
    if tier.for_s:
        rule["for"] = format_duration(tier.for_s)
    if tier.keep_firing_for_s:
        rule["keep_firing_for"] = format_duration(tier.keep_firing_for_s)
    rule["labels"] = alert_labels(sig, tier, spec)
    rule["annotations"] = alert_annotations(sig, tier, spec)
    return rule


def absent_labels(metric: str, signals: list[str], spec: Spec) -> dict[str, str]:
    labels = dict(spec.labels)
    labels[C.LABEL["severity"]] = spec.absent_severity
    labels[C.LABEL["metric"]] = metric
    labels["signals"] = ",".join(signals)
    return labels


def absent_annotations(metric: str, signals: list[str], spec: Spec) -> dict[str, str]:
    return {
        "summary": f"No series of {metric}: {', '.join(signals)} cannot be evaluated",
        "description": (f"Prometheus has had no series of {metric} for {format_duration(spec.absent_for_s)}. "
                        f"The alerts of {', '.join(signals)} cannot fire and no fuse can trip on them."),
        "runbook_url": spec.runbook_url(C.ABSENT_ALERT),
    }


def render_rules(spec: Spec) -> Rules:
    """Build the rule groups for ``spec``.

    Returns:
        Rules with one group per signal (recording rules, then one alerting rule per enabled
        tier, all under the signal's single alert name), a ``fusebox-dashboard`` group of
        records the dashboards read (:func:`fusebox.conventions.dashboard_records`) and a
        ``fusebox-absent`` group.
    """
    groups: list[dict[str, Any]] = []
    raw_metrics: dict[str, list[str]] = {}
    interval = format_duration(spec.evaluation_interval_s)
    for sig in spec.signals:
        rules = _records(sig, spec) + [_alert(sig, t, spec) for t in sig.tiers]
        groups.append({"name": f"{GROUP_PREFIX}-{sig.name}", "interval": interval, "rules": rules})
        for m in signal_raw_metrics(sig):
            raw_metrics.setdefault(m, []).append(sig.name)
    # Dashboard records: read by panels only, so their metrics never join raw_metrics (no absent alerts).
    groups.append({"name": f"{GROUP_PREFIX}-dashboard", "interval": interval, "rules": _dashboard_records(spec)})
    if spec.absent_enabled and raw_metrics:
        absent_rules = []
        for m in sorted(raw_metrics):
            rule = {"alert": C.ABSENT_ALERT, "expr": f"absent({selector(m, spec)})"}
            if spec.absent_for_s:
                rule["for"] = format_duration(spec.absent_for_s)
            rule["labels"] = absent_labels(m, raw_metrics[m], spec)
            rule["annotations"] = absent_annotations(m, raw_metrics[m], spec)
            absent_rules.append(rule)
        groups.append({"name": f"{GROUP_PREFIX}-absent", "interval": interval, "rules": absent_rules})
    if gpu_down_enabled(spec):
        groups.append({"name": f"{GROUP_PREFIX}-health", "interval": interval, "rules": [gpu_down_rule(spec)]})
    return Rules(groups=groups, raw_metrics=raw_metrics)


GPU_DOWN_FOR_S = 60.0


def gpu_down_enabled(spec: Spec) -> bool:
    """The fusebox GPU collector reports lost GPUs as fusebox_gpu_up 0 (dcgm-exporter does not)."""
    return any(s.kind == "gpu_memory" and s.source.backend == "fusebox" for s in spec.signals)


def gpu_down_labels(spec: Spec) -> dict[str, str]:
    return {**spec.labels, C.LABEL["severity"]: "warning"}


def gpu_down_annotations(spec: Spec) -> dict[str, str]:
    return {
        "summary": f"{C.GPU_DOWN_ALERT}: the GPU collector lost GPU {{{{ $labels.hw_id }}}} on {{{{ $labels.host_name }}}}",
        "description": ("NVML reports GPU {{ $labels.hw_id }} on {{ $labels.host_name }} as lost or failing "
                        f"for {format_duration(GPU_DOWN_FOR_S)}. Its memory series have stopped, so no memory alert "
                        "or fuse can act on it; a fuse it held is released after the hold time."),
        "runbook_url": spec.runbook_url(C.GPU_DOWN_ALERT),
    }


def gpu_down_rule(spec: Spec) -> dict[str, Any]:
    sender = f"{C.LABEL['instance']}, {C.LABEL['job']}"
    return {
        "alert": C.GPU_DOWN_ALERT,
        "expr": f"max without ({sender}) ({selector(C.PROM['gpu_up'], spec)}) == 0",
        "for": format_duration(GPU_DOWN_FOR_S),
        "labels": gpu_down_labels(spec),
        "annotations": gpu_down_annotations(spec),
    }
