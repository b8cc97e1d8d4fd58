"""The registry of signal kinds (:data:`KINDS`) and what is asked of all of them at once.

The order of :data:`KINDS` is the order of the kinds' drill-down dashboards and dashboard records.
To add a kind: write a module with a :class:`~.base.Kind` subclass and its ``KIND`` instance,
and list it below (docs/architecture.md, "Where to add a signal kind").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusebox import conventions as C
from fusebox.spec.inpath import shedding_records
from fusebox.spec.slo import slo_records

from . import connection_idle, deriv, gauge, gpu_memory, quantile, rate, time_to_full
from .base import Kind, dashboard_records

if TYPE_CHECKING:
    from fusebox.spec.normalised import Signal, Spec


KINDS: dict[str, Kind] = {k.name: k for k in (gpu_memory.KIND, deriv.KIND, time_to_full.KIND, quantile.KIND, gauge.KIND,
                                               rate.KIND, connection_idle.KIND)}


def kind_of(sig: Signal) -> Kind:
    """The :class:`Kind` of a signal (its ``kind`` names one of :data:`KINDS`)."""
    return KINDS[sig.kind]


def records(sig: Signal) -> dict[str, str]:
    """Every recording-rule name a signal produces, by role (``value`` is what its alert reads).

    Dashboards, runbooks and the demo import these; never spell the names out.
    """
    return KINDS[sig.kind].records(sig)


def recorded_names(spec: Spec) -> dict[str, str]:
    """Every record the rules of ``spec`` write, name -> who writes it (``signal NAME``,
    ``dashboard``, ``in-path``), as ``generator/render_rules.render_rules`` renders them: each
    signal's :meth:`Kind.rules`, :meth:`Kind.panel_rules` and :meth:`Kind.slow_rules`, the kinds'
    :meth:`Kind.dashboard_records`, the dashboard records of :func:`dashboard_records` (the
    prefix-cache hit rate per engine of :attr:`Spec.engines`) and the in-path gateways' records
    (:func:`fusebox.spec.inpath.shedding_records`), and with ``scaling`` the autoscalers' load
    records. The spec's check of runbook queries reads it;
    ``tests/generator/test_runbook_queries.py`` holds it to the rendered rules."""
    out: dict[str, str] = {}
    for sig in spec.signals:
        kind = kind_of(sig)
        for r in kind.rules(sig, spec) + kind.panel_rules(sig, spec) + kind.slow_rules(sig, spec):
            if "record" in r:
                out.setdefault(r["record"], f"signal {sig.name}")
    for kind in KINDS.values():
        sigs = [s for s in spec.signals if s.kind == kind.name]
        for r in kind.dashboard_records(sigs, spec) if sigs else ():
            out.setdefault(r["record"], "dashboard")
    d = dashboard_records()
    roles = ["host_power", "host_tokens", "energy_per_token"]
    roles += [role for engine, role in (("vllm", "prefix_hit_vllm"), ("sglang", "prefix_hit_sglang")) if engine in spec.engines]
    for role in roles:
        out.setdefault(d[role], "dashboard")
    for name in shedding_records(spec).values():
        out.setdefault(name, "in-path")
    if spec.scaling is not None and spec.scaling.workloads:  # generator/render_scaling.py
        for name in (C.SCALING_SIGNAL_LOAD, C.SCALING_LOAD):
            out.setdefault(name, "scaling")
    for name in slo_records([s.name for s in spec.slos]):  # generator/render_slo.py
        out.setdefault(name, "slo")
    return out


def reports_lost_gpus(spec: Spec) -> bool:
    """Whether a signal of ``spec`` reads a source that reports a lost GPU as ``fusebox_gpu_up 0``
    (the fusebox GPU collector does, dcgm-exporter does not): then the GPU-down alert
    (``conventions.GPU_DOWN_ALERT``) is generated."""
    return any(kind_of(s).reports_lost_gpus(s) for s in spec.signals)


def lost_gpu_fuses(spec: Spec) -> tuple[str, ...]:
    """The fuse actions the GPU-down alert requests, by level: every ``fuse`` of a tier of a
    GPU-level signal (``level: gpu``), since a lost GPU silences them all (its series stop). A GPU
    that is down so holds the fuse it had, and a tier's release waits until the GPU is back.
    Empty when the alert is not generated (:func:`reports_lost_gpus`).

    The rule renderer labels the alert with each (one rule per action) and the fuse trusts exactly
    these (alert, action) pairs besides the signals' own.
    """
    if not reports_lost_gpus(spec):
        return ()
    names = {t.fuse for s in spec.signals if s.level == "gpu" for t in s.tiers if t.fuse and t.fuse in spec.actions}
    return tuple(sorted(names, key=lambda n: (spec.actions[n].level, n)))
