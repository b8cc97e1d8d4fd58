"""The fuse API's exception handlers: every refusal is a JSON error (:mod:`fusebox.fuse.http.errors`).

=========================  ====  ==============================================================
exception                  code  notes
=========================  ====  ==============================================================
Limited                    429   ``Retry-After``: whole seconds
Denied                     401   ``WWW-Authenticate: Bearer`` (and Basic for the read routes)
RequestValidationError     400   FastAPI says 422; Alertmanager and we say 400 (the first problem,
                                 worded for a person); 401 first when the token is missing or wrong
HTTPException              400   FastAPI's own: a body it could not parse (nested too deeply);
                                 401 first, as above; other codes passed on
BadQuery                   400   a query parameter that parses but means nothing
StoreError                 503   a read a page needs (the audit) failed: never 500
=========================  ====  ==============================================================

401, 400 and 429 answers to ``POST /alertmanager`` count in ``fusebox_fuse_notifications_total``
(``http_401``...).
"""


from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ..store import StoreError
from .deps import authorized
from .errors import CHALLENGE, DENIED, BadQuery, Denied, Limited, count, problem, validation_problem


def _count(request: Request, outcome: str) -> None:
    count(request.app.state.service.metrics, request.url.path, outcome)


def limited(request: Request, exc: Limited) -> JSONResponse:
    """429, with ``Retry-After``."""
    _count(request, "http_429")
    return problem(429, f"too many failed authentications from this client; retry after {exc.retry_after} s",
                   headers={"Retry-After": str(exc.retry_after)})


def denied(request: Request, exc: Denied | None = None) -> JSONResponse:
    """401, with a Bearer challenge (and a Basic one when ``exc.basic``)."""
    _count(request, "http_401")
    r = problem(401, DENIED, headers=CHALLENGE)
    if exc is not None and exc.basic:  # one challenge per header: browsers then ask for the token
        r.headers.append("WWW-Authenticate", 'Basic realm="fusebox fuse"')
    return r


async def _limited(request, exc):
    return limited(request, exc)


async def _denied(request, exc):
    return denied(request, exc)


async def _bad_request(request, exc):  # FastAPI says 422; Alertmanager and we say 400
    try:
        if not await authorized(request):
            return denied(request)
    except Limited as e:
        return limited(request, e)
    _count(request, "http_400")
    return validation_problem(exc, request.headers.get("content-type"))


async def _http_error(request, exc):  # FastAPI's own: a body it could not parse (nested too deeply)
    if exc.status_code == 401:
        return denied(request, Denied(basic=True))
    try:
        if exc.status_code == 400 and not await authorized(request):
            return denied(request)
    except Limited as e:
        return limited(request, e)
    if exc.status_code == 400:
        _count(request, "http_400")
        return problem(400, "body is not usable JSON (nested too deeply, or not UTF-8)", "body")
    return problem(exc.status_code, str(exc.detail)[:200])


async def _bad_query(request, exc):
    return problem(400, exc.message, exc.field)


async def _store_error(request, exc):  # a read the page needs (the audit): 503, never 500
    return problem(503, f"store unreachable, retry: {exc}"[:500])


def install_handlers(app: FastAPI) -> None:
    """Register the handlers of the table above on ``app``."""
    app.add_exception_handler(Limited, _limited)
    app.add_exception_handler(Denied, _denied)
    app.add_exception_handler(RequestValidationError, _bad_request)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(BadQuery, _bad_query)
    app.add_exception_handler(StoreError, _store_error)
