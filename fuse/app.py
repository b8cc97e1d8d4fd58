"""HTTP transport (FastAPI): maps requests to :class:`FuseService` calls and outcomes to codes.

==========================  ========  =============================================================
Route                       Token     Answers
==========================  ========  =============================================================
POST /alertmanager          webhook   200 applied or ignored (an alert with a label over 256
                                      characters refused alone); 400 malformed; 401; 413 too large;
                                      429 too many failed authentications (Retry-After);
                                      503 state not persisted (Alertmanager retries 5xx only)
POST /override              a person  200 with the decisions; 400 bad override; 401; 409 the scope
                                      is not exactly a known one (lists the candidates); 413; 503
GET  /state                 reader    JSON: ``levels`` {scope key: highest tripped level}, ``scopes``;
                                      times as Unix seconds and ISO-8601 (``*_iso``); a page:
                                      ``?limit=&offset=``, filters ``?scope=`` and ``?level=``
GET  /                      reader    read-only HTML status page (Bearer, or Basic with the token
                                      as password, so a browser can ask for it); the same query
GET  /openapi.json          reader    the API description (no /docs, /redoc: no third-party script)
GET  /metrics               none      Prometheus text format (no URL, no answer text)
GET  /healthz               none      200 "ok" (liveness: the process answers; on the event loop,
                                      which no notification blocks: they run in worker threads)
GET  /readyz                none      200 ``{"status": "ready"}`` when the store answers a read (and a
                                      write, when the last one failed) and an adapter is
                                      configured (dry-run counts); else 503 with
                                      ``{"status": "not ready", "reason": ...}``
==========================  ========  =============================================================

Tokens (:mod:`fusebox.fuse.tokens`): *webhook* is Alertmanager's; *a person* is one of the named
override tokens, whose name the audit records; *reader* is the read token when one is configured,
else the webhook token, and any person's token. ``Authorization: Bearer <token>``, the scheme in
any case (RFC 7235), each token compared in constant time. A missing or wrong token is answered 401
whatever the body holds (nothing of it is used); a body over the limit is 413 before the token is
looked at. Failed authentications are counted per role; a client address with ``AUTH_FAILURES``
of them in ``AUTH_WINDOW_S`` seconds is answered 429 (``Retry-After``) on every route that needs a
token, without its token being looked at.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations, which name
# dependencies local to create_app.

import collections
import json
import logging
import math
import os
import re
import threading
import time
from typing import Annotated, Any, Literal, Optional, Union
from urllib.parse import urlencode

import anyio
from fastapi import Depends, FastAPI, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBasic, HTTPBasicCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from starlette.exceptions import HTTPException

from .breaker import OverrideError, ScopeNotFound
from .override import UsageError, parse_scope
from .payload import MAX_LABEL_VALUE, NOT_STORABLE, PayloadError, parse_payload, storable
from .service import FuseService, Unavailable
from .store import HEADROOM_BYTES, StoreError
from .status import (CALL_KINDS, STATUS_CALL_ROWS, STATUS_DECISIONS, STATUS_ROWS, StatusLinks, render_status,
                     state_view, web_url)
from .tokens import Tokens, TokenFiles, match

log = logging.getLogger("fusebox.fuse")

__all__ = ["create_app", "render_status", "MAX_BODY_BYTES", "MAX_LABEL_VALUE", "STATUS_ROWS", "WebhookPayload",
           "OverrideRequest", "StatusLinks"]

# Alertmanager caps a notification at max_alerts (0 = all); 1 MiB holds thousands of alerts.
MAX_BODY_BYTES = 1 << 20
# Alertmanager's fingerprints are 16 hex digits.
MAX_FINGERPRINT = 64
# /state's page: scopes per answer by default and at most (the default holds every scope of a
# small fleet, so readers that do not page see them all); the status page's default.
STATE_LIMIT = 1000
STATE_LIMIT_MAX = 10_000
STATUS_SCOPES = 100
# Failed authentications a client (its address) may make in AUTH_WINDOW_S seconds before it is
# answered 429; clients remembered at most (the least recent forgotten).
AUTH_FAILURES = 20
AUTH_WINDOW_S = 60.0
AUTH_CLIENTS = 10_000
# Worker threads for /readyz's store read, apart from those notifications wait in.
PROBE_THREADS = 4
def _storable(text: str) -> str:
    if not storable(text):
        raise ValueError(f"is {NOT_STORABLE}")
    return text


# Text the fuse stores or answers: no lone surrogate (JSON's "\udfff"), whatever pydantic's own
# str validation lets through (it differs between pydantic-core versions).
Text = Annotated[str, AfterValidator(_storable)]
LabelValue = Annotated[str, StringConstraints(max_length=MAX_LABEL_VALUE), AfterValidator(_storable)]


class Alert(BaseModel):
    """One alert of a webhook notification (Alertmanager's ``template.Alert``)."""

    model_config = ConfigDict(extra="allow")
    status: Optional[Literal["firing", "resolved"]] = Field(None, description="absent: derived from endsAt")
    # not capped here: an alert over the cap is refused alone (payload.Refused), the others are used
    labels: dict[Text, Text] = Field(description=f"strings; an alert with a name or value over {MAX_LABEL_VALUE} "
                                                 "characters is refused alone (the others are used)")
    annotations: dict[str, str] = {}
    startsAt: str = Field(description="RFC 3339")
    endsAt: Optional[str] = Field(None, description="RFC 3339; Go's zero time or absent: no end known")
    generatorURL: Optional[str] = None
    fingerprint: Optional[Annotated[Text, StringConstraints(max_length=MAX_FINGERPRINT)]] = Field(
        None, description="absent: computed from the labels as Alertmanager does")


class WebhookPayload(BaseModel):
    """Alertmanager webhook payload, version 4 (older versions are accepted too)."""

    model_config = ConfigDict(extra="allow")
    version: Optional[Union[str, int]] = "4"
    groupKey: Optional[Union[str, int]] = None
    truncatedAlerts: int = Field(0, ge=0)
    status: Optional[Literal["firing", "resolved"]] = None
    receiver: Optional[str] = None
    groupLabels: dict[str, str] = {}
    commonLabels: dict[str, str] = {}
    commonAnnotations: dict[str, str] = {}
    externalURL: Optional[str] = None
    alerts: list[Alert]


# An override lasts at most a week: longer, and it outlives the incident it was for.
MAX_OVERRIDE_S = 7 * 86400


class OverrideRequest(BaseModel):
    """Force a level of a scope tripped or released until ``expires_in_s`` seconds from now.

    Strict types: ``"level": true`` or ``"expires_in_s": "600"`` are refused, not coerced.
    """

    model_config = ConfigDict(extra="ignore", strict=True)
    scope: dict[Text, LabelValue] = Field(description="scope labels (cluster, host_name, instance, hw_id, engine)")
    level: int = Field(ge=1, le=99, description="the spec's fuse level: 1 freeze_admissions, 2 text_only_fallback, "
                                                "3 kv_cache_eviction")
    mode: Literal["trip", "release"]
    reason: Text = Field(min_length=1, max_length=1000, description="why, for the audit log")
    expires_in_s: float = Field(gt=0, le=MAX_OVERRIDE_S, description="seconds until the override ends (required)")
    fleet: bool = Field(False, description='true, with "scope": {}, to override every scope of the fleet at once')
    new_scope: bool = Field(False, description="true to trip a scope that is part of a known one as a scope of its own")


def _validation_problem(e: ValidationError | RequestValidationError, content_type: Optional[str] = None) -> JSONResponse:
    """A 400 a human can act on: ``{"error": "<field> must be ..., got ...", "field": "<field>"}``.

    Only the first problem is told (fix it and resend); pydantic's text and documentation URLs are left out.
    A body sent with another ``content_type`` than JSON's (FastAPI then hands the model the raw bytes)
    is told so: ``body must be sent as JSON with Content-Type: application/json ...``.
    """
    err = e.errors()[0]
    kind = err.get("type", "")
    if isinstance(err.get("input"), bytes) and [x for x in err.get("loc", ()) if x != "body"] == []:
        return _problem(400, "body must be sent as JSON with Content-Type: application/json (this request's "
                             f"Content-Type: {(content_type or 'none')[:100]})", "body")
    if kind == "json_invalid":
        return _problem(400, f"body is not JSON: {err.get('ctx', {}).get('error', 'decode error')}", "body")
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    name = loc[-1:] == ["[key]"]  # a label name (a key of the object): the object is the field
    if name:
        loc = loc[:-2]
    field = ".".join(loc) or "body"
    if kind == "missing":
        msg = f"{field} is required"
    elif kind == "value_error":  # ours (AfterValidator): the message is written for this answer
        msg = f"{field}{': a label name' if name else ''} {err.get('ctx', {}).get('error', 'is invalid')}"
    else:
        text = re.sub(r"^(Input|String|Value|Dictionary|List) should", "must", err.get("msg", "is invalid"))
        text = text.replace("a valid dictionary", "a JSON object")
        if kind in ("model_type", "model_attributes_type", "dict_type"):
            text = "must be a JSON object"
        got = json.dumps(err.get("input"), default=str)
        msg = f"{field} {text}, got {got[:60] + '...' if len(got) > 60 else got}"
    return _problem(400, msg, field)


def _problem(code: int, msg: str, field: Optional[str] = None, headers: Optional[dict] = None) -> JSONResponse:
    # The answer must encode whatever the request held: a lone surrogate quoted back is escaped.
    body = {"status": "error", "error": _encodable(msg)}
    if field is not None:
        body["field"] = _encodable(field)
    return JSONResponse(body, status_code=code, headers=headers)


def _encodable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class _Denied(Exception):
    """No token, or not one of the role's (HTTP 401)."""

    def __init__(self, basic: bool = False):
        self.basic = basic  # also offer Basic: a browser then asks for the token


class _BadQuery(Exception):
    """A query parameter that parses but means nothing (HTTP 400)."""

    def __init__(self, message: str, field: str):
        self.message, self.field = message, field


class _Limited(Exception):
    """Too many failed authentications from the client (HTTP 429); ``retry_after``: whole seconds."""

    def __init__(self, retry_after: int):
        self.retry_after = retry_after


class _AuthLimiter:
    """Failed authentications per client address, in a sliding window of ``window_s`` seconds
    (monotonic clock); at most ``max_clients`` clients remembered, the least recent forgotten."""

    def __init__(self, max_failures: int, window_s: float, max_clients: int = AUTH_CLIENTS):
        self.max_failures, self.window_s, self.max_clients = max_failures, window_s, max_clients
        self._failures: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._lock = threading.Lock()

    def wait(self, client: str) -> int:
        """Whole seconds the client must wait (0: none)."""
        now = time.monotonic()
        with self._lock:
            q = self._failures.get(client)
            while q and q[0] <= now - self.window_s:
                q.popleft()
            if not q or len(q) < self.max_failures:
                return 0
            return max(1, math.ceil(q[0] + self.window_s - now))

    def failed(self, client: str) -> None:
        with self._lock:
            q = self._failures.pop(client, None) or collections.deque(maxlen=self.max_failures)
            q.append(time.monotonic())
            self._failures[client] = q
            while len(self._failures) > self.max_clients:
                self._failures.popitem(last=False)


_DENIED = "missing or wrong token"
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


class _BodyLimit:
    """ASGI middleware: a request body over ``max_body`` bytes is answered 413 before the app reads
    it (Content-Length checked first, a streamed body counted as it comes); ``on_413(path)`` counts it."""

    def __init__(self, app, max_body: int, on_413):
        self.app, self.max_body, self.on_413 = app, max_body, on_413

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body:
            return await self._too_large(scope, receive, send)
        body = bytearray()
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client left
                return
            body += msg.get("body", b"")
            if len(body) > self.max_body:
                return await self._too_large(scope, receive, send)
            if not msg.get("more_body"):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    async def _too_large(self, scope, receive, send):
        self.on_413(scope["path"])
        await _problem(413, f"body over {self.max_body} bytes")(scope, receive, send)


def create_app(service: FuseService, tokens: Tokens | TokenFiles | str, *, max_body: int = MAX_BODY_BYTES,
               links: Optional[StatusLinks] = None, auth_failures: int = AUTH_FAILURES,
               auth_window_s: float = AUTH_WINDOW_S) -> FastAPI:
    """The ASGI app.

    Args:
        tokens: :class:`Tokens` (fixed), :class:`TokenFiles` (read again when the files change), or a
            string: the webhook token alone (no one may override).
        max_body: largest request body, bytes (413 above).
        auth_failures, auth_window_s: a client (its address) that failed to authenticate
            ``auth_failures`` times within ``auth_window_s`` seconds is answered 429, with
            ``Retry-After`` in seconds, until the oldest of those failures is that old.
        links: where the status page links to (runbooks, dashboard, Alertmanager); None: no links
            but Alertmanager's, from the notifications' ``externalURL``.

    Raises:
        ValueError: an empty webhook token.
    """
    if isinstance(tokens, str):
        tokens = Tokens(webhook=tokens)
    source = tokens
    source.current()  # fails now, not on the first request
    app = FastAPI(title="fusebox fuse", version="1", description=__doc__.split("\n\n")[0],
                  openapi_url=None, docs_url=None, redoc_url=None)
    metrics = service.metrics
    seen = {"alertmanager": ""}  # the externalURL of the last notification (Alertmanager's own address)

    def count(path: str, outcome: str) -> None:
        if path == "/alertmanager":
            metrics.notifications.labels(outcome).inc()

    app.add_middleware(_BodyLimit, max_body=max_body, on_413=lambda path: count(path, "http_413"))

    bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <token> (scheme in any case)")
    basic = HTTPBasic(auto_error=False, realm="fusebox fuse",
                      description="for browsers, read routes only: any user name, a reader token as password")

    def presented(creds: Optional[HTTPAuthorizationCredentials]) -> Optional[str]:
        return creds.credentials.strip(" ") if creds else None

    limiter = _AuthLimiter(auth_failures, auth_window_s)

    def check(request: Request, role: str, tokens: dict[str, str], given: Optional[str]) -> Optional[str]:
        """The name in ``tokens`` whose token is ``given``, else None (counted, and charged to the
        client). Raises _Limited, before looking at the token, while the client is over its failures."""
        client = request.client.host if request.client else "-"
        wait = limiter.wait(client)
        if wait:
            metrics.auth_limited.labels(role).inc()
            raise _Limited(wait)
        name = match(given, tokens)
        if name is None:
            metrics.auth_failures.labels(role).inc()
            limiter.failed(client)
        return name

    def webhook_token(request: Request,
                      creds: Annotated[Optional[HTTPAuthorizationCredentials], Security(bearer)]) -> str:
        if check(request, "webhook", {"webhook": source.current().webhook}, presented(creds)) is None:
            raise _Denied()
        return "webhook"

    def person_token(request: Request,
                     creds: Annotated[Optional[HTTPAuthorizationCredentials], Security(bearer)]) -> str:
        name = check(request, "override", source.current().people, presented(creds))
        if name is None:
            raise _Denied()
        return name

    def reader_token(request: Request, creds: Annotated[Optional[HTTPAuthorizationCredentials], Security(bearer)],
                     login: Annotated[Optional[HTTPBasicCredentials], Security(basic)]) -> str:
        given = login.password if login else presented(creds)
        name = check(request, "read", source.current().readers(), given)
        if name is None:
            raise _Denied(basic=True)
        return name

    roles = {"/alertmanager": webhook_token, "/override": person_token}

    def authorized(request: Request) -> bool:
        """For a request refused before its dependencies ran (a body that is not JSON): the role's
        token? Raises _Limited as the dependencies do."""
        dep = roles.get(request.url.path)
        if dep is None:
            return True
        scheme, _, cred = request.headers.get("authorization", "").partition(" ")
        ok = scheme.lower() == "bearer"
        try:
            dep(request, HTTPAuthorizationCredentials(scheme="Bearer", credentials=cred.strip(" ") if ok else ""))
        except _Denied:
            return False
        return True

    def limited(request: Request, exc: "_Limited") -> JSONResponse:
        count(request.url.path, "http_429")
        return _problem(429, f"too many failed authentications from this client; retry after {exc.retry_after} s",
                        headers={"Retry-After": str(exc.retry_after)})

    @app.exception_handler(_Limited)
    async def _limited(request, exc):
        return limited(request, exc)

    def denied(request: Request, exc: Optional[_Denied] = None) -> JSONResponse:
        count(request.url.path, "http_401")
        r = _problem(401, _DENIED, headers=_CHALLENGE)
        if exc is not None and exc.basic:  # one challenge per header: browsers then ask for the token
            r.headers.append("WWW-Authenticate", 'Basic realm="fusebox fuse"')
        return r

    @app.exception_handler(_Denied)
    async def _denied(request, exc):
        return denied(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request, exc):  # FastAPI says 422; Alertmanager and we say 400
        try:
            if not authorized(request):
                return denied(request)
        except _Limited as e:
            return limited(request, e)
        count(request.url.path, "http_400")
        return _validation_problem(exc, request.headers.get("content-type"))

    @app.exception_handler(HTTPException)
    async def _http_error(request, exc):  # FastAPI's own: a body it could not parse (nested too deeply)
        if exc.status_code == 401:
            return denied(request, _Denied(basic=True))
        try:
            if exc.status_code == 400 and not authorized(request):
                return denied(request)
        except _Limited as e:
            return limited(request, e)
        if exc.status_code == 400:
            count(request.url.path, "http_400")
            return _problem(400, "body is not usable JSON (nested too deeply, or not UTF-8)", "body")
        return _problem(exc.status_code, str(exc.detail)[:200])

    responses: dict[int | str, dict[str, Any]] = {400: {"description": "malformed"}, 401: {"description": "no or wrong token"},
                 413: {"description": "too large"}, 503: {"description": "state not persisted; retry"}}

    @app.post("/alertmanager", responses=responses)
    async def alertmanager(body: WebhookPayload, _: Annotated[str, Depends(webhook_token)]):
        """Alertmanager webhook receiver (payload version 4)."""
        t0 = time.perf_counter()
        received = service.clock()
        seen["alertmanager"] = web_url(body.externalURL) or seen["alertmanager"]

        def work():  # in a worker thread: the event loop (/healthz) never waits for a notification
            try:
                note = parse_payload(body.model_dump(), received)
            except (PayloadError, ValueError) as e:
                return e
            return service.handle(note, received)

        try:
            result = await anyio.to_thread.run_sync(work)
        except Unavailable as e:
            metrics.notifications.labels("http_503").inc()
            return _problem(503, f"state not persisted, retry: {e}")
        if isinstance(result, Exception):  # the payload did not parse
            metrics.notifications.labels("http_400").inc()
            return _problem(400, str(result)[:500])
        metrics.notifications.labels("applied" if result["decisions"] else "ignored").inc()
        metrics.request.observe(time.perf_counter() - t0)
        return {"status": "ok", **result}

    @app.post("/override", responses={**responses, 409: {"description": "the scope is not exactly a known one; "
                                                                        "lists candidates"}})
    async def override(req: OverrideRequest, who: Annotated[str, Depends(person_token)]):
        """Force-trip or force-release a level of a scope for a while, with a reason (audited with
        the name of the token used)."""
        def work():
            return service.override(req.scope, req.level, req.mode, req.reason, req.expires_in_s, fleet=req.fleet,
                                    new_scope=req.new_scope, by=who)

        try:
            decisions = await anyio.to_thread.run_sync(work)
        except ScopeNotFound as e:  # 409: the request is well formed but names no scope exactly
            return JSONResponse({"status": "error", "error": str(e), "field": e.field, "scopes": e.scopes},
                                status_code=409)
        except OverrideError as e:
            return _problem(400, str(e), e.field)
        except Unavailable as e:
            return _problem(503, f"state not persisted, retry: {e}")
        return {"status": "ok", "decisions": decisions}

    def page_query(limit: Optional[int], offset: int, scope: Optional[str], level: int) -> dict:
        labels = None
        if scope:
            try:
                labels = parse_scope(scope)
            except UsageError as e:
                raise _BadQuery(str(e), "scope") from None
        return {"offset": offset, "limit": limit, "scope": labels, "min_level": level}

    Limit = Annotated[int, Query(ge=1, le=STATE_LIMIT_MAX, description="scopes per page")]
    Offset = Annotated[int, Query(ge=0, description="scopes to skip (key order)")]
    ScopeFilter = Annotated[Optional[str], Query(max_length=2000, description=(
        "only scopes with these labels: cluster=a,engine=e0 or a scope key {cluster=\"a\"}"))]
    LevelFilter = Annotated[int, Query(ge=0, le=99, description="only scopes tripped at this level or higher")]

    @app.get("/state", responses={400: {"description": "bad query"}, 401: {"description": "no or wrong token"}})
    def state(_: Annotated[str, Depends(reader_token)], limit: Limit = STATE_LIMIT, offset: Offset = 0,
              scope: ScopeFilter = None, level: LevelFilter = 0):
        """``levels``: scope key -> highest tripped level of the page's scopes (absent: none);
        ``scopes``: details, in key order, ``limit`` from ``offset``; ``total`` scopes match the
        filters (``scope``: labels they include, ``level``: tripped at least), ``tripped`` maps
        every one tripped to its level, ``next_offset`` starts the next page (null: none). Times
        are Unix seconds with an ISO-8601 twin (``tripped_at`` and ``tripped_at_iso``...)."""
        return state_view(service.state(**page_query(limit, offset, scope, level)), service.clock())

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(_: Annotated[str, Depends(reader_token)]):
        return app.openapi()

    @app.get("/metrics", response_class=PlainTextResponse)
    def prometheus_metrics():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz():
        """Liveness: the process answers (it says nothing of the store or the adapters: /readyz).
        On the event loop: no worker thread to wait for."""
        return "ok"

    probes = anyio.CapacityLimiter(PROBE_THREADS)

    @app.get("/readyz", responses={503: {"description": "not ready; the reason says why"}})
    async def readyz():
        """Readiness: 200 when the store answers a read (and a write when its last write failed:
        a full disk) and at least one adapter is configured (the dry-run adapter counts); 503 ``{"status": "not ready", "reason": ...}`` otherwise. The read
        runs on the store's probe connection, in threads of its own: a notification being handled
        (holding the store's connection and the worker threads) does not delay it."""
        reason = await anyio.to_thread.run_sync(not_ready, service, limiter=probes)
        if reason:
            return JSONResponse({"status": "not ready", "reason": _encodable(reason)}, status_code=503)
        return {"status": "ready", "adapters": sorted(service.labels.values()), "dry_run": service.dry_run}

    @app.get("/", response_class=HTMLResponse, responses={400: {"description": "bad query"},
                                                          401: {"description": "no or wrong token"}})
    def status_page(_: Annotated[str, Depends(reader_token)], limit: Limit = STATUS_SCOPES, offset: Offset = 0,
                    scope: ScopeFilter = None, level: LevelFilter = 0):
        """Read-only status: per scope and level, since when, the alerts holding it (with links),
        the adapter calls made and pending, last decisions, the last truncated notification. A page
        of ``limit`` scopes from ``offset``, filtered as ``GET /state``."""
        st = service.state(**page_query(limit, offset, scope, level))
        keep = {k: v for k, v in (("limit", limit), ("scope", scope), ("level", level)) if v}
        pages = {}
        if offset > 0:
            pages["prev"] = "?" + urlencode({**keep, "offset": max(0, offset - limit)})
        if st["next_offset"] is not None:
            pages["next"] = "?" + urlencode({**keep, "offset": st["next_offset"]})
        return render_status(st, service.store.audit_log(STATUS_DECISIONS), now=service.clock(),
                             calls=service.store.audit_log(STATUS_CALL_ROWS, kinds=CALL_KINDS),
                             pending=pending_calls(service), links=links, alertmanager=seen["alertmanager"],
                             pages=pages)

    @app.exception_handler(_BadQuery)
    async def _bad_query(request, exc):
        return _problem(400, exc.message, exc.field)

    @app.exception_handler(StoreError)
    async def _store_error(request, exc):  # a read the page needs (the audit): 503, never 500
        return _problem(503, f"store unreachable, retry: {exc}"[:500])

    return app


def not_ready(service: FuseService) -> str:
    """Why the service is not ready, or ``""``: the store must answer a read; a SQLite file's volume
    must have HEADROOM_BYTES free (a full disk: every webhook answers 503); when the last write
    failed, the store must write again (:meth:`Store.probe_write`); at least one adapter must be
    configured."""
    if not service.adapters:
        return "no adapter configured: give --gateway-url (or --dry-run)"
    # a file store (SQLite): the file must still be there, ours to use; a database URL is no file
    path = getattr(service.store, "path", None) if getattr(service.store, "dialect", "") == "sqlite" else None
    if isinstance(path, str) and path != ":memory:" and not os.access(path, os.R_OK | os.W_OK):
        return f"store file {path} is missing or not readable and writable by this process"
    store = service.store
    try:
        store.ping()  # its own connection: not held up by a change in progress
    except Exception as e:  # sqlite3.Error, a closed store, a lost connection (the store logs it once)
        return f"store not reachable: {type(e).__name__}: {e}"[:300]
    free = store.free_bytes()
    if free is not None and free < HEADROOM_BYTES:  # a full disk: writes fail (or are about to)
        return f"store cannot write: {free} bytes free on the volume of {path}, less than {HEADROOM_BYTES}"
    if store.health.write_failed:  # the last write failed: ready again once one succeeds
        try:
            store.probe_write()
        except Exception as e:
            return f"store cannot write: {type(e).__name__}: {e}"[:300]
    return ""


def pending_calls(service: FuseService) -> list[dict]:
    """Outbox rows not yet applied, for the status page: ``{"scope_key", "level", "state",
    "adapter" (its label, no URL), "attempts"}``."""
    from .rules import scope_key, scope_of

    out = []
    for name, label in service.labels.items():
        for row in service.store.pending(name)[:STATUS_ROWS]:
            p = row["payload"]
            out.append({"scope_key": scope_key(scope_of(p.get("scope") or {})), "level": p.get("level"),
                        "state": p.get("state"), "adapter": label, "attempts": row["attempts"]})
    return out
