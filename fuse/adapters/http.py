"""The generic HTTP action as a ``fuse.adapters`` kind, ``http`` (see :class:`HttpAction`).

Method, URL and JSON body per (trip, release) as Jinja2 templates rendered in
:class:`jinja2.sandbox.SandboxedEnvironment`; every value an URL template prints is
percent-encoded; the URL must reach one of the spec's ``hosts``; headers are read from files. It
cannot report what the target shows (an arbitrary API): it is not reconciled.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
from jinja2.sandbox import SandboxedEnvironment

from fusebox.spec.adapters import Adapter as AdapterSpec
from fusebox.spec.adapters import Target

from ..control import ControlCall
from .base import FromSpec, call_error, targets_for, unmapped
from .protocol import ActionError
from .transport import answer_text, call_deadline, deadline_client

__all__ = ["HttpAction"]


def _url_value(value: object) -> str:
    """What an URL template prints for ``{{ value }}``: percent-encoded, '/' included."""
    return quote("" if value is None else str(value), safe="")


class HttpAction(FromSpec):
    """The generic HTTP action of kind ``http`` (see the module's doc).

    Template context: ``scope`` (the target's ``match``: the spec's values), ``target`` (its ``vars``),
    ``action``, ``level``, ``state`` (trip|release), ``decision_id``. Raises at construction
    (OSError) when a headers file cannot be read.
    """

    kind = "http"

    def __init__(self, spec: AdapterSpec):
        super().__init__(spec)
        self._url_env = SandboxedEnvironment(finalize=_url_value, autoescape=False)
        self._body_env = SandboxedEnvironment(autoescape=False)
        self.headers = {k: Path(p).read_text(encoding="utf-8").strip() for k, p in spec.headers_files.items()}
        self._client = deadline_client(spec.timeout_s)

    def wants(self, call: ControlCall) -> bool:
        req = self.spec.trip if call.state == "trip" else self.spec.release
        return call.action in self.spec.actions and req is not None

    def render(self, call: ControlCall, target: Target) -> tuple[str, str, object]:
        """(method, url, body) for ``target``; raises ActionError (permanent) when the URL leaves the spec's hosts."""
        req = self.spec.trip if call.state == "trip" else self.spec.release
        assert req is not None
        ctx = {"scope": dict(target.match), "target": dict(target.vars), "action": call.action,
               "level": call.level, "state": call.state, "decision_id": call.decision_id}
        url = self._url_env.from_string(req.url).render(ctx)
        try:
            u = urlsplit(url)
            port = u.port or {"http": 80, "https": 443}.get(u.scheme)
        except ValueError:  # a port that is not a number
            u, port = urlsplit(""), None
        hostport = f"{(u.hostname or '').lower()}:{port}"
        if u.scheme not in ("http", "https") or (hostport not in self.spec.hosts and (u.hostname or "").lower() not in self.spec.hosts):
            e = ActionError(f"rendered URL leaves fuse.adapters.{self.spec.name}.hosts ({hostport[:200]}): refused",
                            summary="URL outside the spec's hosts: refused")
            e.permanent = True
            raise e
        return req.method, url, self._body(req.body, ctx)

    def _body(self, body: object, ctx: dict) -> object:
        if isinstance(body, str):
            return self._body_env.from_string(body).render(ctx)
        if isinstance(body, dict):
            return {k: self._body(v, ctx) for k, v in body.items()}
        if isinstance(body, list):
            return [self._body(v, ctx) for v in body]
        return body

    def apply(self, call: ControlCall) -> None:
        targets = targets_for(self.spec, call.scope)
        if not targets:
            raise unmapped(self.spec)
        with call_deadline(self.timeout_s):
            for t in targets:
                self._send(call, t)

    def _send(self, call: ControlCall, t: Target) -> None:
        method, url, body = self.render(call, t)
        headers = {**self.headers, "Idempotency-Key": call.decision_id}
        try:
            r = (self._client.request(method, url, headers=headers, json=body) if body is not None
                 else self._client.request(method, url, headers=headers))
        except httpx.HTTPError as e:
            raise call_error(url, e) from None
        if not 200 <= r.status_code < 300:
            raise ActionError(f"{method} {url}: HTTP {r.status_code} {answer_text(r)}", r.status_code)
