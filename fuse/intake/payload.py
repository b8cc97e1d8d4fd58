"""Alertmanager webhook payloads (versions 0, 3 and 4) to plain :class:`AlertEvent` values.

Alertmanager's webhook notifier sends ``{"version": "4", "status", "alerts": [...],
"groupKey", "truncatedAlerts", ...}`` (notify/webhook/webhook.go). Older senders and hand-made
payloads differ: version 0 and 3 have no ``fingerprint``; some alerts carry no ``status``
(then it is derived from ``endsAt``, as Alertmanager itself does); ``version`` and
``groupKey`` may be integers. Unknown fields are ignored. The body is validated once, by
:class:`fusebox.fuse.intake.webhook.WebhookPayload` (the HTTP route's model, or
:func:`parse_payload` for a raw body); :func:`notification` turns a valid one into
:class:`Notification`. What cannot be used (no alerts list, an alert without ``alertname`` or
without an RFC 3339 ``startsAt``) raises :class:`PayloadError` (or, at the HTTP route, the
model's own 400), which changes nothing. An alert with a label name or value over
:data:`MAX_LABEL_VALUE` characters costs only itself: it is set apart in
:attr:`Notification.refused` (never trips or releases anything) and the rest of the notification
is used (Alertmanager does not retry a 4xx, so one bad alert must not silence the others).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError

from .webhook import MAX_LABEL_VALUE, NOT_STORABLE, WebhookPayload, storable

__all__ = ["AlertEvent", "Notification", "PayloadError", "parse_payload", "notification", "load_json", "fingerprint",
           "parse_time", "Refused"]

# Alertmanager's model.SeparatorByte and FNV-1a 64 (prometheus/common model/signature.go).
_SEP = b"\xff"
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_ZERO_YEAR = 1  # Go's zero time, "0001-01-01T00:00:00Z": "no end known"
# The externalURL is a label value of the fuse's last-notification gauge: bounded, so a sender
# cannot grow /metrics without limit (one series per distinct value).
MAX_EXTERNAL_URL = 512


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


def parse_payload(body: bytes | str | Mapping[str, Any], now: float) -> Notification:
    """Parse a webhook body: JSON (or an already decoded object) validated by
    :class:`~fusebox.fuse.intake.webhook.WebhookPayload`, then :func:`notification`.

    Args:
        body: the raw request body (JSON) or an already decoded object.
        now: Unix seconds, used to derive a missing per-alert status from ``endsAt``.

    Raises:
        PayloadError: malformed or too deeply nested JSON, not a notification (no ``alerts`` list, a
            label value that is not a string, text with a lone surrogate, an unknown status...: the
            first problem the model finds, in the words below), or what :func:`notification` refuses.
    """
    data = load_json(body) if isinstance(body, (bytes, str)) else body
    try:
        model = _PAYLOAD.validate_python(data)
    except ValidationError as e:
        raise _payload_error(e.errors()[0]) from None
    return notification(model, now)


def notification(model: WebhookPayload, now: float) -> Notification:
    """The typed notification of a valid webhook body (what ``POST /alertmanager`` validated).

    Raises:
        PayloadError: an alert without ``alertname`` or whose ``startsAt``/``endsAt`` is not an RFC 3339
            time (``startsAt`` not Go's zero time either), or ``groupKey``/``receiver``/``externalURL``
            holding a lone surrogate.
    """
    out, refused = [], []
    for i, a in enumerate(model.alerts):
        where = f"alerts[{i}]"
        labels = dict(a.labels)
        if "alertname" not in labels:
            raise PayloadError(f"{where}.labels: no 'alertname'")
        starts = parse_time(a.startsAt, f"{where}.startsAt")
        if starts is None:
            raise PayloadError(f"{where}.startsAt: zero time")
        ends = parse_time(a.endsAt, f"{where}.endsAt") if a.endsAt else None
        # Alertmanager: resolved when endsAt is set and not after now (types.Alert.Resolved).
        status = a.status or ("resolved" if ends is not None and ends <= now else "firing")
        fp = a.fingerprint or fingerprint(labels)
        too_long = _too_long(labels)
        if too_long:
            refused.append(Refused(fp[:64], labels["alertname"][:MAX_LABEL_VALUE], starts, "label_too_long",
                                   f"{where} ({fp[:64]}) refused: {too_long}"))
            continue
        out.append(AlertEvent(status, labels, fp, starts, ends))
    group_key, receiver = str(model.groupKey), str(model.receiver or "")
    external_url = str(model.externalURL or "")[:MAX_EXTERNAL_URL]
    for name, text in (("groupKey", group_key), ("receiver", receiver), ("externalURL", external_url)):
        if not storable(text):
            raise PayloadError(f"'{name}' is {NOT_STORABLE}")
    return Notification(
        version=str(model.version), status=str(model.status or ""), group_key=group_key, receiver=receiver,
        truncated_alerts=model.truncatedAlerts, alerts=tuple(out), external_url=external_url, refused=tuple(refused),
    )


_PAYLOAD = TypeAdapter(WebhookPayload)


def _payload_error(err: Mapping[str, Any]) -> PayloadError:
    """The model's first problem with a body (a pydantic error: ``loc``, ``type``, ``input``) in the
    words the fuse has always used for it."""
    loc, value, kind = tuple(err["loc"]), err.get("input"), err["type"]
    if not loc:
        return PayloadError("body must be a JSON object (Alertmanager webhook payload)")
    head = loc[0]
    if head == "alerts" and len(loc) == 1:
        return PayloadError("'alerts' must be a list")
    if head == "status":
        return PayloadError(f"'status' must be 'firing' or 'resolved', got {value!r}")
    if head == "truncatedAlerts":
        return PayloadError("'truncatedAlerts' must be a non-negative integer")
    if head != "alerts":
        return PayloadError(f"'{head}': {err['msg']}")
    where, field = f"alerts[{loc[1]}]", loc[2] if len(loc) > 2 else None
    if field is None:
        return PayloadError(f"{where}: expected an object")
    if field == "labels":
        return _labels_error(where, loc[3:], value, kind)
    if field in ("startsAt", "endsAt"):
        return PayloadError(f"{where}.{field}: expected an RFC 3339 time string, got {value!r}")
    if field == "status":
        return PayloadError(f"{where}.status must be 'firing' or 'resolved', got {value!r}")
    if field == "fingerprint" and kind == "value_error":
        return PayloadError(f"{where}.fingerprint: {NOT_STORABLE}")
    return PayloadError(f"{where}.{field}: {err['msg']}")


def _labels_error(where: str, rest: tuple, value: Any, kind: str) -> PayloadError:
    """:func:`_payload_error` of an alert's ``labels`` (``rest``: the path below them)."""
    if not rest:
        return PayloadError(f"{where}.labels: expected an object of strings")
    name = rest[0]
    if len(rest) > 1 and rest[1] == "[key]":
        return PayloadError(f"{where}.labels: a label name is {NOT_STORABLE if kind == 'value_error' else _kind(value)}")
    if kind == "value_error":
        return PayloadError(f"{where}.labels.{name}: the value is {NOT_STORABLE}")
    return PayloadError(f"{where}.labels.{name}: label values are strings (as Alertmanager sends them), got {_kind(value)}")


def _too_long(labels: dict[str, str]) -> str:
    """What is over :data:`MAX_LABEL_VALUE` in ``labels`` (its name cut to 64 characters, and the
    length: never the value), or ``""``."""
    for k, v in labels.items():
        if len(k) > MAX_LABEL_VALUE:
            return f"a label name of {len(k)} characters ({k[:64]!r}...), over {MAX_LABEL_VALUE}"
        if len(v) > MAX_LABEL_VALUE:
            return f"label {k[:64]!r} has a value of {len(v)} characters, over {MAX_LABEL_VALUE}"
    return ""
