"""vmalert-tool unit tests: the promtool tests of :mod:`.render_tests`, transformed (pure: no I/O).

The same test cases, rendered once, run under ``vmalert-tool unittest`` (VictoriaMetrics) with
three changes, each from vmalert-tool's documentation (https://docs.victoriametrics.com/vmalert-tool/)
and source (app/vmalert-tool/unittest):

* ``promql_expr_test`` is ``metricsql_expr_test`` (the tool runs MetricsQL), and an expected
  sample without labels is written ``""`` rather than ``{}``;
* every ``alert_rule_test`` names its rule group (``groupname``: vmalert adds the ``alertgroup``
  label to each alert); a case whose alert lives in several groups (a split group, e.g.
  ``fusebox-absent-1`` and ``-2``) becomes one case per group, each expecting the alerts of that
  group's rules;
* series of Unix timestamps (names ending ``_timestamp_seconds``, Prometheus' convention) move by
  the tools' different epochs: promtool's tests start at Unix time 0, vmalert-tool's at
  2000-01-01T00:00:00Z (``testStartTime`` in app/vmalert-tool/unittest/unittest.go), and a rule
  comparing such a series with ``time()`` must see the same age on both;
* times move later by the alert's lag: vmalert stores a recording rule's result after the group's
  evaluation, so a rule reading a record of its own group sees the previous evaluation's value,
  one interval per level of same-group chain (:func:`.rule_rule_engines.chain_depths`). The lags are
  computed from the rules and stated in the file's header.
"""

from __future__ import annotations

import re
from typing import Any

from fusebox.spec.units import format_duration, format_number, parse_duration

from .rule_engines import chain_depths, records_read

__all__ = ["alert_lags", "record_lags", "vmalert_tests", "lag_note", "VMALERT_TOOL_EPOCH_S"]

# vmalert-tool's tests start at 2000-01-01T00:00:00Z (promtool's at Unix time 0).
VMALERT_TOOL_EPOCH_S = 946_684_800
TIMESTAMP_SUFFIX = "_timestamp_seconds"
_TOKEN = re.compile(r"^(?P<start>[^x]+?)(?P<step>[+-][0-9.]+(?:e[+-]?\d+)?)?(?P<times>x\d+)?$")


def _epoch_shifted(values: str) -> str:
    """promtool series notation (``0+5x4 20x127 stale``) with every segment's start value moved
    by :data:`VMALERT_TOOL_EPOCH_S`; ``stale`` and ``_`` (no sample) kept."""
    out = []
    for token in values.split():
        m = _TOKEN.match(token)
        if token in ("stale", "_") or not m:
            out.append(token)
            continue
        start = format_number(float(m["start"]) + VMALERT_TOOL_EPOCH_S)
        out.append(start + (m["step"] or "") + (m["times"] or ""))
    return " ".join(out)


def _series(series: list[dict[str, str]]) -> list[dict[str, str]]:
    """The input series, timestamp-valued ones on vmalert-tool's epoch (the others as they are)."""
    if not any(s["series"].split("{")[0].endswith(TIMESTAMP_SUFFIX) for s in series):
        return series  # the same list: the test files share its text
    return [{**s, "values": _epoch_shifted(s["values"])} if s["series"].split("{")[0].endswith(TIMESTAMP_SUFFIX) else s
            for s in series]


def _depths(groups: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], int]]:
    """(group name, rule, chain depth) for every rule; a group without records has none to parse."""
    out = []
    for g in groups:
        rules = g["rules"]
        depths = chain_depths(rules) if any("record" in r for r in rules) else [0] * len(rules)
        out += [(g["name"], r, d) for r, d in zip(rules, depths, strict=False)]
    return out


def alert_lags(groups: list[dict[str, Any]], depths: list[tuple[str, dict[str, Any], int]] | None = None
               ) -> dict[str, dict[str, int]]:
    """``{alert name: {group name: lag in evaluation intervals}}`` for every alerting rule (the
    deepest of its rules where one group holds several of the same name); ``depths``: the
    groups' :func:`_depths`, when already computed."""
    out: dict[str, dict[str, int]] = {}
    for name, rule, depth in depths if depths is not None else _depths(groups):
        if "alert" in rule:
            per = out.setdefault(rule["alert"], {})
            per[name] = max(per.get(name, 0), depth)
    return out


def record_lags(groups: list[dict[str, Any]], depths: list[tuple[str, dict[str, Any], int]] | None = None
                ) -> dict[str, int]:
    """``{record name: lag in evaluation intervals}``: how many evaluations late vmalert stores a
    record's value compared with Prometheus (its chain depth in its group)."""
    out: dict[str, int] = {}
    for _name, rule, depth in depths if depths is not None else _depths(groups):
        if "record" in rule:
            out[rule["record"]] = max(out.get(rule["record"], 0), depth)
    return out


def _shift(eval_time: str, levels: int, interval_s: float) -> str:
    return format_duration(parse_duration(eval_time) + levels * interval_s)


def _owner(exp: dict[str, Any], rules_by_group: dict[str, list[dict[str, Any]]]) -> str:
    """The group whose rule (of the case's alert name) would produce the expected alert: its labels
    are all among the alert's. The first group when none matches (the tool then reports the case)."""
    labels = exp.get("exp_labels") or {}
    for name, rules in rules_by_group.items():
        if any(all(labels.get(k) == v for k, v in (r.get("labels") or {}).items()) for r in rules):
            return name
    return next(iter(rules_by_group))


def _alert_rules(groups: list[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """``{alert name: {group name: its alerting rules of that name}}``."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for g in groups:
        for r in g["rules"]:
            if "alert" in r:
                out.setdefault(r["alert"], {}).setdefault(g["name"], []).append(r)
    return out


def _alert_cases(case: dict[str, Any], alert_rules: dict[str, dict[str, list[dict[str, Any]]]],
                 lags: dict[str, dict[str, int]], interval_s: float) -> list[dict[str, Any]]:
    alert = case["alertname"]
    rules_by_group = alert_rules.get(alert)
    if not rules_by_group:
        return []  # no rule of that name (a signal without tiers): nothing to check on any engine
    exps: dict[str, list[dict[str, Any]]] = {n: [] for n in rules_by_group}
    for exp in case["exp_alerts"]:
        exps[_owner(exp, rules_by_group)].append(exp)
    out = []
    for group_name, expected in exps.items():
        c: dict[str, Any] = {}
        for k, v in case.items():
            if k == "exp_alerts":
                c["groupname"] = group_name
            c[k] = v
        c["eval_time"] = _shift(case["eval_time"], lags[alert][group_name], interval_s)
        c["exp_alerts"] = expected
        out.append(c)
    return out


def vmalert_tests(tests: list[tuple[str, dict[str, Any]]], groups: list[dict[str, Any]],
                  interval_s: float) -> list[tuple[str, dict[str, Any]]]:
    """The promtool test groups ``tests`` (as :func:`.render_tests.render_rule_tests` returns them;
    not modified) for vmalert-tool, against the rule ``groups`` evaluated every ``interval_s``
    seconds. Same order, same titles."""
    depths = _depths(groups)
    lags, rec_lags = alert_lags(groups, depths), record_lags(groups, depths)
    rules = _alert_rules(groups)
    out = []
    for title, group in tests:
        g = dict(group)  # new lists where they change; the input series are shared, not copied
        if g.get("input_series"):
            g["input_series"] = _series(g["input_series"])
        if "alert_rule_test" in g:
            g["alert_rule_test"] = [c for case in g["alert_rule_test"]
                                    for c in _alert_cases(case, rules, lags, interval_s)]
        if "promql_expr_test" in g:
            cases = []
            for case in g.pop("promql_expr_test"):
                levels = max((rec_lags[r] for r in records_read(case["expr"], set(rec_lags))), default=0)
                samples = [{**s, "labels": "" if s.get("labels") == "{}" else s["labels"]} for s in case.get("exp_samples", [])]
                cases.append({**case, "eval_time": _shift(case["eval_time"], levels, interval_s), "exp_samples": samples})
            g["metricsql_expr_test"] = cases
        out.append((title, g))
    return out


def lag_note(groups: list[dict[str, Any]], interval_s: float) -> str:
    """Comment lines for the test file's header: each alert's lag on a deployed vmalert, in
    evaluations of its own group and seconds at that group's ``interval`` (``interval_s`` for a
    group without one), with its group; and how far this file moves each case: the same number of
    evaluations at ``interval_s``, the file's evaluation_interval, at which vmalert-tool (like
    promtool) evaluates every group whatever its own interval."""
    file_step = format_duration(interval_s)
    lines = ["vmalert stores a recording rule's result after its group's evaluation: an alert reading a record",
             "of its own group sees it one evaluation later per level of that chain. This file's times are the",
             f"promtool file's plus that many evaluations at its evaluation_interval ({file_step}: vmalert-tool evaluates",
             "every group at it, whatever the group's own interval); series of Unix timestamps",
             f"(*{TIMESTAMP_SUFFIX}) start at vmalert-tool's epoch, 2000-01-01 (+{VMALERT_TOOL_EPOCH_S} s), not 1970.",
             "Lag per alert on a deployed vmalert (evaluations x its group's interval):"]
    every = {g["name"]: parse_duration(g["interval"]) if g.get("interval") else interval_s for g in groups}
    for alert, per in sorted(alert_lags(groups).items()):
        for group_name, levels in sorted(per.items()):
            step = every[group_name]
            lines.append(f"  {alert} ({group_name}): {levels} x {format_duration(step)} = "
                         f"{format_duration(levels * step) if levels else '0s'}")
    return "".join(f"# {line}\n" for line in lines)
