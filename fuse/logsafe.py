"""Log lines that carry outside text (label values, override reasons, gateway answers) safely.

Label values and reasons come from whoever reaches Alertmanager's API or holds a token. A newline
in one would start a forged log line; ``\\r`` or an ANSI escape would rewrite the terminal showing
the log. :class:`EscapeControl` rewrites each record's message with every control character
escaped (``\\n``, ``\\r``, ``\\t``, ``\\x1b``, ``\\u2028``...), so one record is one line. Traceback
text, added by the formatter after the message, is left as it is. Format characters (Unicode
category Cf: the bidi embeddings, overrides and isolates U+202A-202E and U+2066-2069, the
zero-width U+200B-200F, U+FEFF, the tag characters ...) are escaped too (``\\u202e``,
``\\U000e0041``): shown raw, a right-to-left override makes ``evil\\u202efdp.exe`` read as
``evilexe.pdf`` and a zero-width space makes two different label values look the same, in the log and
on the status page (:mod:`fusebox.fuse.http.status` writes every cell through :func:`escape_control`).

Credentials: :func:`redact_url` leaves a URL's password (and, but for a database URL, its whole
userinfo: ``https://TOKEN@host``) and the values of secret query parameters (``?token=``,
``?password=``, ``?api_key=``...) out; :func:`redact_urls` does it to every URL in a text. The log
filter applies it to every message, :class:`fusebox.fuse.adapters.protocol.ActionError` to its message and the
store to every audit row, so no URL credential reaches the log, the audit or the start-up line.
"""

from __future__ import annotations

import logging
import re
import unicodedata

__all__ = ["escape_control", "EscapeControl", "RedactUrls", "install", "redact_url", "redact_urls"]

# C0, DEL, C1, and the Unicode line and paragraph separators (some viewers break lines on them).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# Beyond ASCII, a character is escaped when its Unicode category is one of these: control (Cc),
# format (Cf: bidi controls, zero-width characters, tags), surrogate (Cs: a lone one cannot be
# written as UTF-8), line and paragraph separator (Zl, Zp).
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NON_ASCII = re.compile("[^\x00-\x7f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _esc(m: re.Match) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _esc_unicode(m: re.Match) -> str:
    c = m.group()
    return _esc(m) if unicodedata.category(c) in _ESCAPED_CATEGORIES else c


# Query parameters whose values are secrets (compared in lower case, "-" read as "_").
SECRET_PARAMS = frozenset({"password", "passwd", "pwd", "pass", "token", "access_token", "id_token", "refresh_token",
                           "auth", "authorization", "api_key", "apikey", "key", "secret", "client_secret",
                           "signature", "sig", "x_amz_signature", "x_amz_security_token", "credential", "credentials"})
# URL schemes whose user name is no secret (a database role); others lose the whole userinfo.
_USER_SCHEMES = ("postgresql", "postgres", "sqlite", "mysql")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>`]+")
HIDDEN = "***"


def redact_url(url: str) -> str:
    """``url`` without credentials, for logs, errors, the audit and the start-up line.

    ``scheme://user:password@host`` -> ``scheme://host`` (a database URL keeps ``user@``),
    ``https://TOKEN@host`` -> ``https://host``, ``?token=abc&x=1`` -> ``?token=***&x=1`` (any name of
    :data:`SECRET_PARAMS`). Text without ``://`` comes back unchanged.
    """
    if "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    if "@" in netloc:
        creds, _, host = netloc.rpartition("@")
        user = creds.split(":", 1)[0]
        netloc = f"{user}@{host}" if user and scheme.lower() in _USER_SCHEMES else host
    path, qmark, query = tail.partition("?")
    if qmark:
        query, hash_, frag = query.partition("#")
        parts = []
        for p in query.split("&"):
            name, eq, _ = p.partition("=")
            secret = name.lower().replace("-", "_") in SECRET_PARAMS
            parts.append(f"{name}={HIDDEN}" if secret and eq else p)
        path += "?" + "&".join(parts) + hash_ + frag
    return f"{scheme}://{netloc}{path}"


def redact_urls(text: str) -> str:
    """``text`` with :func:`redact_url` applied to every URL in it (``scheme://`` up to a space or quote)."""
    return _URL.sub(_redact_match, text) if "://" in text else text


def _redact_match(m: re.Match) -> str:
    url = m.group()
    tail = len(url) - len(url.rstrip(".,:;)]}"))  # punctuation after a URL is the text's, not the URL's
    return redact_url(url[:len(url) - tail]) + url[len(url) - tail:]


def escape_control(text: str) -> str:
    """``text`` with each control and format character written as an escape: ``"a\\nb"`` ->
    ``"a\\\\nb"``, ``"a\\u202eb"`` -> ``"a\\\\u202eb"`` (categories :data:`_ESCAPED_CATEGORIES`; other
    letters, marks and symbols of any script stay as they are)."""
    text = _CONTROL.sub(_esc, text)
    return text if text.isascii() else _NON_ASCII.sub(_esc_unicode, text)


class EscapeControl(logging.Filter):
    """Formats the record's message once, escapes it, leaves URL credentials out
    (:func:`redact_urls`), and stores it back (``args`` emptied)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a bad format string: let logging report it as it always does
            return True
        record.msg, record.args = escape_control(redact_urls(msg)), None
        return True


class RedactUrls(logging.Filter):
    """For a handler: every record it writes, whoever logged it (httpx logs each request's URL at
    INFO), has the credentials of its URLs left out (:func:`redact_urls`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a bad format string: let logging report it as it always does
            return True
        if "://" in msg:
            record.msg, record.args = redact_urls(msg), None
        return True


_FILTER = EscapeControl()


def install(logger: logging.Logger) -> logging.Logger:
    """Add the filter to ``logger`` (once) and return it. Filters of a logger apply to the records
    it creates itself, so each fuse module installs it on the logger it logs with."""
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
