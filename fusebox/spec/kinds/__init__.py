"""Signal kinds: one module each (gauge, gpu_memory, deriv, quantile), registered here.

The order of :data:`KINDS` is the order of the kinds' drill-down dashboards and dashboard records.
To add a kind: write a module with a :class:`~.base.Kind` subclass and its ``KIND`` instance,
and list it below.
"""

from __future__ import annotations

from typing import Any

from . import deriv, gauge, gpu_memory, quantile
from .base import DashboardDef, Kind, PanelDef, Query, Synth, dashboard_records

KINDS: dict[str, Kind] = {k.name: k for k in (gpu_memory.KIND, deriv.KIND, quantile.KIND, gauge.KIND)}

__all__ = ["KINDS", "Kind", "kind_of", "records", "dashboard_records", "DashboardDef", "PanelDef", "Query", "Synth"]


def kind_of(sig: Any) -> Kind:
    """The :class:`Kind` of a signal (anything with a ``kind`` attribute naming one)."""
    return KINDS[sig.kind]


def records(sig: Any) -> dict[str, str]:
    """Every recording-rule name a signal produces, by role (``value`` is what its alert reads).

    Dashboards, runbooks and the demo import these; never spell the names out.
    """
    return KINDS[sig.kind].records(sig)
