"""The fuse API's routes (the table in :mod:`fusebox.fuse.http.app`), on one :data:`router`.

Each route reaches the service through ``app.state`` (:data:`~fusebox.fuse.http.deps.Service`) and
its token through a dependency of :mod:`fusebox.fuse.http.deps`; refusals raise what
:mod:`fusebox.fuse.http.handlers` answers. Notifications and overrides run in worker threads: the
event loop (``/healthz``) never waits for the store.

``POST /alertmanager`` is the hot route (one request per notification): :class:`WebhookRoute` serves
it without FastAPI's per-request dependency solving (whose sync dependencies each cost a hop through
a worker thread), doing the same steps in the same order -- token, body, notification -- and raising
the same exceptions for the same requests, so every answer is FastAPI's own.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations.

import asyncio
import email.message
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any
from urllib.parse import urlencode

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import TypeAdapter, ValidationError
from starlette.exceptions import HTTPException

from ..intake.breaker import OverrideError, ScopeNotFound
from ..intake.payload import PayloadError, notification
from ..intake.webhook import WebhookPayload
from ..override import UsageError, parse_scope
from ..rows import StateView
from ..service import FuseService, Unavailable
from ..store import HEADROOM_BYTES
from .deps import Service, bearer, person_token, reader_token, service_of, webhook_token
from .errors import BadQuery, encodable, problem
from .models import OverrideRequest
from .status import CALL_KINDS, STATUS_CALL_ROWS, STATUS_DECISIONS, STATUS_ROWS, render_status, state_view, status_headers, web_url

# /state's page: scopes per answer by default and at most (the default holds every scope of a
# small fleet, so readers that do not page see them all; a larger limit is a 400); the status
# page's default and most (it shows STATUS_ROWS rows).
STATE_LIMIT = 1000
STATE_LIMIT_MAX = 1000
STATUS_SCOPES = 100
# A /state answer's scopes stop before their JSON passes this many bytes (one scope at least):
# ``next_offset`` says where the next page starts. 10,000 scopes with 256-character labels were
# one 58 MB answer, and eight of them in flight 786 MB of the fuse's 512 MiB.
STATE_MAX_BYTES = 4 << 20
# Reads of /state and the status page built at once, in a thread of their own (not the webhook's,
# not the event loop's); one more is answered 503 with Retry-After at once, never queued.
READERS = 1
# A page built is served again to every reader of the same URL for this long while the state's
# version is the same (its "now" says when it was read), at most READ_SNAPSHOTS pages kept (each
# at most STATE_MAX_BYTES).
READ_SNAPSHOT_S = 1.0
READ_SNAPSHOTS = 8
READ_RETRY_AFTER_S = 1
# After a build of READ_HEAVY_BYTES or more, none other for (READ_SHARE - 1) times as long as it took:
# heavy reads take at most 1 / READ_SHARE of the time (a 4 MiB page of 10,000 long scopes: 50-100
# ms here); lighter ones (a small fleet's whole state) are not held back.
READ_HEAVY_BYTES = 1 << 20
READ_SHARE = 3
# While a read runs, a thread waiting for the interpreter gets it after this many seconds at most.
READ_SWITCH_S = 0.0005
# Scopes a reader encodes between two hand-overs of the interpreter to other threads.
YIELD_EVERY = 50
# Worker threads for /readyz's store read, apart from those notifications wait in.
PROBE_THREADS = 4
# Threads notifications are handled in (and wait in for the service's lock, where those waiting are
# committed together): anyio's default, which they shared with the sync routes before.
WEBHOOK_THREADS = 40

router = APIRouter()

RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "malformed"}, 401: {"description": "no or wrong token"},
    413: {"description": "too large"}, 503: {"description": "state not persisted; retry"}}


async def notify(request: Request, service: FuseService, body: WebhookPayload) -> Response | dict:
    """Apply a validated notification (in a thread of ``app.state.webhook_threads``: the event loop,
    /healthz, never waits for it) and answer: 200 ``{"status": "ok", "decisions", "alerts"}`` once committed, 400 when the
    payload does not parse (:func:`~fusebox.fuse.intake.payload.notification`), 503 when the store did not persist it."""
    t0 = time.perf_counter()
    received = service.clock()
    metrics = service.metrics
    state = request.app.state
    state.alertmanager_url = web_url(body.externalURL) or state.alertmanager_url

    def work():
        try:
            note = notification(body, received)
        except (PayloadError, ValueError) as e:
            return e
        return service.handle(note, received)

    try:  # the app's own threads: asyncio's hand-off costs the event loop less than anyio's
        result = await asyncio.get_running_loop().run_in_executor(state.webhook_threads, work)
    except Unavailable as e:
        metrics.notifications.labels("http_503").inc()
        return problem(503, f"state not persisted, retry: {e}")
    if isinstance(result, Exception):  # the payload did not parse
        metrics.notifications.labels("http_400").inc()
        return problem(400, str(result)[:500])
    metrics.notifications.labels("applied" if result["decisions"] else "ignored").inc()
    metrics.request.observe(time.perf_counter() - t0)
    return {"status": "ok", **result}


_PAYLOAD = TypeAdapter(WebhookPayload)
_NO_BODY = object()


async def webhook_body(request: Request) -> WebhookPayload:
    """The request's body as FastAPI reads a body parameter of this model (its own reading,
    ``fastapi.routing.get_request_handler``, done here without its per-request dependency solving):
    JSON when the Content-Type is JSON's (``application/json``, ``*+json``), else the raw bytes
    (then refused: send it as JSON); an empty body is missing.

    Raises:
        RequestValidationError: not JSON, or not a notification (answered 400, the first problem).
        HTTPException: 400, a body json cannot decode at all (nested too deeply, not UTF-8).
    """
    raw = await request.body()
    data: Any = _NO_BODY
    if raw:
        ctype = request.headers.get("content-type")
        data = raw
        if ctype == "application/json" or (ctype and _json_type(ctype)):
            data = _json_loads(raw)  # json's, as Starlette's (orjson reads an integer over 64 bits as a float)
    if data is _NO_BODY:  # none sent (JSON's null is a body, refused by the model)
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    try:
        return _PAYLOAD.validate_python(data, from_attributes=True)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None


def _json_type(content_type: str) -> bool:
    """Whether FastAPI reads a body of this Content-Type as JSON (``application/json``, ``*+json``)."""
    message = email.message.Message()
    message["content-type"] = content_type
    if message.get_content_maintype() != "application":
        return False
    subtype = message.get_content_subtype()
    return subtype == "json" or subtype.endswith("+json")


def _json_loads(raw: bytes) -> Any:
    """``json.loads`` as FastAPI (Starlette's ``Request.json``) reads a body, failing as it does."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos), "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": e.msg}}]) from None
    except Exception:  # nested too deeply (RecursionError), not UTF-8
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from None


class WebhookRoute(APIRoute):
    """``POST /alertmanager``: documented from its endpoint's signature (the body model, the token),
    served by :func:`receive_webhook`, which does what FastAPI would -- the token first (401, 429),
    then the body (400), then :func:`notify` -- without solving the endpoint's dependencies per
    request (two of them sync, each a hop through a worker thread)."""

    def get_route_handler(self):
        return receive_webhook


async def receive_webhook(request: Request) -> Response:
    """The webhook route's handler (:class:`WebhookRoute`)."""
    if request.scope.get("fusebox.token") != "webhook":  # checked from the head already (app._BodyLimit)
        webhook_token(request, await bearer(request))  # Denied (401), Limited (429): before the body
    out = await notify(request, service_of(request), await webhook_body(request))
    return out if isinstance(out, Response) else JSONResponse(out)


async def alertmanager(request: Request, service: Service, body: WebhookPayload,
                       _: Annotated[str, Depends(webhook_token)]):
    """Alertmanager webhook receiver (payload version 4)."""
    return await notify(request, service, body)


router.add_api_route("/alertmanager", alertmanager, methods=["POST"], responses=RESPONSES,
                     route_class_override=WebhookRoute)


@router.post("/override", responses={**RESPONSES, 409: {"description": "the scope is not exactly a known one; "
                                                                       "lists candidates"}})
async def override(service: Service, req: OverrideRequest, who: Annotated[str, Depends(person_token)]):
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
        return problem(400, str(e), e.field)
    except Unavailable as e:
        return problem(503, f"state not persisted, retry: {e}")
    return {"status": "ok", "decisions": decisions}


def page_query(limit: int | None, offset: int, scope: str | None, level: int) -> dict:
    """The keyword arguments of :meth:`FuseService.state` for one page. Raises BadQuery (400) for a
    ``scope`` filter that names no labels."""
    labels = None
    if scope:
        try:
            labels = parse_scope(scope)
        except UsageError as e:
            raise BadQuery(str(e), "scope") from None
    return {"offset": offset, "limit": limit, "scope": labels, "min_level": level}


Limit = Annotated[int, Query(ge=1, le=STATE_LIMIT_MAX, description="scopes per page")]
Offset = Annotated[int, Query(ge=0, description="scopes to skip (key order)")]
ScopeFilter = Annotated[str | None, Query(max_length=2000, description=(
    "only scopes with these labels: cluster=a,engine=e0 or a scope key {cluster=\"a\"}"))]
LevelFilter = Annotated[int, Query(ge=0, le=99, description="only scopes tripped at this level or higher")]


READ_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "bad query"}, 401: {"description": "no or wrong token"},
    503: {"description": f"{READERS} reads in flight already: retry after Retry-After seconds"}}


async def bounded_read(request: Request, work) -> Response:
    """``work()`` (a page of /state or the status page), served from a snapshot when the same page
    was built less than :data:`READ_SNAPSHOT_S` ago and neither the state (this replica's version of
    it and its applied records' changes: a reader sees its own change, and an adapter's outcome, at
    once) nor the store's reachability has changed since, else built in the app's one reader thread
    (apart from the webhook's and the event loop's). While a build runs, another is answered 503
    with ``Retry-After`` at once: reads never queue up behind each other nor in front of the
    writers; after a build of :data:`READ_HEAVY_BYTES` or more that took ``d`` seconds, for
    ``2 d`` more (heavy builds take at most a third of the time, whatever the readers do)."""
    st = request.app.state
    svc = service_of(request)
    # the applied records change without the breaker's version (an adapter's outcome, a reconciler's
    # call): a snapshot built before one must not be served after it; nor one built while the store
    # answered once it is lost (it would say stale false for up to READ_SNAPSHOT_S), nor the reverse
    health = getattr(getattr(svc, "store", None), "health", None)
    key = (request.url.path, request.url.query, getattr(svc, "_version", None),
           getattr(getattr(svc, "applied", None), "changes", None), getattr(health, "down_since", None))
    now = time.monotonic()
    snapshots: dict = getattr(st, "read_snapshots", None) or {}
    hit = snapshots.get(key)
    if hit is not None and now - hit[0] < READ_SNAPSHOT_S:
        return Response(hit[1], media_type=hit[2], headers=hit[3])
    busy = getattr(st, "readers_busy", 0)
    if busy >= READERS or now < getattr(st, "read_free_at", 0.0):
        why = f"the state is being read already: retry in {READ_RETRY_AFTER_S} s"
        headers = {"Retry-After": str(READ_RETRY_AFTER_S), "Cache-Control": "no-store"}
        if request.url.path == "/":  # a browser: a page that asks again by itself
            return HTMLResponse(f'<!doctype html><meta http-equiv="refresh" content="{READ_RETRY_AFTER_S}">'
                                f"<title>fusebox fuse: busy</title><p>{why}</p>", status_code=503,
                                headers={**status_headers(), **headers})
        return problem(503, why, headers=headers)
    pool = getattr(st, "reader_threads", None)
    if pool is None:  # the event loop runs this: no other request creates one meanwhile
        pool = st.reader_threads = ThreadPoolExecutor(READERS, thread_name_prefix="fuse-read")
    st.readers_busy = busy + 1
    try:
        out: Response = await asyncio.get_running_loop().run_in_executor(pool, _handing_over, work)
    finally:
        st.readers_busy -= 1
    done = time.monotonic()
    if len(out.body) >= READ_HEAVY_BYTES:  # a heavy build: the next waits twice as long (reads <= 1/3 of the time)
        st.read_free_at = done + (READ_SHARE - 1) * (done - now)
    if out.status_code == 200:
        snapshots = {k: v for k, v in snapshots.items() if done - v[0] < READ_SNAPSHOT_S}
        if len(snapshots) < READ_SNAPSHOTS:
            snapshots[key] = (done, out.body, out.media_type,
                              {k: v for k, v in out.headers.items() if k.lower() not in ("content-length", "content-type")})
        st.read_snapshots = snapshots
    return out


def _handing_over(work):
    """``work()`` with the interpreter handed to a waiting thread every READ_SWITCH_S (Python's
    default, 5 ms, let a read make a notification wait that long at each of its steps)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, READ_SWITCH_S))
    try:
        return work()
    finally:
        sys.setswitchinterval(before)


def state_body(view: StateView, max_bytes: int = STATE_MAX_BYTES) -> bytes:
    """``view`` (:func:`state_view`) as JSON (as FastAPI writes it: UTF-8, compact) of at most
    ``max_bytes``, its scopes cut where the next one (with its ``levels`` entry) would pass them
    (one scope at least): ``scopes``, ``levels`` and ``next_offset`` then say what the answer holds;
    ``max_bytes`` is in it as ``limit_bytes``."""
    levels = view["levels"]
    head: dict[str, Any] = {**view, "scopes": [], "levels": {}, "limit_bytes": max_bytes, "next_offset": None}
    size = len(_dumps(head).encode()) + 20  # + a next_offset's digits
    pieces: list[bytes] = []
    for i, sc in enumerate(view["scopes"]):
        if i % YIELD_EVERY == 0:
            time.sleep(0)  # let a waiting thread (a notification) have the interpreter
        piece = _dumps(sc).encode()
        cost = len(piece) + 1 + (len(_dumps({sc["key"]: levels[sc["key"]]}).encode()) if sc["key"] in levels else 0)
        if pieces and size + cost > max_bytes:
            break
        pieces.append(piece)
        size += cost
    kept = [sc["key"] for sc in view["scopes"][:len(pieces)]]
    head["levels"] = {k: levels[k] for k in kept if k in levels}
    head["next_offset"] = view["offset"] + len(pieces) if len(pieces) < len(view["scopes"]) else view["next_offset"]
    text = _dumps(head)
    marker = '"scopes":[]'
    at = text.index(marker) + len(marker) - 1
    return text[:at].encode() + b",".join(pieces) + text[at:].encode()


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


@router.get("/state", responses=READ_RESPONSES)
async def state(request: Request, service: Service, _: Annotated[str, Depends(reader_token)],
                limit: Limit = STATE_LIMIT, offset: Offset = 0, scope: ScopeFilter = None, level: LevelFilter = 0):
    """``levels``: scope key -> highest tripped level of the page's scopes (absent: none);
    ``scopes``: details, in key order, ``limit`` (at most 1000) from ``offset``, fewer when their
    JSON would pass ``limit_bytes`` (4 MiB); ``total`` scopes match the filters (``scope``: labels
    they include, ``level``: tripped at least), ``tripped`` maps the first 100 tripped to their
    level, ``tripped_total`` counts them all, ``next_offset`` starts the next page (null: none).
    Times are Unix seconds with an ISO-8601 twin (``tripped_at`` and ``tripped_at_iso``...). At
    most 2 reads (this and the status page) at once: 503 with ``Retry-After`` over that."""
    query = page_query(limit, offset, scope, level)

    def work() -> Response:
        body = state_body(state_view(service.state(**query), service.clock()))
        return Response(body, media_type="application/json",
                        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"})

    return await bounded_read(request, work)


@router.get("/openapi.json", include_in_schema=False)
def openapi(request: Request, _: Annotated[str, Depends(reader_token)]):
    return request.app.openapi()


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus_metrics(service: Service):
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz", response_class=PlainTextResponse)
async def healthz():
    """Liveness: the process answers (it says nothing of the store or the adapters: /readyz).
    On the event loop: no worker thread to wait for."""
    return "ok"


@router.get("/readyz", responses={503: {"description": "not ready; the reason says why"}})
async def readyz(request: Request, service: Service):
    """Readiness: 200 when the store answers a read (and a write when its last write failed:
    a full disk) and at least one adapter is configured (the dry-run adapter counts); 503 ``{"status": "not ready", "reason": ...}`` otherwise. The read
    runs on the store's probe connection, in threads of its own: a notification being handled
    (holding the store's connection and the worker threads) does not delay it."""
    reason = await anyio.to_thread.run_sync(not_ready, service, limiter=request.app.state.probes)
    if reason:
        return JSONResponse({"status": "not ready", "reason": encodable(reason)}, status_code=503)
    return {"status": "ready", "adapters": sorted(service.labels.values()), "dry_run": service.dry_run}


StatusLimit = Annotated[int, Query(ge=1, le=STATUS_SCOPES, description="scopes per page")]


@router.get("/", response_class=HTMLResponse, responses=READ_RESPONSES)
async def status_page(request: Request, service: Service, _: Annotated[str, Depends(reader_token)],
                      limit: StatusLimit = STATUS_SCOPES, offset: Offset = 0, scope: ScopeFilter = None,
                      level: LevelFilter = 0):
    """Read-only status: per scope and level, since when, the alerts holding it (with links),
    the adapter calls made and pending, last decisions, the last truncated notification. A page
    of ``limit`` (at most 100) scopes from ``offset``, filtered as ``GET /state``; served as
    ``/state`` is (at most 2 reads at once), with security headers (:func:`status_headers`)."""
    query = page_query(limit, offset, scope, level)
    app = request.app.state

    def work() -> Response:
        st = service.state(**query)
        keep = {k: v for k, v in (("limit", limit), ("scope", scope), ("level", level)) if v}
        pages = {}
        if offset > 0:
            pages["prev"] = "?" + urlencode({**keep, "offset": max(0, offset - limit)})
        if st["next_offset"] is not None:
            pages["next"] = "?" + urlencode({**keep, "offset": st["next_offset"]})
        html = render_status(st, service.store.audit_log(STATUS_DECISIONS), now=service.clock(),
                             calls=service.store.audit_log(STATUS_CALL_ROWS, kinds=CALL_KINDS),
                             pending=pending_calls(service), links=app.links, alertmanager=app.alertmanager_url,
                             pages=pages)
        return HTMLResponse(html, headers=status_headers())

    return await bounded_read(request, work)


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
    from ..rules import scope_key, scope_of

    out = []
    for name, label in service.labels.items():
        for row in service.store.pending(name, limit=STATUS_ROWS):  # not the whole outbox of a backlog
            call = row["call"]
            out.append({"scope_key": scope_key(scope_of(call.scope)), "level": call.level,
                        "state": call.state, "adapter": label, "attempts": row["attempts"]})
    return out
