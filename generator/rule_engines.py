"""Rule groups shaped for the engine that evaluates them (pure: data in, data out; no I/O).

* Every engine: a group over :data:`MAX_RULES_PER_GROUP` rules is split into numbered groups
  (``fusebox-absent-1``, ``fusebox-absent-2``, ...), never separating a recording rule from a
  rule that reads it, directly or through another record (:func:`split_groups`). Grafana Mimir's
  ruler refuses a bigger group by default; Prometheus and vmalert do not mind the split.
* ``thanos``: every group gets ``partial_response_strategy: abort`` (:data:`THANOS_STRATEGY`):
  Thanos Ruler evaluates against a query API that may answer with data from only some stores, and
  an alert must fail rather than judge a partial answer. promtool refuses that key, so the
  promtool checks run on a copy without it (:func:`promtool_text`).
* ``victoriametrics``: vmalert writes a recording rule's result asynchronously, so a rule reading
  a record of its own group sees the previous evaluation's value: one interval of lag per level of
  same-group chain (:func:`chain_depths`). The generated vmalert-tool tests shift their times by it.

Sources of the numbers:

* 20 rules per group, 70 groups per tenant: Grafana Mimir's defaults of
  ``-ruler.max-rules-per-rule-group`` and ``-ruler.max-rule-groups-per-tenant``
  (https://grafana.com/docs/mimir/latest/configure/configuration-parameters/, block ``limits``;
  registered in pkg/util/validation/limits.go).
* ``partial_response_strategy`` (``warn`` or ``abort``): Thanos Ruler's rule-group field
  (https://thanos.io/tip/components/rule.md/, "Partial Response"); the Prometheus Operator's
  PrometheusRule CRD carries it as ``spec.groups[].partial_response_strategy``.
* vmalert's chaining lag: https://docs.victoriametrics.com/vmalert/ ("chaining" of rules in one
  group: "persistence of execution results to remote storage is asynchronous").
"""

from __future__ import annotations

from typing import Any

import yaml

from fusebox.spec.promql import metrics_in_expr

from .yamlout import dump_yaml

__all__ = ["MAX_RULES_PER_GROUP", "MAX_GROUPS_PER_TENANT", "THANOS_STRATEGY", "STRATEGY_KEY", "shape_groups",
           "split_groups", "chains", "chain_depths", "records_read", "promtool_text", "ChainTooLong"]

MAX_RULES_PER_GROUP = 20  # Mimir: -ruler.max-rules-per-rule-group (limits.ruler_max_rules_per_rule_group), default 20
MAX_GROUPS_PER_TENANT = 70  # Mimir: -ruler.max-rule-groups-per-tenant (limits.ruler_max_rule_groups_per_tenant), default 70
STRATEGY_KEY = "partial_response_strategy"
THANOS_STRATEGY = "abort"


class ChainTooLong(ValueError):
    """One recording chain (a record and every rule reading it, transitively) holds more rules
    than a group may: no split keeps it whole."""


def records_read(expr: str, defined: set[str]) -> set[str]:
    """The names among ``defined`` (record names) that the PromQL ``expr`` selects.

    Raises:
        ValueError: ``expr`` does not parse (promql-parser's message).
    """
    return set(metrics_in_expr(expr)) & defined


def _reads(rules: list[dict[str, Any]]) -> list[set[int]]:
    """For each rule, the indices of the rules of the same list that record what it reads."""
    by_name: dict[str, list[int]] = {}
    for i, r in enumerate(rules):
        if "record" in r:
            by_name.setdefault(r["record"], []).append(i)
    out = []
    for r in rules:
        names = records_read(r["expr"], set(by_name))
        out.append({j for n in names for j in by_name[n]})
    return out


def chains(rules: list[dict[str, Any]]) -> list[list[int]]:
    """The rules' indices grouped into chains: a record, every rule that reads it and, through
    them, everything connected (two rules recording the same name are one node). Each chain is
    sorted; chains are ordered by their first rule."""
    parent = list(range(len(rules)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, deps in enumerate(_reads(rules)):
        for j in deps:
            parent[find(i)] = find(j)
    comps: dict[int, list[int]] = {}
    for i in range(len(rules)):
        comps.setdefault(find(i), []).append(i)
    return sorted(comps.values(), key=lambda c: c[0])


def chain_depths(rules: list[dict[str, Any]]) -> list[int]:
    """Per rule, how many same-group records lie between it and the raw series: 0 for a rule
    reading raw series (or other groups' records) only, else 1 + the deepest record it reads.

    On vmalert that is the rule's lag in evaluation intervals: a record's result is stored after
    the group's evaluation, so a reader in the same group sees it one evaluation later, at every
    level of the chain. Prometheus sees a record of its own group at once when it comes first.

    Raises:
        ValueError: the records read each other in a cycle.
    """
    reads = _reads(rules)
    memo: dict[int, int] = {}

    def depth(i: int, seen: frozenset[int]) -> int:
        if i in memo:
            return memo[i]
        if i in seen:
            raise ValueError(f"recording rules read each other in a cycle ({rules[i].get('record')})")
        d = max((1 + depth(j, seen | {i}) for j in reads[i] if j != i), default=0)
        memo[i] = d
        return d

    return [depth(i, frozenset()) for i in range(len(rules))]


def _split(group: dict[str, Any], max_rules: int) -> list[dict[str, Any]]:
    rules = group["rules"]
    if len(rules) <= max_rules:
        return [group]
    bins: list[list[int]] = []
    # a group without records (the absent alerts) has no chain: nothing to parse
    for c in chains(rules) if any("record" in r for r in rules) else [[i] for i in range(len(rules))]:
        if len(c) > max_rules:
            first = rules[c[0]].get("record") or rules[c[0]].get("alert")
            raise ChainTooLong(f"rule group {group['name']}: the chain from {first} holds {len(c)} rules, over "
                               f"{max_rules} per group (Grafana Mimir's default -ruler.max-rules-per-rule-group); "
                               "raise the limit or split the signal")
        if bins and len(bins[-1]) + len(c) <= max_rules:
            bins[-1] += c
        else:
            bins.append(list(c))
    out = []
    for n, b in enumerate(bins, 1):
        g = {k: v for k, v in group.items() if k != "rules"}
        g["name"] = f"{group['name']}-{n}"
        g["rules"] = [rules[i] for i in sorted(b)]  # in the group's order: records before their readers
        out.append(g)
    return out


def split_groups(groups: list[dict[str, Any]], max_rules: int = MAX_RULES_PER_GROUP) -> list[dict[str, Any]]:
    """``groups`` with each group over ``max_rules`` rules split into ``NAME-1``, ``NAME-2``, ...
    (other keys kept), each at most ``max_rules`` rules, each chain (:func:`chains`) whole in one
    of them, rules in their original order. Groups within the limit are returned unchanged.

    Raises:
        ChainTooLong: one chain alone is over ``max_rules``.
    """
    return [g for group in groups for g in _split(group, max_rules)]


def shape_groups(groups: list[dict[str, Any]], engine: str) -> list[dict[str, Any]]:
    """The rule groups for ``engine`` (``global.rule_engine``): split to Mimir's limit for every
    engine, and, for ``thanos``, ``partial_response_strategy: abort`` after each group's interval."""
    out = split_groups(groups)
    if engine == "thanos":
        shaped = []
        for g in out:
            h: dict[str, Any] = {}
            for k, v in g.items():
                if k == "rules":
                    h[STRATEGY_KEY] = THANOS_STRATEGY
                h[k] = v
            shaped.append(h)
        out = shaped
    return out


def promtool_text(rule_file_text: str) -> str | None:
    """The rule file without Thanos' ``partial_response_strategy`` (promtool refuses the key),
    or None when it holds none (use the file as it is).

    Raises:
        yaml.YAMLError: the text is not YAML.
    """
    doc = yaml.safe_load(rule_file_text)
    groups = doc.get("groups") if isinstance(doc, dict) else None
    if not groups or not any(isinstance(g, dict) and STRATEGY_KEY in g for g in groups):
        return None
    for g in groups:
        if isinstance(g, dict):
            g.pop(STRATEGY_KEY, None)
    return dump_yaml(doc)
