"""HTTP transport (FastAPI): maps requests to :class:`FuseService` calls and outcomes to codes.

==========================  =====  ===============================================================
Route                       Auth   Answers
==========================  =====  ===============================================================
POST /alertmanager          yes    200 applied or ignored; 400 malformed; 401; 413 too large;
                                   503 state not persisted (Alertmanager retries 5xx only)
POST /override              yes    200 with the decisions; 400 bad override; 401; 409 the scope is
                                   not exactly a known one (lists the candidates); 413; 503
GET  /state                 no     JSON: ``levels`` {scope key: highest tripped level}, ``scopes``
GET  /metrics               no     Prometheus text format
GET  /                      no     read-only HTML status page
GET  /healthz               no     200 "ok"
==========================  =====  ===============================================================

Authentication is ``Authorization: Bearer <token>`` (scheme case-insensitive, RFC 7235), the token
read from a file (Alertmanager's ``http_config.authorization.credentials_file``), compared with
:func:`hmac.compare_digest` (:func:`fusebox.fuse.actions.bearer_matches`).
"""

from __future__ import annotations

import html
import json
import re
import time
from datetime import datetime, timezone
from importlib import resources
from typing import Literal, Optional, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError


from .actions import bearer_matches
from .breaker import OverrideError, ScopeNotFound
from .payload import PayloadError, load_json, parse_payload
from .service import FuseService, Unavailable

__all__ = ["create_app", "MAX_BODY_BYTES"]

# Alertmanager caps a notification at max_alerts (0 = all); 1 MiB holds thousands of alerts.
MAX_BODY_BYTES = 1 << 20


class _Alert(BaseModel):
    model_config = ConfigDict(extra="allow")
    status: Optional[Literal["firing", "resolved"]] = None
    labels: dict[str, str]
    annotations: dict[str, str] = {}
    startsAt: str
    endsAt: Optional[str] = None
    generatorURL: Optional[str] = None
    fingerprint: Optional[str] = None


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
    alerts: list[_Alert]


# An override lasts at most a week: longer, and it outlives the incident it was for.
MAX_OVERRIDE_S = 7 * 86400


class OverrideRequest(BaseModel):
    """Force a level of a scope tripped or released until ``expires_in_s`` seconds from now.

    Strict types: ``"level": true`` or ``"expires_in_s": "600"`` are refused, not coerced.
    """

    model_config = ConfigDict(extra="ignore", strict=True)
    scope: dict[str, str] = Field(description="scope labels (cluster, host_name, instance, hw_id, engine)")
    level: int = Field(ge=1, le=99, description="the spec's fuse level: 1 freeze_admissions, 2 text_only_fallback, "
                                                "3 kv_cache_eviction")
    mode: Literal["trip", "release"]
    reason: str = Field(min_length=1, max_length=1000, description="why, for the audit log")
    expires_in_s: float = Field(gt=0, le=MAX_OVERRIDE_S, description="seconds until the override ends (required)")
    fleet: bool = Field(False, description='true, with "scope": {}, to override every scope of the fleet at once')
    new_scope: bool = Field(False, description="true to trip a scope that is part of a known one as a scope of its own")


def _validation_problem(e: ValidationError | RequestValidationError) -> JSONResponse:
    """A 400 a human can act on: ``{"error": "<field> must be ..., got ...", "field": "<field>"}``.

    Only the first problem is told (fix it and resend); pydantic's text and documentation URLs are left out.
    """
    err = e.errors()[0]
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    field = ".".join(loc) or "body"
    kind = err.get("type", "")
    if kind == "missing":
        msg = f"{field} is required"
    else:
        text = re.sub(r"^(Input|String|Value|Dictionary|List) should", "must", err.get("msg", "is invalid"))
        text = text.replace("a valid dictionary", "a JSON object")
        if kind in ("model_type", "model_attributes_type"):
            text = "must be a JSON object"
        got = json.dumps(err.get("input"), default=str)
        msg = f"{field} {text}, got {got[:60] + '...' if len(got) > 60 else got}"
    return JSONResponse({"status": "error", "error": msg, "field": field}, status_code=400)


def _schema(model) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema(ref_template="#/components/schemas/{model}")}}}}


def _problem(code: int, msg: str) -> JSONResponse:
    return JSONResponse({"status": "error", "error": msg}, status_code=code)


def create_app(service: FuseService, token: str, *, max_body: int = MAX_BODY_BYTES) -> FastAPI:
    """The ASGI app. ``token``: the bearer token both Alertmanager and SREs present."""
    if not token:
        raise ValueError("an empty token would let anyone trip fuses")
    app = FastAPI(title="fusebox fuse", version="1", description=__doc__.split("\n\n")[0])

    # pydantic's nested schemas (the _Alert model) must be in components for the $ref to resolve.
    def openapi():
        if app.openapi_schema:
            return app.openapi_schema
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        for m in (WebhookPayload, OverrideRequest):
            full = m.model_json_schema(ref_template="#/components/schemas/{model}")
            comps.update(full.pop("$defs", {}))
        schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request, exc):  # FastAPI says 422; Alertmanager and we say 400
        return _validation_problem(exc)

    def authorized(request: Request) -> bool:
        return bearer_matches(request.headers.get("authorization"), token)

    async def body_of(request: Request) -> bytes | Response:
        if not authorized(request):
            return JSONResponse({"status": "error", "error": "missing or wrong bearer token"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > max_body:
            return _problem(413, f"body over {max_body} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                return _problem(413, f"body over {max_body} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    responses = {400: {"description": "malformed"}, 401: {"description": "no or wrong token"},
                 413: {"description": "too large"}, 503: {"description": "state not persisted; retry"}}

    @app.post("/alertmanager", openapi_extra=_schema(WebhookPayload), responses=responses)
    async def alertmanager(request: Request):
        """Alertmanager webhook receiver (payload version 4)."""
        t0 = time.perf_counter()
        received = service.clock()
        body = await body_of(request)
        if isinstance(body, Response):
            service.metrics.notifications.labels(f"http_{body.status_code}").inc()
            return body
        try:
            note = parse_payload(body, received)
        except (ValidationError, PayloadError, ValueError) as e:
            service.metrics.notifications.labels("http_400").inc()
            return _problem(400, str(e)[:500])
        try:
            result = service.handle(note, received)
        except Unavailable as e:
            service.metrics.notifications.labels("http_503").inc()
            return _problem(503, f"state not persisted, retry: {e}")
        service.metrics.notifications.labels("applied" if result["decisions"] else "ignored").inc()
        service.metrics.request.observe(time.perf_counter() - t0)
        return {"status": "ok", **result}

    @app.post("/override", openapi_extra=_schema(OverrideRequest),
              responses={**responses, 409: {"description": "the scope is not exactly a known one; lists candidates"}})
    async def override(request: Request):
        """Force-trip or force-release a level of a scope for a while, with a reason (audited)."""
        body = await body_of(request)
        if isinstance(body, Response):
            return body
        try:
            req = OverrideRequest.model_validate(load_json(body))
        except PayloadError as e:
            return JSONResponse({"status": "error", "error": str(e)[:200], "field": "body"}, status_code=400)
        except ValidationError as e:
            return _validation_problem(e)
        try:
            decisions = service.override(req.scope, req.level, req.mode, req.reason, req.expires_in_s, fleet=req.fleet,
                                         new_scope=req.new_scope)
        except ScopeNotFound as e:  # 409: the request is well formed but names no scope exactly
            return JSONResponse({"status": "error", "error": str(e), "field": e.field, "scopes": e.scopes},
                                status_code=409)
        except OverrideError as e:
            return JSONResponse({"status": "error", "error": str(e), "field": e.field}, status_code=400)
        except Unavailable as e:
            return _problem(503, f"state not persisted, retry: {e}")
        return {"status": "ok", "decisions": decisions}

    @app.get("/state")
    def state():
        """``levels``: scope key -> highest tripped level (absent: none); ``scopes``: details."""
        return service.state()

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics():
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz():
        return "ok"

    @app.get("/", response_class=HTMLResponse)
    def status_page():
        """Read-only status: scopes, levels, alerts holding them, last decisions."""
        return render_status(service.state(), service.store.audit_log(30))

    return app


def _ts(t) -> str:
    if t is None:
        return ""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_status(state: dict, audit: list[dict]) -> str:
    """The status page as one HTML string (template in static/status.html, no script)."""
    e = html.escape
    rows = []
    for sc in state["scopes"]:
        for lvl, st in sc["levels"].items():
            ov = st["override"]
            ov_text = f"{ov['mode']} until {_ts(ov['until'])}: {ov['reason']}" if ov else ""
            rows.append(
                f'<tr class="{"tripped" if st["tripped"] else "ok"}" data-scope="{e(sc["key"])}" data-level="{e(lvl)}">'
                f'<td>{e(sc["key"])}</td><td>{e(lvl)}</td><td>{e(st["action"])}</td>'
                f'<td>{"TRIPPED" if st["tripped"] else "ok"}</td>'
                f'<td>{"<br>".join(e(a) for a in st["alerts"]) or "-"}</td>'
                f'<td>{e(_ts(st["release_at"]))}</td>'
                f'<td>{e(ov_text)}</td></tr>')
    drows = [
        f'<tr><td>{e(_ts(a["at"]))}</td><td>{e(a["kind"])}</td><td>{e(a["scope_key"] or "")}</td>'
        f'<td>{e(str(a["level"] or ""))}</td><td>{e(a["action"] or "")}</td><td>{e(a["source"] or "")}</td>'
        f'<td>{e(a["reason"] or "")}</td></tr>' for a in audit]
    summary = ", ".join(f"{e(k)}: level {v}" for k, v in sorted(state["levels"].items())) or "no fuse tripped"
    tpl = resources.files("fusebox.fuse").joinpath("static/status.html").read_text(encoding="utf-8")
    return (tpl.replace("{{summary}}", summary)
            .replace("{{scopes}}", "\n".join(rows) or '<tr><td colspan="7">no scope seen yet</td></tr>')
            .replace("{{decisions}}", "\n".join(drows) or '<tr><td colspan="7">no decision yet</td></tr>')
            .replace("{{mode}}", "dry-run (decisions are logged, not applied)" if state["dry_run"] else "live")
            .replace("{{pending}}", str(state["pending_actions"]))
            .replace("{{hold}}", f'{state["hold_s"]:g}'))

