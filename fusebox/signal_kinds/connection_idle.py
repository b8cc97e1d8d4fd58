"""Kind ``connection_idle``: a quantile of the idle time before each use of the long-lived
gateway-engine connections (``fusebox_connection_idle_before_use_seconds``, from
``fusebox collect conns``), with its own dashboard.

The rules, tests and checks are the quantile kind's (:mod:`.quantile`): every threshold a bucket
bound, the alert reading the share of uses over it. The seed's two lines read one histogram:
P95 at or over 45 s (lower the keep-alive time) and the share of uses after more than 30 s idle,
the cold starts, at or over 8 % (warm the pool), which is P92 at or over 30 s. What differs is
what they are about: a peer service (``by``), not an engine, so they list no engine in the
dashboards' variables and get the connections dashboard instead of the alignment one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from fusebox.spec.units import format_duration, format_number

from .base import UNITS, DashboardDef, Kind, PanelDef, Query, quantile_of, signal_legend, signal_sel
from .quantile import Quantile

if TYPE_CHECKING:
    from fusebox.spec.budget import Budget
    from fusebox.spec.normalised import Signal, Spec, Tier


class ConnectionIdle(Quantile):
    name = "connection_idle"
    variable_source: ClassVar[tuple[str, int] | None] = None  # about peer services, not engines
    scale_cannot_help = True  # its base Quantile leaves that note out; an idle-time signal keeps it

    def time_left(self, sig: Signal, tier: Tier, budget: Budget, growth_bps: float | None) -> tuple[float | None, str]:
        """An idle time is no latency of a request, nor a pool: the general answer."""
        return Kind.time_left(self, sig, tier, budget, growth_bps)

    def dashboard(self, spec: Spec, sigs: list[Signal]) -> DashboardDef | None:
        """Per signal: P50 / Pq / P99 of the idle time before a use, the share of uses over each
        threshold (what the alert reads: for the cold-start line, the cold starts over the uses),
        and the uses per second."""
        if not sigs:
            return None
        panels: list[PanelDef] = []
        for sig in sigs:
            r = self.records(sig)
            q = format_number(quantile_of(sig) * 100)
            lg = signal_legend(sig)
            lines = ", ".join(f"{t.name} {t.threshold_text}" for t in sig.tiers)
            panels.append(PanelDef(
                f"{sig.alert}: idle time before a use, P50 / P{q} / P99",
                f"{sig.description} Lines at {lines}. A gap means no use in the window.",
                (Query(signal_sel(sig, r["p50"]), "P50 " + lg), Query(signal_sel(sig, r["value"]), f"P{q} " + lg),
                 Query(signal_sel(sig, r["p99"]), "P99 " + lg)),
                UNITS[sig.unit], (sig.alert,), sig.tiers, width=12,
            ))
            panels.append(PanelDef(
                f"{sig.alert}: share of uses over {lines}",
                "Share of the uses that came after more idle than the threshold (label le), over the rule window: what "
                f"the alert reads; at or above {1 - quantile_of(sig):g} it fires.",
                (Query(signal_sel(sig, r["over_threshold"]), "> {{le}}s " + lg),), "percentunit", (sig.alert,),
                soft_max=1.0, width=12,
            ))
        panels.append(PanelDef(
            "Connection uses per second", "Uses seen per second (at most one per connection and collector round), "
            "over each signal's window.",
            tuple(Query(signal_sel(s, self.records(s)["rate"]), f"{format_duration(s.window_s)} " + signal_legend(s))
                  for s in sigs), "ops", tuple(s.alert for s in sigs), width=24,
        ))
        return DashboardDef("connections", f"fusebox / {spec.name} / connections",
                            "Idle time of the gateway-engine connections before each use, and the cold starts.",
                            tuple(panels))


KIND = ConnectionIdle()
