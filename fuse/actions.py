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
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from pathlib import Path
from typing import Optional, Protocol

import httpx

from .logsafe import HIDDEN, SECRET_PARAMS, install, redact_url, redact_urls

log = install(logging.getLogger("fusebox.fuse"))

__all__ = ["ActionError", "is_permanent", "RETRYABLE_4XX", "Adapter", "HttpGateway", "VllmResetPrefixCache", "DryRun", "read_token", "bearer_matches",
           "CONTROL_PATH"]

CONTROL_PATH = "/v1/control/fuse"
TOKEN_ENV = "FUSEBOX_GATEWAY_TOKEN"


RETRYABLE_4XX = frozenset({408, 425, 429})  # Request Timeout, Too Early, Too Many Requests


class ActionError(RuntimeError):
    """The action was not applied (connection refused, timeout, non-2xx).

    ``status``: the HTTP status when there was an answer (None: no answer); ``permanent``: True when
    retrying cannot help (see :func:`is_permanent`). ``summary``: what happened without URL or
    answer text (``HTTP 404``, ``ConnectError``), for the status page; the message has both.
    """

    def __init__(self, message: str, status: Optional[int] = None, summary: Optional[str] = None):
        super().__init__(redact_urls(message))  # no URL credential reaches the log or the audit
        self.status = status
        self.permanent = is_permanent(status)
        self.summary = summary or (f"HTTP {status}" if status is not None else "no answer")


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


def is_permanent(status: Optional[int]) -> bool:
    """Whether an HTTP ``status`` means the same request will never succeed: 4xx except 408/425/429.

    None (no answer: refused, reset, timeout) and 5xx are transient."""
    return status is not None and 400 <= status < 500 and status not in RETRYABLE_4XX


class Adapter(Protocol):
    """``max_attempts``: None retries transient failures until applied; an int gives up after that
    many attempts (read with ``getattr``, so an adapter without it retries until applied).
    ``label`` (optional, default ``name``): how metrics and the status page name it; no URL."""

    name: str
    max_attempts: Optional[int]

    def wants(self, payload: dict) -> bool: ...

    def apply(self, payload: dict) -> None: ...


def read_token(path: Optional[str] = None, env: Optional[str] = TOKEN_ENV) -> Optional[str]:
    """A bearer token from env var ``env`` (when set) or from the file ``path`` (stripped); None if neither."""
    if env and os.environ.get(env):
        return os.environ[env].strip()
    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    return None


def bearer_matches(header: Optional[str], token: str) -> bool:
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

    def __init__(self, url: str, token: Optional[str] = None, timeout_s: float = 5.0):
        self.url = url.rstrip("/") + CONTROL_PATH
        self.name = "gateway"
        self.max_attempts: Optional[int] = None  # "a gateway that is down is retried until it accepts"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(timeout=timeout_s)

    def wants(self, payload: dict) -> bool:
        return True

    def apply(self, payload: dict) -> None:
        try:
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

    def __init__(self, base_url: str, engine: Optional[str] = None, action: str = "kv_cache_eviction",
                 timeout_s: float = 5.0, max_attempts: int = 5):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.max_attempts: Optional[int] = max_attempts
        self.url = base_url.rstrip("/") + "/reset_prefix_cache"
        self.engine = engine
        self.action = action
        # the outbox key: stable across restarts; no credential of the URL (it reaches the audit and the logs)
        self.name = f"vllm:{engine or '*'}:{redact_url(base_url.rstrip('/'))}"
        self.label = f"vllm:{engine or '*'}"  # for metrics and the status page: no URL
        self._client = httpx.Client(timeout=timeout_s)

    def wants(self, payload: dict) -> bool:
        if payload["state"] != "trip" or payload["action"] != self.action:
            return False
        return self.engine is None or payload["scope"].get("engine") == self.engine

    def apply(self, payload: dict) -> None:
        try:
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
    max_attempts: Optional[int] = None

    def __init__(self):
        self.seen: list[dict] = []

    def wants(self, payload: dict) -> bool:
        return True

    def apply(self, payload: dict) -> None:
        self.seen.append(payload)
        log.warning("dry-run: would %s %s (level %s) on %s: %s", payload["state"], payload["action"],
                    payload["level"], payload["scope"], payload["reason"])
