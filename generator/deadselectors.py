"""Dead selectors: rule selectors that match no series in /metrics captures.

``fusebox check --rules FILE... --against CAPTURE...`` (and ``fusebox check --against`` on the
generated rules). promtool passes a rule that reads a metric no exporter writes; such a rule can
never fire. vLLM's own published PrometheusRule has two: ``rate(vllm:num_preemptions[5m])``
(the counter is ``vllm:num_preemptions_total``) and ``..._bucket{le="120"}`` (vLLM writes
``le="120.0"``, and Prometheus compares label values as strings).

Inputs:

* rule files: a Prometheus rule file (``groups:``) or a Prometheus Operator ``PrometheusRule``
  (``apiVersion: monitoring.coreos.com/v1``, ``spec.groups``), one YAML document each;
* captures: Prometheus text-format ``/metrics`` dumps (prometheus-client's parser).

A selector is judged against the union of the captures' samples: its metric name (or
``__name__`` matchers), then every label matcher (``=``, ``!=``, ``=~``, ``!~``; regexes are
fully anchored as in Prometheus, with RE2's POSIX classes such as ``[[:digit:]]`` understood).
Left out, because no target's ``/metrics`` holds them:

* names recorded by a rule in the given files, and the series Prometheus makes itself
  (:data:`SYNTHETIC`: ``up``, ``scrape_*``, ``ALERTS``, ``ALERTS_FOR_STATE``);
* matchers on a label that none of the metric's captured samples carries: Prometheus adds
  such labels at scrape time (``job``, ``instance``, ``namespace``, ``pod`` from target
  relabelling), so a capture cannot tell; they are named as "not judged".
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from fusebox.spec.errors import SpecError, unreadable
from fusebox.spec.positions import Positions, read_text
from fusebox.spec.positions import load as load_yaml
from fusebox.spec.promql import vector_selectors

# Series Prometheus makes itself: never in a target's /metrics.
SYNTHETIC = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped",
                       "scrape_samples_post_metric_relabeling", "scrape_series_added", "ALERTS",
                       "ALERTS_FOR_STATE"})

_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}
# RE2 POSIX classes (valid only inside a bracket expression) -> Python's re
_POSIX = {"alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ",
          "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~",
          "punct": "!-/:-@\\[-`{-~", "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z", "word": "0-9A-Za-z_",
          "xdigit": "0-9A-Fa-f"}


class InputError(ValueError):
    """A rule file or capture that cannot be read; ``str()`` is ``FILE:LINE:COL: what -- fix``."""


@dataclass(frozen=True)
class Rule:
    """One rule of a rule file: where it is, its name (alert or record) and its expression."""

    file: str
    line: int  # 1-based line of the rule's `alert:`/`record:` key
    name: str
    record: bool  # a recording rule (its name is a series other rules may read)
    expr: str
    expr_lines: tuple[int, int]  # 1-based first and last line of the expr value in the file


@dataclass(frozen=True)
class Dead:
    """A selector of ``rule`` that matches no captured series, and why."""

    file: str
    line: int
    col: int
    rule: str
    selector: str
    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.rule}: {self.selector} matches no series: {self.why} -- {self.fix}"


@dataclass
class Captures:
    """Samples of /metrics captures, by sample name (``foo_bucket``, ``foo_total``): label sets."""

    files: list[str]
    series: dict[str, list[dict[str, str]]] = field(default_factory=dict)


@dataclass
class Report:
    dead: list[Dead]
    not_judged: set[str]  # label names matched by some selector and carried by no captured sample
    unused_allow: list[str]  # --allow-dead selectors that excused nothing
    unsupported: set[str] = field(default_factory=set)  # regex matchers in RE2 syntax Python's re lacks (not judged)


# ------------------------------------------------------------------------- reading
_DOC_START = re.compile(r"^---(\s|$)")


class _Shifted:
    """Positions of one document of a multi-document file, in the file's lines."""

    def __init__(self, pos: Positions, offset: int):
        self.pos, self.offset = pos, offset

    def at(self, path: tuple[Any, ...], *, key: bool = False) -> tuple[int, int]:
        line, col = self.pos.at(path, key=key)
        return line + self.offset, col


def _documents(text: str) -> list[tuple[int, str]]:
    """(line offset, text) of each YAML document of ``text`` (split at ``---`` lines); blank
    documents and documents of comments only are left out."""
    docs: list[tuple[int, list[str]]] = [(0, [])]
    for n, line in enumerate(text.splitlines(keepends=True)):
        if _DOC_START.match(line):
            docs.append((n, [line]))
        else:
            docs[-1][1].append(line)
    out = []
    for offset, lines in docs:
        body = "".join(lines)
        if any(ln.strip() and not ln.lstrip().startswith("#") and not _DOC_START.match(ln) for ln in lines):
            out.append((offset, body))
    return out


def _groups(doc: Any, pos: _Shifted, file: str) -> tuple[list[Any], tuple[Any, ...]] | None:
    """The rule groups of one document and their path, or None for a document that holds none."""
    if isinstance(doc, dict) and doc.get("kind") == "PrometheusRule":
        spec = doc.get("spec")
        if not isinstance(spec, dict) or not isinstance(spec.get("groups"), list):
            line, col = pos.at(("spec",))
            raise InputError(f"{file}:{line}:{col}: PrometheusRule without spec.groups -- "
                             "put the rule groups under spec.groups (monitoring.coreos.com/v1)")
        return spec["groups"], ("spec", "groups")
    if isinstance(doc, dict) and isinstance(doc.get("groups"), list):
        return doc["groups"], ("groups",)
    return None


def load_rules(path: str | Path) -> list[Rule]:
    """Every rule of a Prometheus rule file or PrometheusRule manifest, with its position. A file
    of several YAML documents (``---``, e.g. ``kustomize build`` output) is read document by
    document; documents without rule groups (other kinds) are skipped.

    Raises:
        InputError: unreadable file, YAML syntax error, no rule groups in any document, a rule
            without ``expr`` or without exactly one of ``alert`` / ``record``, an ``expr`` that is
            not PromQL.
    """
    file = str(path)
    try:
        text = read_text(path, file)
    except (OSError, UnicodeDecodeError) as e:
        raise InputError("fusebox check: " + unreadable(file, e, "check the path given to --rules" if isinstance(e, FileNotFoundError)
                                                        else "pass a readable Prometheus rule file (YAML)")) from None
    except SpecError as e:
        raise InputError("\n".join(str(p) for p in e.problems)) from None
    n_lines = len(text.splitlines())
    rules: list[Rule] = []
    found = False
    for offset, body in _documents(text):
        try:
            doc, raw_pos = load_yaml(body, file)
        except SpecError as e:
            helm = "; it looks like a Helm template: render it first (helm template ...)" if "{{" in text else ""
            raise InputError("\n".join(f"{p.path}:{p.line + offset}:{p.col}: {p.what} -- {p.fix}"
                                       for p in e.problems) + helm) from None
        pos = _Shifted(raw_pos, offset)
        got = _groups(doc, pos, file)
        if got is None:
            continue
        found = True
        rules.extend(_rules_of(got[0], got[1], pos, file, n_lines))
    if not found:
        raise InputError(f"{file}:1:1: no rule groups found -- pass a Prometheus rule file (top-level groups:) or a "
                         "PrometheusRule (apiVersion: monitoring.coreos.com/v1, spec.groups); render Helm templates first")
    return rules


def _rules_of(groups: list[Any], gpath: tuple[Any, ...], pos: _Shifted, file: str, n_lines: int) -> list[Rule]:
    rules: list[Rule] = []
    for gi, g in enumerate(groups):
        grules = g.get("rules") if isinstance(g, dict) else None
        if not isinstance(grules, list):
            line, col = pos.at((*gpath, gi))
            raise InputError(f"{file}:{line}:{col}: rule group without a rules: list -- "
                             "each group needs name: and rules: [...]")
        for ri, r in enumerate(grules):
            rpath = (*gpath, gi, "rules", ri)
            line, col = pos.at(rpath)
            kinds = [k for k in ("alert", "record") if isinstance(r, dict) and k in r]
            if len(kinds) != 1 or not isinstance(r.get("expr"), (str, int, float)):
                raise InputError(f"{file}:{line}:{col}: a rule needs exactly one of alert: or record:, and an expr: -- "
                                 "fix this rule")
            expr = str(r["expr"])
            eline, ecol = pos.at((*rpath, "expr"))
            try:
                vector_selectors(expr)
            except (ValueError, TypeError) as e:
                raise InputError(f"{file}:{eline}:{ecol}: {r[kinds[0]]}: expr is not valid PromQL ({e}) -- "
                                 "fix the expression (promtool check rules shows the same)") from None
            # a block scalar's text starts on the line after `expr: |`
            extent = (eline, min(eline + expr.count("\n") + 1, n_lines))
            rules.append(Rule(file, pos.at((*rpath, kinds[0]), key=True)[0], str(r[kinds[0]]), kinds[0] == "record",
                              expr, extent))
    return rules


def load_captures(paths: Iterable[str | Path]) -> Captures:
    """Samples of Prometheus text-format captures.

    Raises:
        InputError: a capture that cannot be read, or a line that is not exposition format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    caps = Captures([])
    for p in paths:
        file = str(p)
        try:
            text = Path(p).read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise InputError("fusebox check: " + unreadable(file, e, "check the path given to --against: a /metrics dump "
                                                            "(curl -s http://HOST:PORT/metrics > FILE)")) from None
        try:
            fams = list(text_string_to_metric_families(text))
        except Exception:  # noqa: BLE001 -- prometheus-client's parser raises several classes
            line, what = _bad_line(text)
            raise InputError(f"{file}:{line}:1: not Prometheus text exposition format ({what}) -- pass a /metrics "
                             "dump as the target serves it (curl -s http://HOST:PORT/metrics > FILE)") from None
        caps.files.append(file)
        for fam in fams:
            for s in fam.samples:
                caps.series.setdefault(s.name, []).append(dict(s.labels))
    return caps


def _bad_line(text: str) -> tuple[int, str]:
    from prometheus_client.parser import text_string_to_metric_families

    for n, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                list(text_string_to_metric_families(line + "\n"))
            except Exception as e:  # noqa: BLE001
                return n, f"{type(e).__name__}: {e}"
    return 1, "unparsable"


# ------------------------------------------------------------------------- selectors
def _op(m: Any) -> str:
    return _OPS[str(m.op).rsplit(".", 1)[-1]]


def _quote(v: str) -> str:
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _matcher_text(m: Any) -> str:
    return f"{m.name}{_op(m)}{_quote(m.value)}"


def selector_text(sel: Any) -> str:
    """PromQL text of a vector selector: ``name{label="v",...}``, braces only when needed."""
    groups = [sel.matchers.matchers] + list(sel.matchers.or_matchers or [])
    shown = [[m for m in g if not (sel.name and m.name == "__name__")] for g in groups if g]
    inner = " or ".join(",".join(_matcher_text(m) for m in g) for g in shown if g)
    return f"{sel.name or ''}{{{inner}}}" if inner or not sel.name else sel.name


def selector_key(sel: Any) -> tuple[str, frozenset[tuple[str, str, str]]]:
    """Identity of a selector for ``--allow-dead``: the name and the set of matchers."""
    ms = [m for g in [sel.matchers.matchers] + list(sel.matchers.or_matchers or []) for m in g]
    return (sel.name or "", frozenset((m.name, _op(m), m.value) for m in ms if not (sel.name and m.name == "__name__")))


def parse_selector(text: str) -> Any:
    """A single vector selector (``--allow-dead``).

    Raises:
        ValueError: not PromQL, or not a bare selector.
    """
    import promql_parser

    try:
        node = promql_parser.parse(text)
    except ValueError as e:
        raise ValueError(f"{text!r} is not PromQL ({e})") from None
    if type(node).__name__ != "VectorSelector":
        raise ValueError(f"{text!r} is not one vector selector, e.g. 'vllm:num_preemptions' or 'foo_bucket{{le=\"120\"}}'")
    return node


@functools.cache
def prometheus_regex(pattern: str) -> re.Pattern[str]:
    """Python regex for a PromQL label regex: fully anchored like Prometheus (``^(?:re)$``),
    ``.`` matching newlines too (Prometheus 3), RE2's ``[[:class:]]`` and ``\\z`` translated.

    Raises:
        re.error: a pattern Python's re cannot compile.
    """
    p = re.sub(r"\[:(\w+):\]", lambda m: _POSIX.get(m.group(1), m.group(0)), pattern)
    p = p.replace("\\z", "\\Z")
    return re.compile(f"(?:{p})\\Z", re.DOTALL)


def _compiles(pattern: str) -> bool:
    try:
        prometheus_regex(pattern)
    except re.error:
        return False
    return True


def matcher_accepts(m: Any, value: str) -> bool:
    """Whether the label matcher ``m`` (promql-parser's; ``=``, ``!=``, ``=~``, ``!~``) accepts ``value``
    (an absent label is the empty value, as in Prometheus)."""
    op = _op(m)
    if op == "=":
        return value == m.value
    if op == "!=":
        return value != m.value
    hit = prometheus_regex(m.value).match(value) is not None
    return hit if op == "=~" else not hit


def _candidates(sel: Any, caps: Captures) -> list[str]:
    """Sample names the selector's name (or ``__name__`` matchers) accepts."""
    name_ms = [m for m in sel.matchers.matchers if m.name == "__name__"]
    if any(_op(m) in ("=~", "!~") and not _compiles(m.value) for m in name_ms):
        return list(caps.series)  # cannot judge the name: let the label matchers decide
    if sel.name:
        return [sel.name] if sel.name in caps.series else []
    return [n for n in caps.series if all(matcher_accepts(m, n) for m in name_ms)]


def _no_metric(name: str, caps: Captures) -> tuple[str, str]:
    names = caps.series
    if name + "_total" in names:
        return (f"no metric {name} in the captures, but {name}_total is there",
                f"read {name}_total (a counter's samples end in _total)")
    if name.endswith("_total") and name[:-6] in names:
        return (f"no metric {name} in the captures, but {name[:-6]} is there", f"read {name[:-6]}")
    for suffix in ("_bucket", "_count", "_sum"):
        if name + suffix in names:
            return (f"{name} is a histogram or summary: its samples are {name}_bucket, _count, _sum",
                    f"read {name}{suffix} (or the sample you meant)")
    close = difflib.get_close_matches(name, list(names), n=3, cutoff=0.8)
    if close:
        return (f"no metric {name} in the captures; close names: {', '.join(close)}", "correct the metric name")
    return (f"no metric {name} in the captures",
            "check the exporter's version and flags, or capture the target that writes it")


def _why(sel: Any, caps: Captures, not_judged: set[str], unsupported: set[str]) -> tuple[str, str] | None:
    """None when the selector matches a captured sample, else (why, how to fix)."""
    names = _candidates(sel, caps)
    if not names:
        if sel.name:
            return _no_metric(sel.name, caps)
        return ("no metric name in the captures matches the __name__ matchers", "correct the __name__ matchers")
    samples = [(n, labels) for n in names for labels in caps.series[n]]
    carried = {k for _, labels in samples for k in labels}
    groups = [sel.matchers.matchers] + list(sel.matchers.or_matchers or [])
    judged_groups = []
    for g in groups:
        judged = []
        for m in g:
            if m.name == "__name__":
                continue
            if m.name not in carried:
                not_judged.add(m.name)  # a target label, added at scrape time
                continue
            if _op(m) in ("=~", "!~") and not _compiles(m.value):
                unsupported.add(f"{m.name}{_op(m)}{_quote(m.value)}")
                continue
            judged.append(m)
        judged_groups.append(judged)
    if any(all(matcher_accepts(m, labels.get(m.name, "")) for m in g) for _, labels in samples for g in judged_groups):
        return None
    label = " and ".join(sorted(set(names)))[:200]
    for m in judged_groups[0]:
        if not any(matcher_accepts(m, labels.get(m.name, "")) for _, labels in samples):
            return _excluded_by(m, label, samples)
    return (f"each of its matchers matches some sample of {label}, but no sample matches all of them",
            "compare the matchers with the captured label sets")


def _excluded_by(m: Any, label: str, samples: list[tuple[str, dict[str, str]]]) -> tuple[str, str]:
    values = sorted({labels.get(m.name, "") for _, labels in samples})
    what = f"{_matcher_text(m)} excludes all {len(samples)} samples of {label}"
    if _op(m) == "=":
        same = [v for v in values if _float(v) is not None and _float(v) == _float(m.value)]
        if same:
            return (f"{what}; the captures write {m.name}={_quote(same[0])} (label values compare as strings, "
                    f"{_quote(m.value)} != {_quote(same[0])})",
                    f"write {m.name}={_quote(same[0])}, or {m.name}=~{_quote(_both_spellings(m.value))} for either spelling")
    shown = ", ".join(_quote(v) for v in values[:6]) + (f", ... ({len(values)} values)" if len(values) > 6 else "")
    return f"{what}; values there: {shown}", f"correct the {m.name} matcher"


def _float(v: str) -> float | None:
    try:
        return float(v)
    except ValueError:
        return None


def _both_spellings(v: str) -> str:
    f = _float(v)
    if f is not None and f.is_integer():
        return re.escape(str(int(f))) + "(\\.0)?"
    return re.escape(v)


def _position(rule: Rule, sel: Any, lines: list[str]) -> tuple[int, int]:
    """Line and column of the selector in the rule file (its metric name's first occurrence
    within the expr, preferring one followed by its first matcher's value)."""
    needle = sel.name or "{"
    first_value = next((m.value for m in sel.matchers.matchers if m.name != "__name__"), None)
    found: tuple[int, int] | None = None
    for n in range(rule.expr_lines[0], min(rule.expr_lines[1], len(lines)) + 1):
        text = lines[n - 1]
        for mt in re.finditer(re.escape(needle), text):
            after = text[mt.end():]
            if first_value is None or first_value in after.split("}")[0]:
                return n, mt.start() + 1
            found = found or (n, mt.start() + 1)
    return found or (rule.expr_lines[0], 1)


# ------------------------------------------------------------------------- the check
def dead_selectors(rules: list[Rule], caps: Captures, allow: Iterable[str] = ()) -> Report:
    """Selectors of ``rules`` that match no sample of ``caps``, less those ``allow`` excuses.

    Raises:
        ValueError: an ``allow`` entry that is not one vector selector.
    """
    allowed = {selector_key(parse_selector(a)): a for a in allow}
    used: set[str] = set()
    recorded = {r.name for r in rules if r.record}
    not_judged: set[str] = set()
    unsupported: set[str] = set()
    dead: list[Dead] = []
    lines_of: dict[str, list[str]] = {}
    for r in rules:
        seen = set()
        for sel in vector_selectors(r.expr):
            if sel.name in recorded or sel.name in SYNTHETIC:
                continue
            text = selector_text(sel)
            if text in seen:
                continue
            seen.add(text)
            why = _why(sel, caps, not_judged, unsupported)
            if why is None:
                continue
            if selector_key(sel) in allowed:
                used.add(allowed[selector_key(sel)])
                continue
            if r.file not in lines_of:
                lines_of[r.file] = Path(r.file).read_text(encoding="utf-8").splitlines()
            line, col = _position(r, sel, lines_of[r.file])
            dead.append(Dead(r.file, line, col, r.name, text, *why))
    return Report(dead, not_judged, [a for a in allowed.values() if a not in used], unsupported)


def report(rep: Report, n_rules: int, n_captures: int, out: TextIO) -> None:
    """Print a :class:`Report`: one line per dead selector, then a summary."""
    for d in rep.dead:
        print(str(d), file=out)
    for a in rep.unused_allow:
        print(f"note: --allow-dead {a} excused nothing: it matches a series now, or no rule reads it -- drop it", file=out)
    if rep.not_judged:
        print(f"note: matchers on {', '.join(sorted(rep.not_judged))} not judged: no captured sample carries that label "
              "(Prometheus adds target labels such as job, instance, namespace, pod at scrape time)", file=out)
    if rep.unsupported:
        print(f"note: {', '.join(sorted(rep.unsupported))} not judged: RE2 syntax that Python's re lacks "
              "(such as \\pL); check them by hand", file=out)
    verdict = (f"{len(rep.dead)} dead selector(s): match no series" if rep.dead else "no dead selectors")
    print(f"{verdict} ({n_rules} rule(s) against {n_captures} capture(s))"
          + (" -- fix the rules, or excuse known ones with --allow-dead 'SELECTOR'" if rep.dead else ""), file=out)


def run(rule_files: list[str], captures: list[str], allow_dead: Iterable[str] = (), stream: TextIO | None = None,
        errors: TextIO | None = None) -> int:
    """``fusebox check --rules FILE... --against CAPTURE...``: no spec needed.

    Returns:
        0 no dead selector; 1 some (printed on ``stream``); 2 a bad rule file, capture or
        ``--allow-dead`` (``FILE:LINE:COL: what -- fix`` on ``errors``).
    """
    import sys

    stream = stream or sys.stdout
    errors = errors or sys.stderr
    try:
        rules = [r for f in rule_files for r in load_rules(f)]
        caps = load_captures(captures)
        rep = dead_selectors(rules, caps, allow_dead)
    except InputError as e:
        print(str(e), file=errors)
        return 2
    except ValueError as e:  # a bad --allow-dead
        print(f"fusebox check: --allow-dead {e} -- pass a selector as the rule writes it", file=errors)
        return 2
    report(rep, len(rules), len(caps.files), stream)
    return 1 if rep.dead else 0
