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
An exception inside a dispatcher iteration (e.g. the store failing) is counted in
``fusebox_fuse_dispatcher_errors_total`` and the loop goes on.

The store unreachable (PostgreSQL down, a full disk): every loop that touches it (each dispatcher,
the ticker) waits ``backoff_s`` after a failed pass, doubling up to ``backoff_max_s``, until a pass
succeeds; the store logs one line when it is lost and one when it is back (:class:`Health`), with
no traceback (a failure that is not the store's is still logged with its traceback). Meanwhile
``/state`` answers from the last state this replica read, marked ``stale`` (and ``store``:
``{"reachable": false, "unreachable_since", "error"}``), and the oldest-pending gauge keeps counting
from the oldest pending action last read (never NaN), so ``FuseboxFuseActionsStuck`` can fire.

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

A call never outlives its claim: each adapter bounds one attempt by its ``timeout_s`` in total
(:func:`fusebox.fuse.actions.call_deadline`), which the lease exceeds (``fusebox fuse serve``
checks it), and a result is recorded only under the claim it was made with (the store's fencing
token): one whose claim passed to another replica meanwhile is logged and counted in
``fusebox_fuse_stale_results_total``, never recorded. Leases and, by default, the service's clock
are the store's (:meth:`Store.clock`: PostgreSQL's server clock). :meth:`FuseService.stop` stops
taking work, lets the calls under way end and gives this replica's other claims up.

Reconciler (every ``reconcile_s``, 0: never): for each adapter that can report the target's own
state (``observe``, :class:`fusebox.fuse.actions.Observable`), every level tripped (the breaker's
state, which ``/state`` and ``fusebox_fuse_level`` show) that the adapter wants and that has no
action pending for its scope is compared with what the target shows; where they differ (someone
put the worker back by hand, a call was given up, the gateway restarted) the trip is queued again
as a new outbox row (idempotency key ``reconcile|<decision id>``), delivered by the dispatcher like
any other (claimed, retried, audited ``applied``), with an audit row of kind ``reconcile`` and
``fusebox_fuse_reconciliations_total{adapter}`` counting it. A release this process gave up
(audited ``failed``) is compared and queued again the same way until the target shows it or the
level trips again. An adapter that cannot report
(``http``, ``--gateway-url``, vLLM's reset) is named once at start-up: not reconciled. Each
replica reconciles; two that queue the same trip make one more call, which the adapters'
holds make harmless.

Test-only: the environment variable ``FUSEBOX_FUSE_TEST_HANG_AFTER_CLAIM_S`` makes the dispatcher
wait that many seconds (or until :meth:`FuseService.stop`) after claiming a row and before calling
its adapter, so that a test can kill or stop a replica in between. Never set it in a deployment.

What people see (the status page, ``/metrics``) names an adapter by its *label* (``gateway``,
``vllm:<engine>``), never by a URL; the audit's ``reason`` says what happened (``HTTP 400``)
without the answer's text, which stays in the audit row's ``detail`` (``error``, ``adapter``).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fusebox import conventions as C

from .actions import ActionError, Adapter, CredentialRefused
from .applied import RESTORE_ROWS, AppliedLevels
from .breaker import MAX_SCOPES, Breaker, Decision, OverrideError
from .logsafe import install
from .payload import Notification
from .rows import AuditRecord, AuditRow, FuseState, OutboxRow, TruncatedLast, TruncatedView
from .rules import FuseRules
from .store import Store, StoreError

log = install(logging.getLogger("fusebox.fuse"))

__all__ = ["FuseService", "Unavailable", "OverrideError"]

_CHANGED = {"tripped", "held", "overridden", "resolved", "release_pending", "not_held"}
_REFUSED = {"untrusted", "no_scope", "scope_limit", "holder_limit"}  # audited as kind "ignored", with the reason
# Distinct Alertmanagers (externalURL) with a last-notification series of their own; an HA pair
# or a few clusters' worth, far below what would burden /metrics.
MAX_ALERTMANAGERS = 16
# Scopes with a fusebox_fuse_level series of their own, the most severe first (10,000
# scopes made /metrics 13.6 MB); fusebox_fuse_scopes{level} counts every scope.
MAX_LEVEL_SERIES = 1000
# Notifications applied in one store transaction at most (group commit, FuseService.handle).
MAX_BATCH = 64
# Episodes (fingerprint, startsAt, result) of refused alerts already audited, kept per replica, the
# oldest forgotten first: a refused alert is audited (and logged) once per episode, not on every
# re-notification (10 re-notifications of 4,000 refused alerts made 40,000 rows).
MAX_REFUSED_EPISODES = 100_000
# Refused episodes read back from the audit at start (the newest ones).
EPISODES_READ_BACK = 10_000
# The refused-alert audit's bound (fuse.audit's defaults, fusebox/spec/model.py: RawAudit).
AUDIT_REFUSED_PER_MINUTE = 100
AUDIT_REFUSED_MAX_ROWS = 100_000

# Tripped scopes named in one state answer's ``tripped`` map at most (the first in key order;
# ``tripped_total`` counts them all): the whole map of 10,000 scopes with long labels made an
# empty page of /state 13 MB.
TRIPPED_SHOWN = 100


TEST_HANG_ENV = "FUSEBOX_FUSE_TEST_HANG_AFTER_CLAIM_S"


class _AuditBudget:
    """The bound on audit rows of refused alerts (``fuse.audit``): at most ``per_minute`` rows per
    60 s window of this replica, and none once the audit holds ``max_rows`` rows of kind
    ``ignored`` (counted at start and at each window's start: the other replicas' rows too). What
    is left out is counted (``dropped_now`` after each :meth:`take`, for the metric) and summed up
    in one ``ignored`` row per window that dropped any (itself within ``max_rows``).

    Not thread-safe: the service calls it under its lock."""

    WINDOW_S = 60.0

    def __init__(self, per_minute: int, max_rows: int, count: Callable[[], int]):
        self.per_minute, self.max_rows, self._count = per_minute, max_rows, count
        self._start: float | None = None  # the window's start (Unix s); None: none yet
        self._used = 0  # rows audited in the window
        self._held: int | None = None  # rows of kind ignored in the audit (counted, then kept up to date)
        self._dropped = {"rate": 0, "full": 0}  # in the window
        self.dropped_now = {"rate": 0, "full": 0}

    def take(self, refused: list[tuple], now: float) -> tuple[list[tuple], AuditRecord | None]:
        """The refusals of ``refused`` to audit (the first that fit) and the summary row of the
        previous window when it dropped some (None otherwise). Raises StoreError (counting)."""
        summary = None
        self.dropped_now = {"rate": 0, "full": 0}
        if self._start is None or now >= self._start + self.WINDOW_S or now < self._start:
            self._held = self._count()  # first: a prune since may have made room for the summary
            if self._start is not None and any(self._dropped.values()):
                summary = self._summary(now)
            self._start, self._used, self._dropped = now, 0, {"rate": 0, "full": 0}
            if summary is not None:
                self._held += 1
        assert self._held is not None
        room = max(0, min(self.per_minute - self._used, self.max_rows - self._held))
        kept = refused[:room]
        for _ in refused[room:]:
            why = "full" if self._held + len(kept) >= self.max_rows else "rate"
            self._dropped[why] += 1
            self.dropped_now[why] += 1
        if len(refused) > room and not any(v - self.dropped_now[k] for k, v in self._dropped.items()):
            log.warning("refused alerts: %s; the rest are counted (%s), not audited or logged, until %s",
                        f"the audit holds {self.max_rows} rows of them (fuse.audit.refused_max_rows): prune it "
                        "(fusebox fuse audit prune)" if self.dropped_now["full"] else
                        f"{self.per_minute} audited this minute (fuse.audit.refused_per_minute)",
                        C.FUSE_METRICS["audit_refused_dropped"],
                        "a prune" if self.dropped_now["full"] else "the next minute")
        self._used += len(kept)
        self._held += len(kept)
        return kept, summary

    def _summary(self, now: float) -> AuditRecord | None:
        if self._held is not None and self._held >= self.max_rows:
            return None  # full: the metric alone counts
        assert self._start is not None
        n = sum(self._dropped.values())
        return {"at": now, "kind": "ignored", "source": "alert",
                "reason": (f"{n} refused alert(s) not audited from {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self._start))} "
                           f"for {self.WINDOW_S:g} s: {self._dropped['rate']} over fuse.audit.refused_per_minute "
                           f"({self.per_minute}), {self._dropped['full']} with the audit full "
                           f"(fuse.audit.refused_max_rows, {self.max_rows})"),
                "detail": {"result": "not_audited", "dropped": dict(self._dropped), "window_start": self._start,
                           "window_s": self.WINDOW_S}}


class Unavailable(RuntimeError):
    """The change could not be persisted; nothing changed; the caller should retry (HTTP 503)."""


# Why the server closes or refuses a connection itself (fusebox.fuse.server.GuardedH11Protocol.on_close).
CONNECTION_CLOSE_REASONS = ("header_timeout", "request_timeout", "evicted", "over_capacity", "head_too_large")


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
        self.credential_refusals = Counter(M["credential_refusals"].removesuffix("_total"),
                                           "Gateway calls answered 401/403: the control-plane credential refused "
                                           "(or none configured); retried, never applied.", ["adapter"], registry=r)
        self.stale = Counter(M["stale_results"].removesuffix("_total"),
                             "Call results not recorded: the claim had passed to another replica meanwhile.",
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
        self.reconciliations = Counter(M["reconciliations"].removesuffix("_total"),
                                       "Trips queued again because the target's own state differed (reconciler).",
                                       ["adapter"], registry=r)
        self.auth_failures = Counter(M["auth_failures"].removesuffix("_total"),
                                     "Requests refused 401: no token, or not one of the route's role.", ["role"],
                                     registry=r)
        self.auth_limited = Counter(M["auth_rate_limited"].removesuffix("_total"),
                                    "Requests refused 429: their client failed to authenticate too often.", ["role"],
                                    registry=r)
        for role in ("webhook", "override", "read"):  # at 0 from the start
            self.auth_failures.labels(role), self.auth_limited.labels(role)
        self.connections_closed = Counter(M["connections_closed"].removesuffix("_total"),
                                          "Connections the server closed or refused itself, by reason.", ["reason"],
                                          registry=r)
        for reason in CONNECTION_CLOSE_REASONS:
            self.connections_closed.labels(reason)
        self.level_dropped = Gauge(M["level_series_dropped"],
                                   "Scopes held without a fusebox_fuse_level series (over the cap; the least severe).",
                                   registry=r)
        self.token_file_valid = Gauge(M["token_file_valid"],
                                      "1 while a token file is in force as written, 0 while refused (malformed or "
                                      "unreadable: a people or read file's tokens dropped, the webhook's last good "
                                      "token kept).", ["file"], registry=r)
        self.token_file_refused = Counter(M["token_file_refused"].removesuffix("_total"),
                                          "Reads of a token file (on change, on SIGHUP) that refused it.", ["file"],
                                          registry=r)
        self.audit_dropped = Counter(M["audit_refused_dropped"].removesuffix("_total"),
                                     "Refused alerts not audited: over fuse.audit.refused_per_minute (rate) or the "
                                     "audit holding fuse.audit.refused_max_rows of them (full).", ["reason"],
                                     registry=r)
        for reason in ("rate", "full"):
            self.audit_dropped.labels(reason)
        self.unapplied = Gauge(M["unapplied_levels"],
                               "Tripped levels that no adapter applied (yet): refused, given up, pending or no adapter.",
                               registry=r)

    def token_file(self, file: str, valid: bool, refused: bool) -> None:
        """A token file's state (:meth:`fusebox.fuse.tokens.TokenFiles.observe`'s callback)."""
        self.token_file_valid.labels(file).set(1 if valid else 0)
        c = self.token_file_refused.labels(file)  # at 0 from the start
        if refused:
            c.inc()

    def zero(self, adapters: Sequence[str]) -> None:
        """Every series labelled by adapter at 0 from start, so the first failure or give-up is an
        increase Prometheus sees (``increase()`` of a series that first appears at 1 is 0)."""
        for a in adapters:
            self.failures.labels(a)
            self.credential_refusals.labels(a)
            self.dispatcher_errors.labels(a)
            self.stale.labels(a)
            for reason in ("permanent", "retries_exhausted"):
                self.given_up.labels(a, reason)
            for outcome in ("ok", "error"):
                self.calls.labels(a, outcome)


class _LevelSeries:
    """``fusebox_fuse_level`` for at most ``cap`` scopes, the most severe first, updated one scope at a
    time (:meth:`set`): a change touches only the series of the scopes it changed (and, when the
    cap is reached, swaps one shown scope for a more severe hidden one). ``fusebox_fuse_scopes``
    counts every scope by level; ``fusebox_fuse_level_series_dropped`` those without a series."""

    def __init__(self, metrics: _Metrics, cap: int, levels):
        self.m, self.cap = metrics, cap
        self.level: dict[str, int] = {}  # every scope -> its highest tripped level
        self.labels: dict[str, tuple] = {}  # every scope -> its gauge label values
        self.shown: dict[int, dict[str, None]] = {}  # level -> scopes with a series
        self.hidden: dict[int, dict[str, None]] = {}  # level -> scopes without one
        self.counts: dict[int, int] = {lvl: 0 for lvl in (0, *levels)}
        for lvl in self.counts:
            self.m.scopes.labels(str(lvl)).set(0)
        self.m.level_dropped.set(0)

    def set(self, key: str, labels: dict | None, level: int) -> None:
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
        clock: Unix seconds (default: the store's, :meth:`Store.clock`: the host's with SQLite, the
            database server's with PostgreSQL, so hold times and leases agree across replicas
            whatever each host's clock says).
        max_scopes: scopes the breaker keeps at most (:class:`Breaker`).
        max_level_series: scopes with a ``fusebox_fuse_level`` series, the most severe first.
        lease_s: how long a claimed outbox row is this replica's, seconds; another replica takes it
            over after that (it must exceed an adapter call's timeout).
        reconcile_s: seconds between two passes of the reconciler (:meth:`reconcile`); 0: none.
        replica: this replica's name in the outbox's ``claimed_by`` (default host:pid:random).
        audit_refused_per_minute, audit_refused_max_rows: the refused-alert audit's bound
            (``fuse.audit`` of the spec; :class:`_AuditBudget`).
    """

    def __init__(self, rules: FuseRules, store: Store, adapters: Sequence[Adapter], *, hold_s: float = 300.0,
                 backoff_s: float = 0.5, backoff_max_s: float = 30.0, tick_s: float = 1.0,
                 clock: Callable[[], float] | None = None, dry_run: bool = False, max_scopes: int = MAX_SCOPES,
                 lease_s: float = 30.0, replica: str | None = None, max_level_series: int = MAX_LEVEL_SERIES,
                 reconcile_s: float = 0.0, audit_refused_per_minute: int = AUDIT_REFUSED_PER_MINUTE,
                 audit_refused_max_rows: int = AUDIT_REFUSED_MAX_ROWS):
        self.rules = rules
        self.store = store
        self.adapters = {a.name: a for a in adapters}
        for a in adapters:  # the spec's adapters keep their holds in the store (fuse/adapters/)
            if hasattr(a, "attach"):
                a.attach(store)
        self.labels = _labels(adapters)
        self.longest_timeout_s = max((getattr(a, "timeout_s", 0) or 0 for a in adapters), default=0)
        self.max_scopes = max_scopes
        self.hold_s = hold_s
        self.backoff_s, self.backoff_max_s, self.tick_s = backoff_s, backoff_max_s, tick_s
        self.clock = store.clock if clock is None else clock
        self.dry_run = dry_run
        self.metrics = _Metrics()
        self.metrics.dry_run.set(1 if dry_run else 0)
        self.metrics.zero(list(self.labels.values()))
        self.lease_s = lease_s
        self.reconcile_s = reconcile_s
        self.replica = replica or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._test_hang = float(os.environ.get(TEST_HANG_ENV) or 0)
        self.breaker = Breaker(rules, hold_s, max_scopes=max_scopes)
        self._version = store.version()
        self.breaker.restore(store.snapshot())  # rows newer than _version, if any, are read again later
        self._wrote = False
        self._series = _LevelSeries(self.metrics, max_level_series, sorted(rules.levels))
        self.applied = AppliedLevels()  # per tripped level: what the calls achieved (fuse/applied.py)
        self._applied_version = -1  # the store version the records were last rebuilt at
        self._restore_applied()
        self.metrics.unapplied.set_function(self.applied.unapplied)
        self._store_errors: tuple[type[BaseException], ...] = (StoreError, *store._errors())
        self._pending_known = 0  # the pending actions' count last read
        self._oldest_known: float | None = None  # ``received`` of the oldest pending action last read
        # the reconciler's releases given up: (adapter, scope key, level) -> the release payload
        self._unreleased: dict[tuple, dict] = {}
        failed = store.audit_log(1, kinds=("failed",))
        self._failed_seen = failed[0]["seq"] if failed else 0  # audit rows older were before this start
        last = store.audit_log(1, kinds=("truncated",))
        self._truncated: TruncatedView = {"notifications": 0, "alerts": 0, "last": _truncated_view(last[0]) if last else None}
        self._lock = threading.Lock()
        self._queue: list[_Job] = []  # notifications waiting for the lock (group commit)
        self._queue_lock = threading.Lock()
        # refused episodes audited, oldest first; the newest ones of the audit read back at start, so a
        # restart does not audit them again
        self._episodes: collections.OrderedDict = collections.OrderedDict()
        for row in reversed(store.audit_log(EPISODES_READ_BACK, kinds=("ignored",))):
            d = row["detail"]
            if isinstance(d, dict) and "starts_at" in d:
                self._episodes[(d.get("fingerprint"), d["starts_at"], d.get("result"))] = None
        self._after: list[Callable[[], None]] = []  # run once a change is committed (_change)
        self._audit_budget = _AuditBudget(audit_refused_per_minute, audit_refused_max_rows,
                                          lambda: store.audit_count("ignored"))
        self._senders: set[str] = set()  # externalURLs with a last-notification series
        self._senders_lock = threading.Lock()
        self._wakes = {name: threading.Event() for name in self.adapters}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._in_call: set[int] = set()  # outbox rows whose adapter call is under way (not released at stop)
        self._in_call_lock = threading.Lock()
        self.metrics.oldest_pending.set_function(self._oldest_pending_age)
        self._sync_gauges()
        self._pending_known = self.store.pending_count()
        self.metrics.pending.set(self._pending_known)

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
        targets: list[tuple[Callable[..., None], str]] = [
            (lambda n=n: self._dispatch_loop(n), f"fuse-dispatch-{n}") for n in self.adapters]
        targets.append((self._tick_loop, "fuse-tick"))
        if self.reconcile_s > 0:
            for aname, adapter in self.adapters.items():
                if not hasattr(adapter, "observe"):
                    log.info("adapter %s cannot report the target's state: not reconciled", self.labels[aname])
                else:
                    self.metrics.reconciliations.labels(self.labels[aname])
            targets.append((self._reconcile_loop, "fuse-reconcile"))
        for target, name in targets:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop_taking_work(self) -> None:
        """No new claim and no new call from now on (the calls under way finish); :meth:`stop` after."""
        self._stop.set()
        for w in self._wakes.values():
            w.set()

    def stop(self) -> None:
        """Stop taking work (no new claim, no new call), wait for the calls under way (each ends by
        its adapter's deadline), then give up this replica's claims on the rows not applied, so
        another replica takes them at once rather than after the lease (logged; a store that fails
        leaves them to the lease)."""
        self.stop_taking_work()
        for t in self._threads:
            t.join(timeout=max(5.0, self.longest_timeout_s + 1))
        self._threads.clear()
        try:
            with self._in_call_lock:
                busy = sorted(self._in_call)
            n = self.store.release_claims(self.replica, keep=busy)
        except Exception as e:
            log.warning("claims of %s not released (another replica takes them when the lease ends): %s",
                        self.replica, e)
            return
        if n:
            log.info("released %d claimed action(s) of %s for another replica", n, self.replica)

    # ------------------------------------------------------------------ inputs
    def handle(self, note: Notification, received: float | None = None) -> dict:
        """Apply a parsed notification. Returns ``{"decisions": [...], "alerts": {result: n}}``.

        Group commit: notifications that arrive while another one is being committed wait for the
        lock, and the first of them to get it applies all that are waiting, in arrival order, in
        one store transaction (one fsync on SQLite, one round of commits on PostgreSQL); each caller
        gets its own answer after that transaction committed, so a 200 still means "persisted".
        When anything but the store fails in a batch of several, the batch is rolled back and each
        notification is applied alone, so one bad notification fails only itself.

        Raises:
            Unavailable: the state could not be persisted (nothing changed).
            Exception: anything else that failed (nothing changed either: the breaker is set back to
                the committed state and the store's transaction rolled back).
        """
        received = self.clock() if received is None else received
        # Every notification proves the feed alive (the heartbeat, or any other): recorded before the
        # decision, so a store that fails does not make the feed look silent.
        self._record_sender(note.external_url, received)
        job = _Job(note, received)
        with self._queue_lock:
            self._queue.append(job)
        with self._lock:
            if not job.finished:
                with self._queue_lock:
                    batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                self._run_batch(batch)
        if job.error is not None:
            # what the webhook answers 503: refused, never a trip. DEBUG: the store's ERROR line said
            # why, once per outage, and fusebox_fuse_notifications_total{outcome="http_503"} counts each
            if isinstance(job.error, Unavailable):
                log.debug("notification of %d alert(s) not applied (state not persisted, nothing decided; "
                         "Alertmanager retries): %s", len(note.alerts), job.error)
            raise job.error
        assert job.result is not None
        return job.result

    def _run_batch(self, batch: list[_Job]) -> None:
        """Apply ``batch`` in one change (under ``self._lock``); on a failure other than the store's,
        apply each of several alone. Sets every job's ``result`` or ``error``."""
        try:
            self._apply(batch)
        except Unavailable as e:
            for j in batch:
                j.error = e
        except Exception as e:
            if len(batch) == 1:
                batch[0].error = e
            else:
                for j in batch:
                    self._run_batch([j])
        finally:
            for j in batch:
                j.finished = True

    def _apply(self, batch: list[_Job]) -> None:
        """One change for every notification of ``batch``: the breaker decides each in turn, then
        one commit writes the scopes they touched, their outbox and audit rows."""
        pending: list[tuple[Decision, float, dict | None]] = []
        audit: list[AuditRecord] = []
        per_job = []
        with self._all_or_nothing(), self._change():
            now = self.clock()
            changed = False
            fresh: dict = {}  # episodes first refused in this batch, audited by this commit
            dropped = {"rate": 0, "full": 0}  # refusals over the audit's bound, counted once committed
            for j in batch:
                note, cut = j.note, j.note.truncated_alerts
                decisions, outcomes = self.breaker.on_notification(note, now)
                refused = [e for e in self._first_of_episode(
                    [*((o.fingerprint, a.starts_at, o.result, o.reason) for a, o in zip(note.alerts, outcomes, strict=False)
                       if o.result in _REFUSED),
                     *((r.fingerprint, r.starts_at, r.result, r.reason) for r in note.refused)]) if e[:3] not in fresh]
                refused, summary = self._audit_budget.take(refused, now)
                for why, n in self._audit_budget.dropped_now.items():
                    dropped[why] += n
                if summary is not None:
                    audit.append(summary)
                    changed = True
                fresh.update((e[:3], None) for e in refused)
                audit += [{"at": now, "kind": "ignored", "source": "alert", "reason": reason[:1000],
                           "detail": {"result": result, "fingerprint": fp[:64], "starts_at": starts}}
                          for fp, starts, result, reason in refused]
                trunc = _truncated_row(note, now) if cut else None
                if trunc is not None:
                    audit.append(trunc)
                changed = (changed or bool(decisions) or bool(refused) or bool(cut)
                           or any(o.result in _CHANGED for o in outcomes))
                detail = {"truncated_alerts": cut} if cut else None
                pending += [(d, j.received, detail) for d in decisions]
                per_job.append((len(decisions), outcomes, refused, trunc))
            ids = self._commit(pending, changed or self.breaker.dirty(), audit)
        self._episodes.update(fresh)  # committed: audited
        for why, n in dropped.items():
            self.metrics.audit_dropped.labels(why).inc(n)
        while len(self._episodes) > MAX_REFUSED_EPISODES:
            self._episodes.popitem(last=False)
        at = 0
        for j, (n, outcomes, refused, trunc) in zip(batch, per_job, strict=False):
            for e in refused:
                log.warning("%s", e[3])
            if trunc is not None:
                self.metrics.truncated.inc(j.note.truncated_alerts)
                self._truncated = {"notifications": self._truncated["notifications"] + 1,
                                   "alerts": self._truncated["alerts"] + j.note.truncated_alerts,
                                   "last": _truncated_view(trunc)}
                log.warning("%s", trunc["reason"])
            counts: dict[str, int] = {}
            for name, result in [*((o.alertname, o.result) for o in outcomes),
                                 *((r.alertname, r.result) for r in j.note.refused)]:
                # the heartbeat is counted, never audited (it asks for no fuse, so nothing is committed)
                result = "heartbeat" if name == C.HEARTBEAT_ALERT else result
                counts[result] = counts.get(result, 0) + 1
                self.metrics.alerts.labels(result).inc()
            j.result = {"decisions": ids[at:at + n], "alerts": counts}
            at += n

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
            return self._commit([(d, now, None) for d in decisions], bool(decisions) or self.breaker.dirty())

    def override(self, scope: dict, level: int, mode: str, reason: str, duration_s: float, *,
                 fleet: bool = False, new_scope: bool = False, by: str | None = None) -> list[dict]:
        """Force a level of a scope (:meth:`Breaker.override`); audited, with ``by`` (the name of
        the token that asked, never its value) in the audit row's ``detail.token``.

        Raises OverrideError (bad input), ScopeNotFound (not exactly a known scope; both change
        nothing) or Unavailable."""
        with self._lock, self._all_or_nothing(), self._change():
            now = self.clock()
            decisions = self.breaker.override(scope, level, mode, reason, duration_s, now, fleet=fleet,
                                               new_scope=new_scope)
            audit: list[AuditRecord] = [{"at": now, "kind": "override", "scope_key": _key(scope), "level": level,
                                         "action": self.rules.levels.get(level), "source": "override", "reason": reason,
                                         "detail": {"mode": mode, "until": now + duration_s, "scope": scope,
                                                    "fleet": fleet, "token": by}}]
            out = self._commit([(d, now, None) for d in decisions], True, audit)
        log.info("override %s level %d on %s by %s for %gs: %s", mode, level, _key(scope), by, duration_s, reason,
                 extra={"scope": _key(scope), "action": self.rules.levels.get(level), "fuse_level": level,
                        "state": mode, "source": "override"})
        return out

    def reconcile(self) -> int:
        """One pass of the reconciler (see the module's doc): returns how many trips were queued
        again. An adapter whose target cannot be read is left for the next pass (logged at debug:
        its own calls say it is down). Raises StoreError."""
        with self._lock:
            with contextlib.suppress(StoreError):
                self._refresh()
            tripped = [(dict(sc["labels"]), lvl) for sc in self.breaker.scopes.values()
                       for lvl, st in sc["levels"].items() if st.tripped]
        self._note_given_up_releases()
        queued = 0
        for name, adapter in self.adapters.items():
            observe = getattr(adapter, "observe", None)
            if observe is None:
                continue
            busy = {_key(r["payload"].get("scope") or {}) for r in self.store.pending(name)}
            wanted = []
            for labels, lvl in tripped:
                p = {"action": self.rules.levels.get(lvl), "level": lvl, "state": "trip", "scope": labels}
                if p["action"] and _key(labels) not in busy and adapter.wants(p):
                    wanted.append(p)
            held = {(_key(labels), lvl) for labels, lvl in tripped}
            for lane, p in list(self._unreleased.items()):
                if lane[0] == name and (lane[1:] in held or lane[1] in busy):
                    del self._unreleased[lane]  # tripped again, or a newer action queued: theirs now
                elif lane[0] == name:
                    wanted.append(p)
            if not wanted:
                continue
            try:
                seen = observe(wanted)
            except ActionError as e:
                log.debug("reconcile %s: the target's state cannot be read: %s", name, e)
                continue
            for p, ok in zip(wanted, seen, strict=False):
                if p["state"] == "release" and ok:
                    self._unreleased.pop((name, _key(p["scope"]), p["level"]), None)
                elif not ok:
                    self._requeue(name, p)
                    queued += 1
        return queued

    def _note_given_up_releases(self) -> None:
        """Releases given up (audited ``failed``) since the last pass, from the audit (newest 1000):
        kept in ``_unreleased`` until the target shows them or the level trips again. Only those
        after this process started (``_failed_seen``): an older one may have been superseded by
        hand."""
        from .override import UsageError, parse_scope

        rows = [r for r in self.store.audit_log(1000, kinds=("failed",)) if r["seq"] > self._failed_seen]
        for r in reversed(rows):
            self._failed_seen = max(self._failed_seen, r["seq"])
            name = (r.get("detail") or {}).get("adapter")
            if name not in self.adapters or not str(r.get("reason", "")).startswith("release ") or not r["scope_key"]:
                continue
            try:
                labels = parse_scope(r["scope_key"])
            except UsageError:
                continue
            self._unreleased[(name, r["scope_key"], r["level"])] = {
                "action": r["action"], "level": r["level"], "state": "release", "scope": labels}

    def _requeue(self, name: str, p: dict) -> None:
        """Queue the trip or release ``p`` again for adapter ``name`` (outbox + a ``reconcile`` audit row)."""
        label, now, did = self.labels[name], self.clock(), uuid.uuid4().hex
        key = _key(p["scope"])
        done = "tripped" if p["state"] == "trip" else "released"
        reason = (f"level {p['level']} ({p['action']}) {done} on {key} but not seen on {label}: "
                  "queued again")
        p = {**p, "reason": reason, "decision_id": did}
        self.store.commit(None, [(did, name, p, now, f"reconcile|{did}")], [
            {"at": now, "kind": "reconcile", "decision_id": did, "scope_key": key, "level": p["level"],
             "action": p["action"], "source": label, "reason": reason, "detail": {"adapter": name}}])
        self.metrics.reconciliations.labels(label).inc()
        if p["state"] == "trip":  # its outcome counts for the level's applied record (fuse/applied.py)
            self.applied.requeued(key, int(p["level"]), did, label)
        log.warning("%s", reason, extra={"decision_id": did, "scope": key, "action": p["action"],
                                         "fuse_level": p["level"], "state": p["state"], "adapter": label})
        self._wakes[name].set()

    def _reconcile_loop(self) -> None:
        self._every(self.reconcile_s, self.reconcile, "reconcile")

    # ------------------------------------------------------------------ queries
    def state(self, offset: int = 0, limit: int | None = None, *, scope: dict | None = None,
              min_level: int = 0) -> FuseState:
        """``levels``, ``scopes`` (:meth:`Breaker.view`; each tripped level with ``applied``,
        ``applied_by``, ``pending``, ``not_applied``: :meth:`AppliedLevels.view`), ``hold_s``, ``dry_run``, ``pending_actions``,
        ``stale`` (True: the store could not be read now, and all this is what this replica last read),
        ``store`` (``{"reachable": bool, "unreachable_since": Unix s or None, "error": str or None}``,
        :class:`fusebox.fuse.store.Health`), and ``truncated``: ``{"notifications", "alerts"}`` truncated since start and ``last``, the
        newest ``truncated`` audit row (``{"at", "truncated_alerts", "alerts", "group_key"}``, kept
        across restarts) or None.

        A page (:meth:`Breaker.page`): the scopes whose labels include ``scope`` and whose highest
        tripped level is at least ``min_level``, in key order, ``limit`` of them (None: all) from
        ``offset``; ``levels`` is of the page's scopes; ``total`` counts the scopes matching,
        ``rows`` their (scope, level) rows, ``tripped`` maps every matching tripped scope to its
        level, ``next_offset`` is where the next page starts (None: the last page). ``tripped``
        maps the first :data:`TRIPPED_SHOWN` of them (key order), ``tripped_total`` counts them all.

        The service's lock (which every change needs) is held only while the page is chosen and
        its scopes copied: a page of ``limit`` scopes costs a change that much wait, never the
        answer's encoding or sending (callers bound ``limit``: ``GET /state``)."""
        read = True
        with self._lock:
            try:
                self._refresh()
            except StoreError:  # shown as last known (marked stale); the webhook answers 503 meanwhile
                read = False
            page = self.breaker.page(offset, limit, labels=scope, min_level=min_level)
            tripped = [(sc["key"], int(lvl), st) for sc in page["scopes"] for lvl, st in sc["levels"].items() if st["tripped"]]
            if any(not self.applied.has(k, lvl) for k, lvl, _ in tripped) and self._applied_version != self._version:
                with contextlib.suppress(Exception):  # another replica's trips: rebuilt from the store once per version
                    self._restore_applied()
            for k, lvl, st in tripped:  # each tripped level: applied or not, by whom, why not
                st.update(self.applied.view(k, lvl))
            truncated = self._truncated.copy()
        try:
            self._pending_known = self.store.pending_count()
        except self._store_errors:
            read = False  # the count last read; the answer says it is stale
        end = offset + len(page["scopes"])
        health = self.store.health
        since = None if read else (health.down_since or self.clock())
        return {"levels": page["levels"], "scopes": page["scopes"], "total": page["total"], "rows": page["rows"],
                "tripped": dict(itertools.islice(page["tripped"].items(), TRIPPED_SHOWN)),
                "tripped_total": len(page["tripped"]), "offset": offset, "limit": limit,
                "next_offset": end if end < page["total"] else None, "hold_s": self.hold_s,
                "dry_run": self.dry_run, "pending_actions": self._pending_known, "truncated": truncated,
                "stale": not read,
                "store": {"reachable": read, "unreachable_since": since, "error": None if read else health.error or None}}

    # ------------------------------------------------------------------ machinery
    def _restore_applied(self) -> None:
        """Rebuild :attr:`applied` from the audit log and the pending outbox (fuse/applied.py)."""
        version = self._version
        self.applied.restore(self.store.audit_log(RESTORE_ROWS, kinds=("trip", "release", "reconcile", "applied", "failed",
                                                                   "dry_run")),
                             [(row["decision_id"], self.labels[a]) for a in self.adapters for row in self.store.pending(a)])
        self._applied_version = version

    def _take_back(self, version: int, rows: list | None, snap: dict | None) -> None:
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
        self._after = []  # run once the change is committed (_commit's log lines)
        try:
            with self.store.change(self._version) as head:
                if head.version != self._version:
                    self._take_back(head.version, head.rows, head.snapshot)
                self.breaker.begin()
                yield
        except StoreError as e:  # the store logged it (one line per outage)
            log.debug("state not persisted, change dropped: %s", e)
            raise Unavailable(str(e)) from e
        if self._wrote:
            self._version += 1
        self.breaker.done()
        self._sync_gauges()
        after, self._after = self._after, []
        for f in after:
            f()

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

    def _commit(self, decisions: list[tuple[Decision, float, dict | None]], changed: bool,
                extra_audit: Sequence[AuditRecord] = ()) -> list[dict]:
        """Persist the scopes the change touched, one outbox row per decision and adapter that wants
        it, and the audit rows (``extra_audit``, then one per decision). ``decisions``: ``(decision,
        received, note_detail)``, where ``received`` (Unix seconds) is when its input arrived (the
        outbox's age) and ``note_detail`` goes into the decision's audit ``detail``."""
        if not changed:
            return []
        out, rows, audit = [], [], list[AuditRecord](extra_audit)
        d_wanted: list[list[str]] = []
        for d, received, note_detail in decisions:
            did = uuid.uuid4().hex
            payload = {"action": d.action, "level": d.level, "state": d.kind, "reason": d.reason,
                       "scope": d.scope, "decision_id": did}
            wanted = [a.name for a in self.adapters.values() if a.wants(payload)]
            rows += [(did, name, payload, received, d.key) for name in wanted]
            d_wanted.append([self.labels[n] for n in wanted])
            audit.append({"at": d.at, "kind": d.kind, "decision_id": did, "scope_key": d.scope_key, "level": d.level,
                          "action": d.action, "source": d.source, "reason": d.reason,
                          "detail": {"alerts": list(d.alerts), "scope": d.scope, **(note_detail or {})}})
            out.append({**payload, "source": d.source})
        changes = self.breaker.changes()
        try:
            self.store.commit(None, rows, audit, changes=changes)
        except StoreError as e:  # the breaker is set back by _all_or_nothing; the store logged it
            log.debug("state not persisted, change dropped: %s", e)
            raise Unavailable(str(e)) from e
        self._wrote = bool(changes)
        # logged, counted and recorded once the change is committed (on leaving _change): a
        # notification answered 503 (the commit failed) logs its refusal, never a trip it did not store
        self._after.append(lambda: self._committed(decisions, out, d_wanted))
        return out

    def _committed(self, decisions: list[tuple[Decision, float, dict | None]], out: list[dict],
                   d_wanted: list[list[str]]) -> None:
        """What :meth:`_commit` wrote is committed: record, count and log each decision."""
        for (d, _, _), o, wanted in zip(decisions, out, d_wanted, strict=False):
            self.applied.decided(d.scope_key, d.level, d.kind, str(o["decision_id"]), wanted, d.action)
            if d.kind == "trip" and not wanted:
                log.warning("level %d (%s) tripped on %s, but no adapter applies it: not applied", d.level, d.action,
                            d.scope_key, extra={"scope": d.scope_key, "action": d.action, "fuse_level": d.level})
            self.metrics.transitions.labels(d.action, d.kind, d.source).inc()
            log.info("%s %s level %d on %s (%s): %s", d.kind, d.action, d.level, d.scope_key, d.source, d.reason,
                     extra={"decision_id": o["decision_id"], "scope": d.scope_key, "action": d.action,
                            "fuse_level": d.level, "state": d.kind, "source": d.source})
        if decisions:
            try:
                self._pending_known = self.store.pending_count()
            except self._store_errors as e:  # committed; the gauge catches up at the next read
                log.debug("pending actions not counted: %s", e)
            self.metrics.pending.set(self._pending_known)
            for w in self._wakes.values():
                w.set()

    def _sync_gauges(self) -> None:
        """Set ``fusebox_fuse_level`` of the scopes whose level may have changed, and only those."""
        for key in self.breaker.changed_levels():
            sc = self.breaker.scopes.get(key)
            self._series.set(key, sc["labels"] if sc else None, self.breaker.level_of(key))

    def _oldest_pending_age(self) -> float:
        """Seconds since the oldest pending action's request (0: none). The store unreachable: from
        the oldest one last read, so that a stuck action keeps ageing (never NaN: an alert on NaN
        never fires)."""
        try:
            self._oldest_known = self.store.oldest_pending_received(self.adapters)
        except self._store_errors:
            pass
        received = self._oldest_known
        return 0.0 if received is None else max(0.0, self.clock() - received)

    def _dispatch_loop(self, name: str) -> None:
        """Deliver the outbox rows of adapter ``name`` until :meth:`stop`; never raises."""
        adapter = self.adapters[name]
        wake = self._wakes[name]
        lanes: dict[str, _Lane] = {}
        unrecorded: dict[int, tuple[float, AuditRecord]] = {}
        backoff = _Backoff(self.backoff_s, self.backoff_max_s)
        while not self._stop.is_set():
            wake.clear()  # a commit during the pass sets it again, so the wait below returns at once
            try:
                wait = self._dispatch_once(adapter, lanes, unrecorded)
                backoff.reset()
            except Exception as e:  # the store failing, a bug: count, go on after a pause that grows
                self.metrics.dispatcher_errors.labels(self.labels[name]).inc()
                wait = backoff.next()
                if not isinstance(e, self._store_errors):  # the store's are logged once per outage
                    log.exception("dispatcher %s: iteration failed; retrying in %.2fs", name, wait)
            if wait > 0:
                wake.wait(timeout=wait)

    def _dispatch_once(self, adapter: Adapter, lanes: dict[str, _Lane],
                       unrecorded: dict[int, tuple[float, AuditRecord]]) -> float:
        """One pass over the lanes (scopes) of ``adapter``: claim each lane's oldest pending row whose
        backoff has passed and that no other replica holds a lease on, and attempt those claimed.
        Returns seconds until the next pass (0: at once, a row left)."""
        heads: dict[str, OutboxRow] = {}
        for row in self.store.pending(adapter.name):
            heads.setdefault(_key(row["payload"].get("scope") or {}), row)
        for k in [k for k, lane in lanes.items() if k not in heads or heads[k]["seq"] != lane.seq]:
            del lanes[k]
        for seq in [seq for seq in unrecorded if seq not in {h["seq"] for h in heads.values()}]:
            del unrecorded[seq]
        wait, progressed = 1.0, False
        wall = self.store.clock()  # the leases' clock (the database server's with PostgreSQL)
        ready: dict[str, OutboxRow] = {}
        for k, job in heads.items():
            lane = lanes.get(k)
            now = time.monotonic()
            if lane is not None and lane.due > now:
                wait = min(wait, lane.due - now)
            elif job["claimed_by"] not in (None, self.replica) and (job["lease_until"] or 0) > wall:
                wait = min(wait, (job["lease_until"] or 0) - wall)  # another replica's: taken over when its lease ends
            else:
                ready[k] = job
        if self._stop.is_set():
            return 0.0
        claimed = self.store.claim_fenced([j["seq"] for j in ready.values()], self.replica, self.lease_s) if ready else {}
        claimed_at = time.monotonic()
        longest = getattr(adapter, "timeout_s", None) or 0.0
        if claimed and self._test_hang:
            log.warning("%s set: waiting %gs after claiming outbox rows %s (test only)", TEST_HANG_ENV,
                        self._test_hang, sorted(claimed))
            self._stop.wait(self._test_hang)
        for k, job in ready.items():
            if self._stop.is_set():
                break
            if job["seq"] not in claimed:  # another replica claimed it meanwhile
                continue
            if time.monotonic() - claimed_at + longest >= self.lease_s:
                # the calls before this one took so long that the batch's lease would end before this
                # call's deadline: renew it (a new token), or leave the row if it was taken over
                renewed = self.store.claim_fenced([job["seq"]], self.replica, self.lease_s)
                if job["seq"] not in renewed:
                    continue
                claimed[job["seq"]] = renewed[job["seq"]]
            job["claim"] = (self.replica, claimed[job["seq"]])
            if job["seq"] in unrecorded:  # applied, but recording it failed: record it, do not call again
                at, audit = unrecorded[job["seq"]]
                self._recorded(adapter.name, job, self.store.mark_applied(job["seq"], at, audit, job["claim"]))
                del unrecorded[job["seq"]]
                progressed = True
            elif self._attempt(adapter, job, k, lanes, unrecorded):
                progressed = True
            else:
                wait = min(wait, max(0.0, lanes[k].due - time.monotonic()))
        self._pending_known = self.store.pending_count()
        self.metrics.pending.set(self._pending_known)
        return 0.0 if progressed else wait

    def _attempt(self, adapter: Adapter, job: OutboxRow, key: str, lanes: dict[str, _Lane],
                 unrecorded: dict[int, tuple[float, AuditRecord]]) -> bool:
        """Apply one outbox row. True when it left the outbox (applied, or given up and audited as
        ``failed``); False when it is to be retried (``lanes[key]`` holds when)."""
        name, p, attempt = adapter.name, job["payload"], job["attempts"] + 1
        label = self.labels[name]
        started = time.monotonic()
        with self._in_call_lock:
            self._in_call.add(job["seq"])
        try:
            adapter.apply(p)
        except Exception as e:  # ActionError, or a bug in an adapter (transient: retried)
            self._call_done(job["seq"])
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
                recorded = self.store.mark_given_up(job["seq"], str(e), {
                    "at": now, "kind": "failed", "decision_id": job["decision_id"], "scope_key": key,
                    "level": p.get("level"), "action": p.get("action"), "source": label,
                    "reason": f"{p.get('state')} not applied by {label} after {attempt} attempt(s), "
                              f"{'permanent failure' if permanent else 'retries exhausted'}: "
                              f"{getattr(e, 'summary', None) or type(e).__name__}"[:1000],
                    "detail": {"attempts": attempt, "status": status, "class": reason, "adapter": name,
                               "error": str(e)[:1000]}}, job["claim"])
                if not self._recorded(name, job, recorded):
                    return True
                self.metrics.given_up.labels(label, reason).inc()
                if p.get("state") == "trip":
                    self.applied.outcome(key, int(p.get("level") or 0), job["decision_id"], label, False,
                                         f"{'refused' if permanent else 'gave up'}: "
                                         f"{getattr(e, 'summary', None) or type(e).__name__}"[:300])
                log.error("action %s for %s given up after %d attempt(s) (%s): %s", name, job["decision_id"],
                          attempt, reason, e, extra=_fields(job, key, label, attempt))
                return True
            lane = lanes.get(key)
            delay = self.backoff_s if lane is None else min(lane.delay * 2, self.backoff_max_s)
            lanes[key] = _Lane(job["seq"], time.monotonic() + delay, delay)  # before the store, which may fail
            if isinstance(e, CredentialRefused):  # the adapter logged the refusal once
                self.metrics.credential_refusals.labels(label).inc()
            if p.get("state") == "trip":  # not applied, and why, while retried (/state: not_applied)
                self.applied.retrying(key, int(p.get("level") or 0), job["decision_id"], label,
                                      f"retrying: {getattr(e, 'summary', None) or type(e).__name__}"[:300])
            log.log(logging.DEBUG if getattr(e, "quiet", False) else logging.WARNING,
                    "action %s for %s failed (attempt %d), retrying in %.2fs: %s",
                    name, job["decision_id"], attempt, delay, e, extra=_fields(job, key, label, attempt))
            if not self._recorded(name, job, self.store.mark_failed(job["seq"], str(e), self.store.clock() + delay,
                                                                    job["claim"])):
                lanes.pop(key, None)
                return True
            return False
        self._call_done(job["seq"])
        took = time.monotonic() - started
        self.metrics.call_duration.labels(label).observe(took)
        self.metrics.calls.labels(label, "ok").inc()
        lanes.pop(key, None)
        now = self.clock()
        # In dry-run the adapter only logged it: the audit says it was not applied, never "applied".
        audit: AuditRecord = {
            "at": now, "kind": "dry_run" if self.dry_run else "applied", "decision_id": job["decision_id"],
            "scope_key": key, "level": p["level"], "action": p["action"], "source": label,
            "reason": f"{p['state']} not applied (dry-run)" if self.dry_run else f"{p['state']} applied by {label}",
            "detail": {"attempts": attempt, "adapter": name, "call_s": round(took, 6)}}
        try:
            recorded = self.store.mark_applied(job["seq"], now, audit, job["claim"])
        except Exception:
            unrecorded[job["seq"]] = (now, audit)  # recorded on the next pass, without calling again
            raise
        if not self._recorded(name, job, recorded):
            return True
        self.metrics.latency.labels(label).observe(max(0.0, now - job["received"]))
        if p["state"] == "trip":
            self.applied.outcome(key, int(p["level"]), job["decision_id"], label, not self.dry_run,
                                 "dry-run: nothing was called")
        log.info("%s %s level %s on %s: %s", p["state"], p["action"], p["level"], key, audit["reason"],
                 extra=_fields(job, key, label, attempt))
        return True

    def _call_done(self, seq: int) -> None:
        with self._in_call_lock:
            self._in_call.discard(seq)

    def _recorded(self, name: str, job: OutboxRow, recorded: bool) -> bool:
        """``recorded`` as the store's ``mark_*`` returned it; when False (the row is no longer
        pending, or another replica claimed it since: this call outlived its claim), log it and
        count it in ``fusebox_fuse_stale_results_total``: the other replica's result counts."""
        if not recorded:
            label = self.labels[name]
            self.metrics.stale.labels(label).inc()
            log.warning("result of %s for %s not recorded: the claim passed to another replica (or the row was "
                        "settled) meanwhile", name, job["decision_id"], extra=_fields(job, "", label, job["attempts"] + 1))
        return recorded

    def _tick_loop(self) -> None:
        self._every(self.tick_s, self.tick, "tick")

    def _every(self, period: float, step: Callable[[], object], what: str) -> None:
        """Run ``step`` every ``period`` seconds until :meth:`stop`; after a failed step, wait the
        longer of ``period`` and a backoff that grows while the store is unreachable."""
        backoff = _Backoff(self.backoff_s, self.backoff_max_s)
        wait = period
        while not self._stop.wait(wait):
            try:
                step()
                backoff.reset()
                wait = period
            except Exception as e:
                wait = max(period, backoff.next())
                if not isinstance(e, (Unavailable, *self._store_errors)):  # the store's: logged once per outage
                    log.exception("%s failed", what)


class _Backoff:
    """The pause of a loop after a failed pass: ``base`` seconds, doubling on every failure in a
    row up to ``cap``; :meth:`reset` after a pass that succeeded."""

    def __init__(self, base: float, cap: float):
        self.base, self.cap, self.delay = base, max(base, cap), 0.0

    def next(self) -> float:
        self.delay = self.base if not self.delay else min(self.delay * 2, self.cap)
        return self.delay

    def reset(self) -> None:
        self.delay = 0.0


class _Job:
    """One notification waiting to be applied (:meth:`FuseService.handle`)."""

    __slots__ = ("note", "received", "result", "error", "finished")

    def __init__(self, note: Notification, received: float):
        self.note, self.received = note, received
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.finished = False


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


def _fields(job: OutboxRow, key: str, adapter: str, attempt: int) -> dict:
    """Structured log fields of an outbox row's attempt (``--log-format json``)."""
    p = job["payload"]
    return {"decision_id": job["decision_id"], "scope": key, "action": p.get("action"), "fuse_level": p.get("level"),
            "state": p.get("state"), "adapter": adapter, "attempt": attempt}


def _truncated_row(note: Notification, now: float) -> AuditRecord:
    """The audit row of a notification Alertmanager truncated (``truncatedAlerts`` > 0)."""
    cut, sent = note.truncated_alerts, len(note.alerts)
    return {"at": now, "kind": "truncated", "source": "alert",
            "reason": (f"Alertmanager left {cut} alert(s) out of this notification (webhook max_alerts) and sent "
                       f"{sent}: those sent were applied; those left out neither trip nor release until a "
                       "notification carries them"),
            "detail": {"truncated_alerts": cut, "alerts": sent, "group_key": note.group_key[:500],
                       "receiver": note.receiver[:200]}}


def _truncated_view(row: AuditRow | AuditRecord) -> TruncatedLast:
    d = row["detail"]
    return {"at": row["at"], "truncated_alerts": d["truncated_alerts"], "alerts": d["alerts"],
            "group_key": d["group_key"]}


def _key(scope: dict) -> str:
    from .rules import scope_key, scope_of

    return scope_key(scope_of(scope))
