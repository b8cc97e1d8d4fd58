"""The PostgreSQL store (:class:`PgStore`, psycopg 3): any number of replicas share it; changes
and migrations are serialised by locks on the server, leases are on the server's clock."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

from .dialect import POSTGRESQL
from .errors import NO_STORE_HINT, NoStoreError, StoreError, store_label
from .health import local_clock
from .sqlite import Store

log = logging.getLogger("fusebox.fuse")

# The PostgreSQL advisory lock key of every change and of the migrations ("fusebox" in ASCII).
_PG_LOCK = 0x66757365626F78
# How often a PostgreSQL store measures again how far the host's clock is from the server's, seconds.
CLOCK_REFRESH_S = 5.0


class PgStore(Store):
    """PostgreSQL store (psycopg 3): any number of replicas share it. One connection per store,
    opened again after the server went away (every call meanwhile raises StoreError: the webhook
    answers 503 and Alertmanager retries). Changes are serialised across replicas by a
    transaction-scoped advisory lock; the migrations by the same lock."""

    dialect = "postgresql"
    sql = POSTGRESQL

    def __init__(self, url: str, connect_timeout_s: float = 3.0, existing: bool = False):
        self.url = url
        self.path = store_label(url)  # what logs and errors may show: no password
        self.connect_timeout_s = connect_timeout_s
        self._init_state(self.path)
        self._db = None
        self._offset, self._offset_at = 0.0, local_clock()
        self._offset_busy = threading.Event()
        try:
            self._connect()
            if existing and not self._rows("SELECT to_regclass('schema_version') IS NOT NULL")[0][0]:
                self._db.close()
                raise NoStoreError(f"no fuse store at {self.path} (a database without the fuse's schema) "
                                   f"{NO_STORE_HINT}")
            self._migrate()
            self._offset_busy.set()
            self._measure_offset()  # before the first clock() a caller reads
        except self._errors() as e:
            raise StoreError(f"{store_label(url)}: {e}".strip()) from e

    # ----------------------------------------------------------------- the server's clock
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
                probe = self._probe_conn()
                t0 = local_clock()
                server = float(probe.execute(self._NOW).fetchone()[0])
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

    # ----------------------------------------------------------------- the connection
    def _connect(self) -> None:
        import psycopg

        self._db = psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, int(self.connect_timeout_s)),
                                   application_name="fusebox-fuse")

    def _conn(self) -> Any:
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
