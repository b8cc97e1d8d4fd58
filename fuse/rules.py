"""Which fuse an alert asks for, from its labels and the spec.

The generated alerting rules label every tier that trips a fuse with ``fuse_action`` and
``fuse_level``; warning tiers and ``FuseboxSignalAbsent`` carry none and never trip. An alert
without those labels (a hand-written rule, a relabelled route) is resolved through the spec by
``alertname`` + ``severity``. The spec is authoritative for the level of an action: a
``fuse_level`` label that disagrees with it is ignored.

Only what the spec generates is trusted (a sender holding the webhook token is not): a ``fuse_action`` label counts only on an alert
whose (``alertname``, action) pair is one of the spec's tiers, or ``FuseboxGPUDown`` with the action
of a GPU-level signal (a lost GPU holds the fuse it had); any other alert that asks for a fuse
is refused with a reason (audited by the service). ``FuseboxHeartbeat`` (always firing, routed to
the fuse to prove the feed alive) asks for nothing, even with a ``fuse_action`` label. An alert without any scope label would trip the
empty scope, i.e. the whole fleet: refused unless the spec says ``fuse.allow_fleet_wide_alerts``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fusebox import conventions as C
from fusebox.signal_kinds import lost_gpu_fuses

__all__ = ["Target", "Refusal", "FuseRules", "scope_of", "scope_key", "key_of"]


@dataclass(frozen=True)
class Target:
    action: str
    level: int


@dataclass(frozen=True)
class Refusal:
    """An alert that asks for a fuse it may not trip. ``result``: ``untrusted`` (not an alert and
    action the spec generates) or ``no_scope`` (no scope label, fleet-wide alerts not allowed)."""

    result: str
    reason: str


def scope_of(labels: Mapping[str, str]) -> dict[str, str]:
    """The blast radius of an alert: the SCOPE_LABELS present in its labels, in that order."""
    return {k: labels[k] for k in C.SCOPE_LABELS if labels.get(k)}


def key_of(labels: Mapping[str, str]) -> str:
    """:func:`scope_key` of :func:`scope_of` ``labels``: the key of the scope a control call or an
    override names (its labels may hold more than the scope's)."""
    return scope_key(scope_of(labels))


def _escape(value: str) -> str:
    # Prometheus' label-value escaping (text exposition format): backslash first, then quote, newline.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def scope_key(scope: Mapping[str, str]) -> str:
    """A stable, unambiguous text key for a scope, as a Prometheus selector: ``{cluster="a",engine="e0"}``.

    Values are escaped as Prometheus does (``\\`` ``\\"`` ``\\n``), so a value such as
    ``a",engine="b`` cannot be mistaken for two labels.
    """
    inner = ",".join(f'{k}="{_escape(str(scope[k]))}"' for k in C.SCOPE_LABELS if k in scope)
    return "{" + inner + "}"


class FuseRules:
    """Actions and their levels, (alertname, severity) -> action from the spec's tiers, and the
    (alertname, action) pairs the spec generates (the only ones a ``fuse_action`` label may ask for).

    Args:
        actions: action name -> level.
        by_alert: (alertname, severity) -> action name.
        allow_fleet_wide: whether an alert without any scope label may trip the empty scope.
    """

    def __init__(self, actions: Mapping[str, int], by_alert: Mapping[tuple[str, str], str], *,
                 allow_fleet_wide: bool = False, trusted: Iterable[tuple[str, str]] | None = None):
        self.actions = dict(actions)  # name -> level
        self.by_alert = dict(by_alert)  # (alertname, severity) -> action name
        self.levels = {lvl: name for name, lvl in self.actions.items()}
        if trusted is None:
            trusted = [(alert, action) for (alert, _sev), action in self.by_alert.items()]
        self.trusted = frozenset(trusted)  # (alertname, fuse_action) pairs a fuse_action label may ask for
        self.allow_fleet_wide = allow_fleet_wide

    @classmethod
    def from_spec(cls, spec) -> FuseRules:
        """From a :class:`fusebox.spec.Spec`: spec.actions, each tier's ``fuse`` (a signal's, or an
        SLO's page or ticket), ``fuse.allow_fleet_wide_alerts``, and the trusted pairs: (alert,
        ``fuse_action``) of every tier that requests a fuse, and (``FuseboxGPUDown``, action) for each action of
        :func:`fusebox.signal_kinds.lost_gpu_fuses` -- the pairs the generated alerting rules carry
        (the rule renderer puts ``fuse_action`` on exactly those; a test compares the two).
        """
        actions = {name: a.level for name, a in spec.actions.items()}
        by_alert = {}
        for s in spec.signals:
            for t in s.tiers:
                if t.fuse:
                    by_alert[(s.alert, t.severity)] = t.fuse
        trusted = [(s.alert, t.fuse) for s in spec.signals for t in s.tiers if t.fuse]
        # An SLO's burn-rate alert that requests a fuse (slos.<name>.page/ticket.fuse) takes the same path.
        for slo in getattr(spec, "slos", ()):
            for bt in slo.tiers:
                if bt.fuse:
                    by_alert[(slo.alert, bt.severity)] = bt.fuse
                    trusted.append((slo.alert, bt.fuse))
        # A lost GPU holds the fuse of the signals it silences (the GPU-down rules carry these actions).
        trusted += [(C.GPU_DOWN_ALERT, action) for action in lost_gpu_fuses(spec)]
        return cls(actions, by_alert, allow_fleet_wide=bool(getattr(spec, "allow_fleet_wide_alerts", False)),
                   trusted=trusted)

    def target(self, labels: Mapping[str, str]) -> Target | None:
        """The fuse an alert asks for and may trip, or None (see :meth:`verdict`)."""
        t = self.verdict(labels)
        return t if isinstance(t, Target) else None

    def verdict(self, labels: Mapping[str, str]) -> Target | Refusal | None:
        """The fuse an alert trips (:class:`Target`); a :class:`Refusal` when it asks for one it may
        not trip; None when it asks for none (warning tier, absent alert, unknown action)."""
        name = labels.get("alertname", "")
        if name in (C.ABSENT_ALERT, C.HEARTBEAT_ALERT):  # the heartbeat trips nothing, whatever it carries
            return None
        action = labels.get(C.LABEL["fuse_action"])
        if action:
            if (name, action) not in self.trusted:
                return Refusal("untrusted", f"alert {name!r} asks for fuse_action {action!r}, but that is not an "
                                            "alert the spec generates with that action: ignored")
        else:
            action = self.by_alert.get((name, labels.get(C.LABEL["severity"], "")))
        if not action or action not in self.actions:
            return None
        if not scope_of(labels) and not self.allow_fleet_wide:
            known = ", ".join(C.SCOPE_LABELS)
            return Refusal("no_scope", f"alert {name!r} ({action}) has no scope label ({known}) and would trip the "
                                       "whole fleet; the spec does not allow that (fuse.allow_fleet_wide_alerts): ignored")
        return Target(action, self.actions[action])
