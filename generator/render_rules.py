"""Prometheus recording and alerting rules from the spec (pure: returns data, no I/O).

One rule group per signal, recording rules first: rules in a group run in order, so the
alert reads this evaluation's recorded value, not the previous one (groups run
independently and would add one evaluation interval of delay). Signals whose records are the
same rule (two deriv signals over one gauge and window) share one group, so that record is
computed once and both alerts still read this evaluation's value.

Groups at ``global.evaluation_interval`` hold what alerts read. What no alert's timing depends
on runs at ``global.slow_evaluation_interval`` (30 s by default): ``fusebox-<signal>-panels``
(records only panels read, :meth:`Kind.panel_rules`), ``fusebox-static`` (static inputs,
:meth:`Kind.slow_rules`), ``fusebox-dashboard``, ``fusebox-inpath`` (the in-path gateways'
refusals, overload sheds and open breakers, :mod:`.shedding`) and ``fusebox-absent``. With a
``scaling:`` section the autoscalers' load records go beside the values they read, and
``fusebox-scaling`` (:func:`.render_scaling.place_rules`) runs at the slow interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fusebox import conventions as C
from fusebox.signal_kinds import KINDS, dashboard_records, kind_of, lost_gpu_fuses, reports_lost_gpus
from fusebox.signal_kinds.base import DCGM, FUSEBOX, SGLANG, TARGET, VLLM, dcgm_labels, le_regex, selector
from fusebox.spec import Signal, Spec, Tier
from fusebox.spec.units import format_duration, humanize

from . import render_scaling, render_slo, shedding
from .producers import fed_spec, gpu_power_backend
from .rule_engines import shape_groups
from .selfmon import GROUP as SELF_GROUP
from .selfmon import self_rules

__all__ = ["Rules", "render_rules", "selector", "le_regex", "signal_raw_metrics", "marker_labels", "alert_labels", "alert_annotations",
           "alert_where", "gpu_power_backend"]

GROUP_PREFIX = "fusebox"
# static inputs (a GPU's memory size): their records never change, so reading them from a slower
# group delays no alert (generator/budget.py counts no staleness for them)
STATIC_GROUP = f"{GROUP_PREFIX}-static"


@dataclass
class Rules:
    """Rendered rules: ``groups`` as in a Prometheus rule file, plus what the tests need."""

    groups: list[dict[str, Any]]
    # metric name -> signals reading it (drives the absent alerts and their tests)
    raw_metrics: dict[str, list[str]] = field(default_factory=dict)
    # metric name -> the source backend reading it (whose selector matchers its absent alert uses)
    raw_backends: dict[str, str] = field(default_factory=dict)


def signal_raw_metrics(sig: Signal) -> list[str]:
    """The raw metric names a signal's active source reads (for absent alerts)."""
    return kind_of(sig).raw_metrics(sig)


def _rate_or(names: tuple[str, ...], spec: Spec, w: str, backend: str) -> str:
    """``rate(a[w]) or rate(b[w])``: one series per engine whichever name its version exports.

    ``rate`` drops the metric name, so an engine exporting both spellings matches itself on the
    right of ``or`` and is counted once (docs/pitfalls.md P4)."""
    return " or ".join(f"rate({selector(n, spec, backend=backend)}[{w}])" for n in names)


def _gpu_power(spec: Spec) -> str:
    """GPU power in watts, one series per GPU, from the backend of the GPU-memory signal (without
    one: the collectors where :attr:`Spec.fusebox_collectors` expects them): the fusebox GPU
    collector's ``hw_power_watts``, or dcgm-exporter's
    ``DCGM_FI_DEV_POWER_USAGE`` (W, in its default counters), with hw_id and host_name from its
    labels and one series per GPU whichever exporter pod sent it."""
    if gpu_power_backend(spec) != DCGM:
        return selector(C.PROM["gpu_power"], spec, backend=FUSEBOX)
    return f"max without ({TARGET}) ({dcgm_labels(selector(C.DCGM['power'], spec, backend=DCGM))})"


def _dashboard_records(spec: Spec) -> list[dict[str, Any]]:
    """The ``fusebox-dashboard`` group: what the drill-down panels read beyond the signals' records.

    Each record aggregates to fewer series or precomputes a rate, so a panel reads one short
    series per engine / host / model instead of every raw series over a window. Records that
    read records come after them (rules in a group run in order). Engine metrics (vLLM, SGLang)
    are optional: a record over a missing metric is empty, and no absent alert is made for it.
    """
    names = dashboard_records()
    w = format_duration(C.DASHBOARD_RATE_WINDOW_S)
    host_by = "cluster, host_name"
    model_by = "cluster, host_name, model_name"
    out: list[dict[str, Any]] = []
    for kind in KINDS.values():  # in the kinds' order: GPU memory, then KV
        sigs = [s for s in spec.signals if s.kind == kind.name]
        if sigs:
            out += [dict(r) for r in kind.dashboard_records(sigs, spec)]
    engines = spec.engines
    token_parts = []
    if VLLM in engines:
        token_parts.append(f'label_replace(rate({selector(C.VLLM_GENERATION_TOKENS, spec, backend=VLLM)}[{w}]), "engine_kind", "vllm", "", "")')
    if SGLANG in engines:
        sglang_tokens = _rate_or(C.sglang_names(C.SGLANG_GENERATION_TOKENS), spec, w, SGLANG)
        token_parts.append(f'label_replace({sglang_tokens}, "engine_kind", "sglang", "", "")')
    out += [
        {"record": names["host_power"], "expr": f"sum by ({host_by}) ({_gpu_power(spec)})"},
        # The engine-kind label keeps a vLLM and an SGLang engine with equal labels apart (`or`
        # would drop the second); within a kind, `or` picks one spelling per engine.
        {"record": names["host_tokens"], "expr": "sum by ({}) (\n  {}\n)".format(host_by, "\n  or ".join(token_parts))},
        # W / (tokens/s) = J/token; a host that generated nothing has no sample rather than +Inf.
        {"record": names["energy_per_token"], "expr": f"{names['host_power']} / ({names['host_tokens']} > 0)"},
    ]
    if VLLM in engines:
        out.append({"record": names["prefix_hit_vllm"], "expr": (
            f"sum by ({model_by}) ({_rate_or((C.VLLM_PREFIX_CACHE_HITS, C.VLLM_PREFIX_CACHE_HITS_OLD), spec, w, VLLM)})\n"
            f"  / (sum by ({model_by}) ({_rate_or((C.VLLM_PREFIX_CACHE_QUERIES, C.VLLM_PREFIX_CACHE_QUERIES_OLD), spec, w, VLLM)}) > 0)")})
    if SGLANG in engines:
        out.append({"record": names["prefix_hit_sglang"], "expr": (
            f"avg by ({model_by}) ({ ' or '.join(selector(n, spec, backend=SGLANG) for n in C.sglang_names(C.SGLANG_CACHE_HIT_RATE))})")})
    return out


def marker_labels(spec: Spec) -> dict[str, str]:
    """``global.labels`` plus the marker ``fusebox: <metadata.name>`` that every alert fusebox
    generates carries: Alertmanager routes to the fuse match it, never severity alone."""
    return {**spec.labels, C.LABEL["marker"]: spec.name}


def alert_labels(sig: Signal, tier: Tier, spec: Spec) -> dict[str, str]:
    """Labels the alerting rule adds: the marker, severity, signal and, on a tier that requests a
    fuse, fuse_action and fuse_level (the fuse service reads them; Alertmanager routes on them)."""
    labels = marker_labels(spec)
    labels[C.LABEL["severity"]] = tier.severity
    labels[C.LABEL["signal"]] = sig.name
    if tier.fuse:
        labels[C.LABEL["fuse_action"]] = tier.fuse
        labels[C.LABEL["fuse_level"]] = str(tier.fuse_level)
    return labels


# The usual labels of the standard levels, and how the description names them.
_WHERE = {
    "gpu": (("hw_id", "host_name"), "GPU {{ $labels.hw_id }} on {{ $labels.host_name }}"),
    "engine": (("engine", "model", "host_name"), "engine {{ $labels.engine }} ({{ $labels.model }}) on {{ $labels.host_name }}"),
    "host": (("host_name",), "host {{ $labels.host_name }}"),
}


def alert_where(sig: Signal) -> str:
    """Where the alert is, as a template over labels the alert carries ("" when it carries none).

    When the value keeps its level's usual labels (gpu, engine, host: the source's labels, or a
    ``by`` that holds them) it reads as before ("GPU {{ $labels.hw_id }} on {{ $labels.host_name }}");
    otherwise it names the labels the value keeps (:meth:`Kind.kept_labels`), the level's first:
    "pod {{ $labels.pod }} (namespace {{ $labels.namespace }}, ...)". So no label the alert lacks is
    named (it would render empty).
    """
    parts = _where_parts(sig)
    if isinstance(parts, str):
        return parts
    return parts[0] + (f" ({', '.join(parts[1:])})" if len(parts) > 1 else "") if parts else ""


def alert_where_short(sig: Signal) -> str:
    """The first part of :func:`alert_where`, for the summary: "GPU {{ $labels.hw_id }}",
    "engine {{ $labels.engine }}", "host {{ $labels.host_name }}", "pod {{ $labels.pod }}"."""
    parts = _where_parts(sig)
    if isinstance(parts, str):
        return parts.split(" on ")[0].split(" (")[0]
    return parts[0] if parts else ""


def _where_parts(sig: Signal) -> str | list[str]:
    """The level's usual phrase, or one "label {{ $labels.label }}" per label the value keeps."""
    kept = kind_of(sig).kept_labels(sig)
    usual = _WHERE.get(sig.level)
    if usual and (kept is None or set(usual[0]) <= set(kept)):
        return usual[1]
    labels = sorted(kept or (), key=lambda lb: lb != sig.level)  # the level's label first, then by's order
    return [f"{lb} {{{{ $labels.{lb} }}}}" for lb in labels]


def alert_annotations(sig: Signal, tier: Tier, spec: Spec) -> dict[str, str]:
    """Annotations use ``$labels`` (no ``$value``), so generated promtool tests can state them
    exactly; the value is one click away on the dashboard linked from the runbook. They name only
    labels the alert carries (:func:`alert_where`). The one exception is a tier's ``advice``
    (``advice`` annotation), which may show the alert's value (``{{ $value | humanizePercentage }}``):
    the generated tests state it where the value is known (render_tests)."""
    where = alert_where(sig)
    op = ">=" if sig.direction == "above" else "<="
    action = f" The fuse requests: {spec.actions[tier.fuse].description}" if tier.fuse else ""
    if tier.after_shedding:
        action = " The in-path gateways have been refusing requests meanwhile without bringing it back." + action
    short = alert_where_short(sig)
    ann = {
        "summary": f"{sig.alert}: {sig.name} {op} {humanize(tier.threshold, sig.unit)}{' on ' + short if short else ''} ({tier.name})",
        "description": (f"{sig.name}{' on ' + where if where else ''} has been {op} {humanize(tier.threshold, sig.unit)} "
                        f"for {format_duration(tier.for_s)}.{action}"),
        "runbook_url": spec.runbook_url(sig.alert),
    }
    measured = kind_of(sig).measured(sig)
    if measured:  # what the series measured, from its label: one `if` per value, none when it lacks the label
        label = C.ALIGNMENT_SOURCE_LABEL
        ann["summary"] += "".join(f'{{{{ if eq $labels.{label} "{v}" }}}} [measured: {short}]{{{{ end }}}}'
                                  for v, short, _what, _todo in measured)
        ann["description"] += "".join(f'{{{{ if eq $labels.{label} "{v}" }}}} Measured: {what}.{{{{ end }}}}'
                                      for v, _short, what, _todo in measured)
    if tier.advice:
        ann["advice"] = " ".join(tier.advice.split())
    if spec.dashboard_base_url:
        ann["dashboard_url"] = (f"{spec.dashboard_base_url.rstrip('/')}/d/"
                                f"{C.dashboard_uid(spec.name, C.OVERVIEW_DASHBOARD)}")
    return ann


shedding_window_s = shedding.window_s  # the gate's window is the refusal records' (generator/shedding.py)


def shedding_gate(spec: Spec) -> str:
    """The condition a tier with ``after_shedding`` adds to its alert: the in-path gateways are
    refusing requests now (a refusal within :func:`shedding_window_s`, a gateway's first ones
    included: :func:`.shedding.refused_in_window`), or no gateway's counter is scraped at all, in
    which case the tier acts as if it did not wait (it never blocks a fuse on a gateway Prometheus
    cannot see). Joined ``on ()``: any gateway that Prometheus scrapes counts, whatever its labels."""
    return f"(sum({shedding.refused_in_window(spec)}) > 0) or on () absent({C.GATEWAY_ADMISSIONS})"


def _alert(sig: Signal, tier: Tier, spec: Spec) -> dict[str, Any]:
    expr = kind_of(sig).alert_expr(sig, tier, spec)
    if tier.after_shedding:
        inner = "\n".join("  " + line for line in expr.splitlines())
        expr = f"(\n{inner}\n)\nand on () (\n  {shedding_gate(spec)}\n)"
    rule: dict[str, Any] = {"alert": sig.alert, "expr": expr}
    if tier.for_s:
        rule["for"] = format_duration(tier.for_s)
    if tier.keep_firing_for_s:
        rule["keep_firing_for"] = format_duration(tier.keep_firing_for_s)
    rule["labels"] = alert_labels(sig, tier, spec)
    rule["annotations"] = alert_annotations(sig, tier, spec)
    return rule


def absent_labels(metric: str, signals: list[str], spec: Spec) -> dict[str, str]:
    labels = marker_labels(spec)
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


def _shared_group(name: str, own: list[dict[str, Any]], recorded: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, Any] | None:
    """The group of an earlier signal that already records every one of ``own``'s records (same
    name, same rule), or None.

    Raises:
        ValueError: a record of ``own`` is recorded earlier with a different rule.
    """
    homes = []
    for r in (r for r in own if "record" in r):
        hit = recorded.get(r["record"])
        if hit and next(x for x in hit[1]["rules"] if x.get("record") == r["record"]) != r:
            raise ValueError(f"signals {hit[0]} and {name} both record {r['record']} with different expressions: "
                             "give them the same source, window and by, or different windows")
        homes.append(hit[1] if hit else None)
    if homes and all(h is homes[0] for h in homes):
        return homes[0]
    return None


def render_rules(spec: Spec) -> Rules:
    """Build the rule groups for ``spec``.

    Returns:
        Rules with one group per signal (recording rules, then one alerting rule per enabled
        tier, all under the signal's single alert name; a signal whose records are all already
        another's, same name and expression, adds its alerts to that signal's group), its
        ``fusebox-<signal>-panels`` group where the kind has panel-only records, a
        ``fusebox-static`` group of static inputs (:meth:`Kind.slow_rules`), a ``fusebox-dashboard`` group of
        records the dashboards read (:func:`fusebox.signal_kinds.dashboard_records`), a
        ``fusebox-inpath`` group where ``inpath.shedders`` names a gateway (:func:`.shedding.rules`), a
        ``fusebox-absent`` group (one alert per metric an enabled tier's signal reads: a
        signal with every tier disabled keeps its records and adds none), ``fusebox-health``
        (lost GPUs) and ``fusebox-self`` (:mod:`.selfmon`: the fuse, Alertmanager's feed to it,
        the collectors). Shaped for ``global.rule_engine`` (:func:`.rule_engines.shape_groups`): a
        group over 20 rules (Mimir's default limit) is split into ``NAME-1``, ``NAME-2``, ... with
        each recording chain whole; for Thanos every group carries ``partial_response_strategy``.
        The panels, static, dashboard, inpath and absent groups run at ``global.slow_evaluation_interval``.

    A signal with every tier disabled whose source nothing publishes is left out altogether
    (:func:`.producers.fed_spec`), and no group is ever empty: a disabled gauge whose only record
    is a panel record has no group of its own.

    Raises:
        ValueError: two signals record one name with different expressions (say two deriv
            signals over one gauge and window with different ``by``).
    """
    spec = fed_spec(spec)
    groups: list[dict[str, Any]] = []
    raw_metrics: dict[str, list[str]] = {}
    raw_backends: dict[str, str] = {}
    interval = format_duration(spec.evaluation_interval_s)
    slow = format_duration(spec.slow_evaluation_interval_s)
    recorded: dict[str, tuple[str, dict[str, Any]]] = {}  # record name -> (signal, its group)
    panels: list[dict[str, Any]] = []
    static: list[dict[str, Any]] = []
    for sig in spec.signals:
        kind = kind_of(sig)
        own: list[dict[str, Any]] = [dict(r) for r in kind.rules(sig, spec)]
        alerts = [_alert(sig, t, spec) for t in sig.tiers]
        home = _shared_group(sig.name, own, recorded)
        if home is not None:
            home["rules"].extend(alerts)  # its records are another signal's: one group, one evaluation
        elif own or alerts:  # a disabled gauge that filters first has neither: no empty group
            group = {"name": f"{GROUP_PREFIX}-{sig.name}", "interval": interval, "rules": own + alerts}
            groups.append(group)
            for r in own:
                if "record" in r:
                    recorded.setdefault(r["record"], (sig.name, group))
        if kind.panel_rules(sig, spec):
            panels.append({"name": f"{GROUP_PREFIX}-{sig.name}-panels", "interval": slow, "rules": [dict(r) for r in kind.panel_rules(sig, spec)]})
        static += [dict(r) for r in kind.slow_rules(sig, spec) if r not in static]
        # A signal whose tiers are all disabled keeps its records (the dashboards draw it) but
        # makes no absent alert: nothing of it can fire, so its metric's absence loses nothing.
        for m in (signal_raw_metrics(sig) if sig.tiers else ()):
            raw_metrics.setdefault(m, []).append(sig.name)
            raw_backends.setdefault(m, sig.source.backend)
    groups += panels
    if static:
        groups.append({"name": STATIC_GROUP, "interval": slow, "rules": static})
    # Dashboard records: read by panels only, so their metrics never join raw_metrics (no absent alerts).
    groups.append({"name": f"{GROUP_PREFIX}-dashboard", "interval": slow, "rules": _dashboard_records(spec)})
    # What the in-path gateways did (generator/shedding.py): panels and runbooks read it, no alert.
    if shedding.rules(spec):
        groups.append({"name": shedding.GROUP, "interval": slow, "rules": shedding.rules(spec)})
    # What the autoscalers read (generator/render_scaling.py): each load beside the value it reads.
    render_scaling.place_rules(spec, groups, slow)
    # The SLOs' error ratios, budgets and burn-rate alerts (generator/render_slo.py), one group each;
    # an SLO's histogram gets the absent alert too: without it its burn-rate alerts are silent for good.
    groups += [render_slo.slo_rules(slo, spec) for slo in spec.slos]
    for slo in spec.slos:
        m = f"{slo.metric}_count"
        raw_metrics.setdefault(m, []).append(f"{slo.name} (SLO)")
        raw_backends.setdefault(m, slo.backend)
    if spec.absent_enabled and raw_metrics:
        absent_rules = []
        for m in sorted(raw_metrics):
            rule: dict[str, Any] = {"alert": C.ABSENT_ALERT, "expr": f"absent({selector(m, spec, backend=raw_backends[m])})"}
            if spec.absent_for_s:
                rule["for"] = format_duration(spec.absent_for_s)
            rule["labels"] = absent_labels(m, raw_metrics[m], spec)
            rule["annotations"] = absent_annotations(m, raw_metrics[m], spec)
            absent_rules.append(rule)
        groups.append({"name": f"{GROUP_PREFIX}-absent", "interval": slow, "rules": absent_rules})
    if gpu_down_enabled(spec):
        groups.append({"name": f"{GROUP_PREFIX}-health", "interval": interval, "rules": gpu_down_rules(spec)})
    own = self_rules(spec)
    if own:  # fusebox's own path: the fuse, Alertmanager's feed to it, the collectors (generator/selfmon.py)
        groups.append({"name": SELF_GROUP, "interval": interval, "rules": own})
    return Rules(groups=shape_groups(groups, spec.rule_engine), raw_metrics=raw_metrics, raw_backends=raw_backends)


GPU_DOWN_FOR_S = 60.0


def gpu_down_enabled(spec: Spec) -> bool:
    """Whether a signal reads a source that reports lost GPUs as fusebox_gpu_up 0 (the fusebox
    GPU collector does, dcgm-exporter does not)."""
    return reports_lost_gpus(spec)


def gpu_down_labels(spec: Spec, action: str | None = None) -> dict[str, str]:
    """The GPU-down rule's labels; with ``action`` (one of :func:`lost_gpu_fuses`), the fuse it requests."""
    labels = {**marker_labels(spec), C.LABEL["severity"]: "warning"}
    if action:
        labels[C.LABEL["fuse_action"]] = action
        labels[C.LABEL["fuse_level"]] = str(spec.actions[action].level)
    return labels


def gpu_down_annotations(spec: Spec) -> dict[str, str]:
    fuses = lost_gpu_fuses(spec)
    held = (f" It requests the fuse of the GPU-level signals it silences ({', '.join(fuses)}): that fuse stays "
            "tripped while the GPU is down and is released after the hold time once it is back." if fuses else "")
    return {
        "summary": f"{C.GPU_DOWN_ALERT}: the GPU collector lost GPU {{{{ $labels.hw_id }}}} on {{{{ $labels.host_name }}}}",
        "description": ("NVML reports GPU {{ $labels.hw_id }} on {{ $labels.host_name }} as lost or failing "
                        f"for {format_duration(GPU_DOWN_FOR_S)}. Its memory series have stopped, so no memory alert "
                        f"can fire or resolve on it.{held}"),
        "runbook_url": spec.runbook_url(C.GPU_DOWN_ALERT),
    }


def gpu_down_rules(spec: Spec) -> list[dict[str, Any]]:
    """One rule per fuse action of :func:`lost_gpu_fuses` (same alert name and expression, one
    ``fuse_action`` each: an alert carries one), or one rule without a fuse when no GPU-level
    signal has one. A GPU that is down thereby holds the fuse it had: the memory alert resolving
    because the GPU's series stopped no longer releases it."""
    rules = []
    for action in lost_gpu_fuses(spec) or (None,):
        rules.append({
            "alert": C.GPU_DOWN_ALERT,
            "expr": f"max without ({TARGET}) ({selector(C.PROM['gpu_up'], spec, backend=FUSEBOX)}) == 0",
            "for": format_duration(GPU_DOWN_FOR_S),
            "labels": gpu_down_labels(spec, action),
            "annotations": gpu_down_annotations(spec),
        })
    return rules
