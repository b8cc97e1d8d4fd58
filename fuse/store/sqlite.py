"""The SQLite store (:class:`Store`): one file, one replica; and the file's care: created private
(mode 0600, its folder 0700), its WAL bounded, its ``-shm`` index allocated at open.

The file is ``fuse.sqlite`` in ``--state-dir`` (:data:`STATE_FILE`, :func:`default_state_dir`) or
the path of a ``sqlite:///path`` URL; WAL journal, ``synchronous=FULL``.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .audit_log import AuditOps
from .errors import NO_STORE_HINT, NoStoreError, StoreError, store_label
from .outbox import AdapterStateOps, OutboxOps

log = logging.getLogger("fusebox.fuse")

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

STATE_FILE = "fuse.sqlite"  # the SQLite file inside --state-dir (its -wal and -shm files sit beside it)


def default_state_dir() -> Path:
    """The user's data directory for fusebox, as the XDG Base Directory spec places it:
    ``$XDG_DATA_HOME/fusebox`` when that is an absolute path, else ``~/.local/share/fusebox``."""
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "fusebox"


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


def _reserve_shm(shm: str) -> int | None:
    """Allocate the first :data:`SHM_RESERVE_BYTES` of SQLite's ``-shm`` file (created by the WAL
    connection just opened), so its mmap never touches a page the volume cannot back (SIGBUS).

    Returns the open file descriptor, which the caller must keep open until every SQLite
    connection of this process to the store is closed: POSIX record locks (fcntl) belong to the
    process, and closing ANY descriptor of a file drops all of them. Closed at once, it dropped
    the shared "dead man switch" lock SQLite holds on the -shm file; the next process to open the
    store (a ``fusebox fuse audit``, a test's reader) then took it for the first, truncated the
    -shm under this process's mmap, and the server died of SIGBUS (exit -7). None for a missing
    file (another journal mode). Raises StoreError naming the file and the cause (no space, a
    quota, not writable)."""
    try:
        fd = os.open(shm, os.O_RDWR)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StoreError(f"{shm}: SQLite's shared-memory file cannot be opened for writing ({e.strerror}): the "
                         "store needs it writable -- fix its owner and mode, or the volume") from None
    try:
        if os.fstat(fd).st_blocks * 512 < SHM_RESERVE_BYTES:
            os.posix_fallocate(fd, 0, SHM_RESERVE_BYTES)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate: SQLite's own writes
            return fd
        os.close(fd)  # the caller closes its connection next: no lock of SQLite's is left to keep
        raise StoreError(f"{shm}: SQLite's shared-memory file cannot be given {SHM_RESERVE_BYTES // 1024} KiB "
                         f"({e.strerror}): writing through its mmap would stop the process with SIGBUS -- free "
                         "space on the store's volume (or raise its quota) and start again") from None
    return fd


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


class Store(OutboxOps, AuditOps, AdapterStateOps):
    """SQLite store (one replica); thread-safe (one connection under a lock).

    Raises StoreError (or ``sqlite3.Error`` from reads) when the file cannot be opened or migrated.
    """

    def __init__(self, path: str | Path, existing: bool = False):
        self.path = str(path)
        self.url = self.path if self.path == ":memory:" else f"sqlite:///{os.path.abspath(self.path)}"
        if existing and (not os.path.isfile(self.path) or not _sqlite_has_schema(self.path)):
            raise NoStoreError(f"no fuse store at {self.path} {NO_STORE_HINT}")
        if self.path != ":memory:":
            _private_folder(Path(self.path).parent)
            _create_private(self.path)
        self._init_state(store_label(self.url))
        self._connect()
        self._migrate()

    def _connect(self) -> None:
        self._db: Any = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=5.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        _bound_wal(self._db)
        self._shm_fd: int | None = None
        if self.path != ":memory:":
            self._db.execute("SELECT count(*) FROM sqlite_master").fetchall()  # a read makes the -shm file
            try:
                self._shm_fd = _reserve_shm(self.path + "-shm")
            except StoreError:
                self._db.close()
                raise

    def _errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def _begin_exclusive(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def _begin(self) -> None:
        self._begin_exclusive()  # SQLite: one writer at a time anyway

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

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._db.close()
        with self._probe_lock:
            if self._probe is not None:
                self._probe.close()
        if self._shm_fd is not None:  # last: closing it drops this process's locks on the -shm file
            os.close(self._shm_fd)
            self._shm_fd = None

    def free_bytes(self) -> int | None:
        """Bytes free (to this process) on the volume of the SQLite file; None for a database
        without a file of ours (in memory, PostgreSQL: its disk is the server's)."""
        if self.dialect != "sqlite" or self.path == ":memory:":
            return None
        st = os.statvfs(os.path.dirname(os.path.abspath(self.path)))
        return st.f_bavail * st.f_frsize

    def _connect_probe(self) -> Any:
        if self.path == ":memory:":
            return None
        return _bound_wal(sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=1.0))
