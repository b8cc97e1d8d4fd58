"""Slow peers for the fuse's call-path tests: an HTTP server and a UNIX-socket server (HAProxy's
runtime API) that send their answer one byte per ``gap`` seconds, counting what each answer got out
before the client hung up, and how many answers were under way at once."""

from __future__ import annotations

import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GAP = 0.05  # seconds between two bytes of a trickled answer
BYTES = 200  # a trickled answer's length: 10 s at GAP


class _Tally:
    def __init__(self, gap: float, size: int):
        self.gap, self.size = gap, size
        self.lock = threading.Lock()
        self.sent: list[int] = []  # bytes each trickled answer got out before the client hung up (or all)
        self.busy = 0  # answers under way now
        self.most = 0  # the most under way at once
        self.answers = 0  # answers begun

    def begin(self) -> int:
        with self.lock:
            self.busy += 1
            self.answers += 1
            self.most = max(self.most, self.busy)
            return self.answers

    def end(self) -> None:
        with self.lock:
            self.busy -= 1

    def trickle(self, write) -> None:
        n = 0
        try:
            for _ in range(self.size):
                write()
                n += 1
                time.sleep(self.gap)
        except OSError:  # the client hung up
            pass
        with self.lock:
            self.sent.append(n)


class TrickleHttp(_Tally):
    """Answers every request 200 with a JSON body of ``size`` bytes (spaces, then ``{}``), one per
    ``gap``; with ``first_only``, only the first request trickles and later ones get it at once."""

    def __init__(self, gap: float = GAP, size: int = BYTES, first_only: bool = False):
        super().__init__(gap, size)
        tally = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                nth = tally.begin()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(tally.size))
                    self.end_headers()
                    body = b" " * (tally.size - 2) + b"{}"
                    if first_only and nth > 1:
                        self.wfile.write(body)
                        return
                    self.wfile.flush()
                    it = iter(body)

                    def one():
                        self.wfile.write(bytes([next(it)]))
                        self.wfile.flush()

                    tally.trickle(one)
                finally:
                    tally.end()

            do_GET = do_POST = do_DELETE = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class TrickleSocket(_Tally):
    """HAProxy's runtime API as a slow HAProxy answers: one space per ``gap`` (an empty answer: applied)."""

    def __init__(self, path, gap: float = GAP, size: int = BYTES):
        super().__init__(gap, size)
        tally = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                self.request.recv(4096)
                tally.begin()
                try:
                    tally.trickle(lambda: self.request.sendall(b" "))
                finally:
                    tally.end()

        self.server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self.server.daemon_threads = True
        self.path = str(path)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
