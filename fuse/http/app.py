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
GET  /healthz               none      200 "ok" (liveness: the process answers; as a connection's
                                      first request answered by the server before the app and its
                                      connection caps, :mod:`fusebox.fuse.http.server`; else on the
                                      event loop, which no notification blocks)
GET  /readyz                none      200 ``{"status": "ready"}`` when the store answers a read (and a
                                      write, when the last one failed) and an adapter is
                                      configured (dry-run counts); else 503 with
                                      ``{"status": "not ready", "reason": ...}``
==========================  ========  =============================================================

Tokens (:mod:`fusebox.fuse.tokens`): *webhook* is Alertmanager's; *a person* is one of the named
override tokens, whose name the audit records; *reader* is the read token when one is configured,
else the webhook token, and any person's token. ``Authorization: Bearer <token>``, the scheme in
any case (RFC 7235), each token compared in constant time. A missing or wrong token is answered 401
from the request's head, before its body is read (nothing of it is used); a ``Content-Length`` over
the limit is 413 before the token is looked at. Failed authentications are counted per role; a
client address with ``AUTH_FAILURES`` of them in ``AUTH_WINDOW_S`` seconds has its wrong tokens
answered 429 (``Retry-After``) on every route that needs a token; a right token is never refused
by it.

The app in rooms: request bodies in :mod:`~fusebox.fuse.http.models`, the token and service
dependencies in :mod:`~fusebox.fuse.http.deps`, the routes in :mod:`~fusebox.fuse.http.routes`, the
error answers in :mod:`~fusebox.fuse.http.errors` and their handlers in
:mod:`~fusebox.fuse.http.handlers`; :func:`create_app` wires them and keeps what they share in
``app.state``.
"""


from concurrent.futures import ThreadPoolExecutor

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ..intake.webhook import MAX_LABEL_VALUE, WebhookPayload
from ..service import FuseService
from ..tokens import TokenFiles, Tokens
from .deps import AUTH_FAILURES, AUTH_WINDOW_S, ROLES, AuthLimiter, bearer
from .errors import Denied, Limited, count, problem
from .handlers import denied, install_handlers, limited
from .models import OverrideRequest
from .routes import PROBE_THREADS, WEBHOOK_THREADS, router
from .status import STATUS_ROWS, StatusLinks, render_status

__all__ = ["create_app", "render_status", "MAX_BODY_BYTES", "MAX_LABEL_VALUE", "STATUS_ROWS", "WebhookPayload",
           "OverrideRequest", "StatusLinks"]

# Alertmanager caps a notification at max_alerts (0 = all); 1 MiB holds thousands of alerts.
MAX_BODY_BYTES = 1 << 20


class _BodyLimit:
    """ASGI middleware: what can be refused from a request's head is refused before its body is
    read, so a client without a token cannot hold a connection by trickling a body. For a request
    with a body (not GET, HEAD, OPTIONS): a ``Content-Length`` over ``max_body`` bytes is 413, then
    on the routes that need a token (``POST /alertmanager``, ``POST /override``) a missing or wrong
    one is 401 (429 while the client is over its failures); these answers say ``Connection: close``
    (the server discards the unread body, then closes). Then the body is read, counted as it comes
    (a streamed one over ``max_body``: 413), and handed to the app whole. ``on_413(path)`` counts a
    413. The route's name for the token is left in ``scope["fusebox.token"]``."""

    def __init__(self, app, max_body: int, on_413):
        self.app, self.max_body, self.on_413 = app, max_body, on_413

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_body:
            return await self._too_large(scope, receive, send)
        refused = await _token_refusal(scope)
        if refused is not None:
            refused.headers["connection"] = "close"
            return await refused(scope, receive, send)
        body = bytearray()
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # the client left (or its request's deadline passed)
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
        r = problem(413, f"body over {self.max_body} bytes")
        r.headers["connection"] = "close"
        await r(scope, receive, send)


async def _token_refusal(scope) -> Response | None:
    """The answer to a request to a token route whose token is missing or wrong (401) or whose
    client is over its failures (429), from its head alone; None: no token route, or its token is
    right (its name then in ``scope["fusebox.token"]``)."""
    dep = ROLES.get(scope["path"])
    if dep is None:
        return None
    request = Request(scope)
    try:
        scope["fusebox.token"] = dep(request, await bearer(request))
    except Denied as e:
        return denied(request, e)
    except Limited as e:
        return limited(request, e)
    return None


def create_app(service: FuseService, tokens: Tokens | TokenFiles | str, *, max_body: int = MAX_BODY_BYTES,
               links: StatusLinks | None = None, auth_failures: int = AUTH_FAILURES,
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
    tokens.current()  # fails now, not on the first request
    app = FastAPI(title="fusebox fuse", version="1", description=(__doc__ or "").split("\n\n")[0],
                  openapi_url=None, docs_url=None, redoc_url=None)
    app.state.service = service
    app.state.tokens = tokens
    app.state.limiter = AuthLimiter(auth_failures, auth_window_s)
    app.state.links = links
    app.state.alertmanager_url = ""  # the externalURL of the last notification (Alertmanager's own address)
    app.state.probes = anyio.CapacityLimiter(PROBE_THREADS)  # /readyz's threads
    # the notifications' threads (started when needed, ended at exit)
    app.state.webhook_threads = ThreadPoolExecutor(WEBHOOK_THREADS, thread_name_prefix="fuse-webhook")
    app.add_middleware(_BodyLimit, max_body=max_body, on_413=lambda path: count(service.metrics, path, "http_413"))
    install_handlers(app)
    app.include_router(router)
    return app
