"""The tiered breaker: a pure state machine, ``(alerts | override | time) -> decisions``.

No I/O and no clock of its own: every call takes ``now`` (Unix seconds). The service feeds
:meth:`Breaker.restore` at start and persists, after every change, only what it changed
(:meth:`Breaker.changes`: the scopes and resolved fingerprints it touched), so that a change costs
the same whether the breaker holds one scope or 10,000: alerts are indexed by fingerprint (a
resolved alert finds its holder without looking at every scope), hold times and override expiries
sit in a heap (a tick looks only at what is due), tombstones in order of when they were seen.

Rules:

* Per scope (the SCOPE_LABELS present in the alert) and per level (the spec's action levels,
  1 freeze admissions, 2 text-only fallback, 3 KV-cache eviction), a level is tripped while at
  least one firing alert holds it.
* An alert is identified by its fingerprint; an instance of it by its ``startsAt``. The same
  notification resent, an HA pair's duplicate, or a "firing" whose ``startsAt`` is not after a
  "resolved" already seen for that fingerprint (a stale firing) changes nothing.
* When the last holder of a tripped level resolves, the level is released only after
  ``hold_s`` seconds without any holder (hysteresis); a holder firing meanwhile cancels the
  release, so a signal flapping around its threshold trips at most once per hold time.
* Only an explicit "resolved" alert removes a holder; alerts missing from a notification
  (``truncatedAlerts`` > 0 or otherwise) never release anything.
* An override forces a level of a scope tripped or released until it expires; then the level
  follows its holders again (released at once when none holds it).
* Only alerts the spec generates trip, and an alert without scope labels trips nothing unless the
  spec allows fleet-wide alerts (:meth:`FuseRules.verdict`; outcome ``untrusted``/``no_scope``).
* At most ``max_scopes`` scopes are kept: a new one first drops an idle scope (nothing tripped,
  held, pending or overridden); when none is idle the alert is refused (outcome ``scope_limit``)
  and an override answers an error. At most ``MAX_TOMBSTONES`` resolved fingerprints are kept, and
  at most ``MAX_HOLDERS`` holders per level of a scope (one more is refused: ``holder_limit``).
"""

from __future__ import annotations

import copy
import heapq
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field

from fusebox.conventions import SCOPE_LABELS

from ..rows import LevelView, Page, ScopeView
from ..rules import FuseRules, Refusal, scope_key, scope_of
from .payload import NOT_STORABLE, AlertEvent, Notification, storable

__all__ = ["Decision", "Outcome", "Breaker", "OverrideError", "ScopeNotFound", "DEFAULT_HOLD_S"]

# How long a "resolved" is remembered to reject a stale "firing" of the same alert instance.
TOMBSTONE_S = 24 * 3600.0
# Bounds on what alerts can make the breaker keep: an authenticated sender must not be able to
# grow the state, the snapshot and the status page without end.
MAX_SCOPES = 10_000
MAX_TOMBSTONES = 100_000
# Holders (firing alerts, by fingerprint) one level of one scope keeps at most: the scope's row is
# rewritten on every change, and 100,000 holders made it 8.2 MB. A level held this many times is
# tripped whatever one more holder says; the one more is refused (outcome ``holder_limit``).
MAX_HOLDERS = 1000
# Kinds of the rows :meth:`Breaker.changes` and :meth:`Breaker.apply` exchange with the store.
SCOPE_ROW, RESOLVED_ROW = "s", "r"
# Seconds without a holder before a level is released (``fusebox fuse serve --hold``'s default).
DEFAULT_HOLD_S = 300.0


class OverrideError(ValueError):
    """An override names an unknown level or mode, or a non-positive duration.

    ``field``: the request field at fault (``level``, ``mode``, ``expires_in_s``, ``scope``...).
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class ScopeNotFound(OverrideError):
    """An override names no known scope exactly (HTTP 409). Scopes are independent: releasing
    ``{engine="e0"}`` does not release ``{cluster="a",host_name="h1",engine="e0"}``.

    ``scopes``: the known scopes that contain the given labels, ``[{"key", "labels", "level"}]``
    (``level``: highest tripped, 0 none), so the caller can repeat with the exact one.
    """

    def __init__(self, message: str, scopes: list[dict]):
        super().__init__(message, "scope")
        self.scopes = scopes


@dataclass(frozen=True)
class Decision:
    """A change of one level of one scope, to be told to the gateway.

    kind: "trip" | "release". source: "alert" | "hold_expired" | "override" | "override_expired".
    alerts: ``alertname/fingerprint`` of the alerts holding the level at the time.
    episode: when the trip this decision makes (a trip) or ends (a release) was made, Unix s; with
    kind, scope and level it names the change (the outbox's idempotency key, :attr:`key`).
    """

    kind: str
    scope: dict
    scope_key: str
    level: int
    action: str
    reason: str
    source: str
    at: float
    alerts: tuple = ()
    episode: float | None = None

    @property
    def key(self) -> str:
        """``kind|scope key|level|episode``: the same for the same change whoever decides it."""
        return f"{self.kind}|{self.scope_key}|{self.level}|{self.episode!r}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["alerts"] = list(self.alerts)
        return d


@dataclass(frozen=True)
class Outcome:
    """What one alert of a notification did: "tripped", "held", "duplicate", "stale", "no_fuse",
    "resolved" (a holder left), "release_pending" (the last one left; hold started),
    "not_held" (a resolved alert that held nothing); refused, with a ``reason``: "untrusted" (not an
    alert and action the spec generates), "no_scope" (no scope label, fleet-wide alerts not
    allowed), "scope_limit" (no room for another scope), "holder_limit" (the level already has
    :data:`MAX_HOLDERS` holders)."""

    fingerprint: str
    alertname: str
    result: str
    reason: str = ""


@dataclass
class _Level:
    tripped: bool = False
    holders: dict = field(default_factory=dict)  # fingerprint -> {"start": s, "alert": name}
    release_at: float | None = None
    tripped_at: float | None = None
    override: dict | None = None  # {"mode": "trip"|"release", "until": t, "reason": str}


def _level_row(st: _Level) -> dict:
    """``dataclasses.asdict(st)`` written out (it is on every change's path, where asdict's generic
    recursion took about a seventh of a change's time under cProfile): the same keys in the same
    order, the holders' entries and the override copied (flat dicts of strings and numbers)."""
    return {"tripped": st.tripped, "holders": {fp: dict(h) for fp, h in st.holders.items()},
            "release_at": st.release_at, "tripped_at": st.tripped_at,
            "override": None if st.override is None else dict(st.override)}


class Breaker:
    """Per-scope, per-level fuse state. Not thread-safe: the service serialises calls.

    Changes are tracked per scope: :meth:`begin` starts a change (what it touches is remembered so
    that :meth:`rollback` can put it back), :meth:`changes` gives the rows to persist (only the
    scopes and tombstones touched since the last :meth:`done`), :meth:`done` ends it.
    """

    def __init__(self, rules: FuseRules, hold_s: float = DEFAULT_HOLD_S, *, max_scopes: int = MAX_SCOPES):
        if hold_s < 0:
            raise ValueError("hold_s must be >= 0")
        if max_scopes < 1:
            raise ValueError("max_scopes must be >= 1")
        self.rules = rules
        self.hold_s = float(hold_s)
        self.max_scopes = max_scopes
        self.scopes: dict[str, dict] = {}  # key -> {"labels": {...}, "levels": {level: _Level}}
        # fingerprint -> [latest resolved startsAt, seen at], oldest seen first
        self.resolved: OrderedDict[str, list] = OrderedDict()
        self._held: dict[str, dict[tuple[str, int], None]] = {}  # fingerprint -> (scope key, level) holding it
        self._timers: list[tuple[float, str, int]] = []  # heap of (due, key, level): release_at, override until
        self._idle: OrderedDict[str, None] = OrderedDict()  # scopes that may be idle, least recently changed first
        self._dirty: set[str] = set()  # scopes touched since done(): persisted by the next commit
        self._dirty_fps: set[str] = set()  # tombstones touched since done()
        self._undo: dict[str, dict | None] | None = None  # scope key -> as it was at begin()
        self._undo_fps: dict[str, list | None] = {}
        self._changed_levels: set[str] = set()  # scopes whose level may have changed (the service's gauges)

    # ------------------------------------------------------------------ inputs
    def on_notification(self, note: Notification, now: float) -> tuple[list[Decision], list[Outcome]]:
        """Apply every alert of a notification; returns the decisions and one outcome per alert."""
        decisions = self.tick(now)
        outcomes = []
        for a in note.alerts:
            d, o = self._on_alert(a, now)
            outcomes.append(o)
            if d:
                decisions.append(d)
        return decisions, outcomes

    def tick(self, now: float) -> list[Decision]:
        """Release levels whose hold time has passed, end expired overrides, forget old tombstones.
        Looks only at what is due (a heap of timers), not at every scope."""
        due: set[tuple[str, int]] = set()
        while self._timers and self._timers[0][0] <= now:
            _, key, lvl = heapq.heappop(self._timers)
            due.add((key, lvl))
        out = []
        for key, lvl in sorted(due):
            st = self.scopes.get(key, {}).get("levels", {}).get(lvl)
            if st is None:
                continue
            if st.override and st.override["until"] <= now:
                self._touch(key)
                st.override = None
                if not st.holders:
                    st.release_at = None
                d = self._settle(key, lvl, now, "override_expired", "override expired")
                if d:
                    out.append(d)
            elif st.release_at is not None and st.release_at <= now and not st.holders:
                self._touch(key)
                st.release_at = None
                d = self._settle(key, lvl, now, "hold_expired", f"no alert for the hold time ({self.hold_s:g}s)")
                if d:
                    out.append(d)
            self._arm(key, lvl, st)  # a timer not due yet (an override set again) stays armed
        while self.resolved:
            fp, (_, seen) = next(iter(self.resolved.items()))
            if now - seen <= TOMBSTONE_S:
                break
            self._touch_fp(fp)
            del self.resolved[fp]
        return out

    def next_due(self) -> float | None:
        """When the next hold time or override ends (Unix s), None when none runs."""
        while self._timers:
            at, key, lvl = self._timers[0]
            st = self.scopes.get(key, {}).get("levels", {}).get(lvl)
            if st is not None and ((st.override and st.override["until"] == at)
                                   or (st.release_at == at and not st.holders)):
                return at
            heapq.heappop(self._timers)  # outdated: the timer was cancelled or moved
        return None

    def override(self, scope: dict, level: int, mode: str, reason: str, duration_s: float, now: float, *,
                 fleet: bool = False, new_scope: bool = False) -> list[Decision]:
        """Force ``level`` of ``scope`` tripped (mode "trip") or released ("release") for ``duration_s``.

        ``scope`` holds only SCOPE_LABELS with non-empty values; the empty scope ``{}`` (every
        engine of the fleet) only with ``fleet=True``, so that it is never reached by accident.
        A release must name a known scope exactly. A trip may name a scope nobody has seen yet; one
        that is part of a known scope (``{engine="e0"}`` while ``{cluster="a",engine="e0"}`` is
        known) only with ``new_scope=True``, since the caller most likely meant the known one.

        Raises:
            ScopeNotFound: the scope is not exactly a known one (see above); nothing changed.
            OverrideError: unknown level, mode, a duration <= 0, an unknown scope label, an empty
                label value, a label or reason that is not storable text (a lone surrogate:
                :func:`~fusebox.fuse.intake.payload.storable`), an empty scope without ``fleet`` or
                ``fleet`` with labels.
        """
        if level not in self.rules.levels:
            raise OverrideError(f"unknown fuse level {level}; the spec has {sorted(self.rules.levels)}", "level")
        if mode not in ("trip", "release"):
            raise OverrideError("mode must be 'trip' or 'release'", "mode")
        if not duration_s or duration_s <= 0:
            raise OverrideError("expires_in_s must be > 0", "expires_in_s")
        if not isinstance(reason, str) or not storable(reason):
            raise OverrideError(f"reason is {NOT_STORABLE if isinstance(reason, str) else 'not a string'}", "reason")
        _check_scope(scope, fleet)
        scope = scope_of(scope)
        key = scope_key(scope)
        if key not in self.scopes:
            self._check_new_scope(scope, key, mode, new_scope or fleet)
            if not self._room_for(key):
                raise OverrideError(f"the fuse keeps at most {self.max_scopes} scopes and every one has something "
                                    "tripped, held or overridden; release one first", "scope")
        self._touch(key)
        st = self._level(key, scope, level)
        st.override = {"mode": mode, "until": now + duration_s, "reason": reason}
        st.release_at = None
        self._arm(key, level, st)
        d = self._settle(key, level, now, "override", f"override {mode}: {reason}")
        return [d] if d else []

    # ------------------------------------------------------------------ queries
    def level_of(self, key: str) -> int:
        """Highest tripped level of scope ``key`` (0: none tripped, or no such scope)."""
        sc = self.scopes.get(key)
        return max((lvl for lvl, st in sc["levels"].items() if st.tripped), default=0) if sc else 0

    def levels(self, now: float | None = None) -> dict[str, int]:
        """scope key -> highest tripped level (scopes with nothing tripped are left out)."""
        out = {}
        for key in self.scopes:
            lvl = self.level_of(key)
            if lvl:
                out[key] = lvl
        return out

    def view(self) -> list[ScopeView]:
        """Every known scope with its levels, holders, pending releases and overrides (JSON-able)."""
        return [self.view_of(key) for key in sorted(self.scopes)]

    def view_of(self, key: str) -> ScopeView:
        """One scope as :meth:`view` shows it."""
        sc = self.scopes[key]
        levels: dict[str, LevelView] = {}
        for lvl, st in sorted(sc["levels"].items()):
            levels[str(lvl)] = {
                "action": self.rules.levels.get(lvl, ""),
                "tripped": st.tripped,
                "tripped_at": st.tripped_at,
                "release_at": st.release_at,
                "override": copy.deepcopy(st.override),
                "alerts": [f"{h['alert']}/{fp}" for fp, h in sorted(st.holders.items())],
            }
        tripped = [int(k) for k, v in levels.items() if v["tripped"]]
        return {"key": key, "labels": dict(sc["labels"]), "level": max(tripped, default=0), "levels": levels}

    def page(self, offset: int = 0, limit: int | None = None, *, labels: dict | None = None,
             min_level: int = 0) -> Page:
        """The scopes whose labels include ``labels`` and whose highest tripped level is at least
        ``min_level``, in key order, from ``offset``, at most ``limit`` (None: all).

        Returns ``{"scopes": [view...], "levels": {key: level} of those tripped on the page,
        "total": scopes matching, "rows": their (scope, level) rows, "tripped": {key: level} of
        every matching tripped scope}``. One pass over the keys; only the page is viewed."""
        want = list((labels or {}).items())
        keys, rows, tripped = [], 0, {}
        for key in sorted(self.scopes):
            sc = self.scopes[key]
            if want and any(sc["labels"].get(k) != v for k, v in want):
                continue
            lvl = self.level_of(key)
            if lvl < min_level:
                continue
            keys.append(key)
            rows += len(sc["levels"])
            if lvl:
                tripped[key] = lvl
        chosen = keys[offset:] if limit is None else keys[offset:offset + limit]
        return {"scopes": [self.view_of(k) for k in chosen], "levels": {k: tripped[k] for k in chosen if k in tripped},
                "total": len(keys), "rows": rows, "tripped": tripped}

    # ------------------------------------------------------------------ persistence
    def snapshot(self) -> dict:
        """JSON-able state; :meth:`restore` takes it back."""
        return {
            "version": 1,
            "scopes": {key: self._row(key) for key in self.scopes},
            "resolved": {fp: list(v) for fp, v in self.resolved.items()},
        }

    def restore(self, snap: dict | None) -> None:
        """Take back a :meth:`snapshot` (the state as a whole). The breaker keeps its own copy:
        changing it later never changes ``snap``."""
        self.scopes, self.resolved = {}, OrderedDict()
        self._held, self._timers, self._idle = {}, [], OrderedDict()
        self._dirty, self._dirty_fps, self._undo, self._undo_fps = set(), set(), None, {}
        self._changed_levels = set()
        snap = copy.deepcopy(snap or {})
        # Keys are recomputed from the labels: snapshots written before values were escaped
        # (fusebox < escaping) carry ambiguous keys.
        for sc in snap.get("scopes", {}).values():
            self._put(scope_key(sc["labels"]), sc)
        for fp, v in sorted(snap.get("resolved", {}).items(), key=lambda kv: kv[1][1]):
            self.resolved[fp] = list(v)

    def apply(self, rows: Iterable[tuple[str, str, object | None]]) -> None:
        """Take back rows another writer (a replica) committed: ``(kind, key, value)``, kind
        :data:`SCOPE_ROW` (value: the scope, as :meth:`changes` gives it) or :data:`RESOLVED_ROW`
        (a tombstone ``[startsAt, seen]``); value None: gone. Only those scopes change; the
        breaker keeps the values (fresh from the store)."""
        for kind, key, value in rows:
            if kind == SCOPE_ROW:
                self._put(key, value)  # type: ignore[arg-type]
            elif kind == RESOLVED_ROW:
                self.resolved.pop(key, None)
                if value is not None:
                    self.resolved[key] = list(value)  # type: ignore[call-overload]

    def begin(self) -> None:
        """Start a change: what it touches is remembered, for :meth:`rollback`."""
        self._undo, self._undo_fps = {}, {}

    def dirty(self) -> bool:
        """Whether anything changed that is not persisted yet."""
        return bool(self._dirty or self._dirty_fps)

    def changes(self) -> list[tuple[str, str, object | None]]:
        """The rows to persist: ``(kind, key, value)`` of every scope and tombstone touched since
        the last :meth:`done` (value None: gone). JSON-able; no other scope is looked at."""
        out: list[tuple[str, str, object | None]] = [
            (SCOPE_ROW, k, self._row(k) if k in self.scopes else None) for k in sorted(self._dirty)]
        out += [(RESOLVED_ROW, fp, self.resolved.get(fp)) for fp in sorted(self._dirty_fps)]
        return out

    def done(self) -> None:
        """The change is persisted (or needs no persisting): forget what it touched."""
        self._dirty, self._dirty_fps, self._undo, self._undo_fps = set(), set(), None, {}

    def rollback(self) -> None:
        """Put back every scope and tombstone as it was at :meth:`begin` (a change that failed)."""
        for key, old in (self._undo or {}).items():
            self._put(key, old)
        for fp, tomb in self._undo_fps.items():
            self.resolved.pop(fp, None)
            if tomb is not None:
                self.resolved[fp] = tomb
        self.done()

    def changed_levels(self) -> set[str]:
        """The scopes whose highest level may have changed since the last call (and forget them)."""
        out, self._changed_levels = self._changed_levels, set()
        return out

    # ------------------------------------------------------------------ machinery
    def _row(self, key: str) -> dict:
        sc = self.scopes[key]
        return {"labels": sc["labels"], "levels": {str(lvl): _level_row(st) for lvl, st in sc["levels"].items()}}

    def _put(self, key: str, sc: dict | None) -> None:
        """Replace scope ``key`` by ``sc`` (a :meth:`_row`, or the stored form of one with
        ``_Level`` values; None: drop it), keeping the indexes (holders, timers, idle) right."""
        old = self.scopes.pop(key, None)
        if old is not None:
            for lvl, st in old["levels"].items():
                for fp in st.holders:
                    places = self._held.get(fp)
                    if places is not None:
                        places.pop((key, lvl), None)
                        if not places:
                            del self._held[fp]
        self._idle.pop(key, None)
        self._changed_levels.add(key)
        if sc is None:
            return
        levels = {int(lvl): (st if isinstance(st, _Level) else _Level(**st)) for lvl, st in sc["levels"].items()}
        self.scopes[key] = {"labels": dict(sc["labels"]), "levels": levels}
        self._idle[key] = None
        for lvl, st in levels.items():
            for fp in st.holders:
                self._held.setdefault(fp, {})[(key, lvl)] = None
            self._arm(key, lvl, st)

    def _copy(self, key: str) -> dict | None:
        sc = self.scopes.get(key)
        if sc is None:
            return None
        return {"labels": dict(sc["labels"]),
                "levels": {lvl: _Level(st.tripped, dict(st.holders), st.release_at, st.tripped_at,
                                       dict(st.override) if st.override else None)
                           for lvl, st in sc["levels"].items()}}

    def _touch(self, key: str) -> None:
        """Scope ``key`` is about to change: remember it as it is (once per change) and mark it."""
        if self._undo is not None and key not in self._undo:
            self._undo[key] = self._copy(key)
        self._dirty.add(key)
        self._changed_levels.add(key)
        self._idle.pop(key, None)
        self._idle[key] = None  # least recently changed first

    def _touch_fp(self, fp: str) -> None:
        if self._undo is not None and fp not in self._undo_fps:
            tomb = self.resolved.get(fp)
            self._undo_fps[fp] = list(tomb) if tomb is not None else None
        self._dirty_fps.add(fp)

    def _arm(self, key: str, lvl: int, st: _Level) -> None:
        """Put the level's timers (its override's end, its pending release) in the heap."""
        if st.override:
            heapq.heappush(self._timers, (st.override["until"], key, lvl))
        if st.release_at is not None:
            heapq.heappush(self._timers, (st.release_at, key, lvl))
        if len(self._timers) > 4 * MAX_SCOPES + 1024:  # outdated entries pile up: rebuild
            self._timers = [(t, k, lv) for k, sc in self.scopes.items() for lv, s in sc["levels"].items()
                            for t in ((s.override or {}).get("until"), s.release_at) if t is not None]
            heapq.heapify(self._timers)

    @staticmethod
    def _idle_scope(sc: dict) -> bool:
        return all(not st.tripped and not st.holders and st.release_at is None and st.override is None
                   for st in sc["levels"].values())

    def _room_for(self, key: str) -> bool:
        """Whether scope ``key`` is kept or may be added, dropping the least recently changed idle
        scope if needed (candidates found busy are left out of the candidates until they change)."""
        if key in self.scopes or len(self.scopes) < self.max_scopes:
            return True
        while self._idle:
            k = next(iter(self._idle))
            sc = self.scopes.get(k)
            if sc is not None and self._idle_scope(sc):
                self._touch(k)
                self._put(k, None)
                return True
            del self._idle[k]
        return False

    def _level(self, key: str, scope: dict, level: int) -> _Level:
        sc = self.scopes.get(key)
        if sc is None:
            sc = self.scopes[key] = {"labels": dict(scope), "levels": {}}
            self._idle[key] = None
        return sc["levels"].setdefault(level, _Level())

    def _scopes_containing(self, wanted: Iterable[tuple[str, str]]) -> Iterator[dict]:
        want = list(wanted)
        for key in sorted(self.scopes):
            labels = self.scopes[key]["labels"]
            if all(labels.get(k) == v for k, v in want):
                yield {"key": key, "labels": dict(labels), "level": self.level_of(key)}

    def _check_new_scope(self, scope: dict, key: str, mode: str, new_scope: bool) -> None:
        containing = list(self._scopes_containing(scope.items()))
        listed = ", ".join(f'{c["key"]} (level {c["level"]})' for c in containing[:5]) or "none"
        if len(containing) > 5:
            listed += f" and {len(containing) - 5} more (see 'scopes')"
        if mode == "release":
            raise ScopeNotFound(f"no scope is exactly {key}; a release must name a scope exactly (releasing part of "
                                f"one releases nothing). Scopes with these labels: {listed}", containing)
        if containing and not new_scope:
            raise ScopeNotFound(f"{key} is part of {listed}; repeat with {'that' if len(containing) == 1 else 'one'} exact scope, or say "
                                f'"new_scope": true to trip {key} as a scope of its own', containing)

    def _find_holder(self, fp: str) -> tuple[str, int, _Level] | None:
        """Where alert ``fp`` holds a level: one dictionary look-up, whatever the scopes held."""
        for key, lvl in self._held.get(fp, {}):
            st = self.scopes[key]["levels"][lvl]
            if fp in st.holders:
                return key, lvl, st
        return None

    def _on_alert(self, a: AlertEvent, now: float) -> tuple[Decision | None, Outcome]:
        name = a.labels.get("alertname", "")
        target = self.rules.verdict(a.labels)
        if target is None:
            return None, Outcome(a.fingerprint, name, "no_fuse")
        if isinstance(target, Refusal):
            return None, Outcome(a.fingerprint, name, target.result, target.reason)
        scope = scope_of(a.labels)
        key = scope_key(scope)
        if a.status == "firing":
            tomb = self.resolved.get(a.fingerprint)
            if tomb and a.starts_at <= tomb[0]:
                return None, Outcome(a.fingerprint, name, "stale")
            cur = self.scopes.get(key, {}).get("levels", {}).get(target.level)
            held = cur.holders.get(a.fingerprint) if cur is not None else None
            if held is not None and a.starts_at <= held["start"]:
                return None, Outcome(a.fingerprint, name, "duplicate")
            if held is None and cur is not None and len(cur.holders) >= MAX_HOLDERS:
                return None, Outcome(a.fingerprint, name, "holder_limit", (
                    f"alert {name!r} on {key}: level {target.level} already has {MAX_HOLDERS} firing alerts holding "
                    "it (the most one level keeps; it stays tripped while they fire): ignored"))
            if not self._room_for(key):
                return None, Outcome(a.fingerprint, name, "scope_limit", (
                    f"alert {name!r} on {key}: the fuse keeps at most {self.max_scopes} scopes and every one has "
                    "something tripped, held or overridden: ignored"))
            self._touch(key)
            st = self._level(key, scope, target.level)
            st.holders[a.fingerprint] = {"start": a.starts_at, "alert": name}
            self._held.setdefault(a.fingerprint, {})[(key, target.level)] = None
            st.release_at = None
            was = st.tripped
            d = self._settle(key, target.level, now, "alert", f"{name} firing")
            return d, Outcome(a.fingerprint, name, "tripped" if d else ("held" if was else "overridden"))
        # resolved
        tomb = self.resolved.get(a.fingerprint)
        if not tomb or a.starts_at > tomb[0]:
            self._touch_fp(a.fingerprint)
            self.resolved.pop(a.fingerprint, None)
            self.resolved[a.fingerprint] = [a.starts_at, now]  # the newest last: the oldest are forgotten first
            while len(self.resolved) > MAX_TOMBSTONES:
                self._touch_fp(next(iter(self.resolved)))
                self.resolved.popitem(last=False)
        found = self._find_holder(a.fingerprint)
        if not found or found[2].holders[a.fingerprint]["start"] > a.starts_at:
            return None, Outcome(a.fingerprint, name, "not_held")
        fkey, lvl, st = found
        self._touch(fkey)
        del st.holders[a.fingerprint]
        places = self._held[a.fingerprint]
        places.pop((fkey, lvl), None)
        if not places:
            del self._held[a.fingerprint]
        if st.holders:
            return None, Outcome(a.fingerprint, name, "resolved")
        if st.tripped and not (st.override and st.override["until"] > now):
            st.release_at = now + self.hold_s
            d = self._settle(fkey, lvl, now, "hold_expired", f"no alert for the hold time ({self.hold_s:g}s)") if self.hold_s == 0 else None
            if d:
                st.release_at = None
                return d, Outcome(a.fingerprint, name, "resolved")
            self._arm(fkey, lvl, st)
            return None, Outcome(a.fingerprint, name, "release_pending")
        return None, Outcome(a.fingerprint, name, "resolved")

    def _desired(self, st: _Level, now: float) -> bool:
        if st.override and st.override["until"] > now:
            return st.override["mode"] == "trip"
        return bool(st.holders) or (st.release_at is not None and now < st.release_at)

    def _settle(self, key: str, level: int, now: float, source: str, reason: str) -> Decision | None:
        sc = self.scopes[key]
        st = sc["levels"][level]
        want = self._desired(st, now)
        if want == st.tripped:
            return None
        self._touch(key)
        episode = now if want else st.tripped_at
        st.tripped = want
        st.tripped_at = now if want else None
        if not want:
            st.release_at = None
        return Decision(
            kind="trip" if want else "release", scope=dict(sc["labels"]), scope_key=key, level=level,
            action=self.rules.levels.get(level, ""), reason=reason, source=source, at=now,
            alerts=tuple(f"{h['alert']}/{fp}" for fp, h in sorted(st.holders.items())), episode=episode,
        )


def _check_scope(scope: dict, fleet: bool) -> None:
    known = ", ".join(SCOPE_LABELS)
    for k, v in scope.items():
        if not isinstance(k, str) or not storable(k):
            raise OverrideError(f"a scope label name is {NOT_STORABLE}; scope labels are {known}", "scope")
        if not isinstance(v, str):
            raise OverrideError(f"scope label {k!r}: values are strings", f"scope.{k}")
        if not storable(v):
            raise OverrideError(f"scope label {k!r}: the value is {NOT_STORABLE}", f"scope.{k}")
        if k not in SCOPE_LABELS:
            raise OverrideError(f"unknown scope label {k!r}; scope labels are {known}", f"scope.{k}")
        if not v:
            raise OverrideError(f"scope label {k!r} has an empty value; give its value or leave it out", f"scope.{k}")
    if fleet and scope:
        raise OverrideError("fleet: true covers every scope; give it with scope {}, or drop fleet", "fleet")
    if not scope and not fleet:
        raise OverrideError(f"empty scope: it would cover the whole fleet; name the scope's labels ({known}), "
                            "or say \"fleet\": true", "scope")


def replay(rules: FuseRules, hold_s: float, steps: Iterable[tuple[float, Notification | None]]) -> list[Decision]:
    """Feed ``(now, Notification | None)`` steps (None = a tick) and collect every decision.

    A helper for tests and the benchmark: the whole breaker behaviour as a pure function.
    """
    b = Breaker(rules, hold_s)
    out: list[Decision] = []
    for now, item in steps:
        if item is None:
            out.extend(b.tick(now))
        else:
            out.extend(b.on_notification(item, now)[0])
    return out
