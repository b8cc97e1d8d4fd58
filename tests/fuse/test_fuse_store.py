"""The store's two implementations: versioned migrations (an old SQLite file, replicas starting
together on PostgreSQL), the append-only audit on PostgreSQL, outbox claims and leases, and a
hold/override timer ended by a replica other than the one that set it, and the adapters' holds
(adapter_state) kept across a restart and shared by replicas."""

from __future__ import annotations

import sqlite3
import stat
import subprocess
import sys
import threading
import time

import pytest
from _fuse_support import SPEC, TOKEN

from fusebox.fuse.adapters.gateway import DryRun
from fusebox.fuse.control import ControlCall
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


def test_an_old_sqlite_file_is_migrated_keeping_its_pending_row(tmp_path):
    path = tmp_path / "fuse.sqlite"
    db = sqlite3.connect(path)
    db.executescript(V1)
    db.close()
    s = Store(path)
    assert s.schema_version() == SCHEMA_VERSION == 6
    assert s.adapter_state("haproxy:lb") == {}  # migration 4's table, empty
    assert [(r["decision_id"], r["status"], r["idem_key"], r["claimed_by"]) for r in s.outbox()] == [
        ("d1", "pending", "d1", None)]
    s.close()
    s = Store(path)  # opening again changes nothing
    assert s.schema_version() == SCHEMA_VERSION and len(s.outbox()) == 1


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
    assert [r[0] for r in stores[0]._rows("SELECT version FROM schema_version ORDER BY version")] == list(range(1, SCHEMA_VERSION + 1))
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
    call = ControlCall("freeze_admissions", 1, "trip")
    a.commit(None, [("d1", "gateway", call, 1.0, "k1")])
    a.commit(None, [("d2", "gateway", call, 1.0, "k1")])  # the same change again: not queued
    (seq,) = [r["seq"] for r in a.pending("gateway")]
    assert [r["call"] for r in a.pending("gateway")] == [call]  # read back as the call queued
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
    with pytest.raises(ValueError, match="--lease 5 must exceed the longest adapter timeout, --timeout 5"):
        build_service(args)


# ------------------------------------------------------------------ the adapters' holds (adapter_state)
def test_adapter_holds_and_settings_survive_a_restart_on_sqlite(tmp_path):
    s = Store(tmp_path / "fuse.sqlite")
    assert s.adapter_hold("sglang_gateway:g", "http://10.0.0.5:30001", "freeze_admissions engine=e0", True) is True
    s.adapter_record("sglang_gateway:g", "http://10.0.0.5:30001", {"priority": 7, "cost": 2})
    s.close()
    s = Store(tmp_path / "fuse.sqlite")
    assert s.adapter_state("sglang_gateway:g") == {
        "http://10.0.0.5:30001": {"holds": ["freeze_admissions engine=e0"], "settings": {"priority": 7, "cost": 2}}}
    assert s.adapter_hold("sglang_gateway:g", "http://10.0.0.5:30001", "freeze_admissions engine=e0", False) is False
    assert s.adapter_state("sglang_gateway:g")["http://10.0.0.5:30001"] == {"holds": [], "settings": {"priority": 7, "cost": 2}}
    s.close()


@tools
def test_adapter_holds_are_shared_by_replicas_on_postgresql(pg):
    """Two replicas' stores on one database: each sees the other's holds, and 2 x 25 holds taken
    at once from two threads are all kept (the row lock: no lost update)."""
    url = pg.create_db("adapterholds")
    a, b = PgStore(url), PgStore(url)
    assert a.schema_version() == SCHEMA_VERSION
    assert a.adapter_hold("haproxy:lb", "be_llm/engine0", "freeze_admissions engine=e0", True) is True
    assert b.adapter_hold("haproxy:lb", "be_llm/engine0", "kv_cache_eviction engine=e0", True) is True
    assert a.adapter_hold("haproxy:lb", "be_llm/engine0", "freeze_admissions engine=e0", False) is True  # b's holds it
    assert b.adapter_hold("haproxy:lb", "be_llm/engine0", "kv_cache_eviction engine=e0", False) is False
    a.adapter_record("sglang_gateway:g", "http://w:1", {"priority": 3})
    assert b.adapter_state("sglang_gateway:g") == {"http://w:1": {"holds": [], "settings": {"priority": 3}}}

    def take(store, who):
        for i in range(25):
            store.adapter_hold("haproxy:lb", "be_llm/engine1", f"{who} {i}", True)

    ts = [threading.Thread(target=take, args=(s, w)) for s, w in ((a, "a"), (b, "b"))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert len(a.adapter_state("haproxy:lb")["be_llm/engine1"]["holds"]) == 50
    a.close()
    b.close()


# ------------------------------------------------------------------ audit retention (issue 22)
def _raw_sql(url: str, sql: str) -> None:
    """Run ``sql`` on the store's database outside fusebox, as an operator (or an intruder) would."""
    if url.startswith("sqlite:///"):
        c = sqlite3.connect(url.removeprefix("sqlite://"), isolation_level=None)
        try:
            c.execute(sql)
        finally:
            c.close()
        return
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql)


def _refused(url: str):
    import psycopg

    return pytest.raises((sqlite3.Error, psycopg.Error), match="append-only")


def _prune(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fusebox.cli", "fuse", "audit", *args, "--store", url],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_audit_rows_are_pruned_only_after_their_export_and_the_prune_is_recorded(tmp_path, backend, request):
    import hashlib
    import json

    url = (f"sqlite:///{tmp_path / 'fuse.sqlite'}" if backend == "sqlite"
           else request.getfixturevalue("pg").create_db("prune"))
    s = open_store(url)
    for i in range(10):  # at 1000 ... 1009
        s.audit({"at": 1000.0 + i, "kind": "override", "reason": f"r{i}", "detail": {"i": i}})
    s.close()
    with _refused(url):
        _raw_sql(url, "DELETE FROM audit WHERE seq = 1")

    copy = tmp_path / "copy.jsonl"
    r = _prune(url, "export", "--before", "1003", "--out", str(copy))
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["reason"] for line in copy.read_text().splitlines()] == ["r0", "r1", "r2"]

    out = tmp_path / "audit-before-1005.jsonl"
    r = _prune(url, "prune", "--before", "1005", "--export", str(out))
    assert r.returncode == 0, r.stderr
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(e["seq"], e["reason"], e["detail"]) for e in exported] == [(i + 1, f"r{i}", {"i": i}) for i in range(5)]
    s = open_store(url)
    try:
        left = s.audit_log(100)
        assert [a["reason"] for a in left if a["kind"] == "override"] == [f"r{i}" for i in range(9, 4, -1)]
        (pruned,) = [a for a in left if a["kind"] == "pruned"]
        assert pruned["detail"] == {"through_seq": 5, "rows": 5, "export": str(out),
                                    "sha256": hashlib.sha256(out.read_bytes()).hexdigest()}
    finally:
        s.close()
    # what was not pruned stays append-only; the record of the prune too
    for sql in ("DELETE FROM audit WHERE seq = 6", "UPDATE audit SET reason = 'x' WHERE seq = 7",
                "DELETE FROM audit_prune", "UPDATE audit_prune SET row_count = 0"):
        with _refused(url):
            _raw_sql(url, sql)
    # an export never overwrites a file; nothing more is deleted
    r = _prune(url, "prune", "--before", "1008", "--export", str(out))
    assert r.returncode == 2 and "exists" in r.stderr, r.stderr
    s = open_store(url)
    assert len([a for a in s.audit_log(100) if a["kind"] == "override"]) == 5
    s.close()


def _audit(*args: str, env: dict | None = None, umask: int | None = None) -> subprocess.CompletedProcess:
    """``fusebox fuse audit ARGS`` as a user runs it (no ``--store`` added)."""
    import os

    return subprocess.run([sys.executable, "-m", "fusebox.cli", "fuse", "audit", *args], capture_output=True,
                          text=True, timeout=120, env=env,
                          preexec_fn=None if umask is None else (lambda: os.umask(umask)))


@pytest.mark.parametrize("command,out", [("export", "--out"), ("prune", "--export")])
def test_audit_on_a_mistyped_store_path_is_an_error_and_creates_nothing(tmp_path, command, out):
    typo = tmp_path / "some" / "typo" / "fuse.sqlite"
    r = _audit(command, "--before", "30d", out, str(tmp_path / "x.jsonl"), "--store", f"sqlite:///{typo}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"no fuse store at {typo} -- check --store" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_audit_without_store_and_no_default_store_is_an_error_and_creates_nothing(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k != "FUSEBOX_FUSE_STORE"}
    env.update(HOME=str(tmp_path / "home"), XDG_DATA_HOME=str(tmp_path / "data"))
    r = _audit("prune", "--before", "30d", "--export", str(tmp_path / "x.jsonl"), env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"no fuse store at {tmp_path / 'data' / 'fusebox' / 'fuse.sqlite'}" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_audit_on_a_file_without_the_fuse_schema_is_an_error_and_leaves_it_as_it_was(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    r = _audit("prune", "--before", "30d", "--export", str(tmp_path / "x.jsonl"), "--store", f"sqlite:///{empty}")
    assert r.returncode == 1 and f"no fuse store at {empty}" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.sqlite"] and empty.read_bytes() == b""


def test_audit_on_a_postgresql_database_without_the_fuse_schema_is_an_error_and_creates_no_table(pg):
    import psycopg

    url = pg.create_db("noschema")
    r = _audit("prune", "--before", "30d", "--export", "/nonexistent/x.jsonl", "--store", url)
    assert r.returncode == 1 and "no fuse store at" in r.stderr and "without the fuse's schema" in r.stderr, r.stderr
    with psycopg.connect(url) as c:
        assert c.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
                         ).fetchone()[0] == 0


def test_a_prune_with_nothing_that_old_writes_no_export_and_exports_are_private(tmp_path):
    import json

    url = f"sqlite:///{tmp_path / 'fuse.sqlite'}"
    s = open_store(url)
    for i in range(3):  # at 1000 ... 1002
        s.audit({"at": 1000.0 + i, "kind": "override", "reason": f"r{i}"})
    s.close()
    out = tmp_path / "none.jsonl"
    r = _audit("prune", "--before", "999", "--export", str(out), "--store", url, umask=0)
    assert r.returncode == 0 and "nothing pruned" in r.stdout, r.stdout + r.stderr
    assert not out.exists() and not (tmp_path / "none.jsonl.partial").exists()
    for command, flag in (("export", "--out"), ("prune", "--export")):
        f = tmp_path / f"{command}.jsonl"
        r = _audit(command, "--before", "1002", flag, str(f), "--store", url, umask=0)
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
        assert [json.loads(line)["reason"] for line in f.read_text().splitlines()] == ["r0", "r1"]


def test_the_docs_list_every_audit_kind_the_fuse_writes():
    """docs/fuse.md's list of audit kinds holds every ``"kind": "..."`` the fuse's code writes."""
    import re

    from _fuse_support import ROOT

    written: set[str] = set()
    for src in (ROOT / "fuse").rglob("*.py"):  # the sub-packages too (fuse/store/)
        for m in re.finditer(r'"kind":\s*"(\w+)"(?:\s+if\s+[\w.]+\s+else\s+"(\w+)")?', src.read_text()):
            written.update(k for k in m.groups() if k)
    assert {"applied", "dry_run", "override", "pruned"} <= written  # the scan reads the code's forms
    docs = (ROOT / "docs" / "fuse.md").read_text()
    listed = docs[docs.index("its kinds are"):docs.index("`applied` rows record")]
    assert written - set(re.findall(r"`(\w+)`", listed)) == set()
