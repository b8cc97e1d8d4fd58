"""``fusebox fuse audit export|prune``: the audit log's retention, an export before any pruning.

* ``export --before TIME --out FILE``: the audit rows older than TIME, oldest first, one JSON
  object per line (``seq``, ``at``, ``kind``, ``decision_id``, ``scope_key``, ``level``,
  ``action``, ``source``, ``reason``, ``detail``) into FILE (created; an existing file is refused).
  Nothing changes in the store.
* ``prune --before TIME --export FILE``: the same export, written whole and synced to disk
  (``FILE.partial`` renamed to FILE), then, in one transaction, the prune recorded (table
  ``audit_prune``: the last ``seq``, the row count, the file's SHA-256 and name; a ``pruned`` audit
  row saying the same) and those rows deleted (:meth:`fusebox.fuse.store.Store.prune_audit`). A
  prune that fails leaves the rows and the export; a prune is never done without its export.

TIME: RFC 3339 (``2026-01-01T00:00:00Z``), Unix seconds, or ``<N>d`` (N days before now). The
store: ``--store URL`` (``sqlite:///path/fuse.sqlite`` or ``postgresql://...``), else env
``FUSEBOX_FUSE_STORE``, else the default state directory's ``fuse.sqlite``: an existing store
only (a SQLite file with the fuse's schema, a PostgreSQL database the fuse has migrated); where
there is none, an error ``no fuse store at PATH`` and nothing is created. Export files are mode
0600. A prune with no row that old writes no export. Exit status: 0 done (also when no row is that
old), 1 no store there or the store failed (nothing deleted), 2 a usage error.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from fusebox import conventions as C

from .rows import AuditRow

__all__ = ["register", "parse_before", "export_rows"]


def register(sub) -> None:
    """Add ``audit`` and its ``export`` and ``prune`` subcommands to the ``fuse`` subparsers."""
    a = sub.add_parser("audit", help="the audit log's retention: export rows, prune them after their export")
    asub = a.add_subparsers(dest="audit_command", required=True, metavar="SUBCOMMAND")
    for name, out, text in (("export", "--out", "write the audit rows older than --before to a JSON-lines file"),
                            ("prune", "--export", "export the audit rows older than --before, then delete them "
                                                  "(recorded in the audit)")):
        p = asub.add_parser(name, help=text)
        p.add_argument("--before", required=True, metavar="TIME",
                       help="rows older than this: RFC 3339, Unix seconds, or <N>d (N days ago)")
        p.add_argument(out, dest="out", required=True, metavar="FILE", help="the JSON-lines file to write (new)")
        p.add_argument("--store", metavar="URL", default=None,
                       help=f"an existing store: sqlite:///path/fuse.sqlite or postgresql://...; default: env "
                            f"{C.FUSE_STORE_ENV}, else the default state directory's fuse.sqlite")
        p.set_defaults(func=run, prune=name == "prune")


def parse_before(text: str, now: float) -> float:
    """Unix seconds of ``--before``. Raises ValueError with what is accepted."""
    t = text.strip()
    if t.endswith("d") and t[:-1].isdigit():
        return now - int(t[:-1]) * 86400.0
    try:
        return float(t)
    except ValueError:
        pass
    from .intake.payload import PayloadError, parse_time

    try:
        value = parse_time(t, "--before")
    except PayloadError:
        value = None
    if value is None:
        raise ValueError(f"--before {text!r}: expected RFC 3339 (2026-01-01T00:00:00Z), Unix seconds or <N>d")
    return value


def export_rows(rows: Iterable[AuditRow], path: Path) -> tuple[int, str]:
    """Write ``rows`` (:class:`~fusebox.fuse.rows.AuditRow`, as :meth:`Store.audit_rows` reads them)
    to ``path`` as JSON lines via ``path.partial``, synced, then renamed;
    the file mode 0600 (the rows hold override reasons and token names); returns (rows written,
    SHA-256 of the file). Raises FileExistsError when ``path`` exists."""
    if path.exists():
        raise FileExistsError(f"{path} exists: the export never overwrites one -- choose another file")
    partial = path.with_name(path.name + ".partial")
    digest, n = hashlib.sha256(), 0
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # whatever the umask, and a .partial left by an earlier run too
    with os.fdopen(fd, "wb") as f:
        for row in rows:
            line = (json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
            digest.update(line)
            f.write(line)
            n += 1
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    dirfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)
    return n, digest.hexdigest()


def _store_url(args) -> str:
    if args.store:
        return args.store
    if os.environ.get(C.FUSE_STORE_ENV):
        return os.environ[C.FUSE_STORE_ENV]
    from .store import STATE_FILE, default_state_dir

    return f"sqlite:///{default_state_dir() / STATE_FILE}"


def run(args) -> int:
    """``fusebox fuse audit export|prune``; see the module's doc for the exit status."""
    from .store import NoStoreError, StoreError, open_store, store_label

    now = time.time()
    url = ""
    try:
        before = parse_before(args.before, now)
        url = _store_url(args)
        store = open_store(url, existing=True)
    except ValueError as e:
        print(f"fusebox fuse audit: {e}", file=sys.stderr)
        return 2
    except NoStoreError as e:
        print(f"fusebox fuse audit: {e}", file=sys.stderr)
        return 1
    except (OSError, StoreError) as e:
        print(f"fusebox fuse audit: store {store_label(url)}: {e}", file=sys.stderr)
        return 1
    out = Path(args.out)
    try:
        through = store.audit_through(before)
        if args.prune and through == 0:
            print(f"no audit row older than --before: nothing pruned, no export written ({out} not created)")
            return 0
        n, sha = export_rows(store.audit_rows(through), out)
        if not args.prune:
            print(f"exported {n} audit rows (seq <= {through}) to {out}, sha256 {sha}")
            return 0
        deleted = store.prune_audit(through, n, sha, str(out), now)
        print(f"exported {n} audit rows (seq <= {through}) to {out}, sha256 {sha}; pruned {deleted}")
        return 0
    except FileExistsError as e:
        print(f"fusebox fuse audit: {e}", file=sys.stderr)
        return 2
    except (OSError, StoreError, ValueError) as e:
        print(f"fusebox fuse audit: nothing deleted: {e}", file=sys.stderr)
        return 1
    finally:
        store.close()
