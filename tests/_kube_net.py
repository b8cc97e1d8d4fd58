"""The boundary of "no kubelet, no pod network": what a cluster's nodes would provide, stood in for
on loopback, and nothing else.

* **Service discovery.** Prometheus' ``kubernetes_sd_configs`` list a cluster's Endpoints and Pods
  (which only a kubelet and the endpoints controller would fill in). :func:`static_sd` replaces
  each with ``static_configs`` holding the targets that SD would find among the test's running
  pods and the Services read back from the API server, each with the ``__meta_kubernetes_*``
  labels Prometheus' SD gives it (discovery/kubernetes/endpoints.go and pod.go), so the
  operator's relabelings run unchanged and decide what is kept and how it is labelled.
* **Pod IPs.** Each pod gets its own loopback address (``_k8s_pods.pod_ip``), so its containers
  listen on their manifest ports (9095, 9093, 9410...) as on a pod IP (a port another process
  holds on every address of this machine moves: ``_k8s_pods.host_port``; targets say where).
* **Services and cluster DNS.** :class:`ServiceProxy` stands for a Service's ClusterIP: it listens
  on a loopback address of its own on the Service's port and forwards each request to one of the
  Service's **Ready** pods (readiness as the kubelet reports it: the pod's readiness probe, polled),
  as kube-proxy forwards only to ready endpoints. :func:`map_service_urls` rewrites a URL naming
  ``<service>.<namespace>.svc`` to that address (what cluster DNS resolves it to).
"""

from __future__ import annotations

import copy
import hashlib
import http.client
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from _k8s_pods import host_port, pod_ip
from _support import QuietHandler

_SANITIZE = re.compile(r"[^a-zA-Z0-9_]")


def sanitize(name: str) -> str:
    """A Kubernetes label or annotation name as Prometheus' SD puts it in a meta label name."""
    return _SANITIZE.sub("_", name)


@dataclass
class RunningPod:
    """A pod the test runs natively, as the API server would list it had a kubelet started it."""

    name: str
    namespace: str
    ip: str
    labels: dict[str, str]
    containers: list[dict[str, Any]]
    controller_kind: str
    controller_name: str
    node: str = "node-a"
    annotations: dict[str, str] = field(default_factory=dict)
    ready: Callable[[], bool] = lambda: True
    host_ports: dict[int, int] = field(default_factory=dict)  # containerPort -> where it listens (_k8s_pods.host_port)

    def address(self, container_port: int) -> str:
        return f"{self.ip}:{self.host_ports.get(container_port, container_port)}"

    @property
    def uid(self) -> str:
        return str(hashlib.sha1(f"{self.namespace}/{self.name}".encode()).hexdigest())

    def meta(self) -> dict[str, str]:
        """The pod-level labels of Prometheus' pod SD (discovery/kubernetes/pod.go podLabels)."""
        m = {"__meta_kubernetes_namespace": self.namespace, "__meta_kubernetes_pod_name": self.name,
             "__meta_kubernetes_pod_ip": self.ip, "__meta_kubernetes_pod_ready": str(self.ready()).lower(),
             "__meta_kubernetes_pod_phase": "Running", "__meta_kubernetes_pod_node_name": self.node,
             "__meta_kubernetes_pod_host_ip": self.ip, "__meta_kubernetes_pod_uid": self.uid,
             "__meta_kubernetes_pod_controller_kind": self.controller_kind,
             "__meta_kubernetes_pod_controller_name": self.controller_name}
        for k, v in self.labels.items():
            m[f"__meta_kubernetes_pod_label_{sanitize(k)}"] = v
            m[f"__meta_kubernetes_pod_labelpresent_{sanitize(k)}"] = "true"
        for k, v in self.annotations.items():
            m[f"__meta_kubernetes_pod_annotation_{sanitize(k)}"] = v
            m[f"__meta_kubernetes_pod_annotationpresent_{sanitize(k)}"] = "true"
        return m

    @staticmethod
    def container_meta(c: dict[str, Any], port: dict[str, Any] | None) -> dict[str, str]:
        m = {"__meta_kubernetes_pod_container_name": c["name"], "__meta_kubernetes_pod_container_image": c.get("image", ""),
             "__meta_kubernetes_pod_container_init": "false"}
        if port is not None:
            m.update({"__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                      "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                      "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP")})
        return m

    def port(self, ref: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(container, port) of a named or numbered container port."""
        for c in self.containers:
            for p in c.get("ports", []):
                if p.get("name") == ref or p["containerPort"] == ref:
                    return c, p
        return None


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_targets(pods: list[RunningPod], namespaces: list[str] | None) -> list[dict[str, Any]]:
    """``role: pod``: one target per container port of every pod (a container without ports: one
    target on the pod IP alone)."""
    out = []
    for p in pods:
        if namespaces and p.namespace not in namespaces:
            continue
        for c in p.containers:
            ports = c.get("ports") or [None]
            for port in ports:
                addr = p.ip if port is None else p.address(port["containerPort"])
                out.append({"__address__": addr, **p.meta(), **RunningPod.container_meta(c, port)})
    return out


def endpoints_targets(services: list[dict[str, Any]], pods: list[RunningPod],
                      namespaces: list[str] | None) -> list[dict[str, Any]]:
    """``role: endpoints``: the Endpoints the endpoints controller keeps for each Service with a
    selector (ready and not-ready pod addresses, one port per Service port), labelled as
    Prometheus' endpoints SD labels them."""
    out = []
    for svc in services:
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        if namespaces and ns not in namespaces:
            continue
        base = {"__meta_kubernetes_namespace": ns, "__meta_kubernetes_endpoints_name": name,
                "__meta_kubernetes_service_name": name}
        for k, v in (svc["metadata"].get("labels") or {}).items():
            # the endpoints controller copies the Service's labels onto its Endpoints
            base[f"__meta_kubernetes_endpoints_label_{sanitize(k)}"] = v
            base[f"__meta_kubernetes_endpoints_labelpresent_{sanitize(k)}"] = "true"
            base[f"__meta_kubernetes_service_label_{sanitize(k)}"] = v
            base[f"__meta_kubernetes_service_labelpresent_{sanitize(k)}"] = "true"
        for k, v in (svc["metadata"].get("annotations") or {}).items():
            base[f"__meta_kubernetes_service_annotation_{sanitize(k)}"] = v
            base[f"__meta_kubernetes_service_annotationpresent_{sanitize(k)}"] = "true"
        selector = svc["spec"].get("selector") or {}
        for p in pods:
            if p.namespace != ns or not _selects(selector, p.labels):
                continue
            bound = set()
            for sp in svc["spec"]["ports"]:
                found = p.port(sp.get("targetPort", sp["port"]))
                if found is None:
                    continue  # the endpoints controller leaves a port it cannot resolve out
                c, cp = found
                bound.add((c["name"], cp["containerPort"]))
                t = {"__address__": p.address(cp["containerPort"]), **base,
                     "__meta_kubernetes_endpoint_port_name": sp.get("name", ""),
                     "__meta_kubernetes_endpoint_port_protocol": sp.get("protocol", "TCP"),
                     "__meta_kubernetes_endpoint_ready": str(p.ready()).lower(),
                     "__meta_kubernetes_endpoint_node_name": p.node,
                     "__meta_kubernetes_endpoint_address_target_kind": "Pod",
                     "__meta_kubernetes_endpoint_address_target_name": p.name,
                     **p.meta(), **RunningPod.container_meta(c, cp)}
                if sp.get("appProtocol"):
                    t["__meta_kubernetes_endpoint_port_app_protocol"] = sp["appProtocol"]
                out.append(t)
            # the pod's container ports no Service port binds are targets too (endpoints.go)
            for c in p.containers:
                for cp in c.get("ports", []):
                    if (c["name"], cp["containerPort"]) not in bound:
                        out.append({"__address__": p.address(cp["containerPort"]), **base, **p.meta(),
                                    **RunningPod.container_meta(c, cp)})
    return out


def _replace_sd(block: dict[str, Any], services: list[dict[str, Any]], pods: list[RunningPod]) -> int:
    """Replace ``block``'s kubernetes_sd_configs by static_configs; the number of targets."""
    sds = block.pop("kubernetes_sd_configs", None)
    if sds is None:
        return -1
    statics = block.setdefault("static_configs", [])
    n = 0
    for sd in sds:
        unknown = set(sd) - {"role", "namespaces", "api_server", "kubeconfig_file", "follow_redirects",
                             "enable_http2", "tls_config", "authorization", "bearer_token_file", "attach_metadata"}
        assert not unknown, f"kubernetes_sd_config fields this stand-in does not model: {sorted(unknown)}"
        nss = (sd.get("namespaces") or {}).get("names")
        role = sd["role"]
        if role == "pod":
            targets = pod_targets(pods, nss)
        elif role == "endpoints":
            targets = endpoints_targets(services, pods, nss)
        else:
            raise AssertionError(f"kubernetes_sd role {role!r} is not modelled by this stand-in")
        for t in targets:
            labels = dict(t)
            statics.append({"targets": [labels.pop("__address__")], "labels": labels})
            n += 1
    return n


def static_sd(config: dict[str, Any], services: list[dict[str, Any]], pods: list[RunningPod]) -> dict[str, Any]:
    """A copy of a Prometheus config with every ``kubernetes_sd_configs`` (scrape jobs and
    Alertmanagers) replaced by the static targets SD would give; relabelings untouched."""
    cfg = copy.deepcopy(config)
    for job in cfg.get("scrape_configs") or []:
        _replace_sd(job, services, pods)
    for am in (cfg.get("alerting") or {}).get("alertmanagers") or []:
        _replace_sd(am, services, pods)
    return cfg


# ---------------------------------------------------------------------------------- Services
class ServiceProxy:
    """A Service's ClusterIP stand-in: ``ip:port`` on loopback, forwarding each HTTP request to a
    ready backend (round robin), as kube-proxy forwards a connection to a ready endpoint. It keeps
    what it forwarded (method, path, body) in ``seen``: the traffic the Service carried."""

    def __init__(self, name: str, port: int, backends: Callable[[], list[str]], ip: str | None = None):
        self.name, self.service_port = name, port
        self.ip = ip or pod_ip()
        self.port = host_port(self.ip, port)  # the Service's port, unless taken on every address
        self.backends = backends  # -> ["ip:port", ...] of the ready endpoints, asked per request
        self.seen: list[tuple[str, str, bytes, str | None]] = []  # method, path, body, backend
        self._next = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(QuietHandler):
            def _forward(self):
                body = self.body()
                with proxy._lock:
                    ready = proxy.backends()
                    target = ready[proxy._next % len(ready)] if ready else None
                    proxy._next += 1
                    proxy.seen.append((self.command, self.path, body, target))
                if target is None:  # no ready endpoint: the connection is refused
                    self.close_connection = True
                    self.send_error(503, "no ready endpoints")
                    return
                host, port = target.rsplit(":", 1)
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    r = conn.getresponse()
                    data = r.read()
                    self.send_response(r.status)
                    for k, v in r.getheaders():
                        if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError as e:
                    self.send_error(502, f"backend {target}: {e}")
                finally:
                    conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        self.server = ThreadingHTTPServer((self.ip, self.port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name=f"svc-{name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


class ReadinessProber:
    """The kubelet's readiness probing of some pods, every ``period`` seconds in a thread; ``ready``
    holds each pod name's last result (the Ready condition the endpoints controller reads)."""

    def __init__(self, probes: dict[str, Callable[[], bool]], period: float):
        self.probes, self.period = probes, period
        self.ready: dict[str, bool] = {n: False for n in probes}
        self.history: list[tuple[float, str, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet-probes", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for n, probe in self.probes.items():
                ok = probe()
                if ok != self.ready[n]:
                    self.history.append((time.time(), n, ok))
                self.ready[n] = ok
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


_SVC_HOST = re.compile(r"^(?P<svc>[a-z0-9-]+)\.(?P<ns>[a-z0-9-]+)\.svc(\.cluster\.local)?$")


def map_service_urls(obj: Any, services: dict[tuple[str, str], ServiceProxy]) -> Any:
    """``obj`` (a parsed config) with every ``url`` naming ``<svc>.<ns>.svc[.cluster.local]:PORT``
    pointed at that Service's proxy (cluster DNS); AssertionError for a Service not stood in for."""
    if isinstance(obj, dict):
        return {k: (_map_url(v, services) if k == "url" and isinstance(v, str) else map_service_urls(v, services))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [map_service_urls(v, services) for v in obj]
    return obj


def _map_url(url: str, services: dict[tuple[str, str], ServiceProxy]) -> str:
    parts = urlsplit(url)
    m = _SVC_HOST.match(parts.hostname or "")
    if not m:
        return url
    proxy = services.get((m["ns"], m["svc"]))
    assert proxy is not None, f"{url}: no stand-in for Service {m['ns']}/{m['svc']}"
    assert (parts.port or 80) == proxy.service_port, f"{url}: Service {m['svc']} has port {proxy.service_port}"
    return urlunsplit(parts._replace(netloc=f"{proxy.ip}:{proxy.port}"))
