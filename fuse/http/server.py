"""The HTTP server of ``fusebox fuse serve``: uvicorn with bounded connections, deadlines on reading
a request, and ``/healthz`` answered apart from the app.

uvicorn alone keeps every connection a client opens, for as long as it stays silent or trickles:
1,100 idle connections (a slowloris) used up the process's file descriptors; 1,100 connections that
sent a head with ``Content-Length: 1000000`` and then one body byte every 5 s held the webhook and
``/healthz`` at 503 (issues 22 and 34). :class:`GuardedH11Protocol` therefore

* gives a connection ``header_timeout_s`` seconds to send a request's head whole, and
  ``request_timeout_s`` seconds to send the whole request, head and body (both from when it is
  accepted, or from the end of its last response): a client trickling bytes, or sending none, is
  disconnected then;
* refuses a head over ``max_head_bytes`` (request line and headers, counted as the bytes arrive,
  whatever the reads' sizes) with 431;
* keeps at most ``max_per_client`` connections per client address and ``max_connections`` in all:
  one more closes the *oldest idle* connection (no request under way: waiting for a head, or
  discarding a body nobody reads) of that address, else of all; when none is idle, the new
  connection may only ask ``GET /healthz``, anything else is answered 503 (``Retry-After: 1``;
  Alertmanager retries 5xx) and closed. A connection reading a request's body counts as busy;
* answers ``GET /healthz`` (and ``HEAD``) as the first request of a connection itself, before the
  app and the caps: the liveness probe (a new connection per probe) does not wait behind the
  webhook's requests, nor behind a flood of connections;
* closes a connection whose answer went out before its request's body was read (401, 413, 404...)
  once the body is over, or after :data:`LINGER_S` (a lingering close: its writing side is shut
  at once, what the client still sends is discarded, so the answer is not lost to a reset);
* bounds the clients that do not read their answers (a slow reader: 260 connections pipelining
  ``GET /metrics`` into a 4 KiB receive window held the webhook at 503 for as long as they stayed,
  and 1,000 of them took the process to 1.07 GB, each holding an unsent answer): a connection
  whose writes stay paused (its send buffer over the transport's high-water mark) for
  ``write_timeout_s`` is aborted, its buffer dropped; at most ``max_stalled`` connections may be
  paused at once (one more aborts the one paused longest); and a paused connection counts as idle
  for the caps above, so a new client always gets in;
* accepts at most :data:`BACKLOG` connections in one go (the listen backlog).

The app itself checks the token and the ``Content-Length`` before it reads a body
(:mod:`fusebox.fuse.http.app`), so a client without a token cannot hold a connection in a body.
:func:`server_options` gives ``uvicorn.run`` these limits and the others: ``timeout_keep_alive`` (an
idle keep-alive connection is closed after it), ``proxy_headers`` (``X-Forwarded-For`` trusted only
from the addresses given, none by default). ``max_connections`` is also kept below the process's
open-file limit (``RLIMIT_NOFILE``) minus :data:`FD_RESERVE`, so accepting never runs out of
descriptors.
"""

from __future__ import annotations

import collections
import logging
import re
import resource
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["GuardedH11Protocol", "server_options", "connection_cap", "MAX_CONNECTIONS", "MAX_PER_CLIENT",
           "HEADER_TIMEOUT_S", "REQUEST_TIMEOUT_S", "KEEP_ALIVE_S", "MAX_HEAD_BYTES", "LINGER_S", "FD_RESERVE",
           "BACKLOG", "WRITE_TIMEOUT_S", "MAX_STALLED"]

log = logging.getLogger("fusebox.fuse")

# Connections kept at most (before the open-file limit bounds it further), and per client address.
MAX_CONNECTIONS = 1000
MAX_PER_CLIENT = 256
# Seconds a connection has to send a request's head whole, and the whole request (head and body).
HEADER_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 30.0
# Seconds an idle keep-alive connection is kept after a response (uvicorn's timeout_keep_alive).
KEEP_ALIVE_S = 5.0
# Largest request head (request line and headers), bytes.
MAX_HEAD_BYTES = 16 * 1024
# Seconds a connection's writes may stay paused (the client not reading its answer) before it is
# aborted, and the connections that may be paused at once (each holds at most one unsent answer:
# /metrics about 0.5 MB, a /state page at most 4 MiB, so 32 hold at most 128 MiB).
WRITE_TIMEOUT_S = 10.0
MAX_STALLED = 32
# Seconds a connection answered before its body was read keeps discarding that body before it is closed.
LINGER_S = 2.0
# Connections accepted in one go (asyncio accepts up to the listen backlog before any is handed
# over) and the listen queue's length.
BACKLOG = 64
# File descriptors kept for what is not a kept client connection: the bursts of accepted ones not yet
# handed over or closed (three backlogs), SQLite and its WAL, PostgreSQL, the adapters' HTTP
# connections, the listening socket, logs.
FD_RESERVE = 3 * BACKLOG + 64

_BLANK_LINE = re.compile(rb"\n\r?\n")  # the end of a head, as h11 finds it
_HEALTHZ = re.compile(rb"(?:GET|HEAD) /healthz(?:\?[^ \r\n]*)? HTTP/1\.[01]\r?\n")
_LINE_MAX = 64  # bytes of a first request line looked at for /healthz


def connection_cap(wanted: int = MAX_CONNECTIONS) -> int:
    """``wanted``, or fewer when the process's open-file limit is lower than it plus FD_RESERVE
    (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(16, min(wanted, soft - FD_RESERVE))


class _Guard:
    """What the connections of one server share (on uvicorn's server state): the idle ones, oldest
    first; every one per client address, oldest first; those admitted over the caps."""

    def __init__(self):
        self.idle: collections.OrderedDict[Any, None] = collections.OrderedDict()
        self.by_client: dict[str, dict[Any, None]] = {}
        self.over: set = set()
        self.stalled: collections.OrderedDict[Any, None] = collections.OrderedDict()  # writes paused, oldest first


def _raw(status: int, reason: str, body: str, *extra: str) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection."""
    data = body.encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: text/plain; charset=utf-8", f"content-length: {len(data)}",
            "connection: close", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


_OK = _raw(200, "OK", "ok")


class _LingeringTransport:
    """The connection's transport as uvicorn sees it: ``close()`` while the request's body is still
    coming shuts the writing side only and lets the protocol discard the rest (a lingering close)."""

    def __init__(self, transport, protocol: GuardedH11Protocol):
        self._t, self._p = transport, protocol

    def __getattr__(self, name):
        return getattr(self._t, name)

    def is_closing(self) -> bool:
        return self._p._lingering or self._t.is_closing()

    def close(self) -> None:
        if self._p._lingering:
            return
        if self._p._body_unread() and not self._t.is_closing():
            self._p._linger()
        else:
            self._t.close()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines, caps and answers of the module's doc. The limits are
    class attributes, set by :func:`server_options` on a subclass; ``on_close(reason)`` is called for
    each connection the guard closes or refuses (reason: ``header_timeout``, ``request_timeout``,
    ``evicted``, ``over_capacity``, ``head_too_large``, ``write_timeout``, ``slow_reader``)."""

    max_connections = MAX_CONNECTIONS
    max_per_client = MAX_PER_CLIENT
    _head_bytes: int | None  # bytes of the head under way (None: whole, or not looked at)
    _head_tail: bytes  # its last two bytes (a blank line may straddle two reads)
    header_timeout_s = HEADER_TIMEOUT_S
    request_timeout_s = REQUEST_TIMEOUT_S
    max_head_bytes = MAX_HEAD_BYTES
    linger_s = LINGER_S
    write_timeout_s = WRITE_TIMEOUT_S
    max_stalled = MAX_STALLED

    @staticmethod
    def on_close(reason: str) -> None:
        pass

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._sock = transport
        self.transport = _LingeringTransport(transport, self)  # type: ignore[assignment]
        g = _guard(self.server_state)
        self._lingering = False
        self._timers: dict[str, Any] = {}
        self._line: bytearray | None = bytearray()  # the first request line, looked at for /healthz
        self._key = self.client[0] if self.client else "-"
        mine = g.by_client.setdefault(self._key, {})
        mine[self] = None
        self._wait_for_head(g)
        # one over a cap: the oldest idle one goes (of this address, else of all); none idle: this one
        # may only ask /healthz (one per new connection: those closing are still counted until their
        # socket is closed, a loop iteration later)
        for over, pool in ((len(mine) > self.max_per_client, mine), (len(self.connections) > self.max_connections, g.idle)):
            if over:
                victim = next((c for c in pool if c is not self and c in g.idle), None)
                if victim is None:  # a slow reader's connection goes before a new client is refused
                    victim = next((c for c in (pool if pool is mine else g.stalled) if c in g.stalled), None)
                    if victim is not None:
                        victim._abort("slow_reader")
                        continue
                    self._refuse(g)
                    return
                victim._drop("evicted")

    def pause_writing(self) -> None:
        """The send buffer passed the high-water mark: the client is not reading (yet). Aborted after
        ``write_timeout_s``; over ``max_stalled`` paused connections, the one paused longest is."""
        super().pause_writing()
        g = _guard(self.server_state)
        g.stalled[self] = None
        self._cancel("write")
        self._timers["write"] = self.loop.call_later(self.write_timeout_s, self._abort, "write_timeout")
        if len(g.stalled) > self.max_stalled:
            next(iter(g.stalled))._abort("slow_reader")

    def resume_writing(self) -> None:
        super().resume_writing()
        _guard(self.server_state).stalled.pop(self, None)
        self._cancel("write")

    def _abort(self, reason: str) -> None:
        """Close at once, dropping the unsent answer (a reset: the client was not reading it)."""
        self._timers.pop("write", None)
        _guard(self.server_state).stalled.pop(self, None)
        if not self._sock.is_closing():
            self.on_close(reason)
        self._sock.abort()

    def _refuse(self, g: _Guard) -> None:
        """Over the caps with no idle connection to close: a probe is answered, nothing else."""
        if len(g.over) >= BACKLOG:  # a burst of them: no descriptor left to wait on
            self.on_close("over_capacity")
            self._sock.close()
            return
        g.over.add(self)

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # a body nobody reads: discarded
            return
        if self._line is not None:
            data = self._first_line(data)
            if not data:
                return
        if self.conn.their_state is h11.IDLE and self._head_bytes is not None and not self._count_head(data):
            return
        super().data_received(data)
        self._busy_if_under_way()

    def _busy_if_under_way(self) -> None:
        """A request's head arrived: the connection is busy (no head timer, not idle); its request
        read whole: no request deadline either."""
        if self.cycle is not None and not self.cycle.response_complete and self.conn.their_state is not h11.IDLE:
            self._cancel("head")
            _guard(self.server_state).idle.pop(self, None)
            if self.conn.their_state is not h11.SEND_BODY:
                self._cancel("request")

    def _first_line(self, data: bytes) -> bytes:
        """Look at the connection's first request line: ``GET /healthz`` is answered here; an
        over-capacity connection asking anything else is answered 503. Returns the bytes to pass on
        (all that came, once decided), or b"" while undecided."""
        assert self._line is not None
        self._line += data
        buf = bytes(self._line)
        healthz = _HEALTHZ.match(buf)
        if healthz is None and b"\n" not in buf[:_LINE_MAX] and len(buf) < _LINE_MAX:
            return b""  # the line is not whole yet
        if healthz is not None:
            if _BLANK_LINE.search(buf) is None and len(buf) <= self.max_head_bytes:
                return b""  # answered when the head is whole (closing on unread data would reset it)
            self._answer(_OK if buf.startswith(b"GET") else _OK[:-2])  # HEAD: no body
            return b""
        self._line = None
        if self in _guard(self.server_state).over:
            self.on_close("over_capacity")
            self._answer(_raw(503, "Service Unavailable", "too many connections, retry", "retry-after: 1"))
            return b""
        return buf

    def _count_head(self, data: bytes) -> bool:
        """Count the head's bytes; over ``max_head_bytes``: answer 431 and return False."""
        tail = self._head_tail
        found = _BLANK_LINE.search(tail + data)
        size = (self._head_bytes or 0) + (found.end() - len(tail) if found else len(data))
        if size > self.max_head_bytes:
            self.on_close("head_too_large")
            self._answer(_raw(431, "Request Header Fields Too Large", f"request head over {self.max_head_bytes} bytes"))
            return False
        if found:
            self._head_bytes = None  # whole: counted again from the next request's head
        else:
            self._head_bytes = size
            self._head_tail = (tail + data)[-2:]
        return True

    def _answer(self, raw: bytes) -> None:
        """Write a whole answer of our own and close (the app never sees the request)."""
        self._line = None
        self._sock.write(raw)
        self._sock.close()

    def on_response_complete(self) -> None:
        if not self._body_unread() and not self.transport.is_closing():
            self._wait_for_head(_guard(self.server_state))
            trailing = self.conn.trailing_data[0]  # a pipelined head already buffered: counted too
            if trailing and self.conn.their_state is h11.DONE and not self._count_head(trailing):
                return
        super().on_response_complete()  # starts a pipelined request, if one is buffered
        if self._body_unread():  # answered before its body was read: closed once it is over
            self.transport.close()
        else:
            self._busy_if_under_way()

    def connection_lost(self, exc: Exception | None) -> None:
        for name in list(self._timers):
            self._cancel(name)
        g = _guard(self.server_state)
        g.idle.pop(self, None)
        g.over.discard(self)
        g.stalled.pop(self, None)
        mine = g.by_client.get(self._key)
        if mine is not None:
            mine.pop(self, None)
            if not mine:
                del g.by_client[self._key]
        super().connection_lost(exc)

    def _body_unread(self) -> bool:
        return self.conn.their_state is h11.SEND_BODY and self.cycle is not None and self.cycle.response_complete

    def _linger(self) -> None:
        """Shut the writing side, discard what still comes, close after ``linger_s`` (or the client's EOF)."""
        self._lingering = True
        try:
            self._sock.write_eof()
        except (OSError, NotImplementedError):  # the peer is gone already
            self._sock.close()
            return
        _guard(self.server_state).idle[self] = None  # nothing under way: the first to go
        self._cancel("head")
        self._cancel("request")
        self._timers["linger"] = self.loop.call_later(self.linger_s, self._sock.close)

    def _wait_for_head(self, g: _Guard) -> None:
        self._head_bytes = 0
        self._head_tail = b""
        g.idle[self] = None
        g.idle.move_to_end(self)
        self._cancel("head")
        self._cancel("request")
        self._timers["head"] = self.loop.call_later(self.header_timeout_s, self._drop, "header_timeout")
        self._timers["request"] = self.loop.call_later(self.request_timeout_s, self._read_deadline)

    def _cancel(self, name: str) -> None:
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    def _read_deadline(self) -> None:
        """The request is not read whole in ``request_timeout_s``: closed (the app, if it waits for the
        body, sees the client gone)."""
        self._timers.pop("request", None)
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self._sock.is_closing():
            self.on_close("request_timeout")
            self._sock.close()

    def _drop(self, reason: str) -> None:
        """Close the connection if no request is under way (silently: a log line per dropped
        connection would be the flood this class prevents)."""
        self._cancel("head")
        _guard(self.server_state).idle.pop(self, None)
        if self.cycle is not None and not self.cycle.response_complete:
            return
        if not self._sock.is_closing():
            self.on_close(reason)
            self._sock.close()


def _guard(state) -> _Guard:
    """The server's :class:`_Guard` (kept on uvicorn's shared server state)."""
    guard = getattr(state, "fusebox_guard", None)
    if guard is None:
        guard = _Guard()
        state.fusebox_guard = guard
    return guard


def server_options(max_connections: int = MAX_CONNECTIONS, header_timeout_s: float = HEADER_TIMEOUT_S, *,
                   max_per_client: int = MAX_PER_CLIENT, request_timeout_s: float = REQUEST_TIMEOUT_S,
                   forwarded_allow_ips: str = "", on_close=None, write_timeout_s: float = WRITE_TIMEOUT_S,
                   max_stalled: int = MAX_STALLED) -> dict:
    """Keyword arguments for ``uvicorn.run``: the guarded protocol (``max_connections`` bounded by
    :func:`connection_cap`; ``on_close(reason)`` counts what it closes), ``backlog``,
    ``timeout_keep_alive``, and the proxy headers: ``X-Forwarded-For`` and ``X-Forwarded-Proto``
    are read only from the addresses (or networks, ``*`` all) in ``forwarded_allow_ips``, comma
    separated; empty: from none, whatever env ``FORWARDED_ALLOW_IPS`` says."""
    cap = connection_cap(max_connections)
    attrs: dict[str, Any] = {"max_connections": cap, "header_timeout_s": header_timeout_s,
                             "max_per_client": max(1, min(max_per_client, cap)),
                             "request_timeout_s": max(request_timeout_s, header_timeout_s),
                             "write_timeout_s": write_timeout_s, "max_stalled": max(1, max_stalled)}
    if on_close is not None:
        attrs["on_close"] = staticmethod(on_close)
    protocol = type("GuardedH11", (GuardedH11Protocol,), attrs)
    trusted = [ip.strip() for ip in forwarded_allow_ips.split(",") if ip.strip()]
    return {"http": protocol, "limit_concurrency": None, "backlog": BACKLOG, "timeout_keep_alive": KEEP_ALIVE_S,
            "h11_max_incomplete_event_size": MAX_HEAD_BYTES, "proxy_headers": bool(trusted),
            "forwarded_allow_ips": trusted or None}
