"""Action adapters: what a decision does outside the service.

Every adapter has a stable ``name`` (the outbox key), ``wants(payload) -> bool`` and
``apply(payload)``, which returns when the action is applied and raises :class:`ActionError`
otherwise. ``payload`` is the gateway control body:
``{"action", "level", "state": "trip"|"release", "reason", "scope", "decision_id"}``.

Retry classes (what the dispatcher in :mod:`fusebox.fuse.service` does with an :class:`ActionError`):

* ``permanent`` (an HTTP 4xx other than 408, 425, 429: the request itself is refused, so sending it
  again cannot help): audited as failed at once, the next decision goes on.
* otherwise (no answer, timeout, 5xx, 408/425/429): retried with backoff, until applied when the
  adapter's ``max_attempts`` is None (the gateway), or up to ``max_attempts`` attempts (best-effort
  adapters such as the vLLM reset), then audited as failed.

* :class:`HttpGateway`: ``POST <gateway>/v1/control/fuse`` with a bearer token (the seed's
  control call); the gateway is idempotent per ``decision_id`` (also sent as ``Idempotency-Key``).
* :class:`VllmResetPrefixCache`: ``POST <engine>/reset_prefix_cache`` on a level-3 trip
  (vLLM's API server; only on a trip: there is nothing to undo on release).
* :class:`DryRun`: logs the decision and calls nothing.

Deadlines: an adapter's ``timeout_s`` bounds one call (one :meth:`apply`) in total, not each read:
:func:`call_deadline` sets it for the thread, and every connect, write and read of a
:func:`deadline_client` (and of the HAProxy socket) waits at most what is left of it, so a gateway
that trickles its answer a byte at a time is cut off at the deadline (:class:`DeadlineExceeded`, a
transient :class:`ActionError`). Resolving the host's name is bounded too (:func:`resolve`): a
resolver that does not answer holds ``getaddrinfo`` for its own timeouts, which no socket timeout
covers (30 s for a ``--timeout 1`` call in the tests). The service's lease must exceed the longest ``timeout_s``
(``fusebox fuse serve`` checks it at start), so a call never outlives its claim.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

import httpcore
import httpx

from .logsafe import HIDDEN, SECRET_PARAMS, install, redact_url, redact_urls

log = install(logging.getLogger("fusebox.fuse"))

__all__ = ["ActionError", "CredentialRefused", "is_permanent", "RETRYABLE_4XX", "Adapter", "Observable",
           "HttpGateway", "VllmResetPrefixCache", "DryRun", "read_token", "bearer_matches",
           "CONTROL_PATH", "DeadlineExceeded", "call_deadline", "remaining", "deadline_client", "resolve"]

CONTROL_PATH = "/v1/control/fuse"
TOKEN_ENV = "FUSEBOX_GATEWAY_TOKEN"


RETRYABLE_4XX = frozenset({408, 425, 429})  # Request Timeout, Too Early, Too Many Requests


class ActionError(RuntimeError):
    """The action was not applied (connection refused, timeout, non-2xx).

    ``status``: the HTTP status when there was an answer (None: no answer); ``permanent``: True when
    retrying cannot help (see :func:`is_permanent`). ``summary``: what happened without URL or
    answer text (``HTTP 404``, ``ConnectError``), for the status page; the message has both.
    """

    def __init__(self, message: str, status: int | None = None, summary: str | None = None):
        super().__init__(redact_urls(message))  # no URL credential reaches the log or the audit
        self.status = status
        self.permanent = is_permanent(status)
        self.summary = summary or (f"HTTP {status}" if status is not None else "no answer")


class CredentialRefused(ActionError):
    """A gateway answered 401 or 403 to the fuse's control-plane call: it refused the key the
    adapter sent (``configured``), or asked for one and none is configured (no ``credentials_file``).

    Transient, unlike other 4xx: the call is retried with the lane's backoff (a key file rotated
    meanwhile is read on the next attempt; the fuse never claims the change applied). ``quiet``:
    the adapter logs such a refusal once per change (refused, accepted again), so the service does
    not log every retry of it.
    """

    quiet = True

    def __init__(self, message: str, status: int, configured: bool):
        summary = (f"gateway refused the control-plane credential (HTTP {status})" if configured
                   else f"gateway requires a control-plane credential (HTTP {status}): none configured (credentials_file)")
        super().__init__(message, status, summary)
        self.permanent = False


# Shortest string of a request body hidden in an answer that echoes it (shorter ones -- "trip",
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


def is_permanent(status: int | None) -> bool:
    """Whether an HTTP ``status`` means the same request will never succeed: 4xx except 408/425/429.

    None (no answer: refused, reset, timeout) and 5xx are transient."""
    return status is not None and 400 <= status < 500 and status not in RETRYABLE_4XX


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


class Adapter(Protocol):
    """``max_attempts``: None retries transient failures until applied; an int gives up after that
    many attempts (read with ``getattr``, so an adapter without it retries until applied).
    ``label`` (optional, default ``name``): how metrics and the status page name it; no URL.

    Optional, ``observe(payloads) -> list[bool]`` (:class:`Observable`): what the target itself
    shows; an adapter without it cannot report, and is not reconciled."""

    name: str
    max_attempts: int | None

    def wants(self, payload: dict) -> bool: ...

    def apply(self, payload: dict) -> None: ...


class Observable(Protocol):
    """An adapter that can report the target's own state (the reconciler in
    :mod:`fusebox.fuse.service` compares it with what the fuse decided, and queues the decision again
    where they differ).

    ``observe(payloads)``: for each control payload (the shape :meth:`Adapter.apply` takes), True
    when the target's own state shows it applied -- a trip: every worker it maps to is out of
    rotation (drained, its map entry set); a release: every such worker is back, unless another
    (action, scope) still holds it -- else False. One read of the target per call, whatever the
    number of payloads; a payload whose scope maps to no target is True (nothing to apply).
    Raises :class:`ActionError` when the target's state cannot be read (no answer: nothing is
    concluded)."""

    def observe(self, payloads: Sequence[dict]) -> list[bool]: ...


def read_token(path: str | None = None, env: str | None = TOKEN_ENV) -> str | None:
    """A bearer token from env var ``env`` (when set) or from the file ``path`` (one line, surrounding
    whitespace stripped, as :func:`fusebox.fuse.tokens.read_token_file` reads it); None if neither.
    The gateway's token, the one ``fuse serve`` sends and the one ``fuse gateway`` requires: at least
    :data:`fusebox.fuse.tokens.MIN_TOKEN_LENGTH` (32) characters, as the fuse's own tokens.

    Raises:
        ValueError: shorter than that, empty, more than one line, or whitespace inside (the message
            names the file or the env var and how to make one). OSError: the file cannot be read.
    """
    from .tokens import check_token_length, read_token_file

    if env and os.environ.get(env):
        token = os.environ[env].strip()
        check_token_length(f"env {env}", token)
        return token
    if path:
        return read_token_file(path)
    return None


def bearer_matches(header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` with the Bearer scheme.

    The scheme is case-insensitive (RFC 7235 section 2.1: ``bearer``, ``BEARER`` are fine) and may be
    followed by more than one space; the token is compared in constant time (:func:`hmac.compare_digest`).
    """
    scheme, _, credentials = (header or "").strip().partition(" ")
    ok_scheme = scheme.lower() == "bearer"
    # compare even when the scheme is wrong, so the time taken does not say which part was wrong
    ok_token = hmac.compare_digest(credentials.strip(" ").encode(), token.encode())
    return ok_scheme and ok_token


class HttpGateway:
    """The generic control call: ``POST <url>/v1/control/fuse`` (timeout in seconds)."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 5.0):
        self.url = url.rstrip("/") + CONTROL_PATH
        self.name = "gateway"
        self.max_attempts: int | None = None  # "a gateway that is down is retried until it accepts"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s  # one call in total (call_deadline)
        self._client = deadline_client(timeout_s)

    def wants(self, payload: dict) -> bool:
        return True

    def apply(self, payload: dict) -> None:
        try:
            with call_deadline(self.timeout_s):
                r = self._client.post(self.url, json=payload,
                                      headers={**self._headers, "Idempotency-Key": payload["decision_id"]})
        except httpx.HTTPError as e:
            raise ActionError(f"{self.url}: {type(e).__name__}: {e}", summary=type(e).__name__) from None
        if not 200 <= r.status_code < 300:
            raise ActionError(f"{self.url}: HTTP {r.status_code} {answer_text(r)}", r.status_code)


class VllmResetPrefixCache:
    """vLLM's ``POST /reset_prefix_cache`` on a trip of ``action`` (default kv_cache_eviction).

    ``engine``: only scopes whose ``engine`` label equals it (None: every scope). Best effort:
    ``max_attempts`` attempts at most (default 5), then the dispatcher audits it as failed. vLLM
    registers the route only when the engine runs with ``VLLM_SERVER_DEV_MODE=1``; without it the
    answer is 404, a permanent failure (one attempt).
    """

    def __init__(self, base_url: str, engine: str | None = None, action: str = "kv_cache_eviction",
                 timeout_s: float = 5.0, max_attempts: int = 5):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.max_attempts: int | None = max_attempts
        self.url = base_url.rstrip("/") + "/reset_prefix_cache"
        self.engine = engine
        self.action = action
        # the outbox key: stable across restarts; no credential of the URL (it reaches the audit and the logs)
        self.name = f"vllm:{engine or '*'}:{redact_url(base_url.rstrip('/'))}"
        self.label = f"vllm:{engine or '*'}"  # for metrics and the status page: no URL
        self.timeout_s = timeout_s  # one call in total (call_deadline)
        self._client = deadline_client(timeout_s)

    def wants(self, payload: dict) -> bool:
        if payload["state"] != "trip" or payload["action"] != self.action:
            return False
        return self.engine is None or payload["scope"].get("engine") == self.engine

    def apply(self, payload: dict) -> None:
        try:
            with call_deadline(self.timeout_s):
                r = self._client.post(self.url)
        except httpx.HTTPError as e:
            raise ActionError(f"{self.url}: {type(e).__name__}: {e}", summary=type(e).__name__) from None
        if r.status_code == 404:
            hint = "HTTP 404 (vLLM serves /reset_prefix_cache only when the engine runs with VLLM_SERVER_DEV_MODE=1)"
            raise ActionError(f"{self.url}: {hint}", 404, summary=hint)
        if not 200 <= r.status_code < 300:
            raise ActionError(f"{self.url}: HTTP {r.status_code}", r.status_code)


class DryRun:
    """Logs what would be done; never fails."""

    name = "dry-run"
    max_attempts: int | None = None

    def __init__(self):
        self.seen: list[dict] = []

    def wants(self, payload: dict) -> bool:
        return True

    def apply(self, payload: dict) -> None:
        """Log ``dry-run: would STATE ACTION (level N) on SCOPE_KEY: REASON`` (WARNING), with the
        decision's fields (``decision_id``, ``scope`` as the scope key, ``action``, ``fuse_level``,
        ``state``, ``adapter``) for ``--log-format json``."""
        from .rules import scope_key, scope_of

        self.seen.append(payload)
        key = scope_key(scope_of(payload.get("scope") or {}))
        log.warning("dry-run: would %s %s (level %s) on %s: %s", payload["state"], payload["action"],
                    payload["level"], key, payload["reason"],
                    extra={"decision_id": payload.get("decision_id"), "scope": key, "action": payload["action"],
                           "fuse_level": payload["level"], "state": payload["state"], "adapter": self.name})
