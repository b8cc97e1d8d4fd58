"""`fusebox fuse gateway` (the reference gateway) as a process: SIGTERM and SIGINT stop it at once,
with a line saying so and exit 0, as `fusebox fuse serve` stops; connections it kept are closed."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys

import pytest
from _fuse_support import wait_for
from _support import finish

from fusebox.tooling import free_port

pytestmark = pytest.mark.process


# The gateway started with SIGINT ignored and blocked, as both survive exec (a parent that ignores it,
# a test runner's worker, `cmd &` in a script): Ctrl-C must stop it all the same.
_IGNORING = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
             "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}); os.execv(sys.executable, sys.argv[1:])")


@pytest.mark.parametrize("sig, name, parent", [(signal.SIGTERM, "SIGTERM", "plain"), (signal.SIGINT, "SIGINT", "plain"),
                                               (signal.SIGINT, "SIGINT", "ignoring")])
def test_the_reference_gateway_stops_on_a_signal_with_exit_0(tmp_path, sig, name, parent):
    port = free_port()
    cmd = [sys.executable, "-m", "fusebox.cli", "fuse", "gateway", "--listen", f"127.0.0.1:{port}",
           "--log", str(tmp_path / "gw.jsonl")]
    if parent == "ignoring":
        cmd = [sys.executable, "-c", _IGNORING, *cmd]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)

        def up() -> bool:
            try:
                conn.request("GET", "/v1/control/fuse")
                return conn.getresponse().read() == b"{}"
            except OSError:
                conn.close()
                return False

        wait_for(up, 30, 0.1, "the reference gateway")
        body = {"action": "freeze_admissions", "level": 1, "state": "trip", "reason": "test",
                "scope": {"hw_id": "GPU-0"}, "decision_id": "d-1"}
        conn.request("POST", "/v1/control/fuse", json.dumps(body), {"Content-Type": "application/json"})
        assert conn.getresponse().read() and conn.sock is not None  # the connection is kept (HTTP/1.1)
        p.send_signal(sig)
        status, _, err = finish(p)  # the exit is the event; finish's bound is only a backstop
        assert status == 0, err
        assert f"fusebox fuse gateway: {name}: stopped" in err
        conn.sock.settimeout(5)
        assert conn.sock.recv(1) == b""  # the kept connection was closed by the gateway
        assert [json.loads(line)["decision_id"] for line in (tmp_path / "gw.jsonl").read_text().splitlines()] == ["d-1"]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_the_reference_gateway_stops_on_sigterm_while_requests_arrive(tmp_path):
    """SIGTERM arriving while the gateway accepts a request stops it all the same (an exception raised
    by a handler in the middle of the server's request handling was caught there, printed, and the
    gateway served on: it happened once in a full run)."""
    import threading
    import time

    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "fusebox.cli", "fuse", "gateway", "--listen", f"127.0.0.1:{port}",
                          "--log", str(tmp_path / "gw.jsonl")], stderr=subprocess.PIPE, text=True)
    done = threading.Event()

    def knock() -> None:  # new connections, one after another, until the gateway is gone
        while not done.is_set():
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/v1/control/fuse")
                c.getresponse().read()
                c.close()
            except OSError:
                pass

    try:
        wait_for(lambda: _answers(port), 30, 0.1, "the reference gateway")
        knockers = [threading.Thread(target=knock, daemon=True) for _ in range(4)]
        for t in knockers:
            t.start()
        time.sleep(0.3)  # the knockers at full speed
        p.send_signal(signal.SIGTERM)
        status, _, err = finish(p, 20)
        done.set()
        assert status == 0, err
        assert "fusebox fuse gateway: SIGTERM: stopped" in err
        assert "Traceback" not in err
    finally:
        done.set()
        if p.poll() is None:
            p.kill()
            p.wait(10)


def _answers(port: int) -> bool:
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request("GET", "/v1/control/fuse")
        return c.getresponse().read() == b"{}"
    except OSError:
        return False
