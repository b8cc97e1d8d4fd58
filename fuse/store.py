"""Persistence: the breaker's state, an outbox of actions to apply, an append-only audit log.

One interface, two databases (:func:`open_store` picks by URL):

* :class:`Store` -- SQLite, one file (``fuse.sqlite`` in ``--state-dir``, or ``sqlite:///path``), WAL
  journal, ``synchronous=FULL``; one replica. A new file is created with mode 0600 (its -wal and -shm
  files follow it).
* :class:`PgStore` -- PostgreSQL (``postgresql://user@host:port/db``, psycopg 3); any number of
  replicas share it.

A decision is on disk, with the actions it needs, before the webhook answers 200, so a crash or
restart loses none and repeats none. Every change of the breaker runs in one *exclusive* transaction
(:meth:`Store.change`: SQLite ``BEGIN IMMEDIATE``; PostgreSQL ``SELECT ... FOR UPDATE`` of the
``breaker_version`` row), which reads
the state's ``version`` first: a replica whose copy is older takes back what changed since its
version before deciding, so two replicas never decide the same thing twice. Tables (schema version 5):

* ``schema_version(version, applied_at)``: the migrations applied (:data:`SCHEMA_VERSION` the
  newest); run at start-up, idempotent, safe when replicas start together (under the same lock).
* ``meta(key, value)``: ``breaker_version`` = how many times the breaker's state was written (its
  row's lock serialises the changes on PostgreSQL; migrations take an advisory lock),
  ``state_horizon`` = the version below which rows of removed scopes were purged (a replica older
  than that reads the whole state again). Before version 5, ``breaker`` held the whole state as one
  JSON snapshot, rewritten on every change.
* ``breaker_state(kind, key, value, version)``: the breaker's state, one row per scope (kind ``s``,
  key the scope key, value its JSON) and per resolved fingerprint (kind ``r``, value ``[startsAt,
  seen]``); a change writes only the rows it touched, with the new ``version``; a removed scope or
  fingerprint keeps its row with value NULL for a while, so that other replicas learn it is gone
  (:meth:`Store.changes_since`).
* ``outbox(seq, decision_id, adapter, payload, received, status, attempts, last_error, applied_at,
  idem_key, claimed_by, lease_until, claim_gen)``: one row per decision and adapter; ``status`` is
  ``pending``, ``applied`` or ``failed`` (given up, see :mod:`fusebox.fuse.actions`). ``idem_key``
  (unique with ``adapter``) names the decision by what it changes: ``trip|release``, scope, level and
  the trip's time, so the same change is never queued twice. A replica *claims* a row before it
  calls the adapter (:meth:`Store.claim`: ``claimed_by``, ``lease_until`` in Unix seconds); others
  leave it alone until the lease ends, then take it over (its claimer died). Every claim adds one
  to ``claim_gen`` (the *fencing token*): a result is recorded (:meth:`Store.mark_applied`,
  ``mark_given_up``, ``mark_failed``) only by the replica that holds the row's latest claim, so a
  replica whose call outlived its lease cannot record it over the one that took the row over.
  Leases are on the database's clock with PostgreSQL (:meth:`Store.now`), the host's with SQLite.
* ``audit(seq, at, kind, decision_id, scope_key, level, action, source, reason, detail)``: append-only
  (triggers reject UPDATE and DELETE; on PostgreSQL TRUNCATE too). Retention
  (:meth:`Store.prune_audit`, ``fusebox fuse audit prune``): rows leave it only after their export,
  through a prune recorded in the append-only ``audit_prune(seq, at, through_seq, row_count, sha256,
  export)`` and in a ``pruned`` audit row; from the first prune on, the delete trigger lets a row go
  only when a recorded prune covers its ``seq``.
* ``adapter_state(adapter, worker, holds, settings)``: what the spec's adapters keep between calls
  (:mod:`fusebox.fuse.adapters`), shared by every replica: per adapter (``<kind>:<name>``) and
  worker (a worker URL, an HAProxy ``<backend>/<server>`` or ``map <backend>``), ``holds`` = the
  JSON list of the (action, scope) holding it out, ``settings`` = the JSON object of the settings
  recorded when it was taken out (SGLang's priority, cost...). :meth:`Store.adapter_hold` changes a
  hold under the row's lock (``SELECT ... FOR UPDATE`` on PostgreSQL).

Errors: :class:`StoreError` when the database cannot be written or reached (disk full, locked, the
server down): a retry may help. :attr:`Store.health` (:class:`Health`) follows whether it answers,
logging one line when it is lost and one when it is back; :meth:`Store.ping`,
:meth:`Store.probe_write` and :meth:`Store.free_bytes` serve ``/readyz``. SQLite's WAL is
checkpointed every :data:`WAL_AUTOCHECKPOINT_PAGES` pages and cut back to :data:`WAL_LIMIT_BYTES`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import sqlite3
import stat
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .logsafe import redact_url, redact_urls
from .rows import AuditRecord, AuditRow, OutboxEntry, OutboxRow

__all__ = ["Store", "PgStore", "StoreError", "NoStoreError", "Head", "Health", "open_store", "SCHEMA_VERSION", "store_label",
           "WAL_AUTOCHECKPOINT_PAGES", "WAL_LIMIT_BYTES", "HEADROOM_BYTES"]

log = logging.getLogger("fusebox.fuse")

SCHEMA_VERSION = 6
# Every PURGE_EVERY versions, rows of removed scopes and fingerprints (value NULL) older than
# PURGE_EVERY versions are deleted; a replica that far behind reads the whole state again.
PURGE_EVERY = 1000
# The PostgreSQL advisory lock key of every change and of the migrations ("fusebox" in ASCII).
_PG_LOCK = 0x66757365626F78

# SQLite's WAL: checkpointed every WAL_AUTOCHECKPOINT_PAGES pages (SQLite's default, 1000 pages,
# let it reach 4 MB and fill a 2 MB volume), and cut back to WAL_LIMIT_BYTES when it is
# reset after a checkpoint (PRAGMA journal_size_limit; SQLite's default keeps it at its largest).
WAL_AUTOCHECKPOINT_PAGES = 64
WAL_LIMIT_BYTES = 256 * 1024
# SQLite's shared-memory WAL index (the ``-shm`` file beside the store) is used through mmap: a page
# of it the volume cannot back (full, a quota) stops the process with SIGBUS, no log line. So its
# first 128 KiB (four 32 KiB regions: an index of 16,384 WAL frames, 64 MiB of WAL, far past the
# bound above) are allocated at open, and a volume that cannot give them stops the start with a
# StoreError naming the file. The serve command also enables faulthandler (fuse/cli.py), so a
# SIGBUS that still comes prints "Fatal Python error: Bus error" and the traceback.
SHM_RESERVE_BYTES = 128 * 1024
# Free space the SQLite file's volume must have for /readyz (Store.free_bytes): more than a
# notification of a few alerts writes, so that a volume with room for less, where writes fail or
# are about to, is not called ready (nor ready again between two failed writes).
HEADROOM_BYTES = 64 * 1024

_COLUMNS = ("seq", "decision_id", "adapter", "payload", "received", "attempts", "claimed_by", "lease_until")

# Migrations: version -> statements, per dialect. Version 1 is the schema of fusebox before
# migrations were versioned (its tables exist in older files; CREATE ... IF NOT EXISTS keeps them).
_SQLITE = {
    1: ["CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE IF NOT EXISTS outbox (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  decision_id TEXT NOT NULL, adapter TEXT NOT NULL, payload TEXT NOT NULL,
  received REAL NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
  attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, applied_at REAL,
  UNIQUE (decision_id, adapter))""",
        "CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (status, seq)",
        """CREATE TABLE IF NOT EXISTS audit (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, kind TEXT NOT NULL,
  decision_id TEXT, scope_key TEXT, level INTEGER, action TEXT, source TEXT, reason TEXT,
  detail TEXT NOT NULL DEFAULT '{}')""",
        """CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
  BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END""",
        """CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
  BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END"""],
    2: ["ALTER TABLE outbox ADD COLUMN idem_key TEXT",
        "ALTER TABLE outbox ADD COLUMN claimed_by TEXT",
        "ALTER TABLE outbox ADD COLUMN lease_until REAL",
        "UPDATE outbox SET idem_key = decision_id",
        "CREATE UNIQUE INDEX outbox_idem ON outbox (idem_key, adapter)"],
    3: ["INSERT INTO meta (key, value) VALUES ('breaker_version', '0') ON CONFLICT (key) DO NOTHING"],
    # what the adapters keep (holds, recorded worker settings), shared by the replicas
    4: ["""CREATE TABLE adapter_state (
  adapter TEXT NOT NULL, worker TEXT NOT NULL, holds TEXT NOT NULL DEFAULT '[]', settings TEXT NOT NULL DEFAULT '{}',
  PRIMARY KEY (adapter, worker))"""],
    # the breaker's state per scope and per resolved fingerprint, written per change
    5: ["""CREATE TABLE breaker_state (
  kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT, version INTEGER NOT NULL, PRIMARY KEY (kind, key))""",
        "CREATE INDEX breaker_state_version ON breaker_state (version)",
        "INSERT INTO meta (key, value) VALUES ('state_horizon', '0') ON CONFLICT (key) DO NOTHING",
        "split_snapshot"],
    # the fencing token of a claim (a stale claimer had recorded a second "applied")
    6: ["ALTER TABLE outbox ADD COLUMN claim_gen INTEGER NOT NULL DEFAULT 0"],
}
_PG = {
    1: ["CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE IF NOT EXISTS outbox (
  seq BIGSERIAL PRIMARY KEY,
  decision_id TEXT NOT NULL, adapter TEXT NOT NULL, payload TEXT NOT NULL,
  received DOUBLE PRECISION NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
  attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, applied_at DOUBLE PRECISION,
  UNIQUE (decision_id, adapter))""",
        "CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (status, seq)",
        """CREATE TABLE IF NOT EXISTS audit (
  seq BIGSERIAL PRIMARY KEY, at DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL,
  decision_id TEXT, scope_key TEXT, level INTEGER, action TEXT, source TEXT, reason TEXT,
  detail TEXT NOT NULL DEFAULT '{}')""",
        """CREATE OR REPLACE FUNCTION fusebox_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$""",
        """CREATE TRIGGER audit_no_change BEFORE UPDATE OR DELETE ON audit
  FOR EACH ROW EXECUTE FUNCTION fusebox_audit_append_only()""",
        """CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
  FOR EACH STATEMENT EXECUTE FUNCTION fusebox_audit_append_only()"""],
    2: ["ALTER TABLE outbox ADD COLUMN idem_key TEXT",
        "ALTER TABLE outbox ADD COLUMN claimed_by TEXT",
        "ALTER TABLE outbox ADD COLUMN lease_until DOUBLE PRECISION",
        "UPDATE outbox SET idem_key = decision_id",
        "CREATE UNIQUE INDEX outbox_idem ON outbox (idem_key, adapter)"],
    # the row whose lock serialises the changes (PgStore._begin_change)
    3: ["INSERT INTO meta (key, value) VALUES ('breaker_version', '0') ON CONFLICT (key) DO NOTHING"],
    # what the adapters keep (holds, recorded worker settings), shared by the replicas
    4: ["""CREATE TABLE adapter_state (
  adapter TEXT NOT NULL, worker TEXT NOT NULL, holds TEXT NOT NULL DEFAULT '[]', settings TEXT NOT NULL DEFAULT '{}',
  PRIMARY KEY (adapter, worker))"""],
    # the breaker's state per scope and per resolved fingerprint, written per change
    5: ["""CREATE TABLE breaker_state (
  kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT, version BIGINT NOT NULL, PRIMARY KEY (kind, key))""",
        "CREATE INDEX breaker_state_version ON breaker_state (version)",
        "INSERT INTO meta (key, value) VALUES ('state_horizon', '0') ON CONFLICT (key) DO NOTHING",
        "split_snapshot"],
    # the fencing token of a claim (a stale claimer had recorded a second "applied")
    6: ["ALTER TABLE outbox ADD COLUMN claim_gen BIGINT NOT NULL DEFAULT 0"],
}

# How often a PostgreSQL store measures again how far the host's clock is from the server's, seconds.
CLOCK_REFRESH_S = 5.0


def local_clock() -> float:
    """This host's wall clock, Unix seconds."""
    import time

    return time.time()


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


def _private_folder(folder: Path) -> None:
    """Create ``folder`` (and its parents) when missing, the folder itself mode 0700 whatever the
    umask, as ``--state-dir`` makes its own: the store beside it is private."""
    if not folder.exists():
        folder.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)


def _bound_wal(db: sqlite3.Connection) -> sqlite3.Connection:
    """Bound the WAL that writes on ``db`` make (the settings are per connection)."""
    db.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
    db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
    return db


def _reserve_shm(shm: str) -> None:
    """Allocate the first :data:`SHM_RESERVE_BYTES` of SQLite's ``-shm`` file (created by the WAL
    connection just opened), so its mmap never touches a page the volume cannot back (SIGBUS).
    A missing file (another journal mode) is left alone. Raises StoreError naming the file and
    the cause (no space, a quota, not writable)."""
    try:
        fd = os.open(shm, os.O_RDWR)
    except FileNotFoundError:
        return
    except OSError as e:
        raise StoreError(f"{shm}: SQLite's shared-memory file cannot be opened for writing ({e.strerror}): the "
                         "store needs it writable -- fix its owner and mode, or the volume") from None
    try:
        if os.fstat(fd).st_blocks * 512 < SHM_RESERVE_BYTES:
            os.posix_fallocate(fd, 0, SHM_RESERVE_BYTES)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate: SQLite's own writes
            return
        raise StoreError(f"{shm}: SQLite's shared-memory file cannot be given {SHM_RESERVE_BYTES // 1024} KiB "
                         f"({e.strerror}): writing through its mmap would stop the process with SIGBUS -- free "
                         "space on the store's volume (or raise its quota) and start again") from None
    finally:
        os.close(fd)


class StoreError(RuntimeError):
    """The database could not be written or reached (disk full, locked, read-only, the server
    down): a retry may help."""


class NoStoreError(StoreError):
    """A command that reads an existing store (``fusebox fuse audit``) found none where it was
    pointed: no SQLite file there, or a database without the fuse's schema. Nothing was created."""


class Health:
    """Whether the database answers, as the store's own calls see it: one log line when it is lost
    (ERROR, with the error) and one when it is back (WARNING, with how long it was lost and how many
    calls failed meanwhile), nothing in between (not 6,600 lines a minute while PostgreSQL is
    down). Thread-safe.

    Attributes:
        down_since: Unix seconds of the first failure of this outage; None while the store answers.
        error: the first failure's text (no password).
        write_failed: the last write failed and none succeeded since (a full disk fails writes while
            reads still answer; only a successful write clears it: :meth:`Store.probe_write`).
        failures: calls failed in this outage.
    """

    def __init__(self, label: str):
        self.label = label
        self.down_since: float | None = None
        self.error = ""
        self.write_failed = False
        self.failures = 0
        self._lock = threading.Lock()

    def failed(self, e: BaseException, write: bool) -> None:
        """A call (a write when ``write``) failed with ``e``."""
        with self._lock:
            self.failures += 1
            self.write_failed = self.write_failed or write
            if self.down_since is not None:
                return
            self.down_since, self.error = _now(), f"{type(e).__name__}: {e}".strip()[:500]
        log.error("store %s lost (%s failed): %s -- webhooks answer 503, /readyz is false, loops back off; "
                  "one line when it is back", self.label, "a write" if write else "a read", self.error)

    def ok(self, write: bool) -> None:
        """A call (a write when ``write``) succeeded. A read does not end an outage a write began."""
        if self.down_since is None or (self.write_failed and not write):
            return
        with self._lock:
            if self.down_since is None or (self.write_failed and not write):
                return
            took, n = _now() - self.down_since, self.failures
            self.down_since, self.error, self.write_failed, self.failures = None, "", False, 0
        log.warning("store %s back after %.1fs (%d failed call(s) meanwhile)", self.label, took, n)


@dataclass(frozen=True)
class Head:
    """What :meth:`Store.change` read under its lock: the state's ``version`` (0: never written) and
    what changed since the caller's version: ``rows`` (``(kind, key, value)``, value None: gone),
    or, when the caller is too far behind (or gave no version), the whole ``snapshot``. Both None
    when ``version`` is the caller's."""

    version: int
    snapshot: dict | None
    rows: list | None = None


STATE_FILE = "fuse.sqlite"  # the SQLite file inside --state-dir (its -wal and -shm files sit beside it)


def default_state_dir() -> Path:
    """The user's data directory for fusebox, as the XDG Base Directory spec places it:
    ``$XDG_DATA_HOME/fusebox`` when that is an absolute path, else ``~/.local/share/fusebox``."""
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "fusebox"


def store_label(url: str) -> str:
    """``url`` without its password, for logs, errors, ``/readyz`` and the start-up line: a URL as
    :func:`fusebox.fuse.logsafe.redact_url` (``postgresql://user:PASSWORD@host/db`` -> ``user@host``,
    ``?password=`` -> ``?password=***``); a libpq key/value string (``host=... password=...``) has
    its ``password`` value hidden."""
    if "://" not in url:
        return re.sub(r"(?i)\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S*)", "password=***", url) if "=" in url else url
    return redact_url(url)


def open_store(url: str, existing: bool = False) -> Store:
    """The store a ``--store`` URL names: ``sqlite:///abs/path`` (or ``sqlite:////abs/path``),
    ``sqlite://rel/path`` or a plain path
    (SQLite), ``postgresql://`` / ``postgres://`` (PostgreSQL). ``existing``: open a store that is
    already there only (its file, its schema), never create one.

    Raises:
        ValueError: another scheme.
        NoStoreError: ``existing`` and no fuse store there (nothing created).
        StoreError: the database cannot be opened or migrated.
    """
    if url.startswith(("postgresql://", "postgres://")):
        return PgStore(url, existing=existing)
    if url.startswith("sqlite://"):
        path = url[len("sqlite://"):]
        path = "/" + path.lstrip("/") if path.startswith("/") else path  # sqlite:////abs as SQLAlchemy writes it too
        return Store(path, existing=existing)
    if "://" in url:
        raise ValueError(f"--store {store_label(url)}: unknown scheme -- use sqlite:///path/fuse.sqlite or "
                         "postgresql://user@host:port/db")
    return Store(url, existing=existing)


_NO_STORE_HINT = "-- check --store/--state/--state-dir"


def _sqlite_has_schema(path: str) -> bool:
    """Whether the SQLite file ``path`` (which exists) holds the fuse's schema, read without
    writing to it (an empty or foreign file stays as it is)."""
    db = sqlite3.connect(Path(os.path.abspath(path)).as_uri() + "?mode=ro", uri=True)
    try:
        return bool(db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'")
                    .fetchall())
    except sqlite3.DatabaseError:  # not a database at all
        return False
    finally:
        db.close()


class Store:
    """SQLite store (one replica); thread-safe (one connection under a lock).

    Raises StoreError (or ``sqlite3.Error`` from reads) when the file cannot be opened or migrated.
    """

    dialect = "sqlite"
    _migrations = _SQLITE
    _claim_suffix = ""
    _row_lock = ""

    def __init__(self, path: str | Path, existing: bool = False):
        self.path = str(path)
        self.url = self.path if self.path == ":memory:" else f"sqlite:///{os.path.abspath(self.path)}"
        if existing and (not os.path.isfile(self.path) or not _sqlite_has_schema(self.path)):
            raise NoStoreError(f"no fuse store at {self.path} {_NO_STORE_HINT}")
        if self.path != ":memory:":
            _private_folder(Path(self.path).parent)
            _create_private(self.path)
        self._lock = threading.RLock()
        self._in_change = False
        self._probe: Any = None  # ping()'s own connection
        self._probe_lock = threading.Lock()
        self._closed = False
        self.health = Health(store_label(self.url))
        self._connect()
        self._migrate()

    # ----------------------------------------------------------------- dialect
    def _connect(self) -> None:
        self._db: Any = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=5.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        _bound_wal(self._db)
        if self.path != ":memory:":
            self._db.execute("SELECT count(*) FROM sqlite_master").fetchall()  # a read makes the -shm file
            _reserve_shm(self.path + "-shm")

    def _errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def _begin_exclusive(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def _begin(self) -> None:
        self._begin_exclusive()  # SQLite: one writer at a time anyway

    def _q(self, sql: str) -> str:
        return sql

    def _rows(self, sql: str, args: Sequence = ()) -> list[tuple]:
        return self._db.execute(self._q(sql), tuple(args)).fetchall()

    def _run(self, sql: str, args: Sequence = ()) -> int:
        return self._db.execute(self._q(sql), tuple(args)).rowcount

    def _many(self, sql: str, rows: list[tuple]) -> None:
        if rows:
            self._db.executemany(self._q(sql), rows)

    def _in_transaction(self) -> bool:
        return self._db.in_transaction

    def _lost(self) -> None:
        """The connection failed: SQLite keeps its file open (nothing to do)."""

    def _migrate(self) -> None:
        with self._transaction():
            self._run("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)")
            have = self._rows("SELECT max(version) FROM schema_version")[0][0] or 0
            for v in sorted(self._migrations):
                if v <= have:
                    continue
                for sql in self._migrations[v]:
                    if " " in sql:
                        self._run(sql)
                    else:  # a step in Python, the same on both databases
                        getattr(self, "_migrate_" + sql)()
                self._run("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (v, _now()))
                log.info("%s: schema migrated to version %d", store_label(self.url), v)
            if have > max(self._migrations):
                raise StoreError(f"{store_label(self.url)}: schema version {have} is newer than this fusebox's "
                                 f"({max(self._migrations)}) -- run the newer fusebox, or a copy of the older data")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._db.close()
        with self._probe_lock:
            if self._probe is not None:
                self._probe.close()

    # ----------------------------------------------------------------- readiness
    def ping(self) -> None:
        """Answer a read (the pending actions' count) on a connection of its own, not the one a change
        holds: ``/readyz`` answers while a long change runs. Raises what the database raises (a closed
        store: its driver's error); a lost connection is opened again on the next call."""
        with self._probe_lock:
            if self._probe is None and not self._closed:
                self._probe = self._connect_probe()
            if self._probe is None:  # an in-memory database has no second connection
                self.pending_count()
                return
            try:
                self._probe.execute("SELECT count(*) FROM outbox WHERE status='pending'").fetchall()
            except self._errors() as e:
                self._probe_lost(e, write=False)
                raise
        self.health.ok(write=False)

    def probe_write(self) -> None:
        """Whether the store can write now (a full disk fails writes while reads answer):
        ``meta.write_probe`` (the time) written and committed on the probe connection. Success ends
        an outage a failed write began (:attr:`health`). Raises what the database raises."""
        sql = ("INSERT INTO meta (key, value) VALUES ('write_probe', ?) "
               "ON CONFLICT (key) DO UPDATE SET value = excluded.value")
        with self._probe_lock:
            if self._probe is None and not self._closed:
                self._probe = self._connect_probe()
            try:
                if self._probe is None:  # an in-memory database: its one connection
                    self.commit(None, ())
                else:
                    self._probe.execute(self._q(sql), (f"{_now():.3f}",))
            except self._errors() as e:
                self._probe_lost(e, write=True)
                raise
        self.health.ok(write=True)

    def free_bytes(self) -> int | None:
        """Bytes free (to this process) on the volume of the SQLite file; None for a database
        without a file of ours (in memory, PostgreSQL: its disk is the server's)."""
        if self.dialect != "sqlite" or self.path == ":memory:":
            return None
        st = os.statvfs(os.path.dirname(os.path.abspath(self.path)))
        return st.f_bavail * st.f_frsize

    def _probe_lost(self, e: BaseException, write: bool) -> None:
        self.health.failed(e, write=write)
        if not self._closed:
            with contextlib.suppress(Exception):
                self._probe.close()
            self._probe = None

    def _connect_probe(self) -> Any:
        if self.path == ":memory:":
            return None
        return _bound_wal(sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=1.0))

    def schema_version(self) -> int:
        with self._lock:
            return self._rows("SELECT max(version) FROM schema_version")[0][0] or 0

    # ----------------------------------------------------------------- transactions
    @contextlib.contextmanager
    def _transaction(self, exclusive: bool = True, begin=None) -> Iterator[None]:
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
    def commit(self, snapshot: dict | None, outbox: Iterable[tuple] = (), audit: Iterable[AuditRecord] = (), *,
               changes: Sequence[tuple] | None = None) -> None:
        """Write the breaker's state (its version goes up by one), outbox rows ``(decision_id,
        adapter, payload, received[, idem_key])`` and audit rows in one transaction (or in the
        :meth:`change` around it). A row whose ``(idem_key, adapter)`` is already queued is left out.

        The state: ``changes``, the rows a change touched (``(kind, key, value)``, value None: gone;
        :meth:`fusebox.fuse.breaker.Breaker.changes`), which is what the service writes, or a whole
        ``snapshot`` (:meth:`Breaker.snapshot`), which replaces every row. Neither: the state is
        left as it is, its version too.

        Raises:
            StoreError: when the database cannot write; nothing of the change is kept.
            UnicodeEncodeError: a text value SQLite cannot bind (a lone surrogate); nothing is kept.
        """
        with self._transaction():
            if snapshot is not None or changes:
                v = self._version() + 1
                rows = list(changes or ())
                if snapshot is not None:
                    self._run("UPDATE breaker_state SET value = NULL, version = ? WHERE value IS NOT NULL", (v,))
                    rows = [("s", k, sc) for k, sc in snapshot.get("scopes", {}).items()]
                    rows += [("r", fp, t) for fp, t in snapshot.get("resolved", {}).items()]
                self._many("INSERT INTO breaker_state (kind, key, value, version) VALUES (?, ?, ?, ?) "
                           "ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value, version = excluded.version",
                           [(kind, key, None if val is None else json.dumps(val, separators=(",", ":")), v)
                            for kind, key, val in rows])
                self._set_meta("breaker_version", str(v))
                if v % PURGE_EVERY == 0:  # rows of what is gone, older than any replica still reads
                    self._run("DELETE FROM breaker_state WHERE value IS NULL AND version <= ?", (v - PURGE_EVERY,))
                    self._set_meta("state_horizon", str(v - PURGE_EVERY))
            self._many(
                "INSERT INTO outbox (decision_id, adapter, payload, received, idem_key) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                [(r[0], r[1], json.dumps(r[2], separators=(",", ":")), r[3], r[4] if len(r) > 4 else r[0])
                 for r in outbox])
            self._audit_rows(audit)

    def _set_meta(self, key: str, value: str) -> None:
        self._run("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                  (key, value))

    def _migrate_split_snapshot(self) -> None:
        """Migration 5: the whole-state snapshot (``meta.breaker``) becomes one row per scope and per
        resolved fingerprint, at the current version (keys recomputed from the labels, as
        :meth:`Breaker.restore` does); the snapshot is removed."""
        from .rules import scope_key

        row = self._rows("SELECT value FROM meta WHERE key='breaker'")
        if not row:
            return
        snap = json.loads(row[0][0])
        v = max(1, self._version())
        rows = [("s", scope_key(sc["labels"]), json.dumps(sc, separators=(",", ":")), v)
                for sc in snap.get("scopes", {}).values()]
        rows += [("r", fp, json.dumps(t), v) for fp, t in snap.get("resolved", {}).items()]
        self._many("INSERT INTO breaker_state (kind, key, value, version) VALUES (?, ?, ?, ?) "
                   "ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value, version = excluded.version", rows)
        self._set_meta("breaker_version", str(v))
        self._run("DELETE FROM meta WHERE key='breaker'")

    def _audit_rows(self, rows: Iterable[AuditRecord]) -> None:
        """Insert audit rows; URL credentials in the reason and the detail are left out (redact_urls)."""
        cols = ("at", "kind", "decision_id", "scope_key", "level", "action", "source")
        self._many(
            "INSERT INTO audit (at, kind, decision_id, scope_key, level, action, source, reason, detail) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(*(r.get(c) for c in cols), _redacted(r.get("reason")),
              redact_urls(json.dumps(r.get("detail", {}), separators=(",", ":")))) for r in rows])

    def audit(self, row: AuditRecord) -> None:
        self.commit(None, (), [row])

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
                "SELECT seq FROM outbox WHERE seq IN ({}) AND status='pending' "
                "AND (lease_until IS NULL OR lease_until <= ? OR claimed_by = ?) ORDER BY seq{}".format(",".join("?" * len(seqs)), self._claim_suffix),
                (*seqs, now, owner))]
            if not got:
                return {}
            marks = ",".join("?" * len(got))
            self._run(f"UPDATE outbox SET claimed_by = ?, lease_until = ?, claim_gen = claim_gen + 1 WHERE seq IN ({marks})", (owner, now + lease_s, *got))
            return dict(self._rows(f"SELECT seq, claim_gen FROM outbox WHERE seq IN ({marks})", got))

    def release_claims(self, owner: str, keep: Iterable[int] = ()) -> int:
        """Give up the claims ``owner`` holds on pending rows (but those in ``keep``: a call still under
        way), so another replica takes them at once rather than after the lease; their fencing
        tokens move on. Returns how many. Raises StoreError."""
        keep = list(keep)
        sql = ("UPDATE outbox SET claimed_by = NULL, lease_until = NULL, claim_gen = claim_gen + 1 "
               "WHERE status='pending' AND claimed_by = ?")
        if keep:
            sql += " AND seq NOT IN ({})".format(",".join("?" * len(keep)))
        with self._transaction(exclusive=False):
            return self._run(sql, (owner, *keep))

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

    # ----------------------------------------------------------------- adapters' state
    def adapter_hold(self, adapter: str, worker: str, hold: str, on: bool) -> bool:
        """Add (``on``) or drop ``hold`` on ``worker`` of ``adapter`` in one transaction (the row
        locked on PostgreSQL, so replicas do not lose each other's holds); returns whether anything
        still holds it. Its recorded settings stay. Raises StoreError."""
        key = (adapter, worker)
        with self._transaction(exclusive=False):
            self._run("INSERT INTO adapter_state (adapter, worker) VALUES (?, ?) ON CONFLICT (adapter, worker) DO NOTHING", key)
            row = self._rows("SELECT holds FROM adapter_state WHERE adapter=? AND worker=?" + self._row_lock, key)
            cur = set(json.loads(row[0][0]))
            cur = cur | {hold} if on else cur - {hold}
            self._run("UPDATE adapter_state SET holds=? WHERE adapter=? AND worker=?", (json.dumps(sorted(cur)), *key))
        return bool(cur)

    def adapter_record(self, adapter: str, worker: str, settings: dict) -> None:
        """Record ``settings`` (JSON-able) of ``worker`` of ``adapter``, replacing earlier ones. Raises StoreError."""
        with self._transaction(exclusive=False):
            self._run("INSERT INTO adapter_state (adapter, worker, settings) VALUES (?, ?, ?) "
                      "ON CONFLICT (adapter, worker) DO UPDATE SET settings = excluded.settings",
                      (adapter, worker, json.dumps(settings, sort_keys=True)))

    def adapter_state(self, adapter: str) -> dict[str, dict]:
        """``{worker: {"holds": [...], "settings": {...}}}`` of ``adapter``."""
        rows = self._read("SELECT worker, holds, settings FROM adapter_state WHERE adapter=? ORDER BY worker", (adapter,))
        return {w: {"holds": json.loads(h), "settings": json.loads(st)} for w, h, st in rows}

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

    def pending(self, adapter: str, limit: int | None = None) -> list[OutboxRow]:
        """The pending rows of ``adapter``, oldest first (the first ``limit``; None: all): ``{"seq",
        "decision_id", "adapter", "payload", "received", "attempts", "claimed_by", "lease_until"}``.
        Raises StoreError or sqlite3.Error when the database cannot be read."""
        q = "SELECT {} FROM outbox WHERE status='pending' AND adapter=? ORDER BY seq".format(", ".join(_COLUMNS))
        args: tuple = (adapter,)
        if limit is not None:
            q, args = q + " LIMIT ?", (adapter, limit)
        rows = self._read(q, args)
        return [{"seq": r[0], "decision_id": r[1], "adapter": r[2], "payload": json.loads(r[3]), "received": r[4],
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
            q += " AND adapter IN ({})".format(",".join("?" * len(args)))
        return self._read(q, args)[0][0]

    def pending_count(self) -> int:
        return self._read("SELECT count(*) FROM outbox WHERE status='pending'")[0][0]

    def outbox(self) -> list[OutboxEntry]:
        """Every outbox row, oldest first (:class:`~fusebox.fuse.rows.OutboxEntry`: no payload)."""
        rows = self._read("SELECT seq, decision_id, adapter, status, attempts, last_error, claimed_by, idem_key "
                          "FROM outbox ORDER BY seq")
        return [{"seq": r[0], "decision_id": r[1], "adapter": r[2], "status": r[3], "attempts": r[4],
                 "last_error": r[5], "claimed_by": r[6], "idem_key": r[7]} for r in rows]

    def audit_log(self, limit: int = 50, kinds: tuple[str, ...] | None = None) -> list[AuditRow]:
        """The newest ``limit`` audit rows, newest first."""
        q = f"SELECT {', '.join(self._AUDIT_COLUMNS)} FROM audit"
        args: list = []
        if kinds:
            q += " WHERE kind IN ({})".format(",".join("?" * len(kinds)))
            args.extend(kinds)
        q += " ORDER BY seq DESC LIMIT ?"
        args.append(limit)
        return [_audit_row(r) for r in self._read(q, args)]


    # ----------------------------------------------------------------- audit retention
    _AUDIT_COLUMNS = ("seq", "at", "kind", "decision_id", "scope_key", "level", "action", "source", "reason", "detail")

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
            rows = self._read(f"SELECT {', '.join(self._AUDIT_COLUMNS)} FROM audit WHERE seq > ? AND seq <= ? "
                              "ORDER BY seq LIMIT ?", (after, through, batch))
            for r in rows:
                yield _audit_row(r)
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

    _PRUNE_DDL = [
        """CREATE TABLE IF NOT EXISTS audit_prune (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, through_seq INTEGER NOT NULL, row_count INTEGER NOT NULL,
  sha256 TEXT NOT NULL, export TEXT NOT NULL)""",
        """CREATE TRIGGER IF NOT EXISTS audit_prune_no_change BEFORE UPDATE ON audit_prune
  BEGIN SELECT RAISE(ABORT, 'the audit prune log is append-only'); END""",
        """CREATE TRIGGER IF NOT EXISTS audit_prune_no_delete BEFORE DELETE ON audit_prune
  BEGIN SELECT RAISE(ABORT, 'the audit prune log is append-only'); END""",
        "DROP TRIGGER IF EXISTS audit_no_delete",
        """CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
  WHEN OLD.seq > (SELECT COALESCE(MAX(through_seq), 0) FROM audit_prune)
  BEGIN SELECT RAISE(ABORT, 'the audit log is append-only: rows leave it only through a recorded prune'); END""",
    ]

    def _allow_recorded_prunes(self) -> None:
        """Create ``audit_prune`` and make the audit's delete trigger let through the rows a recorded
        prune covers (idempotent; in the caller's transaction)."""
        for sql in self._PRUNE_DDL:
            self._run(sql)


class PgStore(Store):
    """PostgreSQL store (psycopg 3): any number of replicas share it. One connection per store,
    opened again after the server went away (every call meanwhile raises StoreError: the webhook
    answers 503 and Alertmanager retries). Changes are serialised across replicas by a
    transaction-scoped advisory lock; the migrations by the same lock."""

    dialect = "postgresql"
    _migrations = _PG
    _claim_suffix = " FOR UPDATE SKIP LOCKED"
    _row_lock = " FOR UPDATE"

    def __init__(self, url: str, connect_timeout_s: float = 3.0, existing: bool = False):
        self.url = url
        self.path = store_label(url)  # what logs and errors may show: no password
        self.connect_timeout_s = connect_timeout_s
        self._lock = threading.RLock()
        self._in_change = False
        self._probe: Any = None
        self._probe_lock = threading.Lock()
        self._closed = False
        self.health = Health(self.path)
        self._db = None
        self._offset, self._offset_at = 0.0, local_clock()
        self._offset_busy = threading.Event()
        try:
            self._connect()
            if existing and not self._rows("SELECT to_regclass('schema_version') IS NOT NULL")[0][0]:
                self._db.close()
                raise NoStoreError(f"no fuse store at {self.path} (a database without the fuse's schema) "
                                   f"{_NO_STORE_HINT}")
            self._migrate()
            self._offset_busy.set()
            self._measure_offset()  # before the first clock() a caller reads
        except self._errors() as e:
            raise StoreError(f"{store_label(url)}: {e}".strip()) from e

    _NOW = "SELECT extract(epoch from clock_timestamp())::float8"

    def now(self) -> float:
        """The database server's clock, Unix seconds (``clock_timestamp()``): every replica's leases
        and holds are on it, whatever each host's clock says. Raises StoreError."""
        return float(self._read(self._NOW)[0][0])

    def _claim_now(self) -> float:
        return float(self._rows(self._NOW)[0][0])

    def clock(self) -> float:
        """The server's clock without a round trip: this host's clock plus the offset to the server's,
        measured (half the round trip allowed for) at start and every CLOCK_REFRESH_S after, in a
        thread of its own on the probe's connection, so no caller waits for it; while the server
        cannot be reached, the last offset measured."""
        local = local_clock()
        if local - self._offset_at >= CLOCK_REFRESH_S and not self._offset_busy.is_set():
            self._offset_at = local
            self._offset_busy.set()
            threading.Thread(target=self._measure_offset, name="fuse-pg-clock", daemon=True).start()
        return local + self._offset

    def _measure_offset(self) -> None:
        try:
            with self._probe_lock:
                if self._probe is None and not self._closed:
                    self._probe = self._connect_probe()
                t0 = local_clock()
                server = float(self._probe.execute(self._NOW).fetchone()[0])
                t1 = local_clock()
            self._offset = server - (t0 + t1) / 2
        except Exception as e:  # the server down: keep the last offset (the webhook answers 503 anyway)
            log.debug("clock offset not measured: %s", e)
            with self._probe_lock, contextlib.suppress(Exception):
                if self._probe is not None and not self._closed:
                    self._probe.close()
                    self._probe = None
        finally:
            self._offset_busy.clear()

    def _connect(self) -> None:
        import psycopg

        self._db = psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, int(self.connect_timeout_s)),
                                   application_name="fusebox-fuse")

    def _conn(self):
        if self._db is None or self._db.closed or self._db.broken:
            self._lost()
            self._connect()
        return self._db

    def _errors(self) -> tuple[type[BaseException], ...]:
        import psycopg

        return (psycopg.Error,)

    def _begin_exclusive(self) -> None:
        self._run("BEGIN")
        self._run("SELECT pg_advisory_xact_lock(?)", (_PG_LOCK,))

    def _begin(self) -> None:
        self._run("BEGIN")

    def _begin_change(self) -> int:
        # One round trip: the version row's lock serialises the changes (of every replica), and
        # SELECT ... FOR UPDATE returns the row as the previous holder committed it (READ COMMITTED
        # re-reads a row it waited for), so the version read is never older than the lock.
        cur = self._conn().execute("BEGIN; SELECT value FROM meta WHERE key = 'breaker_version' FOR UPDATE")
        cur.nextset()
        row = cur.fetchone()
        if row is None:  # written by migration 3; absent only if someone deleted it
            raise StoreError(f"{store_label(self.url)}: meta.breaker_version is missing -- restore it: "
                             "INSERT INTO meta VALUES ('breaker_version', '0')")
        return int(row[0])

    def _q(self, sql: str) -> str:
        return sql.replace("%", "%%").replace("?", "%s")

    def _rows(self, sql: str, args: Sequence = ()) -> list[tuple]:
        return self._conn().execute(self._q(sql), tuple(args), prepare=False).fetchall()

    def _run(self, sql: str, args: Sequence = ()) -> int:
        cur = self._conn().execute(self._q(sql), tuple(args) or None, prepare=False)
        return cur.rowcount

    def _many(self, sql: str, rows: list[tuple]) -> None:
        if rows:
            with self._conn().cursor() as cur:
                cur.executemany(self._q(sql), rows)

    def _in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return (self._db is not None and not self._db.closed
                and self._db.info.transaction_status != TransactionStatus.IDLE)

    def _lost(self) -> None:
        if self._db is not None and (self._db.closed or self._db.broken):
            with contextlib.suppress(Exception):
                self._db.close()
            self._db = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._db is not None:
                self._db.close()
        with self._probe_lock:
            if self._probe is not None:
                self._probe.close()

    def _connect_probe(self) -> Any:
        import psycopg

        return psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, int(self.connect_timeout_s)),
                               application_name="fusebox-fuse-probe")

    _PRUNE_DDL = [
        """CREATE TABLE IF NOT EXISTS audit_prune (
  seq BIGSERIAL PRIMARY KEY, at DOUBLE PRECISION NOT NULL, through_seq BIGINT NOT NULL, row_count BIGINT NOT NULL,
  sha256 TEXT NOT NULL, export TEXT NOT NULL)""",
        # one function for every trigger of both tables: only a DELETE of audit rows a recorded
        # prune covers passes; UPDATE, TRUNCATE and any change of audit_prune raise
        """CREATE OR REPLACE FUNCTION fusebox_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN
    IF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'audit'
       AND OLD.seq <= (SELECT COALESCE(MAX(through_seq), 0) FROM audit_prune) THEN
      RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit log is append-only: rows leave it only through a recorded prune';
  END $$""",
        """CREATE OR REPLACE TRIGGER audit_prune_no_change BEFORE UPDATE OR DELETE ON audit_prune
  FOR EACH ROW EXECUTE FUNCTION fusebox_audit_append_only()""",
        """CREATE OR REPLACE TRIGGER audit_prune_no_truncate BEFORE TRUNCATE ON audit_prune
  FOR EACH STATEMENT EXECUTE FUNCTION fusebox_audit_append_only()""",
    ]


def _audit_row(r: Sequence) -> AuditRow:
    """An audit row read in :attr:`Store._AUDIT_COLUMNS` order, its ``detail`` decoded."""
    return {"seq": r[0], "at": r[1], "kind": r[2], "decision_id": r[3], "scope_key": r[4], "level": r[5],
            "action": r[6], "source": r[7], "reason": r[8], "detail": json.loads(r[9])}


def _redacted(text: str | None) -> str | None:
    return redact_urls(text) if isinstance(text, str) else text


def _now() -> float:
    import time

    return time.time()
