"""The fuse service core: breaker + store + dispatcher + metrics, without HTTP.

:class:`FuseService` serialises every input (notification, override, tick) under one lock,
commits the breaker's new state, the decisions' outbox rows and audit rows in one SQLite
transaction, and only then answers. A background dispatcher applies outbox rows strictly in
order, retrying each with exponential backoff (``backoff_s`` doubling up to ``backoff_max_s``)
until its adapter accepts; a ticker releases levels whose hold time has passed.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Callable, Optional, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fusebox import conventions as C

from .actions import ActionError, Adapter
from .breaker import Breaker, Decision, OverrideError
from .payload import Notification
from .rules import FuseRules
from .store import Store, StoreError

log = logging.getLogger("fusebox.fuse")

__all__ = ["FuseService", "Unavailable", "OverrideError"]

_CHANGED = {"tripped", "held", "overridden", "resolved", "release_pending", "not_held"}


class Unavailable(RuntimeError):
    """The change could not be persisted; nothing changed; the caller should retry (HTTP 503)."""


class _Metrics:
    def __init__(self):
        M = C.FUSE_METRICS
        self.registry = CollectorRegistry()
        r = self.registry
        self.level = Gauge(M["level"], "Highest fuse level tripped per scope (0: none).", list(C.SCOPE_LABELS), registry=r)
        self.transitions = Counter(M["transitions"].removesuffix("_total"), "Fuse level changes.",
                                   ["action", "state", "source"], registry=r)
        self.notifications = Counter(M["notifications"].removesuffix("_total"), "Webhook notifications by outcome.",
                                     ["outcome"], registry=r)
        self.alerts = Counter(M["alerts"].removesuffix("_total"), "Alerts in notifications by result.", ["result"], registry=r)
        self.failures = Counter(M["action_failures"].removesuffix("_total"), "Failed action attempts (retried).",
                                ["adapter"], registry=r)
        self.pending = Gauge(M["actions_pending"], "Actions decided but not yet applied.", registry=r)
        buckets = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
        self.latency = Histogram(M["decision_latency"], "Seconds from the request that decided to the action applied.",
                                 ["adapter"], buckets=buckets, registry=r)
        self.request = Histogram(M["request_latency"], "Seconds spent handling a webhook notification.",
                                 buckets=buckets, registry=r)


class FuseService:
    """Args:
        rules: actions and levels (:meth:`FuseRules.from_spec`).
        store: the SQLite store; its snapshot, if any, is restored.
        adapters: applied for every decision they want, in order.
        hold_s: hysteresis before a release, seconds.
        backoff_s, backoff_max_s: first retry delay and cap, seconds.
        tick_s: how often hold times and override expiries are checked.
        clock: Unix seconds.
    """

    def __init__(self, rules: FuseRules, store: Store, adapters: Sequence[Adapter], *, hold_s: float = 300.0,
                 backoff_s: float = 0.5, backoff_max_s: float = 30.0, tick_s: float = 1.0,
                 clock: Callable[[], float] = time.time, dry_run: bool = False):
        self.rules = rules
        self.store = store
        self.adapters = {a.name: a for a in adapters}
        self.hold_s = hold_s
        self.backoff_s, self.backoff_max_s, self.tick_s = backoff_s, backoff_max_s, tick_s
        self.clock = clock
        self.dry_run = dry_run
        self.metrics = _Metrics()
        self.breaker = Breaker(rules, hold_s)
        self._committed = store.snapshot() or {}
        self.breaker.restore(self._committed)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._refresh_gauges()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for target, name in ((self._dispatch_loop, "fuse-dispatch"), (self._tick_loop, "fuse-tick")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()

    # ------------------------------------------------------------------ inputs
    def handle(self, note: Notification, received: Optional[float] = None) -> dict:
        """Apply a parsed notification. Returns ``{"decisions": [...], "alerts": {result: n}}``.

        Raises:
            Unavailable: the state could not be persisted (nothing changed).
        """
        received = self.clock() if received is None else received
        with self._lock:
            now = self.clock()
            decisions, outcomes = self.breaker.on_notification(note, now)
            changed = bool(decisions) or any(o.result in _CHANGED for o in outcomes)
            ids = self._commit(decisions, received, changed)
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[o.result] = counts.get(o.result, 0) + 1
            self.metrics.alerts.labels(o.result).inc()
        return {"decisions": ids, "alerts": counts}

    def tick(self) -> list[dict]:
        with self._lock:
            now = self.clock()
            decisions = self.breaker.tick(now)
            return self._commit(decisions, now, bool(decisions))

    def override(self, scope: dict, level: int, mode: str, reason: str, duration_s: float, *,
                 fleet: bool = False, new_scope: bool = False) -> list[dict]:
        """Force a level of a scope (:meth:`Breaker.override`); audited.

        Raises OverrideError (bad input), ScopeNotFound (not exactly a known scope; both change
        nothing) or Unavailable."""
        with self._lock:
            now = self.clock()
            decisions = self.breaker.override(scope, level, mode, reason, duration_s, now, fleet=fleet,
                                               new_scope=new_scope)
            audit = [{"at": now, "kind": "override", "scope_key": _key(scope), "level": level,
                      "action": self.rules.levels.get(level), "source": "override", "reason": reason,
                      "detail": {"mode": mode, "until": now + duration_s, "scope": scope, "fleet": fleet}}]
            return self._commit(decisions, now, True, audit)

    # ------------------------------------------------------------------ queries
    def state(self) -> dict:
        with self._lock:
            levels = self.breaker.levels()
            scopes = self.breaker.view()
        return {"levels": levels, "scopes": scopes, "hold_s": self.hold_s, "dry_run": self.dry_run,
                "pending_actions": self.store.pending_count()}

    # ------------------------------------------------------------------ machinery
    def _commit(self, decisions: list[Decision], received: float, changed: bool, extra_audit=()) -> list[dict]:
        if not changed:
            return []
        out, rows, audit = [], [], list(extra_audit)
        for d in decisions:
            did = uuid.uuid4().hex
            payload = {"action": d.action, "level": d.level, "state": d.kind, "reason": d.reason,
                       "scope": d.scope, "decision_id": did}
            for a in self.adapters.values():
                if a.wants(payload):
                    rows.append((did, a.name, payload, received))
            audit.append({"at": d.at, "kind": d.kind, "decision_id": did, "scope_key": d.scope_key, "level": d.level,
                          "action": d.action, "source": d.source, "reason": d.reason,
                          "detail": {"alerts": list(d.alerts), "scope": d.scope}})
            out.append({**payload, "source": d.source})
        snap = self.breaker.snapshot()
        try:
            self.store.commit(snap, rows, audit)
        except StoreError as e:
            log.error("state not persisted, change dropped: %s", e)
            self.breaker = Breaker(self.rules, self.hold_s)
            self.breaker.restore(self._committed)  # back to what is on disk
            raise Unavailable(str(e)) from e
        self._committed = snap
        for d in decisions:
            self.metrics.transitions.labels(d.action, d.kind, d.source).inc()
            log.info("%s %s level %d on %s (%s): %s", d.kind, d.action, d.level, d.scope_key, d.source, d.reason)
        if decisions:
            self._refresh_gauges()
            self._wake.set()
        return out

    def _refresh_gauges(self) -> None:
        self.metrics.level.clear()
        for sc in self.breaker.view():
            self.metrics.level.labels(*[sc["labels"].get(k, "") for k in C.SCOPE_LABELS]).set(sc["level"])
        self.metrics.pending.set(self.store.pending_count())

    def _dispatch_loop(self) -> None:
        delay = self.backoff_s
        while not self._stop.is_set():
            try:
                job = self.store.next_pending()
            except Exception:  # pragma: no cover - a broken DB must not kill the thread
                log.exception("outbox read failed")
                job = None
            if job is None:
                self._wake.wait(timeout=1.0)
                self._wake.clear()
                continue
            adapter = self.adapters.get(job["adapter"])
            try:
                if adapter is None:
                    raise ActionError(f"no adapter {job['adapter']!r} configured (started with other options?)")
                adapter.apply(job["payload"])
            except Exception as e:  # ActionError, or a bug in an adapter: retry either way
                self.metrics.failures.labels(job["adapter"]).inc()
                self.store.mark_failed(job["seq"], str(e))
                log.warning("action %s for %s failed (attempt %d), retrying in %.2fs: %s",
                            job["adapter"], job["decision_id"], job["attempts"] + 1, delay, e)
                self._stop.wait(delay)
                delay = min(delay * 2, self.backoff_max_s)
                continue
            delay = self.backoff_s
            now = self.clock()
            p = job["payload"]
            self.store.mark_applied(job["seq"], now, {
                "at": now, "kind": "applied", "decision_id": job["decision_id"], "level": p["level"],
                "action": p["action"], "source": job["adapter"], "reason": f"{p['state']} applied by {job['adapter']}",
                "detail": {"attempts": job["attempts"] + 1}})
            self.metrics.latency.labels(job["adapter"]).observe(max(0.0, now - job["received"]))
            self.metrics.pending.set(self.store.pending_count())

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception:  # pragma: no cover - retried next tick
                log.exception("tick failed")


def _key(scope: dict) -> str:
    from .rules import scope_key, scope_of

    return scope_key(scope_of(scope))
