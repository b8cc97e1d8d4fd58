"""The fuse service core: breaker + store + dispatcher + metrics, without HTTP.

:class:`FuseService` serialises every input (notification, override, tick) under one lock,
commits the breaker's new state, the decisions' outbox rows and audit rows in one SQLite
transaction, and only then answers. A ticker releases levels whose hold time has passed.

Delivery: one dispatcher thread per adapter, so a slow or dead adapter (a vLLM engine) never delays
another (the gateway). Within an adapter, rows are ordered per scope (a *lane*: adapter + scope
key): only the oldest pending row of a lane is attempted, so a trip precedes its release, while a
lane that is failing (in backoff) does not hold up other scopes. Failures are classified by
:class:`fusebox.fuse.actions.ActionError`: permanent ones (4xx but 408/425/429) are audited as
``failed`` at once; transient ones are retried with exponential backoff (``backoff_s`` doubling up
to ``backoff_max_s``, per lane) until applied, or until the adapter's ``max_attempts`` is spent.
An exception inside a dispatcher iteration (e.g. the store failing) is logged, counted in
``fusebox_fuse_dispatcher_errors_total`` and the loop goes on.

Scale: a change persists only the scopes it touched (:meth:`Breaker.changes`), sets the level
gauge of only those scopes, and looks at no other scope (alerts indexed by fingerprint, timers in a
heap), so it costs the same with 10,000 scopes held as with none. ``fusebox_fuse_level`` has one
series per scope for at most ``max_level_series`` scopes, the most severe first
(``fusebox_fuse_scopes{level}`` counts them all, ``fusebox_fuse_level_series_dropped`` those left out).

Replicas (several services on one PostgreSQL store, :class:`fusebox.fuse.store.PgStore`): every
change runs in the store's exclusive transaction (:meth:`Store.change`), which hands back the rows
another replica changed since, so the breaker decides on the newest state and a
notification delivered to two replicas changes it once. Hold timers and override expiries live in
that state: whichever replica ticks first after they are due releases, once. An outbox row is
*claimed* (:meth:`Store.claim`, a lease of ``lease_s``) before its adapter is called; a row whose
claimer died is taken over when its lease ends, so a call may be made twice (at-least-once, the
gateway is idempotent per ``decision_id``), a decision never.

Test-only: the environment variable ``FUSEBOX_FUSE_TEST_HANG_AFTER_CLAIM_S`` makes the dispatcher
sleep that many seconds after claiming a row and before calling its adapter, so that a test can
kill a replica in between. Never set it in a deployment.

What people see (the status page, ``/metrics``) names an adapter by its *label* (``gateway``,
``vllm:<engine>``), never by a URL; the audit's ``reason`` says what happened (``HTTP 400``)
without the answer's text, which stays in the audit row's ``detail`` (``error``, ``adapter``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from typing import Callable, Optional, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fusebox import conventions as C

from .actions import Adapter
from .breaker import MAX_SCOPES, Breaker, Decision, OverrideError
from .logsafe import install
from .payload import Notification
from .rules import FuseRules
from .store import Store, StoreError

log = install(logging.getLogger("fusebox.fuse"))

__all__ = ["FuseService", "Unavailable", "OverrideError"]

_CHANGED = {"tripped", "held", "overridden", "resolved", "release_pending", "not_held"}
_REFUSED = {"untrusted", "no_scope", "scope_limit"}  # audited as kind "ignored", with the reason
# Distinct Alertmanagers (externalURL) with a last-notification series of their own; an HA pair
# or a few clusters' worth, far below what would burden /metrics.
MAX_ALERTMANAGERS = 16
# Scopes with a fusebox_fuse_level series of their own, the most severe first (issue 22: 10,000
# scopes made /metrics 13.6 MB); fusebox_fuse_scopes{level} counts every scope.
MAX_LEVEL_SERIES = 1000
# Episodes (fingerprint, startsAt, result) of refused alerts already audited, kept per replica, the
# oldest forgotten first: a refused alert is audited (and logged) once per episode, not on every
# re-notification (issue 22: 10 re-notifications of 4,000 refused alerts made 40,000 rows).
MAX_REFUSED_EPISODES = 100_000
# Refused episodes read back from the audit at start (the newest ones).
EPISODES_READ_BACK = 10_000


TEST_HANG_ENV = "FUSEBOX_FUSE_TEST_HANG_AFTER_CLAIM_S"


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
        self.truncated = Counter(M["truncated_alerts"].removesuffix("_total"),
                                 "Alerts Alertmanager left out of notifications (truncatedAlerts, webhook max_alerts).",
                                 registry=r)
        self.failures = Counter(M["action_failures"].removesuffix("_total"),
                                "Failed action attempts (retried or given up).", ["adapter"], registry=r)
        self.given_up = Counter(M["actions_given_up"].removesuffix("_total"),
                                "Actions audited as failed and not retried (reason: permanent, retries_exhausted).",
                                ["adapter", "reason"], registry=r)
        self.dispatcher_errors = Counter(M["dispatcher_errors"].removesuffix("_total"),
                                         "Dispatcher iterations that raised (logged; the loop goes on).",
                                         ["adapter"], registry=r)
        self.oldest_pending = Gauge(M["oldest_pending_age"],
                                    "Seconds since the request that decided the oldest pending action (0: none).",
                                    registry=r)
        self.pending = Gauge(M["actions_pending"], "Actions decided but not yet applied.", registry=r)
        buckets = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
        self.latency = Histogram(M["decision_latency"], "Seconds from the request that decided to the action applied.",
                                 ["adapter"], buckets=buckets, registry=r)
        self.calls = Counter(M["adapter_calls"].removesuffix("_total"), "Adapter calls (one apply) by outcome (ok, error).",
                             ["adapter", "outcome"], registry=r)
        self.call_duration = Histogram(M["adapter_call_duration"], "Seconds one adapter call (apply) took.",
                                       ["adapter"], buckets=buckets, registry=r)
        self.request = Histogram(M["request_latency"], "Seconds spent handling a webhook notification.",
                                 buckets=buckets, registry=r)
        self.dry_run = Gauge(M["dry_run"], "1 when the service calls nothing (--dry-run), else 0.", registry=r)
        self.last_notification = Gauge(M["last_notification"],
                                       "Unix time of the last notification from each Alertmanager (its externalURL).",
                                       [C.ALERTMANAGER_LABEL], registry=r)
        self.scopes = Gauge(M["scopes"], "Scopes held, by their highest tripped level (0: none).", ["level"], registry=r)
        self.auth_failures = Counter(M["auth_failures"].removesuffix("_total"),
                                     "Requests refused 401: no token, or not one of the route's role.", ["role"],
                                     registry=r)
        self.auth_limited = Counter(M["auth_rate_limited"].removesuffix("_total"),
                                    "Requests refused 429: their client failed to authenticate too often.", ["role"],
                                    registry=r)
        for role in ("webhook", "override", "read"):  # at 0 from the start
            self.auth_failures.labels(role), self.auth_limited.labels(role)
        self.level_dropped = Gauge(M["level_series_dropped"],
                                   "Scopes held without a fusebox_fuse_level series (over the cap; the least severe).",
                                   registry=r)


class _LevelSeries:
    """``fusebox_fuse_level`` for at most ``cap`` scopes, the most severe first, updated one scope at a
    time (:meth:`set`): a change touches only the series of the scopes it changed (and, when the
    cap is reached, swaps one shown scope for a more severe hidden one). ``fusebox_fuse_scopes``
    counts every scope by level; ``fusebox_fuse_level_series_dropped`` those without a series."""

    def __init__(self, metrics: "_Metrics", cap: int, levels):
        self.m, self.cap = metrics, cap
        self.level: dict[str, int] = {}  # every scope -> its highest tripped level
        self.labels: dict[str, tuple] = {}  # every scope -> its gauge label values
        self.shown: dict[int, dict[str, None]] = {}  # level -> scopes with a series
        self.hidden: dict[int, dict[str, None]] = {}  # level -> scopes without one
        self.counts: dict[int, int] = {lvl: 0 for lvl in (0, *levels)}
        for lvl in self.counts:
            self.m.scopes.labels(str(lvl)).set(0)
        self.m.level_dropped.set(0)

    def set(self, key: str, labels: Optional[dict], level: int) -> None:
        """Scope ``key`` now has ``level`` (labels None: it is gone)."""
        old = self.level.pop(key, None)
        shown = False
        if old is not None:
            shown = key in self.shown.get(old, {})
            (self.shown if shown else self.hidden)[old].pop(key, None)
            self._count(old, -1)
        if labels is None:
            if shown:
                self.m.level.remove(*self.labels[key])
            self.labels.pop(key, None)
        else:
            self.labels[key] = tuple(labels.get(k, "") for k in C.SCOPE_LABELS)
            self.level[key] = level
            self._count(level, 1)
            if shown or self._n(self.shown) < self.cap:
                self.shown.setdefault(level, {})[key] = None
                self.m.level.labels(*self.labels[key]).set(level)
            else:
                self.hidden.setdefault(level, {})[key] = None
        self._balance()
        self.m.level_dropped.set(self._n(self.hidden))

    def _count(self, level: int, d: int) -> None:
        self.counts[level] = self.counts.get(level, 0) + d
        self.m.scopes.labels(str(level)).set(self.counts[level])

    @staticmethod
    def _n(by: dict) -> int:
        return sum(len(v) for v in by.values())

    def _balance(self) -> None:
        while True:
            top = max((lvl for lvl, ks in self.hidden.items() if ks), default=None)
            if top is None:
                return
            if self._n(self.shown) >= self.cap:
                low = min((lvl for lvl, ks in self.shown.items() if ks), default=None)
                if low is None or low >= top:
                    return
                out = next(iter(self.shown[low]))
                del self.shown[low][out]
                self.m.level.remove(*self.labels[out])
                self.hidden.setdefault(low, {})[out] = None
            key = next(iter(self.hidden[top]))
            del self.hidden[top][key]
            self.shown.setdefault(top, {})[key] = None
            self.m.level.labels(*self.labels[key]).set(top)


class FuseService:
    """Args:
        rules: actions and levels (:meth:`FuseRules.from_spec`).
        store: the SQLite store; its snapshot, if any, is restored.
        adapters: applied for every decision they want, in order.
        hold_s: hysteresis before a release, seconds.
        backoff_s, backoff_max_s: first retry delay and cap, seconds.
        tick_s: how often hold times and override expiries are checked.
        clock: Unix seconds.
        max_scopes: scopes the breaker keeps at most (:class:`Breaker`).
        max_level_series: scopes with a ``fusebox_fuse_level`` series, the most severe first.
        lease_s: how long a claimed outbox row is this replica's, seconds; another replica takes it
            over after that (it must exceed an adapter call's timeout).
        replica: this replica's name in the outbox's ``claimed_by`` (default host:pid:random).
    """

    def __init__(self, rules: FuseRules, store: Store, adapters: Sequence[Adapter], *, hold_s: float = 300.0,
                 backoff_s: float = 0.5, backoff_max_s: float = 30.0, tick_s: float = 1.0,
                 clock: Callable[[], float] = time.time, dry_run: bool = False, max_scopes: int = MAX_SCOPES,
                 lease_s: float = 30.0, replica: Optional[str] = None, max_level_series: int = MAX_LEVEL_SERIES):
        self.rules = rules
        self.store = store
        self.adapters = {a.name: a for a in adapters}
        for a in adapters:  # the spec's adapters keep their holds in the store (fuse/adapters.py)
            if hasattr(a, "attach"):
                a.attach(store)
        self.labels = _labels(adapters)
        self.max_scopes = max_scopes
        self.hold_s = hold_s
        self.backoff_s, self.backoff_max_s, self.tick_s = backoff_s, backoff_max_s, tick_s
        self.clock = clock
        self.dry_run = dry_run
        self.metrics = _Metrics()
        self.metrics.dry_run.set(1 if dry_run else 0)
        self.lease_s = lease_s
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._test_hang = float(os.environ.get(TEST_HANG_ENV) or 0)
        self.breaker = Breaker(rules, hold_s, max_scopes=max_scopes)
        self._version = store.version()
        self.breaker.restore(store.snapshot())  # rows newer than _version, if any, are read again later
        self._wrote = False
        self._series = _LevelSeries(self.metrics, max_level_series, sorted(rules.levels))
        last = store.audit_log(1, kinds=("truncated",))
        self._truncated: dict = {"notifications": 0, "alerts": 0, "last": _truncated_view(last[0]) if last else None}
        self._lock = threading.Lock()
        # refused episodes audited, oldest first; the newest ones of the audit read back at start, so a
        # restart does not audit them again
        self._episodes: collections.OrderedDict = collections.OrderedDict()
        for row in reversed(store.audit_log(EPISODES_READ_BACK, kinds=("ignored",))):
            d = row["detail"]
            if isinstance(d, dict) and "starts_at" in d:
                self._episodes[(d.get("fingerprint"), d["starts_at"], d.get("result"))] = None
        self._senders: set[str] = set()  # externalURLs with a last-notification series
        self._senders_lock = threading.Lock()
        self._wakes = {name: threading.Event() for name in self.adapters}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.metrics.oldest_pending.set_function(self._oldest_pending_age)
        self._sync_gauges()
        self.metrics.pending.set(self.store.pending_count())

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """One dispatcher thread per adapter and the ticker. Outbox rows of adapters not configured
        now stay pending (a warning names them) until a start with that adapter applies them."""
        try:
            orphans = {a: n for a, n in self.store.pending_by_adapter().items() if a not in self.adapters}
        except Exception:
            log.exception("outbox read failed")
            orphans = {}
        for a, n in sorted(orphans.items()):
            log.warning("%d pending action(s) for adapter %r, not configured in this run: kept, not applied", n, a)
        targets = [(lambda n=n: self._dispatch_loop(n), f"fuse-dispatch-{n}") for n in self.adapters]
        for target, name in [*targets, (self._tick_loop, "fuse-tick")]:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for w in self._wakes.values():
            w.set()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()

    # ------------------------------------------------------------------ inputs
    def handle(self, note: Notification, received: Optional[float] = None) -> dict:
        """Apply a parsed notification. Returns ``{"decisions": [...], "alerts": {result: n}}``.

        Raises:
            Unavailable: the state could not be persisted (nothing changed).
            Exception: anything else that failed (nothing changed either: the breaker is set back to
                the committed state and the store's transaction rolled back).
        """
        received = self.clock() if received is None else received
        # Every notification proves the feed alive (the heartbeat, or any other): recorded before the
        # decision, so a store that fails does not make the feed look silent.
        self._record_sender(note.external_url, received)
        cut = note.truncated_alerts
        with self._lock, self._all_or_nothing(), self._change():
            now = self.clock()
            decisions, outcomes = self.breaker.on_notification(note, now)
            refused = self._first_of_episode(
                [*((o.fingerprint, a.starts_at, o.result, o.reason) for a, o in zip(note.alerts, outcomes)
                   if o.result in _REFUSED),
                 *((r.fingerprint, r.starts_at, r.result, r.reason) for r in note.refused)])
            audit = [{"at": now, "kind": "ignored", "source": "alert", "reason": reason[:1000],
                      "detail": {"result": result, "fingerprint": fp[:64], "starts_at": starts}}
                     for fp, starts, result, reason in refused]
            if cut:
                audit.append(_truncated_row(note, now))
            changed = (bool(decisions) or bool(refused) or bool(cut) or self.breaker.dirty()
                       or any(o.result in _CHANGED for o in outcomes))
            ids = self._commit(decisions, received, changed, audit, {"truncated_alerts": cut} if cut else {})
            self._episodes.update((e[:3], None) for e in refused)  # committed: audited
            while len(self._episodes) > MAX_REFUSED_EPISODES:
                self._episodes.popitem(last=False)
            if cut:
                self.metrics.truncated.inc(cut)
                self._truncated = {"notifications": self._truncated["notifications"] + 1,
                                   "alerts": self._truncated["alerts"] + cut, "last": _truncated_view(audit[-1])}
        for e in refused:
            log.warning("%s", e[3])
        if cut:
            log.warning("%s", audit[-1]["reason"])
        counts: dict[str, int] = {}
        for name, result in [*((o.alertname, o.result) for o in outcomes), *((r.alertname, r.result) for r in note.refused)]:
            # the heartbeat is counted, never audited (it asks for no fuse, so nothing is committed)
            result = "heartbeat" if name == C.HEARTBEAT_ALERT else result
            counts[result] = counts.get(result, 0) + 1
            self.metrics.alerts.labels(result).inc()
        return {"decisions": ids, "alerts": counts}

    def _first_of_episode(self, refused: list[tuple]) -> list[tuple]:
        """The refusals ``(fingerprint, startsAt, result, reason)`` whose episode (the first three)
        this replica has not audited yet, each once."""
        out, seen = [], set()
        for e in refused:
            if e[:3] not in self._episodes and e[:3] not in seen:
                seen.add(e[:3])
                out.append(e)
        return out

    def _record_sender(self, external_url: str, received: float) -> None:
        """Set the last-notification gauge of the Alertmanager at ``external_url``; past
        MAX_ALERTMANAGERS distinct senders, under ``other`` (a token holder cannot grow /metrics
        without bound)."""
        with self._senders_lock:
            if external_url not in self._senders:
                if len(self._senders) >= MAX_ALERTMANAGERS:
                    external_url = "other"
                self._senders.add(external_url)
        self.metrics.last_notification.labels(external_url).set(received)

    def tick(self) -> list[dict]:
        """Release levels whose hold time passed and end expired overrides (whichever replica ticks
        first after they are due). Raises Unavailable."""
        with self._lock:
            try:
                self._refresh()
            except StoreError as e:
                raise Unavailable(str(e)) from e
            if not self._due(self.clock()):
                return []
        with self._lock, self._all_or_nothing(), self._change():
            now = self.clock()
            decisions = self.breaker.tick(now)
            return self._commit(decisions, now, bool(decisions) or self.breaker.dirty())

    def override(self, scope: dict, level: int, mode: str, reason: str, duration_s: float, *,
                 fleet: bool = False, new_scope: bool = False, by: Optional[str] = None) -> list[dict]:
        """Force a level of a scope (:meth:`Breaker.override`); audited, with ``by`` (the name of
        the token that asked, never its value) in the audit row's ``detail.token``.

        Raises OverrideError (bad input), ScopeNotFound (not exactly a known scope; both change
        nothing) or Unavailable."""
        with self._lock, self._all_or_nothing(), self._change():
            now = self.clock()
            decisions = self.breaker.override(scope, level, mode, reason, duration_s, now, fleet=fleet,
                                               new_scope=new_scope)
            audit = [{"at": now, "kind": "override", "scope_key": _key(scope), "level": level,
                      "action": self.rules.levels.get(level), "source": "override", "reason": reason,
                      "detail": {"mode": mode, "until": now + duration_s, "scope": scope, "fleet": fleet,
                                 "token": by}}]
            out = self._commit(decisions, now, True, audit)
        log.info("override %s level %d on %s by %s for %gs: %s", mode, level, _key(scope), by, duration_s, reason,
                 extra={"scope": _key(scope), "action": self.rules.levels.get(level), "fuse_level": level,
                        "state": mode, "source": "override"})
        return out

    # ------------------------------------------------------------------ queries
    def state(self, offset: int = 0, limit: Optional[int] = None, *, scope: Optional[dict] = None,
              min_level: int = 0) -> dict:
        """``levels``, ``scopes`` (:meth:`Breaker.view`), ``hold_s``, ``dry_run``, ``pending_actions``,
        and ``truncated``: ``{"notifications", "alerts"}`` truncated since start and ``last``, the
        newest ``truncated`` audit row (``{"at", "truncated_alerts", "alerts", "group_key"}``, kept
        across restarts) or None.

        A page (:meth:`Breaker.page`): the scopes whose labels include ``scope`` and whose highest
        tripped level is at least ``min_level``, in key order, ``limit`` of them (None: all) from
        ``offset``; ``levels`` is of the page's scopes; ``total`` counts the scopes matching,
        ``rows`` their (scope, level) rows, ``tripped`` maps every matching tripped scope to its
        level, ``next_offset`` is where the next page starts (None: the last page)."""
        with self._lock:
            try:
                self._refresh()
            except StoreError:  # shown as last known; the webhook answers 503 meanwhile
                log.warning("store unreachable: /state shows the last state this replica read")
            page = self.breaker.page(offset, limit, labels=scope, min_level=min_level)
            truncated = dict(self._truncated)
        end = offset + len(page["scopes"])
        return {"levels": page["levels"], "scopes": page["scopes"], "total": page["total"], "rows": page["rows"],
                "tripped": page["tripped"], "offset": offset, "limit": limit,
                "next_offset": end if end < page["total"] else None, "hold_s": self.hold_s,
                "dry_run": self.dry_run, "pending_actions": self.store.pending_count(), "truncated": truncated}

    # ------------------------------------------------------------------ machinery
    def _take_back(self, version: int, rows: Optional[list], snap: Optional[dict]) -> None:
        """Take back what another replica committed: ``rows`` (only what changed), else the whole
        ``snap``; the gauges of the scopes it changed follow."""
        if rows is None:
            self.breaker.restore(snap)
            self._series = _LevelSeries(self.metrics, self._series.cap, sorted(self.rules.levels))
            self.metrics.level.clear()
        else:
            self.breaker.apply(rows)
        self._version = version
        self._sync_gauges()

    def _refresh(self) -> None:
        """Take back what another replica changed since this one's version. Raises StoreError."""
        if self.store.version() != self._version:
            self._take_back(*self.store.changes_since(self._version))

    def _due(self, now: float) -> bool:
        """Whether a tick at ``now`` has something to release or end (the breaker's timer heap)."""
        due = self.breaker.next_due()
        return due is not None and due <= now

    @contextlib.contextmanager
    def _change(self):
        """The store's exclusive transaction around one change (under ``self._lock``): the breaker
        first takes back what another replica committed since; what :meth:`_commit` writes is
        committed on leaving. Raises Unavailable when the store fails (nothing kept)."""
        self._wrote = False
        try:
            with self.store.change(self._version) as head:
                if head.version != self._version:
                    self._take_back(head.version, head.rows, head.snapshot)
                self.breaker.begin()
                yield
        except StoreError as e:
            log.error("state not persisted, change dropped: %s", e)
            raise Unavailable(str(e)) from e
        if self._wrote:
            self._version += 1
        self.breaker.done()
        self._sync_gauges()

    @contextlib.contextmanager
    def _all_or_nothing(self):
        """Run one change (under the lock): when anything in it fails (the store, a value it cannot
        bind, a bug), the scopes it touched are set back as they were (:meth:`Breaker.rollback`),
        which is what the store holds (its transaction rolls back), and the error goes on to the
        caller. The next request then starts from a consistent state, in memory and on disk."""
        try:
            yield
        except BaseException:
            self.breaker.rollback()
            self._sync_gauges()
            raise

    def _commit(self, decisions: list[Decision], received: float, changed: bool, extra_audit=(),
                note_detail: Optional[dict] = None) -> list[dict]:
        """Persist the scopes the change touched, one outbox row per decision and adapter that wants
        it, and the audit rows (``extra_audit``, then one per decision, whose ``detail`` gets
        ``note_detail``)."""
        if not changed:
            return []
        out, rows, audit = [], [], list(extra_audit)
        for d in decisions:
            did = uuid.uuid4().hex
            payload = {"action": d.action, "level": d.level, "state": d.kind, "reason": d.reason,
                       "scope": d.scope, "decision_id": did}
            for a in self.adapters.values():
                if a.wants(payload):
                    rows.append((did, a.name, payload, received, d.key))
            audit.append({"at": d.at, "kind": d.kind, "decision_id": did, "scope_key": d.scope_key, "level": d.level,
                          "action": d.action, "source": d.source, "reason": d.reason,
                          "detail": {"alerts": list(d.alerts), "scope": d.scope, **(note_detail or {})}})
            out.append({**payload, "source": d.source})
        changes = self.breaker.changes()
        try:
            self.store.commit(None, rows, audit, changes=changes)
        except StoreError as e:  # the breaker is set back by _all_or_nothing
            log.error("state not persisted, change dropped: %s", e)
            raise Unavailable(str(e)) from e
        self._wrote = bool(changes)
        for d, o in zip(decisions, out):
            self.metrics.transitions.labels(d.action, d.kind, d.source).inc()
            log.info("%s %s level %d on %s (%s): %s", d.kind, d.action, d.level, d.scope_key, d.source, d.reason,
                     extra={"decision_id": o["decision_id"], "scope": d.scope_key, "action": d.action,
                            "fuse_level": d.level, "state": d.kind, "source": d.source})
        if decisions:
            self.metrics.pending.set(self.store.pending_count())
            for w in self._wakes.values():
                w.set()
        return out

    def _sync_gauges(self) -> None:
        """Set ``fusebox_fuse_level`` of the scopes whose level may have changed, and only those."""
        for key in self.breaker.changed_levels():
            sc = self.breaker.scopes.get(key)
            self._series.set(key, sc["labels"] if sc else None, self.breaker.level_of(key))

    def _oldest_pending_age(self) -> float:
        try:
            received = self.store.oldest_pending_received(self.adapters)
        except Exception:  # the store cannot be read: say so rather than 0
            log.exception("outbox read failed")
            return float("nan")
        return 0.0 if received is None else max(0.0, self.clock() - received)

    def _dispatch_loop(self, name: str) -> None:
        """Deliver the outbox rows of adapter ``name`` until :meth:`stop`; never raises."""
        adapter = self.adapters[name]
        wake = self._wakes[name]
        lanes: dict[str, _Lane] = {}
        unrecorded: dict[int, tuple[float, dict]] = {}
        while not self._stop.is_set():
            wake.clear()  # a commit during the pass sets it again, so the wait below returns at once
            try:
                wait = self._dispatch_once(adapter, lanes, unrecorded)
            except Exception:  # the store failing, a bug: count, log, go on after a pause
                self.metrics.dispatcher_errors.labels(self.labels[name]).inc()
                log.exception("dispatcher %s: iteration failed; retrying in %.2fs", name, self.backoff_s)
                wait = self.backoff_s
            if wait > 0:
                wake.wait(timeout=wait)

    def _dispatch_once(self, adapter: Adapter, lanes: dict[str, "_Lane"],
                       unrecorded: dict[int, tuple[float, dict]]) -> float:
        """One pass over the lanes (scopes) of ``adapter``: claim each lane's oldest pending row whose
        backoff has passed and that no other replica holds a lease on, and attempt those claimed.
        Returns seconds until the next pass (0: at once, a row left)."""
        heads: dict[str, dict] = {}
        for row in self.store.pending(adapter.name):
            heads.setdefault(_key(row["payload"].get("scope") or {}), row)
        for k in [k for k, lane in lanes.items() if k not in heads or heads[k]["seq"] != lane.seq]:
            del lanes[k]
        for seq in [seq for seq in unrecorded if seq not in {h["seq"] for h in heads.values()}]:
            del unrecorded[seq]
        wait, progressed = 1.0, False
        wall = time.time()
        ready: dict[str, dict] = {}
        for k, job in heads.items():
            lane = lanes.get(k)
            now = time.monotonic()
            if lane is not None and lane.due > now:
                wait = min(wait, lane.due - now)
            elif job["claimed_by"] not in (None, self.replica) and (job["lease_until"] or 0) > wall:
                wait = min(wait, job["lease_until"] - wall)  # another replica's: taken over when its lease ends
            else:
                ready[k] = job
        claimed = set(self.store.claim([j["seq"] for j in ready.values()], self.replica, wall, self.lease_s)) if ready else set()
        if claimed and self._test_hang:
            log.warning("%s set: sleeping %gs after claiming outbox rows %s (test only)", TEST_HANG_ENV,
                        self._test_hang, sorted(claimed))
            time.sleep(self._test_hang)
        for k, job in ready.items():
            if self._stop.is_set():
                break
            if job["seq"] not in claimed:  # another replica claimed it meanwhile
                continue
            if job["seq"] in unrecorded:  # applied, but recording it failed: record it, do not call again
                at, audit = unrecorded[job["seq"]]
                self.store.mark_applied(job["seq"], at, audit)
                del unrecorded[job["seq"]]
                progressed = True
            elif self._attempt(adapter, job, k, lanes, unrecorded):
                progressed = True
            else:
                wait = min(wait, max(0.0, lanes[k].due - time.monotonic()))
        self.metrics.pending.set(self.store.pending_count())
        return 0.0 if progressed else wait

    def _attempt(self, adapter: Adapter, job: dict, key: str, lanes: dict[str, "_Lane"],
                 unrecorded: dict[int, tuple[float, dict]]) -> bool:
        """Apply one outbox row. True when it left the outbox (applied, or given up and audited as
        ``failed``); False when it is to be retried (``lanes[key]`` holds when)."""
        name, p, attempt = adapter.name, job["payload"], job["attempts"] + 1
        label = self.labels[name]
        started = time.monotonic()
        try:
            adapter.apply(p)
        except Exception as e:  # ActionError, or a bug in an adapter (transient: retried)
            self.metrics.call_duration.labels(label).observe(time.monotonic() - started)
            self.metrics.calls.labels(label, "error").inc()
            self.metrics.failures.labels(label).inc()
            permanent = bool(getattr(e, "permanent", False))
            limit = getattr(adapter, "max_attempts", None)
            if permanent or (limit is not None and attempt >= limit):
                reason = "permanent" if permanent else "retries_exhausted"
                lanes.pop(key, None)
                now = self.clock()
                status = getattr(e, "status", None)
                # The answer's text and the URL stay in detail (the audit); the reason is shown to readers.
                self.store.mark_given_up(job["seq"], str(e), {
                    "at": now, "kind": "failed", "decision_id": job["decision_id"], "scope_key": key,
                    "level": p.get("level"), "action": p.get("action"), "source": label,
                    "reason": f"{p.get('state')} not applied by {label} after {attempt} attempt(s), "
                              f"{'permanent failure' if permanent else 'retries exhausted'}: "
                              f"{getattr(e, 'summary', None) or type(e).__name__}"[:1000],
                    "detail": {"attempts": attempt, "status": status, "class": reason, "adapter": name,
                               "error": str(e)[:1000]}})
                self.metrics.given_up.labels(label, reason).inc()
                log.error("action %s for %s given up after %d attempt(s) (%s): %s", name, job["decision_id"],
                          attempt, reason, e, extra=_fields(job, key, label, attempt))
                return True
            lane = lanes.get(key)
            delay = self.backoff_s if lane is None else min(lane.delay * 2, self.backoff_max_s)
            lanes[key] = _Lane(job["seq"], time.monotonic() + delay, delay)  # before the store, which may fail
            log.warning("action %s for %s failed (attempt %d), retrying in %.2fs: %s",
                        name, job["decision_id"], attempt, delay, e, extra=_fields(job, key, label, attempt))
            self.store.mark_failed(job["seq"], str(e), retry_at=time.time() + delay)
            return False
        took = time.monotonic() - started
        self.metrics.call_duration.labels(label).observe(took)
        self.metrics.calls.labels(label, "ok").inc()
        lanes.pop(key, None)
        now = self.clock()
        # In dry-run the adapter only logged it: the audit says it was not applied, never "applied".
        audit = {"at": now, "kind": "dry_run" if self.dry_run else "applied", "decision_id": job["decision_id"],
                 "scope_key": key, "level": p["level"], "action": p["action"], "source": label,
                 "reason": f"{p['state']} not applied (dry-run)" if self.dry_run else f"{p['state']} applied by {label}",
                 "detail": {"attempts": attempt, "adapter": name, "call_s": round(took, 6)}}
        try:
            self.store.mark_applied(job["seq"], now, audit)
        except Exception:
            unrecorded[job["seq"]] = (now, audit)  # recorded on the next pass, without calling again
            raise
        self.metrics.latency.labels(label).observe(max(0.0, now - job["received"]))
        log.info("%s %s level %s on %s: %s", p["state"], p["action"], p["level"], key, audit["reason"],
                 extra=_fields(job, key, label, attempt))
        return True

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception:  # pragma: no cover - retried next tick
                log.exception("tick failed")


class _Lane:
    """Backoff of one (adapter, scope) lane: its head row ``seq`` is not retried before ``due``
    (time.monotonic() seconds); ``delay`` is the last delay, doubled on the next failure."""

    __slots__ = ("seq", "due", "delay")

    def __init__(self, seq: int, due: float, delay: float):
        self.seq, self.due, self.delay = seq, due, delay


def _labels(adapters) -> dict[str, str]:
    """adapter name -> its label for metrics and the audit's source (``label`` attribute, else the
    name); labels shared by several adapters get ``#2``, ``#3``... in the order given."""
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for a in adapters:
        base = getattr(a, "label", None) or a.name
        seen[base] = seen.get(base, 0) + 1
        out[a.name] = base if seen[base] == 1 else f"{base}#{seen[base]}"
    return out


def _fields(job: dict, key: str, adapter: str, attempt: int) -> dict:
    """Structured log fields of an outbox row's attempt (``--log-format json``)."""
    p = job["payload"]
    return {"decision_id": job["decision_id"], "scope": key, "action": p.get("action"), "fuse_level": p.get("level"),
            "state": p.get("state"), "adapter": adapter, "attempt": attempt}


def _truncated_row(note: Notification, now: float) -> dict:
    """The audit row of a notification Alertmanager truncated (``truncatedAlerts`` > 0)."""
    cut, sent = note.truncated_alerts, len(note.alerts)
    return {"at": now, "kind": "truncated", "source": "alert",
            "reason": (f"Alertmanager left {cut} alert(s) out of this notification (webhook max_alerts) and sent "
                       f"{sent}: those sent were applied; those left out neither trip nor release until a "
                       "notification carries them"),
            "detail": {"truncated_alerts": cut, "alerts": sent, "group_key": note.group_key[:500],
                       "receiver": note.receiver[:200]}}


def _truncated_view(row: dict) -> dict:
    d = row["detail"]
    return {"at": row["at"], "truncated_alerts": d["truncated_alerts"], "alerts": d["alerts"],
            "group_key": d["group_key"]}


def _key(scope: dict) -> str:
    from .rules import scope_key, scope_of

    return scope_key(scope_of(scope))
