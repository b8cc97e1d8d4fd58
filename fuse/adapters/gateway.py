"""The built-in control calls (``fusebox fuse serve --gateway-url``, ``--vllm-url``, ``--dry-run``).

* :class:`HttpGateway`: ``POST <gateway>/v1/control/fuse`` with a bearer token (the seed's
  control call); the gateway is idempotent per ``decision_id`` (also sent as ``Idempotency-Key``).
* :class:`VllmResetPrefixCache`: ``POST <engine>/reset_prefix_cache`` on a level-3 trip
  (vLLM's API server; only on a trip: there is nothing to undo on release).
* :class:`DryRun`: logs the decision and calls nothing.

Each follows :class:`fusebox.fuse.adapters.protocol.Adapter`; one call is bounded by its
``timeout_s`` in total (:mod:`fusebox.fuse.adapters.transport`).
"""

from __future__ import annotations

import hmac
import logging
import os

import httpx

from ..control import ControlCall
from ..logsafe import install, redact_url
from ..rules import scope_key, scope_of
from ..tokens import check_token_length, read_token_file
from .protocol import ActionError
from .transport import answer_text, call_deadline, deadline_client

log = install(logging.getLogger("fusebox.fuse"))

__all__ = ["HttpGateway", "VllmResetPrefixCache", "DryRun", "read_token", "bearer_matches", "CONTROL_PATH", "TOKEN_ENV"]

CONTROL_PATH = "/v1/control/fuse"
TOKEN_ENV = "FUSEBOX_GATEWAY_TOKEN"


def read_token(path: str | None = None, env: str | None = TOKEN_ENV) -> str | None:
    """A bearer token from env var ``env`` (when set) or from the file ``path`` (one line, surrounding
    whitespace stripped, as :func:`fusebox.fuse.tokens.read_token_file` reads it); None if neither.
    The gateway's token, the one ``fuse serve`` sends and the one ``fuse gateway`` requires: at least
    :data:`fusebox.fuse.tokens.MIN_TOKEN_LENGTH` (32) characters, as the fuse's own tokens.

    Raises:
        ValueError: shorter than that, empty, more than one line, or whitespace inside (the message
            names the file or the env var and how to make one). OSError: the file cannot be read.
    """
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

    def wants(self, call: ControlCall) -> bool:
        return True

    def apply(self, call: ControlCall) -> None:
        try:
            with call_deadline(self.timeout_s):
                r = self._client.post(self.url, json=call.to_json(),
                                      headers={**self._headers, "Idempotency-Key": call.decision_id})
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

    def wants(self, call: ControlCall) -> bool:
        if call.state != "trip" or call.action != self.action:
            return False
        return self.engine is None or call.scope.get("engine") == self.engine

    def apply(self, call: ControlCall) -> None:
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
        self.seen: list[ControlCall] = []

    def wants(self, call: ControlCall) -> bool:
        return True

    def apply(self, call: ControlCall) -> None:
        """Log ``dry-run: would STATE ACTION (level N) on SCOPE_KEY: REASON`` (WARNING), with the
        decision's fields (``decision_id``, ``scope`` as the scope key, ``action``, ``fuse_level``,
        ``state``, ``adapter``) for ``--log-format json``."""
        self.seen.append(call)
        key = scope_key(scope_of(call.scope))
        log.warning("dry-run: would %s %s (level %s) on %s: %s", call.state, call.action,
                    call.level, key, call.reason,
                    extra={"decision_id": call.decision_id, "scope": key, "action": call.action,
                           "fuse_level": call.level, "state": call.state, "adapter": self.name})
