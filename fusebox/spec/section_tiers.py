"""A signal's ``tiers:``, normalised: each tier's threshold in base units (an override's, else the
tier's), its durations (an override's, else the tier's, else ``defaults:``), its fuse action, and
the order of the warning and critical thresholds for the signal's direction."""

from __future__ import annotations

from dataclasses import dataclass

from fusebox.signal_kinds.base import Kind

from . import units
from .checking import TIER_ORDER, Checker
from .normalised import FuseAction, Tier
from .schema import RawOverride, RawSignal, RawTier, Scalar
from .section_global import Defaults

Override = tuple[RawOverride, int]  # an entry of `overrides:` and its index there


@dataclass(frozen=True)
class TierInputs:
    """What one signal's tiers are normalised against: the signal as written, where it sits, the
    overrides of its alert (``"warning"``, ``"critical"``, ``"*"`` for one without ``tier``),
    ``defaults:``, ``fuse.actions`` and its kind (which checks each threshold)."""

    name: str
    raw: RawSignal
    path: tuple
    overrides: dict[str, Override]
    defaults: Defaults
    actions: dict[str, FuseAction]
    kind: Kind
    buckets: tuple[float, ...]


def _written(tname: str, attr: str, t: RawTier, ins: TierInputs) -> Scalar | bool | str | None:
    """The tier's ``attr`` as an override wrote it (its own tier's, then the whole alert's), else None."""
    for key in (tname, "*"):
        o = ins.overrides.get(key)
        v = getattr(o[0], attr) if o is not None else None
        if v is not None:
            return v
    return None


def _where(tname: str, attr: str, name: str, t: RawTier, ins: TierInputs) -> tuple:
    """Where the tier's ``attr`` came from: an override, the tier, the defaults."""
    for key in (tname, "*"):
        o = ins.overrides.get(key)
        if o is not None and getattr(o[0], attr) is not None:
            return ("overrides", o[1], name)
    return ins.path + ("tiers", tname, name) if getattr(t, attr) is not None else ("defaults", name)


def _threshold(ck: Checker, tname: str, t: RawTier, ins: TierInputs, tp: tuple) -> tuple[float, Scalar] | None:
    """The threshold in base units and as written, or None after reporting it."""
    s = ins.raw
    written = _written(tname, "threshold", t, ins)
    threshold_raw = t.threshold if written is None else written
    try:
        threshold = units.parse_quantity(threshold_raw, s.unit)
    except ValueError as e:
        what, fix = (e.what, e.fix) if isinstance(e, units.QuantityError) else (str(e), None)
        ck.err(tp, what, fix or f"signal {ins.name}'s unit is {s.unit}: write the threshold as e.g. {units.EXAMPLES[s.unit]}")
        return None
    if threshold == 0 and s.direction == "above":  # "-0 MB/s" too: ">= 0" holds for every sample
        ck.err(tp, f"a threshold of {str(threshold_raw).strip()!r} on an upper bound fires whenever the signal exists",
               f"give the level it should fire at, e.g. {units.EXAMPLES[s.unit]}")
        return None
    return threshold, threshold_raw


def _tier(ck: Checker, tname: str, t: RawTier, ins: TierInputs, threshold_at: dict[str, tuple]) -> tuple[Tier | None, bool]:
    """One tier (None when it is malformed, reported) and whether it is enabled."""
    tpath = ins.path + ("tiers", tname)
    if tname not in TIER_ORDER:
        ck.err(tpath, f"unknown tier {tname!r}", "use 'warning' and/or 'critical'", key=True)
        return None, False
    tp = threshold_at[tname] = _where(tname, "threshold", "threshold", t, ins)
    parsed = _threshold(ck, tname, t, ins, tp)
    if parsed is None:
        return None, False
    threshold, threshold_raw = parsed
    d = ins.defaults

    def pick(attr: str, default: object) -> object:
        v = _written(tname, attr, t, ins)
        return default if v is None else v

    for_s = ck.duration(pick("for_", t.for_ if t.for_ is not None else d.for_), _where(tname, "for_", "for", t, ins))
    kff = ck.duration(pick("keep_firing_for", t.keep_firing_for if t.keep_firing_for is not None else d.keep_firing_for),
                      _where(tname, "keep_firing_for", "keep_firing_for", t, ins))
    enabled = pick("enabled", t.enabled)
    if t.fuse is not None and t.fuse not in ins.actions:
        ck.err(tpath + ("fuse",), f"unknown fuse action {t.fuse!r}", f"use one of: {', '.join(ins.actions)}")
    ins.kind.check_threshold(threshold, ins.buckets, tp, ck.err)
    return Tier(
        name=tname, threshold=threshold, threshold_text=str(threshold_raw), for_s=for_s, keep_firing_for_s=kff,
        severity=str(pick("severity", t.severity or tname)), fuse=t.fuse,
        fuse_level=ins.actions[t.fuse].level if t.fuse in ins.actions else 0, path=tpath, after_shedding=t.after_shedding,
        advice=t.advice,
    ), bool(enabled)


def _check_order(ck: Checker, ins: TierInputs, tiers: list[Tier], threshold_at: dict[str, tuple]) -> None:
    """Warning before critical in the signal's direction (not judged under a direction its kind refuses)."""
    s, kind = ins.raw, ins.kind
    by_name = {t.name: t for t in tiers}
    wrong_direction = kind.required_direction is not None and s.direction != kind.required_direction
    if "warning" not in by_name or "critical" not in by_name or wrong_direction:
        return
    wt, ct = by_name["warning"], by_name["critical"]
    wp, cp = threshold_at["warning"], threshold_at["critical"]
    # at the threshold an override wrote (the critical one's when both were), else the critical tier's
    at = wp if wp[0] == "overrides" and cp[0] != "overrides" else cp
    both = " (this override has no 'tier', so it sets both tiers' threshold)" if wp == cp else ""
    fix_both = "add 'tier: critical' or 'tier: warning' to this override"
    if s.direction == "above" and wt.threshold >= ct.threshold:
        ck.err(at, f"warning threshold ({wt.threshold_text}) is not below critical ({ct.threshold_text}) for an upper bound{both}",
               fix_both if both else "lower the warning threshold or raise the critical one")
    if s.direction == "below" and wt.threshold <= ct.threshold:
        ck.err(at, f"warning threshold ({wt.threshold_text}) is not above critical ({ct.threshold_text}) for a lower bound{both}",
               fix_both if both else "raise the warning threshold or lower the critical one")


def normalise_tiers(ck: Checker, ins: TierInputs, disabled: list[Tier] | None = None) -> tuple[Tier, ...]:
    """The signal's enabled tiers, warning before critical; problems reported on ``ck``. The valid
    tiers that are disabled (``enabled: false``, or an override's) go to ``disabled`` when given."""
    tiers: list[Tier] = []
    threshold_at: dict[str, tuple] = {}  # tier -> where its threshold was written (the tier or an override)
    for tname, t in ins.raw.tiers.items():
        tier, enabled = _tier(ck, tname, t, ins, threshold_at)
        if tier is not None and enabled:
            tiers.append(tier)
        elif tier is not None and disabled is not None:
            disabled.append(tier)
    tiers.sort(key=lambda t: TIER_ORDER.index(t.name))
    _check_order(ck, ins, tiers, threshold_at)
    return tuple(tiers)
