"""A tiny reference inference gateway for tests and the demo: it only records what it is told.

It is the other side of the fuse's ``--gateway-url`` call (``fusebox fuse gateway``; the top-level
CLI adds that subcommand under ``fuse``, a layer below, which cannot import it: docs/architecture.md).

``POST /v1/control/fuse`` with ``{"action", "level", "state": "trip"|"release", "reason",
"scope", "decision_id"}`` appends one JSON line to the log file per request:
``{"at", "decision_id", "action", "level", "state", "reason", "scope", "duplicate"}``;
``duplicate`` is true when the decision id was already applied (idempotent: nothing changes,
200 again). Bad JSON or missing fields: 400, not logged. With a token, a missing or wrong
bearer token: 401, not logged. ``GET /v1/control/fuse`` returns the applied state,
``{"<scope key> <action>": "trip"|"release"}``. Decision ids are reloaded from the log at start.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from fusebox.fuse.adapters.gateway import CONTROL_PATH, bearer_matches
from fusebox.fuse.intake.payload import load_json
from fusebox.fuse.rules import scope_key

__all__ = ["ReferenceGateway", "read_log", "register", "DEFAULT_GATEWAY_LISTEN"]

DEFAULT_GATEWAY_LISTEN = "127.0.0.1:9096"

_FIELDS = {"action": str, "level": int, "state": str, "reason": str, "scope": dict, "decision_id": str}


def read_log(path: str | Path) -> list[dict]:
    """Every complete JSON line of a reference gateway log (empty when the file does not exist).

    The gateway may be writing a line while this reads: a last line without its newline is not
    complete yet and is left for the next read.
    """
    p = Path(path)
    if not p.exists():
        return []
    text = p.read_text(encoding="utf-8")
    lines = text.split("\n")[:-1]  # the part after the last newline is unfinished (or empty)
    return [json.loads(line) for line in lines if line.strip()]


class ReferenceGateway:
    """Run with :meth:`start` (a background thread), end with :meth:`stop`; ``port`` 0 picks one."""

    def __init__(self, host: str, port: int, log_path: str | Path, token: str | None = None):
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.token = token
        self.applied: dict[str, dict] = {}
        self.state: dict[str, str] = {}
        for rec in read_log(self.log_path):
            if not rec.get("duplicate"):
                self._apply(rec)
        self._lock = threading.Lock()
        self._open: set = set()  # the connections' sockets, closed by stop()
        gw = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1: a client keeps its connection for the next call (keep-alive), as it does
            # with a real gateway; every answer has a Content-Length
            protocol_version = "HTTP/1.1"
            # the head and the body are two writes: without TCP_NODELAY the body waits for the
            # client's delayed ACK of the head (40 ms on Linux) once the connection is kept
            disable_nagle_algorithm = True

            def setup(self):
                super().setup()
                with gw._lock:
                    gw._open.add(self.connection)

            def finish(self):
                with gw._lock:
                    gw._open.discard(self.connection)
                super().finish()

            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, obj, read: bool = True) -> None:
                """Answer ``obj`` as JSON; ``read`` False: the request's body was not read, so the
                connection is closed after the answer (its unread bytes are no next request)."""
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if not read and self.command == "POST":
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/healthz":
                    return self._send(200, "ok")
                if self.path == CONTROL_PATH:
                    with gw._lock:
                        return self._send(200, dict(gw.state))
                self._send(404, {"error": "not found"})

            def do_POST(self):
                if self.path != CONTROL_PATH:
                    return self._send(404, {"error": "not found"}, read=False)
                if gw.token and not bearer_matches(self.headers.get("Authorization"), gw.token):
                    return self._send(401, {"error": "missing or wrong bearer token"}, read=False)
                length = self.headers.get("Content-Length") or "0"
                if not length.isdigit() or self.headers.get("Transfer-Encoding"):  # a body not read here
                    return self._send(400, {"error": "a body with a Content-Length is required"}, read=False)
                try:
                    rec = load_json(self.rfile.read(int(length)))  # PayloadError (a ValueError) when too deep
                    if not isinstance(rec, dict):
                        raise ValueError("body must be a JSON object")
                    for k, t in _FIELDS.items():
                        if not isinstance(rec.get(k), t):
                            raise ValueError(f"field {k!r} must be {t.__name__}")
                    if rec["state"] not in ("trip", "release"):
                        raise ValueError("state must be 'trip' or 'release'")
                except (ValueError, json.JSONDecodeError) as e:
                    return self._send(400, {"error": str(e)})
                with gw._lock:
                    dup = rec["decision_id"] in gw.applied
                    line = {"at": time.time(), **{k: rec[k] for k in _FIELDS}, "duplicate": dup}
                    with gw.log_path.open("a", encoding="utf-8") as f:
                        f.write(json.dumps(line, sort_keys=True) + "\n")
                    if not dup:
                        gw._apply(line)
                self._send(200, {"applied": not dup, "duplicate": dup})

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        bound_host, self.port = self.server.server_address[:2]
        assert isinstance(bound_host, str)  # an AF_INET/AF_INET6 server; the stub also allows bytes
        self.host = bound_host
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _apply(self, rec: dict) -> None:
        self.applied[rec["decision_id"]] = rec
        self.state[f"{scope_key(rec['scope'])} {rec['action']}"] = rec["state"]

    def start(self) -> ReferenceGateway:
        self._thread = threading.Thread(target=self.server.serve_forever, name="ref-gateway", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every connection, kept-alive ones too: a client's next call is
        refused, as by a gateway that is down."""
        if self._thread:  # serve_forever runs in our thread: ask it to return
            self.server.shutdown()
        self.server.server_close()
        with self._lock:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        if self._thread:
            self._thread.join(timeout=5)


def register(fuse_subcommands) -> None:
    """Add ``gateway`` to the subcommands of ``fusebox fuse`` (what :func:`fusebox.fuse.cli.register`
    returns; :mod:`fusebox.cli` wires the two)."""
    from fusebox.fuse.cli import _hostport

    g = fuse_subcommands.add_parser("gateway", help="reference gateway: accept POST /v1/control/fuse and log it as JSON lines")
    g.add_argument("--listen", type=_hostport, default=DEFAULT_GATEWAY_LISTEN,
                   help=f"HOST:PORT (default {DEFAULT_GATEWAY_LISTEN})")
    g.add_argument("--log", required=True, help="JSON-lines file, one line per control call")
    g.add_argument("--token-file", help="require this bearer token, at least 32 characters (env FUSEBOX_GATEWAY_TOKEN wins)")
    g.set_defaults(func=gateway)


def _ignore(signum, frame) -> None:
    """A handler that is never run (the signals are blocked and taken by ``sigwait``): installed so that
    a signal the parent left ignored (SIG_IGN survives exec) is not discarded on arrival."""


def gateway(args) -> int:
    """``fusebox fuse gateway``: serve until SIGTERM or SIGINT (Ctrl-C), then close every connection
    and exit 0, saying so on stderr; 2 with the reason on stderr when the token file or the address
    is refused."""
    import signal
    import sys

    from fusebox.fuse.adapters.gateway import read_token
    from fusebox.fuse.cli import _err

    try:
        token = read_token(args.token_file)
        host, port = args.listen
        gw = ReferenceGateway(host, port, args.log, token)
    except (OSError, ValueError) as e:
        return _err(str(e))
    print(f"fusebox fuse gateway: listening on {gw.url}, logging to {args.log}", file=sys.stderr, flush=True)
    # The main thread waits for the signal in sigwait, with both signals blocked in every thread (the
    # server's threads inherit the mask): no handler raises into whatever the main thread runs (an
    # exception raised in serve_forever's request handling is caught and printed by socketserver, and
    # the server went on serving). Ctrl-C stops it even when started with SIGINT ignored or blocked
    # (both survive exec: a parent that ignores it, a test runner's worker, `cmd &` in a script).
    stops = {signal.SIGINT, signal.SIGTERM}
    previous = {s: signal.signal(s, _ignore) for s in stops}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        gw.start()
        got = signal.sigwait(stops)
        gw.stop()  # closes the socket and the kept connections at once
        print(f"fusebox fuse gateway: {signal.Signals(got).name}: stopped (every connection closed, exit 0)",
              file=sys.stderr, flush=True)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return 0
