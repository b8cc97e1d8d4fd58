"""Issue 34, the wire: a hostile neighbour against the served fuse (``fusebox fuse serve`` as a real
process, real sockets, a real Alertmanager).

* 1,100 connections that send a head with ``Content-Length: 1000000`` and then one body byte every
  5 s held the webhook and ``/healthz`` at 503: the body was read before the token was checked.
* twenty wrong tokens from Alertmanager's address got Alertmanager's own notifications answered 429,
  which Alertmanager does not retry; and ``X-Forwarded-For`` from 127.0.0.1 was believed.
* a request head of up to 100 KiB was accepted where 16 KiB is the limit.
"""

from __future__ import annotations

import re
import resource
import socket
import subprocess
import threading
import time
from datetime import UTC, datetime

import httpx
import pytest
from _fuse_support import TOKEN, alert, am_config, payload, wait_for
from _slow_peers import SlowBodyFlood
from test_fuse_connections import _serve, _webhook

pytestmark = pytest.mark.process

FLOOD = 1100  # the reproduction: more connections than the server has file descriptors
HOOK = {"Authorization": f"Bearer {TOKEN}"}
LEVEL_1 = '{cluster="a",hw_id="GPU-1"}'  # the scope _webhook trips (GPUMemoryUtilizationHigh: level 1)


def _stop(p) -> str:
    p.terminate()
    return p.communicate(timeout=60)[1]


def test_1100_slow_bodies_without_a_token_neither_stop_the_webhook_nor_fail_healthz(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < FLOOD + 200:  # this test's own sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, FLOOD + 500), hard))
    p, port, url = _serve(tmp_path)  # the server under a 1024 open-file limit
    flood = SlowBodyFlood(port, FLOOD, gap=5.0, headers={"Authorization": "Bearer not-the-token"}).start()
    try:
        # 1,100 heads sent, 250 connections a second (so that each head is read before most of the
        # others come: on main every one was then a busy connection no new one could displace)
        end = time.monotonic() + 20
        while flood.heads < FLOOD and time.monotonic() < end:
            time.sleep(0.1)
        heads = flood.heads
        t0 = time.monotonic()
        r = _webhook(url)
        webhook_s = time.monotonic() - t0
        health = httpx.get(url + "/healthz", timeout=5).status_code
        # every connection has had its next turn (5 s after its head): a body byte on a connection
        # still open, or a new connection (and head) in place of one the server closed
        wait_for(lambda: flood.heads + flood.body_bytes >= 2 * FLOOD, 20, 0.1, "the flood's second round")
        body_bytes = flood.body_bytes
        again = (_webhook(url).status_code, httpx.get(url + "/healthz", timeout=5).status_code)
    finally:
        flood.stop()
        err = _stop(p)
    assert heads >= FLOOD, (heads, flood.refused)
    assert r.status_code == 200, r.text
    assert r.json()["alerts"] == {"tripped": 1}
    assert health == 200 and again == (200, 200)
    assert webhook_s < 5, webhook_s
    # the flood's heads were answered 401 from the head alone (no body byte needed), none accepted
    # none of them was held: the server answered each from its head and closed it within LINGER_S
    # (2 s), before its first body byte was due (5 s after the head); on main most were held
    assert body_bytes <= FLOOD // 100, body_bytes
    # the answers the flood read came from its heads alone: 401 for the first 20 failures of the
    # address (AUTH_FAILURES), 429 after; 503 when over capacity; never anything accepted
    assert set(flood.answers) <= {401, 429, 503} and flood.answers[401] <= 20 and flood.answers[429] > 0, flood.answers
    assert "Traceback" not in err and "Too many open files" not in err, err[-2000:]


def _send_head(port, head: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(head)
    return s


def _read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def _post_head(length: int, token: str = TOKEN) -> bytes:
    return (f"POST /alertmanager HTTP/1.1\r\nHost: fuse\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


def test_request_deadline_per_client_cap_and_healthz_apart(tmp_path):
    """With the right token a slow body is a busy connection: two fill a per-client cap of 2, the
    third connection gets /healthz and a 503 for anything else; the request deadline (2 s) then
    closes both."""
    p, port, url = _serve(tmp_path, "--max-connections-per-client", "2", "--request-timeout", "2",
                          "--header-timeout", "1")
    try:
        t0 = time.monotonic()
        slow = [_send_head(port, _post_head(1000) + b"{") for _ in range(2)]
        time.sleep(0.3)  # both heads read: two busy connections of 127.0.0.1
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
        over = httpx.post(url + "/alertmanager", json=payload(), headers=HOOK, timeout=5)
        assert over.status_code == 503 and over.headers["retry-after"] == "1", over.text
        assert [_read_all(s) for s in slow] == [b"", b""]  # closed by the deadline, no answer
        closed_s = time.monotonic() - t0
        assert 1.5 < closed_s < 4, closed_s
        assert _webhook(url).status_code == 200  # the slots are free again
        metrics = httpx.get(url + "/metrics", timeout=5).text
    finally:
        err = _stop(p)
    assert "Traceback" not in err, err
    assert 'fusebox_fuse_connections_closed_total{reason="request_timeout"} 2.0' in metrics
    assert 'fusebox_fuse_connections_closed_total{reason="over_capacity"} 1.0' in metrics


def test_by_default_x_forwarded_for_is_not_believed_and_a_head_over_16_kib_is_refused(tmp_path):
    p, port, url = _serve(tmp_path)
    try:
        # a head sent in one write: h11 bounds only a head it has not seen whole (issue 34: 100 KiB passed)
        big = _send_head(port, b"GET /metrics HTTP/1.1\r\nHost: fuse\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n")
        assert _read_all(big).startswith(b"HTTP/1.1 431 ")
        ok = _send_head(port, b"GET /metrics HTTP/1.1\r\nHost: fuse\r\nConnection: close\r\nX-Pad: "
                        + b"a" * 16_000 + b"\r\n\r\n")  # 16,062 bytes: under 16 KiB
        assert _read_all(ok).startswith(b"HTTP/1.1 200 ")
        assert 'fusebox_fuse_connections_closed_total{reason="head_too_large"} 1.0' in httpx.get(url + "/metrics").text
        codes = [httpx.post(url + "/alertmanager", json=payload(), timeout=5, headers={
            "Authorization": "Bearer wrong-token", "X-Forwarded-For": f"198.51.100.{i}"}).status_code
            for i in range(21)]
        right = httpx.post(url + "/alertmanager", json=payload(), timeout=5,
                           headers={**HOOK, "X-Forwarded-For": "198.51.100.99"}).status_code
    finally:
        _stop(p)
    # 20 failures charged to 127.0.0.1 whatever the header said; the 21st is 429; the right token is not refused
    assert codes == [401] * 20 + [429], codes
    assert right == 200


AM_CONFIG = am_config("alertname, cluster, hw_id", "1s", "5m")
GROUP_WAIT_S = 1.0


@pytest.mark.tools
def test_a_neighbour_with_wrong_tokens_on_alertmanagers_address_does_not_delay_its_trip(tmp_path, alertmanager):
    p, port, url = _serve(tmp_path)
    stop = threading.Event()
    neighbour: list[int] = []

    def wrong_tokens():  # the same address as Alertmanager (127.0.0.1), a wrong token every 50 ms
        with httpx.Client(timeout=5) as c:
            while not stop.is_set():
                neighbour.append(c.post(url + "/alertmanager", json=payload(),
                                        headers={"Authorization": "Bearer a-neighbours-guess"}).status_code)
                stop.wait(0.05)

    t = threading.Thread(target=wrong_tokens, daemon=True)
    t.start()
    try:
        wait_for(lambda: neighbour.count(429) >= 3, 20, what="the neighbour over its failures (429)")
        am = alertmanager(url, config=AM_CONFIG)
        labels = alert("GPUMemoryUtilizationHigh", cluster="a", hw_id="GPU-1")["labels"]
        t0 = time.monotonic()
        started = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        assert httpx.post(am + "/api/v2/alerts", json=[{"labels": labels, "startsAt": started}],
                          timeout=5).status_code == 200
        wait_for(lambda: 'fusebox_fuse_notifications_total{outcome="applied"} 1.0' in httpx.get(
            url + "/metrics", timeout=5).text, GROUP_WAIT_S + 10, 0.05, "the notification applied")
        trip_s = time.monotonic() - t0
        levels = httpx.get(url + "/state", headers=HOOK, timeout=5).json()["levels"]
    finally:
        stop.set()
        t.join(10)
        _stop(p)
    assert trip_s < GROUP_WAIT_S + 3, trip_s
    assert neighbour[:20] == [401] * 20 and neighbour.count(429) >= 3, neighbour[:30]
    assert levels == {LEVEL_1: 1}


def _slow_reader(port: int, requests: int) -> socket.socket:
    """A client that pipelines ``requests`` GET /metrics (no token needed) into a 4 KiB receive
    window and never reads an answer."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: fuse\r\n\r\n" * requests)
    return s


SLOW_READERS = 20  # the per-client cap the test sets, of 127.0.0.1, the address the webhook posts from


def _stalled_server_sockets(port: int) -> int:
    """The server's connections on ``port`` with unsent bytes in the kernel (ss's Send-Q)."""
    out = subprocess.run(["ss", "-tnH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    return sum(1 for line in out.splitlines() if int(line.split()[1]) > 0)


def test_clients_that_never_read_their_answers_do_not_lock_out_the_webhook(tmp_path):
    """The trial of issue 34's fix: 260 connections pipelining GET /metrics (no token) and never
    reading held the webhook (same address, right token) at 503 for as long as they stayed, each
    next answer waiting to be written with no deadline; 1,000 of them took the fuse to 1.07 GB. A
    connection whose writes stay paused gives way to a new client (``slow_reader``), is aborted
    after --write-timeout (``write_timeout``), and at most 32 wait at once (MAX_STALLED)."""
    p, port, url = _serve(tmp_path, "--write-timeout", "3", "--max-connections-per-client", str(SLOW_READERS))
    readers: list[socket.socket] = []
    try:
        answer = len(httpx.get(url + "/metrics", timeout=5).content)
        # enough answers queued on each connection to fill the kernel's buffers and then the
        # server's transport past its high-water mark (64 KiB), whatever /metrics weighs here
        per = max(40, (4 << 20) // max(answer, 1))
        readers = [_slow_reader(port, per) for _ in range(SLOW_READERS)]
        # every one of them has answers the client does not take: the address's cap is full of
        # connections busy writing
        wait_for(lambda: _stalled_server_sockets(port) >= SLOW_READERS, 30, 0.2, "the slow readers stalled")
        # Alertmanager retries a 503: within 30 s one try gets in (on main every try got 503 for as
        # long as the readers stayed: their connections were busy writing, with no deadline)
        codes: list[int] = []
        # (alone it gets in within the 3 s --write-timeout; 10 s failed once in a full run, four
        # pytest workers on 2 cores, with every try 503: not reproduced alone or under load since)
        end = time.monotonic() + 30
        while time.monotonic() < end and 200 not in codes:
            r = _webhook(url)
            codes.append(r.status_code)
            time.sleep(0.25)
        health = httpx.get(url + "/healthz", timeout=5).status_code
        wait_for(lambda: 'reason="write_timeout"} 0.0' not in _metrics(url), 15, 0.5,
                 "a slow reader aborted by the write deadline")
        metrics = _metrics(url)
    finally:
        for s in readers:
            s.close()
        err = _stop(p)
    assert codes[-1] == 200 and r.json()["alerts"] == {"tripped": 1}, (len(codes), codes[-5:], per, answer)
    assert health == 200
    slow = re.search(r'fusebox_fuse_connections_closed_total\{reason="slow_reader"\} (\d+)', metrics)
    assert slow and int(slow.group(1)) >= 1, metrics
    assert "Traceback" not in err, err[-2000:]


def _metrics(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=5).text
