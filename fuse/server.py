"""The HTTP server of ``fusebox fuse serve``: uvicorn with bounded connections and a header timeout.

uvicorn alone keeps every connection a client opens, for as long as it stays silent: 1,100 idle
connections (a slowloris) used up the process's file descriptors, stopped the webhook and wrote
59 MB of "Too many open files" in 25 s. :class:`GuardedH11Protocol` therefore

* gives a connection ``header_timeout_s`` seconds to send a request's headers whole (from when it
  is accepted, or from the end of its last response): a client trickling bytes, or sending none,
  is disconnected then;
* keeps at most ``max_connections`` connections: one more closes the *oldest idle* connection (one
  with no request under way), so a new client -- Alertmanager -- always gets in while the extra
  ones are idle; when every connection is busy with a request, the newest may be answered 503
  (uvicorn's ``limit_concurrency``; Alertmanager retries 5xx);
* accepts at most :data:`BACKLOG` connections in one go (the listen backlog), so a burst cannot
  take the descriptors before the oldest idle ones are closed.

:func:`server_options` gives ``uvicorn.run`` these and the other limits: ``timeout_keep_alive``
(an idle keep-alive connection is closed after it), ``h11_max_incomplete_event_size`` (the largest
request head, bytes; over it the answer is 400). ``max_connections`` is also kept below the
process's open-file limit (``RLIMIT_NOFILE``) minus :data:`FD_RESERVE` for the store, the
adapters' connections and the logs, so accepting never runs out of descriptors.
"""

from __future__ import annotations

import collections
import logging
import resource
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["GuardedH11Protocol", "server_options", "connection_cap", "MAX_CONNECTIONS", "HEADER_TIMEOUT_S",
           "KEEP_ALIVE_S", "MAX_HEAD_BYTES", "FD_RESERVE", "BACKLOG"]

log = logging.getLogger("fusebox.fuse")

# Connections kept at most (before the open-file limit bounds it further).
MAX_CONNECTIONS = 1000
# Seconds a connection has to send a request's headers whole.
HEADER_TIMEOUT_S = 10.0
# Seconds an idle keep-alive connection is kept after a response (uvicorn's timeout_keep_alive).
KEEP_ALIVE_S = 5.0
# Largest request head (request line and headers), bytes (h11's max_incomplete_event_size).
MAX_HEAD_BYTES = 16 * 1024
# Connections accepted in one go (asyncio accepts up to the listen backlog before any is handed
# over) and the listen queue's length.
BACKLOG = 64
# File descriptors kept for what is not a kept client connection: the bursts of accepted ones not yet
# handed over or closed (three backlogs), SQLite and its WAL, PostgreSQL, the adapters' HTTP
# connections, the listening socket, logs.
FD_RESERVE = 3 * BACKLOG + 64


def connection_cap(wanted: int = MAX_CONNECTIONS) -> int:
    """``wanted``, or fewer when the process's open-file limit is lower than it plus FD_RESERVE
    (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(16, min(wanted, soft - FD_RESERVE))


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout and a cap on connections (see the module's doc).
    ``max_connections`` and ``header_timeout_s`` are set by :func:`server_options` on a subclass."""

    max_connections = MAX_CONNECTIONS
    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        idle = _idle(self.server_state)
        self._header_timer: Any | None = None
        self._wait_for_head(idle)
        # one over the cap: the oldest idle one goes (one per new connection: those closing are
        # still counted until their socket is closed, a loop iteration later)
        if len(self.connections) > self.max_connections and len(idle) > 1:
            oldest = next(iter(idle))
            if oldest is not self:
                oldest._drop()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not None and not self.cycle.response_complete:  # a request's head arrived
            self._cancel_head_timer()
            _idle(self.server_state).pop(self, None)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._wait_for_head(_idle(self.server_state))

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        _idle(self.server_state).pop(self, None)
        super().connection_lost(exc)

    def _wait_for_head(self, idle: collections.OrderedDict) -> None:
        self._cancel_head_timer()
        idle[self] = None
        idle.move_to_end(self)
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._drop)

    def _cancel_head_timer(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _drop(self) -> None:
        """Close the connection if no request is under way (silently: a log line per dropped
        connection would be the flood this class prevents)."""
        _idle(self.server_state).pop(self, None)
        self._cancel_head_timer()
        if self.cycle is not None and not self.cycle.response_complete:
            return
        if not self.transport.is_closing():
            self.transport.close()


def _idle(state) -> collections.OrderedDict:
    """The server's idle connections, oldest first (kept on uvicorn's shared server state)."""
    idle = getattr(state, "fusebox_idle", None)
    if idle is None:
        idle = collections.OrderedDict()
        state.fusebox_idle = idle
    return idle


def server_options(max_connections: int = MAX_CONNECTIONS, header_timeout_s: float = HEADER_TIMEOUT_S) -> dict:
    """Keyword arguments for ``uvicorn.run``: the guarded protocol (``max_connections`` bounded by
    :func:`connection_cap`), ``limit_concurrency``, ``timeout_keep_alive`` and
    ``h11_max_incomplete_event_size``."""
    cap = connection_cap(max_connections)
    protocol = type("GuardedH11", (GuardedH11Protocol,), {"max_connections": cap, "header_timeout_s": header_timeout_s})
    return {"http": protocol, "limit_concurrency": cap + 3 * BACKLOG, "backlog": BACKLOG,
            "timeout_keep_alive": KEEP_ALIVE_S, "h11_max_incomplete_event_size": MAX_HEAD_BYTES}
