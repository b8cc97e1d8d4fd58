"""``fusebox fuse override``: list, trip and release fuses from a terminal, without hand-written curl.

The scope is picked from what the service knows (``GET /state``), never typed free-hand into a
request: by its number in ``list``, by its labels (``cluster=a,engine=e0``) or by its key
(``{cluster="a",engine="e0"}``), which must name one of ``/state``'s scopes exactly (a trip of a scope
``/state`` does not hold needs ``--new-scope``). Then ``POST /override`` with the person's token.

Token: ``--token-file PATH`` (the whole file, one line), else the ``FUSEBOX_FUSE_TOKEN`` environment
variable. ``list`` reads with any reader token; ``trip`` and ``release`` need a person's token
(``fusebox fuse serve --override-tokens``), whose name the audit records.

Exit status: 0 done; 1 the service refused (401 token, 400 bad override, 409 scope, 503 state not
persisted: retry); 2 a usage error (no token, unknown scope, bad duration); 3 the service could not
be reached (connection refused, timeout).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from urllib.parse import urlencode

import httpx

from .http.status import for_text, iso
from .rules import scope_key

__all__ = ["register", "run", "parse_scope", "pick_scope", "TOKEN_ENV", "URL_ENV", "DEFAULT_URL", "UsageError"]

TOKEN_ENV = "FUSEBOX_FUSE_TOKEN"
URL_ENV = "FUSEBOX_FUSE_URL"
DEFAULT_URL = "http://127.0.0.1:9095"
DEFAULT_FOR = "1h"
EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3


class UsageError(ValueError):
    """What the person typed cannot be used (exit 2); the message says how to fix it."""


class Refused(RuntimeError):
    """The service answered with an error (exit 1)."""


class Unreachable(RuntimeError):
    """No answer from the service (exit 3)."""


def register(sub) -> None:
    """Add ``override`` (``list``, ``trip``, ``release``) to ``fusebox fuse``'s subcommands."""
    o = sub.add_parser("override", help="list, trip or release fuses on a running fuse service (POST /override)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None,
                        help=f"the fuse service (default ${URL_ENV}, else {DEFAULT_URL})")
    common.add_argument("--token-file", metavar="PATH",
                        help=f"your token (whole file, one line); default: the {TOKEN_ENV} environment variable")
    common.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")
    osub = o.add_subparsers(dest="override_command", required=True, metavar="list|trip|release")
    ls = osub.add_parser("list", parents=[common], help="the scopes the service knows, numbered, with their levels")
    ls.set_defaults(func=run)
    scope_help = ("the scope: its number in `list`, its labels (cluster=a,engine=e0) or its key "
                  "({cluster=\"a\",engine=\"e0\"}); it must be exactly one of the service's scopes")
    for mode in ("trip", "release"):
        p = osub.add_parser(mode, parents=[common], help=f"{mode} a level of one scope for a while (audited)")
        p.add_argument("scope", nargs="?", help=scope_help)
        p.add_argument("--scope", dest="scope_opt", metavar="SCOPE", help="the same, as an option")
        p.add_argument("--level", type=int, required=(mode == "trip"),
                       help="the fuse level (1 freeze_admissions, 2 text_only_fallback, 3 kv_cache_eviction)"
                       + ("" if mode == "trip" else "; default: every level tripped in the scope"))
        p.add_argument("--reason", required=True, help="why (the audit log and the status page show it)")
        p.add_argument("--for", dest="duration", default=DEFAULT_FOR, metavar="DURATION",
                       help=f"how long the override lasts, e.g. 30m, 2h (default {DEFAULT_FOR}, at most 7d)")
        if mode == "trip":
            p.add_argument("--new-scope", action="store_true",
                           help="trip a scope the service does not hold yet (labels only, not a number)")
        p.set_defaults(func=run)


def parse_scope(text: str) -> dict[str, str]:
    """``cluster=a,engine=e0`` or ``{cluster="a",engine="e0"}`` -> ``{"cluster": "a", "engine": "e0"}``.

    Values in the key form are unescaped as Prometheus writes them (``\\"``, ``\\\\``, ``\\n``).
    Raises UsageError."""
    s = text.strip()
    if s.startswith("{") and s.endswith("}"):
        return _parse_key(s[1:-1], text)
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in s.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value:
            raise UsageError(f"scope {text!r}: expected LABEL=VALUE[,LABEL=VALUE...], e.g. cluster=a,engine=e0")
        if name.strip() in out:
            raise UsageError(f"scope {text!r}: {name.strip()} given twice")
        out[name.strip()] = value.strip().strip('"')
    if not out:
        raise UsageError(f"scope {text!r}: no label -- give LABEL=VALUE pairs or the number from `list`")
    return out


def _parse_key(inner: str, text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    i, n = 0, len(inner)
    while i < n:
        eq = inner.find('="', i)
        if eq < 0:
            raise UsageError(f"scope {text!r}: expected {{label=\"value\",...}} as `list` prints it")
        name, i, value = inner[i:eq].strip(), eq + 2, []
        while i < n and inner[i] != '"':
            if inner[i] == "\\" and i + 1 < n:
                value.append({"n": "\n"}.get(inner[i + 1], inner[i + 1]))
                i += 2
            else:
                value.append(inner[i])
                i += 1
        if i >= n:
            raise UsageError(f"scope {text!r}: a value is not closed with '\"'")
        out[name] = "".join(value)
        i += 1
        if i < n and inner[i] != ",":
            raise UsageError(f"scope {text!r}: expected ',' after {name}=\"...\"")
        i += 1
    return out


def pick_scope(text: str, scopes: list[dict], *, new_scope: bool = False, trip: bool = False) -> dict[str, str]:
    """The labels of the scope ``text`` names among ``scopes`` (``/state``'s, in its order): a number
    (1-based, as ``list`` prints) or labels/key matching one exactly. With ``new_scope``, labels
    that match none are returned as they are (a trip of a scope the service does not hold yet).

    Raises UsageError naming the known scopes."""
    t = text.strip()
    if t.isdigit():
        k = int(t)
        if not 1 <= k <= len(scopes):
            raise UsageError(f"no scope number {k}: the service holds {len(scopes)} scope(s); see `fusebox fuse "
                             "override list`")
        return dict(scopes[k - 1]["labels"])
    labels = parse_scope(t)
    key = scope_key(labels)
    for sc in scopes:
        if sc["key"] == key:
            return dict(sc["labels"])
    if new_scope:
        return labels
    near = [sc["key"] for sc in scopes if all(sc["labels"].get(k) == v for k, v in labels.items())]
    hint = (f"; scopes that contain it: {', '.join(near[:5])}" if near
            else f"; known scopes: {', '.join(sc['key'] for sc in scopes[:5]) or 'none'}")
    raise UsageError(f"unknown scope {key}: the service holds no scope exactly like it{hint} -- pick one with "
                     "`fusebox fuse override list`" + (", or pass --new-scope to trip it anyway" if trip else ""))


def _token(args) -> str:
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                tok = f.read().strip()
        except OSError as e:
            raise UsageError(f"--token-file {args.token_file}: {e.strerror or e}") from None
    else:
        tok = os.environ.get(TOKEN_ENV, "").strip()
    if not tok:
        raise UsageError(f"no token: pass --token-file PATH or set {TOKEN_ENV} (trip and release need your "
                         "override token, the one beside your name in the service's --override-tokens file)")
    if any(c.isspace() for c in tok):
        raise UsageError("the token file holds more than one word: it must hold the token alone")
    return tok


# A read of the state answered 503 with Retry-After (the service's reads all in flight) is asked
# again this many times, after the seconds it says (at most READ_RETRY_MAX_S each).
READ_RETRIES = 5
READ_RETRY_MAX_S = 5.0


def _request(method: str, url: str, token: str, timeout: float, body: dict | None = None) -> dict:
    for _ in range(READ_RETRIES):
        r = _send(method, url, token, timeout, body)
        after = r.headers.get("retry-after", "")
        if method != "GET" or r.status_code != 503 or not after.isdigit():
            break
        time.sleep(min(float(after), READ_RETRY_MAX_S))
    return _answer(r, url)


def _send(method: str, url: str, token: str, timeout: float, body: dict | None) -> httpx.Response:
    try:
        return httpx.request(method, url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
    except httpx.ConnectError as e:
        raise Unreachable(f"cannot reach the fuse service at {url}: {_why(e)} -- is `fusebox fuse serve` running "
                          f"there? check --url or {URL_ENV}") from None
    except httpx.TimeoutException:
        raise Unreachable(f"the fuse service at {url} did not answer within {timeout:g} s -- retry, or raise "
                          "--timeout") from None
    except httpx.HTTPError as e:
        raise Unreachable(f"{url}: {type(e).__name__}: {e}") from None


def _answer(r: httpx.Response, url: str) -> dict:
    try:
        data = r.json()
    except ValueError:
        data = {}
    if r.status_code == 401:
        raise Refused(f"401 from {url}: the token was refused -- use your own override token (a line 'NAME TOKEN' "
                      "of the service's --override-tokens file) for trip and release, any reader token for list")
    if r.status_code == 409:
        scopes = ", ".join(s["key"] for s in data.get("scopes", [])[:5])
        raise Refused(f"409: {data.get('error', 'the scope is not exactly a known one')}"
                      + (f" (candidates: {scopes})" if scopes else ""))
    if r.status_code == 503:
        raise Refused(f"503: {data.get('error', 'the service could not persist the change')} -- nothing changed; "
                      "retry")
    if not 200 <= r.status_code < 300:
        raise Refused(f"{r.status_code}: {data.get('error') or r.text[:300]}")
    return data


def _why(e: Exception) -> str:
    text = str(e)
    return "connection refused" if "refused" in text.lower() else text or type(e).__name__


def _list(state: dict, out) -> None:
    scopes = state.get("scopes", [])
    if state.get("dry_run"):
        print("DRY RUN: this service applies nothing", file=out)
    if not scopes:
        print("no scope known to the service (nothing has tripped since its state began)", file=out)
        return
    print(f"{'#':>3}  {'LEVEL':5}  {'TRIPPED SINCE (UTC)':32}  SCOPE", file=out)
    now = state.get("now")
    for i, sc in enumerate(scopes, 1):
        tripped = {lvl: st for lvl, st in sc["levels"].items() if st["tripped"]}
        since = min((st["tripped_at"] for st in tripped.values() if st.get("tripped_at") is not None), default=None)
        when = ""
        if since is not None:
            when = iso(since) or ""
            if now is not None:
                when += f" ({for_text(now - since)})"
        levels = ",".join(sorted(tripped)) or "0"
        print(f"{i:>3}  {levels:5}  {when or '-':32}  {sc['key']}", file=out)
    more = (state.get("total") or 0) - len(scopes)
    if more > 0:
        print(f"... and {more} more scope(s) not listed: name a scope by its labels (--scope 'cluster=a,engine=e0')",
              file=out)


def _duration(text: str) -> float:
    from fusebox.spec.units import parse_duration

    try:
        s = float(text) if text.replace(".", "", 1).isdigit() else parse_duration(text)
    except ValueError as e:
        raise UsageError(f"--for {text!r}: {e}") from None
    if not 0 < s <= 7 * 86400:
        raise UsageError(f"--for {text!r}: must be more than 0 and at most 7d")
    return s


def run(args, out=None, err=None) -> int:
    """Run ``list``, ``trip`` or ``release``; returns the exit status (messages on ``err``)."""
    out, err = out or sys.stdout, err or sys.stderr
    base = (args.url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")
    try:
        token = _token(args)
        text = None if args.override_command == "list" else (args.scope_opt or args.scope)
        query = ""
        if text and not text.strip().isdigit():
            # only the scopes with these labels: the service may hold more than one page of scopes
            query = "?" + urlencode({"scope": scope_key(parse_scope(text)), "limit": 1000})
        state = _request("GET", base + "/state" + query, token, args.timeout)
        if args.override_command == "list":
            _list(state, out)
            return 0
        if not text:
            raise UsageError("which scope? give its number from `fusebox fuse override list`, or --scope "
                             "'cluster=a,engine=e0'")
        if args.scope and args.scope_opt and args.scope != args.scope_opt:
            raise UsageError("give the scope once: as an argument or as --scope")
        duration = _duration(args.duration)
        new = bool(getattr(args, "new_scope", False))
        labels = pick_scope(text, state.get("scopes", []), new_scope=new, trip=args.override_command == "trip")
        key = scope_key(labels)
        known = next((sc for sc in state.get("scopes", []) if sc["key"] == key), None)
        if args.level is not None:
            levels = [args.level]
        else:  # release without --level: every tripped level of the scope
            levels = sorted(int(lvl) for lvl, st in (known or {}).get("levels", {}).items() if st["tripped"])
            if not levels:
                raise UsageError(f"nothing is tripped in {key}: give --level to force a level released anyway")
        for level in levels:
            body = {"scope": labels, "level": level, "mode": args.override_command, "reason": args.reason,
                    "expires_in_s": duration, "new_scope": new and known is None}
            data = _request("POST", base + "/override", token, args.timeout, body)
            done = [f"{d['state']} {d['action']}" for d in data.get("decisions", [])]
            print(f"{args.override_command} level {level} of {key} for {for_text(duration)}: "
                  f"{', '.join(done) if done else 'no change (already so); the override holds it'}", file=out)
        if state.get("dry_run"):
            print("note: the service runs in DRY RUN: nothing is applied", file=err)
        return 0
    except UsageError as e:
        print(f"fusebox fuse override: {e}", file=err)
        return EXIT_USAGE
    except Refused as e:
        print(f"fusebox fuse override: {e}", file=err)
        return EXIT_REFUSED
    except Unreachable as e:
        print(f"fusebox fuse override: {e}", file=err)
        return EXIT_UNREACHABLE
