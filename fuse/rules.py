"""Which fuse an alert asks for, from its labels and the spec.

The generated alerting rules label every tier that trips a fuse with ``fuse_action`` and
``fuse_level``; warning tiers and ``FuseboxSignalAbsent`` carry none and never trip. An alert
without those labels (a hand-written rule, a relabelled route) is resolved through the spec by
``alertname`` + ``severity``. The spec is authoritative for the level of an action: a
``fuse_level`` label that disagrees with it is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from fusebox import conventions as C

__all__ = ["Target", "FuseRules", "scope_of", "scope_key"]


@dataclass(frozen=True)
class Target:
    action: str
    level: int


def scope_of(labels: Mapping[str, str]) -> dict[str, str]:
    """The blast radius of an alert: the SCOPE_LABELS present in its labels, in that order."""
    return {k: labels[k] for k in C.SCOPE_LABELS if labels.get(k)}


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
    """Actions and their levels, plus (alertname, severity) -> action from the spec's tiers."""

    def __init__(self, actions: Mapping[str, int], by_alert: Mapping[tuple[str, str], str]):
        self.actions = dict(actions)  # name -> level
        self.by_alert = dict(by_alert)  # (alertname, severity) -> action name
        self.levels = {lvl: name for name, lvl in self.actions.items()}

    @classmethod
    def from_spec(cls, spec) -> "FuseRules":
        """From a :class:`fusebox.spec.Spec`: spec.actions and each tier's ``fuse``."""
        actions = {name: a.level for name, a in spec.actions.items()}
        by_alert = {}
        for s in spec.signals:
            for t in s.tiers:
                if t.fuse:
                    by_alert[(s.alert, t.severity)] = t.fuse
        return cls(actions, by_alert)

    @classmethod
    def default(cls) -> "FuseRules":
        """Only the conventions' three levels, no alert table (for tests and tools without a spec)."""
        return cls(C.FUSE_LEVELS, {})

    def target(self, labels: Mapping[str, str]) -> Optional[Target]:
        """The fuse an alert asks for, or None (warning tier, absent alert, unknown action)."""
        if labels.get("alertname") == C.ABSENT_ALERT:
            return None
        action = labels.get(C.LABEL["fuse_action"])
        if not action:
            action = self.by_alert.get((labels.get("alertname", ""), labels.get(C.LABEL["severity"], "")))
        if not action or action not in self.actions:
            return None
        return Target(action, self.actions[action])
