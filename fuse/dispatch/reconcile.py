"""The reconciler (:class:`Reconciler`, a part of :class:`fusebox.fuse.service.FuseService`).

Reconciler (every ``reconcile_s``, 0: never): for each adapter that can report the target's own
state (``observe``, :class:`fusebox.fuse.adapters.protocol.Observable`), every level tripped (the breaker's
state, which ``/state`` and ``fusebox_fuse_level`` show) that the adapter wants and that has no
action pending for its scope is compared with what the target shows; where they differ (someone
put the worker back by hand, a call was given up, the gateway restarted) the trip is queued again
as a new outbox row (idempotency key ``reconcile|<decision id>``), delivered by the dispatcher like
any other (claimed, retried, audited ``applied``), with an audit row of kind ``reconcile`` and
``fusebox_fuse_reconciliations_total{adapter}`` counting it. A release this process gave up
(audited ``failed``) is compared and queued again the same way until the target shows it or the
level trips again. An adapter that cannot report
(``http``, ``--gateway-url``, vLLM's reset) is named once at start-up: not reconciled. Each
replica reconciles; two that queue the same trip make one more call, which the adapters'
holds make harmless.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable

from ..adapters.protocol import ActionError
from ..control import ControlCall
from ..intake.breaker import Breaker
from ..logsafe import install
from ..override import UsageError, parse_scope
from ..rules import FuseRules, key_of
from ..store import StoreError
from .parts import ServiceParts

log = install(logging.getLogger("fusebox.fuse"))

__all__ = ["Reconciler"]


class Reconciler(ServiceParts):
    """:meth:`reconcile` of :class:`fusebox.fuse.service.FuseService` (which sets every attribute
    below in its ``__init__``)."""

    rules: FuseRules
    breaker: Breaker
    reconcile_s: float
    _lock: threading.Lock
    _unreleased: dict[tuple[str, str, int], ControlCall]
    _failed_seen: int

    _refresh: Callable[[], None]
    _every: Callable[[float, Callable[[], object], str], None]

    def reconcile(self) -> int:
        """One pass of the reconciler (see the module's doc): returns how many trips were queued
        again. An adapter whose target cannot be read is left for the next pass (logged at debug:
        its own calls say it is down). Raises StoreError."""
        with self._lock:
            with contextlib.suppress(StoreError):
                self._refresh()
            tripped = [(dict(sc["labels"]), lvl) for sc in self.breaker.scopes.values()
                       for lvl, st in sc["levels"].items() if st.tripped]
        self._note_given_up_releases()
        queued = 0
        for name, adapter in self.adapters.items():
            observe = getattr(adapter, "observe", None)
            if observe is None:
                continue
            busy = {key_of(r["call"].scope) for r in self.store.pending(name)}
            wanted = []
            for labels, lvl in tripped:
                action = self.rules.levels.get(lvl)
                call = ControlCall(action=action or "", level=lvl, state="trip", scope=labels)
                if action and key_of(labels) not in busy and adapter.wants(call):
                    wanted.append(call)
            held = {(key_of(labels), lvl) for labels, lvl in tripped}
            for lane, release in list(self._unreleased.items()):
                if lane[0] == name and (lane[1:] in held or lane[1] in busy):
                    del self._unreleased[lane]  # tripped again, or a newer action queued: theirs now
                elif lane[0] == name:
                    wanted.append(release)
            if not wanted:
                continue
            try:
                seen = observe(wanted)
            except ActionError as e:
                log.debug("reconcile %s: the target's state cannot be read: %s", name, e)
                continue
            for call, ok in zip(wanted, seen, strict=False):
                if not call.trip and ok:
                    self._unreleased.pop((name, key_of(call.scope), call.level), None)
                elif not ok:
                    self._requeue(name, call)
                    queued += 1
        return queued

    def _note_given_up_releases(self) -> None:
        """Releases given up (audited ``failed``) since the last pass, from the audit (newest 1000):
        kept in ``_unreleased`` until the target shows them or the level trips again. Only those
        after this process started (``_failed_seen``): an older one may have been superseded by
        hand."""
        rows = [r for r in self.store.audit_log(1000, kinds=("failed",)) if r["seq"] > self._failed_seen]
        for r in reversed(rows):
            self._failed_seen = max(self._failed_seen, r["seq"])
            name = (r.get("detail") or {}).get("adapter")
            if name not in self.adapters or not str(r.get("reason", "")).startswith("release ") or not r["scope_key"]:
                continue
            try:
                labels = parse_scope(r["scope_key"])
            except UsageError:
                continue
            self._unreleased[(name, r["scope_key"], r["level"])] = ControlCall(
                action=r["action"] or "", level=int(r["level"] or 0), state="release", scope=labels)

    def _requeue(self, name: str, call: ControlCall) -> None:
        """Queue the trip or release ``p`` again for adapter ``name`` (outbox + a ``reconcile`` audit row)."""
        label, now, did = self.labels[name], self.clock(), uuid.uuid4().hex
        key = key_of(call.scope)
        done = "tripped" if call.trip else "released"
        reason = (f"level {call.level} ({call.action}) {done} on {key} but not seen on {label}: "
                  "queued again")
        call = call.queued(reason, did)
        self.store.commit(None, [(did, name, call, now, f"reconcile|{did}")], [
            {"at": now, "kind": "reconcile", "decision_id": did, "scope_key": key, "level": call.level,
             "action": call.action, "source": label, "reason": reason, "detail": {"adapter": name}}])
        self.metrics.reconciliations.labels(label).inc()
        if call.trip:  # its outcome counts for the level's applied record (fuse/dispatch/applied.py)
            self.applied.requeued(key, call.level, did, label)
        log.warning("%s", reason, extra={"decision_id": did, "scope": key, "action": call.action,
                                         "fuse_level": call.level, "state": call.state, "adapter": label})
        self._wakes[name].set()

    def _reconcile_loop(self) -> None:
        self._every(self.reconcile_s, self.reconcile, "reconcile")
