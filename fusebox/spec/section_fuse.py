"""The ``fuse:`` section, normalised: the human receiver, the actions and their levels, the
Alertmanager timings, ``fuse.self_monitoring`` and ``fuse.audit``; and the tiers' ``after_shedding``,
which needs an in-path gateway of ``inpath:``. (``fuse.adapters`` is :mod:`.adapters`'.)"""

from __future__ import annotations

from .checking import Checker
from .inpath import GATEWAY_KINDS, Inpath
from .normalised import Audit, FuseAction, SelfMonitoring, Signal
from .schema import RawFuse

GROUP_TIMINGS = ("group_wait", "group_wait_critical", "group_interval", "repeat_interval")


def check_human_receiver(ck: Checker, f: RawFuse) -> None:
    """``fuse.human_receiver`` needs a name of its own."""
    hr = f.human_receiver
    if not isinstance(hr.get("name"), str) or not hr.get("name"):
        ck.err(("fuse", "human_receiver"), "human_receiver needs a 'name'",
               "write it as an Alertmanager receiver, e.g. {name: oncall, pagerduty_configs: [...]}")
    elif hr["name"] == f.receiver:
        ck.err(("fuse", "human_receiver", "name"), f"human_receiver is named like the fuse receiver ({hr['name']!r})",
               "give your pager's receiver its own name")


def normalise_actions(ck: Checker, f: RawFuse) -> dict[str, FuseAction]:
    """``fuse.actions``: one level each, from 1."""
    actions: dict[str, FuseAction] = {}
    levels: dict[int, str] = {}
    for name, a in f.actions.items():
        if a.level in levels:
            ck.err(("fuse", "actions", name, "level"), f"fuse level {a.level} is used by both {levels[a.level]!r} and {name!r}",
                   "give each action its own level (1 freeze admissions, 2 text-only fallback, 3 KV-cache eviction)")
        if a.level < 1:
            ck.err(("fuse", "actions", name, "level"), "fuse levels start at 1", "use 1, 2, 3 ...")
        levels[a.level] = name
        actions[name] = FuseAction(name, a.level, a.description)
    return actions


def group_timings(ck: Checker, f: RawFuse) -> dict[str, float]:
    """The routes' timings in seconds, by name (:data:`GROUP_TIMINGS`)."""
    return {name: ck.duration(getattr(f, name), ("fuse", name)) for name in GROUP_TIMINGS}


def normalise_self_monitoring(ck: Checker, f: RawFuse, scrape_s: float) -> SelfMonitoring:
    """``fuse.self_monitoring``: positive durations, label names, and a silence bound the
    heartbeat's own period cannot reach (Alertmanager resends on a group_interval tick after
    repeat_interval, so two periods can pass between two heartbeats)."""
    m = f.self_monitoring
    base = ("fuse", "self_monitoring")
    d: dict[str, float] = {}
    for name in ("down_for", "max_pending_action_age", "heartbeat_interval", "heartbeat_silent_after"):
        before = len(ck.problems)
        d[name] = ck.duration(getattr(m, name), base + (name,))
        if name != "down_for" and d[name] <= 0 and len(ck.problems) == before:  # not twice for one value
            ck.err(base + (name,), f"{name} must be positive", "e.g. '2m'")
    for key in ("fuse_selector", "alertmanager_selector"):
        ck.labels(getattr(m, key), base + (key,))
    if d["heartbeat_interval"] > 0 and d["heartbeat_silent_after"] < 3 * d["heartbeat_interval"]:
        ck.err(base + ("heartbeat_silent_after",),
               f"heartbeat_silent_after ({m.heartbeat_silent_after}) is under three heartbeat intervals "
               f"({m.heartbeat_interval} each): a heartbeat can come two intervals apart, so this would page on a healthy feed",
               "raise heartbeat_silent_after to at least 3 x heartbeat_interval, e.g. 5m for 1m")
    if 0 < d["max_pending_action_age"] < 2 * scrape_s:
        ck.err(base + ("max_pending_action_age",),
               f"max_pending_action_age ({m.max_pending_action_age}) is under two scrape intervals",
               "raise it to at least two global.scrape_interval")
    return SelfMonitoring(enabled=m.enabled, fuse_selector=dict(m.fuse_selector),
                          alertmanager_selector=dict(m.alertmanager_selector),
                          down_for_s=d["down_for"], max_pending_action_age_s=d["max_pending_action_age"],
                          heartbeat_interval_s=d["heartbeat_interval"], heartbeat_silent_after_s=d["heartbeat_silent_after"])


def audit(f: RawFuse) -> Audit:
    """``fuse.audit`` (its bounds are pydantic's to check)."""
    return Audit(f.audit.refused_per_minute, f.audit.refused_max_rows)


def check_after_shedding(ck: Checker, signals: list[Signal], inpath: Inpath) -> None:
    """A tier with ``after_shedding`` needs a gateway shedder (``smg`` or ``sglang_router``,
    whose admission counter the rule reads) that sheds on its signal."""
    for sig in signals:
        for t in sig.tiers:
            if not t.after_shedding:
                continue
            gateways = [sh.name for sh in inpath.shedders if sh.signal == sig.name and sh.kind in GATEWAY_KINDS]
            if not gateways:
                ck.err(t.path + ("after_shedding",),
                       f"after_shedding: no in-path gateway sheds on signal {sig.name!r}, so this tier would wait for nothing",
                       f"add one under inpath.shedders (kind: smg or sglang_router, signal: {sig.name}), "
                       "or remove after_shedding")
