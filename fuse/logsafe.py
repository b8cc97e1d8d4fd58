"""Log lines that carry outside text (label values, override reasons, gateway answers) safely.

Label values and reasons come from whoever reaches Alertmanager's API or holds a token. A newline
in one would start a forged log line; ``\\r`` or an ANSI escape would rewrite the terminal showing
the log. :class:`EscapeControl` rewrites each record's message with every control character
escaped (``\\n``, ``\\r``, ``\\t``, ``\\x1b``, ``\\u2028``...), so one record is one line. Traceback
text, added by the formatter after the message, is left as it is.
"""

from __future__ import annotations

import logging
import re

__all__ = ["escape_control", "EscapeControl", "install"]

# C0, DEL, C1, and the Unicode line and paragraph separators (some viewers break lines on them).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _esc(m: re.Match) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def escape_control(text: str) -> str:
    """``text`` with each control character written as an escape: ``"a\\nb"`` -> ``"a\\\\nb"``."""
    return _CONTROL.sub(_esc, text)


class EscapeControl(logging.Filter):
    """Formats the record's message once, escapes it, and stores it back (``args`` emptied)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a bad format string: let logging report it as it always does
            return True
        record.msg, record.args = escape_control(msg), None
        return True


_FILTER = EscapeControl()


def install(logger: logging.Logger) -> logging.Logger:
    """Add the filter to ``logger`` (once) and return it. Filters of a logger apply to the records
    it creates itself, so each fuse module installs it on the logger it logs with."""
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
