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
:meth:`TokenFiles.reload` (SIGHUP). Each token is at least :data:`MIN_TOKEN_LENGTH` (32)
characters (``head -c 32 /dev/urandom | base64`` makes 44). A file is read whole, and only when it
did not change while being read (its size, mtime and inode the same before and after); then:

* a token removed from the people or read file is revoked (fail closed), and so are all of that
  role's tokens when its file is empty or holds only comments (no one may override; no read token
  reads: the webhook token does not take its place) or missing (then the file is also *refused*,
  below: a deleted file or an unmounted Secret is not a way to say "no one");
* a people or read file that cannot be read whole (unreadable, changed while read) or is malformed
  (a token under 32 characters, a line that is not ``NAME TOKEN``, a token another role holds...)
  is *refused*, and every token of that file is dropped until it is fixed (fail closed: a file
  that is wrong on one line cannot be trusted on the others, so an edit that revokes someone and
  breaks the file revokes them too). A file rewritten in two steps never makes a partial token live;
  between the steps that file's tokens are refused.
* each file is judged on its own: a refused people file leaves the webhook and read tokens as
  they were. The webhook file alone keeps its last good token when it is missing, empty or
  malformed: Alertmanager reads the same token, and a fuse that refuses it trips nothing.

A refused file is logged (an ERROR line naming the file, the line and what is wrong, once per change
and on every SIGHUP) and shown in ``/metrics``: :meth:`TokenFiles.observe` reports each file's state
(``fusebox_fuse_token_file_valid{file}`` 1 or 0, ``fusebox_fuse_token_file_refused_total{file}``),
and the generated alert ``FuseboxFuseTokenFileRefused`` pages while one is 0.

Write token files atomically (a new file renamed over the old, as Kubernetes does for a Secret
volume): a file rewritten in place may be read between two writes.
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

from .logsafe import install

log = install(logging.getLogger("fusebox.fuse"))

__all__ = ["Tokens", "TokenFiles", "KeyFile", "read_token_file", "read_people_file", "permission_warnings", "match",
           "MIN_TOKEN_LENGTH", "NoTokens", "check_token_length", "FILES"]

# Shortest token accepted from a file, characters (32 random bytes in base64 are 44).
MIN_TOKEN_LENGTH = 32
_HOW = "make one with: head -c 32 /dev/urandom | base64"
# Reads of a file that changed while being read, before giving up (the last good tokens stay).
_READ_TRIES = 3

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$")


@dataclass(frozen=True)
class Tokens:
    """The tokens in force. ``people``: name -> token; ``read``: None when not configured (the
    webhook token reads) or, with ``no_read``, when its file has none left (no read token reads).

    Raises ValueError when a token is empty or one token serves two roles.
    """

    webhook: str
    people: dict = field(default_factory=dict)
    read: str | None = None
    no_read: bool = False

    def readers(self) -> dict[str, str]:
        """name -> token of those who may read: the people, and the read token (``(read)``), else
        the webhook token (``(webhook)``) unless ``no_read``."""
        if self.read:
            return {**self.people, "(read)": self.read}
        return dict(self.people) if self.no_read else {**self.people, "(webhook)": self.webhook}

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

    def current(self) -> Tokens:
        return self


def match(presented: str | None, tokens: dict[str, str]) -> str | None:
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


class NoTokens(ValueError):
    """The file is missing, empty or holds only comments: the role it gives has no token."""


def _read_whole(path: str | os.PathLike) -> str:
    """The file's text, read whole while it did not change (size, mtime, inode the same before and
    after the read). Raises FileNotFoundError -> :class:`NoTokens`; OSError: unreadable, or it kept
    changing while read."""
    for _ in range(_READ_TRIES):
        try:
            before = _stamp(path, missing_raises=True)
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise NoTokens(f"{path}: no such file") from None
        if _stamp(path) == before:
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{path}: not UTF-8 text") from None
    raise OSError(f"{path}: changed while being read ({_READ_TRIES} tries); read again on its next change")


def check_token_length(path, tok: str, where: str = "") -> None:
    """Raise ValueError naming ``path`` (a file, or ``env NAME``) when ``tok`` is under
    :data:`MIN_TOKEN_LENGTH` characters, with how to make one."""
    if len(tok) < MIN_TOKEN_LENGTH:
        raise ValueError(f"{path}: {where}the token is {len(tok)} characters, at least {MIN_TOKEN_LENGTH} are "
                         f"required ({_HOW})")


def read_token_file(path: str | os.PathLike) -> str:
    """The token in ``path``: the whole file (read while it did not change), surrounding
    whitespace stripped.

    Raises:
        NoTokens: missing or empty. OSError: unreadable. ValueError: more than one line,
            whitespace inside the token, or under :data:`MIN_TOKEN_LENGTH` characters.
    """
    text = _one_line(path, "token", _HOW)
    check_token_length(path, text)
    return text


def _one_line(path: str | os.PathLike, what: str, how: str) -> str:
    """The file's one line (read whole while it did not change), surrounding whitespace stripped.
    Raises NoTokens (missing, empty), OSError, ValueError (more than one line, inner whitespace)."""
    text = _read_whole(path).strip()
    if not text:
        raise NoTokens(f"{path}: empty {what} file ({how})")
    if "\n" in text or "\r" in text:
        raise ValueError(f"{path}: a {what} file holds one line (the {what}), this one has more")
    if any(c.isspace() for c in text):
        raise ValueError(f"{path}: the {what} contains whitespace")
    return text


class KeyFile:
    """A credential the fuse *sends* (a gateway's control-plane key, ``fuse.adapters.<name>.
    credentials_file``): the file's one line, surrounding whitespace stripped, read again when the
    file changes (size, mtime, ctime or inode: a Kubernetes Secret volume swaps its files), so a
    rotated key is used without a restart. No length rule: the key is the gateway's own.

    Raises (at construction): NoTokens (missing or empty), OSError (unreadable), ValueError (more
    than one line, whitespace inside). Afterwards a file that cannot be read or is malformed keeps
    the last good key, logged once per change of the file (the path and what is wrong, never the
    key).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self._lock = threading.Lock()
        self._stamp = _stamp(self.path)
        self._key = _one_line(self.path, "key", "write the gateway's control-plane key into it")

    def value(self) -> str:
        """The key in force, the file read again first when it changed."""
        stamp = _stamp(self.path)
        with self._lock:
            if stamp == self._stamp:
                return self._key
            try:
                key = _one_line(self.path, "key", "write the gateway's control-plane key into it")
            except (OSError, ValueError) as e:
                log.error("key file not read again, the previous key stays in use: %s", e)
            else:
                if key != self._key:
                    log.info("key file %s read again: a new key is in use", self.path)
                self._key = key
            self._stamp = stamp  # logged once per change, not once per call
            return self._key


def read_people_file(path: str | os.PathLike) -> dict[str, str]:
    """``{name: token}`` from a file of ``NAME TOKEN`` lines (``#`` comments and blank lines ignored),
    read whole while it did not change.

    Raises:
        NoTokens: missing, or no token at all. OSError: unreadable. ValueError: a line that is not
            two fields, a bad or repeated name, a repeated token, or a token under
            :data:`MIN_TOKEN_LENGTH` characters; the message names the file and the line.
    """
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for n, line in enumerate(_read_whole(path).splitlines(), 1):
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
        check_token_length(path, tok, f"line {n}: ")
        out[name], seen[tok] = tok, name
    if not out:
        raise NoTokens(f"{path}: no token (expected NAME TOKEN lines)")
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


def _stamp(path, missing_raises: bool = False) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        if missing_raises:
            raise
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


# The token files, in the order they are read; each is judged on its own (``/metrics``' ``file`` label).
FILES = ("webhook", "people", "read")


class TokenFiles:
    """Tokens read from files, read again when a file changes or on :meth:`reload`.

    Args:
        webhook: the webhook token file (required).
        people: the people file (``NAME TOKEN`` lines), or None: no one may override.
        read: the read token file, or None: the webhook token reads.

    Raises (at construction): OSError, ValueError, as :func:`read_token_file`, :func:`read_people_file`
    and :class:`Tokens`. After that nothing raises: a people or read file that cannot be read or is
    malformed drops its tokens (fail closed), the webhook file keeps its last good token; both are
    logged and reported to the :meth:`observe` callbacks.
    """

    def __init__(self, webhook, people=None, read=None):
        self.paths = {"webhook": webhook, "people": people, "read": read}
        self._lock = threading.RLock()  # reentrant: SIGHUP's handler may run while the main thread holds it
        self._stamps = self._all_stamps()
        self._tokens = self._load()
        # file -> True while the file is in force as written (valid), False while refused
        self.valid: dict[str, bool] = {k: True for k, v in self.paths.items() if v is not None}
        self._observers: list = []

    def _all_stamps(self) -> dict:
        return {k: _stamp(p) for k, p in self.paths.items() if p is not None}

    def _load(self) -> Tokens:
        """The tokens of the files, each read strictly (at start: any error stops the start)."""
        p = self.paths
        read = read_token_file(p["read"]) if p["read"] is not None else None
        return Tokens(webhook=read_token_file(p["webhook"]),
                      people=read_people_file(p["people"]) if p["people"] is not None else {}, read=read)

    def observe(self, callback) -> None:
        """Call ``callback(file, valid, refused)`` now for every configured file (``refused``
        False) and after every read of the files: ``file`` one of :data:`FILES`, ``valid`` whether
        the file is in force as written, ``refused`` True when this read refused it (a counter's
        increment). Callbacks must not raise."""
        with self._lock:
            self._observers.append(callback)
            for kind, ok in self.valid.items():
                callback(kind, ok, False)

    def current(self) -> Tokens:
        """The tokens in force, read again first when a file's size, mtime, ctime or inode changed."""
        if self._all_stamps() != self._stamps:
            self._reread(explicit=False)
        return self._tokens

    def reload(self) -> bool:
        """Read every file again (SIGHUP). True when every file is valid; False when one is refused
        (logged; a refused people or read file's tokens are dropped, the webhook's last good token
        stays)."""
        return self._reread(explicit=True)

    def _reread(self, explicit: bool) -> bool:
        with self._lock:
            stamps = self._all_stamps()
            # an error is logged once per change of the files, and on every SIGHUP (not per request;
            # the stamps are taken before the read: a file that changed while read is read again)
            loud = explicit or stamps != self._stamps
            self._stamps = stamps
            old, p = self._tokens, self.paths
            errors: dict[str, str] = {}

            def role(kind, reader, dropped):
                try:
                    return reader(p[kind])
                except NoTokens as e:
                    if kind == "webhook":
                        errors[kind] = f"{e}; the last good webhook token stays in use"
                        return dropped
                    who = "override" if kind == "people" else kind
                    if not os.path.lexists(p[kind]):  # gone (a deleted file, an unmounted Secret): refused
                        errors[kind] = f"{e}; every {who} token is revoked until the file is back"
                    elif loud:  # empty or comments only: no one, as written
                        log.warning("token files: %s: every %s token is revoked", e, who)
                    return dropped
                except (OSError, ValueError) as e:
                    errors[kind] = (f"{e}; the last good webhook token stays in use" if kind == "webhook" else
                                    f"{e}; every {'override' if kind == 'people' else 'read'} token of this file is "
                                    "revoked until it is fixed (a malformed file is not trusted line by line)")
                    return dropped

            webhook = role("webhook", read_token_file, old.webhook)
            people = (role("people", read_people_file, {}) or {}) if p["people"] is not None else {}
            read = role("read", read_token_file, None) if p["read"] is not None else None
            # tokens shared between roles: the file that reuses another role's token is refused
            if read is not None and hmac.compare_digest(read.encode(), webhook.encode()):
                errors["read"], read = f"{p['read']}: the read token is the webhook token; give each role its own", None
            for name, tok in people.items():
                if any(t is not None and hmac.compare_digest(tok.encode(), t.encode()) for t in (webhook, read)):
                    errors["people"] = (f"{p['people']}: the override token of {name} is the webhook or read token; "
                                        "give each role its own -- every override token is revoked until it is fixed")
                    people = {}
                    break
            tokens = Tokens(webhook=webhook, people=people, read=read, no_read=p["read"] is not None and read is None)
            self._tokens = tokens
            for kind in self.valid:
                self.valid[kind] = kind not in errors
                if kind in errors and loud:
                    log.error("token file %s refused: %s", kind, errors[kind])
                for cb in self._observers:
                    cb(kind, kind not in errors, kind in errors and loud)
        if not errors:
            log.info("token files read: webhook, %d override token(s)%s", len(tokens.people),
                     ", read" if tokens.read else "")
        return not errors
