"""The fuse API's error answers and the exceptions that lead to them.

Every error is JSON: ``{"status": "error", "error": "<what, and how to fix it>", "field": "<the
request field at fault>"}`` (``field`` when one is). The handlers that turn the exceptions into
answers are in :mod:`fusebox.fuse.http.handlers`.
"""

import json
import re

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

DENIED = "missing or wrong token"
CHALLENGE = {"WWW-Authenticate": "Bearer"}


def count(metrics, path: str, outcome: str) -> None:
    """Count a refused request to ``/alertmanager`` in ``fusebox_fuse_notifications_total{outcome}``."""
    if path == "/alertmanager":
        metrics.notifications.labels(outcome).inc()


def validation_problem(e: ValidationError | RequestValidationError, content_type: str | None = None) -> JSONResponse:
    """A 400 a human can act on: ``{"error": "<field> must be ..., got ...", "field": "<field>"}``.

    Only the first problem is told (fix it and resend); pydantic's text and documentation URLs are left out.
    A body sent with another ``content_type`` than JSON's (FastAPI then hands the model the raw bytes)
    is told so: ``body must be sent as JSON with Content-Type: application/json ...``.
    """
    err = e.errors()[0]
    kind = err.get("type", "")
    if isinstance(err.get("input"), bytes) and [x for x in err.get("loc", ()) if x != "body"] == []:
        return problem(400, "body must be sent as JSON with Content-Type: application/json (this request's "
                            f"Content-Type: {(content_type or 'none')[:100]})", "body")
    if kind == "json_invalid":
        return problem(400, f"body is not JSON: {err.get('ctx', {}).get('error', 'decode error')}", "body")
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
    return problem(400, msg, field)


def problem(code: int, msg: str, field: str | None = None, headers: dict | None = None) -> JSONResponse:
    """The error answer ``{"status": "error", "error": msg, "field": field}`` with HTTP ``code``.

    The answer must encode whatever the request held: a lone surrogate quoted back is escaped.
    """
    body = {"status": "error", "error": encodable(msg)}
    if field is not None:
        body["field"] = encodable(field)
    return JSONResponse(body, status_code=code, headers=headers)


def encodable(text: str) -> str:
    """``text`` with lone surrogates written as backslash escapes (encodable as UTF-8)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class Denied(Exception):
    """No token, or not one of the role's (HTTP 401)."""

    def __init__(self, basic: bool = False):
        self.basic = basic  # also offer Basic: a browser then asks for the token


class BadQuery(Exception):
    """A query parameter that parses but means nothing (HTTP 400)."""

    def __init__(self, message: str, field: str):
        self.message, self.field = message, field


class Limited(Exception):
    """Too many failed authentications from the client (HTTP 429); ``retry_after``: whole seconds."""

    def __init__(self, retry_after: int):
        self.retry_after = retry_after
