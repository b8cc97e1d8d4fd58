"""promtool unit tests generated from the spec (pure: returns data, no I/O).

For every enabled tier of every signal: a value just above the threshold (alert pending on
the near side of ``for``, firing on the far side, still firing within ``keep_firing_for``
after the value falls, resolved after it), a value just below (never fires), for kinds with
``edge_tested`` a value exactly at it (fires once ``for`` has passed), and for
quantile signals zero traffic (no quantile sample, no alert, no absent alert for its metrics:
docs/pitfalls.md P1). One group with no data at all checks that only the absent alert fires.

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
from fusebox import promsim
from fusebox.signal_kinds import kind_of, lost_gpu_fuses
from fusebox.signal_kinds.base import DELTA, FUSEBOX, GPU_LABELS, Synth, label_str, segments
from fusebox.spec import Signal, Spec, Tier
from fusebox.spec.units import format_duration, format_number, parse_duration

from .render_rules import (
    GPU_DOWN_FOR_S,
    Rules,
    absent_annotations,
    absent_labels,
    alert_annotations,
    alert_labels,
    gpu_down_annotations,
    gpu_down_enabled,
    gpu_down_labels,
)
from .render_scaling import test_groups as scaling_tests
from .selfmon import self_tests


def _target_value(synth: Synth, tier: Tier, target: str) -> float:
    """The value a test group drives the signal to: just beyond or just inside ``tier``, or safe."""
    s = synth.sig
    t = tier.threshold
    if s.unit == "count" and float(t).is_integer():  # whole requests: the nearest counts on either side (51 and 49 around 50)
        return _count_target(s, t, target)
    # a fractional count is a rate (0.2 preemptions per second): just beyond or inside it, as any unit
    if target == "safe":
        lo = min(x.threshold for x in s.tiers)
        hi = max(x.threshold for x in s.tiers)
        return lo * 0.5 if s.direction == "above" else min(hi * 1.5, 1.0) if s.unit == "ratio" else hi * 1.5
    if target == "at":
        return t
    beyond = target == "above"
    if s.direction == "below":
        beyond = not beyond
    return t * (1 + DELTA) if beyond else t * (1 - DELTA)


def _count_target(s: Signal, t: float, target: str) -> float:
    if target == "safe":
        lo = min(x.threshold for x in s.tiers)
        hi = max(x.threshold for x in s.tiers)
        return float(math.floor(lo / 2)) if s.direction == "above" else float(math.ceil(hi * 1.5))
    higher = (target == "above") != (s.direction == "below")  # as _target_value: "above" breaches the tier
    return float(math.floor(t) + 1) if higher else float(max(math.ceil(t) - 1, 0))


_VALUE = re.compile(r"\{\{\s*\$value\s*\|\s*humanizePercentage\s*\}\}")


def _expand(template: str, labels: dict[str, str], value: float | None = None) -> str:
    """The annotation as Alertmanager shows it for an alert with ``labels`` (and, for a tier's
    advice, the alert's ``value``: ``humanizePercentage`` is Prometheus' ``%.4g%%`` of value x 100).

    Raises:
        ValueError: the template names a label the alert lacks (it would render empty), or shows
            ``$value`` another way than ``humanizePercentage``, or ``value`` is None where it does.
    """
    if "$value" in template:
        if value is None:
            raise ValueError(f"annotation {template!r} shows the alert's value, unknown here")
        shown = "%.4g%%" % (value * 100)
        template = _VALUE.sub(lambda _m: shown, template)
        if "$value" in template:
            raise ValueError(f"annotation {template!r}: show the value as {{{{ $value | humanizePercentage }}}}")
    # `{{ if eq $labels.L "V" }}TEXT{{ end }}` (render_rules.alert_annotations): TEXT where the alert's L is V
    template = re.sub(r'\{\{\s*if eq \$labels\.([a-zA-Z_][a-zA-Z0-9_]*) "([^"]*)"\s*\}\}(.*?)\{\{\s*end\s*\}\}',
                      lambda m: m.group(3) if labels.get(m.group(1), "") == m.group(2) else "", template, flags=re.S)

    def label_value(m: re.Match) -> str:
        if not labels.get(m.group(1)):
            raise ValueError(f"annotation {template!r} names label {m.group(1)!r}, which the alert lacks ({', '.join(sorted(labels))})")
        return labels[m.group(1)]
    return re.sub(r"\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", label_value, template)


class _Expect:
    """Certain-or-unknown model of Prometheus' alert states for one signal's tiers."""

    def __init__(self, sig: Signal, synth: Synth):
        self.sig, self.synth, self.I = sig, synth, synth.interval
        kind = kind_of(sig)
        self.window, self.first_true = kind.window(sig), kind.first_true(sig, synth.interval)

    def state(self, tier: Tier, value_exact: float, t: float, t_drop: float) -> str | None:
        """'firing', 'quiet' or None (uncertain) at eval time t, when the signal holds
        ``value_exact`` on [0, t_drop) and a safe value after."""
        I, w = self.I, self.window
        if not promsim.breaches(value_exact, tier.threshold, self.sig.direction):
            return "quiet"
        F, K = tier.for_s, tier.keep_firing_for_s
        first_fire_latest = self.first_true + F
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


def _shows_value(tiers: list[Tier]) -> bool:
    """Whether an alert of these tiers shows its value (a tier's advice with ``$value``)."""
    return any(t.advice and "$value" in t.advice for t in tiers)


def _alert_case(sig: Signal, spec: Spec, synth: Synth, tiers_firing: list[Tier],
                v: float | None = None) -> list[dict[str, Any]]:
    """The expected alerts while the input holds target ``v`` (None: unknown), whose alert value
    (:meth:`Kind.alert_value`) an advice may show."""
    res = kind_of(sig).result_labels(synth)
    out = []
    for t in tiers_firing:
        labels = {**res, **alert_labels(sig, t, spec)}
        value = None if v is None else kind_of(sig).alert_value(synth, t, v)
        ann = {k: _expand(text, res, value) for k, text in alert_annotations(sig, t, spec).items()}
        out.append({"exp_labels": labels, "exp_annotations": ann})
    return out


def _checks(sig, spec, synth, value_exact, times, t_drop, comments, v=None) -> list[dict[str, Any]]:
    """The alert checks at ``times``; where the alert shows its value (:func:`_shows_value`), only
    while the input holds target ``v`` (before ``t_drop``), since after it the value moves with
    the rate window."""
    exp = _Expect(sig, synth)
    out = []
    for t, why in zip(times, comments, strict=False):
        if t < 0:
            continue
        states = {tier.name: exp.state(tier, value_exact, t, t_drop) for tier in sig.tiers}
        if None in states.values():
            continue
        firing = [tier for tier in sig.tiers if states[tier.name] == "firing"]
        held = v if t < t_drop else None
        if _shows_value(firing) and held is None:
            continue
        out.append({"eval_time": format_duration(t), "alertname": sig.alert,
                    "exp_alerts": _alert_case(sig, spec, synth, firing, held), "_why": why})
    return out


def _tier_groups(sig: Signal, spec: Spec) -> list[tuple[str, dict[str, Any]]]:
    kind = kind_of(sig)
    synth = Synth.of(sig, spec)
    I = synth.interval
    w = kind.window(sig)
    first_true = kind.first_true(sig, I)
    max_for = max(t.for_s for t in sig.tiers)
    max_kff = max(t.keep_firing_for_s for t in sig.tiers)
    n_a = int((max_for + w + 6 * I) // I) + 1
    n_b = int((w + max_kff + 6 * I) // I) + 1
    t_drop = n_a * I
    groups = []
    for tier in sig.tiers:
        for target in ("above", "below") + (("at",) if kind.edge_tested else ()):
            v = _target_value(synth, tier, target)
            safe = _target_value(synth, tier, "safe")
            phases = [(n_a, v), (n_b, safe)]
            v_exact = kind.exact(synth, v)
            F, K = tier.for_s, tier.keep_firing_for_s
            if target == "above":
                times = [F - I, F + first_true + I, t_drop + K - 2 * I, t_drop + w + max_kff + 2 * I]
                why = [f"{tier.name}: pending one interval before `for` ({format_duration(F)}) ends",
                       f"{tier.name}: firing once `for` has passed",
                       f"{tier.name}: still firing within keep_firing_for ({format_duration(K)}) after the value fell",
                       f"{tier.name}: resolved after keep_firing_for"]
                if F < I:
                    times[0] = -1
                if K < 2 * I:
                    times[2] = -1
            elif target == "at":
                times = [F + first_true + I]
                why = [f"{tier.name}: a value exactly at {tier.threshold_text} fires once `for` has passed"]
            else:
                times = [t_drop - I]
                why = [f"{tier.name}: a value just inside {tier.threshold_text} never fires this tier"]
            checks = _checks(sig, spec, synth, v_exact, times, t_drop, why, v)
            if not checks:
                continue
            side = target if sig.direction == "above" else {"above": "below", "below": "above", "at": "at"}[target]
            title = (f"{sig.alert} {tier.name}: {sig.name} {'exactly' if target == 'at' else 'just'} {side} {tier.threshold_text} "
                     f"(signal {format_number(v_exact)})")
            groups.append((title, {"interval": format_duration(I), "input_series": kind.series(synth, phases),
                                   "alert_rule_test": checks}))
    return groups


def _shedding_groups(sig: Signal, spec: Spec) -> list[tuple[str, dict[str, Any]]]:
    """For each tier with ``after_shedding``: the value held above its threshold while a gateway
    is scraped, (a) refusing nothing (the tier waits: never fires; the other tiers as usual) and
    (b) refusing requests throughout (it fires once its ``for`` has passed). The other groups feed
    no gateway series, so there the tier acts as if it did not wait (the rule's fail-open branch)."""
    kind = kind_of(sig)
    synth = Synth.of(sig, spec)
    I = synth.interval
    first_true = kind.first_true(sig, I)
    exp = _Expect(sig, synth)
    groups = []
    for tier in (t for t in sig.tiers if t.after_shedding):
        v = _target_value(synth, tier, "above")
        v_exact = kind.exact(synth, v)
        F = tier.for_s
        n = int((F + first_true + kind.window(sig) + 6 * I) // I) + 1
        t_check = F + first_true + I
        admissions = C.GATEWAY_ADMISSIONS
        allowed = {"series": f'{admissions}{{result="allowed"}}', "values": f"0+10x{n}"}
        for shedding in (False, True):
            rejected = {"series": f"{admissions}{label_str(C.GATEWAY_REJECTED)}", "values": f"0+{5 if shedding else 0}x{n}"}
            states = {t.name: exp.state(t, v_exact, t_check, n * I + I) for t in sig.tiers}
            if not shedding:
                states[tier.name] = "quiet"
            if None in states.values():
                continue
            firing = [t for t in sig.tiers if states[t.name] == "firing"]
            why = (f"{tier.name}: the gateways refuse requests: fires once `for` ({format_duration(F)}) has passed" if shedding
                   else f"{tier.name}: waits while the gateways are scraped and refuse nothing")
            title = (f"{sig.alert} {tier.name} after shedding: {sig.name} above {tier.threshold_text} "
                     f"(signal {format_number(v_exact)}), the gateways {'refusing requests' if shedding else 'refusing none'}")
            groups.append((title, {"interval": format_duration(I),
                                   "input_series": kind.series(synth, [(n, v)]) + [allowed, rejected],
                                   "alert_rule_test": [{"eval_time": format_duration(t_check), "alertname": sig.alert,
                                                        "exp_alerts": _alert_case(sig, spec, synth, firing, v), "_why": why}]}))
    return groups


def _absent_check(spec: Spec, rules: Rules, group: dict[str, Any]) -> dict[str, Any] | None:
    """At the group's last alert check, exactly the absent alerts of the metrics its input lacks.

    A metric with series in the group must raise none (e.g. zero traffic: the series are there,
    only their rates are 0); each other metric the rules read has had no series since the start,
    so its alert fires once ``absent.for`` has passed. None where that time is within one interval
    of ``absent.for`` (uncertain) or the group checks no alert.
    """
    times = [parse_duration(c["eval_time"]) for c in group.get("alert_rule_test", [])]
    if not (spec.absent_enabled and rules.raw_metrics and times):
        return None
    t, I, F = max(times), spec.test_interval_s, spec.absent_for_s
    present = {s["series"].split("{")[0] for s in group["input_series"]}
    if t >= F + I:
        missing = [m for m in sorted(rules.raw_metrics) if m not in present]
    elif t <= F - I:
        missing = []
    else:
        return None
    return {"eval_time": format_duration(t), "alertname": C.ABSENT_ALERT, "exp_alerts": [
        {"exp_labels": {**spec.selector_for(rules.raw_backends[m]), **absent_labels(m, rules.raw_metrics[m], spec)},
         "exp_annotations": absent_annotations(m, rules.raw_metrics[m], spec)} for m in missing],
        "_why": "the absent-signal alert fires for the metrics this group feeds no series of, and for no other"}


def _extra_groups(sig: Signal, spec: Spec, rules: Rules) -> list[tuple[str, dict[str, Any]]]:
    """The kind's own extra groups (e.g. zero traffic), each with :func:`_absent_check`."""
    out = []
    for title, typed in kind_of(sig).extra_tests(Synth.of(sig, spec)):
        group: dict[str, Any] = dict(typed)
        check = _absent_check(spec, rules, group)
        if check:
            group["alert_rule_test"] = [*group["alert_rule_test"], check]
        out.append((title, group))
    return out


def _gpu_down_group(spec: Spec) -> tuple[str, dict[str, Any]]:
    """One GPU lost (up 0) beside a healthy one: the alert fires after its `for`, for the lost one only."""
    I = spec.test_interval_s
    n = int((GPU_DOWN_FOR_S + 4 * I) // I) + 1
    lost = {**GPU_LABELS, **spec.selector_for(FUSEBOX)}
    ok = {**lost, "hw_id": "GPU-5a3c1f2e-0000-4000-8000-000000000002", "hw_gpu_index": "1"}
    res = {k: v for k, v in lost.items() if k not in (C.LABEL["instance"], C.LABEL["job"])}
    ann = {k: _expand(v, res) for k, v in gpu_down_annotations(spec).items()}
    # quiet one evaluation before the `for` has passed (at 0 where the interval is longer than the `for`:
    # a 61s evaluation_interval made this -1s, which promtool and vmalert-tool refuse)
    checks = [{"eval_time": format_duration(max(0.0, GPU_DOWN_FOR_S - I)), "alertname": C.GPU_DOWN_ALERT, "exp_alerts": []},
              {"eval_time": format_duration(GPU_DOWN_FOR_S + I), "alertname": C.GPU_DOWN_ALERT,
               "exp_alerts": [{"exp_labels": {**res, **gpu_down_labels(spec, action)}, "exp_annotations": ann}
                              for action in lost_gpu_fuses(spec) or (None,)]}]
    return (f"{C.GPU_DOWN_ALERT}: a GPU the collector lost (up 0) alerts after "
            f"{format_duration(GPU_DOWN_FOR_S)}; a healthy one does not", {
                "interval": format_duration(I),
                "input_series": [{"series": C.PROM["gpu_up"] + label_str(lost), "values": segments([(n, 0, 0)])},
                                 {"series": C.PROM["gpu_up"] + label_str(ok), "values": segments([(n, 1, 0)])}],
                "alert_rule_test": checks})


def render_rule_tests(spec: Spec, rules: Rules, rule_file: str) -> list[tuple[str, dict[str, Any]]]:
    """Return [(comment, test group)] for promtool; ``rule_file`` is relative to the test file."""
    groups: list[tuple[str, dict[str, Any]]] = []
    for sig in spec.signals:
        if not sig.tiers:
            continue
        if not kind_of(sig).testable(sig):
            continue  # e.g. a custom expression: no generic way to synthesise its inputs
        groups += _tier_groups(sig, spec) + _shedding_groups(sig, spec) + _extra_groups(sig, spec, rules)
    if gpu_down_enabled(spec):
        groups.append(_gpu_down_group(spec))
    groups += self_tests(spec)
    groups += scaling_tests(spec)  # the autoscalers' load records and the CostQoS alert (render_scaling)
    if spec.absent_enabled and rules.raw_metrics:
        I = spec.test_interval_s
        t = spec.absent_for_s + I
        checks = [{"eval_time": format_duration(t), "alertname": C.ABSENT_ALERT, "exp_alerts": [
            {"exp_labels": {**spec.selector_for(rules.raw_backends[m]), **absent_labels(m, sigs, spec)},
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
