"""The outbox (:class:`OutboxOps`): the actions a decision needs, claimed by one replica at a time
(a lease on the store's clock and a fencing token), their results recorded only by the replica
holding the row's latest claim; and the adapters' state (:class:`AdapterStateOps`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from ..control import ControlCall
from ..rows import AuditRecord, OutboxEntry, OutboxRow
from .base import StoreCore
from .dialect import marks, upsert
from .health import local_clock

_COLUMNS = ("seq", "decision_id", "adapter", "payload", "received", "attempts", "claimed_by", "lease_until")


class OutboxOps(StoreCore):
    """The outbox's claims, results and reads."""

    def now(self) -> float:
        """The clock leases are on, Unix seconds: this host's (SQLite: one host). Raises StoreError."""
        return local_clock()

    def clock(self) -> float:
        """:meth:`now` without a round trip to the database (the service's clock; on PostgreSQL the
        host's clock corrected by the offset to the server's, measured every CLOCK_REFRESH_S)."""
        return local_clock()

    def _claim_now(self) -> float:
        """The lease clock inside :meth:`claim`'s transaction."""
        return local_clock()

    def claim(self, seqs: Iterable[int], owner: str, now: float | None = None, lease_s: float = 30.0) -> list[int]:
        """:meth:`claim_fenced`, the rows only."""
        return list(self.claim_fenced(seqs, owner, lease_s, now))

    def claim_fenced(self, seqs: Iterable[int], owner: str, lease_s: float, now: float | None = None) -> dict[int, int]:
        """Claim the outbox rows ``seqs`` that are pending and not leased to another replica (no lease,
        an ended one, or ``owner``'s own) for ``lease_s`` seconds from ``now`` (Unix s; None: the
        store's clock, :meth:`now`, read in the same transaction). Returns ``{seq: fencing token}``
        of the rows claimed: only those may be applied by ``owner``, and its results recorded with
        that token (``claim=(owner, token)``) while no one claimed the row since. PostgreSQL locks
        them with ``SELECT ... FOR UPDATE SKIP LOCKED``: rows another replica is claiming are skipped.

        Raises StoreError (nothing claimed)."""
        seqs = list(seqs)
        if not seqs:
            return {}
        with self._transaction(exclusive=False):
            if now is None:
                now = self._claim_now()
            got = [r[0] for r in self._rows(
                f"SELECT seq FROM outbox WHERE seq IN ({marks(len(seqs))}) AND status='pending' "
                f"AND (lease_until IS NULL OR lease_until <= ? OR claimed_by = ?) ORDER BY seq{self.sql.claim_suffix}",
                (*seqs, now, owner))]
            if not got:
                return {}
            got_marks = marks(len(got))
            self._run(f"UPDATE outbox SET claimed_by = ?, lease_until = ?, claim_gen = claim_gen + 1 WHERE seq IN ({got_marks})",
                      (owner, now + lease_s, *got))
            return dict(self._rows(f"SELECT seq, claim_gen FROM outbox WHERE seq IN ({got_marks})", got))

    def release_claims(self, owner: str, keep: Iterable[int] = ()) -> int:
        """Give up the claims ``owner`` holds on pending rows (but those in ``keep``: a call still under
        way), so another replica takes them at once rather than after the lease; their fencing
        tokens move on. Returns how many. Raises StoreError."""
        keep = list(keep)
        sql = ("UPDATE outbox SET claimed_by = NULL, lease_until = NULL, claim_gen = claim_gen + 1 "
               "WHERE status='pending' AND claimed_by = ?")
        if keep:
            sql += f" AND seq NOT IN ({marks(len(keep))})"
        with self._transaction(exclusive=False):
            return self._run(sql, (owner, *keep))

    def _finish(self, sql: str, args: tuple, audit: AuditRecord | None, claim: tuple[str, int] | None) -> bool:
        """Run ``sql`` (an UPDATE of one pending outbox row, ``seq`` its last argument) and, when it
        changed the row, write ``audit``; with ``claim`` = (owner, token) only while ``owner`` holds
        the row's latest claim. Whether it did (False: nothing written)."""
        if claim is not None:
            sql += " AND claimed_by = ? AND claim_gen = ?"
            args = (*args, *claim)
        with self._transaction(exclusive=False):
            done = self._run(sql, args) == 1
            if done and audit is not None:
                self._audit_rows([audit])
        return done

    def mark_applied(self, seq: int, at: float, audit: AuditRecord, claim: tuple[str, int] | None = None) -> bool:
        """Pending outbox row ``seq`` applied at ``at`` (Unix s), with its audit row, in one
        transaction; with ``claim`` = (owner, fencing token, :meth:`claim_fenced`) only while that
        claim is the row's latest. Returns whether it was recorded (False: the row is no longer
        pending, or someone claimed it since; nothing written, so a decision never gets two
        ``applied`` rows).

        Raises StoreError (nothing written)."""
        return self._finish("UPDATE outbox SET status='applied', applied_at=?, attempts=attempts+1, lease_until=NULL "
                            "WHERE seq=? AND status='pending'", (at, seq), audit, claim)

    def mark_given_up(self, seq: int, error: str, audit: AuditRecord, claim: tuple[str, int] | None = None) -> bool:
        """Pending outbox row ``seq`` will not be retried (status ``failed``), with its audit row;
        ``claim`` and the result as :meth:`mark_applied`.

        Raises StoreError (nothing written)."""
        return self._finish("UPDATE outbox SET status='failed', attempts=attempts+1, last_error=?, lease_until=NULL "
                            "WHERE seq=? AND status='pending'", (error[:500], seq), audit, claim)

    def mark_failed(self, seq: int, error: str, retry_at: float | None = None,
                    claim: tuple[str, int] | None = None) -> bool:
        """One more failed attempt of row ``seq`` (still pending); with ``retry_at`` (Unix s, the
        store's clock) its lease is kept until then, so no replica retries it before the backoff;
        ``claim`` and the result as :meth:`mark_applied`. Raises StoreError."""
        if retry_at is None:
            return self._finish("UPDATE outbox SET attempts=attempts+1, last_error=? WHERE seq=? AND status='pending'",
                                (error[:500], seq), None, claim)
        return self._finish("UPDATE outbox SET attempts=attempts+1, last_error=?, lease_until=? "
                            "WHERE seq=? AND status='pending'", (error[:500], retry_at, seq), None, claim)

    # ----------------------------------------------------------------- reads
    def pending(self, adapter: str, limit: int | None = None) -> list[OutboxRow]:
        """The pending rows of ``adapter``, oldest first (the first ``limit``; None: all): ``{"seq",
        "decision_id", "adapter", "call", "received", "attempts", "claimed_by", "lease_until"}``,
        ``call`` the :class:`~fusebox.fuse.control.ControlCall` its ``payload`` column holds.
        Raises StoreError or sqlite3.Error when the database cannot be read, ValueError when a
        row's payload is not a control call (:meth:`ControlCall.from_json`)."""
        q = "SELECT {} FROM outbox WHERE status='pending' AND adapter=? ORDER BY seq".format(", ".join(_COLUMNS))
        args: tuple = (adapter,)
        if limit is not None:
            q, args = q + " LIMIT ?", (adapter, limit)
        rows = self._read(q, args)
        return [{"seq": r[0], "decision_id": r[1], "adapter": r[2], "call": ControlCall.from_json(json.loads(r[3])), "received": r[4],
                 "attempts": r[5], "claimed_by": r[6], "lease_until": r[7]} for r in rows]

    def pending_by_adapter(self) -> dict[str, int]:
        """``{adapter: number of pending rows}``."""
        return dict(self._read("SELECT adapter, count(*) FROM outbox WHERE status='pending' GROUP BY adapter"))

    def oldest_pending_received(self, adapters: Iterable[str] | None = None) -> float | None:
        """``received`` (Unix s) of the oldest pending row (of ``adapters`` when given); None if none."""
        q, args = "SELECT min(received) FROM outbox WHERE status='pending'", []
        if adapters is not None:
            args = list(adapters)
            if not args:
                return None
            q += f" AND adapter IN ({marks(len(args))})"
        return self._read(q, args)[0][0]

    def pending_count(self) -> int:
        return self._read("SELECT count(*) FROM outbox WHERE status='pending'")[0][0]

    def outbox(self) -> list[OutboxEntry]:
        """Every outbox row, oldest first (:class:`~fusebox.fuse.rows.OutboxEntry`: no payload)."""
        rows = self._read("SELECT seq, decision_id, adapter, status, attempts, last_error, claimed_by, idem_key "
                          "FROM outbox ORDER BY seq")
        return [{"seq": r[0], "decision_id": r[1], "adapter": r[2], "status": r[3], "attempts": r[4],
                 "last_error": r[5], "claimed_by": r[6], "idem_key": r[7]} for r in rows]


class AdapterStateOps(StoreCore):
    """What the spec's adapters keep between calls (table ``adapter_state``), shared by every replica."""

    def adapter_hold(self, adapter: str, worker: str, hold: str, on: bool) -> bool:
        """Add (``on``) or drop ``hold`` on ``worker`` of ``adapter`` in one transaction (the row
        locked on PostgreSQL, so replicas do not lose each other's holds); returns whether anything
        still holds it. Its recorded settings stay. Raises StoreError."""
        key = (adapter, worker)
        with self._transaction(exclusive=False):
            self._run(upsert("adapter_state", ("adapter", "worker"), ("adapter", "worker")), key)
            row = self._rows("SELECT holds FROM adapter_state WHERE adapter=? AND worker=?" + self.sql.row_lock, key)
            cur = set(json.loads(row[0][0]))
            cur = cur | {hold} if on else cur - {hold}
            self._run("UPDATE adapter_state SET holds=? WHERE adapter=? AND worker=?", (json.dumps(sorted(cur)), *key))
        return bool(cur)

    def adapter_record(self, adapter: str, worker: str, settings: dict) -> None:
        """Record ``settings`` (JSON-able) of ``worker`` of ``adapter``, replacing earlier ones. Raises StoreError."""
        with self._transaction(exclusive=False):
            self._run(upsert("adapter_state", ("adapter", "worker", "settings"), ("adapter", "worker"), ("settings",)),
                      (adapter, worker, json.dumps(settings, sort_keys=True)))

    def adapter_state(self, adapter: str) -> dict[str, dict]:
        """``{worker: {"holds": [...], "settings": {...}}}`` of ``adapter``."""
        rows = self._read("SELECT worker, holds, settings FROM adapter_state WHERE adapter=? ORDER BY worker", (adapter,))
        return {w: {"holds": json.loads(h), "settings": json.loads(st)} for w, h, st in rows}
