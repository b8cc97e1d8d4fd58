"""The spec's ``fuse.adapters``: what the fuse service calls, on which targets, for which actions.

Shape (``docs/fuse.md`` has an example per kind)::

    fuse:
      adapters:
        <name>:                       # the adapter's label in metrics, the audit and the status page
          kind: sglang_gateway        # sglang_gateway | vllm_router | haproxy | http (conventions.ADAPTER_LEVELS)
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
          discover:                   # sglang_gateway, vllm_router: GPU and engine (namespace/pod) scopes -> workers
            prometheus: http://kps-kube-prometheus-stack-prometheus.monitoring:9090   # default: --prometheus-url
            ttl: 30s                  # how long one resolution is reused (1s..10m)
            # exported_*: read where the scrape renamed them (the GPU Operator's ServiceMonitor,
            # honorLabels false), the plain label where it did not (fuse/adapters/discovery.py)
            attribution: {metric: DCGM_FI_DEV_FB_USED, gpu: UUID, pod: exported_pod, namespace: exported_namespace}
          text_only:                  # haproxy, level 2: a map entry per backend (haproxy/fusebox.cfg reads it)
            map: /etc/haproxy/fusebox-text-only.map     # the map file HAProxy loads (created empty)
            backend: be_llm_text                        # where multimodal requests go while tripped
            header: X-Fusebox-Multimodal                # what marks a request multimodal (default)
          headers_files: {Authorization: /etc/fusebox/dynamo.auth}   # http: header -> file with its value
          credentials_file: /var/run/secrets/fusebox-gateway/key  # sglang_gateway, vllm_router: the control-plane
                                      # key, sent as Authorization: Bearer (smg --control-plane-api-keys)
          trip: {method: POST, url: "...", body: {...}}  # http: Jinja2 templates (sandboxed)
          release: {method: POST, url: "...", body: {...}}

Every problem is a :class:`~fusebox.spec.errors.Problem` at its line; an action whose level the
kind cannot apply is one of them (the fuse service exits 2 naming that line).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from jinja2 import TemplateSyntaxError
from jinja2.sandbox import SandboxedEnvironment
from pydantic import BaseModel, ConfigDict

from fusebox import conventions as C

__all__ = ["RawAdapter", "Adapter", "Target", "Request", "TextOnly", "Discover", "DISCOVER_KINDS", "CREDENTIAL_KINDS",
           "normalise_adapters", "KINDS", "TEXT_ONLY_LEVEL"]

KINDS = tuple(C.ADAPTER_LEVELS)
TEXT_ONLY_LEVEL = 2  # the fuse level the haproxy adapter applies through its map (text-only fallback)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class RawTarget(_Strict):
    match: dict[str, str]
    worker_url: str | None = None
    server: str | None = None
    vars: dict[str, str] = {}


class RawRequest(_Strict):
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    url: str
    body: Any = None


class RawTextOnly(_Strict):
    map: str
    backend: str
    header: str = "X-Fusebox-Multimodal"


class RawAttribution(_Strict):
    metric: str = "DCGM_FI_DEV_FB_USED"
    gpu: str = "UUID"
    # The GPU Operator's dcgm-exporter ServiceMonitor does not honor the exporter's labels: its
    # pod attribution lands in exported_pod/exported_namespace (read as pod/namespace where the
    # scrape did honor them: fusebox.fuse.adapters.discovery.pod_label).
    pod: str = "exported_pod"
    namespace: str = "exported_namespace"


class RawDiscover(_Strict):
    prometheus: str | None = None  # None: the fuse's --prometheus-url (kubernetes.fuse.prometheus_url)
    ttl: Any = "30s"
    attribution: RawAttribution = RawAttribution()


class RawAdapter(_Strict):
    kind: Literal[KINDS]  # type: ignore[valid-type]
    url: str | None = None
    socket: str | None = None
    actions: list[str]
    timeout: Any = "5s"
    max_attempts: int | None = None
    targets: list[RawTarget] = []
    hosts: list[str] = []
    headers_files: dict[str, str] = {}
    credentials_file: str | None = None
    trip: RawRequest | None = None
    release: RawRequest | None = None
    text_only: RawTextOnly | None = None
    discover: RawDiscover | None = None


@dataclass(frozen=True)
class Discover:
    """GPU or engine scope -> workers, from trusted series only (``fuse.adapters.<name>.discover``).

    ``prometheus``: its base URL (None: ``fusebox fuse serve --prometheus-url``, which the generated
    Deployment passes from ``kubernetes.fuse.prometheus_url``); ``ttl_s``: seconds one resolution is reused (1 to 600);
    ``metric``: a series per (GPU, pod) with the GPU id in label ``gpu`` (the scope's ``hw_id``)
    and the pod in ``pod``/``namespace`` (dcgm-exporter with Kubernetes pod mapping:
    ``DCGM_FI_DEV_FB_USED{UUID, pod, namespace}``, renamed ``exported_pod``/``exported_namespace``
    by a scrape without honorLabels; an ``exported_X`` label is read as ``X`` where a job's series
    carry no ``exported_`` label); pod IPs come from kube-state-metrics'
    ``kube_pod_info{namespace, pod, pod_ip}`` (``exported_*`` alike). An engine scope
    (``engine="<namespace>/<pod>"``) needs only the pod IPs."""

    prometheus: str | None
    ttl_s: float
    metric: str
    gpu: str
    pod: str
    namespace: str


# Kinds whose targets can be discovered (the gateway's own worker list is joined with the pods).
DISCOVER_KINDS = ("sglang_gateway", "vllm_router")
# Kinds that send a control-plane credential from ``credentials_file`` (the gateways' own APIs).
CREDENTIAL_KINDS = ("sglang_gateway", "vllm_router")
DISCOVER_TTL_RANGE_S = (1.0, 600.0)
_PROM_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_PROM_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*\Z")


@dataclass(frozen=True)
class TextOnly:
    """haproxy's text-only fallback: the runtime-API ``map`` file, the text-only ``backend``, the
    request ``header`` whose presence marks a request multimodal."""

    map: str
    backend: str
    header: str


@dataclass(frozen=True)
class Target:
    """One scope -> target row: ``match`` (scope labels, the spec's values), ``worker_url``, ``vars``."""

    match: dict[str, str]
    worker_url: str | None = None
    vars: dict[str, str] = field(default_factory=dict)
    server: str | None = None  # haproxy: "<backend>/<server>"


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
    url: str | None
    actions: tuple[str, ...]
    timeout_s: float
    max_attempts: int | None
    targets: tuple[Target, ...]
    hosts: tuple[str, ...] = ()
    headers_files: dict[str, str] = field(default_factory=dict)
    trip: Request | None = None
    release: Request | None = None
    socket: str | None = None  # haproxy: the runtime API's UNIX socket
    text_only: TextOnly | None = None  # haproxy: level 2 through a map
    discover: Discover | None = None  # sglang_gateway, vllm_router: GPU scopes -> workers
    # sglang_gateway, vllm_router: the file holding the gateway's control-plane key (sent as
    # ``Authorization: Bearer``; read again when it changes); None: no credential is sent
    credentials_file: str | None = None


# HAProxy proxy and server names: letters, digits, '-', '_', '.' and ':' (its cfgparse rule);
# nothing that could end a runtime-API command or start another (no space, ';' or newline).
# Checked with fullmatch: with match, '$' also matches before a trailing newline ("be/x\n").
_HAPROXY_NAME = r"[A-Za-z0-9_.:-]+"
_HAPROXY_SERVER = re.compile(rf"^{_HAPROXY_NAME}/{_HAPROXY_NAME}\Z")
_HAPROXY_BACKEND = re.compile(rf"^{_HAPROXY_NAME}\Z")
# A map file as HAProxy names it on the runtime API: an absolute path, no space, ';' or newline.
_HAPROXY_MAP = re.compile(r"^/[A-Za-z0-9_.@+/-]+\Z")
_HEADER = re.compile(r"^[A-Za-z0-9-]+\Z")


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
        if not a.targets and a.discover is None:
            err(path + ("targets",), f"adapter {name!r} has no targets", "map scopes to targets: - match: {engine: engine-0} ...")
        discover = _check_discover(a, name, path, duration, err)
        _check_credentials_file(a, path, err)
        for i, t in enumerate(a.targets):
            tp = path + ("targets", i)
            if not t.match:
                err(tp + ("match",), "a target needs a match", "e.g. match: {engine: engine-0}")
            for k in t.match:
                if k not in C.SCOPE_LABELS:
                    err(tp + ("match", k), f"{k!r} is not a scope label", f"use one of: {', '.join(C.SCOPE_LABELS)}", key=True)
            if a.kind == "haproxy":
                if not (t.server and _HAPROXY_SERVER.fullmatch(t.server)):
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
        _check_text_only(a, name, path, levels, err)
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
            release=Request(a.release.method, a.release.url, a.release.body) if a.release else None,
            text_only=TextOnly(a.text_only.map, a.text_only.backend, a.text_only.header) if a.text_only else None,
            discover=discover, credentials_file=a.credentials_file or None))
    return tuple(out)


def _check_credentials_file(a: RawAdapter, path: tuple, err: Callable[..., None]) -> None:
    """``credentials_file``: on the kinds in :data:`CREDENTIAL_KINDS` only, an absolute path (the
    file itself is read by ``fuse serve``, which exits 2 when it cannot)."""
    f = a.credentials_file
    if f is None:
        return
    cp = path + ("credentials_file",)
    if a.kind not in CREDENTIAL_KINDS:
        fix = "put the header under headers_files: {Authorization: FILE}" if a.kind == "http" else f"remove it from this {a.kind} adapter"
        err(cp, f"credentials_file is for kinds {', '.join(CREDENTIAL_KINDS)} only", fix, key=True)
    elif not f.strip():
        err(cp, "credentials_file is empty: it names the file holding the gateway's control-plane key",
            "e.g. credentials_file: /var/run/secrets/fusebox-gateway/key, or leave it out (no credential is sent)")
    elif not f.startswith("/") or any(c.isspace() for c in f):
        err(cp, f"credentials_file must be an absolute file path without spaces, got {f[:100]!r}",
            "e.g. credentials_file: /var/run/secrets/fusebox-gateway/key")


def _check_discover(a: RawAdapter, name: str, path: tuple, duration: Callable[[Any, tuple], float],
                    err: Callable[..., None]) -> Discover | None:
    """``discover``: only on the kinds in :data:`DISCOVER_KINDS`, an http(s) Prometheus URL, a TTL
    within :data:`DISCOVER_TTL_RANGE_S`, Prometheus metric and label names."""
    d = a.discover
    if d is None:
        return None
    dp = path + ("discover",)
    if a.kind not in DISCOVER_KINDS:
        err(dp, f"discover is for kinds {', '.join(DISCOVER_KINDS)} only", f"remove it from this {a.kind} adapter", key=True)
    if d.prometheus is not None and not _http_url(d.prometheus):
        err(dp + ("prometheus",), f"prometheus must be an http(s) URL, got {d.prometheus[:100]!r}",
            "e.g. prometheus: http://kps-kube-prometheus-stack-prometheus.monitoring:9090")
    ttl = duration(d.ttl, dp + ("ttl",))
    lo, hi = DISCOVER_TTL_RANGE_S
    if not lo <= ttl <= hi:
        err(dp + ("ttl",), f"ttl must be between {lo:g}s and {hi:g}s, got {ttl:g}s",
            "a bounded cache: e.g. ttl: 30s (a pod moved to another GPU is seen within it)")
    at = d.attribution
    if not _PROM_NAME.match(at.metric):
        err(dp + ("attribution", "metric"), f"{at.metric[:100]!r} is not a Prometheus metric name", "e.g. DCGM_FI_DEV_FB_USED")
    for k in ("gpu", "pod", "namespace"):
        if not _PROM_LABEL.match(getattr(at, k)):
            err(dp + ("attribution", k), f"{getattr(at, k)[:100]!r} is not a Prometheus label name",
                "e.g. gpu: UUID, pod: exported_pod (read as pod where the scrape honors the exporter's labels)")
    return Discover(d.prometheus.rstrip("/") if d.prometheus else None, ttl, at.metric, at.gpu, at.pod, at.namespace)


def _check_text_only(a: RawAdapter, name: str, path: tuple, levels: dict[str, int], err: Callable[..., None]) -> None:
    """haproxy's ``text_only``: needed when the adapter applies a level-2 action, names that HAProxy takes."""
    t = a.text_only
    if t is None:
        if a.kind == "haproxy":
            for i, act in enumerate(a.actions):
                if levels.get(act) == TEXT_ONLY_LEVEL:
                    err(path + ("actions", i), f"haproxy adapter {name!r} applies {act} (level 2) but has no text_only",
                        "add text_only: {map: /etc/haproxy/fusebox-text-only.map, backend: be_llm_text}")
        return
    tp = path + ("text_only",)
    if a.kind != "haproxy":
        err(tp, "text_only is for kind haproxy only", f"remove it from this {a.kind} adapter", key=True)
        return
    if not _HAPROXY_BACKEND.fullmatch(name):
        err(path, f"adapter name {name[:100]!r} names the generated HAProxy ACLs: it must be an HAProxy name",
            "rename it with letters, digits, '-', '_', '.', ':' only", key=True)
    if not _HAPROXY_MAP.fullmatch(t.map):
        err(tp + ("map",), f"map must be an absolute file path, got {t.map[:100]!r}",
            "e.g. map: /etc/haproxy/fusebox-text-only.map (letters, digits, '_.@+/-')")
    if not _HAPROXY_BACKEND.fullmatch(t.backend):
        err(tp + ("backend",), f"backend must be an HAProxy backend name, got {t.backend[:100]!r}",
            "e.g. backend: be_llm_text (letters, digits, '-', '_', '.', ':')")
    if not _HEADER.fullmatch(t.header):
        err(tp + ("header",), f"header must be an HTTP header name, got {t.header[:100]!r}", "e.g. header: X-Fusebox-Multimodal")
