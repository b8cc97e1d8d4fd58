"""The fuse API's dependencies: the service behind the app, and the token each route needs.

The app keeps what they need in ``app.state`` (:func:`fusebox.fuse.http.app.create_app` sets it):
``service`` (the :class:`~fusebox.fuse.service.FuseService`), ``tokens`` (a
:class:`~fusebox.fuse.tokens.Tokens` or :class:`~fusebox.fuse.tokens.TokenFiles`: ``current()``),
``limiter`` (:class:`AuthLimiter`). A token dependency answers the name the token belongs to
(``"webhook"``, a person's name, a reader's) or raises :class:`~fusebox.fuse.http.errors.Denied`
(401), or :class:`~fusebox.fuse.http.errors.Limited` (429) when the token is wrong and the client
is over its failures: a right token is never refused by the failure limiter.

The client is the connection's peer address; ``X-Forwarded-For`` replaces it only from the
proxies ``fuse serve --forwarded-allow-ips`` names (none by default: see
:func:`fusebox.fuse.http.server.server_options`).
"""

# No `from __future__ import annotations`: FastAPI reads these annotations.

import collections
import math
import threading
import time
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBasic, HTTPBasicCredentials, HTTPBearer

from ..service import FuseService
from ..tokens import match
from .errors import Denied, Limited

# Failed authentications a client (its address) may make in AUTH_WINDOW_S seconds before its wrong
# tokens are answered 429 (a right token never is); clients remembered at most (the least recent forgotten).
AUTH_FAILURES = 20
AUTH_WINDOW_S = 60.0
AUTH_CLIENTS = 10_000


class AuthLimiter:
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


bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <token> (scheme in any case)")
basic = HTTPBasic(auto_error=False, realm="fusebox fuse",
                  description="for browsers, read routes only: any user name, a reader token as password")
Bearer = Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]


def service_of(request: Request) -> FuseService:
    """The :class:`FuseService` the app serves (``app.state.service``)."""
    return request.app.state.service


Service = Annotated[FuseService, Depends(service_of)]


def _presented(creds: HTTPAuthorizationCredentials | None) -> str | None:
    return creds.credentials.strip(" ") if creds else None


def _check(request: Request, role: str, tokens: dict[str, str], given: str | None) -> str | None:
    """The name in ``tokens`` whose token is ``given``, else None (counted, and charged to the
    client). A right token is never refused; a wrong one raises Limited while its client is over
    its failures (so a neighbour's failures cannot shut out Alertmanager on the same address)."""
    name = match(given, tokens)
    if name is not None:
        return name
    state = request.app.state
    metrics = state.service.metrics
    client = request.client.host if request.client else "-"
    wait = state.limiter.wait(client)
    if wait:
        metrics.auth_limited.labels(role).inc()
        raise Limited(wait)
    metrics.auth_failures.labels(role).inc()
    state.limiter.failed(client)
    return None


def webhook_token(request: Request, creds: Bearer) -> str:
    """Alertmanager's token (``POST /alertmanager``)."""
    if _check(request, "webhook", {"webhook": request.app.state.tokens.current().webhook}, _presented(creds)) is None:
        raise Denied()
    return "webhook"


def person_token(request: Request, creds: Bearer) -> str:
    """One of the named override tokens (``POST /override``): the person's name, for the audit."""
    name = _check(request, "override", request.app.state.tokens.current().people, _presented(creds))
    if name is None:
        raise Denied()
    return name


def reader_token(request: Request, creds: Bearer, login: Annotated[HTTPBasicCredentials | None, Security(basic)]) -> str:
    """A reader's token (``GET /state``, the status page, ``/openapi.json``): Bearer, or Basic with
    the token as password so that a browser can ask for it."""
    given = login.password if login else _presented(creds)
    name = _check(request, "read", request.app.state.tokens.current().readers(), given)
    if name is None:
        raise Denied(basic=True)
    return name


ROLES = {"/alertmanager": webhook_token, "/override": person_token}  # the POST routes that need a token


async def authorized(request: Request) -> bool:
    """For a request refused before its dependencies ran (a body that is not JSON): does it carry
    its route's token? Raises Limited as the dependencies do."""
    dep = ROLES.get(request.url.path)
    if dep is None:
        return True
    try:
        dep(request, await bearer(request))
    except Denied:
        return False
    return True
