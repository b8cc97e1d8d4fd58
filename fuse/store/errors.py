"""The store's errors and the label it shows for a URL (no password).

:class:`StoreError` -- the database cannot be written or reached (a retry may help);
:class:`NoStoreError` -- a command that reads an existing store found none;
:func:`store_label` -- a store URL fit for logs, errors and ``/readyz``.
"""

from __future__ import annotations

import re

from ..logsafe import redact_url

# the end of every "no fuse store" error: where the commands take the store from
NO_STORE_HINT = "-- check --store/--state/--state-dir"


class StoreError(RuntimeError):
    """The database could not be written or reached (disk full, locked, read-only, the server
    down): a retry may help."""


class NoStoreError(StoreError):
    """A command that reads an existing store (``fusebox fuse audit``) found none where it was
    pointed: no SQLite file there, or a database without the fuse's schema. Nothing was created."""


def store_label(url: str) -> str:
    """``url`` without its password, for logs, errors, ``/readyz`` and the start-up line: a URL as
    :func:`fusebox.fuse.logsafe.redact_url` (``postgresql://user:PASSWORD@host/db`` -> ``user@host``,
    ``?password=`` -> ``?password=***``); a libpq key/value string (``host=... password=...``) has
    its ``password`` value hidden."""
    if "://" not in url:
        return re.sub(r"(?i)\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S*)", "password=***", url) if "=" in url else url
    return redact_url(url)
