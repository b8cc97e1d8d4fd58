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
          overload: {token_usage: 80%}   # kind smg only: smg's own worker overload veto (spec/overload.py)

Every problem is a :class:`~fusebox.spec.errors.Problem` at its line (exit 2 in the CLI).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

from fusebox import conventions as C

from . import units
from .overload import Overload, RawOverload, normalise_overload

__all__ = ["RawInpath", "Inpath", "Shedder", "per_engine", "SETTINGS", "KINDS", "GATEWAY_KINDS", "normalise_inpath",
           "shedding_window_s", "shedding_records"]

GATEWAY_KINDS = ("smg", "sglang_router")
_NAME = re.compile(r"^[a-z][a-z0-9_-]*\Z")  # a shedder's name is its file's name: inpath/<name>.flags
KINDS = (*GATEWAY_KINDS, "vllm")

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
    overload, overload_ok = normalise_overload(raw.kind, raw.overload, path, signals, err)
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
