"""The spec's ``inpath:`` section: the shedders in the request path (the gateway, the engines) whose
settings ``fusebox generate`` writes into ``inpath/`` from the same thresholds as the alerts
(docs/inpath.md).

Shape::

    inpath:
      max_generation: 10m        # the longest a request may run (the gateway's request timeout and breaker window)
      mean_generation: 16s       # optional: a typical request's duration (the sustained admission rate)
      shedders:
        <name>:                  # the file inpath/<name>.flags
          kind: smg              # smg (1.13) | sglang_router (0.3.2) | vllm (an engine's arguments)
          signal: gpu_memory_utilization   # a signal of the spec that grows with load (direction above)
          engines: 2             # the engines behind the gateway (smg, sglang_router)
          idle: 55%              # the signal with no request running, in the signal's unit
          per_request: 2%        # what one running request adds to it, per engine
          shed_at: 72%           # optional; default: the signal's warning threshold (its safe level)
          set: {queue_size: 0}   # optional per-setting overrides (SETTINGS lists them per kind)
          overload:              # kind smg only: smg 1.13's own worker overload veto, stated (on by default)
            token_usage: 80%     # KV-cache token usage at or above which a worker leaves routing
            waiting_requests: 8  # waiting requests at or above which it does
            shed: false          # true: 503 when every worker is over (--worker-overload-shed)
            # protection: false  # switch the veto off (then neither threshold)

Without ``overload:`` (or without one of its thresholds) the threshold is derived: the warning
threshold (the safe level) of the spec's signal of the same quantity (a ``gauge`` whose source reads
what smg reads, ``conventions.SMG_VETO_READS``), else smg 1.13's own default (0.8, 8); the flags
state it either way. Every veto is checked against every signal of its quantity: at or above its
safe level, under its fuse tier's threshold.

Every problem is a :class:`~fusebox.spec.errors.Problem` at its line (exit 2 in the CLI).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictBool

from fusebox import conventions as C

from . import units

__all__ = ["RawInpath", "Inpath", "Shedder", "Overload", "Veto", "per_engine", "SETTINGS", "KINDS", "GATEWAY_KINDS",
           "OVERLOAD_KINDS", "OVERLOAD_QUANTITIES", "SMG_OVERLOAD_DEFAULTS", "SMG_DEFAULT_KEY", "normalise_inpath", "shedding_window_s", "shedding_records"]

GATEWAY_KINDS = ("smg", "sglang_router")
_NAME = re.compile(r"^[a-z][a-z0-9_-]*\Z")  # a shedder's name is its file's name: inpath/<name>.flags
KINDS = (*GATEWAY_KINDS, "vllm")
# The kinds with a worker overload veto of their own: smg 1.13 (sglang-router 0.3.2's --help has none).
OVERLOAD_KINDS = ("smg",)
# smg 1.13's veto where its command line says nothing (smg/router_args.py: worker_overload_token_usage
# 0.8, worker_overload_waiting_requests 8; both compared "at or above"), by quantity: a shedder the
# spec would not know of unless the flags state it (docs/pitfalls.md P23).
SMG_OVERLOAD_DEFAULTS = {"token_usage": 0.8, "waiting_requests": 8.0}
SMG_DEFAULT_KEY = "smg 1.13's default"
# The veto's quantities: each one's unit in the spec (a signal of it has this unit), and its name for people.
OVERLOAD_QUANTITIES = {"token_usage": ("ratio", "KV-cache token usage"), "waiting_requests": ("count", "waiting requests")}

# The overrides each kind takes under `set:`, and their type: "count" a whole number of 0 or more,
# "positive" one of 1 or more, "seconds" a Prometheus duration of whole seconds (the gateways'
# flags take integer seconds). docs/inpath.md maps each to its flag.
_GATEWAY_SETTINGS = {
    "max_concurrent_requests": "positive", "queue_size": "count", "queue_timeout": "seconds",
    "rate_limit": "positive", "request_timeout": "seconds", "cb_failure_threshold": "positive",
    "cb_success_threshold": "positive", "cb_timeout": "seconds", "cb_window": "seconds",
}
SETTINGS: dict[str, dict[str, str]] = {
    "smg": _GATEWAY_SETTINGS,
    "sglang_router": _GATEWAY_SETTINGS,
    "vllm": {"max_num_queued_reqs": "positive", "max_num_queued_tokens": "positive"},
}

Err = Callable[..., None]
# Number-like fields refuse YAML booleans (engines: yes would be 1), as the rest of the spec does.
_Value = Annotated[str | int | float, BeforeValidator(units.reject_bool)]
_Int = Annotated[int, BeforeValidator(units.reject_bool)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RawOverload(_Strict):
    """``inpath.shedders.<name>.overload`` (kind smg): smg 1.13's worker overload veto."""

    protection: StrictBool = True
    token_usage: _Value | None = None
    waiting_requests: _Int | None = None
    shed: StrictBool = False


class RawShedder(_Strict):
    kind: Literal["smg", "sglang_router", "vllm"]
    signal: str
    engines: _Int = 1
    idle: _Value
    per_request: _Value
    shed_at: _Value | None = None
    set: dict[str, _Value] = {}
    overload: RawOverload | None = None


class RawInpath(_Strict):
    """``inpath``: the in-path shedders and the generation times their settings follow (docs/inpath.md)."""

    max_generation: _Value | None = None
    mean_generation: _Value | None = None
    shedders: dict[str, RawShedder] = {}


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


@dataclass(frozen=True)
class Shedder:
    """One shedder, normalised: levels in the signal's base unit (ratio 0-1, s, B/s), overrides in
    the flag's unit (a count, or whole seconds)."""

    name: str
    kind: str
    signal: str
    unit: str  # the signal's unit
    engines: int
    idle: float
    per_request: float
    shed_at: float
    shed_at_key: str  # the spec key shed_at comes from, e.g. signals.gpu_memory_utilization.tiers.warning.threshold
    shed_at_text: str  # as the spec wrote it
    fuse_at: float | None  # the threshold of the signal's first tier that requests a fuse; None without one
    fuse_key: str | None
    fuse_for_s: float | None  # that tier's `for`
    settings: dict[str, float] = field(default_factory=dict)  # `set:` overrides
    path: tuple = ()
    overload: Overload | None = None  # kind smg: its worker overload veto (None for the other kinds)

    @property
    def veto_at(self) -> dict[str, float]:
        """Signal name -> the level, in that signal's base unit, at or above which smg's worker
        overload veto takes a worker out of routing: one entry per signal of the spec that reads
        the veto's quantity (KV-cache token usage, waiting requests); ``{}`` without a veto on any.
        What a check of the order "scale, then shed, then fuse" reads beside ``shed_at``."""
        if self.overload is None:
            return {}
        return {sig: v.at for v in self.overload.vetoes for sig in v.signals}

    @property
    def per_engine(self) -> int:
        """Requests one engine may run before the signal passes ``shed_at``:
        floor((shed_at - idle) / per_request), the division rounded to 9 digits first (72% - 55%
        over 2% is 8.4999999 in floats)."""
        return per_engine(self.shed_at, self.idle, self.per_request)


def per_engine(shed_at: float, idle: float, per_request: float) -> int:
    """floor((shed_at - idle) / per_request), rounded to 9 digits before the floor (float noise)."""
    return math.floor(round((shed_at - idle) / per_request, 9))


@dataclass(frozen=True)
class Inpath:
    """``inpath``, normalised: durations in seconds (None: not given), the shedders in spec order."""

    max_generation_s: float | None = None
    mean_generation_s: float | None = None
    shedders: tuple[Shedder, ...] = ()


def _key(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _seconds(value: _Value) -> float | None:
    try:
        return units.parse_duration(value)  # type: ignore[arg-type]  # a float fails as it should
    except ValueError:
        return None


def _setting(value: _Value, kind: str, path: tuple, err: Err) -> float | None:
    """One `set:` value in its flag's unit, or None after reporting it."""
    if kind == "seconds":
        secs = _seconds(value)
        if secs is None or secs <= 0 or secs != int(secs):
            err(path, f"{value!r} is not a positive whole number of seconds (a Prometheus duration)",
                "the gateway's flag takes whole seconds, e.g. '30s' or '10m'")
            return None
        return secs
    if isinstance(value, bool) or not isinstance(value, int) or value < (1 if kind == "positive" else 0):
        err(path, f"{value!r} is not a whole number of {'1' if kind == 'positive' else '0'} or more",
            "write a plain integer, e.g. 16")
        return None
    return float(value)


def _shed_signal(name: str, raw: RawShedder, signals: dict[str, Any], written: set[str], err: Err) -> Any:
    """The signal a shedder named ``name`` reads, or None (reported, unless the signal's own
    problem is): a file name fusebox can write, a known signal that alerts above its threshold."""
    path = ("inpath", "shedders", name)
    if not _NAME.match(name):
        err(path, f"shedder name {name!r} is not a file name fusebox writes", "lower-case letters, digits, _ and -, "
            "starting with a letter (it names inpath/<name>.flags)", key=True)
        return None
    sig = signals.get(raw.signal)
    if sig is None and raw.signal in written:
        return None  # a signal of the spec that did not load: its own problem is reported
    if sig is None:
        err(path + ("signal",), f"inpath.shedders.{name} reads unknown signal {raw.signal!r}",
            f"use one of: {', '.join(signals) or '(the spec has no signals)'}")
        return None
    if sig.direction != "above":
        err(path + ("signal",), f"signal {raw.signal!r} alerts below its threshold (direction: below): load does not "
            "raise it request by request", "read a signal that grows with load (GPU memory, KV usage, a latency)")
        return None
    return sig


def _levels(raw: RawShedder, sig: Any, path: tuple, err: Err) -> tuple[dict[str, float], bool]:
    """``idle``, ``per_request`` and ``shed_at`` as given, in the signal's base unit, and whether
    all (and ``engines``) were valid."""
    ok = True
    if raw.engines < 1:
        err(path + ("engines",), f"engines {raw.engines} is under 1", "the number of engines behind the gateway, e.g. 2")
        ok = False
    levels: dict[str, float] = {}
    for key in ("idle", "per_request", "shed_at"):
        value = getattr(raw, key)
        if value is None:
            continue
        try:
            levels[key] = units.parse_quantity(value, sig.unit)
        except ValueError as e:
            err(path + (key,), f"{key}: {getattr(e, 'what', str(e))}",
                f"write it in the unit of signal {raw.signal!r} ({sig.unit.replace('_', ' ')}), e.g. '2%' for a ratio")
            ok = False
    return levels, ok


def _shed_at(raw: RawShedder, sig: Any, path: tuple, levels: dict[str, float], err: Err) -> tuple[str, str] | None:
    """(key, text as written) of the shedding level: the shedder's ``shed_at``, else the signal's
    warning threshold (then put in ``levels``); None (reported) without either."""
    tiers = {t.name: t for t in sig.tiers}
    if raw.shed_at is not None:
        return _key(path + ("shed_at",)), str(raw.shed_at)
    if "warning" in tiers:
        levels["shed_at"] = tiers["warning"].threshold
        return _key(tiers["warning"].path + ("threshold",)), tiers["warning"].threshold_text
    err(path, f"signal {raw.signal!r} has no warning tier (its safe level) to shed at",
        "give the shedder 'shed_at:' in the signal's unit, or add a warning tier to the signal")
    return None


def _bounded(raw: RawShedder, path: tuple, levels: dict[str, float], shed_key: str, shed_text: str, err: Err) -> bool:
    """Whether at least one request, and fewer than a billion, fit between idle and the shedding
    level; the first reason it does not is reported."""
    if levels["per_request"] <= 0:
        err(path + ("per_request",), "per_request is 0: one request would never reach the shedding level",
            "measure the rise of the signal per running request, e.g. '2%'")
        return False
    if levels["shed_at"] <= levels["idle"]:
        err(path + ("shed_at" if raw.shed_at is not None else "idle",),
            f"the shedding level {shed_text} ({shed_key}) is not above idle {raw.idle}: no request could be admitted",
            "idle is the signal with no request running; shed above it")
        return False
    if not (levels["shed_at"] - levels["idle"]) / levels["per_request"] < 1e9:
        err(path + ("per_request",), f"per_request {raw.per_request} is so small that a billion requests would fit "
            "before the shedding level: no bound", "measure the rise of the signal per running request, e.g. '2%'")
        return False
    if per_engine(levels["shed_at"], levels["idle"], levels["per_request"]) < 1:
        err(path + ("per_request",), f"not one request of {raw.per_request} fits between idle {raw.idle} and the shedding "
            f"level {shed_text} ({shed_key}): the shedder would refuse everything", "check idle and per_request against the "
            "signal you measure, or shed higher (shed_at)")
        return False
    return True


def _settings(raw: RawShedder, path: tuple, err: Err) -> tuple[dict[str, float], bool]:
    """The ``set:`` overrides in their flags' units, and whether all were valid for the kind."""
    allowed = SETTINGS[raw.kind]
    settings: dict[str, float] = {}
    ok = True
    for key, value in raw.set.items():
        if key not in allowed:
            err(path + ("set", key), f"kind {raw.kind} has no setting {key!r}", f"use one of: {', '.join(allowed)}", key=True)
            ok = False
            continue
        v = _setting(value, allowed[key], path + ("set", key), err)
        if v is None:
            ok = False
        else:
            settings[key] = v
    return settings, ok


# --- smg's worker overload veto (overload:) -------------------------------------------------------
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


def _overload(raw: RawShedder, path: tuple, signals: dict[str, Any], err: Err) -> tuple[Overload | None, bool]:
    """The shedder's worker overload veto (kind smg; None for the others) and whether it is valid:
    each threshold as given, else derived (:func:`_derived_veto`), checked against every signal of
    its quantity (:func:`_check_veto`)."""
    ov = raw.overload
    opath = path + ("overload",)
    if raw.kind not in OVERLOAD_KINDS:
        if ov is not None:
            err(opath, f"kind {raw.kind} has no worker overload protection (smg 1.13's --worker-overload-* flags)",
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


def _shedder(name: str, raw: RawShedder, signals: dict[str, Any], written: set[str], err: Err) -> Shedder | None:
    path = ("inpath", "shedders", name)
    sig = _shed_signal(name, raw, signals, written, err)
    if sig is None:
        return None
    levels, ok = _levels(raw, sig, path, err)
    shed = _shed_at(raw, sig, path, levels, err)
    if shed is None:
        return None
    shed_key, shed_text = shed
    ok = ok and _bounded(raw, path, levels, shed_key, shed_text, err)
    settings, settings_ok = _settings(raw, path, err)
    overload, overload_ok = _overload(raw, path, signals, err)
    if not (ok and settings_ok and overload_ok):
        return None
    fuse = next((t for t in sig.tiers if t.fuse), None)
    return Shedder(name=name, kind=raw.kind, signal=raw.signal, unit=sig.unit, engines=raw.engines,
                   idle=levels["idle"], per_request=levels["per_request"], shed_at=levels["shed_at"],
                   shed_at_key=shed_key, shed_at_text=shed_text,
                   fuse_at=fuse.threshold if fuse else None,
                   fuse_key=_key(fuse.path + ("threshold",)) if fuse else None,
                   fuse_for_s=fuse.for_s if fuse else None, settings=settings, path=path, overload=overload)


def normalise_inpath(raw: RawInpath, signals: dict[str, Any], written: set[str], err: Err) -> Inpath:
    """``raw`` checked against the spec's ``signals`` (name -> normalised Signal); ``written`` names
    every signal the spec writes, so a shedder of one that failed to load adds no problem of its own.

    Reports through ``err(path, what, fix)``: an unknown signal or setting, a level that is not in
    the signal's unit, a shedding level at or under idle, a generation time that is not a positive
    duration, an smg overload veto under the safe level or at or above the fuse of a signal of its
    quantity (or out of smg's range, or on another kind). Returns what is valid (the caller raises when anything was reported)."""
    gens: dict[str, float | None] = {}
    for key in ("max_generation", "mean_generation"):
        value = getattr(raw, key)
        gens[key] = None
        if value is not None:
            secs = _seconds(value)
            if secs is None or secs <= 0:
                err(("inpath", key), f"inpath.{key} {value!r} is not a positive Prometheus duration", "e.g. '10m' or '16s'")
            else:
                gens[key] = secs
    shedders: list[Shedder] = []
    for name, r in raw.shedders.items():
        one = _shedder(name, r, signals, written, err)
        if one is not None:
            shedders.append(one)
    return Inpath(max_generation_s=gens["max_generation"], mean_generation_s=gens["mean_generation"],
                  shedders=tuple(shedders))


# --- what the in-path gateways did, as records (generator/shedding.py writes the rules) ------------
def shedding_window_s(spec: Any) -> float:
    """The rate window of the refusal records and of the ``after_shedding`` gate
    (generator/render_rules.shedding_gate): a minute, or four scrapes where that is longer."""
    return max(60.0, 4 * spec.scrape_interval_s)


def shedding_records(spec: Any) -> dict[str, str]:
    """Record names by role of the ``fusebox-inpath`` group (generator/shedding.py); ``{}`` without a
    gateway shedder (``smg``, ``sglang_router``). Rates over :func:`shedding_window_s` (``rate1m``
    in the name for a minute):

    * ``refused``: requests the gateways refused (429: the concurrency bound, the rate limit, a
      full queue) within the window, over the window's seconds (their mean per second), summed per
      ``cluster``; a gateway's first refusals count too (its counter's series is born with them);
    * ``overload_shed``: requests shed because every worker of the model was overloaded, per
      second, per ``cluster`` and ``stage`` (only where an ``smg`` shedder is named: sglang-router
      0.3.2 does not count them);
    * ``breaker_open``: 1 while a worker's circuit breaker is open, else 0, per ``cluster`` and
      ``worker`` (the worker's URL; the highest over gateways that share a worker);
    * ``breakers_open``: the workers whose breaker is open, per ``cluster`` (0 when none).

    Here, in the spec's layer, so the check of the runbooks' queries knows them too
    (:func:`fusebox.signal_kinds.recorded_names`)."""
    gws = [s for s in spec.inpath.shedders if s.kind in GATEWAY_KINDS]
    if not gws:
        return {}
    w = units.format_duration(shedding_window_s(spec))
    rn = C.record_name
    out = {"refused": rn("cluster", "fusebox_gateway_refused_requests", f"rate{w}")}
    if any(s.kind == "smg" for s in gws):
        out["overload_shed"] = rn("stage", "fusebox_gateway_overload_shed_requests", f"rate{w}")
    out["breaker_open"] = rn("worker", "fusebox_gateway_breaker_open", "max")
    out["breakers_open"] = rn("cluster", "fusebox_gateway_breakers_open", "sum")
    return out
