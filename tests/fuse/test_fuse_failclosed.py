"""The fuse with a hostile neighbour (issue 34, defects 4 and 5 and three lows): token files fail
closed on a malformed edit (the webhook keeps working on its own file), the refused-alert audit is
bounded per minute and in all (``fuse.audit``), a level's holders are capped, a trip is logged
only once stored, and a store whose ``-shm`` cannot be allocated stops the start with its name."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from _fuse_support import PEOPLE, SPEC, TOKEN, alert, free_port, payload, wait_for
from _support import finish

from fusebox.fuse.adapters.gateway import DryRun
from fusebox.fuse.intake import breaker as breaker_mod
from fusebox.fuse.intake.payload import parse_payload
from fusebox.fuse.rules import FuseRules
from fusebox.fuse.service import FuseService, Unavailable
from fusebox.fuse.store import Store, StoreError
from fusebox.spec import load_spec

T0 = 1_700_000_000.0
OVERRIDE = {"scope": {"cluster": "a", "engine": "e0"}, "level": 1, "mode": "trip", "reason": "canary",
            "expires_in_s": 600}
BOB_NEW = "bob-override-token-0003-klmnopqrst"  # what bob's line would have become

# The malformed edits of the review: each meant to revoke bob (or edit around him), each leaving
# the file malformed; the file must be refused whole, bob's token with it.
EDITS = {
    "bob REVOKED": f"alice {PEOPLE['alice']}\nbob REVOKED\n",
    "a trailing comment": f"alice {PEOPLE['alice']}  # on call this week\nbob {PEOPLE['bob']}\n",
    "a truncated token": f"alice {PEOPLE['alice']}\nbob {BOB_NEW[:20]}\n",
    "a typo on another line": f"alice{PEOPLE['alice']}\n",  # bob's line removed, alice's lost its space
}


def _write(path, text):
    """As a Secret volume or an editor's save does: a new file renamed over the old."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    tmp.chmod(0o600)
    os.replace(tmp, path)


def _metric(text: str, name: str, **labels) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    return None


def _refused_notes(n: int, per_note: int, starts: float = T0):
    """``n`` refused (untrusted: a fuse_action the spec does not generate) alerts, each its own
    fingerprint, in notifications of ``per_note``."""
    for k in range(0, n, per_note):
        alerts = []
        for i in range(k, min(n, k + per_note)):
            a = alert("GPUMemoryUtilizationHigh", starts=starts, cluster="a", hw_id=f"GPU-{i}")
            a["labels"]["fuse_action"] = "not_an_action"
            a["fingerprint"] = ""  # computed from the labels, as Alertmanager does
            alerts.append(a)
        yield payload(*alerts)


def _serve(tmp_path, hook, people, port, stderr=subprocess.PIPE):
    return subprocess.Popen(
        [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen", f"127.0.0.1:{port}",
         "--state", str(tmp_path / "s.sqlite"), "--webhook-token-file", str(hook), "--override-tokens", str(people),
         "--dry-run", "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=stderr, text=True)


def _up(url):
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.process
def test_each_malformed_edit_of_the_people_file_revokes_every_override_token_after_sighup(tmp_path):
    hook, people = tmp_path / "hook", tmp_path / "people"
    _write(hook, TOKEN + "\n")
    valid = "".join(f"{n} {t}\n" for n, t in PEOPLE.items())
    _write(people, valid)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    p = _serve(tmp_path, hook, people, port)

    def override(name):
        return httpx.post(url + "/override", json={**OVERRIDE, "reason": f"by {name}"}, timeout=10,
                          headers={"Authorization": f"Bearer {PEOPLE[name]}"}).status_code

    def notify(i):
        note = payload(alert("GPUMemoryUtilizationHigh", starts=T0 + i, cluster="a", hw_id=f"GPU-n{i}"))
        return httpx.post(url + "/alertmanager", json=note, timeout=10, headers={"Authorization": f"Bearer {TOKEN}"})

    def metrics():
        return httpx.get(url + "/metrics", timeout=10).text

    try:
        wait_for(lambda: _up(url), 30, 0.1, "fuse serve")
        assert override("bob") == 200
        m = metrics()
        assert _metric(m, "fusebox_fuse_token_file_valid", file="people") == 1.0
        assert _metric(m, "fusebox_fuse_token_file_refused_total", file="people") == 0.0
        refused = 0.0
        for i, (what, text) in enumerate(EDITS.items()):
            _write(people, text)
            p.send_signal(signal.SIGHUP)
            wait_for(lambda: override("bob") == 401, 10, 0.1, f"bob's token refused after {what}")
            assert override("alice") == 401, what  # the whole file is refused, not only bob's line
            r = notify(i)  # the webhook's own file is valid: Alertmanager still trips
            assert r.status_code == 200 and r.json()["alerts"] == {"tripped": 1}, (what, r.text)
            m = metrics()
            assert _metric(m, "fusebox_fuse_token_file_valid", file="people") == 0.0, what
            assert _metric(m, "fusebox_fuse_token_file_valid", file="webhook") == 1.0, what
            now = _metric(m, "fusebox_fuse_token_file_refused_total", file="people")
            assert now is not None and now > refused, (what, now)  # on the change and/or the SIGHUP
            refused = now
            _write(people, valid)  # fixed: both people override again
            p.send_signal(signal.SIGHUP)
            wait_for(lambda: override("bob") == 200, 10, 0.1, f"bob's token back after fixing {what}")
            assert override("alice") == 200
            assert _metric(metrics(), "fusebox_fuse_token_file_valid", file="people") == 1.0
        assert p.poll() is None
    finally:
        p.terminate()
        _, _, err = finish(p)
    assert err.count("token file people refused") >= len(EDITS), err
    assert "bob REVOKED" not in err and PEOPLE["bob"] not in err  # the line is named, never a token


@pytest.mark.process
def test_an_audit_flood_of_40000_varied_refused_alerts_leaves_at_most_the_per_minute_bound(tmp_path):
    hook, people = tmp_path / "hook", tmp_path / "people"
    _write(hook, TOKEN + "\n")
    _write(people, "".join(f"{n} {t}\n" for n, t in PEOPLE.items()))
    per_minute = load_spec(SPEC).audit.refused_per_minute  # the shipped spec's bound
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    p = _serve(tmp_path, hook, people, port, stderr=subprocess.DEVNULL)  # unread: a pipe would fill
    try:
        wait_for(lambda: _up(url), 30, 0.1, "fuse serve")
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            for note in _refused_notes(40_000, 1000):
                r = c.post(url + "/alertmanager", json=note)
                assert r.status_code == 200 and r.json()["alerts"] == {"untrusted": len(note["alerts"])}, r.text[:300]
            m = c.get(url + "/metrics").text
        dropped = _metric(m, "fusebox_fuse_audit_refused_dropped_total", reason="rate")
        assert p.poll() is None
    finally:
        p.terminate()
        p.communicate(timeout=30)
    db = sqlite3.connect(tmp_path / "s.sqlite")
    rows = db.execute("SELECT COUNT(*) FROM audit WHERE kind = 'ignored'").fetchone()[0]
    windows = db.execute("SELECT COUNT(*) FROM audit WHERE kind = 'ignored' AND detail LIKE '%not_audited%'").fetchone()[0]
    db.close()
    # one window unless the flood outlasted a minute (then one more per minute, and its summary row)
    assert per_minute <= rows - windows <= per_minute * (windows + 1), (rows, windows)
    assert rows - windows + dropped == 40_000  # every refused alert audited or counted


def _service(tmp_path, **kw):
    return FuseService(FuseRules.from_spec(load_spec(SPEC)), Store(tmp_path / "fuse.sqlite"), [DryRun()], hold_s=60,
                       dry_run=True, **kw)


def test_the_refused_audit_stops_at_its_row_bound_and_counts_the_rest(tmp_path):
    svc = _service(tmp_path, audit_refused_per_minute=100_000, audit_refused_max_rows=500)
    try:
        for note in _refused_notes(40_000, 2000):
            assert svc.handle(parse_payload(note, T0)) is not None
        assert svc.store.audit_count("ignored") == 500
        full = svc.metrics.registry.get_sample_value("fusebox_fuse_audit_refused_dropped_total", {"reason": "full"})
        assert full == 40_000 - 500
    finally:
        svc.store.close()


def test_a_minute_that_dropped_refusals_is_summed_up_in_one_row_at_the_next(tmp_path):
    clock = [T0]
    svc = _service(tmp_path, audit_refused_per_minute=10, clock=lambda: clock[0])
    try:
        notes = list(_refused_notes(30, 30))
        svc.handle(parse_payload(notes[0], T0))
        assert svc.store.audit_count("ignored") == 10
        clock[0] += 61
        svc.handle(parse_payload(payload(alert("GPUMemoryUtilizationHigh", starts=T0, cluster="a", hw_id="ok")), T0))
        rows = svc.store.audit_log(100, kinds=("ignored",))
        assert len(rows) == 11
        assert rows[0]["detail"]["dropped"] == {"rate": 20, "full": 0}, rows[0]
        assert "20 refused alert(s) not audited" in rows[0]["reason"]
    finally:
        svc.store.close()


def test_a_level_keeps_at_most_max_holders_and_refuses_one_more(tmp_path, monkeypatch):
    monkeypatch.setattr(breaker_mod, "MAX_HOLDERS", 5)
    svc = _service(tmp_path)
    try:
        alerts = [alert("GPUMemoryUtilizationHigh", starts=T0, cluster="a", hw_id="GPU-0") for _ in range(7)]
        for i, a in enumerate(alerts):  # the same scope's level, seven fingerprints (a label outside the scope)
            a["labels"]["job"] = f"j{i}"
            a["fingerprint"] = ""
        r = svc.handle(parse_payload(payload(*alerts), T0))
        assert r["alerts"] == {"tripped": 1, "held": 4, "holder_limit": 2}, r
        (sc,) = svc.breaker.snapshot()["scopes"].values()
        assert [len(st["holders"]) for st in sc["levels"].values()] == [5]
        assert len(svc.store.audit_log(100, kinds=("ignored",))) == 2
    finally:
        svc.store.close()


def test_a_trip_whose_commit_fails_is_answered_503_and_not_logged_as_a_trip(tmp_path, caplog, monkeypatch):
    svc = _service(tmp_path)
    real = svc.store.change

    def failing_commit(*a, **kw):  # the COMMIT itself fails, after the rows were written (disk full, server gone)
        cm = real(*a, **kw)

        class Wrap:
            def __enter__(self):
                return cm.__enter__()

            def __exit__(self, *exc):
                cm.__exit__(RuntimeError, RuntimeError("x"), None)  # rolled back
                raise StoreError("database or disk is full")
        return Wrap()

    try:
        monkeypatch.setattr(svc.store, "change", failing_commit)
        caplog.set_level(logging.DEBUG, logger="fusebox.fuse")
        with pytest.raises(Unavailable):
            svc.handle(parse_payload(payload(alert("GPUMemoryUtilizationHigh", starts=T0, cluster="a", hw_id="G")), T0))
        assert not [r for r in caplog.records if r.getMessage().startswith("trip ")], caplog.text
        assert "notification of 1 alert(s) not applied (state not persisted" in caplog.text  # its refusal
        assert svc.metrics.registry.get_sample_value(
            "fusebox_fuse_transitions_total", {"action": "freeze_admissions", "state": "trip", "source": "alert"}) is None
    finally:
        monkeypatch.undo()
        svc.store.close()


def test_a_store_whose_shm_cannot_be_allocated_stops_with_its_name(tmp_path, monkeypatch):
    def full(fd, offset, length):  # the volume full: the boundary this host cannot make happen safely
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(StoreError, match=r"fuse\.sqlite-shm: SQLite's shared-memory file cannot be given 128 KiB "
                                         r"\(No space left on device\).*SIGBUS"):
        Store(tmp_path / "fuse.sqlite")
    monkeypatch.undo()
    s = Store(tmp_path / "fuse.sqlite")  # with room: opened, its -shm's first 128 KiB allocated
    try:
        st = os.stat(tmp_path / "fuse.sqlite-shm")
        assert st.st_size >= 128 * 1024 and st.st_blocks * 512 >= 128 * 1024
    finally:
        s.close()


# SQLite's unix VFS (os_unix.c): the -shm file's "dead man switch" byte, UNIX_SHM_BASE (22 + 8) * 4 +
# SQLITE_SHM_NLOCK 8 = 128. Every process with the store open holds a shared lock on it; a process
# that gets it exclusively takes itself for the first and truncates the -shm.
SHM_DMS_BYTE = 128
_TAKE_DMS = f"""
import fcntl, sys
with open(sys.argv[1], "r+b") as f:
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {SHM_DMS_BYTE})
    except OSError:
        print("held")
    else:
        print("free")
"""


def _dms(shm: Path) -> str:
    return subprocess.run([sys.executable, "-c", _TAKE_DMS, str(shm)], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()


def test_an_open_store_keeps_sqlites_lock_on_its_shm_so_no_reader_truncates_it(tmp_path):
    """The -shm reservation once closed its own descriptor, which dropped SQLite's record locks on
    the file (they belong to the process): the next reader truncated the -shm under the served
    fuse's mmap and it died of SIGBUS (exit -7) on SIGTERM. A second process must find the lock held
    while the store is open (and free once it is closed)."""
    shm = tmp_path / "fuse.sqlite-shm"
    s = Store(tmp_path / "fuse.sqlite")
    try:
        s.ping()  # the probe connection too
        assert _dms(shm) == "held"
    finally:
        s.close()
    if shm.exists():  # SQLite deletes it when the last connection closes after a checkpoint
        assert _dms(shm) == "free"


def test_the_spec_bounds_the_refused_audit_and_refuses_a_bound_that_is_not_a_whole_positive_number():
    from fusebox.spec import parse_spec
    from fusebox.spec.errors import SpecError

    shipped = "\n  audit: {refused_per_minute: 100, refused_max_rows: 100000}\n"
    text = SPEC.read_text()
    assert text.count(shipped) == 1
    assert (load_spec(SPEC).audit.refused_per_minute, load_spec(SPEC).audit.refused_max_rows) == (100, 100_000)
    without = parse_spec(text.replace(shipped, "\n", 1), str(SPEC))  # the defaults are the shipped values
    assert (without.audit.refused_per_minute, without.audit.refused_max_rows) == (100, 100_000)
    spec = parse_spec(text.replace(shipped, "\n  audit: {refused_per_minute: 7, refused_max_rows: 900}\n", 1), str(SPEC))
    assert (spec.audit.refused_per_minute, spec.audit.refused_max_rows) == (7, 900)
    for bad in ("refused_per_minute: 0", 'refused_per_minute: "100"', "refused_max_rows: 1.5e5"):
        with pytest.raises(SpecError, match=r"fuse\.audit\.refused_(per_minute|max_rows)"):
            parse_spec(text.replace(shipped, f"\n  audit: {{{bad}}}\n", 1), str(SPEC))


@pytest.mark.process
def test_a_bus_error_in_the_served_fuse_says_so_on_stderr_before_it_exits(tmp_path):
    """The last resort where the -shm reservation cannot help: faulthandler's line and traceback
    (a SIGBUS sent by kill takes the same handler as one from a mmap'd page)."""
    hook, people = tmp_path / "hook", tmp_path / "people"
    _write(hook, TOKEN + "\n")
    _write(people, "".join(f"{n} {t}\n" for n, t in PEOPLE.items()))
    port = free_port()
    p = _serve(tmp_path, hook, people, port)
    try:
        wait_for(lambda: _up(f"http://127.0.0.1:{port}"), 30, 0.1, "fuse serve")
        p.send_signal(signal.SIGBUS)
        _, _, err = finish(p)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=30)
    assert p.returncode == -signal.SIGBUS
    assert "Fatal Python error: Bus error" in err, err


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.tools)])
def test_the_row_bound_counts_every_replicas_rows_and_a_prune_makes_room(tmp_path, backend, request):
    from fusebox.fuse.store import open_store

    url = (f"sqlite:///{tmp_path / 'fuse.sqlite'}" if backend == "sqlite"
           else request.getfixturevalue("pg").create_db("bound"))
    clock = [T0]
    rules = FuseRules.from_spec(load_spec(SPEC))

    def replica(name):
        return FuseService(rules, open_store(url), [DryRun()], hold_s=60, dry_run=True, replica=name,
                           clock=lambda: clock[0], audit_refused_per_minute=10_000, audit_refused_max_rows=300)

    a, b = replica("a"), replica("b")
    try:
        (note_a,) = _refused_notes(200, 200)
        assert a.handle(parse_payload(note_a, T0))["alerts"] == {"untrusted": 200}
        clock[0] += 1
        note_b = next(_refused_notes(200, 200, starts=T0 + 1))  # other episodes (startsAt), B's first window
        b.handle(parse_payload(note_b, T0 + 1))
        assert a.store.audit_count("ignored") == 300  # B counted A's 200 at its window's start
        assert b.metrics.registry.get_sample_value("fusebox_fuse_audit_refused_dropped_total", {"reason": "full"}) == 100
        before = a.store.audit_through(T0 + 10_000)
        a.store.prune_audit(before, sum(1 for _ in a.store.audit_rows(before)), "0" * 64, "test-export.jsonl", clock[0])
        clock[0] += 61  # B's next window counts again: the prune made room
        b.handle(parse_payload(next(_refused_notes(50, 50, starts=T0 + 2)), T0 + 2))
        rows = b.store.audit_log(1000, kinds=("ignored",))
        assert len(rows) == 50 + 1  # the 50, and the summary of the window that dropped 100
        assert sum(1 for r in rows if r["detail"].get("result") == "not_audited") == 1
    finally:
        a.store.close()
        b.store.close()
