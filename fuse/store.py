"""SQLite persistence: the breaker's state, an outbox of actions to apply, an append-only audit log.

One file (``fuse.sqlite`` in ``--state-dir``, or ``--state PATH``), WAL journal, ``synchronous=FULL``: a decision is on disk, with the
actions it needs, before the webhook answers 200, so a crash or restart loses none and repeats
none. Tables:

* ``meta(key, value)``: ``breaker`` = the JSON snapshot of :class:`fusebox.fuse.breaker.Breaker`.
* ``outbox(seq, decision_id, adapter, payload, received, status, attempts, last_error, applied_at)``:
  one row per decision and adapter; ``status`` is ``pending``, ``applied`` or ``failed`` (given up,
  see :mod:`fusebox.fuse.actions`). Rows of one adapter and one scope are applied in ``seq`` order;
  rows of other adapters or scopes do not wait for them.
* ``audit(seq, at, kind, decision_id, scope_key, level, action, source, reason, detail)``:
  triggers reject UPDATE and DELETE, so the log can only grow.

A new file is created with mode 0600 (its -wal and -shm files follow it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Iterable, Optional

__all__ = ["Store", "StoreError"]

log = logging.getLogger("fusebox.fuse")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  decision_id TEXT NOT NULL, adapter TEXT NOT NULL, payload TEXT NOT NULL,
  received REAL NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
  attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, applied_at REAL,
  UNIQUE (decision_id, adapter));
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (status, seq);
CREATE TABLE IF NOT EXISTS audit (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, kind TEXT NOT NULL,
  decision_id TEXT, scope_key TEXT, level INTEGER, action TEXT, source TEXT, reason TEXT,
  detail TEXT NOT NULL DEFAULT '{}');
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
  BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
  BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
"""


def _create_private(path: str) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (SQLite gives its -wal and -shm
    files the database file's mode); warn when an existing one is readable by group or others.
    The audit holds override reasons, token names and the gateway's answers."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        if mode & 0o044:
            log.warning("%s is readable by group or others (mode %04o); chmod 600 it", path, mode)


class StoreError(RuntimeError):
    """The database could not be written (disk full, locked, read-only): a retry may help."""


class Store:
    """Thread-safe wrapper around one SQLite connection."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            _create_private(self.path)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=5.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ----------------------------------------------------------------- writes
    def commit(self, snapshot: Optional[dict], outbox: Iterable[tuple[str, str, dict, float]] = (),
               audit: Iterable[dict] = ()) -> None:
        """Write a breaker snapshot, outbox rows ``(decision_id, adapter, payload, received)``
        and audit rows in one transaction.

        Raises:
            StoreError: when SQLite cannot write; nothing of the change is kept.
            UnicodeEncodeError: a text value SQLite cannot bind (a lone surrogate); nothing is kept.
        """
        with self._transaction():
            if snapshot is not None:
                self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('breaker', ?)",
                                 (json.dumps(snapshot, separators=(",", ":")),))
            self._db.executemany(
                "INSERT OR IGNORE INTO outbox (decision_id, adapter, payload, received) VALUES (?, ?, ?, ?)",
                [(d, a, json.dumps(p, separators=(",", ":")), r) for d, a, p, r in outbox])
            self._audit_rows(audit)

    @contextlib.contextmanager
    def _transaction(self):
        """One IMMEDIATE transaction under the lock. Whatever fails inside it (an SQLite error, which
        becomes StoreError, or any other exception, such as a value SQLite cannot bind, raised as is)
        rolls it back in ``finally``: nothing of a failed change is kept, and no transaction is left
        open to make the next one fail ("cannot start a transaction within a transaction")."""
        with self._lock:
            done = False
            try:
                self._db.execute("BEGIN IMMEDIATE")
                yield
                self._db.execute("COMMIT")
                done = True
            except sqlite3.Error as e:
                raise StoreError(f"{self.path}: {e}") from e
            finally:
                if not done and self._db.in_transaction:
                    try:
                        self._db.execute("ROLLBACK")
                    except sqlite3.Error:
                        log.exception("%s: rollback failed", self.path)

    def _audit_rows(self, rows: Iterable[dict]) -> None:
        self._db.executemany(
            "INSERT INTO audit (at, kind, decision_id, scope_key, level, action, source, reason, detail) "
            "VALUES (:at, :kind, :decision_id, :scope_key, :level, :action, :source, :reason, :detail)",
            [{"decision_id": None, "scope_key": None, "level": None, "action": None, "source": None,
              "reason": None, **r, "detail": json.dumps(r.get("detail", {}), separators=(",", ":"))} for r in rows])

    def audit(self, row: dict) -> None:
        self.commit(None, (), [row])

    def _finish(self, sql: str, args: tuple, audit: dict) -> None:
        with self._transaction():
            self._db.execute(sql, args)
            self._audit_rows([audit])

    def mark_applied(self, seq: int, at: float, audit: dict) -> None:
        """Outbox row ``seq`` applied at ``at`` (Unix s), with its audit row, in one transaction.

        Raises StoreError (nothing written)."""
        self._finish("UPDATE outbox SET status='applied', applied_at=?, attempts=attempts+1 WHERE seq=?",
                     (at, seq), audit)

    def mark_given_up(self, seq: int, error: str, audit: dict) -> None:
        """Outbox row ``seq`` will not be retried (status ``failed``), with its audit row.

        Raises StoreError (nothing written)."""
        self._finish("UPDATE outbox SET status='failed', attempts=attempts+1, last_error=? WHERE seq=?",
                     (error[:500], seq), audit)

    def mark_failed(self, seq: int, error: str) -> None:
        """One more failed attempt of row ``seq`` (still pending). Raises StoreError."""
        with self._lock:
            try:
                self._db.execute("UPDATE outbox SET attempts=attempts+1, last_error=? WHERE seq=?", (error[:500], seq))
            except sqlite3.Error as e:
                raise StoreError(f"{self.path}: {e}") from e

    # ----------------------------------------------------------------- reads
    def snapshot(self) -> Optional[dict]:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key='breaker'").fetchone()
        return json.loads(row[0]) if row else None

    def pending(self, adapter: str) -> list[dict]:
        """The pending rows of ``adapter``, oldest first: ``{"seq", "decision_id", "adapter", "payload",
        "received", "attempts"}``. Raises sqlite3.Error when the database cannot be read."""
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, decision_id, adapter, payload, received, attempts FROM outbox "
                "WHERE status='pending' AND adapter=? ORDER BY seq", (adapter,)).fetchall()
        return [{"seq": r[0], "decision_id": r[1], "adapter": r[2], "payload": json.loads(r[3]),
                 "received": r[4], "attempts": r[5]} for r in rows]

    def pending_by_adapter(self) -> dict[str, int]:
        """``{adapter: number of pending rows}``."""
        with self._lock:
            rows = self._db.execute("SELECT adapter, count(*) FROM outbox WHERE status='pending' GROUP BY adapter")
            return dict(rows.fetchall())

    def oldest_pending_received(self, adapters: Optional[Iterable[str]] = None) -> Optional[float]:
        """``received`` (Unix s) of the oldest pending row (of ``adapters`` when given); None if none."""
        q, args = "SELECT min(received) FROM outbox WHERE status='pending'", []
        if adapters is not None:
            args = list(adapters)
            q += " AND adapter IN (%s)" % ",".join("?" * len(args))
        with self._lock:
            return self._db.execute(q, args).fetchone()[0]

    def pending_count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM outbox WHERE status='pending'").fetchone()[0]

    def outbox(self) -> list[dict]:
        with self._lock:
            rows = self._db.execute("SELECT seq, decision_id, adapter, status, attempts, last_error FROM outbox ORDER BY seq").fetchall()
        return [dict(zip(("seq", "decision_id", "adapter", "status", "attempts", "last_error"), r)) for r in rows]

    def audit_log(self, limit: int = 50, kinds: Optional[tuple[str, ...]] = None) -> list[dict]:
        """The newest ``limit`` audit rows, newest first."""
        q = "SELECT seq, at, kind, decision_id, scope_key, level, action, source, reason, detail FROM audit"
        args: list = []
        if kinds:
            q += " WHERE kind IN (%s)" % ",".join("?" * len(kinds))
            args.extend(kinds)
        q += " ORDER BY seq DESC LIMIT ?"
        args.append(limit)
        with self._lock:
            rows = self._db.execute(q, args).fetchall()
        cols = ("seq", "at", "kind", "decision_id", "scope_key", "level", "action", "source", "reason", "detail")
        out = []
        for r in rows:
            d = dict(zip(cols, r))
            d["detail"] = json.loads(d["detail"])
            out.append(d)
        return out
