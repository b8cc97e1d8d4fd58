"""The fuse service core: breaker + store + dispatcher + metrics, without HTTP.

:class:`FuseService` serialises every input (notification, override, tick) under one lock,
commits the breaker's new state, the decisions' outbox rows and audit rows in one SQLite
transaction, and only then answers. A ticker releases levels whose hold time has passed. The
outbox's delivery (:class:`fusebox.fuse.dispatch.dispatcher.Dispatcher`) and the reconciler
(:class:`fusebox.fuse.dispatch.reconcile.Reconciler`) are parts of the service, in their own modules;
the series it sets are :class:`fusebox.fuse.metrics.Metrics`.

Scale: a change persists only the scopes it touched (:meth:`Breaker.changes`), sets the level
gauge of only those scopes, and looks at no other scope (alerts indexed by fingerprint, timers in a
heap), so it costs the same with 10,000 scopes held as with none. ``fusebox_fuse_level`` has one
series per scope for at most ``max_level_series`` scopes, the most severe first
(``fusebox_fuse_scopes{level}`` counts them all, ``fusebox_fuse_level_series_dropped`` those left out).

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
import uuid
from collections.abc import Callable, Sequence

from fusebox import conventions as C

from ..adapters.protocol import Adapter
from ..control import ControlCall
from ..dispatch.applied import RESTORE_ROWS, AppliedLevels
from ..dispatch.dispatcher import TEST_HANG_ENV, Backoff, Dispatcher
from ..dispatch.reconcile import Reconciler
from ..intake.breaker import MAX_SCOPES, Breaker, Decision, Outcome, OverrideError
from ..intake.payload import Notification
from ..logsafe import install
from ..metrics import LevelSeries, Metrics
from ..rows import AuditRecord, FuseState, TruncatedView
from ..rules import FuseRules, key_of
from ..store import Store, StoreError
from .refused import AuditBudget, truncated_row, truncated_view

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


class Unavailable(RuntimeError):
    """The change could not be persisted; nothing changed; the caller should retry (HTTP 503)."""


class FuseService(Dispatcher, Reconciler):
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
        self.metrics = Metrics()
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
        self._series = LevelSeries(self.metrics, max_level_series, sorted(rules.levels))
        self.applied = AppliedLevels()  # per tripped level: what the calls achieved (fuse/dispatch/applied.py)
        self._applied_version = -1  # the store version the records were last rebuilt at
        self._restore_applied()
        self.metrics.unapplied.set_function(self.applied.unapplied)
        self._store_errors: tuple[type[BaseException], ...] = (StoreError, *store._errors())
        self._pending_known = 0  # the pending actions' count last read
        self._oldest_known: float | None = None  # ``received`` of the oldest pending action last read
        # the reconciler's releases given up: (adapter, scope key, level) -> the release call
        self._unreleased: dict[tuple[str, str, int], ControlCall] = {}
        failed = store.audit_log(1, kinds=("failed",))
        self._failed_seen = failed[0]["seq"] if failed else 0  # audit rows older were before this start
        last = store.audit_log(1, kinds=("truncated",))
        self._truncated: TruncatedView = {"notifications": 0, "alerts": 0, "last": truncated_view(last[0]) if last else None}
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
        self._audit_budget = AuditBudget(audit_refused_per_minute, audit_refused_max_rows,
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
                refused = [e for e in self._first_of_episode(_refusals(note, outcomes)) if e[:3] not in fresh]
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
                trunc = truncated_row(note, now) if cut else None
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
            self._answer(j, ids[at:at + n], outcomes, refused, trunc)
            at += n

    def _answer(self, j: _Job, ids: list[dict], outcomes: list[Outcome], refused: list[tuple],
                trunc: AuditRecord | None) -> None:
        """Once committed: log ``j``'s refusals and truncation, count its alerts, set its result."""
        for e in refused:
            log.warning("%s", e[3])
        if trunc is not None:
            self.metrics.truncated.inc(j.note.truncated_alerts)
            self._truncated = {"notifications": self._truncated["notifications"] + 1,
                               "alerts": self._truncated["alerts"] + j.note.truncated_alerts,
                               "last": truncated_view(trunc)}
            log.warning("%s", trunc["reason"])
        counts: dict[str, int] = {}
        for name, result in [*((o.alertname, o.result) for o in outcomes),
                             *((r.alertname, r.result) for r in j.note.refused)]:
            # the heartbeat is counted, never audited (it asks for no fuse, so nothing is committed)
            result = "heartbeat" if name == C.HEARTBEAT_ALERT else result
            counts[result] = counts.get(result, 0) + 1
            self.metrics.alerts.labels(result).inc()
        j.result = {"decisions": ids, "alerts": counts}

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
            audit: list[AuditRecord] = [{"at": now, "kind": "override", "scope_key": key_of(scope), "level": level,
                                         "action": self.rules.levels.get(level), "source": "override", "reason": reason,
                                         "detail": {"mode": mode, "until": now + duration_s, "scope": scope,
                                                    "fleet": fleet, "token": by}}]
            out = self._commit([(d, now, None) for d in decisions], True, audit)
        log.info("override %s level %d on %s by %s for %gs: %s", mode, level, key_of(scope), by, duration_s, reason,
                 extra={"scope": key_of(scope), "action": self.rules.levels.get(level), "fuse_level": level,
                        "state": mode, "source": "override"})
        return out

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
        """Rebuild :attr:`applied` from the audit log and the pending outbox (fuse/dispatch/applied.py)."""
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
            self._series = LevelSeries(self.metrics, self._series.cap, sorted(self.rules.levels))
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
            call = ControlCall(action=d.action, level=d.level, state="trip" if d.kind == "trip" else "release",
                               scope=d.scope, reason=d.reason, decision_id=did)
            wanted = [a.name for a in self.adapters.values() if a.wants(call)]
            rows += [(did, name, call, received, d.key) for name in wanted]
            d_wanted.append([self.labels[n] for n in wanted])
            audit.append({"at": d.at, "kind": d.kind, "decision_id": did, "scope_key": d.scope_key, "level": d.level,
                          "action": d.action, "source": d.source, "reason": d.reason,
                          "detail": {"alerts": list(d.alerts), "scope": d.scope, **(note_detail or {})}})
            out.append({**call.to_json(), "source": d.source})
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

    def _tick_loop(self) -> None:
        self._every(self.tick_s, self.tick, "tick")

    def _every(self, period: float, step: Callable[[], object], what: str) -> None:
        """Run ``step`` every ``period`` seconds until :meth:`stop`; after a failed step, wait the
        longer of ``period`` and a backoff that grows while the store is unreachable."""
        backoff = Backoff(self.backoff_s, self.backoff_max_s)
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


class _Job:
    """One notification waiting to be applied (:meth:`FuseService.handle`)."""

    __slots__ = ("note", "received", "result", "error", "finished")

    def __init__(self, note: Notification, received: float):
        self.note, self.received = note, received
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.finished = False


def _refusals(note: Notification, outcomes: list[Outcome]) -> list[tuple]:
    """``(fingerprint, startsAt, result, reason)`` of every alert of ``note`` refused: by the breaker
    (``outcomes``, one per alert) or alone at the door (``note.refused``)."""
    return [*((o.fingerprint, a.starts_at, o.result, o.reason) for a, o in zip(note.alerts, outcomes, strict=False)
              if o.result in _REFUSED),
            *((r.fingerprint, r.starts_at, r.result, r.reason) for r in note.refused)]


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


