"""Signal kinds: what fusebox knows per kind of signal (gauge, gpu_memory, deriv, time_to_full,
quantile, rate, connection_idle), one module each, registered in :mod:`.registry`.

Each module holds the validation of its kind's spec fields (called while the spec loads), its
recording-rule names and rules, the synthetic series of its generated tests, its drill-down
dashboard and its values under a scenario. The spec (:mod:`fusebox.spec`) is the user's file;
this package is the render and validation knowledge the spec's loader and the renderers ask.
"""

from __future__ import annotations

# The spec's loader asks the kinds (fusebox.spec.model imports fusebox.signal_kinds.registry), and
# the kinds read the spec's units: the spec package loads first, whichever is imported first.
import fusebox.spec  # noqa: F401

from .base import DashboardDef, Kind, PanelDef, Query, Synth, dashboard_records
from .registry import KINDS, kind_of, lost_gpu_fuses, recorded_names, records, reports_lost_gpus

__all__ = ["KINDS", "Kind", "kind_of", "records", "dashboard_records", "DashboardDef", "PanelDef", "Query", "Synth",
           "reports_lost_gpus", "lost_gpu_fuses", "recorded_names"]
