"""Whether each tripped level was applied: what the fuse's calls achieved, not what it decided.

One record per tripped (scope key, level), for its trip decision: the adapters that wanted it,
those that applied it, those still trying, and why the others did not (``scope not mapped``, a
permanent refusal, retries exhausted, dry-run) or have not yet (``retrying: <the last error>``,
for an adapter still pending whose last attempt failed). A trip no adapter wants (a level no configured
adapter applies) is unapplied from the start. A release ends the record.

:meth:`AppliedLevels.view` is what ``GET /state`` and the status page show per tripped level::

    {"applied": true|false, "applied_by": [adapter label, ...], "pending": [adapter label, ...],
     "not_applied": [{"adapter": label or null, "why": text}, ...]}

``applied`` is true when at least one adapter applied the trip. :meth:`AppliedLevels.unapplied`
counts the tripped levels with ``applied`` false (``fusebox_fuse_unapplied_levels``; pending ones
included: a trip still being retried is not applied yet).

Records live in memory; at start they are rebuilt from the audit log (``trip``/``release``
decisions and the ``applied``/``failed``/``dry_run`` outcomes, the newest :data:`RESTORE_ROWS`)
and the outbox's pending rows, and again when ``/state`` meets a tripped level without a record
after the store changed (another replica decided it). A tripped level still without one (its trip
older than those rows) says so rather than claim it was applied.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from ..rows import AppliedView, AuditRow

__all__ = ["AppliedLevels", "RESTORE_ROWS", "NO_RECORD"]

RESTORE_ROWS = 5000
NO_RECORD = "no record of its trip decision in this replica (see the audit log)"


class AppliedLevels:
    """Thread-safe: the service's change path and every dispatcher thread update it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._recs: dict[tuple[str, int], dict] = {}
        self.changes = 0  # bumped by every change of a record: part of /state's snapshot key (fuse/http/routes.py)

    def decided(self, key: str, level: int, kind: str, decision_id: str, wanted: Iterable[str],
                action: str = "") -> None:
        """A decision of ``kind`` (trip|release) was committed; ``wanted``: the labels of the adapters it went to."""
        with self._lock:
            self.changes += 1
            if kind != "trip":
                self._recs.pop((key, level), None)
                return
            wanted = list(wanted)
            none = [] if wanted else [{"adapter": None, "why": f"no adapter applies level {level} ({action})"}]
            self._recs[(key, level)] = {"decision_id": decision_id, "applied_by": [], "pending": wanted,
                                        "not_applied": none}

    def outcome(self, key: str, level: int, decision_id: str, adapter: str, applied: bool, why: str = "") -> None:
        """``adapter`` applied (``applied``) or gave up (``why``) the call of ``decision_id``; ignored
        unless that is the trip decision of a level still tripped."""
        with self._lock:
            rec = self._recs.get((key, level))
            if rec is None or (rec["decision_id"] != decision_id and decision_id not in rec.get("again", ())):
                return
            self.changes += 1
            if adapter in rec["pending"]:
                rec["pending"].remove(adapter)
            if applied:  # (again, after a give-up: the reconciler queued it once more) -- no longer "not applied"
                if adapter not in rec["applied_by"]:
                    rec["applied_by"].append(adapter)
                rec["not_applied"] = [n for n in rec["not_applied"] if n["adapter"] != adapter]
            elif adapter not in rec["applied_by"]:
                rec["not_applied"] = [n for n in rec["not_applied"] if n["adapter"] != adapter]
                rec["not_applied"].append({"adapter": adapter, "why": why})

    def retrying(self, key: str, level: int, decision_id: str, adapter: str, why: str) -> None:
        """``adapter``'s call of ``decision_id`` failed and is retried: it stays ``pending``, with
        ``why`` under ``not_applied`` until its outcome (any retried failure, e.g. ``retrying:
        gateway refused the control-plane credential (HTTP 401)``, ``retrying: ConnectError:
        [Errno -2] Name or service not known``); ignored unless that is a trip decision of a level
        still tripped."""
        with self._lock:
            rec = self._recs.get((key, level))
            if rec is None or (rec["decision_id"] != decision_id and decision_id not in rec.get("again", ())):
                return
            self.changes += 1
            if adapter not in rec["applied_by"]:
                rec["not_applied"] = [n for n in rec["not_applied"] if n["adapter"] != adapter]
                rec["not_applied"].append({"adapter": adapter, "why": why})

    def requeued(self, key: str, level: int, decision_id: str, adapter: str) -> None:
        """The reconciler queued the trip of (``key``, ``level``) again for ``adapter`` as
        ``decision_id``: its outcome counts for that level like the trip's own."""
        with self._lock:
            rec = self._recs.get((key, level))
            if rec is None:
                return
            self.changes += 1
            rec.setdefault("again", set()).add(decision_id)
            if adapter not in rec["pending"] and adapter not in rec["applied_by"]:
                rec["pending"].append(adapter)

    def has(self, key: str, level: int) -> bool:
        """Whether (``key``, ``level``) has a record."""
        with self._lock:
            return (key, level) in self._recs

    def view(self, key: str, level: int) -> AppliedView:
        """See the module's doc (a copy)."""
        with self._lock:
            rec = self._recs.get((key, level))
            if rec is None:
                return {"applied": False, "applied_by": [], "pending": [], "not_applied": [{"adapter": None, "why": NO_RECORD}]}
            return {"applied": bool(rec["applied_by"]), "applied_by": list(rec["applied_by"]),
                    "pending": list(rec["pending"]), "not_applied": [n.copy() for n in rec["not_applied"]]}

    def unapplied(self) -> int:
        """Tripped levels that no adapter applied (yet)."""
        with self._lock:
            return sum(1 for rec in self._recs.values() if not rec["applied_by"])

    def restore(self, audit_newest_first: Iterable[AuditRow], pending: Iterable[tuple[str, str]],
                labels: dict[str, str] | None = None) -> None:
        """Rebuild from audit rows (newest first, as :meth:`Store.audit_log` gives them) and the
        outbox's pending ``(decision_id, adapter label)`` pairs."""
        waiting: dict[str, list[str]] = {}
        for did, label in pending:
            waiting.setdefault(did, []).append(label)
        for row in reversed(list(audit_newest_first)):
            key, level, did = row.get("scope_key") or "", int(row.get("level") or 0), row.get("decision_id") or ""
            if row["kind"] in ("trip", "release"):
                self.decided(key, level, row["kind"], did, waiting.get(did, []), row.get("action") or "")
            elif row["kind"] == "reconcile":
                self.requeued(key, level, did, row.get("source") or "")
            elif row["kind"] in ("applied", "failed", "dry_run"):
                with self._lock:
                    rec = self._recs.get((key, level))
                    if rec is not None and rec["decision_id"] == did:  # an adapter was wanted after all
                        rec["not_applied"] = [n for n in rec["not_applied"] if n["adapter"] is not None]
                self.outcome(key, level, did, row.get("source") or "", row["kind"] == "applied",
                             _why(row))


def _why(row: AuditRow) -> str:
    """The live path's text (``refused: <summary>``, ``gave up: <summary>``) from a ``failed`` audit
    row, whose reason ends ``permanent failure: <summary>`` or ``retries exhausted: <summary>``."""
    if row["kind"] == "dry_run":
        return "dry-run: nothing was called"
    reason = str(row.get("reason") or "")
    for marker, word in (("permanent failure: ", "refused"), ("retries exhausted: ", "gave up")):
        if marker in reason:
            return f"{word}: {reason.split(marker, 1)[1]}"[:300]
    return reason[:300]
