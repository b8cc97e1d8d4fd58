"""The audit's reads and its retention (:class:`AuditOps`): rows leave the append-only audit only
through a prune recorded in ``audit_prune`` (:meth:`AuditOps.prune_audit`)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

from ..rows import AuditRow
from .base import StoreCore
from .dialect import marks
from .migrations import prune_ddl

AUDIT_COLUMNS = ("seq", "at", "kind", "decision_id", "scope_key", "level", "action", "source", "reason", "detail")
_SELECT = f"SELECT {', '.join(AUDIT_COLUMNS)} FROM audit"


def audit_row(r: Sequence) -> AuditRow:
    """An audit row read in :data:`AUDIT_COLUMNS` order, its ``detail`` decoded."""
    return {"seq": r[0], "at": r[1], "kind": r[2], "decision_id": r[3], "scope_key": r[4], "level": r[5],
            "action": r[6], "source": r[7], "reason": r[8], "detail": json.loads(r[9])}


class AuditOps(StoreCore):
    """The audit's reads, counts and prunes."""

    _AUDIT_COLUMNS = AUDIT_COLUMNS

    def audit_log(self, limit: int = 50, kinds: tuple[str, ...] | None = None) -> list[AuditRow]:
        """The newest ``limit`` audit rows, newest first."""
        q = _SELECT
        args: list = []
        if kinds:
            q += f" WHERE kind IN ({marks(len(kinds))})"
            args.extend(kinds)
        q += " ORDER BY seq DESC LIMIT ?"
        args.append(limit)
        return [audit_row(r) for r in self._read(q, args)]

    def audit_count(self, kind: str) -> int:
        """How many audit rows of ``kind`` the audit holds (the refused-alert bound counts
        ``ignored``). Raises StoreError."""
        return int(self._read("SELECT COUNT(*) FROM audit WHERE kind = ?", (kind,))[0][0])

    def audit_through(self, before: float) -> int:
        """The highest audit ``seq`` of a row older than ``before`` (Unix seconds); 0 when none."""
        return int(self._read("SELECT COALESCE(MAX(seq), 0) FROM audit WHERE at < ?", (before,))[0][0])

    def audit_rows(self, through: int, batch: int = 1000) -> Iterator[AuditRow]:
        """Audit rows with ``seq`` <= ``through``, oldest first, read ``batch`` at a time: dicts as
        :meth:`audit_log` gives them."""
        after = 0
        while True:
            rows = self._read(_SELECT + " WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?", (after, through, batch))
            for r in rows:
                yield audit_row(r)
            if len(rows) < batch:
                return
            after = rows[-1][0]

    def prune_audit(self, through: int, rows: int, sha256: str, export: str, at: float) -> int:
        """Delete the audit rows with ``seq`` <= ``through``, which an export holds (``rows`` of
        them, the file's ``sha256``, its name ``export``). In one transaction: a row of the
        append-only table ``audit_prune`` records the prune, the audit gets a ``pruned`` row saying
        the same, and only then may the rows go: the audit's delete trigger lets a row be deleted
        only when its ``seq`` is at or below a recorded prune's ``through_seq`` (UPDATE, and on
        PostgreSQL TRUNCATE, stay refused). Returns the rows deleted.

        Raises:
            StoreError: the database refused; nothing was deleted.
            ValueError: the audit holds a different number of rows up to ``through`` than the
                export (a prune meanwhile): nothing was deleted.
        """
        with self._transaction():
            self._allow_recorded_prunes()
            have = int(self._rows("SELECT COUNT(*) FROM audit WHERE seq <= ?", (through,))[0][0])
            if have != rows:
                raise ValueError(f"the audit holds {have} rows up to seq {through}, the export {rows}: "
                                 "nothing deleted -- export again")
            self._run("INSERT INTO audit_prune (at, through_seq, row_count, sha256, export) VALUES (?, ?, ?, ?, ?)",
                      (at, through, rows, sha256, export))
            self._audit_rows([{"at": at, "kind": "pruned", "source": "retention",
                               "reason": f"{rows} audit rows up to seq {through} pruned after their export to {export}",
                               "detail": {"through_seq": through, "rows": rows, "sha256": sha256, "export": export}}])
            return self._run("DELETE FROM audit WHERE seq <= ?", (through,))

    def _allow_recorded_prunes(self) -> None:
        """Create ``audit_prune`` and make the audit's delete trigger let through the rows a recorded
        prune covers (idempotent; in the caller's transaction)."""
        for sql in prune_ddl(self.sql):
            self._run(sql)
