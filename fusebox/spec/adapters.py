"""The spec's ``fuse.adapters``: what the fuse service calls, on which targets, for which actions.

Shape (``docs/fuse.md`` has an example per kind)::

    fuse:
      adapters:
        <name>:                       # the adapter's label in metrics, the audit and the status page
          kind: sglang_gateway        # sglang_gateway | vllm_router | http (conventions.ADAPTER_LEVELS)
          url: http://127.0.0.1:30000 # the gateway (sglang_gateway, vllm_router)
          actions: [freeze_admissions, kv_cache_eviction]   # fuse.actions it applies
          timeout: 5s                 # per call
          max_attempts: 5             # optional: give up after N attempts (default: retry until applied)
          targets:                    # scope -> target, explicit; an unmapped scope is refused
            - match: {engine: engine-0}
              worker_url: http://10.0.0.5:30001          # sglang_gateway, vllm_router
              vars: {model: llama-3-8b}                  # http: values its templates may use
          hosts: [dynamo:8000]        # http: the only host:port its URLs may reach
          socket: /run/haproxy/admin.sock   # haproxy: its runtime API (stats socket, level admin)
          # haproxy targets name a server: - match: {engine: engine-0}; server: be_llm/engine0
          headers_files: {Authorization: /etc/fusebox/dynamo.auth}   # http: header -> file with its value
          trip: {method: POST, url: "...", body: {...}}  # http: Jinja2 templates (sandboxed)
          release: {method: POST, url: "...", body: {...}}

Every problem is a :class:`~fusebox.spec.errors.Problem` at its line; an action whose level the
kind cannot apply is one of them (the fuse service exits 2 naming that line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional
from urllib.parse import urlsplit

from jinja2 import TemplateSyntaxError
from jinja2.sandbox import SandboxedEnvironment
from pydantic import BaseModel, ConfigDict

from fusebox import conventions as C

__all__ = ["RawAdapter", "Adapter", "Target", "Request", "normalise_adapters", "KINDS"]

KINDS = tuple(C.ADAPTER_LEVELS)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class RawTarget(_Strict):
    match: dict[str, str]
    worker_url: Optional[str] = None
    server: Optional[str] = None
    vars: dict[str, str] = {}


class RawRequest(_Strict):
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    url: str
    body: Any = None


class RawAdapter(_Strict):
    kind: Literal[KINDS]  # type: ignore[valid-type]
    url: Optional[str] = None
    socket: Optional[str] = None
    actions: list[str]
    timeout: Any = "5s"
    max_attempts: Optional[int] = None
    targets: list[RawTarget]
    hosts: list[str] = []
    headers_files: dict[str, str] = {}
    trip: Optional[RawRequest] = None
    release: Optional[RawRequest] = None


@dataclass(frozen=True)
class Target:
    """One scope -> target row: ``match`` (scope labels, the spec's values), ``worker_url``, ``vars``."""

    match: dict[str, str]
    worker_url: Optional[str] = None
    vars: dict[str, str] = field(default_factory=dict)
    server: Optional[str] = None  # haproxy: "<backend>/<server>"


@dataclass(frozen=True)
class Request:
    """An HTTP request template: ``method``, ``url`` (Jinja2 text), ``body`` (JSON-like, string leaves are templates)."""

    method: str
    url: str
    body: Any = None


@dataclass(frozen=True)
class Adapter:
    """A normalised ``fuse.adapters.<name>``; ``timeout_s`` in seconds; ``path`` its spec path."""

    name: str
    kind: str
    url: Optional[str]
    actions: tuple[str, ...]
    timeout_s: float
    max_attempts: Optional[int]
    targets: tuple[Target, ...]
    hosts: tuple[str, ...] = ()
    headers_files: dict[str, str] = field(default_factory=dict)
    trip: Optional[Request] = None
    release: Optional[Request] = None
    socket: Optional[str] = None  # haproxy: the runtime API's UNIX socket


# HAProxy proxy and server names: letters, digits, '-', '_', '.' and ':' (its cfgparse rule);
# nothing that could end a runtime-API command or start another (no space, ';' or newline).
_HAPROXY_SERVER = re.compile(r"^[A-Za-z0-9_.:-]+/[A-Za-z0-9_.:-]+$")


def _http_url(value: str) -> bool:
    try:
        u = urlsplit(value)
        return u.scheme in ("http", "https") and bool(u.hostname) and (u.port or 0) >= 0
    except ValueError:
        return False


def _template_strings(body: Any, path: tuple) -> list[tuple[tuple, str]]:
    if isinstance(body, str):
        return [(path, body)]
    if isinstance(body, dict):
        return [x for k, v in body.items() for x in _template_strings(v, path + (k,))]
    if isinstance(body, list):
        return [x for i, v in enumerate(body) for x in _template_strings(v, path + (i,))]
    return []


def normalise_adapters(raw: dict[str, RawAdapter], levels: dict[str, int], duration: Callable[[Any, tuple], float],
                       err: Callable[..., None]) -> tuple[Adapter, ...]:
    """Check ``fuse.adapters`` against the kinds' levels (:data:`fusebox.conventions.ADAPTER_LEVELS`)
    and ``levels`` (fuse action name -> level); problems go to ``err(path, what, fix)``."""
    env = SandboxedEnvironment()
    out = []
    for name, a in raw.items():
        path = ("fuse", "adapters", name)
        can = C.ADAPTER_LEVELS[a.kind]
        if not a.actions:
            err(path + ("actions",), f"adapter {name!r} applies no action", f"list the fuse actions it applies, e.g. [{next(iter(levels), 'x')}]")
        for i, act in enumerate(a.actions):
            if act not in levels:
                err(path + ("actions", i), f"unknown fuse action {act!r}", f"use one of: {', '.join(levels)}")
            elif levels[act] not in can:
                err(path + ("actions", i), f"adapter kind {a.kind} cannot apply fuse level {levels[act]} ({act})",
                    f"it applies levels {', '.join(map(str, can))}: remove {act!r} here and give it to an adapter that can "
                    "(e.g. kind: http)")
        if a.kind in ("sglang_gateway", "vllm_router") and not (a.url and _http_url(a.url)):
            err(path + (("url",) if a.url else ()), f"adapter {name!r} needs the gateway's url", "e.g. url: http://127.0.0.1:30000")
        if a.max_attempts is not None and a.max_attempts < 1:
            err(path + ("max_attempts",), "max_attempts must be >= 1", "leave it out to retry until applied")
        timeout = duration(a.timeout, path + ("timeout",))
        if not a.targets:
            err(path + ("targets",), f"adapter {name!r} has no targets", "map scopes to targets: - match: {engine: engine-0} ...")
        for i, t in enumerate(a.targets):
            tp = path + ("targets", i)
            if not t.match:
                err(tp + ("match",), "a target needs a match", "e.g. match: {engine: engine-0}")
            for k in t.match:
                if k not in C.SCOPE_LABELS:
                    err(tp + ("match", k), f"{k!r} is not a scope label", f"use one of: {', '.join(C.SCOPE_LABELS)}", key=True)
            if a.kind == "haproxy":
                if not (t.server and _HAPROXY_SERVER.match(t.server)):
                    err(tp + (("server",) if t.server else ()), f"this target needs a server <backend>/<server>, got {t.server!r}",
                        "e.g. server: be_llm/engine0 (letters, digits, '-', '_', '.', ':')")
            elif a.kind == "http":
                if t.worker_url:
                    err(tp + ("worker_url",), "an http adapter has no worker_url", "put what its templates need under vars:")
            elif not (t.worker_url and _http_url(t.worker_url)):
                err(tp, "this target needs a worker_url (http or https)", "e.g. worker_url: http://10.0.0.5:30001")
        if a.socket and a.kind != "haproxy":
            err(path + ("socket",), "socket is for kind haproxy only", f"remove it from this {a.kind} adapter", key=True)
        if a.kind == "haproxy" and not a.socket:
            err(path, f"haproxy adapter {name!r} needs its runtime API socket", "socket: /run/haproxy/admin.sock")
        if a.kind == "http":
            if not a.hosts:
                err(path, f"http adapter {name!r} lists no hosts", "hosts: [host:port] -- the only ones its URLs may reach")
            if a.trip is None:
                err(path, f"http adapter {name!r} has no trip request", "trip: {method: POST, url: ..., body: {...}}")
            for which in ("trip", "release"):
                req = getattr(a, which)
                if req is None:
                    continue
                for p, text in [(path + (which, "url"), req.url), *_template_strings(req.body, path + (which, "body"))]:
                    try:
                        env.parse(text)
                    except TemplateSyntaxError as e:
                        err(p, f"Jinja2 template error: {e.message}", "fix the template ({{ ... }} and {% ... %})")
        else:
            for which in ("hosts", "headers_files", "trip", "release"):
                if getattr(a, which):
                    err(path + (which,), f"{which} is for kind http only", f"remove it from this {a.kind} adapter", key=True)
        out.append(Adapter(
            name=name, kind=a.kind, url=a.url.rstrip("/") if a.url else None, actions=tuple(a.actions),
            timeout_s=timeout, max_attempts=a.max_attempts,
            targets=tuple(Target(dict(t.match), t.worker_url.rstrip("/") if t.worker_url else None, dict(t.vars), t.server)
                          for t in a.targets), socket=a.socket,
            hosts=tuple(h.lower() for h in a.hosts), headers_files=dict(a.headers_files),
            trip=Request(a.trip.method, a.trip.url, a.trip.body) if a.trip else None,
            release=Request(a.release.method, a.release.url, a.release.body) if a.release else None))
    return tuple(out)
