"""The shapes of the rows the fuse passes around, as TypedDicts so that mypy checks their keys.

At run time they are plain dicts (a TypedDict is only a type): what the store writes, the audit
export and ``GET /state`` serve stay exactly as before. Times are Unix seconds (floats), levels the
spec's fuse levels (ints).

* Outbox (:mod:`fusebox.fuse.store`, table ``outbox``): :class:`OutboxRow` (a pending row, as
  :meth:`Store.pending` reads it and the dispatcher works it), :class:`OutboxEntry` (any row, as
  :meth:`Store.outbox` lists it).
* Audit (table ``audit``): :class:`AuditRecord` (a row to write: ``at`` and ``kind`` always, the rest
  when known) and :class:`AuditRow` (a row read back, every column, ``seq`` included; the audit
  export writes these, :mod:`fusebox.fuse.audit`).
* State (:meth:`FuseService.state`): :class:`FuseState`, its :class:`ScopeView` (one per scope, from
  :meth:`Breaker.view_of`) and :class:`LevelView` (one per level, with :class:`AppliedView` of
  :class:`fusebox.fuse.dispatch.applied.AppliedLevels` when tripped); ``GET /state`` serves
  :class:`StateView` (:func:`fusebox.fuse.http.status.state_view`: the same with ISO-8601 twins).
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from .control import ControlCall

__all__ = ["OutboxRow", "OutboxEntry", "QueuedCall", "AuditRecord", "AuditRow", "Override", "NotApplied", "AppliedView",
           "LevelView", "ScopeView", "Page", "StoreView", "TruncatedLast", "TruncatedView", "FuseState", "OverrideView",
           "LevelStateView", "ScopeStateView", "TruncatedLastView", "TruncatedStateView", "StateView"]


# ----------------------------------------------------------------------------- outbox
class OutboxRow(TypedDict):
    """A pending outbox row (:meth:`Store.pending`); ``claim`` (owner, fencing token) is added by the
    dispatcher once it claimed the row."""

    seq: int
    decision_id: str
    adapter: str  # the adapter's outbox name, ``<kind>:<name>``, ``gateway``, ``vllm:<engine>``
    call: ControlCall  # the row's control call (its column ``payload`` holds ControlCall.to_json's JSON)
    received: float
    attempts: int
    claimed_by: str | None
    lease_until: float | None
    claim: NotRequired[tuple[str, int]]


# An outbox row to queue (:meth:`Store.commit`): ``(decision_id, adapter, call, received, idem_key)``;
# ``idem_key`` left out: the decision_id.
QueuedCall = tuple[str, str, ControlCall, float] | tuple[str, str, ControlCall, float, str]


class OutboxEntry(TypedDict):
    """Any outbox row, as :meth:`Store.outbox` lists it (its payload left out)."""

    seq: int
    decision_id: str
    adapter: str
    status: str  # pending | applied | failed
    attempts: int
    last_error: str | None
    claimed_by: str | None
    idem_key: str | None


# ----------------------------------------------------------------------------- audit
class AuditRecord(TypedDict, total=False):
    """An audit row to write (:meth:`Store.commit`, :meth:`Store.audit`, ``mark_applied``...); a
    column left out is written NULL (``detail``: ``{}``)."""

    at: float
    kind: str  # trip, release, override, ignored, applied, failed, dry_run, reconcile, truncated, pruned...
    decision_id: str | None
    scope_key: str | None
    level: int | None
    action: str | None
    source: str | None
    reason: str | None
    detail: dict[str, Any]


class AuditRow(AuditRecord):
    """An audit row read back (:meth:`Store.audit_log`, :meth:`Store.audit_rows`): its ``seq`` and
    every column of :class:`AuditRecord`, each present (NULL as None; ``detail`` the JSON object
    written)."""

    seq: int


# ----------------------------------------------------------------------------- state
class Override(TypedDict):
    """A manual override of one level (``POST /override``)."""

    mode: str  # trip | release
    until: float
    reason: str


class NotApplied(TypedDict):
    """Why an adapter (None: none wanted it) did not apply a tripped level."""

    adapter: str | None
    why: str


class AppliedView(TypedDict):
    """What the calls achieved for one tripped level (:meth:`AppliedLevels.view`)."""

    applied: bool
    applied_by: list[str]
    pending: list[str]
    not_applied: list[NotApplied]


class _Level(TypedDict):
    """What :class:`LevelView` and :class:`LevelStateView` share (all but ``override``)."""

    action: str
    tripped: bool
    tripped_at: float | None
    release_at: float | None
    alerts: list[str]  # ``<alertname>/<fingerprint>`` holding it
    applied: NotRequired[bool]
    applied_by: NotRequired[list[str]]
    pending: NotRequired[list[str]]
    not_applied: NotRequired[list[NotApplied]]


class LevelView(_Level):
    """One level of a scope (:meth:`Breaker.view_of`); a tripped one gains :class:`AppliedView`'s keys
    in :meth:`FuseService.state`."""

    override: Override | None


class ScopeView(TypedDict):
    """One scope (:meth:`Breaker.view_of`): its key, labels, highest tripped level and levels by
    level number (as a string, JSON's object keys)."""

    key: str
    labels: dict[str, str]
    level: int
    levels: dict[str, LevelView]


class Page(TypedDict):
    """A page of the breaker's scopes (:meth:`Breaker.page`)."""

    scopes: list[ScopeView]
    levels: dict[str, int]  # scope key -> highest tripped level, of the page's scopes tripped
    total: int  # scopes matching
    rows: int  # their (scope, level) rows
    tripped: dict[str, int]  # every matching tripped scope -> its level


class StoreView(TypedDict):
    """Whether this replica read the store now (:class:`fusebox.fuse.store.Health`)."""

    reachable: bool
    unreachable_since: float | None
    error: str | None


class TruncatedLast(TypedDict):
    """The newest ``truncated`` audit row, in short."""

    at: float
    truncated_alerts: int
    alerts: int
    group_key: str


class TruncatedView(TypedDict):
    """Notifications Alertmanager truncated since start, and the last one (kept across restarts)."""

    notifications: int
    alerts: int
    last: TruncatedLast | None


class _State(TypedDict):
    """What :class:`FuseState` and :class:`StateView` share (all but ``scopes`` and ``truncated``)."""

    levels: dict[str, int]
    total: int
    rows: int
    tripped: dict[str, int]
    tripped_total: int
    offset: int
    limit: int | None
    next_offset: int | None
    hold_s: float
    dry_run: bool
    pending_actions: int
    stale: bool
    store: StoreView


class FuseState(_State):
    """:meth:`FuseService.state` (see there for each key)."""

    scopes: list[ScopeView]
    truncated: TruncatedView


# ----------------------------------------------------------------------------- GET /state
class OverrideView(Override):
    """An override with ``until_iso``."""

    until_iso: str | None


class LevelStateView(_Level):
    """:class:`LevelView` with ISO-8601 twins and the seconds tripped."""

    override: OverrideView | None
    tripped_at_iso: str | None
    tripped_for_s: float | None
    release_at_iso: str | None


class ScopeStateView(TypedDict):
    """:class:`ScopeView` whose levels are :class:`LevelStateView`."""

    key: str
    labels: dict[str, str]
    level: int
    levels: dict[str, LevelStateView]


class TruncatedLastView(TruncatedLast):
    """:class:`TruncatedLast` with ``at_iso``."""

    at_iso: str | None


class TruncatedStateView(TypedDict):
    """:class:`TruncatedView` whose ``last`` has ``at_iso``."""

    notifications: int
    alerts: int
    last: TruncatedLastView | TruncatedLast | None


class StateView(_State):
    """``GET /state``: :class:`FuseState` with ``now``, ``now_iso`` and readable times."""

    scopes: list[ScopeStateView]
    truncated: TruncatedStateView
    now: float
    now_iso: str | None
