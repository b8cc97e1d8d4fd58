"""The spec's ``fuse.adapters``: what the fuse service calls, on which targets, for which actions.

Shape (``docs/fuse.md`` has an example per kind)::

    fuse:
      adapters:
        <name>:                       # the adapter's label in metrics, the audit and the status page
          kind: sglang_gateway        # sglang_gateway | vllm_router | haproxy | http (adapter_kinds.ADAPTER_LEVELS)
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

from pydantic import BaseModel, ConfigDict

from fusebox import conventions as C

from .adapter_kinds import ADAPTER_KINDS, CREDENTIAL_KINDS, DISCOVER_KINDS, http_url
from .adapter_kinds.haproxy import TEXT_ONLY_LEVEL

__all__ = ["RawAdapter", "Adapter", "Target", "Request", "TextOnly", "Discover", "DISCOVER_KINDS", "CREDENTIAL_KINDS",
           "normalise_adapters", "KINDS", "TEXT_ONLY_LEVEL"]

KINDS = tuple(ADAPTER_KINDS)  # the spec's kind values, in registry order


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


def normalise_adapters(raw: dict[str, RawAdapter], levels: dict[str, int], duration: Callable[[Any, tuple], float],
                       err: Callable[..., None]) -> tuple[Adapter, ...]:
    """Check ``fuse.adapters`` against the kinds' levels (:data:`fusebox.spec.adapter_kinds.ADAPTER_LEVELS`)
    and ``levels`` (fuse action name -> level); problems go to ``err(path, what, fix)``.

    The shared checks run here, each kind's own ones in its module of :mod:`fusebox.spec.adapter_kinds`
    (:class:`~fusebox.spec.adapter_kinds.AdapterKind`), in this order per adapter: actions, the
    kind's adapter checks, max_attempts, timeout, targets, discover, credentials_file, each target
    (its match, then the kind's target check), the kind-only fields in registry order."""
    return tuple(_normalise(name, a, levels, duration, err) for name, a in raw.items())


def _normalise(name: str, a: RawAdapter, levels: dict[str, int], duration: Callable[[Any, tuple], float],
               err: Callable[..., None]) -> Adapter:
    path = ("fuse", "adapters", name)
    kind = ADAPTER_KINDS[a.kind]
    _check_actions(a, name, path, kind.levels, levels, err)
    kind.check_adapter(a, name, path, err)
    if a.max_attempts is not None and a.max_attempts < 1:
        err(path + ("max_attempts",), "max_attempts must be >= 1", "leave it out to retry until applied")
    timeout = duration(a.timeout, path + ("timeout",))
    if not a.targets and a.discover is None:
        err(path + ("targets",), f"adapter {name!r} has no targets", "map scopes to targets: - match: {engine: engine-0} ...")
    discover = _check_discover(a, name, path, duration, err)
    _check_credentials_file(a, path, err)
    for i, t in enumerate(a.targets):
        _check_match(t, path + ("targets", i), err)
        kind.check_target(t, path + ("targets", i), err)
    _check_kind_fields(a, name, path, levels, err)
    return Adapter(
        name=name, kind=a.kind, url=a.url.rstrip("/") if a.url else None, actions=tuple(a.actions),
        timeout_s=timeout, max_attempts=a.max_attempts,
        targets=tuple(Target(dict(t.match), t.worker_url.rstrip("/") if t.worker_url else None, dict(t.vars), t.server)
                      for t in a.targets), socket=a.socket,
        hosts=tuple(h.lower() for h in a.hosts), headers_files=dict(a.headers_files),
        trip=Request(a.trip.method, a.trip.url, a.trip.body) if a.trip else None,
        release=Request(a.release.method, a.release.url, a.release.body) if a.release else None,
        text_only=TextOnly(a.text_only.map, a.text_only.backend, a.text_only.header) if a.text_only else None,
        discover=discover, credentials_file=a.credentials_file or None)


def _check_actions(a: RawAdapter, name: str, path: tuple, can: tuple[int, ...], levels: dict[str, int],
                   err: Callable[..., None]) -> None:
    """At least one action, each a fuse action whose level the kind can apply (``can``)."""
    if not a.actions:
        err(path + ("actions",), f"adapter {name!r} applies no action", f"list the fuse actions it applies, e.g. [{next(iter(levels), 'x')}]")
    for i, act in enumerate(a.actions):
        if act not in levels:
            err(path + ("actions", i), f"unknown fuse action {act!r}", f"use one of: {', '.join(levels)}")
        elif levels[act] not in can:
            err(path + ("actions", i), f"adapter kind {a.kind} cannot apply fuse level {levels[act]} ({act})",
                f"it applies level{'s' if len(can) > 1 else ''} {', '.join(map(str, can))}: remove {act!r} here and give it to an adapter that can "
                "(e.g. kind: http)")


def _check_match(t: RawTarget, tp: tuple, err: Callable[..., None]) -> None:
    """A target's ``match``: not empty, scope labels only."""
    if not t.match:
        err(tp + ("match",), "a target needs a match", "e.g. match: {engine: engine-0}")
    for k in t.match:
        if k not in C.SCOPE_LABELS:
            err(tp + ("match", k), f"{k!r} is not a scope label", f"use one of: {', '.join(C.SCOPE_LABELS)}", key=True)


def _check_kind_fields(a: RawAdapter, name: str, path: tuple, levels: dict[str, int], err: Callable[..., None]) -> None:
    """The kind-only fields (``AdapterKind.fields``), in registry order: the adapter's own kind
    checks its own; another kind's, when set, is refused."""
    for other in ADAPTER_KINDS.values():
        if other.name == a.kind:
            other.check_fields(a, name, path, levels, err)
            continue
        for which in other.fields:
            if getattr(a, which):
                err(path + (which,), f"{which} is for kind {other.name} only", f"remove it from this {a.kind} adapter", key=True)


def _check_credentials_file(a: RawAdapter, path: tuple, err: Callable[..., None]) -> None:
    """``credentials_file``: on the kinds in :data:`CREDENTIAL_KINDS` only, an absolute path (the
    file itself is read by ``fuse serve``, which exits 2 when it cannot)."""
    f = a.credentials_file
    if f is None:
        return
    cp = path + ("credentials_file",)
    if a.kind not in CREDENTIAL_KINDS:
        fix = ADAPTER_KINDS[a.kind].credentials_fix or f"remove it from this {a.kind} adapter"
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
    if d.prometheus is not None and not http_url(d.prometheus):
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
