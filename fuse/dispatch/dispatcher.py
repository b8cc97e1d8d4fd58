"""The outbox's delivery: one dispatcher thread per adapter (:class:`Dispatcher`, a part of
:class:`fusebox.fuse.service.FuseService`).

Delivery: one dispatcher thread per adapter, so a slow or dead adapter (a vLLM engine) never delays
another (the gateway). Within an adapter, rows are ordered per scope (a *lane*: adapter + scope
key): only the oldest pending row of a lane is attempted, so a trip precedes its release, while a
lane that is failing (in backoff) does not hold up other scopes. Failures are classified by
:class:`fusebox.fuse.adapters.protocol.ActionError`: permanent ones (4xx but 408/425/429) are audited as
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

Replicas (several services on one PostgreSQL store, :class:`fusebox.fuse.store.PgStore`): every
change runs in the store's exclusive transaction (:meth:`Store.change`), which hands back the rows
another replica changed since, so the breaker decides on the newest state and a
notification delivered to two replicas changes it once. Hold timers and override expiries live in
that state: whichever replica ticks first after they are due releases, once. An outbox row is
*claimed* (:meth:`Store.claim`, a lease of ``lease_s``) before its adapter is called; a row whose
claimer died is taken over when its lease ends, so a call may be made twice (at-least-once, the
gateway is idempotent per ``decision_id``), a decision never.

A call never outlives its claim: each adapter bounds one attempt by its ``timeout_s`` in total
(:func:`fusebox.fuse.adapters.transport.call_deadline`), which the lease exceeds (``fusebox fuse serve``
checks it), and a result is recorded only under the claim it was made with (the store's fencing
token): one whose claim passed to another replica meanwhile is logged and counted in
``fusebox_fuse_stale_results_total``, never recorded. Leases and, by default, the service's clock
are the store's (:meth:`Store.clock`: PostgreSQL's server clock). :meth:`FuseService.stop` stops
taking work, lets the calls under way end and gives this replica's other claims up.

Test-only: the environment variable ``FUSEBOX_FUSE_TEST_HANG_AFTER_CLAIM_S`` makes the dispatcher
wait that many seconds (or until :meth:`FuseService.stop`) after claiming a row and before calling
its adapter, so that a test can kill or stop a replica in between. Never set it in a deployment.

What people see (the status page, ``/metrics``) names an adapter by its *label* (``gateway``,
``vllm:<engine>``), never by a URL; the audit's ``reason`` says what happened (``HTTP 400``)
without the answer's text, which stays in the audit row's ``detail`` (``error``, ``adapter``).
"""

from __future__ import annotations

import logging
import threading
import time

from ..adapters.protocol import Adapter, CredentialRefused
from ..logsafe import install
from ..rows import AuditRecord, OutboxRow
from ..rules import key_of
from .parts import ServiceParts

log = install(logging.getLogger("fusebox.fuse"))

__all__ = ["Dispatcher", "Backoff", "TEST_HANG_ENV"]

TEST_HANG_ENV = "FUSEBOX_FUSE_TEST_HANG_AFTER_CLAIM_S"


class Dispatcher(ServiceParts):
    """The dispatch loop of :class:`fusebox.fuse.service.FuseService` (which sets every attribute
    below in its ``__init__``): :meth:`_dispatch_loop` runs in one thread per adapter."""

    replica: str
    lease_s: float
    backoff_s: float
    backoff_max_s: float
    dry_run: bool
    _stop: threading.Event
    _test_hang: float
    _in_call: set[int]
    _in_call_lock: threading.Lock
    _pending_known: int
    _store_errors: tuple[type[BaseException], ...]

    def _dispatch_loop(self, name: str) -> None:
        """Deliver the outbox rows of adapter ``name`` until :meth:`stop`; never raises."""
        adapter = self.adapters[name]
        wake = self._wakes[name]
        lanes: dict[str, _Lane] = {}
        unrecorded: dict[int, tuple[float, AuditRecord]] = {}
        backoff = Backoff(self.backoff_s, self.backoff_max_s)
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
        heads = self._heads(adapter, lanes, unrecorded)
        ready, wait = self._ready(heads, lanes)
        if self._stop.is_set():
            return 0.0
        claimed = self.store.claim_fenced([j["seq"] for j in ready.values()], self.replica, self.lease_s) if ready else {}
        claimed_at = time.monotonic()
        if claimed and self._test_hang:
            log.warning("%s set: waiting %gs after claiming outbox rows %s (test only)", TEST_HANG_ENV,
                        self._test_hang, sorted(claimed))
            self._stop.wait(self._test_hang)
        progressed = False
        for k, job in ready.items():
            if self._stop.is_set():
                break
            if not self._hold_claim(adapter, job, claimed, claimed_at):
                continue
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

    def _heads(self, adapter: Adapter, lanes: dict[str, _Lane],
               unrecorded: dict[int, tuple[float, AuditRecord]]) -> dict[str, OutboxRow]:
        """The oldest pending row of each lane (scope key) of ``adapter``; the backoff of a lane whose
        head changed, and what is left unrecorded of a row no longer pending, are forgotten."""
        heads: dict[str, OutboxRow] = {}
        for row in self.store.pending(adapter.name):
            heads.setdefault(key_of(row["call"].scope), row)
        for k in [k for k, lane in lanes.items() if k not in heads or heads[k]["seq"] != lane.seq]:
            del lanes[k]
        for seq in [seq for seq in unrecorded if seq not in {h["seq"] for h in heads.values()}]:
            del unrecorded[seq]
        return heads

    def _ready(self, heads: dict[str, OutboxRow], lanes: dict[str, _Lane]) -> tuple[dict[str, OutboxRow], float]:
        """The heads to attempt now (backoff passed, no other replica's lease in force) and the
        seconds until the first of the others is due (at most 1)."""
        wait = 1.0
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
        return ready, wait

    def _hold_claim(self, adapter: Adapter, job: OutboxRow, claimed: dict[int, int], claimed_at: float) -> bool:
        """Whether this replica still holds ``job``'s claim for one more call (setting ``job["claim"]``):
        False when another replica claimed it meanwhile. The calls before this one may have taken so
        long that the batch's lease would end before this call's deadline: then it is renewed (a new
        token), or the row left if it was taken over."""
        if job["seq"] not in claimed:  # another replica claimed it meanwhile
            return False
        longest = getattr(adapter, "timeout_s", None) or 0.0
        if time.monotonic() - claimed_at + longest >= self.lease_s:
            renewed = self.store.claim_fenced([job["seq"]], self.replica, self.lease_s)
            if job["seq"] not in renewed:
                return False
            claimed[job["seq"]] = renewed[job["seq"]]
        job["claim"] = (self.replica, claimed[job["seq"]])
        return True

    def _attempt(self, adapter: Adapter, job: OutboxRow, key: str, lanes: dict[str, _Lane],
                 unrecorded: dict[int, tuple[float, AuditRecord]]) -> bool:
        """Apply one outbox row. True when it left the outbox (applied, or given up and audited as
        ``failed``); False when it is to be retried (``lanes[key]`` holds when)."""
        name, call, attempt = adapter.name, job["call"], job["attempts"] + 1
        label = self.labels[name]
        started = time.monotonic()
        with self._in_call_lock:
            self._in_call.add(job["seq"])
        try:
            adapter.apply(call)
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
                    "level": call.level, "action": call.action, "source": label,
                    "reason": f"{call.state} not applied by {label} after {attempt} attempt(s), "
                              f"{'permanent failure' if permanent else 'retries exhausted'}: "
                              f"{getattr(e, 'summary', None) or type(e).__name__}"[:1000],
                    "detail": {"attempts": attempt, "status": status, "class": reason, "adapter": name,
                               "error": str(e)[:1000]}}, job["claim"])
                if not self._recorded(name, job, recorded):
                    return True
                self.metrics.given_up.labels(label, reason).inc()
                if call.trip:
                    self.applied.outcome(key, call.level, job["decision_id"], label, False,
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
            if call.trip:  # not applied, and why, while retried (/state: not_applied)
                self.applied.retrying(key, call.level, job["decision_id"], label,
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
            "scope_key": key, "level": call.level, "action": call.action, "source": label,
            "reason": f"{call.state} not applied (dry-run)" if self.dry_run else f"{call.state} applied by {label}",
            "detail": {"attempts": attempt, "adapter": name, "call_s": round(took, 6)}}
        try:
            recorded = self.store.mark_applied(job["seq"], now, audit, job["claim"])
        except Exception:
            unrecorded[job["seq"]] = (now, audit)  # recorded on the next pass, without calling again
            raise
        if not self._recorded(name, job, recorded):
            return True
        self.metrics.latency.labels(label).observe(max(0.0, now - job["received"]))
        if call.trip:
            self.applied.outcome(key, call.level, job["decision_id"], label, not self.dry_run,
                                 "dry-run: nothing was called")
        log.info("%s %s level %s on %s: %s", call.state, call.action, call.level, key, audit["reason"],
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


class Backoff:
    """The pause of a loop after a failed pass: ``base`` seconds, doubling on every failure in a
    row up to ``cap``; :meth:`reset` after a pass that succeeded."""

    def __init__(self, base: float, cap: float):
        self.base, self.cap, self.delay = base, max(base, cap), 0.0

    def next(self) -> float:
        self.delay = self.base if not self.delay else min(self.delay * 2, self.cap)
        return self.delay

    def reset(self) -> None:
        self.delay = 0.0


class _Lane:
    """Backoff of one (adapter, scope) lane: its head row ``seq`` is not retried before ``due``
    (time.monotonic() seconds); ``delay`` is the last delay, doubled on the next failure."""

    __slots__ = ("seq", "due", "delay")

    def __init__(self, seq: int, due: float, delay: float):
        self.seq, self.due, self.delay = seq, due, delay


def _fields(job: OutboxRow, key: str, adapter: str, attempt: int) -> dict:
    """Structured log fields of an outbox row's attempt (``--log-format json``)."""
    call = job["call"]
    return {"decision_id": job["decision_id"], "scope": key, "action": call.action, "fuse_level": call.level,
            "state": call.state, "adapter": adapter, "attempt": attempt}
