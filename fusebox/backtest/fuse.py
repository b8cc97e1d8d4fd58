"""The fuse's own breaker (:class:`fusebox.fuse.intake.breaker.Breaker`, its levels, hold and scope rules
from the spec as ``fusebox fuse serve`` builds them) fed the replayed alerts as Alertmanager would
group and send them to the fuse's receiver. Nothing is called: the decisions are only listed.

Alertmanager, as the generated configuration sets it up (:func:`fusebox.generator.render_alertmanager.routing`,
read from the spec, never assumed):

* only fusebox's alerts of this spec (the ``fusebox`` marker label) that request a fuse (a
  ``fuse_action`` label) reach the fuse's receiver;
* they are grouped by the route's ``group_by`` labels; a new group is sent ``group_wait_critical``
  after its first alert arrives (the fuse route's ``group_wait``), then at most every
  ``group_interval``, when an alert of it is new or resolved since the last send; a resolved alert
  is sent once, then dropped; a group left with no alert ends (the next alert starts a new one,
  with ``group_wait`` again);
* the rule engine hands a firing alert to Alertmanager at the evaluation that fires it, with
  ``startsAt`` that time, and a resolved one at the evaluation that resolves it.

A group's resends after ``repeat_interval`` are left out: the breaker ignores a notification it has
already seen (a duplicate changes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fusebox import conventions as C
from fusebox.fuse.intake.breaker import Breaker
from fusebox.fuse.intake.payload import AlertEvent, Notification, fingerprint
from fusebox.fuse.rules import FuseRules
from fusebox.generator.render_alertmanager import routing
from fusebox.spec.units import parse_duration

from .replay import AlertEpisode

__all__ = ["FuseEvent", "run_fuse", "to_fuse"]


@dataclass(frozen=True)
class FuseEvent:
    """A trip or release of one level of one scope. ``action``: "trip" | "release";
    ``fuse_action``: the level's action name; ``at``: Unix seconds; ``alerts``: the alertnames
    holding the level (a trip) or that held it (a release); ``source``: the breaker's (alert,
    hold_expired)."""

    action: str
    scope: dict
    scope_key: str
    level: int
    fuse_action: str
    at: float
    source: str
    alerts: tuple = ()

    def to_dict(self) -> dict[str, Any]:
        return {"scope": dict(self.scope), "scope_key": self.scope_key, "level": self.level, "action": self.action,
                "fuse_action": self.fuse_action, "at": self.at, "source": self.source, "alerts": list(self.alerts)}


def to_fuse(ep: AlertEpisode, marker: str) -> bool:
    """Whether Alertmanager's fuse route takes this alert: fusebox's marker for this spec and a
    non-empty ``fuse_action``."""
    return ep.labels.get(C.LABEL["marker"]) == marker and bool(ep.labels.get(C.LABEL["fuse_action"]))


@dataclass
class _Group:
    key: tuple
    next_flush: float
    alerts: dict = field(default_factory=dict)  # fp -> AlertEvent (latest)
    changed: set = field(default_factory=set)  # fps new or resolved since the last send


def _alert_stream(eps: list[AlertEpisode]) -> list[tuple[float, int, AlertEvent]]:
    out = []
    for ep in eps:
        if ep.firing_at is None:
            continue
        fp = fingerprint(ep.labels)
        out.append((ep.firing_at, 0, AlertEvent("firing", dict(ep.labels), fp, ep.firing_at, None)))
        if ep.resolved_at is not None:
            out.append((ep.resolved_at, 1, AlertEvent("resolved", dict(ep.labels), fp, ep.firing_at, ep.resolved_at)))
    out.sort(key=lambda x: (x[0], x[1], x[2].fingerprint))
    return out


def run_fuse(spec, eps: list[AlertEpisode], hold_s: float) -> list[FuseEvent]:
    """The breaker's trips and releases for ``eps`` (see the module docstring), in time order.
    Hold times still running after the last notification are played out: their releases are
    listed at the time the hold ends (no later alert can come from the window)."""
    r = routing(spec)
    group_by = list(r.group_by)
    wait = parse_duration(r.group_wait_critical)
    interval = parse_duration(r.group_interval)
    breaker = Breaker(FuseRules.from_spec(spec), hold_s)
    stream = _alert_stream([e for e in eps if to_fuse(e, r.marker.value)])
    groups: dict[tuple, _Group] = {}
    out: list[FuseEvent] = []

    def advance(now: float) -> None:  # hold times that end before ``now``
        while (due := breaker.next_due()) is not None and due <= now:
            out.extend(_events(breaker.tick(due)))

    i = 0
    while i < len(stream) or any(x.changed for x in groups.values()):
        next_alert = stream[i][0] if i < len(stream) else None
        g = min(groups.values(), key=lambda x: (x.next_flush, x.key), default=None)
        if g is not None and (next_alert is None or g.next_flush < next_alert):
            now = g.next_flush
            if g.changed:
                advance(now)
                note = Notification("4", "firing" if any(a.status == "firing" for a in g.alerts.values()) else "resolved",
                                    "{}:" + str(dict(zip(group_by, g.key, strict=False))), r.fuse_receiver, 0,
                                    tuple(g.alerts[fp] for fp in sorted(g.alerts)))
                decisions, _ = breaker.on_notification(note, now)
                out.extend(_events(decisions))
                for fp in [fp for fp, a in g.alerts.items() if a.status == "resolved"]:
                    del g.alerts[fp]
                g.changed = set()
            if not g.alerts:
                del groups[g.key]
            else:
                g.next_flush = now + interval
            continue
        t, _, alert = stream[i]
        i += 1
        key = tuple(alert.labels.get(n, "") for n in group_by)
        grp = groups.get(key)
        if grp is None:
            grp = groups[key] = _Group(key, t + wait)
        grp.alerts[alert.fingerprint] = alert
        grp.changed.add(alert.fingerprint)
    advance(float("inf"))
    return out


def _events(decisions) -> list[FuseEvent]:
    return [FuseEvent(d.kind, dict(d.scope), d.scope_key, d.level, d.action, d.at, d.source,
                      tuple(sorted({a.split("/", 1)[0] for a in d.alerts}))) for d in decisions]

