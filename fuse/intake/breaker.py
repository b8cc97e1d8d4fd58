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

import heapq
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from fusebox.conventions import SCOPE_LABELS

from ..rules import FuseRules, Refusal, scope_key, scope_of
from .payload import AlertEvent, Notification
from .scopes import MAX_SCOPES, LevelState, ScopeTable
from .webhook import NOT_STORABLE, storable

__all__ = ["Decision", "Outcome", "Breaker", "OverrideError", "ScopeNotFound", "DEFAULT_HOLD_S", "MAX_SCOPES"]

# How long a "resolved" is remembered to reject a stale "firing" of the same alert instance.
TOMBSTONE_S = 24 * 3600.0
# Bounds on what alerts can make the breaker keep: an authenticated sender must not be able to
# grow the state, the snapshot and the status page without end.
MAX_TOMBSTONES = 100_000
# Holders (firing alerts, by fingerprint) one level of one scope keeps at most: the scope's row is
# rewritten on every change, and 100,000 holders made it 8.2 MB. A level held this many times is
# tripped whatever one more holder says; the one more is refused (outcome ``holder_limit``).
MAX_HOLDERS = 1000
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


class Breaker(ScopeTable):
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
        self.hold_s = float(hold_s)
        self.max_scopes = max_scopes
        super().__init__(rules)

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
                :func:`~fusebox.fuse.intake.webhook.storable`), an empty scope without ``fleet`` or
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

    def _find_holder(self, fp: str) -> tuple[str, int, LevelState] | None:
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

    def _desired(self, st: LevelState, now: float) -> bool:
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
