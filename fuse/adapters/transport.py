"""The deadline of one adapter call, and the HTTP client that keeps it.

An adapter's ``timeout_s`` bounds one call (one :meth:`apply`) in total, not each read:
:func:`call_deadline` sets it for the thread, and every connect, write and read of a
:func:`deadline_client` (and of the HAProxy socket) waits at most what is left of it, so a gateway
that trickles its answer a byte at a time is cut off at the deadline (:class:`DeadlineExceeded`, a
transient :class:`~fusebox.fuse.adapters.protocol.ActionError`). Resolving the host's name is bounded too (:func:`resolve`): a
resolver that does not answer holds ``getaddrinfo`` for its own timeouts, which no socket timeout
covers (30 s for a ``--timeout 1`` call in the tests). The service's lease must exceed the longest ``timeout_s``
(``fusebox fuse serve`` checks it at start), so a call never outlives its claim.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpcore
import httpx

from ..logsafe import HIDDEN, SECRET_PARAMS
from .protocol import ActionError

__all__ = ["answer_text", "DeadlineExceeded", "call_deadline", "remaining", "deadline_client", "resolve"]


# a level -- say nothing); a value under a secret-looking key is hidden whatever its length.
ECHO_MIN = 6


def answer_text(r: httpx.Response, limit: int = 200) -> str:
    """The answer's text for an error message, at most ``limit`` characters, with every string the
    request's JSON body sent (or the whole body, when not JSON) replaced by ``***``: a gateway that
    echoes the body in its error (a worker's ``api_key``) does not put it in the log or the audit."""
    text = r.text[:limit + 4096]
    try:
        sent = r.request.content
    except (httpx.RequestNotRead, RuntimeError):
        sent = b""
    values: list[str] = []
    try:
        _strings(json.loads(sent), values, secret=False) if sent else None
    except ValueError:
        values.append(sent.decode("utf-8", "replace"))
    for v in sorted(set(values), key=len, reverse=True):
        text = text.replace(v, HIDDEN)
    return text[:limit]


def _strings(doc, out: list[str], secret: bool) -> None:
    """The strings of a JSON document worth hiding: those of at least ECHO_MIN characters, and any
    under a key of :data:`SECRET_PARAMS`."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            _strings(v, out, secret or str(k).lower().replace("-", "_") in SECRET_PARAMS)
    elif isinstance(doc, list):
        for v in doc:
            _strings(v, out, secret)
    elif isinstance(doc, (str, int, float)) and not isinstance(doc, bool):
        text = str(doc)
        if text and (secret or (isinstance(doc, str) and len(text) >= ECHO_MIN)):
            out.append(text)


class DeadlineExceeded(ActionError):
    """The call's total deadline (:func:`call_deadline`) passed before it finished: transient."""

    def __init__(self, message: str):
        super().__init__(message, summary="deadline exceeded")


_deadline = threading.local()


@contextlib.contextmanager
def call_deadline(seconds: float | None) -> Iterator[None]:
    """Within it, this thread's calls end ``seconds`` from now at the latest (None: no deadline; an
    outer, earlier deadline stays)."""
    prev = getattr(_deadline, "cur", None)  # (monotonic end, seconds) of the deadline in force
    if seconds is not None and (prev is None or time.monotonic() + seconds < prev[0]):
        _deadline.cur = (time.monotonic() + seconds, seconds)
    try:
        yield
    finally:
        _deadline.cur = prev


def remaining(cap: float | None = None) -> float | None:
    """Seconds left of this thread's deadline, at most ``cap`` (None without deadline: ``cap``).

    Raises:
        DeadlineExceeded: nothing is left.
    """
    cur = getattr(_deadline, "cur", None)
    if cur is None:
        return cap
    left = cur[0] - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded(f"the call's deadline of {cur[1]:g}s passed")
    return left if cap is None else min(cap, left)


def _left(timeout: float | None) -> float | None:
    """:func:`remaining` as httpcore's timeout: a passed deadline is a timeout of httpcore's kind."""
    try:
        return remaining(timeout)
    except DeadlineExceeded as e:
        raise httpcore.ReadTimeout(str(e)) from None


def resolve(host: str, port: int, timeout: float | None) -> list[str]:
    """The addresses of ``host`` for a TCP connection to ``port``, in ``getaddrinfo``'s order
    (duplicates dropped; an IP literal is itself), waited for ``timeout`` seconds at most (None:
    as long as the resolver takes).

    The system resolver is bounded by no socket timeout: one that does not answer holds
    ``getaddrinfo`` for its own timeout times its attempts (glibc: 5 s x 2 by default, per name of
    the search list; resolv.conf(5)). It therefore runs in a daemon thread of its own, left to end
    when the resolver gives up.

    Raises:
        httpcore.ConnectTimeout: not resolved within ``timeout`` (its message names the host).
        httpcore.ConnectError: the name does not resolve (the resolver's own error).
    """
    try:
        ipaddress.ip_address(host)
        return [host]
    except ValueError:
        pass
    found: dict = {}
    done = threading.Event()

    def run() -> None:
        try:
            found["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            found["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, name=f"resolve {host}", daemon=True).start()
    if not done.wait(timeout):
        raise httpcore.ConnectTimeout(f"{host} was not resolved within the {timeout:g}s left to the call "
                                      "(its deadline): the resolver did not answer")
    if "error" in found:
        raise httpcore.ConnectError(str(found["error"]))
    return list(dict.fromkeys(str(info[4][0]) for info in found["infos"]))


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write waits at most what is left of the call's deadline."""

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout)))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own (blocking sockets), resolving, connecting and reading within the call's deadline:
    the name is resolved by :func:`resolve`, then each of its addresses is tried in turn (as
    ``socket.create_connection`` does), each with what is left of the deadline."""

    def __init__(self):
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        failed: Exception | None = None
        for address in resolve(host, port, _left(timeout)):
            try:
                return _DeadlineStream(self._inner.connect_tcp(address, port, _left(timeout), local_address,
                                                               socket_options))
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                failed = e
        raise failed or httpcore.ConnectError(f"{host}: the resolver gave no address")

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _DeadlineStream(self._inner.connect_unix_socket(path, _left(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def deadline_client(timeout_s: float) -> httpx.Client:
    """An :class:`httpx.Client` whose requests wait ``timeout_s`` at most per step and, inside
    :func:`call_deadline`, never past the deadline in all (a late one raises ``httpx.ReadTimeout``).
    Its connections are kept for the next call (keep-alive, httpx's pool)."""
    transport = httpx.HTTPTransport()
    pool = getattr(transport, "_pool", None)
    if not hasattr(pool, "_network_backend"):  # httpx/httpcore changed: fail loudly, not silently unbounded
        raise RuntimeError("httpx's transport has no httpcore pool with a network backend: pin httpx 0.28")
    pool._network_backend = _DeadlineBackend()  # type: ignore[union-attr]
    return httpx.Client(timeout=timeout_s, transport=transport)
