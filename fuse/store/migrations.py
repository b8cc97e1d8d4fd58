"""The store's schema: one list of migrations, written once over a :class:`~.dialect.Dialect`'s
column types, and the DDL of the audit's retention (``audit_prune``).

:data:`MIGRATIONS` maps each schema version to its steps: DDL templates (``$serial``, ``$real``,
``$bigint``: :meth:`Dialect.ddl`), :data:`APPEND_ONLY` (the dialect's triggers that keep the audit
append-only: SQLite and PostgreSQL write triggers differently) and :data:`SPLIT_SNAPSHOT` (a step in
Python, the store's ``_migrate_split_snapshot``). :func:`steps` gives the statements of one dialect.
Version 1 is the schema of fusebox before migrations were versioned (its tables exist in older
files; ``CREATE ... IF NOT EXISTS`` keeps them). Each database ends with exactly the schema it had
when the lists were written per dialect (tests/test_fuse_store_migrations.py).
"""

from __future__ import annotations

from .dialect import Dialect

SCHEMA_VERSION = 6

# The table of the migrations applied; the same text on both databases (REAL: a 4-byte float on
# PostgreSQL, as it has always been there).
SCHEMA_VERSION_DDL = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"

APPEND_ONLY = "append_only"  # the dialect's triggers that keep the audit append-only
SPLIT_SNAPSHOT = "split_snapshot"  # migration 5's step in Python (Store._migrate_split_snapshot)

MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE IF NOT EXISTS outbox (
  seq $serial,
  decision_id TEXT NOT NULL, adapter TEXT NOT NULL, payload TEXT NOT NULL,
  received $real NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
  attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, applied_at $real,
  UNIQUE (decision_id, adapter))""",
        "CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (status, seq)",
        """CREATE TABLE IF NOT EXISTS audit (
  seq $serial, at $real NOT NULL, kind TEXT NOT NULL,
  decision_id TEXT, scope_key TEXT, level INTEGER, action TEXT, source TEXT, reason TEXT,
  detail TEXT NOT NULL DEFAULT '{}')""",
        APPEND_ONLY),
    2: ("ALTER TABLE outbox ADD COLUMN idem_key TEXT",
        "ALTER TABLE outbox ADD COLUMN claimed_by TEXT",
        "ALTER TABLE outbox ADD COLUMN lease_until $real",
        "UPDATE outbox SET idem_key = decision_id",
        "CREATE UNIQUE INDEX outbox_idem ON outbox (idem_key, adapter)"),
    # the row whose lock serialises the changes (PgStore._begin_change)
    3: ("INSERT INTO meta (key, value) VALUES ('breaker_version', '0') ON CONFLICT (key) DO NOTHING",),
    # what the adapters keep (holds, recorded worker settings), shared by the replicas
    4: ("""CREATE TABLE adapter_state (
  adapter TEXT NOT NULL, worker TEXT NOT NULL, holds TEXT NOT NULL DEFAULT '[]', settings TEXT NOT NULL DEFAULT '{}',
  PRIMARY KEY (adapter, worker))""",),
    # the breaker's state per scope and per resolved fingerprint, written per change
    5: ("""CREATE TABLE breaker_state (
  kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT, version $bigint NOT NULL, PRIMARY KEY (kind, key))""",
        "CREATE INDEX breaker_state_version ON breaker_state (version)",
        "INSERT INTO meta (key, value) VALUES ('state_horizon', '0') ON CONFLICT (key) DO NOTHING",
        SPLIT_SNAPSHOT),
    # the fencing token of a claim (a stale claimer had recorded a second "applied")
    6: ("ALTER TABLE outbox ADD COLUMN claim_gen $bigint NOT NULL DEFAULT 0",),
}

# Migration 1's triggers: UPDATE and DELETE of audit rows raise (on PostgreSQL TRUNCATE too).
_APPEND_ONLY = {
    "sqlite": (
        """CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
  BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END""",
        """CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
  BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END"""),
    "postgresql": (
        """CREATE OR REPLACE FUNCTION fusebox_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$""",
        """CREATE TRIGGER audit_no_change BEFORE UPDATE OR DELETE ON audit
  FOR EACH ROW EXECUTE FUNCTION fusebox_audit_append_only()""",
        """CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
  FOR EACH STATEMENT EXECUTE FUNCTION fusebox_audit_append_only()"""),
}

# The audit's retention (Store.prune_audit), created by the first prune, idempotent: the
# append-only table of the prunes, and the audit's delete trigger that lets through the rows a
# recorded prune covers.
_AUDIT_PRUNE = """CREATE TABLE IF NOT EXISTS audit_prune (
  seq $serial, at $real NOT NULL, through_seq $bigint NOT NULL, row_count $bigint NOT NULL,
  sha256 TEXT NOT NULL, export TEXT NOT NULL)"""
_PRUNE_TRIGGERS = {
    "sqlite": (
        """CREATE TRIGGER IF NOT EXISTS audit_prune_no_change BEFORE UPDATE ON audit_prune
  BEGIN SELECT RAISE(ABORT, 'the audit prune log is append-only'); END""",
        """CREATE TRIGGER IF NOT EXISTS audit_prune_no_delete BEFORE DELETE ON audit_prune
  BEGIN SELECT RAISE(ABORT, 'the audit prune log is append-only'); END""",
        "DROP TRIGGER IF EXISTS audit_no_delete",
        """CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
  WHEN OLD.seq > (SELECT COALESCE(MAX(through_seq), 0) FROM audit_prune)
  BEGIN SELECT RAISE(ABORT, 'the audit log is append-only: rows leave it only through a recorded prune'); END"""),
    # one function for every trigger of both tables: only a DELETE of audit rows a recorded
    # prune covers passes; UPDATE, TRUNCATE and any change of audit_prune raise
    "postgresql": (
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
  FOR EACH STATEMENT EXECUTE FUNCTION fusebox_audit_append_only()"""),
}


def steps(dialect: Dialect) -> dict[int, list[str]]:
    """``{version: [step, ...]}`` for ``dialect``: SQL statements (the types filled in, the
    append-only triggers expanded), and :data:`SPLIT_SNAPSHOT` where a step runs in Python."""
    out: dict[int, list[str]] = {}
    for version, todo in MIGRATIONS.items():
        out[version] = []
        for step in todo:
            if step == APPEND_ONLY:
                out[version] += _APPEND_ONLY[dialect.name]
            else:
                out[version].append(step if step == SPLIT_SNAPSHOT else dialect.ddl(step))
    return out


def prune_ddl(dialect: Dialect) -> list[str]:
    """The statements that create ``audit_prune`` and let the audit's delete trigger through the
    rows a recorded prune covers (idempotent)."""
    return [dialect.ddl(_AUDIT_PRUNE), *_PRUNE_TRIGGERS[dialect.name]]
