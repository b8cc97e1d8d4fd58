"""The breaker's table of scopes: what each level of each scope holds, its indexes (holders by
fingerprint, timers in a heap, idle scopes in order), its views and its persistence (the rows a
change touched, their undo). :class:`fusebox.fuse.intake.breaker.Breaker` decides on it.

Not thread-safe: the service serialises calls.
"""

from __future__ import annotations

import copy
import heapq
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ..rows import LevelView, Page, ScopeView
from ..rules import FuseRules, scope_key

__all__ = ["ScopeTable", "LevelState", "SCOPE_ROW", "RESOLVED_ROW", "MAX_SCOPES"]

# Scopes kept at most (the breaker's ``max_scopes`` default; the timer heap is rebuilt past 4x it).
MAX_SCOPES = 10_000
# Kinds of the rows :meth:`ScopeTable.changes` and :meth:`ScopeTable.apply` exchange with the store.
SCOPE_ROW, RESOLVED_ROW = "s", "r"


@dataclass
class LevelState:
    """One level of one scope: tripped or not, its holders (fingerprint -> {"start", "alert"}), a
    pending release, when it tripped, an override in force."""

    tripped: bool = False
    holders: dict = field(default_factory=dict)  # fingerprint -> {"start": s, "alert": name}
    release_at: float | None = None
    tripped_at: float | None = None
    override: dict | None = None  # {"mode": "trip"|"release", "until": t, "reason": str}


def _level_row(st: LevelState) -> dict:
    """``dataclasses.asdict(st)`` written out (it is on every change's path, where asdict's generic
    recursion took about a seventh of a change's time under cProfile): the same keys in the same
    order, the holders' entries and the override copied (flat dicts of strings and numbers)."""
    return {"tripped": st.tripped, "holders": {fp: dict(h) for fp, h in st.holders.items()},
            "release_at": st.release_at, "tripped_at": st.tripped_at,
            "override": None if st.override is None else dict(st.override)}


class ScopeTable:
    """Per-scope, per-level state, its indexes and its persistence.

    Changes are tracked per scope: :meth:`begin` starts a change (what it touches is remembered so
    that :meth:`rollback` can put it back), :meth:`changes` gives the rows to persist (only the
    scopes and tombstones touched since the last :meth:`done`), :meth:`done` ends it.
    """

    def __init__(self, rules: FuseRules):
        self.rules = rules
        self.scopes: dict[str, dict] = {}  # key -> {"labels": {...}, "levels": {level: LevelState}}
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
        ``LevelState`` values; None: drop it), keeping the indexes (holders, timers, idle) right."""
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
        levels = {int(lvl): (st if isinstance(st, LevelState) else LevelState(**st)) for lvl, st in sc["levels"].items()}
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
                "levels": {lvl: LevelState(st.tripped, dict(st.holders), st.release_at, st.tripped_at,
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

    def _arm(self, key: str, lvl: int, st: LevelState) -> None:
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

    def _level(self, key: str, scope: dict, level: int) -> LevelState:
        sc = self.scopes.get(key)
        if sc is None:
            sc = self.scopes[key] = {"labels": dict(scope), "levels": {}}
            self._idle[key] = None
        return sc["levels"].setdefault(level, LevelState())

    def _scopes_containing(self, wanted: Iterable[tuple[str, str]]) -> Iterator[dict]:
        want = list(wanted)
        for key in sorted(self.scopes):
            labels = self.scopes[key]["labels"]
            if all(labels.get(k) == v for k, v in want):
                yield {"key": key, "labels": dict(labels), "level": self.level_of(key)}
