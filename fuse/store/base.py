"""The logic both databases share: :class:`StoreCore` (transactions, the breaker's state, readiness,
migrations) over a few hooks each database implements (:class:`~.sqlite.Store`,
:class:`~.postgres.PgStore`), and :class:`Head`, what a change reads under its lock.

Statements are written once with ``?`` placeholders; the hooks ``_rows``, ``_run`` and ``_many``
run them on the database's driver (:attr:`StoreCore.sql`, a :class:`~.dialect.Dialect`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..logsafe import redact_urls
from ..rows import AuditRecord, QueuedCall
from ..rules import scope_key
from .dialect import SQLITE, Dialect, upsert
from .errors import StoreError, store_label
from .health import Health, now
from .migrations import SCHEMA_VERSION_DDL, steps

log = logging.getLogger("fusebox.fuse")

# Every PURGE_EVERY versions, rows of removed scopes and fingerprints (value NULL) older than
# PURGE_EVERY versions are deleted; a replica that far behind reads the whole state again.
PURGE_EVERY = 1000

_STATE_UPSERT = upsert("breaker_state", ("kind", "key", "value", "version"), ("kind", "key"), ("value", "version"))
_META_UPSERT = upsert("meta", ("key", "value"), ("key",), ("value",))


def purge_every() -> int:
    """:data:`PURGE_EVERY` as the package ``fusebox.fuse.store`` holds it now (a test lowers it there)."""
    package = sys.modules.get(__package__ or "")
    return int(getattr(package, "PURGE_EVERY", PURGE_EVERY))


@dataclass(frozen=True)
class Head:
    """What :meth:`Store.change` read under its lock: the state's ``version`` (0: never written) and
    what changed since the caller's version: ``rows`` (``(kind, key, value)``, value None: gone),
    or, when the caller is too far behind (or gave no version), the whole ``snapshot``. Both None
    when ``version`` is the caller's."""

    version: int
    snapshot: dict | None
    rows: list | None = None


def dumps(value: Any) -> str:
    """``value`` as compact JSON (no spaces), as the store writes it."""
    return json.dumps(value, separators=(",", ":"))


def _redacted(text: str | None) -> str | None:
    return redact_urls(text) if isinstance(text, str) else text


class StoreCore:
    """What both stores share; the hooks below raise NotImplementedError here and are each
    database's (:class:`~.sqlite.Store`, :class:`~.postgres.PgStore`)."""

    dialect = "sqlite"
    sql: Dialect = SQLITE
    url: str
    _db: Any

    def _init_state(self, label: str) -> None:
        """The locks and flags of a store not yet connected; :attr:`health` under ``label``."""
        self._lock = threading.RLock()
        self._in_change = False
        self._probe: Any = None  # ping()'s own connection
        self._probe_lock = threading.Lock()
        self._closed = False
        self.health = Health(label)

    # ----------------------------------------------------------------- hooks
    def _errors(self) -> tuple[type[BaseException], ...]:
        """The driver's errors (a failed statement, a lost connection)."""
        raise NotImplementedError

    def _begin_exclusive(self) -> None:
        """Begin a transaction holding the lock that serialises the breaker's changes."""
        raise NotImplementedError

    def _begin(self) -> None:
        """Begin a transaction (without that lock where the database allows it)."""
        raise NotImplementedError

    def _rows(self, sql: str, args: Sequence = ()) -> list[tuple]:
        """The rows ``sql`` (``?`` placeholders) returns."""
        raise NotImplementedError

    def _run(self, sql: str, args: Sequence = ()) -> int:
        """Run ``sql``; the rows it changed."""
        raise NotImplementedError

    def _many(self, sql: str, rows: list[tuple]) -> None:
        """Run ``sql`` once per row of ``rows`` (nothing when empty)."""
        raise NotImplementedError

    def _in_transaction(self) -> bool:
        raise NotImplementedError

    def _lost(self) -> None:
        """The connection failed: drop it if it is gone (it is opened again on the next call)."""
        raise NotImplementedError

    def _connect_probe(self) -> Any:
        """A second connection for :meth:`ping` and :meth:`probe_write`; None where there is none."""
        raise NotImplementedError

    def _q(self, sql: str) -> str:
        return self.sql.q(sql)

    # ----------------------------------------------------------------- migrations
    def _migrate(self) -> None:
        todo = steps(self.sql)
        newest = max(todo)
        with self._transaction():
            self._run(SCHEMA_VERSION_DDL)
            have = self._rows("SELECT max(version) FROM schema_version")[0][0] or 0
            for v in sorted(todo):
                if v <= have:
                    continue
                for sql in todo[v]:
                    if " " in sql:
                        self._run(sql)
                    else:  # a step in Python, the same on both databases
                        getattr(self, "_migrate_" + sql)()
                self._run("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (v, now()))
                log.info("%s: schema migrated to version %d", store_label(self.url), v)
            if have > newest:
                raise StoreError(f"{store_label(self.url)}: schema version {have} is newer than this fusebox's "
                                 f"({newest}) -- run the newer fusebox, or a copy of the older data")

    def _migrate_split_snapshot(self) -> None:
        """Migration 5: the whole-state snapshot (``meta.breaker``) becomes one row per scope and per
        resolved fingerprint, at the current version (keys recomputed from the labels, as
        :meth:`Breaker.restore` does); the snapshot is removed."""
        row = self._rows("SELECT value FROM meta WHERE key='breaker'")
        if not row:
            return
        snap = json.loads(row[0][0])
        v = max(1, self._version())
        rows = [("s", scope_key(sc["labels"]), dumps(sc), v) for sc in snap.get("scopes", {}).values()]
        rows += [("r", fp, json.dumps(t), v) for fp, t in snap.get("resolved", {}).items()]
        self._many(_STATE_UPSERT, rows)
        self._set_meta("breaker_version", str(v))
        self._run("DELETE FROM meta WHERE key='breaker'")

    def schema_version(self) -> int:
        with self._lock:
            return self._rows("SELECT max(version) FROM schema_version")[0][0] or 0

    # ----------------------------------------------------------------- readiness
    def _probe_conn(self) -> Any:
        """The probe's connection (under ``_probe_lock``), opened when missing; None where there is
        none (an in-memory database, a closed store)."""
        if self._probe is None and not self._closed:
            self._probe = self._connect_probe()
        return self._probe

    def ping(self) -> None:
        """Answer a read (the pending actions' count) on a connection of its own, not the one a change
        holds: ``/readyz`` answers while a long change runs. Raises what the database raises (a closed
        store: its driver's error); a lost connection is opened again on the next call."""
        with self._probe_lock:
            probe = self._probe_conn()
            if probe is None:  # an in-memory database has no second connection
                self.pending_count()
                return
            try:
                probe.execute("SELECT count(*) FROM outbox WHERE status='pending'").fetchall()
            except self._errors() as e:
                self._probe_lost(e, write=False)
                raise
        self.health.ok(write=False)

    def probe_write(self) -> None:
        """Whether the store can write now (a full disk fails writes while reads answer):
        ``meta.write_probe`` (the time) written and committed on the probe connection. Success ends
        an outage a failed write began (:attr:`health`). Raises what the database raises."""
        with self._probe_lock:
            probe = self._probe_conn()
            try:
                if probe is None:  # an in-memory database: its one connection
                    self.commit(None, ())
                else:
                    probe.execute(self._q(_META_UPSERT), ("write_probe", f"{now():.3f}"))
            except self._errors() as e:
                self._probe_lost(e, write=True)
                raise
        self.health.ok(write=True)

    def pending_count(self) -> int:
        raise NotImplementedError

    def _probe_lost(self, e: BaseException, write: bool) -> None:
        self.health.failed(e, write=write)
        if not self._closed:
            with contextlib.suppress(Exception):
                self._probe.close()
            self._probe = None

    # ----------------------------------------------------------------- transactions
    @contextlib.contextmanager
    def _transaction(self, exclusive: bool = True, begin: Callable[[], None] | None = None) -> Iterator[None]:
        """One exclusive transaction under the lock. Whatever fails inside it (a database error,
        which becomes StoreError, or any other exception, such as a value the database cannot bind,
        raised as is) rolls it back in ``finally``: nothing of a failed change is kept, and no
        transaction is left open to make the next one fail. Inside :meth:`change`, it joins that one.
        ``exclusive=False``: without the lock that serialises the breaker's changes (on PostgreSQL;
        the outbox's rows are locked one by one)."""
        with self._lock:
            if self._in_change:
                yield
                return
            done = False
            try:
                if begin is not None:
                    begin()
                elif exclusive:
                    self._begin_exclusive()
                else:
                    self._begin()
                yield
                self._run("COMMIT")
                done = True
                self.health.ok(write=True)
            except self._errors() as e:
                self._lost()
                self.health.failed(e, write=True)
                raise StoreError(f"{store_label(self.url)}: {e}".strip()) from e
            finally:
                if not done:
                    self._rollback()

    def _rollback(self) -> None:
        try:
            if self._in_transaction():
                self._run("ROLLBACK")
        except self._errors():
            self._lost()
            log.warning("%s: rollback failed", store_label(self.url), exc_info=True)

    @contextlib.contextmanager
    def change(self, known_version: int | None = None) -> Iterator[Head]:
        """An exclusive transaction for one change of the breaker: yields the :class:`Head` read under
        the lock (its snapshot only when ``version`` differs from ``known_version``); :meth:`commit`
        calls inside it join it; it commits on leaving, rolls back on an exception.

        Raises StoreError (nothing kept)."""
        got: list[int] = []
        with self._lock, self._transaction(begin=lambda: got.append(self._begin_change())):
            v = got[0]
            snap, rows = None, None
            if v != known_version:
                if known_version is None or known_version < self._horizon():
                    snap = self._snapshot()
                else:
                    rows = self._rows_since(known_version, v)
            self._in_change = True
            try:
                yield Head(v, snap, rows)
            finally:
                self._in_change = False

    def _begin_change(self) -> int:
        """Begin :meth:`change`'s transaction, holding the lock that serialises changes; the state's
        version as committed by the previous holder."""
        self._begin_exclusive()
        return self._version()

    def _version(self) -> int:
        row = self._rows("SELECT value FROM meta WHERE key='breaker_version'")
        return int(row[0][0]) if row else 0

    def version(self) -> int:
        """How many times the breaker state was written (0: never). Raises StoreError."""
        with self._lock:
            try:
                v = self._version()
                self.health.ok(write=False)
                return v
            except self._errors() as e:
                raise self._read_error(e) from e

    # ----------------------------------------------------------------- writes
    def commit(self, snapshot: dict | None, outbox: Iterable[QueuedCall] = (), audit: Iterable[AuditRecord] = (), *,
               changes: Sequence[tuple] | None = None) -> None:
        """Write the breaker's state (its version goes up by one), outbox rows ``(decision_id,
        adapter, call, received[, idem_key])`` (:data:`~fusebox.fuse.rows.QueuedCall`; the call
        stored as :meth:`ControlCall.to_json`'s JSON) and audit rows in one transaction (or in the
        :meth:`change` around it). A row whose ``(idem_key, adapter)`` is already queued is left out.

        The state: ``changes``, the rows a change touched (``(kind, key, value)``, value None: gone;
        :meth:`fusebox.fuse.intake.breaker.Breaker.changes`), which is what the service writes, or a whole
        ``snapshot`` (:meth:`Breaker.snapshot`), which replaces every row. Neither: the state is
        left as it is, its version too.

        Raises:
            StoreError: when the database cannot write; nothing of the change is kept.
            UnicodeEncodeError: a text value SQLite cannot bind (a lone surrogate); nothing is kept.
        """
        with self._transaction():
            if snapshot is not None or changes:
                self._write_state(snapshot, list(changes or ()))
            self._many(
                "INSERT INTO outbox (decision_id, adapter, payload, received, idem_key) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                [(r[0], r[1], dumps(r[2].to_json()), r[3], r[4] if len(r) > 4 else r[0]) for r in outbox])
            self._audit_rows(audit)

    def _write_state(self, snapshot: dict | None, rows: list[tuple]) -> None:
        """:meth:`commit`'s state: ``rows`` (or the whole ``snapshot``) at the next version; every
        :func:`purge_every` versions the rows of what is gone, older than any replica still reads,
        are deleted."""
        v = self._version() + 1
        if snapshot is not None:
            self._run("UPDATE breaker_state SET value = NULL, version = ? WHERE value IS NOT NULL", (v,))
            rows = [("s", k, sc) for k, sc in snapshot.get("scopes", {}).items()]
            rows += [("r", fp, t) for fp, t in snapshot.get("resolved", {}).items()]
        self._many(_STATE_UPSERT, [(kind, key, None if val is None else dumps(val), v) for kind, key, val in rows])
        self._set_meta("breaker_version", str(v))
        every = purge_every()
        if v % every == 0:
            self._run("DELETE FROM breaker_state WHERE value IS NULL AND version <= ?", (v - every,))
            self._set_meta("state_horizon", str(v - every))

    def _set_meta(self, key: str, value: str) -> None:
        self._run(_META_UPSERT, (key, value))

    def _audit_rows(self, rows: Iterable[AuditRecord]) -> None:
        """Insert audit rows; URL credentials in the reason and the detail are left out (redact_urls)."""
        cols = ("at", "kind", "decision_id", "scope_key", "level", "action", "source")
        self._many(
            "INSERT INTO audit (at, kind, decision_id, scope_key, level, action, source, reason, detail) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(*(r.get(c) for c in cols), _redacted(r.get("reason")), redact_urls(dumps(r.get("detail", {}))))
             for r in rows])

    def audit(self, row: AuditRecord) -> None:
        self.commit(None, (), [row])

    # ----------------------------------------------------------------- reads
    def _read(self, sql: str, args: Sequence = ()) -> list[tuple]:
        with self._lock:
            if self._in_change or self.dialect == "sqlite":
                return self._rows(sql, args)
            try:
                rows = self._rows(sql, args)
            except self._errors() as e:
                raise self._read_error(e) from e
        self.health.ok(write=False)
        return rows

    def _read_error(self, e: BaseException) -> StoreError:
        """A read failed with ``e``: the connection is dropped if lost, :attr:`health` told."""
        self._lost()
        self.health.failed(e, write=False)
        return StoreError(f"{store_label(self.url)}: {e}")

    def snapshot(self) -> dict | None:
        """The breaker's whole state as :meth:`Breaker.snapshot` gives it; None when never written."""
        with self._lock:
            if self._in_change or self.dialect == "sqlite":
                return self._snapshot()
            try:
                return self._snapshot()
            except self._errors() as e:
                raise self._read_error(e) from e

    def _snapshot(self) -> dict | None:
        if not self._version():
            return None
        snap: dict = {"version": 1, "scopes": {}, "resolved": {}}
        for kind, key, value in self._rows("SELECT kind, key, value FROM breaker_state WHERE value IS NOT NULL"):
            snap["scopes" if kind == "s" else "resolved"][key] = json.loads(value)
        return snap

    def _horizon(self) -> int:
        row = self._rows("SELECT value FROM meta WHERE key='state_horizon'")
        return int(row[0][0]) if row else 0

    def _rows_since(self, known: int, upto: int) -> list[tuple]:
        return [(kind, key, None if value is None else json.loads(value)) for kind, key, value in self._rows(
            "SELECT kind, key, value FROM breaker_state WHERE version > ? AND version <= ? ORDER BY version",
            (known, upto))]

    def changes_since(self, known: int) -> tuple[int, list | None, dict | None]:
        """What changed since version ``known``: ``(version, rows, snapshot)``, rows ``(kind, key,
        value)`` (value None: gone), or, when ``known`` is older than the purged rows, the whole
        ``snapshot`` (rows None). Reads only the rows written since. Raises StoreError."""
        with self._lock:
            try:
                v = self._version()
                if v == known:
                    return v, [], None
                if known < self._horizon() or known > v:
                    return v, None, self._snapshot()
                return v, self._rows_since(known, v), None
            except self._errors() as e:
                raise self._read_error(e) from e

    def state_rows(self) -> int:
        """How many rows hold the breaker's state (removed ones included until purged)."""
        return self._read("SELECT count(*) FROM breaker_state")[0][0]
