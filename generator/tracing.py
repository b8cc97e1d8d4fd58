"""What feeds each dashboard panel and variable: its query traced down to the exporters.

A panel that reads a record nobody's series reach stays empty, and Grafana says only "No data".
:class:`Tracer` follows a PromQL expression through the recording rules that make its records
(:func:`.render_rules.render_rules`) down to the raw metrics, and asks :func:`.producers.producers`
who publishes each for this spec: the exporters its sources name, what ``k8s/`` deploys
(``kubernetes.collectors.run``), the engines' PodMonitor (``kubernetes.engines``). Besides whether
a series exists at all it follows the labels the series carry (:attr:`.producers.Producer.labels`),
because a join matches only where both sides carry the same labels: energy per token divides
GPU power per ``(cluster, host_name)`` by the engines' tokens per ``(cluster, host_name)``, which
the engines' series carry only when a monitor adds them.

The abstract value (:class:`Trace`) of an expression is whether it has series (``fed``), the
labels they carry for sure, and when unfed, why and how to fix it. PromQL's operators:

* a selector: its records' rules (any of them fed: fed; ``labels:`` of a rule added), else the raw
  metric's producer (its labels; a histogram's ``_bucket`` series ``le`` too);
* ``a or b``: fed when either is, carrying what both carry; ``a unless b``: ``a``;
* ``a OP b`` (arithmetic, comparison, ``and``) between two vectors: fed when both are and their
  series can match -- every label matched on (``on (...)``, else all of them but ``ignoring``'s)
  carried by both sides or by neither; with a scalar side: the vector side;
* ``sum by (L)`` and the other aggregations keep ``L`` (``without (L)``: all but ``L``; ``topk``
  and ``bottomk`` all), ``label_replace``/``label_join`` add their target label where a source
  label is carried (or the regex matches the empty string), ``histogram_quantile`` drops ``le``;
  other functions pass their vector argument through.

:func:`trace_dashboards` applies it to every panel query and template variable of the rendered
dashboards; :func:`empty_panel_warnings` is what ``fusebox generate`` prints for those that stay
empty (docs/dashboards.md, "Panels that stay empty").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fusebox.spec import Spec

from .producers import Producer, how_to_publish, producers

_SCALAR = "scalar"
# Functions whose first vector argument passes through with its labels (rate, deriv, clamp_min ...):
# every function not handled by name below.
_LABEL_VALUES = re.compile(r"^label_values\((.*), *(\w+)\)$", re.S)


@dataclass(frozen=True)
class Trace:
    """The abstract value of an expression: ``fed`` (it has series), the ``labels`` they carry (when
    fed), and when not fed ``why`` (a sentence) and ``fix`` (what to do). ``src``: the record or
    metric the expression is named after, for messages. ``lacks``: label -> how to get it, for the
    labels the producers underneath lack (carried up for a join's message)."""

    fed: bool
    labels: frozenset[str] = frozenset()
    why: str = ""
    fix: str = ""
    src: str = ""
    lacks: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    scalar: bool = False


def _unfed(why: str, fix: str, src: str = "") -> Trace:
    return Trace(False, why=why, fix=fix, src=src)


class Tracer:
    """Traces expressions for one spec and its rule ``groups`` (a Prometheus rule file's groups)."""

    def __init__(self, spec: Spec, groups: list[dict[str, Any]]):
        self.spec = spec
        self.producers: list[Producer] = producers(spec)
        self.rules: dict[str, list[dict[str, Any]]] = {}
        for g in groups:
            for r in g["rules"]:
                if "record" in r:
                    self.rules.setdefault(r["record"], []).append(r)
        self._memo: dict[str, Trace] = {}

    # -- entry points ------------------------------------------------------------------------
    def expr(self, text: str) -> Trace:
        """The trace of a panel's or variable's PromQL expression (Grafana's ``$variables`` read as ``.*``)."""
        return self._parse(re.sub(r"\$\{?(\w+)\}?", ".*", text))

    def _parse(self, text: str) -> Trace:
        import promql_parser

        return self._node(promql_parser.parse(text))

    def metric(self, name: str) -> Trace:
        """A record's trace (through its rules), else the raw metric's (through its producer)."""
        if name in self._memo:
            return self._memo[name]
        self._memo[name] = _unfed(f"{name} is recorded from itself", "", name)  # a loop: never fed
        if name in self.rules:
            got = [self._rule(r) for r in self.rules[name]]
            fed = [t for t in got if t.fed]
            if fed:
                t = Trace(True, frozenset.intersection(*(t.labels for t in fed)), src=name,
                          lacks={k: v for t in fed for k, v in t.lacks.items()})
            else:
                t = Trace(False, why=got[0].why, fix=got[0].fix, src=name)
        else:
            p = next((p for p in self.producers if p.publishes(name)), None)
            if p is None:
                t = _unfed(f"nothing k8s/ deploys or the spec names publishes {name}", how_to_publish(name), name)
            else:
                labels = p.labels_of(name)
                t = Trace(True, labels, src=name, lacks={k: v for k, v in p.label_fixes.items() if k not in labels})
        self._memo[name] = t
        return t

    def _rule(self, rule: dict[str, Any]) -> Trace:
        t = self._parse(str(rule["expr"]))  # a rule's "$1" is label_replace's, not a variable
        if t.fed and rule.get("labels"):
            t = Trace(True, t.labels | set(rule["labels"]), src=t.src, lacks=t.lacks)
        return t

    # -- the AST ----------------------------------------------------------------------------
    def _node(self, node: Any) -> Trace:
        kind = type(node).__name__
        if kind in ("NumberLiteral", "StringLiteral"):
            return Trace(True, scalar=True, src=_SCALAR)
        if kind == "VectorSelector":
            return self.metric(node.name) if node.name else Trace(True)  # a bare {__name__=~...}: not judged
        if kind == "MatrixSelector":
            return self._node(node.vector_selector)
        if kind in ("ParenExpr", "UnaryExpr", "SubqueryExpr"):
            return self._node(node.expr)
        if kind == "AggregateExpr":
            return self._aggregate(node)
        if kind == "Call":
            return self._call(node)
        if kind == "BinaryExpr":
            return self._binary(node)
        return Trace(True)  # anything else is not judged

    def _aggregate(self, node: Any) -> Trace:
        inner = self._node(node.expr)
        if not inner.fed:
            return inner
        op = str(node.op)
        mod = node.modifier
        if op in ("topk", "bottomk", "limitk", "limit_ratio"):
            labels = inner.labels
        elif mod is None:
            labels = frozenset()
        elif str(mod.type).endswith("Without"):
            labels = inner.labels - set(mod.labels)
        else:
            labels = inner.labels & set(mod.labels)
        return Trace(True, labels, src=inner.src, lacks=inner.lacks)

    def _call(self, node: Any) -> Trace:
        name = node.func.name
        args = list(node.args or [])
        if name in ("absent", "absent_over_time", "vector", "time", "scalar", "pi"):
            return Trace(True, src=name)
        vectors = [self._node(a) for a in args if type(a).__name__ not in ("NumberLiteral", "StringLiteral")]
        if not vectors:
            return Trace(True, scalar=True, src=_SCALAR)
        inner = vectors[0]
        if not inner.fed:
            return inner
        labels = inner.labels
        strings = [a.val for a in args if type(a).__name__ == "StringLiteral"]
        if name == "label_replace" and len(strings) == 4:
            dst, repl, src, regex = strings
            if src in labels:
                labels = labels | {dst}
            else:  # the source label is empty: the regex decides
                m = re.fullmatch(regex, "")
                if m is not None:
                    value = re.sub(r"\$\{?(\w+)\}?", lambda g: (m.group(int(g.group(1))) or "") if g.group(1).isdigit() else "", repl)
                    labels = labels | {dst} if value else labels - {dst}
        elif name == "label_join" and strings:
            dst, _sep, *srcs = strings
            labels = labels | {dst} if set(srcs) & labels else labels - {dst}
        elif name == "histogram_quantile":
            labels = labels - {"le"}
        return Trace(True, labels, src=inner.src, lacks=inner.lacks)

    def _binary(self, node: Any) -> Trace:
        op = str(node.op)
        lhs, rhs = self._node(node.lhs), self._node(node.rhs)
        if op == "or":
            if lhs.fed and rhs.fed:
                return Trace(True, lhs.labels & rhs.labels, src=lhs.src, lacks={**rhs.lacks, **lhs.lacks})
            return lhs if lhs.fed else rhs if rhs.fed else lhs
        if op == "unless":
            return lhs
        for side in (lhs, rhs):
            if not side.fed:
                return side
        if lhs.scalar or rhs.scalar:
            return rhs if lhs.scalar else lhs
        matching = getattr(node.modifier, "matching", None) if node.modifier is not None else None
        both = lhs.labels | rhs.labels
        if matching is None:
            on = both
        elif str(matching.type).endswith("Include"):  # on (...)
            on = frozenset(matching.labels)
        else:  # ignoring (...)
            on = both - set(matching.labels)
        one_sided = sorted(label for label in on if (label in lhs.labels) != (label in rhs.labels))
        if one_sided:
            short = rhs if all(label in lhs.labels for label in one_sided) else lhs
            other = lhs if short is rhs else rhs
            fixes = sorted({short.lacks[label] for label in one_sided if label in short.lacks})
            return _unfed(f"it joins {other.src} with {short.src} on {', '.join(one_sided)}, which {short.src} does not carry",
                          "; ".join(fixes) or f"make {short.src} carry {', '.join(one_sided)}", other.src)
        labels = lhs.labels
        group = getattr(node.modifier, "card", None)
        if group is not None and str(group).endswith("OneToMany"):
            labels = rhs.labels
        return Trace(True, labels, src=lhs.src, lacks={**rhs.lacks, **lhs.lacks})


# ------------------------------------------------------------------------- dashboards
@dataclass(frozen=True)
class Fed:
    """One panel or template variable of a rendered dashboard and what feeds it.

    ``what`` is ``panel`` or ``variable``; ``fed`` whether any of its queries has series (a
    variable: and they carry its label); ``why`` and ``fix`` when not. ``moot``: a variable that
    lists nothing because its series, though fed, carry no such label, and neither does any other
    record it could read (:func:`.render_dashboards.variable_queries` takes the first that does):
    ``cluster`` where only dcgm-exporter and the engines are read. It filters nothing away ('All'
    matches the empty label), so no panel loses data."""

    dashboard: str
    what: str
    title: str
    fed: bool
    why: str = ""
    fix: str = ""
    moot: bool = False


def variable_trace(tracer: Tracer, query: str) -> Trace:
    """A ``label_values(SELECTOR, LABEL)`` variable: fed when the selector is and its series carry LABEL."""
    m = _LABEL_VALUES.match(query)
    if m is None:
        return Trace(True)  # not a query variable fusebox writes
    selector, label = m.group(1), m.group(2)
    t = tracer.expr(selector)
    if t.fed and label not in t.labels:
        return _unfed(f"its series ({t.src}) carry no {label} label", t.lacks.get(label, ""), t.src)
    return t


def trace_dashboards(spec: Spec, boards: dict[str, dict], groups: list[dict[str, Any]]) -> list[Fed]:
    """Every panel and query variable of ``boards`` (rendered dashboards by name) with what feeds it.

    A panel is fed when one of its queries is (a panel of two queries, one per engine kind, is fed
    by either). Variables are the same on every dashboard: listed once, under the first."""
    tracer = Tracer(spec, groups)
    out: list[Fed] = []
    seen_vars: set[str] = set()
    for name, d in boards.items():
        for v in d.get("templating", {}).get("list", []):
            if v.get("type") != "query" or v["name"] in seen_vars:
                continue
            seen_vars.add(v["name"])
            t = variable_trace(tracer, str(v["query"]))
            m = _LABEL_VALUES.match(str(v["query"]))
            moot = not t.fed and m is not None and tracer.expr(m.group(1)).fed
            out.append(Fed(name, "variable", v["name"], t.fed, t.why, t.fix, moot))
        for p in d["panels"]:
            traces = [tracer.expr(t["expr"]) for t in p.get("targets", [])]
            first = next((t for t in traces if t.fed), traces[0] if traces else Trace(True))
            out.append(Fed(name, "panel", p["title"], first.fed, first.why, first.fix))
    return out


def empty_panel_warnings(feds: Iterable[Fed]) -> list[str]:
    """One line per panel that stays empty and per variable that lists nothing (but a moot one:
    :class:`Fed`), with why and the fix."""
    out = []
    for f in feds:
        if f.fed or f.moot:
            continue
        where = f"dashboards/fusebox-{f.dashboard}.json"
        if f.what == "panel":
            head = f"panel {f.title!r} ({where}) stays empty"
        else:
            head = f"dashboard variable ${f.title} lists no value (every dashboard; 'All' still shows every series)"
        out.append(f"{head}: {f.why}" + (f" -- {f.fix}" if f.fix else ""))
    return out
