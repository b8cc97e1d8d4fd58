"""The store's two implementations: versioned migrations (an old SQLite file, replicas starting
together on PostgreSQL), the append-only audit on PostgreSQL, outbox claims and leases, and a
hold/override timer ended by a replica other than the one that set it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from _fuse_support import SPEC, TOKEN
from _pg_support import PgServer

from fusebox.fuse.actions import DryRun
from fusebox.fuse.rules import FuseRules
from fusebox.fuse.service import FuseService
from fusebox.fuse.store import SCHEMA_VERSION, PgStore, Store, StoreError, open_store
from fusebox.spec import load_spec

# The schema fusebox wrote before migrations were versioned (fusebox 0.1.0's store.py).
V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, decision_id TEXT NOT NULL, adapter TEXT NOT NULL,
  payload TEXT NOT NULL, received REAL NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
  attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, applied_at REAL, UNIQUE (decision_id, adapter));
CREATE INDEX outbox_pending ON outbox (status, seq);
CREATE TABLE audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, kind TEXT NOT NULL,
  decision_id TEXT, scope_key TEXT, level INTEGER, action TEXT, source TEXT, reason TEXT,
  detail TEXT NOT NULL DEFAULT '{}');
INSERT INTO outbox (decision_id, adapter, payload, received) VALUES ('d1', 'gateway', '{"scope": {}}', 1.5);
"""


tools = pytest.mark.tools  # the tests with Debian's PostgreSQL server


@pytest.fixture(scope="module")
def pg():
    server = PgServer()
    server.start()
    yield server
    server.close()


def test_an_old_sqlite_file_is_migrated_keeping_its_pending_row(tmp_path):
    path = tmp_path / "fuse.sqlite"
    db = sqlite3.connect(path)
    db.executescript(V1)
    db.close()
    s = Store(path)
    assert s.schema_version() == SCHEMA_VERSION == 3
    assert [(r["decision_id"], r["status"], r["idem_key"], r["claimed_by"]) for r in s.outbox()] == [
        ("d1", "pending", "d1", None)]
    s.close()
    s = Store(path)  # opening again changes nothing
    assert s.schema_version() == 3 and len(s.outbox()) == 1


def test_store_urls():
    with pytest.raises(ValueError, match="unknown scheme"):
        open_store("mysql://u:secret@h/db")
    assert open_store("sqlite://:memory:").dialect == "sqlite"


@tools
def test_replicas_starting_together_migrate_once(pg):
    url = pg.create_db("together")
    stores: list = []
    errors: list = []

    def start():
        try:
            stores.append(PgStore(url))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(stores) == 4
    assert [r[0] for r in stores[0]._rows("SELECT version FROM schema_version ORDER BY version")] == [1, 2, 3]
    for s in stores:
        s.close()


@tools
def test_the_audit_is_append_only_on_postgresql(pg):
    import psycopg

    s = PgStore(pg.create_db("appendonly"))
    s.audit({"at": 1.0, "kind": "override", "reason": "r"})
    for sql in ("UPDATE audit SET reason = 'x'", "DELETE FROM audit", "TRUNCATE audit"):
        with psycopg.connect(s.url, autocommit=True) as c, pytest.raises(psycopg.Error, match="append-only"):
            c.execute(sql)
    assert [a["reason"] for a in s.audit_log()] == ["r"]
    s.close()


@tools
def test_a_claimed_row_is_taken_over_only_after_its_lease(pg):
    url = pg.create_db("claims")
    a, b = PgStore(url), PgStore(url)
    a.commit(None, [("d1", "gateway", {"scope": {}}, 1.0, "k1")])
    a.commit(None, [("d2", "gateway", {"scope": {}}, 1.0, "k1")])  # the same change again: not queued
    (seq,) = [r["seq"] for r in a.pending("gateway")]
    assert a.claim([seq], "A", 100.0, 5.0) == [seq]
    assert b.claim([seq], "B", 104.9, 5.0) == []  # A's lease runs until 105
    assert a.claim([seq], "A", 104.9, 5.0) == [seq]  # A renews its own (until 109.9)
    assert b.claim([seq], "B", 110.0, 5.0) == [seq]  # A is gone: B takes it over
    assert [r["claimed_by"] for r in b.pending("gateway")] == ["B"]
    a.close()
    b.close()


@tools
def test_an_override_set_by_a_replica_that_is_gone_expires_on_another(pg):
    url = pg.create_db("override")
    rules = FuseRules.from_spec(load_spec(SPEC))
    gw_a, gw_b = DryRun(), DryRun()
    a = FuseService(rules, PgStore(url), [gw_a], hold_s=60, dry_run=True)
    b = FuseService(rules, PgStore(url), [gw_b], hold_s=60, dry_run=True)
    scope = {"cluster": "a", "hw_id": "GPU-1"}
    a.override(scope, 1, "trip", "maintenance", 0.3, by="alice")
    a.store.close()  # A is gone, its trip not even sent
    assert b.state()["levels"] == {'{cluster="a",hw_id="GPU-1"}': 1}  # B reads what A decided
    time.sleep(0.35)
    (release,) = b.tick()
    assert (release["state"], release["level"], release["source"]) == ("release", 1, "override_expired")
    assert b.tick() == [] and b.state()["levels"] == {}
    kinds = [r["kind"] for r in b.store.audit_log()]
    assert kinds == ["release", "trip", "override"]
    b.store.close()


def test_serve_refuses_an_unreachable_postgresql_with_a_clear_error(tmp_path):
    from fusebox.tooling import free_port

    (tmp_path / "token").write_text(TOKEN)
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--dry-run",
                        "--token-file", str(tmp_path / "token"), "--store",
                        f"postgresql://fuse:hunter2@127.0.0.1:{free_port()}/fuse"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "fusebox fuse: store: postgresql://fuse@127.0.0.1:" in r.stderr and "hunter2" not in r.stderr


@tools
def test_a_store_error_is_raised_while_postgresql_is_down(pg):
    s = PgStore(pg.create_db("down"))
    pg.stop()
    try:
        with pytest.raises(StoreError):
            s.commit({"version": 1}, [], [])
        with pytest.raises(StoreError):
            s.version()
    finally:
        pg.start()
    s.commit({"version": 1}, [], [])  # connected again
    assert s.version() == 1
    s.close()


def test_serve_takes_a_sqlite_url_and_refuses_a_lease_not_above_the_timeout(tmp_path):
    from fusebox.cli import build_parser
    from fusebox.fuse.cli import build_service

    (tmp_path / "token").write_text(TOKEN)
    base = ["fuse", "serve", "--spec", str(SPEC), "--dry-run", "--token-file", str(tmp_path / "token")]
    args = build_parser().parse_args([*base, "--store", f"sqlite:///{tmp_path / 'a' / 'f.sqlite'}", "--lease", "9"])
    service, _ = build_service(args)
    assert service.store.path == str(tmp_path / "a" / "f.sqlite") and service.lease_s == 9.0
    service.store.close()
    args = build_parser().parse_args([*base, "--state", str(tmp_path / "g.sqlite"), "--lease", "5", "--timeout", "5"])
    with pytest.raises(ValueError, match="--lease 5 must exceed --timeout 5"):
        build_service(args)
