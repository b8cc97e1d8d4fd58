"""The fuse at fleet scale (issue 22, "Scale"): a change persists, looks at and sets the gauges of
only the scopes it touches, whatever the scopes held; the level series are capped (totals always);
notifications are handled off the event loop (``/healthz`` and ``/readyz`` answer while one runs);
``/state`` and the status page are paginated and filterable; the whole-state snapshot of schema
version 4 is migrated into per-scope rows. No timing is asserted here: bench/bench_fuse.py --fleet
measures the costs."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time

import httpx
import pytest
from _fuse_support import PEOPLE, SPEC, TOKEN, alert, dry_run_service, free_port, payload, serve_dry_run, wait_for, wait_ok
from fastapi.testclient import TestClient

from fusebox import conventions as C
from fusebox.fuse.adapters.gateway import DryRun
from fusebox.fuse.http.app import create_app
from fusebox.fuse.intake.breaker import Breaker
from fusebox.fuse.intake.payload import parse_payload
from fusebox.fuse.rules import FuseRules
from fusebox.fuse.service import FuseService
from fusebox.fuse.store import SCHEMA_VERSION, Store
from fusebox.fuse.tokens import Tokens
from fusebox.spec import load_spec

AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOKENS = Tokens(webhook=TOKEN, people=dict(PEOPLE))
T0 = 1_700_000_000.0


def _gpu(i: int) -> dict:
    return {"cluster": "a", "hw_id": f"GPU-{i:05d}"}  # one length for every scope: the same bytes per row


def _fleet(n: int, status: str = "firing", first: int = 0) -> dict:
    """One notification of ``n`` alerts, each on a scope of its own (GPU-first..GPU-first+n-1)."""
    return payload(*[alert("GPUMemoryUtilizationHigh", status, starts=T0, **_gpu(i)) for i in range(first, first + n)])


def _service(tmp_path, **kw) -> FuseService:
    return FuseService(FuseRules.from_spec(load_spec(SPEC)), Store(tmp_path / "fuse.sqlite"), [DryRun()],
                       hold_s=60, dry_run=True, **kw)


def _handle(svc: FuseService, body: dict) -> dict:
    return svc.handle(parse_payload(body, T0 + 1), T0 + 1)


class _Written:
    """What the store is asked to write per commit: state rows, their JSON bytes, and the rows SQLite
    changed (``total_changes``: state, outbox, audit, meta)."""

    def __init__(self, svc: FuseService):
        self.svc, self.commits = svc, []
        real = svc.store.commit

        def commit(snapshot, outbox=(), audit=(), *, changes=None):
            before = svc.store._db.total_changes
            real(snapshot, outbox, audit, changes=changes)
            rows = list(changes or ())
            self.commits.append({"state_rows": len(rows), "db_rows": svc.store._db.total_changes - before,
                                 "state_bytes": sum(len(json.dumps(v, separators=(",", ":"))) for _, _, v in rows),
                                 # the same, hex digits left out: times and fingerprints vary in length
                                 "state_shape_bytes": sum(len(re.sub(r"[0-9a-f]", "", json.dumps(v, separators=(",", ":"))))
                                                          for _, _, v in rows)})

        svc.store.commit = commit  # type: ignore[method-assign]


def _one_change_each(svc: FuseService, held: int) -> list[dict]:
    """With ``held`` scopes held: a new scope trips, then a held scope's alert resolves."""
    w = _Written(svc)
    _handle(svc, _fleet(1, first=90_000))
    _handle(svc, _fleet(1, "resolved", first=0))
    return w.commits


def test_a_change_writes_the_same_rows_and_bytes_with_3000_scopes_held_as_with_one(tmp_path):
    (tmp_path / "few").mkdir()
    (tmp_path / "many").mkdir()
    few, many = _service(tmp_path / "few"), _service(tmp_path / "many")
    try:
        _handle(few, _fleet(1))
        _handle(many, _fleet(3000))
        assert len(many.breaker.scopes) == 3000 and len(few.breaker.scopes) == 1
        a, b = _one_change_each(few, 1), _one_change_each(many, 3000)
        rows = [(c["state_rows"], c["db_rows"]) for c in a]
        assert rows == [(c["state_rows"], c["db_rows"]) for c in b], (a, b)
        # the same bytes, but for digits (fingerprints are not zero-padded; a float time's repr varies in length)
        assert [x["state_shape_bytes"] for x in a] == [y["state_shape_bytes"] for y in b], (a, b)
        assert all(abs(x["state_bytes"] - y["state_bytes"]) <= 40 for x, y in zip(a, b, strict=False)), (a, b)
        # the trip: one scope row (and the outbox row, the audit row, the version); the resolve:
        # the scope row and the fingerprint's tombstone
        assert [c["state_rows"] for c in a] == [1, 2]
        assert all(c["db_rows"] < 10 for c in a), a
        assert many.store.state_rows() == 3001 + 1  # 3,001 scopes and one tombstone: one row each
    finally:
        few.store.close()
        many.store.close()


class _CountingScopes(dict):
    """The breaker's scopes, counting every walk over them (iteration, keys, values, items)."""

    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()

    def keys(self):
        type(self).walks += 1
        return super().keys()

    def values(self):
        type(self).walks += 1
        return super().values()

    def items(self):
        type(self).walks += 1
        return super().items()


def test_no_change_walks_the_scopes_held_a_3000_alert_resolve_included(tmp_path):
    svc = _service(tmp_path)
    try:
        _handle(svc, _fleet(3000))
        svc.breaker.scopes = _CountingScopes(svc.breaker.scopes)
        _CountingScopes.walks = 0
        r1 = _handle(svc, _fleet(1, first=90_000))  # a new scope trips
        r2 = _handle(svc, _fleet(3000, "resolved"))  # every held alert resolves: each found by its fingerprint
        svc.tick()
        assert r1["alerts"] == {"tripped": 1} and r2["alerts"] == {"release_pending": 3000}
        assert _CountingScopes.walks == 0
    finally:
        svc.store.close()


def test_gauges_of_unchanged_scopes_are_not_touched(tmp_path):
    svc = _service(tmp_path)
    try:
        _handle(svc, _fleet(50))
        touched: list[tuple] = []
        gauge = svc.metrics.level
        real_labels, real_remove, real_clear = gauge.labels, gauge.remove, gauge.clear
        gauge.labels = lambda *v: touched.append(("set", v)) or real_labels(*v)  # type: ignore[method-assign]
        gauge.remove = lambda *v: touched.append(("remove", v)) or real_remove(*v)  # type: ignore[method-assign]
        gauge.clear = lambda: touched.append(("clear",)) or real_clear()  # type: ignore[method-assign]
        _handle(svc, payload(alert("KVCacheGrowthRateHigh", starts=T0, **_gpu(7))))  # level 3 on GPU-00007
        assert touched == [("set", ("a", "", "", "GPU-00007", ""))]
        assert svc.metrics.registry.get_sample_value(C.FUSE_LEVEL_METRIC, {
            "cluster": "a", "host_name": "", "instance": "", "hw_id": "GPU-00007", "engine": ""}) == 3
    finally:
        svc.store.close()


def _series(svc: FuseService) -> dict[str, float]:
    return {s.labels["hw_id"]: s.value for m in svc.metrics.registry.collect() if m.name == C.FUSE_LEVEL_METRIC
            for s in m.samples}


def test_level_series_are_capped_the_most_severe_first_and_the_totals_count_every_scope(tmp_path):
    svc = _service(tmp_path, max_level_series=3)
    svc.breaker.hold_s = 0
    sample = svc.metrics.registry.get_sample_value
    try:
        _handle(svc, _fleet(5))
        _handle(svc, _fleet(5, "resolved"))  # five idle scopes (level 0)
        assert len(_series(svc)) == 3 and set(_series(svc).values()) == {0}
        _handle(svc, payload(alert("KVCacheGrowthRateHigh", starts=T0 + 5, **_gpu(3)),
                             alert("GPUMemoryUtilizationHigh", starts=T0 + 5, **_gpu(4))))
        s = _series(svc)
        assert len(s) == 3 and s["GPU-00003"] == 3 and s["GPU-00004"] == 1, s
        assert sample(C.FUSE_METRICS["scopes"], {"level": "0"}) == 3
        assert sample(C.FUSE_METRICS["scopes"], {"level": "1"}) == 1
        assert sample(C.FUSE_METRICS["scopes"], {"level": "3"}) == 1
        assert sample(C.FUSE_METRICS["level_series_dropped"]) == 2
        _handle(svc, payload(alert("KVCacheGrowthRateHigh", "resolved", starts=T0 + 5, **_gpu(3))))
        assert sample(C.FUSE_METRICS["scopes"], {"level": "3"}) == 0
        assert _series(svc)["GPU-00004"] == 1 and len(_series(svc)) == 3
    finally:
        svc.store.close()


# ------------------------------------------------------------------ persistence and replicas
def test_a_version_4_snapshot_is_migrated_into_one_row_per_scope(tmp_path):
    path = tmp_path / "fuse.sqlite"
    b = Breaker(FuseRules.from_spec(load_spec(SPEC)), 60)
    b.on_notification(parse_payload(_fleet(3), T0), T0)
    b.on_notification(parse_payload(_fleet(1, "resolved"), T0 + 1), T0 + 1)
    snap = b.snapshot()
    s = Store(path)
    s.close()
    db = sqlite3.connect(path)  # the file as fusebox with schema 4 left it
    db.executescript("DROP TABLE breaker_state; DELETE FROM schema_version WHERE version >= 5;"
                     "ALTER TABLE outbox DROP COLUMN claim_gen;"
                     "DELETE FROM meta WHERE key = 'state_horizon';")
    db.execute("INSERT INTO meta VALUES ('breaker', ?)", (json.dumps(snap),))
    db.execute("UPDATE meta SET value = '7' WHERE key = 'breaker_version'")
    db.commit()
    db.close()
    svc = _service(tmp_path)
    try:
        assert svc.store.schema_version() == SCHEMA_VERSION == 6
        assert svc.store.snapshot() == json.loads(json.dumps(snap))
        assert svc.store.version() == 7 and svc.store.state_rows() == 4  # 3 scopes, 1 tombstone
        assert svc.store._rows("SELECT count(*) FROM meta WHERE key = 'breaker'") == [(0,)]
        assert svc.breaker.snapshot() == b.snapshot()
        assert svc.state()["levels"] == {'{cluster="a",hw_id="GPU-00000"}': 1, '{cluster="a",hw_id="GPU-00001"}': 1,
                                         '{cluster="a",hw_id="GPU-00002"}': 1}
    finally:
        svc.store.close()


def test_a_replica_takes_back_only_the_rows_changed_and_all_when_past_the_purge(tmp_path, monkeypatch):
    """Two services on one store (as replicas on PostgreSQL; tests/fuse/test_fuse_ha.py runs those): B
    reads what A changed, row by row; a scope A dropped reaches B as gone; B, behind the purge of
    such rows, reads the whole state again."""
    import fusebox.fuse.store as store_mod

    a, b = _service(tmp_path, max_scopes=2), _service(tmp_path, max_scopes=2)
    a.breaker.hold_s = b.breaker.hold_s = 0
    try:
        _handle(a, _fleet(2))
        assert b.state()["levels"] == {'{cluster="a",hw_id="GPU-00000"}': 1, '{cluster="a",hw_id="GPU-00001"}': 1}
        _handle(b, _fleet(1, "resolved"))  # GPU-00000 released at once (hold 0): idle
        _handle(a, _fleet(1, first=2))  # A takes B's change back, drops the idle GPU-00000 for GPU-00002
        assert [sc["key"] for sc in b.state()["scopes"]] == ['{cluster="a",hw_id="GPU-00001"}',
                                                             '{cluster="a",hw_id="GPU-00002"}']
        assert b.breaker.snapshot() == a.breaker.snapshot()
        monkeypatch.setattr(store_mod, "PURGE_EVERY", 2)
        seen = []
        real = b.breaker.restore
        b.breaker.restore = lambda snap: seen.append("whole") or real(snap)  # type: ignore[method-assign]
        for i in range(4):  # A writes; the rows of what is gone are purged below A's version - 2
            _handle(a, _fleet(1, "resolved", first=1 + i % 2))
            _handle(a, payload(alert("GPUMemoryUtilizationHigh", starts=T0 + 10 + i, **_gpu(1 + i % 2))))
        assert b.state()["total"] == 2 and seen == ["whole"]
        assert b.breaker.snapshot() == a.breaker.snapshot()
    finally:
        a.store.close()
        b.store.close()


# ------------------------------------------------------------------ off the event loop
def test_healthz_and_readyz_answer_while_a_change_holds_the_store(tmp_path):
    """A notification stuck inside its store transaction (service lock and store connection held,
    the SQLite write lock taken) delays neither /healthz (the event loop) nor /readyz (its own
    connection and threads)."""
    import uvicorn

    svc = _service(tmp_path)
    entered, release = threading.Event(), threading.Event()
    real = svc.store.commit

    def slow_commit(*a, **kw):
        entered.set()
        release.wait(30)
        return real(*a, **kw)

    svc.store.commit = slow_commit  # type: ignore[method-assign]
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(svc, TOKENS), host="127.0.0.1", port=port, log_level="error",
                                           lifespan="off"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: server.started, 10, what="uvicorn start")
        posted: dict = {}
        poster = threading.Thread(target=lambda: posted.update(r=httpx.post(
            url + "/alertmanager", json=_fleet(20), headers=AUTH, timeout=60)))
        poster.start()
        assert entered.wait(30), "the notification never reached the store"
        assert httpx.get(url + "/healthz", timeout=5).text == "ok"
        r = httpx.get(url + "/readyz", timeout=5)
        assert r.status_code == 200, r.text
        assert poster.is_alive()  # the notification is still being handled
        release.set()
        poster.join(30)
        assert posted["r"].status_code == 200 and posted["r"].json()["alerts"] == {"tripped": 20}
    finally:
        release.set()
        server.should_exit = True
        th.join(10)
        svc.store.close()


def test_healthz_answers_during_a_3000_alert_notification_on_a_served_fuse_with_3000_scopes(tmp_path):
    """`fusebox fuse serve` (a process) holding 3,000 scopes gets 3,000 resolved alerts in one
    notification while /healthz is asked over and over: every probe answers 200 (within a
    generous 5 s; the 1 s figure is bench/bench_fuse.py --fleet's), some while the notification runs."""
    (tmp_path / "token").write_text(TOKEN)
    proc, url = serve_dry_run(tmp_path / "s.sqlite", tmp_path / "token")
    try:
        wait_ok(url + "/healthz", proc)
        for first in range(0, 3000, 1000):
            r = httpx.post(url + "/alertmanager", json=_fleet(1000, first=first), headers=AUTH, timeout=120)
            assert r.status_code == 200, r.text
        alerts = _fleet(3000, "resolved")
        for a in alerts["alerts"]:  # fit 3,000 alerts in the 1 MiB body limit
            del a["generatorURL"], a["annotations"], a["endsAt"]
        body = json.dumps(alerts, separators=(",", ":")).encode()
        assert len(body) < 1 << 20
        done = threading.Event()
        probes: list[tuple[int, bool]] = []
        posted: dict = {}

        def post():
            posted["r"] = httpx.post(url + "/alertmanager", content=body, timeout=120,
                                     headers={**AUTH, "Content-Type": "application/json"})
            done.set()

        poster = threading.Thread(target=post)
        poster.start()
        while not done.is_set():
            code = httpx.get(url + "/healthz", timeout=5).status_code
            probes.append((code, not done.is_set()))
            time.sleep(0.005)
        poster.join()
        assert posted["r"].status_code == 200 and posted["r"].json()["alerts"] == {"release_pending": 3000}
        assert probes and all(code == 200 for code, _ in probes)
        assert any(during for _, during in probes), "no probe answered while the notification ran"
    finally:
        proc.terminate()
        proc.wait(10)


# ------------------------------------------------------------------ pagination and filters
@pytest.fixture
def paged(tmp_path):
    svc = dry_run_service(tmp_path)
    svc.handle(parse_payload(payload(*[alert("GPUMemoryUtilizationHigh", starts=T0, cluster=c, hw_id=f"G{i}")
                                       for c in ("a", "b") for i in range(5)]), T0 + 1), T0 + 1)
    svc.handle(parse_payload(payload(alert("KVCacheGrowthRateHigh", starts=T0, cluster="b", hw_id="G3"),
                                     alert("GPUMemoryUtilizationHigh", "resolved", starts=T0, cluster="a", hw_id="G0")),
                             T0 + 2), T0 + 2)
    yield TestClient(create_app(svc, TOKENS))
    svc.store.close()


def _keys(r) -> list[str]:
    return [sc["key"] for sc in r.json()["scopes"]]


def test_state_pages_in_key_order_and_by_default_holds_every_scope_of_a_small_fleet(paged):
    whole = paged.get("/state", headers=AUTH).json()
    assert (whole["total"], whole["offset"], whole["limit"], whole["next_offset"]) == (10, 0, 1000, None)
    assert len(whole["scopes"]) == 10 and len(whole["levels"]) == 10  # G0 of a: release pending, still tripped
    keys = [sc["key"] for sc in whole["scopes"]]
    assert keys == sorted(keys)
    got, offset = [], 0
    while offset is not None:
        r = paged.get("/state", params={"limit": 4, "offset": offset}, headers=AUTH)
        assert r.status_code == 200 and r.json()["total"] == 10 and len(r.json()["scopes"]) <= 4
        assert set(r.json()["levels"]) == set(_keys(r))  # levels: of the page's scopes
        got += _keys(r)
        offset = r.json()["next_offset"]
    assert got == keys


def test_state_filters_by_scope_labels_and_by_level(paged):
    r = paged.get("/state", params={"scope": "cluster=b"}, headers=AUTH)
    assert r.json()["total"] == 5 and all(k.startswith('{cluster="b"') for k in _keys(r))
    r = paged.get("/state", params={"scope": '{cluster="b",hw_id="G3"}'}, headers=AUTH)
    assert _keys(r) == ['{cluster="b",hw_id="G3"}'] and r.json()["levels"] == {'{cluster="b",hw_id="G3"}': 3}
    r = paged.get("/state", params={"level": 2}, headers=AUTH)
    assert _keys(r) == ['{cluster="b",hw_id="G3"}'] and r.json()["tripped"] == {'{cluster="b",hw_id="G3"}': 3}
    r = paged.get("/state", params={"level": 1, "scope": "cluster=a", "limit": 2}, headers=AUTH)
    assert r.json()["total"] == 5 and len(_keys(r)) == 2 and len(r.json()["tripped"]) == 5


@pytest.mark.parametrize("query,field", [({"limit": 0}, "limit"), ({"limit": 1001}, "limit"),
                                         ({"offset": -1}, "offset"), ({"level": "x"}, "level"),
                                         ({"scope": "cluster"}, "scope")])
def test_a_bad_page_or_filter_is_a_400_naming_the_parameter(paged, query, field):
    r = paged.get("/state", params=query, headers=AUTH)
    assert r.status_code == 400 and r.json()["field"].endswith(field), r.text
    assert paged.get("/state", params=query).status_code == 401  # the token first


def test_the_status_page_pages_and_filters_as_state_does(paged):
    page = paged.get("/", params={"limit": 3}, headers=AUTH).text
    assert len(re.findall(r'<tr class="(?:tripped|ok|releasing)" data-scope=', page)) == 3
    assert 'id="next-page" href="?limit=3&amp;offset=3"' in page and "prev-page" not in page
    assert "8 more scope rows" in page  # 11 rows: b/G3 has two levels
    page = paged.get("/", params={"limit": 3, "offset": 3}, headers=AUTH).text
    assert 'id="prev-page" href="?limit=3&amp;offset=0"' in page
    page = paged.get("/", params={"level": 3}, headers=AUTH).text
    assert re.findall(r'data-scope="([^"]+)"', page) == ['{cluster=&#34;b&#34;,hw_id=&#34;G3&#34;}'] * 2
    assert "next-page" not in page
