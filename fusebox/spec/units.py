"""Threshold and duration parsing: what people write -> Prometheus base units.

Thresholds go through pint, so "78.3%" -> 0.783, "1.28s" / "1280ms" -> 1.28,
"14.7 MB/s" -> 14_700_000 (SI: 1 MB = 10^6 bytes), "14.7 MiB/s" -> 15_414_067.2
(2^20), "8.7 GB/min" -> 145_000_000 bytes per second. Durations use Prometheus' own
syntax ("30s", "1m", "1h30m"), which pint would misread ("1m" is a metre there).
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

# Signal units: name -> (pint target unit, dimensionality check)
UNITS = {
    "ratio": "dimensionless",
    "seconds": "second",
    "bytes": "byte",
    "bytes_per_second": "byte / second",
    "count": "dimensionless",  # requests waiting, preemptions: a plain number, never through pint
}
# A threshold people write in each unit, for error messages.
EXAMPLES = {
    "ratio": "'78.3%'",
    "seconds": "'1.28s'",
    "bytes": "'2 GB'",
    "bytes_per_second": "'14.7 MB/s'",
    "count": "50",
}
# Each unit as a sentence names it: "'78.3 GB' is bytes (GB), not a ratio".
UNIT_WORDS = {
    "ratio": "a ratio",
    "seconds": "seconds",
    "bytes": "bytes",
    "bytes_per_second": "bytes per second",
    "count": "a count",
}
# pint holds information dimensionless (its default_en.txt: ``bit = []``, ``byte = 8 * bit``,
# ``baud = bit / second``), so it would convert "78.3 GB" to the ratio 6.264e+11 and "78.3%" to
# 0.098 bytes. These units, with any prefix, are counted apart: one power of them makes bytes.
_INFORMATION = frozenset({"bit", "byte", "baud"})


class QuantityError(ValueError):
    """A threshold that cannot be read: ``what`` is wrong and, when the text itself suggests it,
    ``fix`` (how to write it; ``None`` leaves the hint to the caller, which knows the context).
    ``str()`` is ``"what; fix"``."""

    def __init__(self, what: str, fix: str | None = None) -> None:
        super().__init__(f"{what}; {fix}" if fix else what)
        self.what = what
        self.fix = fix


@functools.lru_cache(maxsize=1)
def _ureg() -> Any:
    """pint's default registry, built once per process.

    Building it parses pint's definitions file (about 0.5 s, more than the rest of a small
    ``fusebox generate``), so pint is imported only here, and the parsed definitions are cached
    in the user's cache folder (pint's ``cache_folder=":auto:"``); where that folder cannot be
    used, the registry is built without it.
    """
    import pint  # heavy: only when a quantity is parsed

    try:
        return pint.UnitRegistry(cache_folder=":auto:")
    except Exception:  # noqa: BLE001 -- an unwritable or corrupt cache must not stop the generator
        return pint.UnitRegistry()


def _tidy(x: float) -> float:
    # pint's float arithmetic leaves noise (8.7 GB/min -> 144999999.99999997); 12 significant
    # digits are far beyond any threshold people write.
    return float(f"{x:.12g}")


def parse_quantity(text: str | int | float, unit: str, *, signed: bool = False) -> float:
    """Convert a human threshold to the base-unit float for ``unit`` (a key of UNITS).

    Returns a finite value of 0 or more, in the unit's base unit (ratio 0..1, s, B, B/s); with
    ``signed`` a negative value is accepted too (a scenario's shrinking KV cache, "-40 MB/s").

    Raises:
        QuantityError: a ValueError saying what was expected, with a ``fix`` where the text
            suggests one ("write '78.3%'"). A wrong unit names what the text is ("'78.3 GB' is
            bytes (GB), not a ratio"); a text without a unit is refused for every unit but ratio
            ('50' of what?); so are a bool, a negative value, infinity, NaN and a comma ("78,3%":
            neither a decimal comma nor a thousands separator is guessed).
    """
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}; use one of {', '.join(UNITS)}")
    if isinstance(text, bool):
        raise QuantityError("a threshold must be a number or a quantity such as '78.3%'")
    value = _parse_quantity(text, unit)
    # pint reads "inf MB/s", "nan%" and "1e400 MB/s"; PromQL would compare against +Inf or NaN.
    if not math.isfinite(value):
        raise QuantityError(f"{str(text).strip()!r} is not a finite number")
    # Every unit here measures a size, a share, a latency or a growth rate: a negative threshold
    # is a sign typo ("deriv ... >= -9200000" fires on every shrinking cache too).
    if value < 0 and not signed:
        raise QuantityError(f"{str(text).strip()!r} is negative; a {unit.replace('_', ' ')} threshold is 0 or more")
    return value


@functools.lru_cache(maxsize=4096)  # specs repeat thresholds; pint takes about 1 ms per parse
def _parse_quantity(text: str | int | float, unit: str) -> float:
    if isinstance(text, str) and "," in text:
        _refuse_comma(text.strip())
    if unit == "count":
        return _parse_count(text)
    if isinstance(text, (int, float)):
        if unit != "ratio":
            example = f"'{text:g}s'" if unit == "seconds" and math.isfinite(text) else EXAMPLES[unit]
            raise QuantityError(f"a bare number is ambiguous for a {unit.replace('_', ' ')} threshold",
                                f"write it with its unit, e.g. {example}")
        value = float(text)
        if not math.isfinite(value):
            raise QuantityError(f"{text!r} is not a finite number")
        if not 0 <= value <= 1:
            raise QuantityError(f"a bare ratio must lie in 0..1 (got {value:g})",
                                f"write a percentage as '{value:g}%', or a fraction such as 0.783")
        return value
    s = str(text).strip()
    ureg = _ureg()
    from pint import DimensionalityError  # loaded by _ureg

    try:
        q = ureg.Quantity(s)
    except Exception as e:  # pint raises several error types for junk input
        raise QuantityError(f"cannot read {s!r} as a quantity ({type(e).__name__})") from None
    if unit != "ratio" and not list(q.unit_items()):  # "50" quoted: 50 what? (pint would read 6.25 bytes)
        example = f"'{s}s'" if unit == "seconds" else EXAMPLES[unit]
        raise QuantityError(f"{s!r} has no unit, which is ambiguous for a {unit.replace('_', ' ')} threshold",
                            f"write it with its unit, e.g. {example}")
    if _information_power(q) != (1 if unit in ("bytes", "bytes_per_second") else 0):
        raise _wrong_unit(s, q, unit)
    target = UNITS[unit]
    try:
        if unit == "ratio":
            if not q.dimensionless:
                raise DimensionalityError(q.units, "dimensionless")
            items = list(q.unit_items())
            if items and (len(items) > 1 or items[0][1] != 1):  # "78.3 %%" is percent squared: 0.00783
                raise QuantityError(f"{s!r} is in {format(q.units, '~')}, a share of a share, not a percentage",
                                    f"write the unit once, e.g. '{q.magnitude:g}%'")
            value = _tidy(q.to("dimensionless").magnitude)
            if not math.isfinite(value):
                raise QuantityError(f"{s!r} is not a finite number")
            if not 0 <= value <= 1:
                hint = f"write a percentage as '{s}%'" if str(q.units) == "dimensionless" else "a utilization lies in 0%..100%, e.g. '78.3%'"
                raise QuantityError(f"{s!r} is {value:g} as a ratio, outside 0..1", hint)
            return value
        return _tidy(q.to(target).magnitude)
    except DimensionalityError:
        raise _wrong_unit(s, q, unit) from None


def _information_power(q: Any) -> int:
    """The power of bits and bytes in pint quantity ``q``'s units: 1 for "2 GB" and "14.7 MB/s",
    0 for "78.3%" and "1.28s" (see :data:`_INFORMATION`)."""
    ureg = _ureg()
    return sum(exp for name, exp in q.unit_items()
               if any(base in _INFORMATION for _prefix, base, _suffix in ureg.parse_unit_name(name)))


def _wrong_unit(s: str, q: Any, unit: str) -> QuantityError:
    """The error for ``s`` (read as pint quantity ``q``) given where a ``unit`` value belongs: it
    names what ``s`` is ("'78.3 GB' is bytes (GB), not a ratio"); the caller, which knows whose
    unit it is, says how to write it."""
    symbol = format(q.units, "~")
    info, dims = _information_power(q), dict(q.dimensionality)
    is_ = {(1, ()): "bytes", (1, (("[time]", -1),)): "bytes per second", (0, (("[time]", 1),)): "seconds",
           (0, ()): "a ratio"}.get((info, tuple(sorted(dims.items()))))
    what = f"wrong unit: {s!r} is {f'{is_} ({symbol})' if is_ else f'in {symbol}'}, not {UNIT_WORDS[unit]}"
    if unit == "seconds" and dims == {"[length]": 1}:  # "3 m": pint's m is a metre, Prometheus' a minute
        what += f" ('m' is a metre here: write minutes as '{q.magnitude:g}min')"
    return QuantityError(what)


def _refuse_comma(s: str) -> None:
    """Raise for a threshold with a comma: pint drops it ("78,3%" would be 783%, "14,7 MB/s"
    147 MB/s) and float() refuses it, so neither reading is guessed."""
    whole, _, frac = s.partition(",")
    if "," not in frac and not re.match(r"\d{3}(?!\d)", frac):
        raise QuantityError(f"{s!r} has a decimal comma", f"write a decimal point: '{whole}.{frac}'")
    raise QuantityError(f"{s!r} has a comma (a thousands separator?)",
                        f"write the number without it, e.g. '{s.replace(',', '')}', and a decimal point for a fraction")


def _parse_count(text: str | int | float) -> float:
    """A count threshold: a plain number, written bare (50) or quoted ("50", "2.5", "1e3")."""
    if isinstance(text, (int, float)):
        return float(text)
    s = str(text).strip()
    try:
        return float(s.replace("_", ""))
    except ValueError:
        raise QuantityError(f"{s!r} is not a plain number; a count threshold has no unit (requests, items)",
                            "write a plain number, e.g. 50 (a kind: rate signal's is per second: 0.1 is six a minute)") from None


_DUR = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?\Z")
_DUR_MS = (365 * 86400_000, 7 * 86400_000, 86400_000, 3600_000, 60_000, 1000, 1)
# Prometheus and Alertmanager hold durations as Go's time.Duration, int64 nanoseconds;
# prometheus/common model.ParseDuration (model/time.go) answers "duration out of range" past
# 1<<63 - 1 ns: 106751d23h47m16s854ms, about 292 years. Larger ones pass here but fail promtool.
MAX_DURATION_NS = (1 << 63) - 1


def parse_duration(text: str | int) -> float:
    """Parse a Prometheus duration ("30s", "1m", "1h30m", "0s") into seconds.

    Raises:
        ValueError: for anything Prometheus itself would reject, including a duration over
            :data:`MAX_DURATION_NS` (about 292 years).
    """
    if isinstance(text, bool):  # str(True) would read as "True"; say what it is instead
        raise ValueError(f"{text!r} is a YAML boolean, not a duration")
    s = str(text).strip()
    m = _DUR.match(s)
    if not s or not m or not any(m.groups()):
        if s == "0":
            return 0.0
        raise ValueError(f"{s!r} is not a Prometheus duration (e.g. '30s', '5m', '1h30m')")
    ms = sum(int(g) * f for g, f in zip(m.groups(), _DUR_MS, strict=False) if g)
    if ms * 1_000_000 > MAX_DURATION_NS:
        raise ValueError(f"{s!r} is out of range: Prometheus durations end at 106751d23h47m16s854ms, about 292 years")
    return ms / 1000


def is_duration(value: object) -> bool:
    """Whether ``value`` parses as a Prometheus duration (:func:`parse_duration`); for checks that
    follow a parser which has already reported a malformed one."""
    try:
        parse_duration(value)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True


def format_duration(seconds: float) -> str:
    """Seconds -> the shortest Prometheus duration string ("90" -> "1m30s")."""
    ms = int(round(seconds * 1000))
    if ms == 0:
        return "0s"
    out = ""
    for unit, f in zip(("y", "w", "d", "h", "m", "s", "ms"), _DUR_MS, strict=False):
        if unit in ("y", "w"):
            continue
        n, ms = divmod(ms, f)
        if n:
            out += f"{n}{unit}"
    return out


def format_number(x: float) -> str:
    """A float as PromQL/YAML writes it: no float noise, integers without '.0'; "+Inf", "-Inf" and
    "NaN" as PromQL spells them (a validated spec never needs them, but a scale near 0 can)."""
    if not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("+Inf" if x > 0 else "-Inf")
    x = _tidy(x)
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else repr(x)


def humanize(value: float, unit: str) -> str:
    """A base-unit value as people write it, for annotations and runbooks."""
    if unit == "ratio":
        return f"{format_number(value * 100)}%"
    if unit == "seconds":
        return f"{format_number(value)}s"
    if unit == "count":
        return format_number(value)
    for div, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B")):
        if abs(value) >= div:
            suffix = "/s" if unit == "bytes_per_second" else ""
            return f"{format_number(value / div)} {name}{suffix}"
    return f"{format_number(value)} B" + ("/s" if unit == "bytes_per_second" else "")


def reject_bool(value: object) -> object:
    """A pydantic "before" check for number-like fields: YAML 1.1 reads yes/no/on/off/true/false
    as booleans, and a bool is an int to Python, so ``threshold: yes`` would become ``>= 1``.

    Raises:
        ValueError: for a bool, with the fix after " -- ".
    """
    if isinstance(value, bool):
        raise ValueError(f"a YAML boolean ({str(value).lower()}: yes/no and on/off read as booleans too) where a number "
                         "belongs -- write the number with its unit, e.g. '78.3%' or '5m'; quote the word if you mean text")
    return value
