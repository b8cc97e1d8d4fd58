"""The served fuse under a slowloris (issue 22): connections that send nothing, or a request's
head a byte at a time, neither stop the webhook nor flood the log. Real sockets against
``fusebox fuse serve`` run with a 1024 open-file limit, as many containers have."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys

import httpx
from _fuse_support import SPEC, TOKEN, alert, free_port, payload, wait_for

IDLE = 1100  # the reproduction: more connections than the server has file descriptors


def _nofile_1024():
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def _serve(tmp_path, *extra):
    port = free_port()
    (tmp_path / "token").write_text(TOKEN + "\n")
    p = subprocess.Popen(
        [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen", f"127.0.0.1:{port}",
         "--state", str(tmp_path / "s.sqlite"), "--token-file", str(tmp_path / "token"), "--dry-run",
         "--log-level", "warning", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_nofile_1024)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _up(url), 30, 0.1, "fuse serve")
    return p, port, url


def _up(url):
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _webhook(url):
    body = payload(alert("GPUMemoryUtilizationHigh", cluster="a", hw_id="GPU-1"))
    return httpx.post(url + "/alertmanager", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)


def test_1100_idle_connections_neither_stop_the_webhook_nor_flood_the_log(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < IDLE + 200:  # this test's own sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, IDLE + 500), hard))
    p, port, url = _serve(tmp_path)
    idle = []
    try:
        for _ in range(IDLE):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        r = _webhook(url)
        assert r.status_code == 200, r.text
        assert r.json()["alerts"] == {"tripped": 1}
        assert _up(url)
    finally:
        for s in idle:
            s.close()
        p.terminate()
        _, err = p.communicate(timeout=60)
    assert "Too many open files" not in err, err[-2000:]
    assert len(err) < 10_000, err[-2000:]


def test_a_connection_trickling_its_request_head_is_closed_after_the_header_timeout(tmp_path):
    p, port, url = _serve(tmp_path, "--header-timeout", "1")
    try:
        slow = socket.create_connection(("127.0.0.1", port), timeout=60)
        slow.sendall(b"POST /alertmanager HTTP/1.1\r\nHost: fuse\r\n")  # the head never ends
        silent = socket.create_connection(("127.0.0.1", port), timeout=60)
        assert slow.recv(1024) == b"" and silent.recv(1024) == b""  # closed by the server, no answer
        assert _webhook(url).status_code == 200
    finally:
        p.terminate()
        _, err = p.communicate(timeout=60)
    assert "Traceback" not in err, err
