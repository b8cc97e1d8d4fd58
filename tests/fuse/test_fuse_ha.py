"""The highly available fuse, with the real parts on loopback: Debian's PostgreSQL server (started by
the tests), two ``fusebox fuse serve`` replicas on it (subprocesses), two Debian Alertmanagers in
cluster mode notifying the replicas, and the reference gateway recording every control call.

Each case counts the calls the gateway received. What is guaranteed: one decision per change,
whichever replica receives which copy of a notification; the gateway gets each decision at least
once and, unless a replica dies between the call and recording it, exactly once (its decision id
makes a repeat harmless).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from _fuse_support import SPEC, TOKEN, alert, free_port, need_tool, payload, wait_for
from _pg_support import PgServer
from _slow_peers import TrickleHttp

from fusebox import conventions as C
from fusebox.demo.gateway import read_log
from fusebox.fuse.dispatch.dispatcher import TEST_HANG_ENV

pytestmark = pytest.mark.tools

GPU = {"cluster": "prod-a", "hw_id": "GPU-5f3c"}
LABELS = {"alertname": "GPUMemoryUtilizationHigh", "severity": "critical", "signal": "gpu_memory_utilization",
          "fuse_action": "freeze_admissions", "fuse_level": "1", **GPU}
HEARTBEAT = {"alertname": C.HEARTBEAT_ALERT, "severity": "none", "fusebox": "fusebox"}
HOLD = 1.5  # seconds
TIMEOUT = 3.0  # seconds, a gateway call's
LEASE = 4.0  # seconds

AM_CONFIG = """
route:
  receiver: fusebox-fuse
  group_by: [alertname, cluster, host_name, instance, hw_id, engine]
  group_wait: 100ms
  group_interval: 400ms
  repeat_interval: 1h
receivers:
  - name: fusebox-fuse
    webhook_configs:
{hooks}
"""
HOOK = """      - url: {url}/alertmanager
        send_resolved: true
        http_config:
          authorization:
            credentials_file: {token_file}
"""


class Cluster:
    """The parts of one test: a database on ``pg``, the gateway, replicas and Alertmanagers."""

    def __init__(self, pg: PgServer, tmp_path, name: str):
        self.pg, self.tmp = pg, tmp_path
        self.url = pg.create_db(name)
        self.token_file = tmp_path / "token"
        self.token_file.write_text(TOKEN + "\n")
        self.gw_log = tmp_path / "gw.jsonl"
        self.gw_url = f"http://127.0.0.1:{free_port()}"
        self.gw = subprocess.Popen([sys.executable, "-m", "fusebox.cli", "fuse", "gateway", "--listen",
                                    self.gw_url.removeprefix("http://"), "--log", str(self.gw_log)],
                                   stdout=subprocess.DEVNULL, stderr=open(tmp_path / "gw.log", "wb"))
        wait_for(lambda: _up(self.gw_url), 30, 0.1, "the reference gateway")
        self.replicas: dict[str, tuple[subprocess.Popen, str]] = {}
        self.ams: dict[str, subprocess.Popen] = {}
        self.am_urls: dict[str, str] = {}

    # ---------------------------------------------------------------- replicas
    def replica(self, name: str, *, env: dict | None = None, wait: bool = True, gw_url: str | None = None,
                timeout: float = TIMEOUT, lease: float = LEASE, backoff: float = 0.05, ahead_s: float = 0) -> str:
        """``ahead_s``: the replica's wall clock runs that many seconds ahead (``time.time`` shifted in
        that process before anything starts, as a host whose clock is off)."""
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, **(env or {})}
        if ahead_s:
            shim = self.tmp / f"clock-{name}"
            shim.mkdir()
            (shim / "sitecustomize.py").write_text(
                f"import time\n_real = time.time\ntime.time = lambda: _real() + {ahead_s!r}\n")
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), env.get("PYTHONPATH", "")) if p)
        p = subprocess.Popen(
            [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen", f"127.0.0.1:{port}",
             "--store", self.url, "--token-file", str(self.token_file), "--gateway-url", gw_url or self.gw_url,
             "--hold", str(HOLD), "--tick", "0.05", "--retry-backoff", str(backoff), "--retry-max", "0.5",
             "--timeout", str(timeout), "--lease", str(lease), "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=open(self.tmp / f"{name}.log", "wb"), env=env)
        self.replicas[name] = (p, url)
        if wait:
            wait_for(lambda: _up(url), 30, 0.1, f"replica {name}")
        return url

    def kill(self, name: str) -> None:
        p, _ = self.replicas[name]
        p.send_signal(signal.SIGKILL)
        p.wait(10)

    # ---------------------------------------------------------------- Alertmanagers
    def alertmanagers(self, targets: dict[str, list[str]]) -> None:
        """Two clustered Alertmanagers; ``targets``: AM name -> the replica URLs it notifies."""
        exe = need_tool("prometheus-alertmanager", "alertmanager")
        cports = {n: free_port() for n in targets}
        for n, urls in targets.items():
            cfg = self.tmp / f"{n}.yml"
            cfg.write_text(AM_CONFIG.format(hooks="".join(HOOK.format(url=u, token_file=self.token_file) for u in urls)))
            port = free_port()
            peers = [f"--cluster.peer=127.0.0.1:{p}" for m, p in cports.items() if m != n]
            self.ams[n] = subprocess.Popen(
                [exe, f"--config.file={cfg}", f"--storage.path={self.tmp / (n + '-data')}",
                 f"--web.listen-address=127.0.0.1:{port}", f"--cluster.listen-address=127.0.0.1:{cports[n]}",
                 *peers, "--cluster.gossip-interval=50ms", "--cluster.pushpull-interval=1s",
                 "--cluster.peer-timeout=500ms", "--cluster.settle-timeout=2s", "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=open(self.tmp / f"{n}.log", "wb"))
            self.am_urls[n] = f"http://127.0.0.1:{port}"
        for n, url in self.am_urls.items():
            wait_for(lambda url=url: _ready(url), 30, 0.1, f"alertmanager {n}")
        # clustered: each sees the other as a peer
        wait_for(lambda: all(len(httpx.get(u + "/api/v2/status", timeout=2).json()["cluster"].get("peers") or []) == 2
                             for u in self.am_urls.values()), 20, 0.1, "alertmanager cluster formed")

    def post_alerts(self, labels: list[dict], starts: datetime, ends: datetime | None = None, only=None) -> None:
        """As Prometheus does: the same alerts to every (living) Alertmanager."""
        body = [{"labels": lb, "startsAt": _rfc3339(starts), **({"endsAt": _rfc3339(ends)} if ends else {})}
                for lb in labels]
        for n, url in self.am_urls.items():
            if only is None or n in only:
                assert httpx.post(url + "/api/v2/alerts", json=body, timeout=5).status_code == 200

    # ---------------------------------------------------------------- what happened
    def calls(self) -> list[tuple[str, int]]:
        return [(r["state"], r["level"]) for r in read_log(self.gw_log)]

    def decisions(self) -> set[str]:
        return {r["decision_id"] for r in read_log(self.gw_log)}

    def db(self, sql: str) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as c:
            return c.execute(sql).fetchall()

    def close(self) -> None:
        for p, _ in self.replicas.values():
            if p.poll() is None:
                p.terminate()
                p.wait(10)
        for p in self.ams.values():
            if p.poll() is None:
                p.terminate()
                p.wait(10)
        self.gw.terminate()
        self.gw.wait(10)


@pytest.fixture
def cluster(pg, tmp_path, request):
    c = Cluster(pg, tmp_path, request.node.name.removeprefix("test_")[:40].lower())
    yield c
    c.close()


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _rfc3339(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def _post(url: str, body: dict) -> int:
    return httpx.post(url + "/alertmanager", json=body, headers={"Authorization": f"Bearer {TOKEN}"},
                      timeout=10).status_code


def _metric(url: str, name: str, **labels) -> float:
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


def _notified(url: str) -> float:
    """Notifications a replica answered 200 (whether they changed anything or not)."""
    return sum(_metric(url, C.FUSE_METRICS["notifications"], outcome=o) for o in ("applied", "ignored"))


def _settled(c: Cluster, n: int, quiet: float = 1.0) -> None:
    """Wait for ``n`` gateway calls, then ``quiet`` seconds more, in which any extra call would come."""
    wait_for(lambda: len(read_log(c.gw_log)) >= n, 20, 0.05, f"{n} gateway call(s)")
    time.sleep(quiet)


# ------------------------------------------------------------------------------------------ cases
def test_one_incident_through_two_clustered_alertmanagers_and_two_replicas(cluster):
    """1. Each Alertmanager notifies both replicas: one trip and one release. The heartbeat goes
    the same way and trips nothing."""
    a, b = cluster.replica("a"), cluster.replica("b")
    cluster.alertmanagers({"am1": [a, b], "am2": [a, b]})
    start = datetime.now(UTC) - timedelta(seconds=5)
    cluster.post_alerts([LABELS, HEARTBEAT], start)
    _settled(cluster, 1)
    assert cluster.calls() == [("trip", 1)]
    cluster.post_alerts([LABELS], start, datetime.now(UTC))
    _settled(cluster, 2, HOLD + 0.5)
    assert cluster.calls() == [("trip", 1), ("release", 1)]
    assert len(cluster.decisions()) == 2 and not any(r["duplicate"] for r in read_log(cluster.gw_log))
    assert all(_notified(u) >= 2 for u in (a, b))  # each replica got the firing and the resolved


def test_the_same_notification_to_both_replicas_20_times_concurrently_trips_once(cluster):
    """2. 40 concurrent POSTs (20 to each replica) of the same firing: one trip."""
    a, b = cluster.replica("a"), cluster.replica("b")
    body = payload(alert("GPUMemoryUtilizationHigh", starts=time.time() - 30, **GPU))
    codes: list[int] = []
    gate = threading.Barrier(40)

    def send(url):
        gate.wait()
        codes.append(_post(url, body))

    threads = [threading.Thread(target=send, args=(u,)) for u in (a, b) * 20]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [200] * 40
    _settled(cluster, 1)
    assert cluster.calls() == [("trip", 1)]
    assert cluster.db("SELECT count(*) FROM audit WHERE kind='trip'") == [(1,)]


def test_replica_a_killed_between_trip_and_release_b_releases_once(cluster):
    """3. A and B each notified by one Alertmanager. The resolved starts the hold; A is killed
    (SIGKILL) before it ends: B releases, once, from the hold time stored in the database."""
    a, b = cluster.replica("a"), cluster.replica("b")
    cluster.alertmanagers({"am1": [a], "am2": [b]})
    start = datetime.now(UTC) - timedelta(seconds=5)
    cluster.post_alerts([LABELS], start)
    _settled(cluster, 1, 0.5)
    cluster.post_alerts([LABELS], start, datetime.now(UTC))
    wait_for(lambda: '"release_at":null' not in cluster.db("SELECT value FROM breaker_state WHERE kind='s'")[0][0],
             10, 0.02, "the hold started")
    cluster.kill("a")
    _settled(cluster, 2, HOLD + 0.5)
    assert cluster.calls() == [("trip", 1), ("release", 1)]
    b_pid = cluster.replicas["b"][0].pid
    (claimer,) = cluster.db("""SELECT claimed_by FROM outbox WHERE payload LIKE '%"state":"release"%'""")[0]
    assert f":{b_pid}:" in claimer


def test_replica_a_killed_after_claiming_a_call_b_makes_it_once_after_the_lease(cluster):
    """4. A claims the trip's gateway call and is killed before making it (the test-only hang
    after claiming); B, started then, makes it once, after A's lease ended."""
    a = cluster.replica("a", env={TEST_HANG_ENV: "60"})
    assert _post(a, payload(alert("GPUMemoryUtilizationHigh", starts=time.time() - 30, **GPU))) == 200
    wait_for(lambda: cluster.db("SELECT claimed_by, lease_until FROM outbox WHERE claimed_by IS NOT NULL"),
             10, 0.02, "A claimed the call")
    ((lease_until,),) = cluster.db("SELECT lease_until FROM outbox")
    cluster.kill("a")
    cluster.replica("b")
    _settled(cluster, 1)
    log = read_log(cluster.gw_log)
    assert cluster.calls() == [("trip", 1)] and len(cluster.decisions()) == 1
    assert log[0]["at"] >= lease_until
    assert cluster.db("SELECT status, attempts FROM outbox") == [("applied", 1)]


def test_postgresql_restarted_mid_incident_replicas_answer_503_nothing_lost_or_doubled(cluster):
    """5. The trip is made; PostgreSQL stops; the resolved reaches the replicas, which answer 503
    (Alertmanager retries); PostgreSQL starts again: the release is made once."""
    a, b = cluster.replica("a"), cluster.replica("b")
    cluster.alertmanagers({"am1": [a, b], "am2": [a, b]})
    start = datetime.now(UTC) - timedelta(seconds=5)
    cluster.post_alerts([LABELS], start)
    _settled(cluster, 1, 0.5)
    cluster.pg.stop()
    try:
        resolved = payload(alert("GPUMemoryUtilizationHigh", "resolved", starts=start.timestamp(), **GPU))
        assert (_post(a, resolved), _post(b, resolved)) == (503, 503)
        cluster.post_alerts([LABELS], start, datetime.now(UTC))
        wait_for(lambda: sum(_metric(u, C.FUSE_METRICS["notifications"], outcome="http_503") for u in (a, b)) >= 3,
                 10, 0.1, "Alertmanager's notification answered 503")
        time.sleep(1.0)
        assert cluster.calls() == [("trip", 1)]
    finally:
        cluster.pg.start()
    _settled(cluster, 2, HOLD + 0.5)
    assert cluster.calls() == [("trip", 1), ("release", 1)]
    assert len(cluster.decisions()) == 2


def test_one_alertmanager_peer_killed_the_other_keeps_notifying_one_trip(cluster):
    """6. am1 is killed (SIGKILL); am2 alone notifies both replicas: one trip."""
    a, b = cluster.replica("a"), cluster.replica("b")
    cluster.alertmanagers({"am1": [a, b], "am2": [a, b]})
    cluster.ams["am1"].send_signal(signal.SIGKILL)
    cluster.ams["am1"].wait(10)
    start = datetime.now(UTC) - timedelta(seconds=5)
    cluster.post_alerts([LABELS, HEARTBEAT], start, only={"am2"})
    _settled(cluster, 1, 1.5)
    assert cluster.calls() == [("trip", 1)]
    assert all(_notified(u) >= 1 for u in (a, b))


# ----------------------------------------------------------------------- calls bounded by the lease
def test_a_gateway_trickling_its_answer_never_gets_the_same_call_from_two_replicas_at_once(cluster):
    """7. --timeout 2 --lease 3; the gateway trickles its first answer over 15 s (later ones come at
    once). The first call is cut off at its 2 s deadline, inside the lease, and retried: the
    gateway never has two calls under way at once, and the decision has one ``applied`` row."""
    gw = TrickleHttp(gap=0.01, size=1500, first_only=True)
    try:
        a = cluster.replica("a", gw_url=gw.url, timeout=2, lease=3, backoff=0.5)
        cluster.replica("b", gw_url=gw.url, timeout=2, lease=3, backoff=0.5)
        assert _post(a, payload(alert("GPUMemoryUtilizationHigh", starts=time.time() - 30, **GPU))) == 200
        wait_for(lambda: cluster.db("SELECT status FROM outbox") == [("applied",)], 30, 0.05, "the trip applied")
        wait_for(lambda: len(gw.sent) == 1, 30, 0.05, "the trickled answer ended")
        time.sleep(1.0)  # a late result of the first call would be recorded by now
    finally:
        gw.stop()
    assert gw.most == 1  # never two calls under way at once
    assert gw.sent[0] < 1500  # the first answer was cut off
    assert cluster.db("SELECT count(*) FROM audit WHERE kind='applied'") == [(1,)]


def test_a_replica_10s_ahead_keeps_the_hold_time_of_the_database_clock(cluster):
    """8. Replica B's clock is 10 s ahead. A trips and receives the resolved; the hold (1.5 s) is
    ended by whichever replica ticks first: the release reaches the gateway no sooner than the
    hold after the resolved (on B's own clock it would be due at once)."""
    a = cluster.replica("a")
    cluster.replica("b", ahead_s=10)
    start = time.time() - 30
    assert _post(a, payload(alert("GPUMemoryUtilizationHigh", starts=start, **GPU))) == 200
    _settled(cluster, 1, 0.3)
    resolved_at = time.time()
    assert _post(a, payload(alert("GPUMemoryUtilizationHigh", "resolved", starts=start, **GPU))) == 200
    _settled(cluster, 2, 0.5)
    log = read_log(cluster.gw_log)
    assert [(r["state"], r["level"]) for r in log] == [("trip", 1), ("release", 1)]
    assert log[1]["at"] >= resolved_at + HOLD


def test_a_replica_10s_ahead_does_not_take_over_a_call_before_the_lease_ends(cluster):
    """9. A claims the call and hangs (test-only) until killed; B, 10 s ahead, makes it once, after
    A's lease (4 s on the database's clock) ended, not at once."""
    a = cluster.replica("a", env={TEST_HANG_ENV: "60"})
    assert _post(a, payload(alert("GPUMemoryUtilizationHigh", starts=time.time() - 30, **GPU))) == 200
    wait_for(lambda: cluster.db("SELECT claimed_by FROM outbox WHERE claimed_by IS NOT NULL"), 10, 0.02, "A claimed")
    ((lease_until,),) = cluster.db("SELECT lease_until FROM outbox")
    cluster.replica("b", ahead_s=10)
    _settled(cluster, 1)
    cluster.kill("a")
    log = read_log(cluster.gw_log)
    assert cluster.calls() == [("trip", 1)] and log[0]["at"] >= lease_until
    assert cluster.db("SELECT status, attempts FROM outbox") == [("applied", 1)]


# --------------------------------------------------------------------------------- graceful SIGTERM
def test_sigterm_releases_the_claim_so_the_next_replica_calls_without_waiting_out_the_lease(cluster):
    """10. A claims the call (lease 60 s) and hangs before making it (test-only); SIGTERM: A stops
    taking work, releases its claim, closes the store and exits 0. B, started then, makes the call
    once, long before A's lease would have ended."""
    a = cluster.replica("a", env={TEST_HANG_ENV: "60"}, lease=60)
    assert _post(a, payload(alert("GPUMemoryUtilizationHigh", starts=time.time() - 30, **GPU))) == 200
    wait_for(lambda: cluster.db("SELECT claimed_by FROM outbox WHERE claimed_by IS NOT NULL"), 10, 0.02, "A claimed")
    ((lease_until,),) = cluster.db("SELECT lease_until FROM outbox")
    p, _ = cluster.replicas["a"]
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0
    assert cluster.db("SELECT status, claimed_by, lease_until FROM outbox") == [("pending", None, None)]
    # its connections are closed (PostgreSQL lists none of the fuse's)
    assert cluster.db("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'fusebox-fuse%'") == [(0,)]
    assert "Traceback" not in (cluster.tmp / "a.log").read_text()
    cluster.replica("b")
    _settled(cluster, 1)
    assert cluster.calls() == [("trip", 1)] and read_log(cluster.gw_log)[0]["at"] < lease_until
    assert cluster.db("SELECT status, attempts FROM outbox") == [("applied", 1)]
