"""The runbooks' own diagnosis queries (``runbook.diagnosis[].query``): record names by reference,
checked against what the rules record.

A query may name a record symbolically, so a changed window, level or interval renames it with
the rules (docs/spec.md, "Runbook queries"):

* ``${SIGNAL}``: the value record of signal ``SIGNAL`` (what its alert reads;
  ``${kv_cache_growth_rate}`` is ``engine:fusebox_kv_cache_usage_bytes:deriv1m`` at a 1m window,
  ``...:deriv2m`` at 2m);
* ``${SIGNAL.ROLE}``: another record of the signal, by the role its kind gives it
  (:func:`fusebox.signal_kinds.records`: ``${gpu_memory_utilization.device}``);
* ``${dashboard.ROLE}``: a dashboard record (:func:`fusebox.signal_kinds.dashboard_records`:
  ``${dashboard.kv_ratio}``).

After the references are replaced, the query must parse as PromQL, and every series it names
that is shaped like a record (``level:metric:operations``, three parts) must be one the rules of
this spec record (:func:`fusebox.signal_kinds.recorded_names`); otherwise it is a spec error at the
query's line with the record it most likely meant. Raw metrics (one colon at most, as vLLM's
``vllm:num_requests_running``) are not judged here: what publishes them is the deployment's.

The standard queries of each signal (its kind's :meth:`~fusebox.signal_kinds.Kind.diagnosis`) come
before these in the rendered runbook; the spec lists only the extra ones.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any

from fusebox.signal_kinds.registry import dashboard_records, kind_of, recorded_names

__all__ = ["REFERENCE", "resolve_diagnosis", "record_shaped"]

Err = Callable[..., None]
# ${name} or ${name.role}; "$1" and "${1}" (label_replace's replacement) are left alone.
REFERENCE = re.compile(r"\$\{([a-z][a-z0-9_]*)(?:\.([a-z][a-z0-9_]*))?\}")
DASHBOARD = "dashboard"
_RECORD = re.compile(r"^[^:]+:[^:]+:[^:]+\Z")


def record_shaped(name: str) -> bool:
    """``level:metric:operations``: three non-empty parts (a raw metric has one colon at most)."""
    return bool(_RECORD.match(name))


def _references(spec: Any) -> dict[str, str]:
    """record name -> the reference that writes it (the first: a signal's value before its other roles)."""
    out: dict[str, str] = {}
    for sig in spec.signals:
        roles = kind_of(sig).records(sig)
        out.setdefault(roles["value"], f"${{{sig.name}}}")
        for role, name in roles.items():
            out.setdefault(name, f"${{{sig.name}.{role}}}")
    for role, name in dashboard_records().items():
        out.setdefault(name, f"${{{DASHBOARD}.{role}}}")
    return out


def _meant(name: str, spec: Any, recorded: dict[str, str]) -> str | None:
    """The record ``name`` most likely meant: the value record of the signal its metric part names
    (``engine:fusebox_kv_cache_growth_rate:deriv1m`` -> kv_cache_growth_rate's), a record of the
    same level and metric with other operations (``...:deriv1m`` -> ``...:deriv2m``), else the
    closest name (difflib)."""
    level, metric, _ops = name.split(":")
    for sig in spec.signals:
        value = kind_of(sig).records(sig)["value"]
        if metric in (f"fusebox_{sig.name}", sig.name) and value in recorded:
            return value
    same = sorted(r for r in recorded if r.startswith(f"{level}:{metric}:"))
    if same:
        return same[0]
    close = difflib.get_close_matches(name, list(recorded), n=1, cutoff=0.6)
    return close[0] if close else None


def _substitute(query: str, spec: Any, path: tuple, err: Err) -> str | None:
    """``query`` with every reference replaced by its record name; None (after ``err``) when one names nothing."""
    signals = {s.name: s for s in spec.signals}
    bad = False

    def one(m: re.Match[str]) -> str:
        nonlocal bad
        name, role = m.group(1), m.group(2)
        if name in signals:
            roles = kind_of(signals[name]).records(signals[name])
            if (role or "value") in roles:
                return roles[role or "value"]
            err(path, f"{m.group(0)}: signal {name} (kind {signals[name].kind}) has no record {role!r}",
                f"use one of: {', '.join(f'${{{name}.{r}}}' for r in roles)}")
        elif name == DASHBOARD:
            d = dashboard_records()
            if role in d:
                return d[role]
            err(path, f"{m.group(0)}: no dashboard record {role!r}", f"use one of: {', '.join(f'${{dashboard.{r}}}' for r in d)}")
        else:
            close = difflib.get_close_matches(name, list(signals), n=1)
            err(path, f"{m.group(0)} names no signal of the spec",
                (f"did you mean ${{{close[0]}}}? " if close else "")
                + "write ${SIGNAL} for a signal's value record, ${SIGNAL.ROLE} for another of its records, "
                "${dashboard.ROLE} for a dashboard record")
        bad = True
        return m.group(0)

    out = REFERENCE.sub(one, query)
    return None if bad else out


def resolve_diagnosis(spec: Any, err: Err) -> dict[str, tuple[tuple[str, str], ...]]:
    """signal name -> its ``runbook.diagnosis`` as (title, query) with the references replaced,
    each query checked (module doc); every problem goes to ``err`` at the query's line."""
    import promql_parser

    from .promql import vector_selectors

    recorded = recorded_names(spec)
    refs = _references(spec)
    out: dict[str, tuple[tuple[str, str], ...]] = {}
    for sig in spec.signals:
        resolved = []
        for i, (title, query) in enumerate(sig.runbook.diagnosis):
            path = sig.path + ("runbook", "diagnosis", i, "query")
            text = _substitute(query, spec, path, err)
            if text is None:
                continue
            try:
                promql_parser.parse(text)
            except Exception as e:  # promql-parser raises its own ValueError subclasses
                err(path, f"invalid PromQL: {str(e).splitlines()[0]}", "fix the query (it is shown to people as written)")
                continue
            for name in dict.fromkeys(v.name for v in vector_selectors(text) if v.name):
                if not record_shaped(name) or name in recorded:
                    continue
                meant = _meant(name, spec, recorded)
                how = f"did you mean {meant}" + (f" (write {refs[meant]}: it follows the rules' names)" if meant in refs else "")
                err(path, f"{name} is named like a record (level:metric:operations) but no rule of this spec records it",
                    how if meant else "name a record the rules write, e.g. ${SIGNAL} for a signal's value record")
            resolved.append((title, text))
        out[sig.name] = tuple(resolved)
    return out
