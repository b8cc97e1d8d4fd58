"""Signal kinds: one module each (gauge, gpu_memory, deriv, time_to_full, quantile), registered here.

The order of :data:`KINDS` is the order of the kinds' drill-down dashboards and dashboard records.
To add a kind: write a module with a :class:`~.base.Kind` subclass and its ``KIND`` instance,
and list it below.
"""

from __future__ import annotations

from typing import Any

from . import deriv, gauge, gpu_memory, quantile, time_to_full
from .base import DashboardDef, Kind, PanelDef, Query, Synth, dashboard_records

KINDS: dict[str, Kind] = {k.name: k for k in (gpu_memory.KIND, deriv.KIND, time_to_full.KIND, quantile.KIND, gauge.KIND)}

__all__ = ["KINDS", "Kind", "kind_of", "records", "dashboard_records", "DashboardDef", "PanelDef", "Query", "Synth",
           "reports_lost_gpus", "lost_gpu_fuses"]


def kind_of(sig: Any) -> Kind:
    """The :class:`Kind` of a signal (anything with a ``kind`` attribute naming one)."""
    return KINDS[sig.kind]


def records(sig: Any) -> dict[str, str]:
    """Every recording-rule name a signal produces, by role (``value`` is what its alert reads).

    Dashboards, runbooks and the demo import these; never spell the names out.
    """
    return KINDS[sig.kind].records(sig)


def reports_lost_gpus(spec: Any) -> bool:
    """Whether a signal of ``spec`` reads a source that reports a lost GPU as ``fusebox_gpu_up 0``
    (the fusebox GPU collector does, dcgm-exporter does not): then the GPU-down alert
    (``conventions.GPU_DOWN_ALERT``) is generated."""
    return any(kind_of(s).reports_lost_gpus(s) for s in spec.signals)


def lost_gpu_fuses(spec: Any) -> tuple[str, ...]:
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
