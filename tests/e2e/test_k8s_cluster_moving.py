"""A cluster as it moves: engine pods created, rescheduled and deleted in a real API server while
the collectors' DaemonSet pod finds them, the GPUs they hold read their real use, and the fuse
takes exactly the right worker out of the real smg 1.13 with its control plane closed.

The spec (fusebox.yaml with 1 s scrapes and evaluations, 10 s ``for``) names NO engine anywhere:
``kubernetes.collectors.run: {gpu: [], kv: []}``, ``kubernetes.engines`` (namespace ``inference``,
selector ``app.kubernetes.io/name: vllm``, port ``http``, one model's geometry), and one fuse
adapter, ``sglang_gateway`` with ``discover`` and ``credentials_file`` at the mount of
``kubernetes.fuse.gateway_secret``; ``kubernetes.fuse.args: [--hold, "5"]`` in place of the starter
spec's ``--dry-run``. What ``fusebox generate`` writes is applied to the API server.

**Real here**: etcd and kube-apiserver v1.37.2 with RBAC authorization (the collectors' pod reads
pods with a token of its own ServiceAccount, made by the TokenRequest API, so the generated Role
and RoleBinding are what lets it); every object of ``k8s/`` whose kind the API server serves
without the operator's CRDs (ConfigMaps, ServiceAccount, Role, RoleBinding, DaemonSet, Deployment,
Service, PodDisruptionBudget, PVC); the DaemonSet's two containers (``collect gpu``, ``collect kv
--discover``) and the fuse Deployment's pod run as their manifests say (tests/_k8s_pods.py), the
spec, the ``fusebox-engines`` ConfigMap and the two Secrets (webhook token, gateway key) read
from the API server into their mounts; the real smg 1.13 with ``--control-plane-api-keys`` (the
key the Secret holds), in front of the engine pods; Debian's Prometheus running the generated
``rules/fusebox.rules.yml`` and Alertmanager running the generated ``alertmanager/alertmanager.yml``.

**Substituted**, each a boundary of "no kubelet, no GPU, no pod network":

* the Prometheus Operator is left out: Prometheus and Alertmanager are wired by hand from the
  generated rules/ and alertmanager/ files (simpler than the operator's relabelling, which
  tests/e2e/test_k8s_cluster.py covers), with static scrape targets for the collectors' pod;
* the engine pods are created with the kubernetes client and their ``status.podIP`` set through the
  status subresource (as a kubelet would); each is a stand-in engine (fusebox.demo.standin) on a
  loopback address of its own (its pod IP) serving a real vLLM v1 /metrics dump
  (tests/fixtures/collectors/hardware-aware-router_vllm-v1_tinyllama-1.1b_idle_2025-11.txt) with its
  ``num_gpu_blocks``, ``gpu_memory_utilization`` (0.9) and ``vllm:kv_cache_usage_perc`` set by the
  test; a deletion is immediate (grace period 0, what a kubelet's confirmation ends in);
* the kubelet's pod-resources socket is a fake kubelet (tests/_kubelet.py) in the folder the
  DaemonSet's hostPath mount names;
* NVML: the gpu container runs ``collect scenario`` in place of ``collect gpu`` (its other args and
  env as the DaemonSet gives them); the scenario plays four GPUs' device memory;
* a mount path named inside the spec's ConfigMap (``credentials_file``) is rewritten in the pod's
  copy of that file to the pod's folder for that mount, as tests/_k8s_pods.py rewrites args, and
  ``kubernetes.fuse.gateway_secret`` is left out of that copy (the fuse checks that the two name
  the Deployment's mount path, which this machine's root does not have; the key itself comes from
  the Secret in the API server through the Deployment's volume, as written);
* the in-cluster service account: the client library reads its token at a fixed path of this
  machine's root, so the kv container gets it as a kubeconfig through ``$KUBECONFIG`` (its own
  ServiceAccount's token, nothing more);
* **kube-state-metrics** is a tiny exporter in this module serving ``kube_pod_info{namespace, pod,
  pod_ip, node}`` and ``kube_pod_status_phase`` from the API server's own pod list, and
  **dcgm-exporter** one serving ``DCGM_FI_DEV_FB_USED{gpu, UUID, namespace, pod}`` from the device
  assignment the fake kubelet answers with (what dcgm-exporter's pod mapping reads), scraped as the GPU Operator's
  ServiceMonitor does (no honor_labels: the pod is in ``exported_pod``, which ``discover`` reads);
* Services and cluster DNS: smg's and the fuse's Services are ServiceProxy stand-ins
  (tests/_kube_net.py); the one in front of smg counts the calls it carries.

Expected values, worked out from the numbers above (not from what the code prints). TinyLlama:
2 (K, V) x 22 layers x 4 KV heads x 64 x 2 bytes = 22,528 B/token; a block of 16 tokens is
360,448 B. An H100 of the scenario: 81,559 MiB = 85,520,809,984 B.

* GPU A, engine ``vllm-a`` (then ``vllm-a2``) preallocating 0.9: 180,000 blocks = 64,880,640,000 B
  of KV pool, 20 % used, so 51,904,512,000 B free; device memory 90 %. The GPU-memory signal reads
  0.90 - 51,904,512,000 / 85,520,809,984 = 0.293077 (the KV-pool correction) and trips nothing.
* GPU B, engine ``vllm-b``: 20,000 blocks = 7,208,960,000 B, 50 % used (3,604,480,000 B free,
  0.042147 of the GPU); device memory climbs from 50 % to 95 % 25 s into the scenario, so the
  signal reads 0.907853 >= 0.783: the critical (freeze_admissions) takes exactly ``vllm-b``'s worker
  out.
* GPU C, engine ``vllm-c``: 180,000 blocks, 10 % used and growing 25 MB/s from its start: KV
  growth 25 MB/s >= 14.7 MB/s (under the 145 MB/s OOM tier): the engine-level critical
  (kv_cache_eviction, engine ``inference/vllm-c``) takes exactly ``vllm-c``'s worker out; GPU C
  reads about 0.90 - 0.683 = 0.217 and trips nothing.
* GPU D, engine ``vllm-d``: 10,000 blocks, 30 % used, device 30 %; the pod is deleted while the
  scenario plays: its series leave within one collection round (5 s, the DaemonSet's default).
* ``vllm-a`` is rescheduled (deleted and at once re-created as ``vllm-a2`` with a new IP on the same
  GPU, as its ReplicaSet does; the GPU's memory stays held, by the new pod's preallocation):
  ``vllm-a``'s series leave and ``vllm-a2``'s bytes appear within one round. For the seconds
  between the two GPU A reads its device memory (0.90) uncorrected: its alerts may go pending
  but, shorter than the 10 s ``for``, never fire.

* ``vllm-e``, an engine pod not started yet (no IP): counted by the collector
  (``fusebox_collector_discovery_skipped_total{reason="no_pod_ip"}``), never scraped.

So smg receives exactly two ``DELETE /workers/{id}`` through its Service, one for each of
``vllm-b`` and ``vllm-c``, and its own worker list loses those two and no other.

One run takes about a minute on 2 cores shared with other work (measured 60 to 64 s): about 6 s to
start the API server, apply and start the pods, the rest the scenario until both workers are out
(about 43 s into it) and 3 s more in which a repeated or stray call would show.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
import shutil
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from _gateways import SMG, sglang_gateway, sglang_workers
from _k8s_pods import Pod, host_port, pod_ip
from _kube_net import ServiceProxy, map_service_urls
from _kube_support import ControlPlane, secret_doc, wait_until
from _kubelet import FakeKubelet, answer
from _support import FIXTURES, SPEC, prometheus_and_alertmanager

from fusebox import conventions as C
from fusebox.demo.spec import Timing, demo_spec_text
from fusebox.demo.standin import StandInEngine

pytestmark = pytest.mark.tools

NS, ENGINES_NS, NODE, CLUSTER = "monitoring", "inference", "gpu-node-a", "prod-a"
KEY = "smg-admin-" + secrets.token_hex(16)  # the gateway's control-plane key, held by a Secret
TIMING = Timing(scrape_interval="1s", evaluation_interval="1s", warning_for="10s", critical_for="10s",
                keep_firing_for="5s", group_wait_critical="1s", group_wait="5s", group_interval="5s")
DUMP = FIXTURES / "collectors" / "hardware-aware-router_vllm-v1_tinyllama-1.1b_idle_2025-11.txt"
MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
BLOCK_BYTES = 16 * 2 * 22 * 4 * 64 * 2  # 360,448: 16 tokens of 22,528 B
TOTAL = 81559 * 2**20  # an H100 of the scenario, bytes
ROUND_S = 5.0  # collect kv's --interval default (the DaemonSet sets none)
SLACK_S = 1.5  # a round's own work (the kubelet's List, one /metrics per engine) and the test's poll
GPUS = {k: f"GPU-{k * 8}-0000-4000-8000-00000000000{k}" for k in "abcd"}
# engine pod -> (GPU, num_gpu_blocks, KV usage at start, KV growth B/s)
ENGINES = {"vllm-a": ("a", 180_000, 0.20, 0.0), "vllm-b": ("b", 20_000, 0.50, 0.0),
           "vllm-c": ("c", 180_000, 0.10, 25e6), "vllm-d": ("d", 10_000, 0.30, 0.0)}
A_CORRECTED = 0.90 - 0.8 * 180_000 * BLOCK_BYTES / TOTAL  # 0.293077
B_CORRECTED = 0.95 - 0.5 * 20_000 * BLOCK_BYTES / TOTAL  # 0.907853

SCENARIO = f"""\
apiVersion: fusebox/v1
kind: FuseboxScenario
metadata: {{name: cluster-moving, description: four GPUs under engine pods that come and go}}
cluster: {CLUSTER}
host: {NODE}
tick: 1s
gpus:
""" + "".join(f"  - {{uuid: {GPUS[k]}, index: {i}, name: NVIDIA H100 80GB HBM3, memory: 81559 MiB, reserved: 479 MiB}}\n"
              for i, k in enumerate("abcd")) + """\
phases:
  - {name: steady, duration: 25s, description: every engine up,
     gpu_memory: {0: 90%, 1: 50%, 2: 90%, 3: 30%}, gpu_utilization: {0: 30%, 1: 30%, 2: 30%, 3: 30%},
     memory_bandwidth: {0: 20%, 1: 20%, 2: 20%, 3: 20%}}
  - {name: surge, duration: 5s, description: GPU B's activations grow past the critical, gpu_memory: {1: 95%}}
  - {name: held, duration: 150s, description: GPU B stays there}
"""


@dataclass
class Run:
    docs: list[dict] = field(default_factory=list)  # k8s/ as generated
    spec_text: str = ""
    warnings: str = ""  # generate's standard error
    kv: dict[str, dict] = field(default_factory=dict)  # event -> what the kv collector exported then
    took: dict[str, float] = field(default_factory=dict)  # event -> seconds
    ratios: dict[str, float] = field(default_factory=dict)  # Prometheus: the GPU-memory records
    firing: list[dict] = field(default_factory=list)  # every alert that fired (Prometheus' ALERTS)
    a_pending_evals: int = 0  # evaluations (1 s apart) GPU A's critical was pending, at most
    kv_in_prometheus: set[str] = field(default_factory=set)  # engines with a current KV limit series at the end
    deletes: list[str] = field(default_factory=list)  # DELETE paths smg's Service carried
    worker_ids: dict[str, str] = field(default_factory=dict)  # engine pod -> its smg worker id
    workers_before: set[str] = field(default_factory=set)
    workers_after: set[str] = field(default_factory=set)
    urls: dict[str, str] = field(default_factory=dict)  # engine pod -> worker URL
    skipped: dict[str, float] = field(default_factory=dict)  # the kv collector's discovery_skipped_total per (engine, reason)
    unauthenticated: int = 0  # smg's answer to DELETE /workers/{id} without the key
    state: dict = field(default_factory=dict)  # the fuse's /state at the end
    logs: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


# ------------------------------------------------------------------------------ stand-ins
def vllm_text(blocks: int, usage) -> Any:
    """The real vLLM v1 dump with this engine's pool and usage (a callable: read at each scrape)."""
    base = DUMP.read_text().replace('num_gpu_blocks="6971"', f'num_gpu_blocks="{blocks}"').replace(
        'gpu_memory_utilization="0.2"', 'gpu_memory_utilization="0.9"')
    line = f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.0'
    assert line in base and f'num_gpu_blocks="{blocks}"' in base
    return lambda: base.replace(line, f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} {usage()!r}')


class Exporter:
    """A tiny /metrics server on a loopback address of its own: ``text()`` at each scrape."""

    def __init__(self, text):
        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                body = text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.ip = pod_ip()
        self.server = ThreadingHTTPServer((self.ip, 0), H)
        self.server.daemon_threads = True
        self.address = f"{self.ip}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def _q(v: str) -> str:
    return json.dumps(v)


def kube_state_metrics(core) -> str:
    """kube-state-metrics' two pod families from the API server's pod list (the boundary stand-in)."""
    out = ["# TYPE kube_pod_info gauge", "# TYPE kube_pod_status_phase gauge"]
    for p in core.list_pod_for_all_namespaces().items:
        m, st = p.metadata, p.status
        base = f"namespace={_q(m.namespace)},pod={_q(m.name)},uid={_q(m.uid)}"
        out.append(f"kube_pod_info{{{base},pod_ip={_q(st.pod_ip or '')},host_ip={_q(st.host_ip or '')},"
                   f"node={_q(p.spec.node_name or '')},created_by_kind=\"<none>\",created_by_name=\"<none>\","
                   f"priority_class=\"\",host_network=\"false\"}} 1")
        for ph in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
            out.append(f"kube_pod_status_phase{{{base},phase={_q(ph)}}} {int((st.phase or 'Pending') == ph)}")
    return "\n".join(out) + "\n"


def dcgm_exporter(assigned: dict[str, tuple[str, str]]) -> str:
    """dcgm-exporter's framebuffer gauge with its Kubernetes pod mapping (GPU UUID -> the pod the
    kubelet gave it), one series per GPU."""
    out = ["# TYPE DCGM_FI_DEV_FB_USED gauge"]
    for i, uuid in enumerate(GPUS.values()):
        pod = assigned.get(uuid)
        who = f',namespace={_q(pod[0])},pod={_q(pod[1])},container="engine"' if pod else ""
        out.append(f'DCGM_FI_DEV_FB_USED{{gpu="{i}",UUID="{uuid}",device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",'
                   f'Hostname="{NODE}"{who}}} 1000')
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------ the spec
def moving_spec_text(smg_url: str, prometheus_url: str) -> str:
    """fusebox.yaml with the test's intervals, an smg adapter that discovers, and no engine named."""
    adapters = {"smg": {"kind": "sglang_gateway", "url": smg_url, "timeout": "5s",
                        "actions": ["freeze_admissions", "kv_cache_eviction"],
                        "credentials_file": f"{C.K8S['gateway_key_dir']}/key", "discover": {"ttl": "1s"}}}
    text = demo_spec_text(SPEC.read_text(), webhook_url=f"http://{C.K8S['fuse']}.{NS}.svc:9095/alertmanager",
                          credentials_file=f"/etc/alertmanager/secrets/{C.K8S['token_secret']}/token",
                          timing=TIMING, adapters=adapters, source="fusebox.yaml")
    data = yaml.safe_load(text)
    # time to full (own tiers on the same GPUs and engines) and alignment (the latency collector,
    # not run here) are left out: the expectations are worked out for the threshold signals
    data["signals"] = {n: s for n, s in data["signals"].items()
                       if s.get("kind") != "time_to_full" and not n.startswith("alignment")}
    # and so is the SLO on the alignment signal (an SLO naming a signal the spec lacks is a spec error)
    data["slos"] = {n: s for n, s in data.get("slos", {}).items() if s.get("signal", "") in ("", *data["signals"])}
    # no autoscaling here: its ScaledObjects need KEDA's CRDs and the engines' namespace (docs/scaling.md)
    data.pop("scaling", None)
    k = data.setdefault("kubernetes", {})
    k["namespace"] = NS
    k.setdefault("collectors", {}).update({"run": {"gpu": [], "kv": []}, "cluster": CLUSTER})
    k["engines"] = {"namespaces": [ENGINES_NS], "selector": {"app.kubernetes.io/name": "vllm"}, "port": "http",
                    "models": {MODEL: {"layers": 22, "kv_heads": 4, "head_dim": 64, "dtype": "bfloat16"}}}
    k.setdefault("fuse", {}).update({"args": ["--hold", "5"], "prometheus_url": prometheus_url,
                                     "gateway_secret": {"name": "fusebox-gateway-key", "key": "key"}})
    return yaml.safe_dump(data, sort_keys=False, width=120)


# ------------------------------------------------------------------------------ helpers
def _engine_pod(name: str, port: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ENGINES_NS, "labels": {"app.kubernetes.io/name": "vllm"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0",
                                                       "ports": [{"name": "http", "containerPort": port}]}]}}


def _kv(url: str) -> dict[tuple[str, str, str], float] | None:
    """{(metric, engine, hw_id): value} of the kv collector's fusebox_kv_cache_* series."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(url + "/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    return {(s.name, s.labels.get("engine", ""), s.labels.get("hw_id", "")): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name.startswith("fusebox_kv_cache_")}


def _engines_in(kv: dict | None) -> set[str]:
    return {e for (_n, e, _h) in (kv or {})}


def _query(prom: str, q: str) -> list[dict]:
    r = httpx.get(prom + "/api/v1/query", params={"query": q}, timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# ------------------------------------------------------------------------------ the run
@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    res = Run()
    t_start = time.monotonic()
    root = tmp_path_factory.mktemp("moving")
    prometheus_exe, am_exe = prometheus_and_alertmanager()
    with ExitStack() as stack:
        # 1. the control plane (RBAC), its namespaces ----------------------------------------
        cp = ControlPlane(root / "cp", authorization="RBAC")
        stack.callback(cp.close)
        cp.start()
        from kubernetes import client, config

        core = client.CoreV1Api(config.new_client_from_config(config_file=str(cp.kubeconfig)))
        for ns in (NS, ENGINES_NS):
            cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        # no controller manager here to make the default service account pods need
        cp.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ENGINES_NS}})
        res.timings["api_server_s"] = time.monotonic() - t_start

        # 2. the engines (not yet pods), the fake kubelet, smg with its control plane closed ---
        t_engines = time.monotonic()
        engines: dict[str, StandInEngine] = {}
        assigned: dict[str, tuple[str, str]] = {}  # GPU UUID -> (namespace, pod): the kubelet's view

        def engine(name: str, gpu: str, blocks: int, usage0: float, growth: float) -> StandInEngine:
            t0 = time.monotonic()
            pool = blocks * BLOCK_BYTES
            ip = pod_ip()
            e = StandInEngine(ip, metrics=vllm_text(blocks, lambda: min(1.0, usage0 + growth * (time.monotonic() - t0) / pool)),
                              port=host_port(ip, 8000))
            stack.callback(e.stop)
            engines[name] = e
            res.urls[name] = e.url
            return e

        for name, spec in ENGINES.items():
            engine(name, *spec)
        kubelet_dir = root / "kubelet"
        kubelet_dir.mkdir()

        def kubelet_answer():
            return answer({pod: [("nvidia.com/gpu", [uuid])] for uuid, pod in assigned.items()})

        smg = sglang_gateway([res.urls[n] for n in ENGINES], root / "smg.log", package=SMG, key=KEY)
        stack.callback(smg.stop)
        smg_svc = ServiceProxy("smg", 30000, lambda: [smg.url.removeprefix("http://")])
        stack.callback(smg_svc.stop)
        ids = {w["url"].rstrip("/"): w["id"] for w in sglang_workers(smg.url, KEY).values()}
        res.worker_ids = {n: ids[u] for n, u in res.urls.items()}
        res.workers_before = set(ids)
        res.unauthenticated = httpx.delete(f"{smg.url}/workers/{res.worker_ids['vllm-a']}", timeout=5).status_code

        # 3. generate (what `make generate` writes), apply k8s/, the user's Secrets ------------
        prom_ip = pod_ip()
        prom_port = host_port(prom_ip, 9090)
        prom_url = f"http://{prom_ip}:{prom_port}"
        res.spec_text = moving_spec_text(f"http://{smg_svc.ip}:{smg_svc.port}", prom_url)
        spec_path = root / "fusebox.yaml"
        spec_path.write_text(res.spec_text)
        out_dir = root / "generated"
        r = subprocess.run([sys.executable, "-m", "fusebox.cli", "generate", "--spec", str(spec_path), "--out",
                            str(out_dir)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        res.warnings = r.stderr
        token = secrets.token_urlsafe(32)
        cp.apply(secret_doc(C.K8S["token_secret"], NS, {C.K8S["token_key"]: token}))
        cp.apply(secret_doc("fusebox-gateway-key", NS, {"key": KEY}))
        kustomization = yaml.safe_load((out_dir / "k8s" / "kustomization.yaml").read_text())
        for f in kustomization["resources"]:
            for doc in yaml.safe_load_all((out_dir / "k8s" / f).read_text()):
                if doc:
                    res.docs.append(doc)
                    if "monitoring.coreos.com" not in doc["apiVersion"]:  # no operator, no CRDs
                        cp.apply(doc)
        secrets_ = {s.metadata.name: {k: base64.b64decode(v).decode() for k, v in (s.data or {}).items()}
                    for s in core.list_namespaced_secret(NS).items}
        configmaps = {c.metadata.name: dict(c.data or {}) for c in core.list_namespaced_config_map(NS).items}

        # 4. the engine pods: created, scheduled on the node, their IPs set (as a kubelet does) -
        def run_pod(name: str, gpu: str) -> None:
            e = engines[name]
            ip, port = e.url.removeprefix("http://").rsplit(":", 1)
            core.create_namespaced_pod(ENGINES_NS, _engine_pod(name, int(port)))
            assigned[GPUS[gpu]] = (ENGINES_NS, name)  # the device plugin's pick, as the kubelet lists it
            kubelet.answer = kubelet_answer()
            core.patch_namespaced_pod_status(name, ENGINES_NS, {"status": {
                "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "10.0.0.10"}})

        def delete_pod(name: str) -> None:
            core.delete_namespaced_pod(name, ENGINES_NS, grace_period_seconds=0)
            for uuid, pod in list(assigned.items()):
                if pod == (ENGINES_NS, name):
                    del assigned[uuid]
            kubelet.answer = kubelet_answer()

        ds = copy.deepcopy(cp.get("apps/v1", "DaemonSet", "fusebox-collectors", NS))
        coll_ip = pod_ip()
        kv_pod = Pod(ds, root / "coll-kv", secrets=secrets_, configmaps=configmaps, name="fusebox-collectors-q7w2x",
                     node=NODE, ip=coll_ip, container="kv")
        sock = kv_pod.local("/var/lib/kubelet/pod-resources/kubelet.sock")
        kubelet = FakeKubelet(sock, kubelet_answer())
        stack.callback(kubelet.stop)
        for name, (gpu, *_rest) in ENGINES.items():
            run_pod(name, gpu)
        # an engine pod not started yet (no IP, no GPU): counted by the collector, never a target
        core.create_namespaced_pod(ENGINES_NS, _engine_pod("vllm-e", 8000))
        res.timings["engines_s"] = time.monotonic() - t_engines

        # 5. the exporters standing in for kube-state-metrics and dcgm-exporter; Prometheus ----
        ksm = Exporter(lambda: kube_state_metrics(core))
        dcgm = Exporter(lambda: dcgm_exporter(assigned))
        stack.callback(ksm.stop)
        stack.callback(dcgm.stop)
        # the collectors' pod: the kv container with its ServiceAccount's token (TokenRequest)
        tok = core.create_namespaced_service_account_token("fusebox-collectors", NS, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=["https://kubernetes.default.svc.cluster.local"],
                                           expiration_seconds=3600))).status.token
        kubeconfig = kv_pod.local("/tmp") + "/kubeconfig"
        Path(kubeconfig).write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "sa",
            "clusters": [{"name": "c", "cluster": {"server": cp.server, "certificate-authority": str(cp.ca)}}],
            "users": [{"name": "sa", "user": {"token": tok}}],
            "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}]}))
        kv_pod.container.setdefault("env", []).append({"name": "KUBECONFIG", "value": "/tmp/kubeconfig"})
        gpu_pod = Pod(ds, root / "coll-gpu", secrets=secrets_, configmaps=configmaps, name="fusebox-collectors-q7w2x",
                      node=NODE, ip=coll_ip, container="gpu")
        args = gpu_pod.container["args"]
        assert args[:2] == ["collect", "gpu"], args
        args[1:2] = ["scenario", "/tmp/scenario.yaml", "--speed", "1", "--spec", "/tmp/fusebox.yaml"]
        (gpu_pod.mounts["/tmp"] / "scenario.yaml").write_text(SCENARIO)
        # `collect scenario` reads a spec for its alignment buckets only (this scenario plays no
        # engine): the shipped one, as this spec leaves alignment out
        shutil.copy(SPEC, gpu_pod.mounts["/tmp"] / "fusebox.yaml")

        # Alertmanager from the generated config; the fuse as its Deployment runs it
        dep = cp.get("apps/v1", "Deployment", C.K8S["fuse"], NS)
        fuse = Pod(dep, root / "fuse", secrets=secrets_, configmaps=configmaps, name=f"{C.K8S['fuse']}-6d8f9-k2j4p")
        # the spec in the pod's ConfigMap names the key's mount path: that folder of the pod here
        mounted = Path(fuse.local("/etc/fusebox/fusebox.yaml"))
        mounted_spec = yaml.safe_load(mounted.read_text())
        assert mounted_spec["kubernetes"]["fuse"].pop("gateway_secret") == {"name": "fusebox-gateway-key", "key": "key"}
        mounted.write_text(yaml.safe_dump(mounted_spec, sort_keys=False).replace(
            C.K8S["gateway_key_dir"], fuse.local(C.K8S["gateway_key_dir"])))
        fuse.start()
        stack.callback(fuse.stop, 10)
        fuse_svc = ServiceProxy(C.K8S["fuse"], 9095, lambda: [f"{fuse.ip}:{fuse.host_ports[9095]}"])
        stack.callback(fuse_svc.stop)
        (root / "am").mkdir()
        (root / "am" / "token").write_text(token)
        am_cfg = yaml.safe_load((out_dir / "alertmanager" / "alertmanager.yml").read_text())
        for rc in am_cfg["receivers"]:
            for w in rc.get("webhook_configs") or []:
                w["http_config"]["authorization"]["credentials_file"] = str(root / "am" / "token")
        am_cfg = map_service_urls(am_cfg, {(NS, C.K8S["fuse"]): fuse_svc})
        (root / "am" / "alertmanager.yml").write_text(yaml.safe_dump(am_cfg))
        am_ip = pod_ip()
        am_addr = f"{am_ip}:{host_port(am_ip, 9093)}"
        am_log = (root / "am" / "log").open("wb")
        am = subprocess.Popen([am_exe, f"--config.file={root / 'am' / 'alertmanager.yml'}",
                               f"--storage.path={root / 'am' / 'data'}", f"--web.listen-address={am_addr}",
                               "--cluster.listen-address="], stdout=am_log, stderr=subprocess.STDOUT,
                              start_new_session=True)
        stack.callback(lambda: (am.terminate(), am.wait(10)))
        (root / "prom").mkdir()
        static = {"honor_labels": True, "scrape_interval": "1s"}
        prom_cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(out_dir / "rules" / "fusebox.rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am_addr]}]}]},
            "scrape_configs": [
                {"job_name": "fusebox-collectors-gpu", **static,
                 "static_configs": [{"targets": [f"{coll_ip}:{gpu_pod.host_ports[9410]}"]}]},
                {"job_name": "fusebox-collectors-kv", **static,
                 "static_configs": [{"targets": [f"{coll_ip}:{kv_pod.host_ports[9411]}"]}]},
                {"job_name": "kube-state-metrics", **static, "static_configs": [{"targets": [ksm.address]}]},
                # the GPU Operator's ServiceMonitor: no honorLabels, the target's own pod labels
                {"job_name": "gpu-operator/nvidia-dcgm-exporter", "scrape_interval": "1s",
                 "static_configs": [{"targets": [dcgm.address], "labels": {
                     "namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-5xk8w", "container": "nvidia-dcgm-exporter"}}]}]}
        (root / "prom" / "prometheus.yml").write_text(yaml.safe_dump(prom_cfg))
        prom_log = (root / "prom" / "log").open("wb")
        prom = subprocess.Popen([prometheus_exe, f"--config.file={root / 'prom' / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={root / 'prom' / 'data'}", f"--web.listen-address={prom_ip}:{prom_port}"],
                                stdout=prom_log, stderr=subprocess.STDOUT, start_new_session=True)
        stack.callback(lambda: (prom.terminate(), prom.wait(10)))
        kv_pod.start()
        stack.callback(kv_pod.stop, 10)
        gpu_pod.start()
        stack.callback(gpu_pod.stop, 10)
        t0 = time.monotonic()
        res.timings["scenario_start_s"] = t0 - t_start
        pods = {"fuse": fuse, "collectors/kv": kv_pod, "collectors/gpu": gpu_pod}

        def alive():
            for n, p in pods.items():
                if p.proc is not None and p.proc.poll() is not None:
                    raise AssertionError(f"pod {n} exited {p.proc.returncode}: {p.output()[-3000:]}")
            for n, pr in (("prometheus", prom), ("alertmanager", am)):
                if pr.poll() is not None:
                    raise AssertionError(f"{n} exited {pr.returncode}")

        def why():
            return "\n".join(f"--- {n}\n{p.output()[-2000:]}" for n, p in pods.items())

        try:
            fuse.wait_ready(timeout=60, period=0.5)
            wait_until(lambda: _ready(prom_url + "/-/ready"), 60, "Prometheus", alive=alive)
            wait_until(lambda: _ready(f"http://{am_addr}/-/ready"), 60, "Alertmanager", alive=alive)
            kv_url = kv_pod.url(9411)
            first = wait_until(lambda: (k := _kv(kv_url)) and _engines_in(k) >= {f"{ENGINES_NS}/{n}" for n in ENGINES} and k,
                               60, "every engine's KV bytes", step=0.2, alive=alive, why=why)
            res.kv["first"] = first
            res.timings["first_kv_s"] = time.monotonic() - t0

            # 6. rescheduled: vllm-a deleted and at once re-created as vllm-a2 (new name, new IP) on
            # GPU A, as its ReplicaSet does; its memory stays held (the new pod preallocates it)
            engine("vllm-a2", *ENGINES["vllm-a"])
            delete_pod("vllm-a")
            t_deleted = time.monotonic()
            run_pod("vllm-a2", "a")
            t_created = time.monotonic()
            seen: dict[str, float] = {}

            def moved():
                k = _kv(kv_url)
                if k is not None:
                    now = time.monotonic()
                    if f"{ENGINES_NS}/vllm-a" not in _engines_in(k):
                        seen.setdefault("a_gone", now - t_deleted)
                    if f"{ENGINES_NS}/vllm-a2" in _engines_in(k):
                        seen.setdefault("a2_appeared", now - t_created)
                        res.kv.setdefault("a2", k)
                return len(seen) == 2

            wait_until(moved, 3 * ROUND_S, "vllm-a's series to leave and vllm-a2's to appear", step=0.1, alive=alive, why=why)
            res.took.update(seen)
            # the user's rollout moves the gateway's worker too (smg has no discovery here)
            h = {"Authorization": f"Bearer {KEY}"}
            httpx.delete(f"{smg.url}/workers/{res.worker_ids['vllm-a']}", headers=h, timeout=5).raise_for_status()
            httpx.post(f"{smg.url}/workers", json={"url": res.urls["vllm-a2"]}, headers=h, timeout=5).raise_for_status()

            # 7. deleted: vllm-d (scaled down)
            delete_pod("vllm-d")
            t = time.monotonic()
            wait_until(lambda: (k := _kv(kv_url)) is not None and f"{ENGINES_NS}/vllm-d" not in _engines_in(k),
                       3 * ROUND_S, "vllm-d's series to leave", step=0.1, alive=alive, why=why)
            res.took["d_gone"] = time.monotonic() - t
            httpx.delete(f"{smg.url}/workers/{res.worker_ids['vllm-d']}", headers=h, timeout=5).raise_for_status()

            # 8. GPU A's corrected reading in Prometheus, with vllm-a2's pool
            def a_ratios():
                got = {}
                for rec in ("gpu:fusebox_gpu_memory_utilization:ratio", "gpu:fusebox_gpu_memory_device_utilization:ratio"):
                    s = _query(prom_url, f'{rec}{{hw_id="{GPUS["a"]}"}}')
                    if len(s) != 1:
                        return None
                    got[rec] = float(s[0]["value"][1])
                return got if abs(got["gpu:fusebox_gpu_memory_utilization:ratio"] - A_CORRECTED) < 1e-4 else None

            res.ratios = wait_until(a_ratios, 30, "GPU A's corrected ratio", step=0.5, alive=alive, why=why)

            # 9. the fuse: vllm-b's worker (GPU critical) and vllm-c's (engine KV critical) out
            want = res.workers_before - {res.urls["vllm-a"], res.urls["vllm-d"], res.urls["vllm-b"], res.urls["vllm-c"]} \
                | {res.urls["vllm-a2"]}

            def settled():
                ws = {u.rstrip("/") for u, w in sglang_workers(smg.url, KEY).items() if w.get("status") != "draining"}
                deletes = [p for m, p, _b, _to in list(smg_svc.seen) if m == "DELETE"]
                return ws if ws == want and len(deletes) >= 2 else None

            res.workers_after = wait_until(settled, 90, "smg to lose vllm-b's and vllm-c's workers", step=0.5,
                                           alive=alive, why=why)
            res.timings["both_out_s"] = time.monotonic() - t0
            time.sleep(3)  # a repeated or stray call would show in these seconds
            res.workers_after = {u.rstrip("/") for u, w in sglang_workers(smg.url, KEY).items() if w.get("status") != "draining"}
        finally:
            res.deletes = [p for m, p, _b, _to in list(smg_svc.seen) if m == "DELETE"]
            try:
                res.firing = [s["metric"] for s in _query(prom_url, 'max_over_time(ALERTS{alertstate="firing"}[10m])')]
                res.a_pending_evals = int(max([float(x["value"][1]) for x in _query(prom_url, (
                    f'count_over_time(ALERTS{{alertstate="pending",alertname="GPUMemoryUtilizationHigh",hw_id="{GPUS["a"]}",'
                    'severity="critical"}[10m])'))] or [0]))
                res.kv_in_prometheus = {s["metric"].get("engine", "") for s in _query(prom_url, "fusebox_kv_cache_limit_bytes")}
                res.state = httpx.get(fuse.url() + "/state", headers={"Authorization": f"Bearer {token}"}, timeout=5).json()
            except (httpx.HTTPError, ValueError):
                pass
            (root / "state.json").write_text(json.dumps({"state": res.state, "firing": res.firing, "deletes": res.deletes,
                                                         "took": res.took, "timings": res.timings}, indent=1, default=str))
            try:
                from prometheus_client.parser import text_string_to_metric_families

                text = httpx.get(kv_pod.url(9411) + "/metrics", timeout=5).text
                res.skipped = {f"{s.labels.get('engine')} {s.labels.get('reason')}": s.value
                               for f in text_string_to_metric_families(text) for s in f.samples
                               if s.name == "fusebox_collector_discovery_skipped_total"}
            except httpx.HTTPError:
                pass
            res.logs = {n: p.output() for n, p in pods.items()}
            res.logs["smg"] = smg.log.read_text(errors="replace")
            res.timings["total_s"] = time.monotonic() - t_start
            print("GPU A's critical pending for", res.a_pending_evals, "evaluations")
            print("moving cluster test timings:", {k: round(v, 1) for k, v in {**res.timings, **res.took}.items()})
    return res


# ------------------------------------------------------------------------------ the tests
def test_no_engine_is_named_in_the_spec_or_k8s(run):
    per_engine = ("--endpoint", "--model-config", "--gpu", "--engine-id")
    text = run.spec_text + yaml.safe_dump_all(run.docs)
    assert not [a for a in per_engine if a in text]
    ds = next(d for d in run.docs if d["kind"] == "DaemonSet")
    kv = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "kv")
    assert "--discover" in kv["args"]
    # KV bytes are produced (discovery covers them): generate says nothing about fusebox_kv_cache_*
    assert "fusebox_kv_cache" not in run.warnings, run.warnings


def test_every_engine_pods_kv_bytes_as_worked_out(run):
    first = run.kv["first"]
    for name, (gpu, blocks, usage, _growth) in ENGINES.items():
        key = (f"{ENGINES_NS}/{name}", GPUS[gpu])
        assert first[("fusebox_kv_cache_limit_bytes", *key)] == blocks * BLOCK_BYTES, name
        if name != "vllm-c":  # vllm-c grows
            assert first[("fusebox_kv_cache_usage_bytes", *key)] == pytest.approx(usage * blocks * BLOCK_BYTES), name
    assert ENGINES["vllm-a"][1] * BLOCK_BYTES == 64_880_640_000


def test_a_rescheduled_pods_bytes_appear_within_one_round_and_the_old_ones_leave(run):
    assert run.took["a_gone"] <= ROUND_S + SLACK_S, run.took
    assert run.took["a2_appeared"] <= ROUND_S + SLACK_S, run.took
    k = run.kv["a2"]
    assert k[("fusebox_kv_cache_limit_bytes", f"{ENGINES_NS}/vllm-a2", GPUS["a"])] == 64_880_640_000
    assert k[("fusebox_kv_cache_usage_bytes", f"{ENGINES_NS}/vllm-a2", GPUS["a"])] == pytest.approx(0.2 * 64_880_640_000)
    assert f"{ENGINES_NS}/vllm-a" not in _engines_in(k)


def test_a_deleted_pods_series_leave_within_one_round_and_go_stale_in_prometheus(run):
    assert run.took["d_gone"] <= ROUND_S + SLACK_S, run.took
    assert run.kv_in_prometheus == {f"{ENGINES_NS}/{n}" for n in ("vllm-a2", "vllm-b", "vllm-c")}, run.kv_in_prometheus


def test_the_gpu_whose_engine_preallocates_reads_its_real_use_and_trips_nothing(run):
    assert run.ratios["gpu:fusebox_gpu_memory_device_utilization:ratio"] == pytest.approx(0.90, abs=1e-6)
    assert run.ratios["gpu:fusebox_gpu_memory_utilization:ratio"] == pytest.approx(A_CORRECTED, abs=1e-6)
    assert A_CORRECTED == pytest.approx(0.293077, abs=1e-6)
    for gpu in ("a", "c", "d"):
        assert not [a for a in run.firing if a.get("hw_id") == GPUS[gpu]], (gpu, run.firing)
    # while vllm-a's pool had left and vllm-a2's not yet come, GPU A read 0.90: pending at most
    # about one collection round, well short of the 10 s `for`
    assert run.a_pending_evals <= ROUND_S + SLACK_S + 1, run.a_pending_evals
    for name in ("vllm-a", "vllm-a2", "vllm-b", "vllm-d"):
        assert not [a for a in run.firing if a.get("engine") == f"{ENGINES_NS}/{name}"], (name, run.firing)


def test_only_gpu_bs_memory_and_vllm_cs_kv_growth_fired(run):
    fired = {(a["alertname"], a.get("severity"), a.get("hw_id") or a.get("engine")) for a in run.firing}
    assert fired == {("GPUMemoryUtilizationHigh", "critical", GPUS["b"]), ("GPUMemoryUtilizationHigh", "warning", GPUS["b"]),
                     ("KVCacheGrowthRateHigh", "critical", f"{ENGINES_NS}/vllm-c"),
                     ("KVCacheGrowthRateHigh", "warning", f"{ENGINES_NS}/vllm-c"),
                     ("FuseboxHeartbeat", "none", None)}, run.firing
    assert B_CORRECTED == pytest.approx(0.907853, abs=1e-6)


def test_smg_with_a_closed_control_plane_lost_exactly_b_and_c(run):
    assert run.unauthenticated == 401  # smg refuses a DELETE without the key
    gone = {run.urls["vllm-b"], run.urls["vllm-c"]}
    assert run.workers_after == {run.urls["vllm-a2"]} | (run.workers_before - gone - {run.urls["vllm-a"], run.urls["vllm-d"]})
    assert gone <= run.workers_before
    # exactly two DELETE calls reached smg through its Service: one per worker, from the fuse
    assert sorted(run.deletes) == sorted(f"/workers/{run.worker_ids[n]}" for n in ("vllm-b", "vllm-c")), run.deletes


def test_the_fuse_says_each_level_was_applied_by_smg_on_its_scope(run):
    scope_b = f'{{cluster="{CLUSTER}",host_name="{NODE}",hw_id="{GPUS["b"]}"}}'
    scope_c = f'{{cluster="{CLUSTER}",host_name="{NODE}",engine="{ENGINES_NS}/vllm-c"}}'
    assert run.state.get("tripped") == {scope_b: 1, scope_c: 3}, run.state
    for sc in run.state["scopes"]:
        for lvl in sc["levels"].values():
            assert (lvl["applied"], lvl["applied_by"], lvl["pending"], lvl["not_applied"]) == (True, ["smg"], [], []), sc
    assert " ERROR " not in run.logs["fuse"], run.logs["fuse"][-3000:]


def test_an_engine_pod_without_an_ip_is_counted_and_never_scraped(run):
    assert run.skipped.get(f"{ENGINES_NS}/vllm-e no_pod_ip", 0) >= 1, run.skipped
    assert f"{ENGINES_NS}/vllm-e" not in _engines_in(run.kv["a2"])
