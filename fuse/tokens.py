"""Bearer tokens of the fuse service: one for machines, one per person, one optional for readers.

==============  =========================  ==================================================
Role            File (``fusebox fuse serve``)   May
==============  =========================  ==================================================
webhook         ``--webhook-token-file``   ``POST /alertmanager`` (Alertmanager's
                (alias ``--token-file``)   ``credentials_file``); reads too when no read token
people          ``--override-tokens``      ``POST /override`` (audited under the person's name)
                                           and read
read            ``--read-token-file``      ``GET /state``, ``GET /``, ``GET /openapi.json``
==============  =========================  ==================================================

File formats:

* a token file (webhook, read) is its whole content with surrounding whitespace stripped, as
  Alertmanager reads ``credentials_file``; it must be one line without inner whitespace.
* the people file has one ``NAME TOKEN`` pair per line (separated by spaces or tabs); blank lines
  and lines starting with ``#`` are ignored. Names and tokens are unique; a token equal to the
  webhook or read token is refused, so the roles stay apart.

:class:`TokenFiles` reads them again when one changes (size, mtime or inode) and on
:meth:`TokenFiles.reload` (SIGHUP); a file that became unreadable or malformed keeps the last good
tokens, with an error in the log.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .logsafe import install

log = install(logging.getLogger("fusebox.fuse"))

__all__ = ["Tokens", "TokenFiles", "read_token_file", "read_people_file", "permission_warnings", "match"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$")


@dataclass(frozen=True)
class Tokens:
    """The tokens in force. ``people``: name -> token; ``read``: None when not configured.

    Raises ValueError when a token is empty or one token serves two roles.
    """

    webhook: str
    people: dict = field(default_factory=dict)
    read: Optional[str] = None

    def __post_init__(self):
        if not self.webhook:
            raise ValueError("an empty webhook token would let anyone trip fuses")
        others = {"webhook": self.webhook, **({"read": self.read} if self.read else {})}
        for name, tok in self.people.items():
            if not tok:
                raise ValueError(f"override token of {name!r} is empty")
            for role, t in others.items():
                if hmac.compare_digest(tok.encode(), t.encode()):
                    raise ValueError(f"override token of {name!r} is the {role} token; give each role its own")
        if self.read is not None and (not self.read or self.read == self.webhook):
            raise ValueError("the read token must be non-empty and differ from the webhook token")

    def current(self) -> "Tokens":
        return self


def match(presented: Optional[str], tokens: dict[str, str]) -> Optional[str]:
    """The name in ``tokens`` (name -> token) whose token equals ``presented``, else None.

    Every token is compared, each in constant time (:func:`hmac.compare_digest`), so the time taken
    does not say which one, or how much of one, matched.
    """
    given = (presented or "").encode()
    found = None
    for name, tok in tokens.items():
        if hmac.compare_digest(given, tok.encode()) and found is None:
            found = name
    return found if presented else None


def read_token_file(path: str | os.PathLike) -> str:
    """The token in ``path``: the whole file, surrounding whitespace stripped.

    Raises:
        OSError: unreadable. ValueError: empty, more than one line, or whitespace inside the token.
    """
    text = Path(path).read_text(encoding="utf-8").strip()
    if not text:
        raise ValueError(f"{path}: empty token file")
    if "\n" in text or "\r" in text:
        raise ValueError(f"{path}: a token file holds one line (the token), this one has more")
    if any(c.isspace() for c in text):
        raise ValueError(f"{path}: the token contains whitespace")
    return text


def read_people_file(path: str | os.PathLike) -> dict[str, str]:
    """``{name: token}`` from a file of ``NAME TOKEN`` lines (``#`` comments and blank lines ignored).

    Raises:
        OSError: unreadable. ValueError: a line that is not two fields, a bad or repeated name, a
            repeated token, or no token at all; the message names the line.
    """
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}: line {n}: expected NAME TOKEN, got {len(parts)} field(s)")
        name, tok = parts
        if not _NAME.match(name):
            raise ValueError(f"{path}: line {n}: name {name[:64]!r}: use letters, digits and . _ @ + - (at most 64)")
        if name in out:
            raise ValueError(f"{path}: line {n}: {name} appears twice")
        if tok in seen:
            raise ValueError(f"{path}: line {n}: the same token as {seen[tok]}; give each person their own")
        out[name], seen[tok] = tok, name
    if not out:
        raise ValueError(f"{path}: no token (expected NAME TOKEN lines)")
    return out


def permission_warnings(paths) -> list[str]:
    """One line per existing file of ``paths`` that others may read (mode & 0o004), or its group
    (mode & 0o040) when that group is not one of this process's own: a Kubernetes Secret volume is
    mounted ``root:<fsGroup>`` mode 0440 for a non-root pod, readable through the pod's own
    supplementary group and nobody else's, which is as private as 0600."""
    out = []
    own = {os.getegid(), *os.getgroups()}
    for p in paths:
        if p is None:
            continue
        try:
            st = os.stat(p)
        except OSError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o004 or (mode & 0o040 and st.st_gid not in own):
            out.append(f"{p} is readable by group or others (mode {mode:04o}); chmod 600 it")
    return out


def _stamp(path) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class TokenFiles:
    """Tokens read from files, read again when a file changes or on :meth:`reload`.

    Args:
        webhook: the webhook token file (required).
        people: the people file (``NAME TOKEN`` lines), or None: no one may override.
        read: the read token file, or None: the webhook token reads.

    Raises (at construction): OSError, ValueError, as :func:`read_token_file`, :func:`read_people_file`
    and :class:`Tokens`.
    """

    def __init__(self, webhook, people=None, read=None):
        self.paths = {"webhook": webhook, "people": people, "read": read}
        self._lock = threading.RLock()  # reentrant: SIGHUP's handler may run while the main thread holds it
        self._stamps = self._all_stamps()
        self._tokens = self._load()

    def _all_stamps(self) -> dict:
        return {k: _stamp(p) for k, p in self.paths.items() if p is not None}

    def _load(self) -> Tokens:
        p = self.paths
        return Tokens(webhook=read_token_file(p["webhook"]),
                      people=read_people_file(p["people"]) if p["people"] is not None else {},
                      read=read_token_file(p["read"]) if p["read"] is not None else None)

    def current(self) -> Tokens:
        """The tokens in force, read again first when a file's size, mtime or inode changed."""
        if self._all_stamps() != self._stamps:
            self.reload()
        return self._tokens

    def reload(self) -> bool:
        """Read every file again. True when the new tokens are in force; False when a file is
        unreadable or malformed (logged; the last good tokens stay)."""
        with self._lock:
            stamps = self._all_stamps()
            try:
                tokens = self._load()
            except (OSError, ValueError) as e:
                if stamps != self._stamps:
                    log.error("token files not reloaded, the previous tokens stay: %s", e)
                self._stamps = stamps  # logged once per change, not once per request
                return False
            self._stamps, self._tokens = stamps, tokens
        log.info("token files read: webhook, %d override token(s)%s", len(tokens.people),
                 ", read" if tokens.read else "")
        return True
