"""The store's one migration list gives each database exactly the schema it had when the
migrations were written once per dialect: the lists of that time (below, verbatim) against
:func:`fusebox.fuse.store.migrations.steps`; a fresh store of each backend against the schema
today's code made before the package (tests/fixtures/fuse_store/schema_v6.json, dumped from
``sqlite_master`` and PostgreSQL's catalog by that code); and a database left at each schema
version by those lists opens and migrates to that same schema (one at the newest version opens
without any change)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from _pg_support import pg_server
from _support import FIXTURES

from fusebox.fuse.rules import scope_key
from fusebox.fuse.store import SCHEMA_VERSION, PgStore, Store
from fusebox.fuse.store.dialect import POSTGRESQL, SQLITE
from fusebox.fuse.store.migrations import prune_ddl, steps

tools = pytest.mark.tools  # the tests with Debian's PostgreSQL server

# The schema fuse/store.py made (SCHEMA_VERSION 6), fresh and after a first prune of the audit.
GOLDEN = json.loads((FIXTURES / "fuse_store" / "schema_v6.json").read_text())

# The migrations as fuse/store.py wrote them, one list per dialect ("split_snapshot": a step in Python).
LEGACY_SQLITE = {
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
LEGACY_PG = {
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

LEGACY_PRUNE_SQLITE = [
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

LEGACY_PRUNE_PG = [
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


SCHEMA_VERSION_DDL = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
SQLITE_SCHEMA = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name"
PG_SCHEMA = {
    "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default FROM information_schema.columns "
               "WHERE table_schema = 'public' ORDER BY table_name, ordinal_position",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY indexname",
    "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
                   "WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2",
    "triggers": "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1, 2",
    "functions": "SELECT proname, prosrc FROM pg_proc WHERE pronamespace = 'public'::regnamespace ORDER BY 1",
    "sequences": "SELECT sequence_name, data_type FROM information_schema.sequences WHERE sequence_schema = 'public' ORDER BY 1",
}
# A whole-state snapshot as fusebox kept it in meta.breaker before version 5 (its scope's key an old
# spelling: migration 5 recomputes it from the labels).
LABELS = {"cluster": "a", "hw_id": "GPU-00000"}
SCOPE = {"labels": LABELS, "level": 1, "since": 1.5}
SNAPSHOT = {"version": 1, "scopes": {"old-key": SCOPE}, "resolved": {"fp1": [1.5, 2.0]}}


def _legacy(run, lists: dict, upto: int) -> None:
    """Bring a database to schema version ``upto`` with the per-dialect ``lists`` as fuse/store.py
    applied them (``run(sql, args)``; the Python step finds no snapshot in a new database), then
    queue one pending row as fusebox at that version did (from version 2 on with its ``idem_key``);
    at version 4, the whole-state snapshot of that time, written 3 times."""
    run(SCHEMA_VERSION_DDL, ())
    for v in range(1, upto + 1):
        for sql in lists[v]:
            if sql != "split_snapshot":
                run(sql, ())
        run("INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (v, 1000.0 + v))
    if upto == 1:
        run("INSERT INTO outbox (decision_id, adapter, payload, received) VALUES ('d1', 'gateway', '{}', 1.5)", ())
    else:
        run("INSERT INTO outbox (decision_id, adapter, payload, received, idem_key) VALUES ('d1', 'gateway', '{}', 1.5, 'd1')", ())
    if upto == 4:
        run("INSERT INTO meta (key, value) VALUES ('breaker', ?)", (json.dumps(SNAPSHOT),))
        run("UPDATE meta SET value = '3' WHERE key = 'breaker_version'", ())


def _sqlite_file(path, upto: int) -> None:
    path.touch(mode=0o600)  # as the store creates it
    db = sqlite3.connect(path, isolation_level=None)
    _legacy(lambda sql, args: db.execute(sql, args), LEGACY_SQLITE, upto)
    db.close()


def _sqlite_schema(path) -> tuple[list, int, list]:
    """(sqlite_master's rows, SQLite's schema cookie: one more on every change of the schema,
    schema_version's rows)."""
    db = sqlite3.connect(path)
    try:
        return ([list(r) for r in db.execute(SQLITE_SCHEMA)], db.execute("PRAGMA schema_version").fetchone()[0],
                db.execute("SELECT version, applied_at FROM schema_version ORDER BY version").fetchall())
    finally:
        db.close()


def _pg_schema(store: PgStore) -> dict:
    return {k: [list(r) for r in store._rows(q)] for k, q in PG_SCHEMA.items()}


def _prune_nothing(store: Store) -> None:
    """The first prune creates audit_prune and its triggers (nothing to delete)."""
    assert store.prune_audit(0, 0, "0" * 64, "audit.jsonl", at=1.0) == 0


def test_the_one_migration_list_gives_each_database_the_statements_it_had():
    assert steps(SQLITE) == LEGACY_SQLITE
    assert steps(POSTGRESQL) == LEGACY_PG
    assert prune_ddl(SQLITE) == LEGACY_PRUNE_SQLITE
    assert prune_ddl(POSTGRESQL) == LEGACY_PRUNE_PG
    assert max(steps(SQLITE)) == max(steps(POSTGRESQL)) == SCHEMA_VERSION == 6


def test_a_fresh_sqlite_store_has_the_schema_it_had(tmp_path):
    path = tmp_path / "fuse.sqlite"
    Store(path).close()
    master, _, versions = _sqlite_schema(path)
    assert master == GOLDEN["sqlite"]["fresh"]
    assert [v for v, _ in versions] == [1, 2, 3, 4, 5, 6]
    s = Store(path)
    _prune_nothing(s)
    s.close()
    assert _sqlite_schema(path)[0] == GOLDEN["sqlite"]["pruned"]


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION + 1))
def test_a_sqlite_file_left_at_each_version_migrates_to_the_schema_it_had(tmp_path, version):
    path = tmp_path / "fuse.sqlite"
    _sqlite_file(path, version)
    master0, cookie0, versions0 = _sqlite_schema(path)
    s = Store(path)
    assert [(r["decision_id"], r["status"], r["idem_key"]) for r in s.outbox()] == [("d1", "pending", "d1")]
    if version == 4:  # migration 5 split the snapshot into rows, keyed from the labels
        assert s.snapshot() == {"version": 1, "scopes": {'{cluster="a",hw_id="GPU-00000"}': SCOPE},
                                "resolved": {"fp1": [1.5, 2.0]}}
        assert s.version() == 3 and scope_key(LABELS) == '{cluster="a",hw_id="GPU-00000"}'
    s.close()
    master, cookie, versions = _sqlite_schema(path)
    assert master == GOLDEN["sqlite"]["fresh"]
    assert versions[:version] == versions0 and [v for v, _ in versions] == [1, 2, 3, 4, 5, 6]
    if version == SCHEMA_VERSION:  # the newest: opened without a change of its schema
        assert (master, cookie, versions) == (master0, cookie0, versions0)


@pytest.fixture(scope="module")
def pg():
    server = pg_server()
    yield server
    server.close()


@tools
def test_a_fresh_postgresql_store_has_the_schema_it_had(pg):
    s = PgStore(pg.create_db("fresh"))
    try:
        assert _pg_schema(s) == GOLDEN["postgresql"]["fresh"]
        assert [r[0] for r in s._rows("SELECT version FROM schema_version ORDER BY version")] == [1, 2, 3, 4, 5, 6]
        _prune_nothing(s)
        assert _pg_schema(s) == GOLDEN["postgresql"]["pruned"]
    finally:
        s.close()


@tools
@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION + 1))
def test_a_postgresql_database_left_at_each_version_migrates_to_the_schema_it_had(pg, version):
    import psycopg

    url = pg.create_db(f"at_v{version}")
    with psycopg.connect(url, autocommit=True) as db:
        _legacy(lambda sql, args: db.execute(POSTGRESQL.q(sql), args or None), LEGACY_PG, version)
        before = {k: db.execute(q).fetchall() for k, q in PG_SCHEMA.items()}
        versions0 = db.execute("SELECT version, applied_at FROM schema_version ORDER BY version").fetchall()
    s = PgStore(url)
    try:
        assert [(r["decision_id"], r["status"], r["idem_key"]) for r in s.outbox()] == [("d1", "pending", "d1")]
        if version == 4:
            assert s.snapshot() == {"version": 1, "scopes": {'{cluster="a",hw_id="GPU-00000"}': SCOPE},
                                    "resolved": {"fp1": [1.5, 2.0]}}
            assert s.version() == 3
        assert _pg_schema(s) == GOLDEN["postgresql"]["fresh"]
        versions = s._rows("SELECT version, applied_at FROM schema_version ORDER BY version")
        assert versions[:version] == versions0 and [v for v, _ in versions] == [1, 2, 3, 4, 5, 6]
        if version == SCHEMA_VERSION:  # the newest: nothing changed
            assert {k: [tuple(r) for r in rows] for k, rows in _pg_schema(s).items()} == before
            assert versions == versions0
    finally:
        s.close()
