"""`fusebox budget`: for every tier that requests a fuse, how long after its signal crosses the
threshold the fuse can act (the detection floor), against how long the resource has left at that
threshold (docs/budget.md has each term and where its number comes from).

Floor terms, seconds, all read from the spec or from what the generator renders:

* ``scrape``: ``global.scrape_interval`` (the sample showing the crossing is up to one scrape late);
* ``eval``: the ``interval`` of the rendered rule group holding the tier's alerting rule (else
  ``global.evaluation_interval``);
* ``records``: how stale the records the alert reads from *other* groups can be, one of their
  group's intervals per cross-group hop on the worst path (:func:`cross_group_s`; 0 when the
  alert's records are all in its own group, as the generator renders them today);
* ``for``: the tier's ``for`` rounded up to a whole number of ``eval`` intervals
  (:func:`fusebox.promsim.for_elapsed`): a pending alert fires at an evaluation, so ``for: 15s``
  in a group evaluated every 30 s fires 30 s after it went pending (``Row.for_spec_s`` keeps the
  spec's own ``for``, and the output names the rounding);
* ``lag``: on ``global.rule_engine: victoriametrics``, one group interval per same-group record the
  alert reads through (:func:`.render_vmalert_tests.alert_lags`); 0 on the other engines;
* ``group_wait``: the ``group_wait`` of the rendered Alertmanager route that takes the alert to the
  fuse (``fuse.group_wait_critical``: that route matches ``fuse_action``, whatever the severity);
* ``fuse``: :data:`FUSE_DECISION_S`, the fuse's measured decision time;
* ``adapter``: the longest ``timeout`` of the spec adapters applying the tier's action, else the
  fuse's default ``--timeout`` (:data:`fusebox.conventions.FUSE_CALL_TIMEOUT_S`).

Time left at the threshold, by kind: ``time_to_full`` its threshold; a byte growth (``deriv`` in
bytes per second) the KV pool's free bytes at ``budget.kv_fill`` over the threshold; ``gpu_memory``
the headroom from the threshold to full on ``budget.gpu_memory`` bytes at ``budget.gpu_growth``;
anything else (a latency, a gauge) exhausts no resource at a known rate: "n/a".

With a ``scaling:`` section, the third speed: for every workload, how long after its load crosses
a set point (a driving signal's safe level) a new replica is Ready (:class:`ScalingRow`), against
the time the KV pool has left then: its free part at ``budget.kv_fill`` filling at the critical
growth rate (the lowest critical threshold of the byte-growth signals, as the fuse rows' growth).
Terms: ``scrape``; ``eval``, the interval of the group holding the workload's load record;
``records``, the staleness of the load records it reads from other groups (:func:`cross_group_s`);
``lag``, on vmalert, one group interval per level of the load's same-group chain;
``sync``, the HPA controller's sync period; ``stabilization``, the scale-up stabilization window; ``pod_start``, the workload's.
KEDA's ``pollingInterval`` is no term: above zero replicas the HPA's query reaches KEDA's
Prometheus trigger live (KEDA's scale_handler.go; a trigger's ``useCachedMetrics`` is off), and the
spec refuses ``replicas.min: 0``, the one case where KEDA's polling loop (activation from zero)
would be on the path (fusebox.spec.scaling); plain HPAs have no polling.
A scale-out that cannot finish before the pool is full fails ``fusebox budget``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

from fusebox import conventions as C
from fusebox import promsim
from fusebox.signal_kinds import kind_of
from fusebox.signal_kinds.base import gigabytes
from fusebox.spec import Signal, Spec, Tier
from fusebox.spec.promql import vector_selectors
from fusebox.spec.units import format_number, humanize, parse_duration

from .deadselectors import matcher_accepts
from .render_alertmanager import routing
from .render_rules import STATIC_GROUP, render_rules
from .render_scaling import load_expr
from .render_vmalert_tests import alert_lags, record_lags

__all__ = ["FUSE_DECISION_S", "Row", "ScalingRow", "budget_rows", "scaling_rows", "cross_group_s", "late_scaling_text", "run_budget"]

# The fuse's decision time: notification received -> gateway call made, p99, the worst of the four
# store runs `python bench/bench_fuse.py` measured (docs/fuse.md, "Benchmarks": PostgreSQL, two
# replicas, run 2: 103.7 ms), rounded up to the millisecond.
FUSE_DECISION_S = 0.104


@dataclass
class Row:
    """One fuse tier: its floor (``terms`` sum to ``floor_s``), the time left (None: n/a, ``basis``
    says why), ``margin_s`` = time left - floor, ``ok`` False when the fuse acts after full."""

    signal: str
    alert: str
    tier: str
    severity: str
    fuse: str
    fuse_level: int
    group: str
    terms: dict[str, float]
    floor_s: float
    time_left_s: float | None
    basis: str
    margin_s: float | None = None
    ok: bool = True
    threshold: str = ""
    direction: str = "above"  # the signal's: which way "earlier" moves its threshold
    for_spec_s: float = 0.0  # the tier's ``for`` as the spec says it; ``terms["for"]`` is it rounded up to the group's interval

    @property
    def for_rounded(self) -> bool:
        """Whether the tier's ``for`` is not a whole number of its group's evaluation intervals
        (``terms["for"]`` is then longer than the spec's)."""
        return self.terms["for"] != self.for_spec_s


@dataclass
class ScalingRow:
    """One scaled workload: its scale-out path (``terms`` sum to ``path_s``), the KV pool's time
    left at the critical growth (None: n/a, ``basis`` says why), ``margin_s`` = time left - path,
    ``ok`` False when the new replica is Ready only after the pool is full."""

    workload: str
    group: str  # the rule group holding the workload's load record
    terms: dict[str, float]
    path_s: float
    time_left_s: float | None
    basis: str

    @property
    def margin_s(self) -> float | None:
        return None if self.time_left_s is None else round(self.time_left_s - self.path_s, 6)

    @property
    def ok(self) -> bool:
        return self.time_left_s is None or self.path_s <= self.time_left_s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "margin_s": self.margin_s, "ok": self.ok}


def scaling_rows(spec: Spec) -> list[ScalingRow]:
    """One :class:`ScalingRow` per ``scaling`` workload ([] without the section)."""
    if spec.scaling is None:
        return []
    s = spec.scaling
    groups = render_rules(spec).groups
    growth = _kv_growth(spec)
    free = spec.budget.kv_pool_bytes * (1 - spec.budget.kv_fill)
    if growth:
        left: float | None = free / growth
        basis = (f"KV pool {gigabytes(spec.budget.kv_pool_bytes)} at {format_number(spec.budget.kv_fill * 100)}% full: "
                 f"{gigabytes(free)} free / {humanize(growth, 'bytes_per_second')} (the critical growth)")
    else:
        left, basis = None, "n/a: no byte-growth signal gives a critical growth rate"
    # vmalert stores a record one evaluation late per level of its same-group chain (the load reads the
    # signal loads, which read the values): the deepest load record's, in its group's intervals
    lag_levels = record_lags(groups).get(C.SCALING_LOAD, 0) if spec.rule_engine == "victoriametrics" else 0
    rows = []
    for w in s.workloads:
        expr = load_expr(w)
        g = next((g for g in groups for r in g["rules"] if r.get("record") == C.SCALING_LOAD and r["expr"] == expr), None)
        if g is None:  # no driving signal recorded (each left out of the rules): nothing scales it
            continue
        interval = parse_duration(g["interval"]) if g.get("interval") else spec.evaluation_interval_s
        terms = {
            "scrape": spec.scrape_interval_s,
            "eval": interval,
            "records": cross_group_s(groups, g["name"], expr, spec.evaluation_interval_s),
            "lag": lag_levels * interval,
            "sync": s.sync_period_s,
            "stabilization": s.scale_up_stabilization_s,
            "pod_start": w.pod_start_s,
        }
        rows.append(ScalingRow(w.name, g["name"], terms, round(sum(terms.values()), 6), None if left is None else round(left, 6), basis))
    return rows


def _alert_group(groups: list[dict[str, Any]], sig: Signal, tier: Tier) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rendered group holding the tier's alerting rule (alert name, severity and action match), and the rule."""
    for g in groups:
        for r in g["rules"]:
            labels = r.get("labels") or {}
            if (r.get("alert") == sig.alert and labels.get(C.LABEL["severity"]) == tier.severity
                    and labels.get(C.LABEL["fuse_action"]) == tier.fuse):
                return g, r
    raise LookupError(f"no rendered rule for {sig.alert} {tier.name}")  # the renderer makes one per tier


def _selected(sel: Any, labels: dict[str, str]) -> bool:
    """Whether the vector selector ``sel`` can select the series a recording rule with these static
    ``labels`` writes: every matcher on a label the rule sets accepts its value (a label the rule's
    expression carries through is not known here: it may match)."""
    groups = [sel.matchers.matchers] + list(sel.matchers.or_matchers or [])
    return any(all(matcher_accepts(m, labels[m.name]) for m in g if m.name in labels) for g in groups if g) or not any(groups)


def cross_group_s(groups: list[dict[str, Any]], group: str, expr: str, default_interval: float) -> float:
    """How stale the records ``expr`` reads can be, seconds: each record recorded in another group
    than ``group`` may be up to one of that group's intervals old when read, and so on down its
    chain (the worst path). 0 when every record read is of ``group`` itself, or none is read;
    records of the static-inputs group (``STATIC_GROUP``) count 0: their value does not change.
    A record name recorded by several rules (``fusebox:scaling_signal_load:ratio``, one per workload
    and signal, in each signal's group) is read only from the rules whose static labels the
    selector's matchers accept (``{workload="llava-7b"}`` reads llava-7b's rules, not another
    workload's in a slower group).

    Raises:
        ValueError: a rule's expression does not parse, or records read each other in a cycle."""
    owner: dict[str, list[tuple[str, float, str, dict[str, str]]]] = {}
    for g in groups:
        interval = parse_duration(g["interval"]) if g.get("interval") else default_interval
        for r in g["rules"]:
            if "record" in r:
                owner.setdefault(r["record"], []).append((g["name"], interval, r["expr"], r.get("labels") or {}))
    total = sum(len(v) for v in owner.values())
    memo: dict[tuple[str, str], float] = {}

    def stale(where: str, text: str, depth: int) -> float:
        if (where, text) in memo:
            return memo[(where, text)]
        if depth > total:  # a cycle: the renderer never makes one (rule_engines.chain_depths refuses it)
            raise ValueError(f"recording rules read each other in a cycle in group {where}")
        worst = 0.0
        for sel in vector_selectors(text):
            for g, interval, rexpr, labels in owner.get(sel.name or "", ()):
                if g == STATIC_GROUP or not _selected(sel, labels):  # a value that does not change (a GPU's memory size)
                    continue
                worst = max(worst, (interval if g != where else 0.0) + stale(g, rexpr, depth + 1))
        memo[(where, text)] = worst
        return worst

    return stale(group, expr, 0)


def _kv_growth(spec: Spec) -> float | None:
    """The lowest critical threshold of the byte-growth signals (bytes per second: their kind's
    :meth:`~fusebox.signal_kinds.base.Kind.grows_pool_bytes`), or None."""
    rates = [t.threshold for s in spec.signals if kind_of(s).grows_pool_bytes(s)
             for t in s.tiers if t.name == "critical"]
    return min(rates) if rates else None


def _time_left(spec: Spec, sig: Signal, tier: Tier) -> tuple[float | None, str]:
    """The signal's kind works it out (:meth:`~fusebox.signal_kinds.base.Kind.time_left`)."""
    return kind_of(sig).time_left(sig, tier, spec.budget, spec.budget.gpu_growth_bps or _kv_growth(spec))


def budget_rows(spec: Spec) -> list[Row]:
    """One :class:`Row` per enabled tier with a ``fuse``, in spec order."""
    groups = render_rules(spec).groups
    lags = alert_lags(groups) if spec.rule_engine == "victoriametrics" else {}
    group_wait = parse_duration(routing(spec).group_wait_critical)
    rows = []
    for sig in spec.signals:
        for tier in sig.tiers:
            if not tier.fuse:
                continue
            g, rule = _alert_group(groups, sig, tier)
            interval = parse_duration(g["interval"]) if g.get("interval") else spec.evaluation_interval_s
            timeouts = [a.timeout_s for a in spec.adapters if tier.fuse in a.actions]
            terms = {
                "scrape": spec.scrape_interval_s,
                "eval": interval,
                "records": cross_group_s(groups, g["name"], rule["expr"], spec.evaluation_interval_s),
                "for": promsim.for_elapsed(tier.for_s, interval),
                "lag": lags.get(sig.alert, {}).get(g["name"], 0) * interval,
                "group_wait": group_wait,
                "fuse": FUSE_DECISION_S,
                "adapter": max(timeouts) if timeouts else C.FUSE_CALL_TIMEOUT_S,
            }
            floor = round(sum(terms.values()), 6)
            left, basis = _time_left(spec, sig, tier)
            row = Row(sig.name, sig.alert, tier.name, tier.severity, tier.fuse, tier.fuse_level, g["name"], terms, floor,
                      left if left is None else round(left, 6), basis, threshold=tier.threshold_text,
                      direction=sig.direction, for_spec_s=tier.for_s)
            if left is not None:
                row.margin_s = round(left - floor, 6)
                row.ok = floor <= left
            rows.append(row)
    return rows


def _s(x: float) -> str:
    return f"{x:.3f}".rstrip("0").rstrip(".") + " s"


def _terms_text(r: Row) -> str:
    return " + ".join(f"{format_number(v)} {k}" + (f" ({_for_note(r)})" if k == "for" and r.for_rounded else "")
                      for k, v in r.terms.items())


def _for_note(r: Row) -> str:
    """"for: 15s rounded up to 2 x 15 s evaluations"-style: why the ``for`` term is not the spec's."""
    n = round(r.terms["for"] / r.terms["eval"]) if r.terms["eval"] else 0
    return f"for: {format_number(r.for_spec_s)}s in the spec, rounded up to {n} evaluation{'s' if n != 1 else ''} of {format_number(r.terms['eval'])} s"


def _scaling_terms(r: ScalingRow) -> str:
    return " + ".join(f"{format_number(v)} {k}" for k, v in r.terms.items())


def _print_table(spec: Spec, rows: list[Row], scaling: list[ScalingRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"fusebox budget: {spec.name} ({spec.rule_engine})", show_lines=True)
    for col in ("tier", "floor (s)", "time left", "margin"):
        t.add_column(col)
    for r in rows:
        left = "n/a" if r.time_left_s is None else _s(r.time_left_s)
        margin = "" if r.margin_s is None else (_s(r.margin_s) if r.ok else f"LATE by {_s(-r.margin_s)}")
        t.add_row(f"{r.alert} {r.tier} {r.threshold}\n{r.fuse} (level {r.fuse_level})",
                  f"{_s(r.floor_s)} = {_terms_text(r)}", f"{left}\n{r.basis}", margin)
    for sr in scaling:
        left = "n/a" if sr.time_left_s is None else _s(sr.time_left_s)
        margin = "" if sr.margin_s is None else (_s(sr.margin_s) if sr.ok else f"LATE by {_s(-sr.margin_s)}")
        t.add_row(f"scale-out {sr.workload}\n(a replica Ready)", f"{_s(sr.path_s)} = {_scaling_terms(sr)}",
                  f"{left}\n{sr.basis}", margin)
    Console(width=160).print(t)


def run_budget(spec: Spec, *, as_json: bool = False, summary: bool = False) -> int:
    """Print the budget of ``spec`` (the table, ``as_json`` one JSON document, ``summary`` one
    line); 0 when every fuse acts before its resource is full and every ``scaling`` workload's new
    replica is Ready before the KV pool is, else 1 (each late tier or workload named on standard
    error with both numbers)."""
    rows = budget_rows(spec)
    late = [r for r in rows if not r.ok]
    scaling = scaling_rows(spec)
    late_scaling = [r for r in scaling if not r.ok]
    if summary:
        timed = [r for r in rows if r.margin_s is not None]
        tight = min(timed, key=lambda r: r.margin_s or 0.0, default=None)
        print(f"{'ok  ' if not (late or late_scaling) else 'FAIL'} fusebox budget: {len(rows)} fuse tier(s), {len(timed) - len(late)} in time, "
              f"{len(late)} late, {len(rows) - len(timed)} n/a"
              + (f"; tightest {tight.alert} {tight.tier}: {_s(tight.floor_s)} against {_s(tight.time_left_s or 0.0)}" if tight else "")
              + (f"; {rounded} tier(s)' for rounded up to their evaluation interval" if (rounded := sum(r.for_rounded for r in rows)) else "")
              + (f"; scale-out: {len(scaling)} workload(s), {len(late_scaling)} late" if scaling else ""))
    elif as_json:
        print(json.dumps({"spec": spec.name, "rule_engine": spec.rule_engine, "ok": not (late or late_scaling),
                          "fuse_decision_s": FUSE_DECISION_S, "tiers": [asdict(r) for r in rows],
                          "scaling": [r.as_dict() for r in scaling]}, indent=2))
    else:
        _print_table(spec, rows, scaling)
    for r in late:
        print(f"fusebox budget: {r.alert} {r.tier} ({r.fuse}) is late: the fuse acts {_s(r.floor_s)} after {r.signal} "
              f"crosses {r.threshold}, but the resource is full {_s(r.time_left_s or 0.0)} after "
              f"({_terms_text(r)}) -- lower the tier's `for` or {'raise' if r.direction == 'below' else 'lower'} its "
              f"threshold (so it fires earlier)"
              + (f"; a `for` under the {format_number(r.terms['eval'])} s evaluation interval still waits a whole one: "
                 "shorten global.evaluation_interval, or write for: 0s" if r.for_rounded else ""), file=sys.stderr)
    for sr in late_scaling:
        print(f"fusebox budget: {late_scaling_text(sr)}", file=sys.stderr)
    return 1 if late or late_scaling else 0


def late_scaling_text(sr: ScalingRow) -> str:
    """What ``fusebox budget`` (and ``fusebox generate``, as a warning) says of a late scale-out:
    both numbers, the path's terms, the fix."""
    return (f"scale-out of workload {sr.workload!r} is late: a new replica is Ready {_s(sr.path_s)} after its "
            f"load crosses a set point ({_scaling_terms(sr)}), but the KV pool is full {_s(sr.time_left_s or 0.0)} after "
            f"({sr.basis}) -- shorten pod_start (a cached image, a smaller model load), the HPA's sync period or "
            "scale-up stabilization, or scale on a lower safe level")
