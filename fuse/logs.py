"""Logging of ``fusebox fuse serve``: text (the default) or one JSON object per line (``--log-format json``).
Every line has the credentials of its URLs left out (:class:`fusebox.fuse.logsafe.RedactUrls`).

A JSON line holds ``time`` (UTC ISO-8601, milliseconds), ``level`` (``info``, ``warning``...),
``logger``, ``message`` and, when the record carries them (``extra=``), the structured fields of
:data:`FIELDS`: ``decision_id``, ``scope`` (the scope key), ``action``, ``fuse_level`` (the fuse
level), ``state`` (trip/release), ``source``, ``adapter``, ``attempt``; a traceback goes in ``exc``.
Log shippers (Loki, the OTel Collector's filelog receiver, Elasticsearch) read it without a parser.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from .logsafe import RedactUrls

__all__ = ["FIELDS", "JsonFormatter", "setup", "TEXT_FORMAT", "json_line"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Structured fields a record may carry (``log.info(..., extra={"decision_id": ...})``).
FIELDS = ("decision_id", "scope", "action", "fuse_level", "state", "source", "adapter", "attempt")


def _time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_line(level: str, logger: str, message: str, t: float | None = None, **fields: Any) -> str:
    """One JSON log line (no newline) with the fields :class:`JsonFormatter` writes."""
    import time

    doc = {"time": _time(time.time() if t is None else t), "level": level, "logger": logger, "message": message}
    doc.update({k: v for k, v in fields.items() if v is not None})
    return json.dumps(doc, ensure_ascii=False, default=str)


class JsonFormatter(logging.Formatter):
    """A record as one JSON object on one line (control characters escaped by JSON itself)."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: getattr(record, k) for k in FIELDS if getattr(record, k, None) is not None}
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        return json_line(record.levelname.lower(), record.name, record.getMessage(), record.created, **fields)


def setup(level: str = "info", fmt: str = "text", stream=None) -> None:
    """Configure the root logger once: ``level`` (debug, info, warning, error), ``fmt`` text or json,
    to ``stream`` (default stderr). Replaces handlers set before (a second call reconfigures)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RedactUrls())  # no URL credential in any line, whichever library logged it
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
