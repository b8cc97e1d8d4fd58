"""SLO rules, their promtool tests and runbooks from the spec's ``slos:`` (pure: returns data, no I/O).

Per SLO (:class:`fusebox.spec.slo.Slo`) one group, ``fusebox-slo-<name>``, at
``global.slow_evaluation_interval``: the error ratio (the share of observations over the
good-event threshold, ``1 - rate(bucket{le=T}) / rate(count)``) over each window the SRE workbook's
multiwindow, multi-burn-rate alerts read (5m, 30m, 1h, 2h, 6h, 1d, 3d), the error budget left
over the SLO window, and one alert ``<Slo>ErrorBudgetBurn`` per severity: page (14.4x over 1h and
5m, or 6x over 6h and 30m, for a 30-day window) and ticket (3x over 1d and 2h, or 1x over 3d and
6h). docs/slo.md derives the windows and factors; :func:`detection_s` works out when each fires.

The generated tests (:func:`slo_test_groups`) run in their own file at a one-minute evaluation
interval (days of input at the rules' interval would take promtool minutes): for each of the
four window pairs a burn that only that pair can catch, expected to fire at its detection time
and not one evaluation before, and quiet pairs of the other severity throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fusebox import conventions as C
from fusebox.signal_kinds.base import DashboardDef, PanelDef, Query, le_regex, selector
from fusebox.spec import Spec
from fusebox.spec import slo as spec_slo
from fusebox.spec.slo import RATIO_WINDOWS, BurnTier, Slo
from fusebox.spec.units import format_duration, format_number

__all__ = ["WINDOWS", "GROUP_PREFIX", "group_name", "ratio_record", "budget_record", "slo_rules", "slo_alert_labels",
           "slo_annotations", "detection_s", "slo_test_groups", "TEST_INTERVAL_S", "runbook_facts", "SloCase", "DASHBOARD",
           "dashboard"]

WINDOWS = RATIO_WINDOWS
TEST_INTERVAL_S = 60.0  # the SLO test files' evaluation interval and input step
_TEST_LABEL_VALUE = "test"


GROUP_PREFIX = "fusebox-slo-"


def group_name(slo: Slo) -> str:
    return f"{GROUP_PREFIX}{slo.name}"


def ratio_record(slo: Slo, window_s: float) -> str:
    """``slo:fusebox_<name>_errors:ratio_rate<w>``: the share of bad events over the window (0-1)."""
    return spec_slo.ratio_record(slo.name, window_s)


def budget_record(slo: Slo) -> str:
    """``slo:fusebox_<name>_error_budget:remaining_ratio``: the budget left over the SLO window."""
    return spec_slo.budget_record(slo.name)


def _by(slo: Slo) -> str:
    return ", ".join(slo.by)


def _ratio_expr(slo: Slo, spec: Spec, window_s: float) -> str:
    w = format_duration(window_s)
    good = selector(f"{slo.metric}_bucket", spec, regex={"le": le_regex(slo.threshold)}, backend=slo.backend)
    total = selector(f"{slo.metric}_count", spec, backend=slo.backend)
    return (f"1 - sum by ({_by(slo)}) (rate({good}[{w}]))\n"
            f"  / (sum by ({_by(slo)}) (rate({total}[{w}])) > 0)")


def _threshold(factor: float, slo: Slo) -> float:
    return round(factor * slo.budget, 12)


def _alert_expr(slo: Slo, tier: BurnTier) -> str:
    pairs = []
    for factor, long_s, short_s in tier.windows:
        t = format_number(_threshold(factor, slo))
        pairs.append(f"(\n  {ratio_record(slo, long_s)} > {t}\n  and\n  {ratio_record(slo, short_s)} > {t}\n)")
    return "\nor\n".join(pairs)


def slo_alert_labels(slo: Slo, tier: BurnTier, spec: Spec) -> dict[str, str]:
    """The marker (``global.labels`` and ``fusebox``), the house severity, ``slo`` and ``slo_alert``
    (page or ticket) and, where the tier requests one, ``fuse_action`` and ``fuse_level``: the same
    labels Alertmanager routes the threshold tiers on, so a burn reaches the fuse by the same route."""
    labels = {**spec.labels, C.LABEL["marker"]: spec.name, C.LABEL["severity"]: tier.severity,
              "slo": slo.name, "slo_alert": tier.name}
    if tier.fuse:
        labels[C.LABEL["fuse_action"]] = tier.fuse
        labels[C.LABEL["fuse_level"]] = str(tier.fuse_level)
    return labels


def _pairs_text(slo: Slo, tier: BurnTier) -> str:
    return " or ".join(f"{format_number(f)}x over {format_duration(lw)} and {format_duration(sw)}" for f, lw, sw in tier.windows)


def slo_annotations(slo: Slo, tier: BurnTier, spec: Spec) -> dict[str, str]:
    """Summary, description (labels only, so the generated tests state them exactly) and runbook_url."""
    where = ", ".join(f"{lb} {{{{ $labels.{lb} }}}}" for lb in slo.by)
    target = f"{format_number(slo.objective * 100)}% of {slo.metric} at or under {format_number(slo.threshold)}s"
    action = f" The fuse requests: {spec.actions[tier.fuse].description}" if tier.fuse else ""
    return {
        "summary": f"{slo.alert}: {slo.name} burns its error budget ({tier.name}) on {where}",
        "description": (f"The SLO {slo.name} ({target} over {format_duration(slo.window_s)}) burns its error budget at "
                        f"{_pairs_text(slo, tier)} the sustainable rate on {where}.{action}"),
        "runbook_url": spec.runbook_url(slo.alert),
    }


def slo_rules(slo: Slo, spec: Spec) -> dict[str, Any]:
    """The SLO's rule group, ``fusebox-slo-<name>`` at ``global.slow_evaluation_interval``: ratio
    records per window, the page and ticket alerts, then the budget left over the SLO window (it
    reads days of samples per evaluation: the burn-rate cases' rule file leaves it out)."""
    rules: list[dict[str, Any]] = [{"record": ratio_record(slo, w), "expr": _ratio_expr(slo, spec, w), "labels": {"slo": slo.name}}
                                   for w in WINDOWS]
    for tier in slo.tiers:
        rules.append({"alert": slo.alert, "expr": _alert_expr(slo, tier), "labels": slo_alert_labels(slo, tier, spec),
                      "annotations": slo_annotations(slo, tier, spec)})
    r5 = ratio_record(slo, WINDOWS[0])
    win = format_duration(slo.window_s)
    budget = {"record": budget_record(slo), "labels": {"slo": slo.name},
              "expr": f"1 - (sum_over_time({r5}[{win}]) / count_over_time({r5}[{win}])) / {format_number(slo.budget)}"}
    return {"name": group_name(slo), "interval": format_duration(spec.slow_evaluation_interval_s), "rules": [*rules, budget]}


# ----------------------------------------------------------------------------- detection times
def _first_over(bad_share: float, threshold: float, steps: int) -> int | None:
    """The fewest burning steps n (n <= steps) for which a window of ``steps`` increments, n of them
    at ``bad_share`` bad and the rest all good, has an error ratio over ``threshold``; None if never."""
    edge = threshold * steps / bad_share
    if abs(edge - round(edge)) < 1e-6:
        return None  # the ratio would sit exactly on the threshold: floating point decides, so no test
    n = math.floor(edge) + 1
    return n if n <= steps else None


def detection_s(bad_share: float, threshold: float, long_s: float, short_s: float, step_s: float = TEST_INTERVAL_S) -> float | None:
    """Seconds from the start of a constant burn (``bad_share`` of the events bad, after a window of
    all good ones) until the pair (long, short) is over ``threshold`` on both windows, sampled and
    evaluated every ``step_s``; None when it never is, or when the answer depends on whether the
    window holds w/step increments (Prometheus 2, VictoriaMetrics: the sample at the window's start
    counts) or one fewer (Prometheus 3: the range is left-open). Worked by hand in docs/slo.md:
    100 % errors at 14.4x a 1 % budget over 1h: n/60 > 0.144 first at n = 9, nine minutes."""
    out = []
    for extra in (0, -1):
        ns = [_first_over(bad_share, threshold, int(round(w / step_s)) + extra) for w in (long_s, short_s)]
        if None in ns:
            return None
        out.append(max(n for n in ns if n is not None) * step_s)
    return out[0] if out[0] == out[1] else None


SloCase = tuple[str, BurnTier, float, float, float, float]  # (title, tier, bad share, detection s, pair's long window s, healthy history s)


def _firing(slo: Slo, bad_share: float, n: int, healthy: int, step_s: float) -> set[tuple[str, int]]:
    """The tiers firing ``n`` steps into the burn after ``healthy`` all-good steps, as (tier, convention)
    for both window conventions (w/step increments, or one fewer): a window reaching back before
    the first sample holds every increment there is."""
    out = set()
    for extra in (0, -1):
        for tier in slo.tiers:
            for factor, long_s, short_s in tier.windows:
                t = _threshold(factor, slo)
                steps = [int(round(w / step_s)) + extra for w in (long_s, short_s)]
                if all(min(n, k) * bad_share / min(k, healthy + n) > t for k in steps):
                    out.add((tier.name, extra))
    return out


def _healthy_steps(slo: Slo, tier: BurnTier, bad_share: float, det_s: float, step_s: float) -> int | None:
    """The shortest all-good history (whole hours, at most the longest window) after which the burn
    fires nothing one step before ``det_s`` and only ``tier`` at it, under both conventions; None if none does."""
    n = int(round(det_s / step_s))
    hour = int(round(3600 / step_s))
    for healthy in range(hour, int(round(max(WINDOWS) / step_s)) + 1, hour):
        if not _firing(slo, bad_share, n - 1, healthy, step_s) and _firing(slo, bad_share, n, healthy, step_s) == {(tier.name, 0), (tier.name, -1)}:
            return healthy
    return None

# Burn rates tried per window pair, as multiples of the pair's factor span: the first whose
# detection is the same under both window conventions is taken (docs/slo.md).
_TRIES = (1.05, 1.1, 1.2, 1.3, 1.5, 1.7, 1.9, 1.15, 1.25, 1.35, 1.45, 1.55, 1.65, 1.75, 1.85)


def _cases(slo: Slo) -> list[SloCase]:
    """One burn per window pair that only that pair catches: for the fast page pair 100 % errors
    (or, where that one's detection minute differs between the window conventions, as at 13.44x
    for a 28d window, the largest whole percent that agrees), for the others a burn between the
    pair's factor and the next faster factor."""
    pairs = [(t, f, lw, sw) for t in slo.tiers for f, lw, sw in t.windows]
    out: list[SloCase] = []
    for i, (tier, factor, long_s, short_s) in enumerate(pairs):
        threshold = _threshold(factor, slo)
        if i == 0:
            tries = [p / 100 for p in range(100, 0, -1) if p / 100 > threshold * _TRIES[0]]
        else:
            upper = _threshold(pairs[i - 1][1], slo)
            tries = [threshold * m for m in _TRIES if threshold * m < upper and threshold * m <= 1]
        for bad in tries:
            bad = round(bad, 6)
            t = detection_s(bad, threshold, long_s, short_s)
            healthy = None if t is None else _healthy_steps(slo, tier, bad, t, TEST_INTERVAL_S)
            if t is not None and healthy is not None:
                out.append((f"{format_number(bad * 100)}% bad ({format_number(bad / slo.budget)}x the budget's rate)",
                            tier, bad, t, long_s, healthy * TEST_INTERVAL_S))
                break
    return out


def _series_labels(slo: Slo, spec: Spec) -> dict[str, str]:
    return {**spec.selector_for(slo.backend), **{lb: _TEST_LABEL_VALUE for lb in slo.by}}


def _label_str(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""


def slo_test_groups(spec: Spec) -> list[tuple[str, dict[str, Any]]]:
    """[(title, promtool test group)]: per SLO and window pair, an all-good history (the shortest
    that keeps every other pair quiet), then a constant burn from then on; the pair's alert fires at
    its detection time and not one evaluation before, and the other severity stays quiet."""
    out = []
    I = TEST_INTERVAL_S
    seen: set[tuple[float, float]] = set()
    for slo in spec.slos:
        labels = _series_labels(slo, spec)
        res = {lb: _TEST_LABEL_VALUE for lb in slo.by}
        events = 1000.0
        # every window pair once per objective and window (the windows and factors); the fast page
        # case for each further SLO (its own expression): days of one-minute steps are slow to test
        cases = _cases(slo)
        if (slo.objective, slo.window_s) in seen:  # the fast page pair (the first tier's first window) alone
            cases = [c for c in cases if (c[1].name, c[4]) == (slo.tiers[0].name, slo.tiers[0].windows[0][1])]
        seen.add((slo.objective, slo.window_s))
        for title, tier, bad, det, long_s, history_s in cases:
            per_step = events
            while not float(per_step * (1 - bad)).is_integer():
                per_step *= 10
            good = per_step * (1 - bad)
            healthy = int(history_s / I)
            burn = int(det / I) + 2
            # large starting values: rate()'s extrapolation then scales both counters alike (docs/slo.md)
            start = 1e6
            count = f"{format_number(start)}+{format_number(per_step)}x{healthy + burn}"
            burning = start + per_step * healthy + good
            bucket = f"{format_number(start)}+{format_number(per_step)}x{healthy} {format_number(burning)}+{format_number(good)}x{burn - 1}"
            t0 = history_s
            other = next(t for t in slo.tiers if t is not tier)
            exp = [{"exp_labels": {**res, **slo_alert_labels(slo, tier, spec)},
                    "exp_annotations": {k: _expand(v, res) for k, v in slo_annotations(slo, tier, spec).items()}}]
            checks = [
                {"eval_time": format_duration(t0 + det - I), "alertname": slo.alert, "exp_alerts": [],
                 "_why": f"{format_duration(det - I)} into the burn: one evaluation before its detection time, nothing"},
                {"eval_time": format_duration(t0 + det), "alertname": slo.alert, "exp_alerts": exp,
                 "_why": f"{format_duration(det)} into the burn: {tier.name} fires (over {format_duration(long_s)} and its short window), "
                         f"{other.name} does not"},
            ]
            out.append((f"{slo.alert} ({slo.name}): {title} after {format_duration(history_s)} all good: "
                        f"{tier.name} over {format_duration(long_s)} at {format_duration(det)}", {
                            "interval": format_duration(I),
                            "input_series": [
                                {"series": f"{slo.metric}_count{_label_str(labels)}", "values": count},
                                {"series": f'{slo.metric}_bucket{_label_str({**labels, "le": format_number(slo.threshold)})}',
                                 "values": bucket},
                            ],
                            "alert_rule_test": checks}))
    return out


def _expand(template: str, labels: dict[str, str]) -> str:
    for k, v in labels.items():
        template = template.replace(f"{{{{ $labels.{k} }}}}", v)
    return template


def runbook_facts(spec: Spec) -> dict[str, dict[str, Any]]:
    """alert name -> what ``runbook_self.md.j2`` renders, per SLO."""
    out = {}
    for slo in spec.slos:
        alerts = [r for r in slo_rules(slo, spec)["rules"] if "alert" in r]
        routes = [f"{t.name}: the people" + (f" and the fuse ({t.fuse}, level {t.fuse_level})" if t.fuse else "") for t in slo.tiers]
        out[slo.alert] = {
            # a sentence: the SLO's own words (as the user wrote them) after it, not before
            "description": (f"The SLO {slo.name} holds while {format_number(slo.objective * 100)}% of {slo.metric} "
                            f"observations are at or under {format_number(slo.threshold)}s over {format_duration(slo.window_s)}."
                            + (f" Its description: {slo.description}" if slo.description else "")),
            "means": (f"bad events (over {format_number(slo.threshold)}s) arrive fast enough to spend the error budget of "
                      f"{format_number(slo.budget * 100)}% early: page when 2% of it goes in an hour or 5% in six hours, "
                      "ticket when 10% goes in a day or in three days (docs/slo.md)"),
            "severity": ", ".join(f"{t.severity} ({t.name})" for t in slo.tiers),
            "route": "; ".join(routes),
            "rules": [{"expr": " ".join(a["expr"].split())} for a in alerts],
            "diagnosis": [
                f"The error ratio per window: `{ratio_record(slo, 3600.0)}` (and the other windows); "
                f"the budget left: `{budget_record(slo)}`.",
                f"Which of {_by(slo)} burns: `topk(5, {ratio_record(slo, 3600.0)})`.",
                f"Dashboard fusebox / {spec.name} / SLOs (dashboards/fusebox-{DASHBOARD}.json): the budget left and the burn rate "
                "of each page and ticket window; the signal dashboards' latency panels and the threshold alerts of the same engines.",
            ],
            "sop": [
                "Page: act now. Find the engines or models that burn (the diagnosis' topk) and the change that started it "
                "(deployment, traffic mix, image sizes); roll back or shed.",
                "Ticket: the budget goes slowly; plan the fix within the SLO window.",
                "After the fix the short window clears within minutes and the alert resolves; the budget record shows what was spent.",
            ],
        }
    return out


# ----------------------------------------------------------------------------- dashboard
DASHBOARD = "slo"  # dashboards/fusebox-slo.json


@dataclass(frozen=True)
class _Line:
    """A threshold line of a burn-rate panel: ``name`` the alert's house severity (its colour),
    ``threshold`` the pair's burn factor."""

    name: str
    threshold: float


def _filter(slo: Slo) -> str:
    return '{cluster=~"$cluster"}' if "cluster" in slo.by else ""


def _burn_panel(slo: Slo, tier: BurnTier, legend: str) -> PanelDef:
    """The burn rates of ``tier``'s window pairs: each window's error ratio over the budget, with
    the pair's factor as a line (the alert fires while a pair's long and short windows are both over it)."""
    queries = tuple(Query(f"{ratio_record(slo, w)}{_filter(slo)} / {format_number(slo.budget)}", f"{format_duration(w)} {legend}")
                    for _f, long_s, short_s in tier.windows for w in (long_s, short_s))
    lines = tuple(_Line(tier.severity, f) for f, _l, _s in sorted(tier.windows))
    return PanelDef(
        f"{slo.alert}: {slo.name.replace('_', ' ')} burn rate, {tier.name} windows",
        (f"The error ratio over each window the {tier.name} alert reads, as a multiple of the rate that spends exactly the "
         f"{format_number(slo.budget * 100)}% budget in {format_duration(slo.window_s)} (1 = sustainable): it fires at "
         f"{_pairs_text(slo, tier)} (lines at {', '.join(format_number(x.threshold) for x in lines)})."),
        queries, "none", (slo.alert,), tiers=lines, width=8)


def dashboard(spec: Spec) -> DashboardDef | None:
    """The SLO board (``fusebox / <spec> / SLOs``); None without ``slos:``. One row per SLO, three
    panels wide: the error budget left over the SLO window (``budget_record``, 1 untouched, below 0
    overspent), then the burn rates of the page windows (1h and 5m, 6h and 30m) and of the ticket
    windows (1d and 2h, 3d and 6h): each window's error-ratio record over the budget. Every query reads a record of
    the SLO's group (:func:`slo_rules`); every panel links to the SLO alert's runbook."""
    if not spec.slos:
        return None
    panels: list[PanelDef] = []
    for slo in spec.slos:
        legend = " ".join(f"{{{{{lb}}}}}" for lb in slo.by)
        panels.append(PanelDef(
            f"{slo.alert}: {slo.name.replace('_', ' ')} error budget left",
            (f"{slo.description + ' ' if slo.description else ''}The share of the error budget "
             f"({format_number(slo.budget * 100)}% of {slo.metric} over {format_number(slo.threshold)}s) not yet spent over the "
             f"last {format_duration(slo.window_s)}: 100% untouched, 0 spent, below 0 overspent ({budget_record(slo)})."),
            (Query(f"{budget_record(slo)}{_filter(slo)}", legend),), "percentunit", (slo.alert,), kind="stat",
            steps=(("red", None), ("green", 0.0)), width=8, no_value="no events yet (or the histogram is not scraped)"))
        panels += [_burn_panel(slo, tier, legend) for tier in slo.tiers]
    return DashboardDef(DASHBOARD, f"fusebox / {spec.name} / SLOs",
                        "Per SLO: the error budget left over its window and the burn rates the multiwindow, multi-burn-rate "
                        "page and ticket alerts read (docs/slo.md).", tuple(panels))
