"""Slow peers for the fuse's tests: an HTTP server and a UNIX-socket server (HAProxy's runtime API)
that send their answer one byte per ``gap`` seconds, counting what each answer got out before the
client hung up, and how many answers were under way at once; and a slow client,
:class:`SlowBodyFlood`, that sends request bodies one byte per ``gap`` seconds on many connections."""

from __future__ import annotations

import collections
import heapq
import selectors
import socket
import socketserver
import threading
import time
from http.server import ThreadingHTTPServer

from _support import QuietHandler

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

        class Handler(QuietHandler):
            def _answer(self):
                self.body()
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


class SlowBodyFlood:
    """Issue 34's slow-body flood: ``n`` connections to ``host:port`` that each send a request head
    (``POST path`` with ``Content-Length: length`` and ``headers``, by default no token) and then
    one body byte every ``gap`` seconds, the first ``n`` opened at ``rate`` a second. A connection the server closes is opened again ``gap``
    seconds later, so ``n`` keep trying for as long as the flood runs. What the peer saw is counted:
    ``heads`` sent, ``answers`` by HTTP status (the first line each connection got back),
    ``closed`` by the server, ``refused`` connects, ``body_bytes`` sent. ``start()`` runs it in a thread; ``stop()``
    closes every socket. One thread and a selector: 1,100 sockets cost this process little."""

    def __init__(self, port: int, n: int = 1100, gap: float = 5.0, *, host: str = "127.0.0.1",
                 path: str = "/alertmanager", length: int = 1_000_000, headers: dict | None = None,
                 rate: float = 250.0):
        self.addr, self.n, self.gap, self.rate = (host, port), n, gap, rate
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.head = (f"POST {path} HTTP/1.1\r\nHost: fuse\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {length}\r\n{extra}\r\n").encode()
        self.heads = self.closed = self.refused = self.body_bytes = 0
        self.answers: collections.Counter = collections.Counter()
        self._seq = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> SlowBodyFlood:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _later(self, due, when: float, what: str, s) -> None:
        self._seq += 1
        heapq.heappush(due, (when, self._seq, what, s))

    def _open(self, sel, due) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex(self.addr)
        sel.register(s, selectors.EVENT_WRITE, {"sent": False, "seen": b""})

    def _close(self, sel, s, due, by_server: bool) -> None:
        sel.unregister(s)
        s.close()
        if by_server:
            self.closed += 1
        self._later(due, time.monotonic() + self.gap, "open", None)

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        due: list = []  # (when, what, socket): the next body byte or reconnect
        t0 = time.monotonic()
        for i in range(self.n):  # opened at ``rate`` a second: each head is read before most of the others come
            self._later(due, t0 + i / self.rate, "open", None)
        while not self._stop.is_set():
            now = time.monotonic()
            while due and due[0][0] <= now:
                _, _, what, s = heapq.heappop(due)
                if what == "open":
                    self._open(sel, due)
                    continue
                try:
                    sel.get_key(s)
                except (KeyError, ValueError):
                    continue  # closed meanwhile
                try:
                    s.send(b" ")
                    self.body_bytes += 1
                    self._later(due, now + self.gap, "byte", s)
                except OSError:
                    self._close(sel, s, due, True)
            timeout = max(0.0, min(0.2, due[0][0] - now)) if due else 0.2
            for key, _ in sel.select(timeout):
                s, state = key.fileobj, key.data
                if not state["sent"]:
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        self.refused += 1
                        self._close(sel, s, due, False)
                        continue
                    try:
                        s.send(self.head)
                    except OSError:
                        self._close(sel, s, due, True)
                        continue
                    state["sent"] = True
                    self.heads += 1
                    sel.modify(s, selectors.EVENT_READ, state)
                    self._later(due, time.monotonic() + self.gap, "byte", s)
                    continue
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if len(state["seen"]) < 12:
                    state["seen"] += data[:12]
                    if len(state["seen"]) >= 12:  # "HTTP/1.1 401"
                        code = state["seen"][9:12]
                        self.answers[int(code) if code.isdigit() else 0] += 1
                if not data:
                    self._close(sel, s, due, True)
        for key in list(sel.get_map().values()):
            key.fileobj.close()
        sel.close()
