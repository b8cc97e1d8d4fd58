"""Kubernetes' and KEDA's scaling controllers on the test control plane, for tests, with no node.

``ScalingPlane`` is a :class:`_kube_support.ControlPlane` (etcd, kube-apiserver v1.37.2) whose API
server runs its aggregator, plus the three processes that turn a Prometheus query into a
Deployment's ``spec.replicas``:

* **kube-controller-manager** v1.37.2 (tools/build-kube.sh, the same k8s.io/kubernetes module as
  the API server) with only the controllers scaling needs: ``horizontal-pod-autoscaler-controller``
  (reads the external metric, writes the Deployment's scale), ``deployment-controller`` and
  ``replicaset-controller`` (the ReplicaSet and its Pods, which stay Pending: no scheduler, no
  kubelet) and ``serviceaccount-controller`` (each namespace's ``default`` ServiceAccount, which
  the ServiceAccount admission plugin needs before it admits a Pod). Its HPA sync period is
  :data:`HPA_SYNC_PERIOD_S`.
* **KEDA's operator** v2.21.0 (tools/build-keda.sh): the ScaledObject controller (it creates and
  keeps the ScaledObject's HPA, ``keda-hpa-<name>``) and the gRPC metrics service that runs the
  scalers (here the Prometheus scaler, querying the test's Prometheus).
* **KEDA's metrics API server** (its ``adapter``): ``external.metrics.k8s.io/v1beta1``, registered as
  the APIService ``v1beta1.external.metrics.k8s.io`` on the API server; the HPA controller reads the
  metric through the API server's aggregator, which forwards to it.

Start-up, as in a cluster, with what a node would provide stood in for at that boundary alone:

* TLS as KEDA deploys it without its cert rotation (``--enable-cert-rotation=false``): one CA and
  one certificate in a cert dir (``ca.crt``, ``tls.crt``, ``tls.key``: KEDA's file names) that both
  read, the operator as the gRPC server (client certificates required), the adapter as its client
  and as the APIService's HTTPS server (``caBundle`` is the CA).
* The aggregator: the API server gets ``--requestheader-*`` (a front-proxy CA and the name its
  client certificate carries) and ``--proxy-client-cert-file``/``--proxy-client-key-file`` (that
  client certificate), with which it authenticates the requests it forwards; the adapter reads the
  CA from the ``kube-system/extension-apiserver-authentication`` ConfigMap the API server writes.
  ``--enable-aggregator-routing=true`` makes the aggregator dial the Service's endpoint (an
  EndpointSlice) instead of its ClusterIP, which nothing routes here.
* The endpoint: an EndpointSlice may not hold a loopback address (the API server refuses it), so
  the adapter listens on this machine's own non-loopback address (:func:`host_address`), and the
  EndpointSlice (what the endpointslice controller would derive from a Ready pod) names it.
* The operator and the adapter run as processes of this machine with a kubeconfig
  (``$KUBECONFIG``: the test's token), ``POD_NAMESPACE`` and ``KEDA_CLUSTER_OBJECT_NAMESPACE``
  ``keda`` (what the Downward API and KEDA's manifests set in a pod).

A missing tool fails the test under CI (``CI=true``) and skips it elsewhere (``_support.need``).
"""

from __future__ import annotations

import base64
import ipaddress
import os
import subprocess
import threading
import time
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml
from _k8s_pods import host_port, pod_ip
from _kube_net import ServiceProxy, map_service_urls
from _kube_support import ControlPlane, Proc, wait_until
from _support import missing, need

from fusebox.tooling import free_port, tools_dir

KEDA_VERSION = "v2.21.0"  # tools/build-keda.sh VERSION
KEDA_NS = "keda"  # where KEDA's manifests install it
ADAPTER_SERVICE = "keda-metrics-apiserver"  # KEDA's Service for its metrics API server
APISERVICE = "v1beta1.external.metrics.k8s.io"
KEDA_CRDS = ("keda.sh_scaledobjects", "keda.sh_scaledjobs", "keda.sh_triggerauthentications",
             "keda.sh_clustertriggerauthentications", "eventing.keda.sh_cloudeventsources",
             "eventing.keda.sh_clustercloudeventsources")
CONTROLLERS = ("horizontal-pod-autoscaler-controller", "deployment-controller", "replicaset-controller",
               "serviceaccount-controller")
# kube-controller-manager's --horizontal-pod-autoscaler-sync-period for the tests (default 15 s): what a
# reaction-time check adds for the HPA's sync
HPA_SYNC_PERIOD_S = 1.0
FRONT_PROXY_CLIENT = "front-proxy-client"  # the CN of the aggregator's client certificate
HOW = "run `make tools` (tools/build-kube.sh builds kube-controller-manager, tools/build-keda.sh KEDA)"


def keda_tools() -> dict[str, Any]:
    """Paths of kube-controller-manager, KEDA's operator and adapter and its CRD files (``need`` each)."""
    base = tools_dir()
    keda = base / f"keda-{KEDA_VERSION}"
    found: dict[str, Any] = {
        "kube-controller-manager": need(str(base / "kubernetes-v1.37.2" / "kube-controller-manager"), HOW),
        "keda-operator": need(str(keda / "operator"), HOW),
        "keda-adapter": need(str(keda / "adapter"), HOW),
    }
    crds = [keda / "crds" / f"{c}.yaml" for c in KEDA_CRDS]
    lacking = [c.name for c in crds if not c.is_file()]
    if lacking:
        missing(f"KEDA {KEDA_VERSION}'s CRDs {', '.join(lacking)} are missing from {keda / 'crds'}: {HOW}")
    found["crds"] = crds
    return found


def host_address() -> str:
    """This machine's first non-loopback IPv4 address (``hostname -I``): what an EndpointSlice may
    name. RuntimeError (saying so) where there is none: the aggregator cannot reach the adapter."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"`hostname -I` failed ({e}): the scaling tests need this machine's non-loopback "
                           "address for the metrics API server's EndpointSlice") from e
    for word in out.split():
        try:
            ip = ipaddress.ip_address(word)
        except ValueError:
            continue
        if ip.version == 4 and not ip.is_loopback and not ip.is_link_local:
            return str(ip)
    raise RuntimeError(f"this machine has no non-loopback IPv4 address (`hostname -I`: {out.strip()!r}); an "
                       "EndpointSlice may not name a loopback address, so the API server's aggregator cannot "
                       "reach KEDA's metrics API server: give the machine a network interface with an address")


class Pki:
    """A CA and certificates it signs, made with openssl into ``root`` (one day's validity)."""

    def __init__(self, openssl: str, root: Path):
        self.openssl, self.root = openssl, root
        root.mkdir(parents=True, exist_ok=True)

    def _run(self, *args: str) -> None:
        r = subprocess.run([self.openssl, *args], capture_output=True, text=True, timeout=120)
        if r.returncode:
            raise RuntimeError(f"openssl {' '.join(args[:2])}: {r.stderr}")

    def ca(self, name: str) -> tuple[Path, Path]:
        crt, key = self.root / f"{name}-ca.crt", self.root / f"{name}-ca.key"
        self._run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}-ca",
                  "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                  "-keyout", str(key), "-out", str(crt))
        return crt, key

    def leaf(self, ca: tuple[Path, Path], cn: str, out: tuple[Path, Path], sans: list[str] | None = None,
             usage: str = "serverAuth,clientAuth") -> None:
        """A certificate for ``cn`` (``sans``: ``IP:...``/``DNS:...``) signed by ``ca``, at ``out`` (crt, key)."""
        ext = ["-addext", "basicConstraints=critical,CA:FALSE", "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
               "-addext", f"extendedKeyUsage={usage}"]
        if sans:
            ext += ["-addext", "subjectAltName=" + ",".join(sans)]
        self._run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={cn}",
                  "-CA", str(ca[0]), "-CAkey", str(ca[1]), *ext, "-keyout", str(out[1]), "-out", str(out[0]))


class ScalingPlane(ControlPlane):
    """The control plane with its aggregator on, KEDA (operator, metrics API server and CRDs) and
    kube-controller-manager; ``start()``, ``close()``. ``hpa_sync_period_s`` is the HPA controller's
    sync period."""

    def __init__(self, root: Path, hpa_sync_period_s: float = HPA_SYNC_PERIOD_S):
        root = Path(root)
        self.keda = keda_tools()
        self.host = host_address()
        self.hpa_sync_period_s = hpa_sync_period_s
        pki_dir = root / "pki"
        self.keda_certs = root / "keda-certs"  # KEDA's cert dir: ca.crt, tls.crt, tls.key
        front = pki_dir / "front-proxy-ca.crt"
        proxy = (pki_dir / "front-proxy-client.crt", pki_dir / "front-proxy-client.key")
        super().__init__(root, apiserver_args=[
            f"--requestheader-client-ca-file={front}", f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={proxy[0]}", f"--proxy-client-key-file={proxy[1]}",
            "--enable-aggregator-routing=true"])
        pki = Pki(self.tools["openssl"], pki_dir)
        front_ca = pki.ca("front-proxy")
        pki.leaf(front_ca, FRONT_PROXY_CLIENT, proxy, usage="clientAuth")
        keda_ca = pki.ca("keda")
        self.keda_certs.mkdir()
        svc = f"{ADAPTER_SERVICE}.{KEDA_NS}.svc"
        # the adapter serves the aggregator at the host address under the Service's name, and the
        # operator's gRPC server the adapter at 127.0.0.1; one certificate for both, as KEDA's own
        # cert rotation makes one for both Services
        pki.leaf(keda_ca, "keda", (self.keda_certs / "tls.crt", self.keda_certs / "tls.key"),
                 sans=[f"DNS:{svc}", f"DNS:{svc}.cluster.local", f"DNS:keda-operator.{KEDA_NS}.svc",
                       "IP:127.0.0.1", f"IP:{self.host}"])
        (self.keda_certs / "ca.crt").write_bytes(keda_ca[0].read_bytes())
        self.grpc_port, self.adapter_port = free_port(), free_port()
        self.keda_operator: Proc | None = None
        self.keda_adapter: Proc | None = None
        self.controller_manager: Proc | None = None

    def start(self) -> ScalingPlane:
        """etcd, the API server, KEDA's CRDs, the operator, the adapter (its APIService Available),
        then kube-controller-manager."""
        super().start()
        self.install_crd_files(self.keda["crds"])
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KEDA_NS}})
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.root), "KUBECONFIG": str(self.kubeconfig),
               "POD_NAMESPACE": KEDA_NS, "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NS, "WATCH_NAMESPACE": ""}
        (self.root / "keda-ca-dirs").mkdir()
        self.keda_operator = self._start("keda-operator", [
            self.keda["keda-operator"], f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{free_port()}",
            f"--metrics-service-bind-address=127.0.0.1:{self.grpc_port}", f"--cert-dir={self.keda_certs}",
            "--enable-cert-rotation=false", "--leader-elect=false", f"--ca-dir={self.root / 'keda-ca-dirs'}",
            "--zap-log-level=info"], env=env)
        self.keda_adapter = self._start("keda-adapter", [
            self.keda["keda-adapter"], f"--bind-address={self.host}", f"--secure-port={self.adapter_port}",
            f"--cert-dir={self.keda_certs}", f"--tls-cert-file={self.keda_certs / 'tls.crt'}",
            f"--tls-private-key-file={self.keda_certs / 'tls.key'}",
            f"--lister-kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}", f"--metrics-service-address=127.0.0.1:{self.grpc_port}",
            f"--port={free_port()}"], env=env)
        self._register_adapter()
        self.controller_manager = self._start("kube-controller-manager", [
            self.keda["kube-controller-manager"], f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            f"--controllers={','.join(CONTROLLERS)}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", f"--cert-dir={self.root / 'kcm-certs'}",
            f"--horizontal-pod-autoscaler-sync-period={self.hpa_sync_period_s:g}s"])
        return self

    def _register_adapter(self, timeout: float = 120) -> None:
        """The adapter's Service, its EndpointSlice (the host address) and the APIService; returns
        once the aggregator reports the APIService Available (it reached the adapter)."""
        self.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": ADAPTER_SERVICE, "namespace": KEDA_NS},
                    "spec": {"ports": [{"name": "https", "port": 443, "targetPort": self.adapter_port, "protocol": "TCP"}]}})
        self.apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": f"{ADAPTER_SERVICE}-host", "namespace": KEDA_NS,
                                 "labels": {"kubernetes.io/service-name": ADAPTER_SERVICE,
                                            "endpointslice.kubernetes.io/managed-by": "fusebox-test"}},
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": [self.host], "conditions": {"ready": True}}],
                    "ports": [{"name": "https", "port": self.adapter_port, "protocol": "TCP"}]})
        self.apply({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": APISERVICE},
                    "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                             "versionPriority": 100,
                             "caBundle": base64.b64encode((self.keda_certs / "ca.crt").read_bytes()).decode(),
                             "service": {"namespace": KEDA_NS, "name": ADAPTER_SERVICE, "port": 443}}})

        def available() -> bool:
            got = self.get("apiregistration.k8s.io/v1", "APIService", APISERVICE) or {}
            return any(c["type"] == "Available" and c["status"] == "True"
                       for c in (got.get("status") or {}).get("conditions") or [])

        def why() -> str:
            got = self.get("apiregistration.k8s.io/v1", "APIService", APISERVICE) or {}
            return (f"APIService status: {(got.get('status') or {}).get('conditions')}\n--- keda-adapter\n"
                    f"{self.keda_adapter.tail(3000) if self.keda_adapter else ''}")

        wait_until(available, timeout, f"APIService {APISERVICE} Available", step=0.5, alive=self.check, why=why)

    def external_metric(self, namespace: str, name: str, selector: str) -> dict[str, Any]:
        """``GET /apis/external.metrics.k8s.io/v1beta1/namespaces/NS/NAME?labelSelector=...`` through
        the aggregator, as the HPA controller reads it (an ExternalMetricValueList)."""
        r = httpx.get(f"{self.server}/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{name}",
                      params={"labelSelector": selector}, verify=self._tls(), timeout=30,
                      headers={"Authorization": f"Bearer {self.token}"})
        r.raise_for_status()
        return dict(r.json())


# ------------------------------------------------------------------ a workload's load and its stack
class KVEngines:
    """What ``fusebox collect kv`` exports for a workload's engines, played: one
    ``fusebox_kv_cache_usage_bytes{cluster, host_name, engine, model}`` per engine, growing at
    ``bytes_per_s`` from when it joined, on /metrics at ``address`` (a loopback address of its own).
    ``set(n)``: exactly ``n`` engines, the first ones kept (their series continue)."""

    def __init__(self, namespace: str, deployment: str, model: str, bytes_per_s: float):
        self.namespace, self.deployment, self.model, self.bytes_per_s = namespace, deployment, model, bytes_per_s
        self.joined: dict[str, float] = {}
        self.lock = threading.Lock()
        self.ip = pod_ip()
        engines = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = engines.exposition(time.time()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer((self.ip, host_port(self.ip, 9411)), Handler)
        self.address = f"{self.ip}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def exposition(self, now: float) -> str:
        with self.lock:
            lines = [f'fusebox_kv_cache_usage_bytes{{cluster="prod-a",host_name="gpu-node-a",'
                     f'engine="{self.namespace}/{e}",model="{self.model}"}} {1e9 + self.bytes_per_s * (now - t):.1f}'
                     for e, t in self.joined.items()]
        return "# TYPE fusebox_kv_cache_usage_bytes gauge\n" + "\n".join(lines) + "\n"

    def set(self, n: int) -> None:
        with self.lock:
            names = [f"{self.deployment}-7d9c8-{i:02d}" for i in range(n)]
            self.joined = {e: self.joined.get(e, time.time()) for e in names}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def prom_query(prom_url: str, q: str) -> list[dict[str, Any]]:
    """An instant query's result list."""
    r = httpx.get(prom_url + "/api/v1/query", params={"query": q}, timeout=10)
    r.raise_for_status()
    return list(r.json()["data"]["result"])


class ScalingStack:
    """A :class:`ScalingPlane`, Debian's Prometheus running ``rules`` (a generated rule file) and
    scraping ``engines`` every second, and a stand-in for the Service ``prometheus-operated`` in
    front of it (cluster DNS, tests/_kube_net.py). ``start(scaled_object)`` starts them, creates
    the target's Namespace and Deployment (1 replica) and applies the ScaledObject with each
    trigger's ``serverAddress`` pointed at the stand-in. ``close()`` stops everything."""

    def __init__(self, root: Path, rules: Path, engines: KVEngines, hpa_sync_period_s: float,
                 prometheus_namespace: str = "monitoring"):
        self.root, self.engines = Path(root), engines
        self.stack = ExitStack()
        self.plane = ScalingPlane(self.root / "k8s", hpa_sync_period_s=hpa_sync_period_s)
        self.stack.callback(self.plane.close)
        prometheus = need("prometheus", "install Debian's prometheus package (`make tools`)")
        prom_dir = self.root / "prom"
        prom_dir.mkdir(parents=True)
        ip = pod_ip()
        self.prom_addr = f"{ip}:{host_port(ip, 9090)}"
        self.prom_url = f"http://{self.prom_addr}"
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rules)],
               "scrape_configs": [{"job_name": "fusebox-collectors-kv", "honor_labels": True, "scrape_interval": "1s",
                                   "static_configs": [{"targets": [engines.address]}]}]}
        (prom_dir / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        self.prometheus_args = [prometheus, f"--config.file={prom_dir / 'prometheus.yml'}",
                                f"--storage.tsdb.path={prom_dir / 'data'}", f"--web.listen-address={self.prom_addr}"]
        self.prometheus: Proc | None = None
        self.services: dict[tuple[str, str], ServiceProxy] = {}
        self.prometheus_namespace = prometheus_namespace
        self.target: tuple[str, str] = ("", "")  # namespace, Deployment

    def start(self, scaled_object: dict[str, Any]) -> dict[str, Any]:
        """Everything up; the ScaledObject as the API server stored it."""
        self.prometheus = Proc("prometheus", self.prometheus_args, self.root / "prom" / "log")
        self.stack.callback(self.prometheus.stop)
        svc = ServiceProxy("prometheus-operated", 9090, lambda: [self.prom_addr])
        self.stack.callback(svc.stop)
        self.services[(self.prometheus_namespace, "prometheus-operated")] = svc
        self.plane.start()
        ns = scaled_object["metadata"]["namespace"]
        ref = scaled_object["spec"]["scaleTargetRef"]
        self.target = (ns, ref["name"])
        labels = {"app.kubernetes.io/name": ref["name"]}
        self.plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        self.plane.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": ref["name"], "namespace": ns},
                          "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                                   "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                                       {"name": "engine", "image": "vllm/vllm-openai:v0.11.0"}]}}}})
        doc = yaml.safe_load(yaml.safe_dump(scaled_object))
        for trigger in doc["spec"]["triggers"]:
            trigger["metadata"]["serverAddress"] = map_service_urls(
                {"url": trigger["metadata"]["serverAddress"]}, self.services)["url"]
        applied = self.plane.apply(doc)
        hpa = f"keda-hpa-{scaled_object['metadata']['name']}"
        wait_until(lambda: prom_query(self.prom_url, "up") != [], 60, "Prometheus' first scrape", alive=self.check)
        wait_until(lambda: self.plane.get("autoscaling/v2", "HorizontalPodAutoscaler", hpa, ns), 60,
                   "KEDA's HPA for the ScaledObject", alive=self.check, why=self.why)
        return applied

    def replicas(self) -> int:
        """The target Deployment's spec.replicas."""
        d = self.plane.get("apps/v1", "Deployment", self.target[1], self.target[0]) or {}
        return int((d.get("spec") or {}).get("replicas") or 0)

    def load(self, workload: str) -> float:
        """``fusebox:scaling_load:ratio{workload}`` now (NaN when absent)."""
        got = prom_query(self.prom_url, f'fusebox:scaling_load:ratio{{workload="{workload}"}}')
        return float(got[0]["value"][1]) if got else float("nan")

    def check(self) -> None:
        self.plane.check()
        if self.prometheus is not None:
            self.prometheus.check()

    def why(self) -> str:
        p = self.plane
        hpas = p.list("autoscaling/v2", "HorizontalPodAutoscaler", self.target[0]) if self.target[0] else []
        return (f"replicas {self.replicas() if self.target[0] else '?'}, HPA status {[h.get('status') for h in hpas]}\n"
                f"--- keda-operator\n{p.keda_operator.tail(2000) if p.keda_operator else ''}\n"
                f"--- kube-controller-manager\n{p.controller_manager.tail(2000) if p.controller_manager else ''}")

    def close(self) -> None:
        self.stack.close()


# ------------------------------------------------------------------ the spec and what generate writes
def scaling_section(workload: str, deployment: str, namespace: str, model: str, replicas: tuple[int, int],
                    sync_period_s: float, scale_down_stabilization_s: float, prometheus_namespace: str = "monitoring") -> dict[str, Any]:
    """A ``scaling:`` section with one KEDA-scaled workload driven by KV growth alone: ``replicas``
    (min, max), a 1 s pod start (it must be positive; no pod starts without a kubelet), KEDA polling
    every second, the HPA sync period kube-controller-manager is started with, no scale-up and
    ``scale_down_stabilization_s`` of scale-down stabilization."""
    return {"prometheus_address": f"http://prometheus-operated.{prometheus_namespace}.svc:9090",
            "keda": {"enabled": True, "polling_interval": "1s", "cooldown_period": "300s"},
            "hpa": {"enabled": False, "sync_period": f"{sync_period_s:g}s", "scale_up_stabilization": "0s",
                    "scale_down_stabilization": f"{scale_down_stabilization_s:g}s"},
            "workloads": [{"name": workload, "target": {"kind": "Deployment", "name": deployment, "namespace": namespace},
                           "model": model, "replicas": {"min": replicas[0], "max": replicas[1]},
                           "price_per_replica_hour": 0.21, "pod_start": "1s", "signals": ["kv_cache_growth_rate"]}]}


def spec_with_scaling(scaling: dict[str, Any], timing: Any) -> str:
    """The shipped spec at ``timing`` (fusebox.demo.spec.Timing) with ``scaling`` as its ``scaling:``."""
    from _support import SPEC

    from fusebox.demo.spec import demo_spec_text

    text = demo_spec_text(SPEC.read_text(), webhook_url="http://fusebox-fuse.monitoring.svc:9095/alertmanager",
                          credentials_file="/etc/alertmanager/secrets/token", timing=timing)
    data = yaml.safe_load(text)
    data["scaling"] = scaling
    return yaml.safe_dump(data, sort_keys=False, width=120)


def generate(text: str, out: Path) -> Any:
    """``fusebox generate`` of the spec ``text`` (written to ``out/fusebox.yaml``) into ``out/gen``;
    the loaded Spec."""
    from fusebox.generator.outputs import render_all
    from fusebox.generator.writer import write_outputs
    from fusebox.spec import load_spec

    out.mkdir(parents=True, exist_ok=True)
    (out / "fusebox.yaml").write_text(text)
    spec = load_spec(out / "fusebox.yaml")
    write_outputs(render_all(spec), out / "gen")
    return spec


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    """The documents of a multi-document YAML file (empty ones left out)."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]
