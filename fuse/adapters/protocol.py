"""The adapter contract: what a decision does outside the service, and how a call fails.

Every adapter has a stable ``name`` (the outbox key), ``wants(call) -> bool`` and
``apply(call)``, which returns when the action is applied and raises :class:`ActionError`
otherwise. ``call`` is a :class:`fusebox.fuse.control.ControlCall` (its JSON is the gateway
control body: ``{"action", "level", "state": "trip"|"release", "reason", "scope", "decision_id"}``).

Retry classes (what the dispatcher in :mod:`fusebox.fuse.dispatch.dispatcher` does with an :class:`ActionError`):

* ``permanent`` (an HTTP 4xx other than 408, 425, 429: the request itself is refused, so sending it
  again cannot help): audited as failed at once, the next decision goes on.
* otherwise (no answer, timeout, 5xx, 408/425/429): retried with backoff, until applied when the
  adapter's ``max_attempts`` is None (the gateway), or up to ``max_attempts`` attempts (best-effort
  adapters such as the vLLM reset), then audited as failed.

The built-in calls are in :mod:`fusebox.fuse.adapters.gateway`, the per-call deadline in
:mod:`fusebox.fuse.adapters.transport`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..control import ControlCall
from ..logsafe import redact_urls

__all__ = ["ActionError", "CredentialRefused", "is_permanent", "RETRYABLE_4XX", "Adapter", "Observable",
           "AdapterStateStore"]


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


def is_permanent(status: int | None) -> bool:
    """Whether an HTTP ``status`` means the same request will never succeed: 4xx except 408/425/429.

    None (no answer: refused, reset, timeout) and 5xx are transient."""
    return status is not None and 400 <= status < 500 and status not in RETRYABLE_4XX


class Adapter(Protocol):
    """``max_attempts``: None retries transient failures until applied; an int gives up after that
    many attempts (read with ``getattr``, so an adapter without it retries until applied).
    ``label`` (optional, default ``name``): how metrics and the status page name it; no URL.

    Optional, ``observe(calls) -> list[bool]`` (:class:`Observable`): what the target itself
    shows; an adapter without it cannot report, and is not reconciled."""

    name: str
    max_attempts: int | None

    def wants(self, call: ControlCall) -> bool: ...

    def apply(self, call: ControlCall) -> None: ...


class Observable(Protocol):
    """An adapter that can report the target's own state (the reconciler in
    :mod:`fusebox.fuse.service` compares it with what the fuse decided, and queues the decision again
    where they differ).

    ``observe(calls)``: for each control call (what :meth:`Adapter.apply` takes), True
    when the target's own state shows it applied -- a trip: every worker it maps to is out of
    rotation (drained, its map entry set); a release: every such worker is back, unless another
    (action, scope) still holds it -- else False. One read of the target per call, whatever the
    number of calls; a call whose scope maps to no target is True (nothing to apply).
    Raises :class:`ActionError` when the target's state cannot be read (no answer: nothing is
    concluded)."""

    def observe(self, calls: Sequence[ControlCall]) -> list[bool]: ...


class AdapterStateStore(Protocol):
    """Where an adapter keeps what it needs between calls, shared by every replica (the fuse's
    store, :class:`fusebox.fuse.store.Store`, table ``adapter_state``): the (action, scope) holds on
    each worker and the settings recorded per worker. An adapter with an ``attach(store)`` method
    is handed it at start. Each method raises StoreError when the store cannot be read or written."""

    def adapter_hold(self, adapter: str, worker: str, hold: str, on: bool) -> bool:
        """Add (``on``) or drop ``hold`` on ``worker``; whether anything still holds it."""
        ...

    def adapter_record(self, adapter: str, worker: str, settings: dict) -> None:
        """Record ``settings`` (JSON-able) of ``worker``, replacing earlier ones."""
        ...

    def adapter_state(self, adapter: str) -> dict[str, dict]:
        """``{worker: {"holds": [...], "settings": {...}}}`` of ``adapter``."""
        ...
