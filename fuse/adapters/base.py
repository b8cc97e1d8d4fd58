"""What every adapter of the spec's ``fuse.adapters`` shares (:mod:`fusebox.fuse.adapters`).

Scope -> target: a target applies to a decision's scope when its ``match`` labels all equal the
scope's (the scope may carry more), or when every scope label is in ``match`` with the same value
(a broader scope, e.g. a cluster, covers the targets inside it). A scope no target applies to is
refused: :class:`~fusebox.fuse.adapters.protocol.ActionError` (permanent), audited as failed, and no label
value of it is sent anywhere (:func:`unmapped`).

:class:`Holds`: a worker stays out of rotation while any (action, scope) that took it out is still
tripped; the holds (and the recorded settings) live in the service's store (table
``adapter_state``, :mod:`fusebox.fuse.store`) once attached, in memory before.

:class:`Rotation`: the base of the adapters that take workers out of an HTTP gateway's rotation
and put them back (:mod:`.sglang_gateway`, :mod:`.vllm_router`); a subclass says how. With the
spec's ``credentials_file`` every call carries the gateway's control-plane key as ``Authorization:
Bearer`` (:class:`~fusebox.fuse.tokens.KeyFile`: read again when the file changes); a 401 or 403
raises :class:`~fusebox.fuse.adapters.protocol.CredentialRefused` (retried, logged once per change).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import httpx

from fusebox.spec.adapters import Adapter as AdapterSpec
from fusebox.spec.adapters import Target

from ..control import ControlCall
from ..logsafe import install
from ..rules import scope_key
from ..tokens import KeyFile
from .discovery import GpuWorkers
from .protocol import ActionError, AdapterStateStore, CredentialRefused
from .transport import answer_text, call_deadline, deadline_client

log = install(logging.getLogger("fusebox.fuse"))

__all__ = ["targets_for", "unmapped", "call_error", "Holds", "Rotation"]


def targets_for(spec: AdapterSpec, scope: dict) -> list[Target]:
    """The spec's targets that apply to ``scope`` (see the module's doc); [] when none."""
    scope = {k: v for k, v in scope.items() if isinstance(v, str)}
    if not scope:
        return []
    out = []
    for t in spec.targets:
        narrower = all(scope.get(k) == v for k, v in t.match.items())
        broader = all(t.match.get(k) == v for k, v in scope.items())
        if narrower or broader:
            out.append(t)
    return out


def unmapped(spec: AdapterSpec) -> ActionError:
    """The permanent :class:`ActionError` for a scope no target of ``spec`` maps (nothing is sent)."""
    # The scope's values are left out: they are untrusted and may be anything (1 MB, newlines).
    msg = f"scope not mapped by fuse.adapters.{spec.name}.targets: refused, nothing sent"
    e = ActionError(msg, status=None, summary="scope not mapped in the spec: refused")
    e.permanent = True
    return e


def call_error(url: str, e: httpx.HTTPError) -> ActionError:
    """The retryable :class:`ActionError` for a request to ``url`` that got no answer (``e``); its
    summary (what ``/state`` shows) keeps the error's own text, one line, at most 200 characters
    (``ConnectError: [Errno -2] Name or service not known``: the name did not resolve)."""
    text = " ".join(str(e).split())
    return ActionError(f"{url}: {type(e).__name__}: {e}", summary=f"{type(e).__name__}: {text}"[:200] if text else type(e).__name__)


class Holds:
    """(action, scope) holds per worker and the settings recorded per worker: in the store once
    :meth:`attach`-ed (``adapter_state``, keyed by the adapter's outbox name), in memory before."""

    def __init__(self, adapter: str):
        self.adapter = adapter
        self.store: AdapterStateStore | None = None
        self._lock = threading.Lock()
        self._holds: dict[str, set[str]] = {}
        self._settings: dict[str, dict] = {}

    def attach(self, store: AdapterStateStore) -> None:
        """Keep them in ``store`` (a :class:`fusebox.fuse.store.Store`) from now on."""
        self.store = store

    def change(self, worker: str, hold: str, on: bool) -> bool:
        """Add (``on``) or drop a hold; returns whether the worker is still held by anything. Raises StoreError."""
        if self.store is not None:
            return bool(self.store.adapter_hold(self.adapter, worker, hold, on))
        with self._lock:
            cur = self._holds.get(worker, set())
            cur = cur | {hold} if on else cur - {hold}
            self._holds[worker] = cur
            return bool(cur)

    def held_by(self, hold: str | None) -> list[str]:
        """The workers ``hold`` holds (None: any hold), sorted. Raises StoreError."""
        if self.store is not None:
            held = {w: st["holds"] for w, st in self.store.adapter_state(self.adapter).items()}
        else:
            with self._lock:
                held = {w: list(hs) for w, hs in self._holds.items()}
        return sorted(w for w, hs in held.items() if (hold in hs if hold is not None else hs))

    def record(self, worker: str, settings: dict) -> None:
        if self.store is not None:
            self.store.adapter_record(self.adapter, worker, settings)
            return
        with self._lock:
            self._settings[worker] = settings

    def held(self, worker: str) -> bool:
        """Whether any (action, scope) holds ``worker`` out now."""
        if self.store is not None:
            return bool(self.store.adapter_state(self.adapter).get(worker, {}).get("holds"))
        with self._lock:
            return bool(self._holds.get(worker))

    def settings(self, worker: str) -> dict:
        """The settings recorded for ``worker`` ({} when none)."""
        if self.store is not None:
            return dict(self.store.adapter_state(self.adapter).get(worker, {}).get("settings", {}))
        with self._lock:
            return dict(self._settings.get(worker, {}))


class FromSpec:
    """What every adapter built from a ``fuse.adapters`` entry carries: ``spec``, ``name``
    (``<kind>:<name>``, its outbox name), ``label`` (the entry's name), ``max_attempts`` and
    ``timeout_s`` (one apply() in total, every request or command of it: call_deadline)."""

    kind = ""

    def __init__(self, spec: AdapterSpec):
        self.spec = spec
        self.name = f"{self.kind}:{spec.name}"
        self.label = spec.name
        self.max_attempts: int | None = spec.max_attempts
        self.timeout_s = spec.timeout_s


class Rotation(FromSpec):
    """Take workers out of a gateway's rotation and put them back; subclasses say how."""

    def __init__(self, spec: AdapterSpec):
        super().__init__(spec)
        self.url = spec.url or ""
        self._client = deadline_client(spec.timeout_s)
        self.holds = Holds(self.name)
        self.discovery = GpuWorkers(spec.discover, spec.timeout_s) if spec.discover else None
        # the control-plane key (raises NoTokens, OSError, ValueError when it cannot be read at start)
        self.key = KeyFile(spec.credentials_file) if spec.credentials_file else None
        self._refused: int | None = None  # the status of the gateway's last refusal of the key, until accepted

    def attach(self, store: AdapterStateStore) -> None:
        """Keep the holds and recorded settings in ``store`` (the service calls it)."""
        self.holds.attach(store)

    def wants(self, call: ControlCall) -> bool:
        return call.action in self.spec.actions

    def apply(self, call: ControlCall) -> None:
        hold = f"{call.action} {scope_key(call.scope)}"
        with call_deadline(self.timeout_s):
            workers = [t.worker_url for t in targets_for(self.spec, call.scope) if t.worker_url]
            if not workers and self.discovery is not None:
                workers = self._discovered(call, hold)
            elif not workers:
                raise unmapped(self.spec)
            for w in workers:
                if self.holds.change(w, hold, call.state == "trip"):
                    self.take_out(w)
                else:
                    self.put_back(w)

    def _discovered(self, call: ControlCall, hold: str) -> list[str]:
        """A scope no static target maps: on a trip, the gateway's workers of the scope's engine pod
        or on its GPU (:class:`~fusebox.fuse.adapters.discovery.GpuWorkers`; raises its ResolveError), those another hold
        already took out included (the gateway listed them then); on a release, the workers this
        (action, scope) holds (whatever the attribution says by then)."""
        assert self.discovery is not None
        if call.state != "trip":
            return self.holds.held_by(hold)
        return self.discovery.workers(call.scope, [*self.worker_urls(), *self.holds.held_by(None)])

    def worker_urls(self) -> list[str]:
        """The gateway's own worker URLs."""
        raise NotImplementedError

    def take_out(self, worker: str) -> None:
        raise NotImplementedError

    def put_back(self, worker: str) -> None:
        raise NotImplementedError

    def listed(self) -> set[str]:
        """The worker URLs in the gateway's own rotation (one read). Raises ActionError."""
        raise NotImplementedError

    def observe(self, calls: Sequence[ControlCall]) -> list[bool]:
        """:class:`fusebox.fuse.adapters.protocol.Observable`: one read of the gateway's worker list."""
        listed = self.listed()
        return [all((t.worker_url not in listed) == (p.state == "trip" or self.holds.held(t.worker_url))
                    for t in targets_for(self.spec, p.scope) if t.worker_url) for p in calls]

    def _req(self, method: str, path: str, **kw) -> httpx.Response:
        """One call to the gateway, with the control-plane key as ``Authorization: Bearer`` when the
        spec names a ``credentials_file``. Raises :class:`ActionError` when there is no answer and
        :class:`CredentialRefused` on a 401 or 403 (logged once per change, never the key)."""
        url = self.url + path
        headers = {"Authorization": f"Bearer {self.key.value()}"} if self.key is not None else None
        try:
            r = self._client.request(method, url, headers=headers, **kw)
        except httpx.HTTPError as e:
            raise call_error(url, e) from None
        if r.status_code in (401, 403):
            refused = CredentialRefused(f"{method} {url}: HTTP {r.status_code} {answer_text(r)}", r.status_code,
                                        self.key is not None)
            if self._refused != r.status_code:
                log.error("adapter %s: %s; its calls are retried with backoff and nothing is applied until the gateway "
                          "accepts one (check %s against the gateway's --control-plane-api-keys)", self.label,
                          refused.summary, f"the key in {self.key.path}" if self.key is not None else "credentials_file")
                self._refused = r.status_code
            raise refused
        if self._refused is not None:
            log.info("adapter %s: the gateway accepts the control-plane credential again", self.label)
            self._refused = None
        return r

    def _check(self, r: httpx.Response, ok: tuple[int, ...] = ()) -> None:
        if not (200 <= r.status_code < 300 or r.status_code in ok):
            raise ActionError(f"{r.request.method} {r.request.url}: HTTP {r.status_code} {answer_text(r)}", r.status_code)
