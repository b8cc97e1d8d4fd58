"""Alertmanager webhook payloads (versions 0, 3 and 4) to plain :class:`AlertEvent` values.

Alertmanager's webhook notifier sends ``{"version": "4", "status", "alerts": [...],
"groupKey", "truncatedAlerts", ...}`` (notify/webhook/webhook.go). Older senders and hand-made
payloads differ: version 0 and 3 have no ``fingerprint``; some alerts carry no ``status``
(then it is derived from ``endsAt``, as Alertmanager itself does); ``version`` and
``groupKey`` may be integers. Unknown fields are ignored. What cannot be used (no alerts list,
an alert without labels or without ``startsAt``) raises :class:`PayloadError`, which the HTTP
layer turns into a 400 that changes nothing. An alert with a label name or value over
:data:`MAX_LABEL_VALUE` characters costs only itself: it is set apart in
:attr:`Notification.refused` (never trips or releases anything) and the rest of the notification
is used (Alertmanager does not retry a 4xx, so one bad alert must not silence the others).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["AlertEvent", "Notification", "PayloadError", "parse_payload", "load_json", "fingerprint", "parse_time",
           "storable", "NOT_STORABLE", "MAX_LABEL_VALUE", "Refused"]

# Alertmanager's model.SeparatorByte and FNV-1a 64 (prometheus/common model/signature.go).
_SEP = b"\xff"
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_ZERO_YEAR = 1  # Go's zero time, "0001-01-01T00:00:00Z": "no end known"
# The externalURL is a label value of the fuse's last-notification gauge: bounded, so a sender
# cannot grow /metrics without limit (one series per distinct value).
MAX_EXTERNAL_URL = 512
# Longest label name or value of an alert (and of an override scope), characters. Host names are at
# most 253 characters (RFC 1035), GPU UUIDs 40; the cap bounds what one alert can make the state and
# the page hold. An alert over it is refused alone (:class:`Refused`).
MAX_LABEL_VALUE = 256


class PayloadError(ValueError):
    """The payload cannot be used; the message says which field and why."""


@dataclass(frozen=True)
class AlertEvent:
    """One alert of a notification.

    ``starts_at``/``ends_at`` are Unix seconds (``ends_at`` None when Go's zero time);
    ``fingerprint`` is the one Alertmanager sent, or the one it would have computed.
    """

    status: str  # "firing" | "resolved"
    labels: dict[str, str]
    fingerprint: str
    starts_at: float
    ends_at: float | None


@dataclass(frozen=True)
class Refused:
    """An alert refused alone (it changes nothing): ``result`` names why (``label_too_long``),
    ``reason`` says it for the audit and the log (the label's name, cut, and its length: never the
    value). ``starts_at`` is Unix seconds: with ``fingerprint`` it names the alert's episode."""

    fingerprint: str
    alertname: str
    starts_at: float
    result: str
    reason: str


@dataclass(frozen=True)
class Notification:
    version: str
    status: str
    group_key: str
    receiver: str
    truncated_alerts: int
    alerts: tuple[AlertEvent, ...]
    external_url: str = ""  # the sending Alertmanager's externalURL ("" when the payload has none)
    refused: tuple[Refused, ...] = ()  # alerts refused alone (not in ``alerts``)


def fingerprint(labels: dict[str, str]) -> str:
    """Alertmanager's alert fingerprint: FNV-1a 64 over sorted ``name 0xff value 0xff``, as %016x."""
    h = _FNV_OFFSET
    for name in sorted(labels):
        for chunk in (name.encode(), _SEP, str(labels[name]).encode(), _SEP):
            for b in chunk:
                h ^= b
                h = (h * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def parse_time(value: Any, where: str) -> float | None:
    """RFC 3339 with 0-9 fractional digits and Z or an offset -> Unix seconds; Go's zero time -> None."""
    if not isinstance(value, str) or not value:
        raise PayloadError(f"{where}: expected an RFC 3339 time string, got {value!r}")
    s = value.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    # Python parses at most 6 fractional digits; Go writes up to 9.
    head, dot, rest = s.partition(".")
    if dot:
        n = 0
        while n < len(rest) and rest[n].isdigit():
            n += 1
        digits, tz = rest[:n], rest[n:]
        s = f"{head}.{digits[:6].ljust(6, '0')}{tz}"
    try:
        t = datetime.fromisoformat(s)
    except ValueError:
        raise PayloadError(f"{where}: {value!r} is not an RFC 3339 time") from None
    if t.year <= _ZERO_YEAR:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


# Why a string is refused by :func:`storable`, for error messages.
NOT_STORABLE = "not valid Unicode text (it holds a lone surrogate such as \\udfff, which UTF-8 cannot encode)"


def storable(text: str) -> bool:
    """Whether ``text`` can be stored and answered: encodable as UTF-8, i.e. no lone surrogate.

    JSON may carry ``"\\udfff"``, which Python decodes to a lone surrogate; SQLite, the status page
    and JSON answers then fail with UnicodeEncodeError, so such text is refused at the door.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _kind(value: Any) -> str:
    """A JSON value's type in JSON's words (for messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return type(value).__name__


def _str_dict(value: Any, where: str) -> dict[str, str]:
    """Labels: an object whose names and values are strings (Alertmanager's model.LabelSet). A value
    that is not a string is refused, never stringified: ``{"a": [1, 2]}`` would otherwise become the
    scope ``hw_id="{'a': [1, 2]}"``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PayloadError(f"{where}: expected an object of strings")
    for k, v in value.items():
        if not isinstance(k, str) or not storable(k):
            raise PayloadError(f"{where}: a label name is {NOT_STORABLE if isinstance(k, str) else _kind(k)}")
        if not isinstance(v, str):
            raise PayloadError(f"{where}.{k}: label values are strings (as Alertmanager sends them), got {_kind(v)}")
        if not storable(v):
            raise PayloadError(f"{where}.{k}: the value is {NOT_STORABLE}")
    return dict(value)


def load_json(body: bytes | str) -> Any:
    """Decode a JSON request body.

    Raises:
        PayloadError: not JSON, not UTF-8, or nested deeper than Python's recursion limit
            (json's decoder recurses per level; a 200 KB ``[[[[...]]]]`` would raise RecursionError).
    """
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise PayloadError(f"body is not JSON: {e}") from None
    except RecursionError:
        raise PayloadError("body is not usable JSON: nested too deeply") from None


def parse_payload(body: bytes | str | dict, now: float) -> Notification:
    """Parse a webhook body.

    Args:
        body: the raw request body (JSON) or an already decoded object.
        now: Unix seconds, used to derive a missing per-alert status from ``endsAt``.

    Raises:
        PayloadError: malformed or too deeply nested JSON, no ``alerts`` list, an alert without labels, alertname or
            startsAt, a label value that is not a string, text with a lone surrogate (:func:`storable`), or an
            unknown status.
    """
    if isinstance(body, (bytes, str)):
        data = load_json(body)
    else:
        data = body
    if not isinstance(data, dict):
        raise PayloadError("body must be a JSON object (Alertmanager webhook payload)")
    alerts_raw = data.get("alerts")
    if not isinstance(alerts_raw, list):
        raise PayloadError("'alerts' must be a list")
    group_status = data.get("status")
    if group_status is not None and group_status not in ("firing", "resolved"):
        raise PayloadError(f"'status' must be 'firing' or 'resolved', got {group_status!r}")
    truncated = data.get("truncatedAlerts", 0) or 0
    if not isinstance(truncated, int) or isinstance(truncated, bool) or truncated < 0:
        raise PayloadError("'truncatedAlerts' must be a non-negative integer")
    out, refused = [], []
    for i, a in enumerate(alerts_raw):
        where = f"alerts[{i}]"
        if not isinstance(a, dict):
            raise PayloadError(f"{where}: expected an object")
        labels = _str_dict(a.get("labels"), f"{where}.labels")
        if "alertname" not in labels:
            raise PayloadError(f"{where}.labels: no 'alertname'")
        starts = parse_time(a.get("startsAt"), f"{where}.startsAt")
        if starts is None:
            raise PayloadError(f"{where}.startsAt: zero time")
        ends = parse_time(a["endsAt"], f"{where}.endsAt") if a.get("endsAt") else None
        status = a.get("status")
        if status is None:
            # Alertmanager: resolved when endsAt is set and not after now (types.Alert.Resolved).
            status = "resolved" if ends is not None and ends <= now else "firing"
        if status not in ("firing", "resolved"):
            raise PayloadError(f"{where}.status must be 'firing' or 'resolved', got {status!r}")
        fp = a.get("fingerprint")
        if isinstance(fp, str) and not storable(fp):
            raise PayloadError(f"{where}.fingerprint: {NOT_STORABLE}")
        if not isinstance(fp, str) or not fp:
            fp = fingerprint(labels)
        too_long = _too_long(labels)
        if too_long:
            refused.append(Refused(fp[:64], labels["alertname"][:MAX_LABEL_VALUE], starts, "label_too_long",
                                   f"{where} ({fp[:64]}) refused: {too_long}"))
            continue
        out.append(AlertEvent(status, labels, fp, starts, ends))
    group_key, receiver = str(data.get("groupKey", "")), str(data.get("receiver") or "")
    external_url = str(data.get("externalURL") or "")[:MAX_EXTERNAL_URL]
    for name, text in (("groupKey", group_key), ("receiver", receiver), ("externalURL", external_url)):
        if not storable(text):
            raise PayloadError(f"'{name}' is {NOT_STORABLE}")
    return Notification(
        version=str(data.get("version", "")), status=str(group_status or ""),
        group_key=group_key, receiver=receiver,
        truncated_alerts=truncated, alerts=tuple(out), external_url=external_url, refused=tuple(refused),
    )


def _too_long(labels: dict[str, str]) -> str:
    """What is over :data:`MAX_LABEL_VALUE` in ``labels`` (its name cut to 64 characters, and the
    length: never the value), or ``""``."""
    for k, v in labels.items():
        if len(k) > MAX_LABEL_VALUE:
            return f"a label name of {len(k)} characters ({k[:64]!r}...), over {MAX_LABEL_VALUE}"
        if len(v) > MAX_LABEL_VALUE:
            return f"label {k[:64]!r} has a value of {len(v)} characters, over {MAX_LABEL_VALUE}"
    return ""
