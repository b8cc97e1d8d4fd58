"""The control call: what one decision asks of the adapters, typed from the breaker to the audit.

A :class:`ControlCall` is made by the service for each committed decision (and by the reconciler
for a call queued again), handed to each adapter's ``wants``/``apply``/``observe``
(:class:`fusebox.fuse.adapters.protocol.Adapter`), and written to the outbox row's JSON by
:meth:`ControlCall.to_json` only at the store's boundary (:meth:`ControlCall.from_json` reads it
back). Its JSON is the gateway's control body (``POST /v1/control/fuse``)::

    {"action": str, "level": int, "state": "trip"|"release", "reason": str,
     "scope": {label: value}, "decision_id": str}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

__all__ = ["ControlCall", "State", "JsonValue"]

State = Literal["trip", "release"]
# A JSON document as the store reads and writes it.
JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]


@dataclass(frozen=True)
class ControlCall:
    """One trip or release of one level of one scope.

    action: the level's action (``freeze_admissions``...); level: 1..n; state: ``trip`` or
    ``release``; reason: why, as the audit says it ("" for a call the reconciler only compares);
    scope: the scope's labels; decision_id: the decision's id, the gateway's idempotency key ("" for
    a call not queued yet).
    """

    action: str
    level: int
    state: State
    scope: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    decision_id: str = ""

    @property
    def trip(self) -> bool:
        """Whether this call trips (else it releases)."""
        return self.state == "trip"

    def queued(self, reason: str, decision_id: str) -> ControlCall:
        """This call with its ``reason`` and ``decision_id``, as it is queued."""
        return replace(self, reason=reason, decision_id=decision_id)

    def to_json(self) -> dict[str, JsonValue]:
        """The outbox row's payload and the gateway's control body, keys in this order: action,
        level, state, reason, scope, decision_id."""
        return {"action": self.action, "level": self.level, "state": self.state, "reason": self.reason,
                "scope": dict(self.scope), "decision_id": self.decision_id}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> ControlCall:
        """The call an outbox row's payload holds (:meth:`to_json`'s form; ``reason`` and
        ``decision_id`` may be missing: "").

        Raises:
            ValueError: ``state`` is not trip or release, or ``level`` is not an integer.
        """
        state = doc.get("state")
        if state not in ("trip", "release"):
            raise ValueError(f"control call: state {state!r} is not trip or release")
        level = doc.get("level")
        if not isinstance(level, int) or isinstance(level, bool):
            raise ValueError(f"control call: level {level!r} is not an integer")
        scope = doc.get("scope") or {}
        if not isinstance(scope, Mapping):
            raise ValueError(f"control call: scope {scope!r} is not an object")
        return cls(action=str(doc.get("action") or ""), level=level, state=state,
                   scope={str(k): str(v) for k, v in scope.items()}, reason=str(doc.get("reason") or ""),
                   decision_id=str(doc.get("decision_id") or ""))
