"""Engine pods on this node, as the Kubernetes API says they come and go.

:class:`PodWatcher` lists and then watches the pods of each namespace of the engines file
(``namespaces: []``: all namespaces) with ``fieldSelector=spec.nodeName=<node>`` and the file's
label selector, through the official ``kubernetes`` client (``CoreV1Api``, ``watch.Watch``), one
daemon thread per namespace. It keeps the pods it was told about; :meth:`PodWatcher.pods` is the
current set. A watch that ends (the server's timeout) resumes from the last resourceVersion; one
that expired (``410 Gone``) lists again; any other error is counted (:attr:`PodWatcher.errors`,
by reason), said once per change of state, and retried after a backoff doubling from 1 s to
:data:`MAX_BACKOFF_S` -- never a crash.

What the collectors may scrape (:meth:`PodWatcher.engines`) is the pods in phase ``Running``,
not being deleted (a ``deletionTimestamp``: the pod is leaving, its series stop now), with a pod
IP; a Pending or Running pod without an IP is reported apart (:meth:`PodWatcher.without_ip`)
so the collector can count it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

MAX_BACKOFF_S = 30.0
WATCH_TIMEOUT_S = 300  # the server ends each watch after this long; it is then resumed


@dataclass(frozen=True)
class PodInfo:
    """What discovery needs of a pod: identity, phase, IP and its containers' named ports."""

    namespace: str
    name: str
    uid: str
    phase: str
    ip: str
    deleting: bool
    ports: dict[str, int] = field(default_factory=dict, hash=False, compare=False)

    @property
    def engine_id(self) -> str:
        """The ``engine`` label of a discovered engine: ``namespace/pod``."""
        return f"{self.namespace}/{self.name}"


def pod_info(pod: Any) -> PodInfo:
    """A :class:`PodInfo` of a ``V1Pod`` (the ``kubernetes`` client's model)."""
    meta, spec, status = pod.metadata, pod.spec, pod.status
    ports: dict[str, int] = {}
    for c in (spec.containers or []) if spec else []:
        for p in c.ports or []:
            if p.name and p.name not in ports:
                ports[p.name] = int(p.container_port)
    return PodInfo(meta.namespace or "", meta.name or "", meta.uid or "", (status.phase if status else "") or "",
                   (status.pod_ip if status else "") or "", meta.deletion_timestamp is not None, ports)


class PodWatcher:
    """List + watch of the engine pods on ``node``.

    Args:
        api: a ``kubernetes.client.CoreV1Api``.
        node: this node's name (the DaemonSet's ``spec.nodeName``, from the downward API).
        namespaces: namespaces to watch; empty: all (``list_pod_for_all_namespaces``).
        label_selector: the API's ``labelSelector`` string (``k=v,...``), "" for none.
        log: hears each change of state of a watch (failing, ok again).
        request_timeout_s: client-side deadline of a list call and of a silent watch connection.

    :attr:`errors` counts failures by reason (``list_error``, ``watch_error``, ``expired``).
    """

    def __init__(self, api: Any, node: str, namespaces: Iterable[str] = (), label_selector: str = "", *,
                 log: Callable[[str], None] | None = None, request_timeout_s: float = 30.0,
                 watch_timeout_s: int = WATCH_TIMEOUT_S):
        self.api = api
        self.node = node
        self.namespaces = tuple(namespaces) or ("",)  # "" = all namespaces
        self.label_selector = label_selector
        self.log = log
        self.request_timeout_s = request_timeout_s
        self.watch_timeout_s = watch_timeout_s
        self.errors: Counter = Counter()
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced: dict[str, threading.Event] = {ns: threading.Event() for ns in self.namespaces}
        self._state: dict[str, str] = {}
        self._threads: list[threading.Thread] = []
        self._watches: dict[str, Any] = {}

    # ------------------------------------------------------------------ state (pure)
    def replace(self, scope: str, pods: Iterable[PodInfo]) -> None:
        """A fresh list of ``scope`` (a namespace, "" = all): its pods become exactly ``pods``."""
        with self._lock:
            for k in [k for k in self._pods if not scope or k[0] == scope]:
                del self._pods[k]
            for p in pods:
                self._pods[(p.namespace, p.name)] = p

    def apply(self, kind: str, pod: PodInfo) -> None:
        """One watch event (``ADDED``, ``MODIFIED``, ``DELETED``)."""
        with self._lock:
            if kind == "DELETED":
                self._pods.pop((pod.namespace, pod.name), None)
            elif kind in ("ADDED", "MODIFIED"):
                self._pods[(pod.namespace, pod.name)] = pod

    def pods(self) -> list[PodInfo]:
        """Every pod known now (any phase), sorted by namespace and name."""
        with self._lock:
            return [self._pods[k] for k in sorted(self._pods)]

    def engines(self) -> list[PodInfo]:
        """The pods to scrape: Running, not being deleted, with a pod IP; sorted."""
        return [p for p in self.pods() if p.phase == "Running" and p.ip and not p.deleting]

    def without_ip(self) -> list[PodInfo]:
        """Pending or Running pods, not being deleted, that have no pod IP (yet): skipped."""
        return [p for p in self.pods() if p.phase in ("Pending", "Running") and not p.ip and not p.deleting]

    # ------------------------------------------------------------------ the API
    def start(self) -> PodWatcher:
        """Start one daemon thread per namespace; returns at once (see :meth:`wait_synced`)."""
        for ns in self.namespaces:
            t = threading.Thread(target=self._run, args=(ns,), name=f"fusebox-podwatch-{ns or 'all'}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def wait_synced(self, timeout_s: float) -> bool:
        """Whether every namespace has been listed once within ``timeout_s`` seconds."""
        end = time.monotonic() + timeout_s
        return all(ev.wait(max(0.0, end - time.monotonic())) for ev in self._synced.values())

    def stop(self) -> None:
        self._stop.set()
        for w in list(self._watches.values()):
            w.stop()
        for t in self._threads:
            t.join(timeout=5)

    def _report(self, scope: str, state: str, detail: str = "") -> None:
        where = f"namespace {scope}" if scope else "all namespaces"
        if self._state.get(scope, "ok") != state and self.log:
            self.log(f"pods: {where} on node {self.node}: {state}{': ' + detail if detail else ''}" if state != "ok"
                     else f"pods: {where} on node {self.node}: ok again")
        self._state[scope] = state

    def _selectors(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"field_selector": f"spec.nodeName={self.node}"}
        if self.label_selector:
            kw["label_selector"] = self.label_selector
        return kw

    def _list(self, scope: str) -> str:
        kw = self._selectors()
        if scope:
            resp = self.api.list_namespaced_pod(scope, _request_timeout=self.request_timeout_s, **kw)
        else:
            resp = self.api.list_pod_for_all_namespaces(_request_timeout=self.request_timeout_s, **kw)
        self.replace(scope, (pod_info(p) for p in resp.items))
        self._synced[scope].set()
        return str(resp.metadata.resource_version or "")

    def _watch(self, scope: str, rv: str) -> str:
        """Watch from ``rv`` until the server ends the watch; returns the last resourceVersion.

        Raises:
            kubernetes.client.ApiException: 410 when ``rv`` expired (also sent as an ERROR event).
        """
        from kubernetes import watch
        from kubernetes.client import ApiException

        w = watch.Watch()
        self._watches[scope] = w
        kw = self._selectors() | {"resource_version": rv, "timeout_seconds": self.watch_timeout_s,
                                  "allow_watch_bookmarks": True,
                                  "_request_timeout": (self.request_timeout_s, self.watch_timeout_s + 30)}
        fn = self.api.list_namespaced_pod if scope else self.api.list_pod_for_all_namespaces
        args = (scope,) if scope else ()
        try:
            for ev in w.stream(fn, *args, **kw):
                if self._stop.is_set():
                    break
                kind = ev.get("type")
                obj = ev.get("object")
                if kind == "ERROR":
                    code = obj.get("code") if isinstance(obj, dict) else getattr(obj, "code", None)
                    raise ApiException(status=code or 500, reason=str(obj))
                if kind == "BOOKMARK":
                    continue
                self.apply(str(kind), pod_info(obj))
            return str(w.resource_version or rv)
        finally:
            self._watches.pop(scope, None)

    def _run(self, scope: str) -> None:
        from kubernetes.client import ApiException

        backoff = 1.0
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._list(scope)
                    self._report(scope, "ok")
                rv = self._watch(scope, rv)
                backoff = 1.0
                continue
            except ApiException as e:
                if e.status == 410:  # the watch's resourceVersion is too old: list again, at once
                    self.errors["expired"] += 1
                    rv = ""
                    continue
                reason, detail = ("list_error" if not rv else "watch_error"), f"HTTP {e.status} {e.reason}"
                fix = _API_FIXES.get(e.status, "see the API server's answer above")
            except Exception as e:  # noqa: BLE001 -- the API server down, a reset connection: retried
                reason, detail = ("list_error" if not rv else "watch_error"), f"{type(e).__name__}: {e}"
                fix = "check that this pod can reach the Kubernetes API (a NetworkPolicy, the API server's health)"
            if self._stop.is_set():  # stop() closed the watch under its stream: the shutdown, not an error
                return
            self.errors[reason] += 1
            self._report(scope, reason, f"{detail}; retrying in {backoff:g}s -- {fix}")
            rv = ""
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, MAX_BACKOFF_S)


# how to fix the API server's refusals of the pod list and watch (said with each change of state)
_API_FIXES = {
    401: "the service account token is missing or not accepted: the DaemonSet runs as ServiceAccount "
         "fusebox-collectors with automountServiceAccountToken (k8s/collectors.yml), or pass --kubeconfig",
    403: "the ServiceAccount needs get, list and watch on pods in the engines' namespaces: apply the "
         "Role/RoleBinding (or ClusterRole) of k8s/collectors.yml, whose namespaces must exist first",
}


def core_api(kubeconfig: str | None = None) -> Any:
    """A ``CoreV1Api``: from ``kubeconfig`` when given, else the in-cluster service account, else
    ``~/.kube/config`` (``$KUBECONFIG``).

    Raises:
        kubernetes.config.ConfigException: no configuration could be loaded.
    """
    from kubernetes import client, config

    if kubeconfig:
        return client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api()
