"""The fuse's store failing under a running ``fusebox fuse serve`` (a subprocess), with real parts:
Debian's PostgreSQL server stopped and started again, and a SQLite file on a 2 MiB tmpfs that fills
up (issue 22). What is counted: the fuse's log lines, its answers (``/state``, ``/readyz``, the
webhook) and its self-metrics."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from _fuse_support import SPEC, TOKEN, alert, free_port, payload, wait_for
from _pg_support import PgServer

from fusebox import conventions as C
from fusebox.demo.gateway import ReferenceGateway
from fusebox.fuse.store import WAL_AUTOCHECKPOINT_PAGES, WAL_LIMIT_BYTES

pytestmark = pytest.mark.tools

M = C.FUSE_METRICS
GPU = {"cluster": "a", "hw_id": "GPU-1"}
BACKOFF, BACKOFF_MAX = 0.05, 0.8  # seconds: --retry-backoff, --retry-max


class Fuse:
    """``fusebox fuse serve`` on ``store`` (a URL or a path), its log (stderr) in ``log``."""

    def __init__(self, tmp: Path, store: str, gateway_url: str, *extra: str):
        token = tmp / "token"
        token.write_text(TOKEN + "\n")
        self.log = tmp / "fuse.log"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.p = subprocess.Popen(
            [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC),
             "--listen", self.url.removeprefix("http://"), "--store", store, "--token-file", str(token),
             "--gateway-url", gateway_url, "--hold", "600", "--tick", "0.05", "--retry-backoff", str(BACKOFF),
             "--retry-max", str(BACKOFF_MAX), "--timeout", "1", "--lease", "3", "--log-level", "info", *extra],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"))
        wait_for(self.up, 30, 0.1, "the fuse")

    def up(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)

    def post(self, body: dict) -> int:
        return httpx.post(self.url + "/alertmanager", json=body, headers={"Authorization": f"Bearer {TOKEN}"},
                          timeout=10).status_code

    def metric(self, name: str, default: float | None = None, **labels) -> float:
        """A sample; ``default`` when absent (a labelled counter appears at its first increment)."""
        want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        if default is not None:
            return default
        raise AssertionError(f"{want} not in /metrics")

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait(10)


def test_postgresql_down_one_line_each_way_state_stale_gauge_kept_not_ready(tmp_path):
    """PostgreSQL stops under a fuse that holds a trip its gateway (down) has not taken: while it is
    down the fuse logs one line (store lost) and no traceback, /state answers 200 from the last state
    it read, marked stale, the oldest-pending gauge keeps ageing (not NaN), /readyz is 503, the
    webhook and the status page 503, and the dispatcher's passes back off (doubling from --retry-backoff to
    --retry-max). PostgreSQL starts again: one line (store back), ready, the webhook applies."""
    pg = PgServer()
    pg.start()
    fuse = None
    try:
        url = pg.create_db("outage")
        gw = f"http://127.0.0.1:{free_port()}"  # nothing listens: the trip stays pending
        fuse = Fuse(tmp_path, url, gw)
        assert fuse.post(payload(alert("GPUMemoryUtilizationHigh", starts=time.time() - 60, **GPU))) == 200
        wait_for(lambda: fuse.metric(M["oldest_pending_age"]) > 0, 10, 0.05, "a pending action")
        before = fuse.get("/state").json()
        assert before["levels"] == {'{cluster="a",hw_id="GPU-1"}': 1} and before["stale"] is False
        age0 = fuse.metric(M["oldest_pending_age"])
        errors0 = fuse.metric(M["dispatcher_errors"], 0.0, adapter="gateway")
        n0 = len(fuse.lines())

        t_down = time.monotonic()  # before the stop: passes fail while PostgreSQL shuts down
        pg.stop()
        wait_for(lambda: any("lost" in ln for ln in fuse.lines()[n0:]), 10, 0.05, "the store-lost line")
        states, ready, ages = [], [], []
        end = time.monotonic() + 5
        while time.monotonic() < end:  # what a scraper, a probe and a reader do meanwhile
            states.append(fuse.get("/state"))
            ready.append(httpx.get(fuse.url + "/readyz", timeout=10).status_code)
            ages.append(fuse.metric(M["oldest_pending_age"]))
            time.sleep(0.1)
        webhook = fuse.post(payload(alert("AlignmentLatencyP95High", starts=time.time() - 60, **GPU)))
        page = fuse.get("/")  # the status page reads the audit: a problem, never a 500
        errors = fuse.metric(M["dispatcher_errors"], 0.0, adapter="gateway") - errors0
        down_s = time.monotonic() - t_down
        outage = fuse.lines()[n0:]
        n1 = len(fuse.lines())
        pg.start()
        wait_for(lambda: httpx.get(fuse.url + "/readyz", timeout=10).status_code == 200, 30, 0.1, "ready again")
        wait_for(lambda: any("back after" in ln for ln in fuse.lines()[n1:]), 10, 0.05, "the store-back line")
        after = fuse.lines()[n1:]
        webhook_after = fuse.post(payload(alert("AlignmentLatencyP95High", starts=time.time() - 60, **GPU)))
        state_after = fuse.get("/state").json()
    finally:
        if fuse is not None:
            fuse.close()
        pg.close()

    # the gateway is down too: attempts logged before PostgreSQL stopped may land after n0; none after
    # the store-lost line (nothing is claimed while the store is away)
    lost_at = next(i for i, ln in enumerate(outage) if "lost" in ln)
    assert all("action gateway" in ln and "failed (attempt" in ln for ln in outage[:lost_at]), outage
    assert len(outage) == lost_at + 1, outage
    assert not any("Traceback" in ln for ln in outage)
    assert [s.status_code for s in states] == [200] * len(states)
    assert all(s.json()["stale"] is True and s.json()["levels"] == before["levels"] for s in states)
    assert states[-1].json()["store"]["reachable"] is False
    assert set(ready) == {503}
    assert all(not math.isnan(a) and a >= age0 for a in ages) and ages[-1] > ages[0]
    assert webhook == 503
    assert page.status_code == 503 and "store unreachable" in page.json()["error"]
    # backing off: pauses 0.05, 0.1, 0.2, 0.4, then 0.8 s each (the passes are what the log no longer shows)
    ramp = [BACKOFF * 2 ** i for i in range(int(math.log2(BACKOFF_MAX / BACKOFF)))]
    # (+2: the pass in flight when it stopped, the one in flight when counted; a fixed pause of
    # --retry-backoff would make about 100 in 5 s)
    assert 1 <= errors <= len(ramp) + 2 + max(0.0, down_s - sum(ramp)) / BACKOFF_MAX, (errors, down_s)
    assert [ln for ln in after if "store" in ln and "back after" in ln] != [] and len(
        [ln for ln in after if "lost" in ln or "back after" in ln]) == 1, after
    assert webhook_after == 200
    assert state_after["stale"] is False and state_after["store"]["reachable"] is True
    assert state_after["levels"] == {'{cluster="a",hw_id="GPU-1"}': 2}  # the trip made after it came back


PAGE = 4096  # bytes: SQLite's default page size
VOLUME = 2 * 1024 * 1024  # bytes: the tmpfs
SPARE = 256 * 1024  # bytes: a file on the volume, removed to make room again
PER_NOTIFICATION = 5  # alerts (new scopes): one write needs far less than HEADROOM_BYTES


def _small_volume(where: Path) -> Path:
    """A 2 MiB tmpfs mounted at ``where`` (a real filesystem that fills: ENOSPC). Needs root (or
    CAP_SYS_ADMIN), as a container's test run has; unmounted by the caller."""
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={VOLUME},mode=0700", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.fail(f"mount -t tmpfs refused ({r.stderr.strip()}): run the test as root, or in a container "
                    "with CAP_SYS_ADMIN, to get a real full disk")
    return where


def test_sqlite_on_a_full_2mib_volume_not_ready_while_it_cannot_write_wal_bounded(tmp_path):
    """The fuse's SQLite file on a 2 MiB tmpfs; notifications of new scopes until the disk is full and
    the webhook answers 503: /readyz says not ready (it answered 200 before), and the WAL stayed
    within its bound (checkpointed every WAL_AUTOCHECKPOINT_PAGES pages, cut back to
    WAL_LIMIT_BYTES) instead of filling the volume. A file removed frees room: ready, the webhook 200."""
    vol = _small_volume(tmp_path / "vol")
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    fuse = None
    try:
        (vol / "spare").write_bytes(b"\0" * SPARE)
        fuse = Fuse(tmp_path, str(vol / "fuse.sqlite"), gw.url)
        assert httpx.get(fuse.url + "/readyz", timeout=10).status_code == 200
        codes, wal_max, n = [], 0, 0
        while not codes or codes[-1] == 200:
            assert n < 20_000, "2 MiB never filled"
            alerts = [alert("GPUMemoryUtilizationHigh", starts=time.time() - 60, cluster="a", hw_id=f"GPU-{n + i}")
                      for i in range(PER_NOTIFICATION)]
            n += PER_NOTIFICATION
            codes.append(fuse.post(payload(*alerts)))
            wal = vol / "fuse.sqlite-wal"
            wal_max = max(wal_max, wal.stat().st_size if wal.exists() else 0)
        full = httpx.get(fuse.url + "/readyz", timeout=10)
        again = fuse.post(payload(alert("AlignmentLatencyP95High", starts=time.time() - 60, cluster="b")))
        (vol / "spare").unlink()
        wait_for(lambda: httpx.get(fuse.url + "/readyz", timeout=10).status_code == 200, 10, 0.1, "ready again")
        after = fuse.post(payload(alert("AlignmentLatencyP95High", starts=time.time() - 60, cluster="b")))
    finally:
        if fuse is not None:
            fuse.close()
        gw.stop()
        subprocess.run(["umount", "-l", str(vol)], check=False)
    print(f"full after {n} scopes; WAL at most {wal_max} bytes")
    assert codes[-1] == 503 and again in (200, 503)  # a smaller write may still find room
    assert full.status_code == 503 and "cannot write" in full.json()["reason"], full.text
    # one checkpoint's worth and one notification's pages (5 scopes: far less than 64 pages)
    assert wal_max <= max(WAL_LIMIT_BYTES, WAL_AUTOCHECKPOINT_PAGES * PAGE) + 64 * PAGE < VOLUME // 3, wal_max
    assert after == 200
