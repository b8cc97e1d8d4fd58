"""The breaker as a pure state machine: tables of cases named as sentences.

Expected decisions are worked out by hand from the rules in issue 5 and the spec's levels
(fusebox.yaml: freeze_admissions 1, text_only_fallback 2, kv_cache_eviction 3).
"""

from __future__ import annotations

import pytest
from _fuse_support import SPEC, alert, payload

from fusebox.fuse import Breaker, FuseRules, OverrideError, ScopeNotFound, parse_payload, scope_key
from fusebox.spec import load_spec

RULES = FuseRules.from_spec(load_spec(SPEC))
T0 = 1_700_000_000.0
HOLD = 60.0
GPU = {"cluster": "a", "hw_id": "GPU-1"}
ENG = {"cluster": "a", "host_name": "h1", "engine": "e0"}


def note(*alerts, truncated=0):
    return parse_payload(payload(*alerts, truncated=truncated), T0 + 10_000)


def run(steps):
    """steps: (now, [alerts] | None for a tick) -> list of (kind, level, scope key)."""
    b = Breaker(RULES, HOLD)
    out = []
    for now, alerts in steps:
        ds = b.tick(now) if alerts is None else b.on_notification(note(*alerts), now)[0]
        out += [(d.kind, d.level, d.scope_key) for d in ds]
    return out


FIRING = alert("GPUMemoryUtilizationHigh", starts=T0, **GPU)
RESOLVED = alert("GPUMemoryUtilizationHigh", "resolved", starts=T0, **GPU)
GPU_KEY = '{cluster="a",hw_id="GPU-1"}'

CASES = {
    "a firing critical alert trips its level on its scope": (
        [(T0, [FIRING])], [("trip", 1, GPU_KEY)]),
    "the same notification three times trips once": (
        [(T0, [FIRING]), (T0 + 1, [FIRING]), (T0 + 2, [FIRING])], [("trip", 1, GPU_KEY)]),
    "a resolution releases only after the hold time": (
        [(T0, [FIRING]), (T0 + 10, [RESOLVED]), (T0 + 10 + HOLD - 1, None), (T0 + 10 + HOLD, None)],
        [("trip", 1, GPU_KEY), ("release", 1, GPU_KEY)]),
    "a stale firing after its resolution changes nothing": (
        [(T0, [FIRING]), (T0 + 10, [RESOLVED]), (T0 + 11, [FIRING]), (T0 + 10 + HOLD, None), (T0 + 200, [FIRING])],
        [("trip", 1, GPU_KEY), ("release", 1, GPU_KEY)]),
    "a firing that arrives after its own resolved never trips": (
        [(T0, [RESOLVED]), (T0 + 1, [FIRING])], []),
    "a warning tier trips nothing": (
        [(T0, [alert("GPUMemoryUtilizationHigh", severity="warning", **GPU)])], []),
    "the absent alert trips nothing": (
        [(T0, [alert("FuseboxSignalAbsent", severity="warning", **GPU)])], []),
    "an alert without fuse labels is resolved through the spec by alertname and severity": (
        [(T0, [alert("KVCacheGrowthRateHigh", fuse_labels=False, **ENG)])],
        [("trip", 3, '{cluster="a",host_name="h1",engine="e0"}')]),
    "an alert the spec does not know trips nothing": (
        [(T0, [alert("DiskSpace", cluster="a")])], []),
    "a level stays tripped while another alert still holds it": (
        [(T0, [FIRING, alert("GPUMemoryBandwidthSaturated", **GPU)]), (T0 + 5, [RESOLVED]), (T0 + 5 + HOLD * 2, None)],
        [("trip", 1, GPU_KEY)]),
    "levels of one scope trip and release independently": (
        [(T0, [alert("AlignmentLatencyP95High", **ENG), alert("KVCacheGrowthRateHigh", **ENG)]),
         (T0 + 1, [alert("KVCacheGrowthRateHigh", "resolved", **ENG)]), (T0 + 1 + HOLD, None)],
        [("trip", 2, '{cluster="a",host_name="h1",engine="e0"}'), ("trip", 3, '{cluster="a",host_name="h1",engine="e0"}'),
         ("release", 3, '{cluster="a",host_name="h1",engine="e0"}')]),
    "scopes are independent": (
        [(T0, [FIRING, alert("GPUMemoryUtilizationHigh", cluster="a", hw_id="GPU-2")])],
        [("trip", 1, GPU_KEY), ("trip", 1, '{cluster="a",hw_id="GPU-2"}')]),
    "a new firing within the hold time cancels the release and does not trip again": (
        [(T0, [FIRING]), (T0 + 10, [RESOLVED]), (T0 + 20, [alert("GPUMemoryUtilizationHigh", starts=T0 + 20, **GPU)]),
         (T0 + 10 + HOLD, None)],
        [("trip", 1, GPU_KEY)]),
    "a late resolved of an older instance does not remove the newer one": (
        [(T0, [alert("GPUMemoryUtilizationHigh", starts=T0 + 5, **GPU)]), (T0 + 6, [RESOLVED]), (T0 + HOLD * 3, None)],
        [("trip", 1, GPU_KEY)]),
}


@pytest.mark.parametrize("steps,expected", CASES.values(), ids=CASES.keys())
def test_breaker(steps, expected):
    assert run(steps) == expected


def test_truncated_alerts_never_cause_a_release():
    b = Breaker(RULES, HOLD)
    a1 = alert("GPUMemoryUtilizationHigh", **GPU)
    a2 = alert("GPUMemoryUtilizationHigh", cluster="a", hw_id="GPU-2")
    assert len(b.on_notification(note(a1, a2), T0)[0]) == 2
    # Alertmanager dropped a2 from the next notification (max_alerts): still tripped after any time.
    assert b.on_notification(note(a1, truncated=1), T0 + 1)[0] == []
    assert b.tick(T0 + HOLD * 10) == []
    assert b.levels() == {GPU_KEY: 1, '{cluster="a",hw_id="GPU-2"}': 1}


def test_flapping_signal_trips_at_most_once_per_hold_time():
    """Fires for 5 s, clears for 5 s, 60 times (10 min); hold 60 s: one trip, one release at the end."""
    b = Breaker(RULES, HOLD)
    trips = releases = 0
    for i in range(60):
        t = T0 + i * 10
        for ds in (b.on_notification(note(alert("GPUMemoryUtilizationHigh", starts=t, **GPU)), t)[0],
                   b.on_notification(note(alert("GPUMemoryUtilizationHigh", "resolved", starts=t, **GPU)), t + 5)[0],
                   b.tick(t + 9)):
            trips += sum(d.kind == "trip" for d in ds)
            releases += sum(d.kind == "release" for d in ds)
    assert (trips, releases) == (1, 0)
    assert [d.kind for d in b.tick(T0 + 595 + HOLD)] == ["release"]


def test_flapping_slower_than_the_hold_time_trips_once_per_cycle():
    """Period 150 s (fire 0-10 s, clear from 10 s), hold 60 s: 4 cycles -> 4 trips, each >= 60 s apart."""
    b = Breaker(RULES, HOLD)
    trip_times = []
    t = T0
    for i in range(4):
        t = T0 + i * 150
        for d in b.on_notification(note(alert("GPUMemoryUtilizationHigh", starts=t, **GPU)), t)[0]:
            trip_times.append(d.at)
        b.on_notification(note(alert("GPUMemoryUtilizationHigh", "resolved", starts=t, **GPU)), t + 10)
        for s in range(11, 150):
            b.tick(t + s)
    assert len(trip_times) == 4
    assert all(b2 - a2 >= HOLD for a2, b2 in zip(trip_times, trip_times[1:], strict=False))


def test_snapshot_restores_holders_and_rejects_a_retrip():
    b = Breaker(RULES, HOLD)
    b.on_notification(note(FIRING), T0)
    b2 = Breaker(RULES, HOLD)
    b2.restore(b.snapshot())
    assert b2.on_notification(note(FIRING), T0 + 1)[0] == []  # not tripped again
    b2.on_notification(note(RESOLVED), T0 + 2)
    assert [d.kind for d in b2.tick(T0 + 2 + HOLD)] == ["release"]


def test_override_trip_then_expiry_releases_when_no_alert_holds():
    b = Breaker(RULES, HOLD)
    ds = b.override(ENG, 2, "trip", "vision encoder canary", 30, T0)
    assert [(d.kind, d.level, d.source) for d in ds] == [("trip", 2, "override")]
    assert b.tick(T0 + 29) == []
    assert [(d.kind, d.source) for d in b.tick(T0 + 30)] == [("release", "override_expired")]


def test_override_release_holds_against_firing_alerts_until_it_expires():
    b = Breaker(RULES, HOLD)
    b.on_notification(note(FIRING), T0)
    assert [d.kind for d in b.override(GPU, 1, "release", "false positive, ticket 123", 100, T0 + 1)] == ["release"]
    assert b.on_notification(note(alert("GPUMemoryUtilizationHigh", starts=T0 + 5, **GPU)), T0 + 5)[0] == []
    assert [(d.kind, d.source) for d in b.tick(T0 + 101)] == [("trip", "override_expired")]


@pytest.mark.parametrize("level,mode,dur", [(7, "trip", 10), (1, "explode", 10), (1, "trip", 0)])
def test_override_rejects_bad_input_and_changes_nothing(level, mode, dur):
    b = Breaker(RULES, HOLD)
    before = b.snapshot()
    with pytest.raises(OverrideError):
        b.override(GPU, level, mode, "x", dur, T0)
    assert b.snapshot() == before


# Keys worked out by hand with Prometheus' label-value escaping (backslash, double quote, newline).
SCOPE_KEYS = {
    "a plain scope is a selector in SCOPE_LABELS order": (
        {"engine": "e0", "cluster": "a"}, '{cluster="a",engine="e0"}'),
    "a double quote in a value is escaped": (
        {"cluster": 'a",engine="b'}, r'{cluster="a\",engine=\"b"}'),
    "a backslash in a value is escaped": (
        {"cluster": "a\\"}, r'{cluster="a\\"}'),
    "a newline in a value is escaped": (
        {"cluster": "a\nb"}, r'{cluster="a\nb"}'),
}


@pytest.mark.parametrize("scope,key", SCOPE_KEYS.values(), ids=SCOPE_KEYS.keys())
def test_scope_key(scope, key):
    assert scope_key(scope) == key


def test_a_value_that_looks_like_two_labels_is_not_the_same_scope_as_those_labels():
    b = Breaker(RULES, HOLD)
    b.on_notification(note(alert("KVCacheGrowthRateHigh", cluster='a",engine="b'),
                           alert("KVCacheGrowthRateHigh", cluster="a", engine="b")), T0)
    assert b.levels() == {r'{cluster="a\",engine=\"b"}': 3, '{cluster="a",engine="b"}': 3}


def test_restore_rekeys_scopes_saved_before_keys_were_escaped():
    b = Breaker(RULES, HOLD)
    b.restore({"version": 1, "resolved": {}, "scopes": {'{cluster="a"b"}': {
        "labels": {"cluster": 'a"b'}, "levels": {"3": {"tripped": True, "holders": {}}}}}})
    assert b.levels() == {r'{cluster="a\"b"}': 3}


BAD_SCOPES = {
    "an unknown label is refused, not dropped": ({"gpu": "GPU-9999"}, False, "scope.gpu"),
    "an empty scope is refused when fleet is not said": ({}, False, "scope"),
    "an empty label value is refused, not dropped": ({"engine": ""}, False, "scope.engine"),
    "fleet with labels is refused": (GPU, True, "fleet"),
}


@pytest.mark.parametrize("scope,fleet,field", BAD_SCOPES.values(), ids=BAD_SCOPES.keys())
def test_override_refuses_a_scope_it_cannot_use_and_changes_nothing(scope, fleet, field):
    b = Breaker(RULES, HOLD)
    before = b.snapshot()
    with pytest.raises(OverrideError) as e:
        b.override(scope, 1, "trip", "x", 10, T0, fleet=fleet)
    assert e.value.field == field
    assert b.snapshot() == before


def test_override_of_the_whole_fleet_needs_fleet_said():
    b = Breaker(RULES, HOLD)
    assert [(d.kind, d.scope_key) for d in b.override({}, 1, "trip", "x", 10, T0, fleet=True)] == [("trip", "{}")]


ENG_KEY = '{cluster="a",host_name="h1",engine="e0"}'
KV = alert("KVCacheGrowthRateHigh", starts=T0, **ENG)

# (mode, scope, new_scope) -> the scopes the refusal lists; the KV alert tripped level 3 on ENG.
INEXACT = {
    "releasing part of a tripped scope is refused and names the tripped scope": (
        "release", {"engine": "e0"}, False, [(ENG_KEY, 3)]),
    "tripping part of a known scope is refused and names the known scope": (
        "trip", {"cluster": "a", "engine": "e0"}, False, [(ENG_KEY, 3)]),
    "releasing a scope never seen is refused and names nothing": (
        "release", {"cluster": "b"}, False, []),
    "releasing a scope never seen is refused even when said to be new, if it is part of a known scope": (
        "release", {"engine": "e0"}, True, [(ENG_KEY, 3)]),
}


@pytest.mark.parametrize("mode,scope,new,listed", INEXACT.values(), ids=INEXACT.keys())
def test_override_of_a_scope_that_is_not_exactly_a_known_one_is_refused(mode, scope, new, listed):
    b = Breaker(RULES, HOLD)
    b.on_notification(note(KV), T0)
    before = b.snapshot()
    with pytest.raises(ScopeNotFound) as e:
        b.override(scope, 3, mode, "x", 10, T0 + 1, new_scope=new)
    assert [(c["key"], c["level"]) for c in e.value.scopes] == listed
    assert e.value.field == "scope"
    assert b.snapshot() == before


EXACT = {
    "releasing the exact tripped scope releases it": ("release", ENG, False, [("release", 3, ENG_KEY)]),
    "tripping part of a known scope said to be new trips that broader scope": (
        "trip", {"engine": "e0"}, True, [("trip", 3, '{engine="e0"}')]),
    "tripping a scope nobody has seen trips it": (
        "trip", {"cluster": "b"}, False, [("trip", 3, '{cluster="b"}')]),
}


@pytest.mark.parametrize("mode,scope,new,expected", EXACT.values(), ids=EXACT.keys())
def test_override_of_an_exact_or_new_scope(mode, scope, new, expected):
    b = Breaker(RULES, HOLD)
    b.on_notification(note(KV), T0)
    ds = b.override(scope, 3, mode, "x", 10, T0 + 1, new_scope=new)
    assert [(d.kind, d.level, d.scope_key) for d in ds] == expected


def test_releasing_the_whole_fleet_is_refused_when_nothing_tripped_the_fleet_scope():
    """Scopes are independent: a fleet release would release nothing that alerts tripped."""
    b = Breaker(RULES, HOLD)
    b.on_notification(note(KV), T0)
    with pytest.raises(ScopeNotFound) as e:
        b.override({}, 3, "release", "x", 10, T0 + 1, fleet=True)
    assert [c["key"] for c in e.value.scopes] == [ENG_KEY]
    assert b.levels() == {ENG_KEY: 3}


def test_a_fleet_trip_then_a_fleet_release_releases_it():
    b = Breaker(RULES, HOLD)
    b.on_notification(note(KV), T0)
    assert [(d.kind, d.scope_key) for d in b.override({}, 1, "trip", "x", 100, T0 + 1, fleet=True)] == [("trip", "{}")]
    assert [(d.kind, d.scope_key) for d in b.override({}, 1, "release", "x", 100, T0 + 2, fleet=True)] == [("release", "{}")]


def test_a_changed_scope_is_persisted_as_dataclasses_asdict_writes_its_levels():
    """The rows :meth:`Breaker.changes` hands the store hold each level as ``dataclasses.asdict``
    of its state would (the store's format), copied: holders, hold deadline, override."""
    import dataclasses

    b = Breaker(RULES, HOLD)
    a1 = alert("GPUMemoryUtilizationHigh", starts=T0 - 5, **GPU)
    b.on_notification(note(a1), T0)
    b.override(GPU, 2, "trip", "canary", 30, T0)
    b.on_notification(note(alert("GPUMemoryUtilizationHigh", "resolved", starts=T0 - 5, **GPU)), T0 + 1)
    [(kind, key, row)] = [r for r in b.changes() if r[1] == GPU_KEY]
    levels = b.scopes[GPU_KEY]["levels"]
    assert row["levels"] == {str(lvl): dataclasses.asdict(st) for lvl, st in levels.items()}
    assert list(row["levels"]["1"]) == ["tripped", "holders", "release_at", "tripped_at", "override"]
    assert row["levels"]["1"]["release_at"] == T0 + 1 + HOLD  # the last holder left at T0 + 1
    assert row["levels"]["2"]["override"] == {"mode": "trip", "until": T0 + 30, "reason": "canary"}
    row["levels"]["2"]["override"]["reason"] = "changed"  # a copy: the breaker's own state is untouched
    assert levels[2].override["reason"] == "canary"
