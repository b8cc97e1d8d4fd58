"""``inpath.shedders.<name>.overload`` (kind smg): smg 1.13's own worker overload veto, which the
generated flags always state (generator/render_inpath.py; docs/inpath.md, "smg's worker overload
protection"; docs/pitfalls.md P23).

Shape::

    overload:
      token_usage: 80%     # KV-cache token usage at or above which a worker leaves routing
      waiting_requests: 8  # waiting requests at or above which it does
      shed: false          # true: 503 when every worker is over (--worker-overload-shed)
      # protection: false  # switch the veto off (then neither threshold)

Without ``overload:`` (or without one of its thresholds) the threshold is derived: the warning
threshold (the safe level) of the spec's signal of the same quantity (a ``gauge`` whose source reads
what smg reads, ``conventions.SMG_VETO_READS``), else smg 1.13's own default (0.8, 8); the flags
state it either way. Every veto is checked against every signal of its quantity: at or above its
safe level, under its fuse tier's threshold. Every problem is reported through ``err(path, what,
fix)`` at its line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictBool

from fusebox import conventions as C

from . import units

__all__ = ["RawOverload", "Overload", "Veto", "OVERLOAD_KINDS", "OVERLOAD_QUANTITIES", "SMG_OVERLOAD_DEFAULTS",
           "SMG_DEFAULT_KEY", "normalise_overload"]

# The kinds with a worker overload veto of their own: smg 1.13 (sglang-router 0.3.2's --help has none).
OVERLOAD_KINDS = ("smg",)
# smg 1.13's veto where its command line says nothing (smg/router_args.py: worker_overload_token_usage
# 0.8, worker_overload_waiting_requests 8; both compared "at or above"), by quantity: a shedder the
# spec would not know of unless the flags state it (docs/pitfalls.md P23).
SMG_OVERLOAD_DEFAULTS = {"token_usage": 0.8, "waiting_requests": 8.0}
SMG_DEFAULT_KEY = "smg 1.13's default"
# The veto's quantities: each one's unit in the spec (a signal of it has this unit), and its name for people.
OVERLOAD_QUANTITIES = {"token_usage": ("ratio", "KV-cache token usage"), "waiting_requests": ("count", "waiting requests")}

Err = Callable[..., None]
# Number-like fields refuse YAML booleans (token_usage: yes would be 1), as the rest of the spec does.
_Value = Annotated[str | int | float, BeforeValidator(units.reject_bool)]
_Int = Annotated[int, BeforeValidator(units.reject_bool)]


def _key(path: tuple) -> str:
    return ".".join(str(p) for p in path)


class RawOverload(BaseModel):
    """``inpath.shedders.<name>.overload`` (kind smg): smg 1.13's worker overload veto."""

    model_config = ConfigDict(extra="forbid")

    protection: StrictBool = True
    token_usage: _Value | None = None
    waiting_requests: _Int | None = None
    shed: StrictBool = False


@dataclass(frozen=True)
class Veto:
    """One threshold of smg's worker overload veto: a worker whose ``quantity`` is at or above
    ``at`` is left out of routing while another worker is under (smg 1.13, inclusive)."""

    quantity: str  # "token_usage" (KV-cache token usage, ratio 0-1) | "waiting_requests" (requests)
    at: float  # ratio 0-1, or requests (a whole number)
    key: str  # where the number comes from: a spec key, or SMG_DEFAULT_KEY
    text: str  # as the spec wrote it (or as derived), for humans
    signals: tuple[str, ...] = ()  # the spec's signals of the same quantity, each checked against it


@dataclass(frozen=True)
class Overload:
    """smg's worker overload protection as the flags state it: ``vetoes`` empty when it is off."""

    protection: bool
    shed: bool  # --worker-overload-shed: 503 when every worker is over, instead of the least-loaded one
    vetoes: tuple[Veto, ...]
    key: str  # inpath.shedders.<name>.overload (given or not)
    given: bool  # whether the spec has the block


def _quantity_signals(signals: dict[str, Any], quantity: str) -> list[Any]:
    """The spec's signals of ``quantity``, in spec order: gauges that alert above, in its unit,
    with a source that reads what smg's veto reads (``conventions.SMG_VETO_READS``)."""
    reads, unit = C.SMG_VETO_READS[quantity], OVERLOAD_QUANTITIES[quantity][0]
    return [sig for sig in signals.values() if sig.kind == "gauge" and sig.direction == "above" and sig.unit == unit
            and any(src.metric in reads for src in sig.sources.values())]


def _given_veto(quantity: str, value: _Value, path: tuple, err: Err) -> float | None:
    """An ``overload`` threshold as given, in its base unit, or None after reporting it."""
    if quantity == "waiting_requests":
        if isinstance(value, int) and value >= 1:
            return float(value)
        err(path, f"overload.waiting_requests {value!r} is under 1", "smg compares at or above, so 0 would take "
            "every worker out of routing: give a whole number of 1 or more, e.g. 8")
        return None
    try:
        at = units.parse_quantity(value, "ratio")
    except ValueError as e:
        err(path, f"overload.token_usage: {getattr(e, 'what', str(e))}", "a share of the KV cache, e.g. '85%' or 0.85")
        return None
    if not 0 < at <= 1:
        err(path, f"overload.token_usage {value} is not over 0% and at most 100%", "smg takes a share of the KV cache in "
            "(0, 1] (0 would take every worker out of routing), e.g. '85%'")
        return None
    return at


def _derived_veto(quantity: str, sigs: list[Any]) -> tuple[float, str, str]:
    """(at, key, text) of a threshold the spec does not give: the warning threshold (the safe level)
    of the first of ``sigs`` with one (waiting requests: rounded up to a whole request, at least 1),
    else smg 1.13's default."""
    for sig in sigs:
        warn = next((t for t in sig.tiers if t.name == "warning"), None)
        if warn is None:
            continue
        key = _key(warn.path + ("threshold",))
        if quantity == "token_usage":
            return warn.threshold, key, warn.threshold_text
        n = float(max(1, math.ceil(round(warn.threshold, 9))))
        return n, key, units.format_number(n) if n == warn.threshold else f"{units.format_number(n)} ({warn.threshold_text} rounded up)"
    at = SMG_OVERLOAD_DEFAULTS[quantity]
    return at, SMG_DEFAULT_KEY, units.humanize(at, OVERLOAD_QUANTITIES[quantity][0])


def _check_veto(v: Veto, sig: Any, path: tuple, err: Err, key: bool) -> bool:
    """Whether veto ``v`` acts at or above ``sig``'s safe level (its warning threshold) and under its
    fuse tier's threshold; the problems are reported at ``path`` (at its key with ``key``)."""
    unit, what = OVERLOAD_QUANTITIES[v.quantity]
    safe = next((t for t in sig.tiers if t.name == "warning"), None)
    fuse = next((t for t in sig.tiers if t.fuse), None)
    span = " and ".join(([f"at or above {safe.threshold_text} ({_key(safe.path + ('threshold',))})"] if safe else [])
                        + ([f"under {fuse.threshold_text} ({_key(fuse.path + ('threshold',))})"] if fuse else []))
    at = f"smg's overload veto takes a worker out of routing at {units.humanize(v.at, unit)} {what} ({v.key})"
    fix = f"state overload.{v.quantity} {span}"
    ok = True
    if safe is not None and round(v.at, 9) < safe.threshold:
        err(path, f"{at}, under signal {sig.name!r}'s safe level {safe.threshold_text} "
            f"({_key(safe.path + ('threshold',))}): it would shed where the spec calls the engine safe", fix, key=key)
        ok = False
    if fuse is not None and round(v.at, 9) >= fuse.threshold:
        err(path, f"{at}, at or above the fuse's {fuse.threshold_text} ({_key(fuse.path + ('threshold',))}) on signal "
            f"{sig.name!r}: the veto acts only once the fuse trips", fix, key=key)
        ok = False
    return ok


def normalise_overload(kind: str, ov: RawOverload | None, path: tuple, signals: dict[str, Any],
                       err: Err) -> tuple[Overload | None, bool]:
    """The worker overload veto of the shedder of ``kind`` at ``path`` (None for a kind without
    one) and whether it is valid. ``signals``: the spec's normalised signals by name. Each threshold
    as given, else derived (:func:`_derived_veto`), checked against every signal of its quantity
    (:func:`_check_veto`); a problem is reported through ``err(path, what, fix)``."""
    opath = path + ("overload",)
    if kind not in OVERLOAD_KINDS:
        if ov is not None:
            err(opath, f"kind {kind} has no worker overload protection (smg 1.13's --worker-overload-* flags)",
                "drop overload:, or use kind: smg", key=True)
            return None, False
        return None, True
    given = ov is not None
    ov = ov or RawOverload()
    if not ov.protection:
        extra = [k for k in OVERLOAD_QUANTITIES if getattr(ov, k) is not None] + (["shed"] if ov.shed else [])
        for k in extra:
            err(opath + (k,), f"overload.{k} is set but overload.protection is false: smg then leaves no worker out "
                "of routing", f"drop {k}, or protection: false", key=True)
        return Overload(protection=False, shed=False, vetoes=(), key=_key(opath), given=given), not extra
    ok, vetoes = True, []
    for quantity in OVERLOAD_QUANTITIES:
        sigs = _quantity_signals(signals, quantity)
        value = getattr(ov, quantity)
        if value is not None:
            at = _given_veto(quantity, value, opath + (quantity,), err)
            if at is None:
                ok = False
                continue
            v = Veto(quantity, at, _key(opath + (quantity,)), str(value), tuple(s.name for s in sigs))
            where, at_key = opath + (quantity,), False
        else:
            v = Veto(quantity, *_derived_veto(quantity, sigs), tuple(s.name for s in sigs))
            where, at_key = (opath if given else path), True
        checked = [_check_veto(v, sig, where, err, at_key) for sig in sigs]
        ok = ok and all(checked)
        vetoes.append(v)
    return Overload(protection=True, shed=ov.shed, vetoes=tuple(vetoes), key=_key(opath), given=given), ok
