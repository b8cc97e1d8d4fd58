"""Kind ``http``: a generic HTTP action (runtime: ``fuse/adapters/http.py``) that does what its
Jinja2 templates say (sandboxed): every level. ``trip`` and ``release`` are ``{method, url, body}``
requests, ``hosts`` the only ``host:port`` its URLs may reach, ``headers_files`` header -> the file
holding its value; targets carry ``vars`` for the templates and no ``worker_url``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jinja2 import TemplateSyntaxError
from jinja2.sandbox import SandboxedEnvironment

from .base import AdapterKind, Err

if TYPE_CHECKING:
    from fusebox.spec.adapters import RawAdapter, RawTarget

__all__ = ["KIND", "HttpKind"]


def _template_strings(body: object, path: tuple) -> list[tuple[tuple, str]]:
    if isinstance(body, str):
        return [(path, body)]
    if isinstance(body, dict):
        return [x for k, v in body.items() for x in _template_strings(v, path + (k,))]
    if isinstance(body, list):
        return [x for i, v in enumerate(body) for x in _template_strings(v, path + (i,))]
    return []


class HttpKind(AdapterKind):
    name = "http"
    levels = (1, 2, 3)
    fields = ("hosts", "headers_files", "trip", "release")
    credentials_fix = "put the header under headers_files: {Authorization: FILE}"

    def check_target(self, t: RawTarget, path: tuple, err: Err) -> None:
        """No ``worker_url``: what the templates need goes under ``vars``."""
        if t.worker_url:
            err(path + ("worker_url",), "an http adapter has no worker_url", "put what its templates need under vars:")

    def check_fields(self, a: RawAdapter, name: str, path: tuple, levels: dict[str, int], err: Err) -> None:
        """``hosts`` and ``trip`` required; every template (url, string leaves of body) parses."""
        if not a.hosts:
            err(path, f"http adapter {name!r} lists no hosts", "hosts: [host:port] -- the only ones its URLs may reach")
        if a.trip is None:
            err(path, f"http adapter {name!r} has no trip request", "trip: {method: POST, url: ..., body: {...}}")
        env = SandboxedEnvironment()
        for which in ("trip", "release"):
            req = getattr(a, which)
            if req is None:
                continue
            for p, text in [(path + (which, "url"), req.url), *_template_strings(req.body, path + (which, "body"))]:
                try:
                    env.parse(text)
                except TemplateSyntaxError as e:
                    err(p, f"Jinja2 template error: {e.message}", "fix the template ({{ ... }} and {% ... %})")


KIND = HttpKind()
