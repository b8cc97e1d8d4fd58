"""Scale first, fuse last: a load the test controls raises the engine Deployment's ``spec.replicas``
through the REAL scaling path, before any fuse tier fires, and lowers it again.

**Real here** (tests/_scaling_support.py): etcd and kube-apiserver v1.37.2 with its aggregator;
kube-controller-manager v1.37.2 (its HPA, deployment, replicaset and serviceaccount controllers;
HPA sync period ``HPA_SYNC_PERIOD_S``); KEDA v2.21.0's operator and metrics API server (the
APIService ``v1beta1.external.metrics.k8s.io``) with KEDA's own CRDs; Debian's Prometheus running
the rules ``fusebox generate`` writes for the shipped spec (every fuse tier's alert) with the demo's
1 s intervals, plus the scaling group: the ``fusebox:scaling_load:ratio`` record; the ScaledObject,
applied as ``kubectl apply --server-side`` sends it.

**Substituted**, each a boundary of "no kubelet, no engine, no pod network":

* the engines: the test serves ``fusebox_kv_cache_usage_bytes{cluster, host_name, engine, model}``
  (what ``fusebox collect kv`` exports per engine) on a /metrics of its own, each engine's bytes
  growing at a rate the test sets; Prometheus scrapes it every second;
* cluster DNS: the ScaledObject's ``serverAddress`` (``prometheus-operated.monitoring.svc:9090``)
  is pointed at a ServiceProxy in front of that Prometheus (tests/_kube_net.py);
* the Deployment's Pods are created by its ReplicaSet and stay Pending (no scheduler, no kubelet):
  the HPA's External ``AverageValue`` metric needs no pod (desired = ceil(sum / target)).

Expected values, worked out by hand. The KV-growth signal's safe level (its warning tier) is
9.2 MB/s; its fuse (critical) tier is 14.7 MB/s. Every engine grows at 6.9 MB/s (0.75 of the safe
level: no engine ever reaches a tier, so no alert of the signal may fire, least of all a fuse
tier's). The record is the sum over the workload's engines of deriv / 9.2e6, so with n engines the
load is 0.75 n and KEDA's trigger (AverageValue, threshold 1) makes the HPA's desired count
ceil(0.75 n), clamped to the ScaledObject's [1, 5] (the HPA's 10 % tolerance never holds it: every
step below moves the ratio load / current replicas by more than that):

=========  ====  =============  ================
phase      n     load           replicas
=========  ====  =============  ================
start      1     0.75           1 (ceil 0.75)
rise       5     3.75           4 (ceil 3.75)
peak       9     6.75           5 (ceil 7, max 5)
fall       1     0.75           1, after the 5 s scale-down stabilization of the test's spec
=========  ====  =============  ================
"""

from __future__ import annotations

import math
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
from _k8s_pods import host_port, pod_ip
from _kube_net import ServiceProxy, map_service_urls
from _kube_support import Proc, wait_until
from _scaling_support import ScalingPlane
from _support import SPEC, need

from fusebox.demo.spec import Timing, demo_spec_text

pytestmark = pytest.mark.tools

NS, MON = "inference", "monitoring"
WORKLOAD, DEPLOYMENT = "llava-7b", "vllm-llava"
MODEL = "llava-hf/llava-1.5-7b-hf"
SAFE_BPS = 9.2e6  # kv_cache_growth_rate's warning tier (the set point), bytes/s
FUSE_BPS = 14.7e6  # its critical tier (fuse: kv_cache_eviction)
PER_ENGINE_BPS = 0.75 * SAFE_BPS  # 6.9 MB/s
MIN_REPLICAS, MAX_REPLICAS = 1, 5
SCALE_DOWN_STABILIZATION_S = 5
TIMING = Timing(scrape_interval="1s", evaluation_interval="1s", warning_for="10s", critical_for="10s",
                keep_firing_for="5s")
PHASES = (("start", 1), ("rise", 5), ("peak", 9), ("fall", 1))  # (name, engines growing at 6.9 MB/s)


def expected_replicas(engines: int) -> int:
    """ceil(load), load = engines x 6.9e6 / 9.2e6, clamped to [min, max]."""
    return max(MIN_REPLICAS, min(MAX_REPLICAS, math.ceil(engines * PER_ENGINE_BPS / SAFE_BPS)))


# The scaling outputs of a workload {llava-7b: Deployment inference/vllm-llava, replicas 1..5,
# signals [kv_cache_growth_rate]} in the contract's shape (the record and the ScaledObject).
SCALING_RULES = {"groups": [{"name": "fusebox-scaling", "interval": "1s", "rules": [
    {"record": "fusebox:scaling_signal_load:ratio",
     "expr": f'sum(clamp_min(engine:fusebox_kv_cache_usage_bytes:deriv1m{{model="{MODEL}"}}, 0)) / 9200000',
     "labels": {"workload": WORKLOAD, "signal": "kv_cache_growth_rate"}},
    {"record": "fusebox:scaling_load:ratio", "expr": "max by (workload) (fusebox:scaling_signal_load:ratio)"}]}]}
SCALED_OBJECT: dict[str, Any] = {
    "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
    "metadata": {"name": WORKLOAD, "namespace": NS,
                 "labels": {"app.kubernetes.io/name": WORKLOAD, "app.kubernetes.io/part-of": "fusebox",
                            "app.kubernetes.io/component": "scaling"}},
    "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": DEPLOYMENT},
             "pollingInterval": 1, "cooldownPeriod": 300, "minReplicaCount": MIN_REPLICAS, "maxReplicaCount": MAX_REPLICAS,
             "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                 "scaleUp": {"stabilizationWindowSeconds": 0},
                 "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_STABILIZATION_S}}}},
             "triggers": [{"type": "prometheus", "name": "scaling-load", "metricType": "AverageValue",
                           "metadata": {"serverAddress": f"http://prometheus-operated.{MON}.svc:9090",
                                        "query": f'fusebox:scaling_load:ratio{{workload="{WORKLOAD}"}}',
                                        "threshold": "1", "ignoreNullValues": "false"}}]}}


class Engines:
    """``fusebox_kv_cache_usage_bytes`` of ``n`` engines, each growing at 6.9 MB/s from when it
    joined, on /metrics at ``address``."""

    def __init__(self) -> None:
        self.joined: dict[str, float] = {}
        self.lock = threading.Lock()
        self.ip = pod_ip()
        engines = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                now = time.time()
                with engines.lock:
                    lines = [f'fusebox_kv_cache_usage_bytes{{cluster="prod-a",host_name="gpu-node-a",engine="{NS}/{e}",'
                             f'model="{MODEL}"}} {1e9 + PER_ENGINE_BPS * (now - t):.1f}' for e, t in engines.joined.items()]
                body = ("# TYPE fusebox_kv_cache_usage_bytes gauge\n" + "\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer((self.ip, host_port(self.ip, 9411)), Handler)
        self.address = f"{self.ip}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set(self, n: int) -> None:
        """Exactly ``n`` engines (the first ones kept, so their series continue)."""
        with self.lock:
            names = [f"{DEPLOYMENT}-7d9c8-{i:02d}" for i in range(n)]
            self.joined = {e: self.joined.get(e, time.time()) for e in names}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Run:
    replicas: dict[str, int] = field(default_factory=dict)  # phase -> the Deployment's spec.replicas reached
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> load change to that count
    load: dict[str, float] = field(default_factory=dict)  # phase -> fusebox:scaling_load:ratio then
    firing_fuse: list[dict[str, Any]] = field(default_factory=list)  # fuse-tier alerts seen pending/firing
    hpa: dict[str, Any] = field(default_factory=dict)
    deployment: dict[str, Any] = field(default_factory=dict)
    applied: dict[str, Any] = field(default_factory=dict)
    external: dict[str, Any] = field(default_factory=dict)
    fuse_rules: list[dict[str, Any]] = field(default_factory=list)  # the loaded alerting rules with a fuse_action


def _spec_text() -> str:
    return demo_spec_text(SPEC.read_text(), webhook_url="http://fusebox-fuse.monitoring.svc:9095/alertmanager",
                          credentials_file="/etc/alertmanager/secrets/token", timing=TIMING)


def _generate(out: Path) -> None:
    from fusebox.generator.outputs import render_all
    from fusebox.generator.writer import write_outputs
    from fusebox.spec import load_spec

    (out / "fusebox.yaml").write_text(_spec_text())
    write_outputs(render_all(load_spec(out / "fusebox.yaml")), out / "gen")


def _quantity(text: str) -> float:
    """A Kubernetes quantity as the metrics API writes one ("6748m", "6.748")."""
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _query(prom: str, q: str) -> list[dict[str, Any]]:
    r = httpx.get(prom + "/api/v1/query", params={"query": q}, timeout=10)
    r.raise_for_status()
    return list(r.json()["data"]["result"])


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    prometheus = need("prometheus", "install Debian's prometheus package (`make tools`)")
    root = tmp_path_factory.mktemp("scaling")
    res = Run()
    with ExitStack() as stack:
        plane = ScalingPlane(root / "k8s")
        stack.callback(plane.close)
        _generate(root)
        engines = Engines()
        stack.callback(engines.stop)
        engines.set(PHASES[0][1])

        (root / "prom").mkdir()
        (root / "prom" / "scaling.rules.yml").write_text(yaml.safe_dump(SCALING_RULES))
        prom_ip = pod_ip()
        prom_addr = f"{prom_ip}:{host_port(prom_ip, 9090)}"
        prom_url = f"http://{prom_addr}"
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
               "rule_files": [str(root / "gen" / "rules" / "fusebox.rules.yml"), str(root / "prom" / "scaling.rules.yml")],
               "scrape_configs": [{"job_name": "fusebox-collectors-kv", "honor_labels": True, "scrape_interval": "1s",
                                   "static_configs": [{"targets": [engines.address]}]}]}
        (root / "prom" / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        prom = Proc("prometheus", [prometheus, f"--config.file={root / 'prom' / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={root / 'prom' / 'data'}", f"--web.listen-address={prom_addr}"],
                    root / "prom" / "log")
        stack.callback(prom.stop)
        svc = ServiceProxy("prometheus-operated", 9090, lambda: [prom_addr])
        stack.callback(svc.stop)

        plane.start()
        plane.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        plane.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": DEPLOYMENT, "namespace": NS},
                     "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": DEPLOYMENT}},
                              "template": {"metadata": {"labels": {"app.kubernetes.io/name": DEPLOYMENT}},
                                           "spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0"}]}}}})
        so = map_service_urls({"url": SCALED_OBJECT["spec"]["triggers"][0]["metadata"]["serverAddress"]},
                              {(MON, "prometheus-operated"): svc})["url"]
        doc = yaml.safe_load(yaml.safe_dump(SCALED_OBJECT))
        doc["spec"]["triggers"][0]["metadata"]["serverAddress"] = so
        res.applied = plane.apply(doc)

        def replicas() -> int:
            d = plane.get("apps/v1", "Deployment", DEPLOYMENT, NS) or {}
            return int((d.get("spec") or {}).get("replicas") or 0)

        def fuse_alerts() -> None:
            res.firing_fuse += _query(prom_url, 'ALERTS{fuse_action!=""}')

        def load() -> float:
            got = _query(prom_url, f'fusebox:scaling_load:ratio{{workload="{WORKLOAD}"}}')
            return float(got[0]["value"][1]) if got else float("nan")

        def why() -> str:
            hpa = plane.get("autoscaling/v2", "HorizontalPodAutoscaler", f"keda-hpa-{WORKLOAD}", NS) or {}
            return (f"replicas {replicas()}, load {load()}, HPA status {hpa.get('status')}\n--- keda-operator\n"
                    f"{plane.keda_operator.tail(2000) if plane.keda_operator else ''}\n--- kube-controller-manager\n"
                    f"{plane.controller_manager.tail(2000) if plane.controller_manager else ''}")

        def alive() -> None:
            plane.check()
            prom.check()
            fuse_alerts()

        wait_until(lambda: _query(prom_url, "up") != [], 60, "Prometheus' first scrape", alive=alive)
        rules = httpx.get(prom_url + "/api/v1/rules", params={"type": "alert"}, timeout=10).json()["data"]["groups"]
        res.fuse_rules = [r for g in rules for r in g["rules"] if r["labels"].get("fuse_action")]
        wait_until(lambda: plane.get("autoscaling/v2", "HorizontalPodAutoscaler", f"keda-hpa-{WORKLOAD}", NS),
                   60, "KEDA's HPA for the ScaledObject", alive=alive, why=why)
        for name, n in PHASES:
            engines.set(n)
            t0 = time.monotonic()
            want = expected_replicas(n)
            wait_until(lambda want=want, n=n: replicas() == want and load() == pytest.approx(n * 0.75, rel=0.01),
                       120, f"{name}: {n} engines, spec.replicas {want}", step=0.5, alive=alive, why=why)
            res.seconds[name] = time.monotonic() - t0
            res.replicas[name] = replicas()
            res.load[name] = load()
            if name == "peak":
                res.hpa = plane.get("autoscaling/v2", "HorizontalPodAutoscaler", f"keda-hpa-{WORKLOAD}", NS) or {}
                res.deployment = plane.get("apps/v1", "Deployment", DEPLOYMENT, NS) or {}
                ext = res.hpa["spec"]["metrics"][0]["external"]["metric"]
                sel = ",".join(f"{k}={v}" for k, v in ext["selector"]["matchLabels"].items())
                res.external = plane.external_metric(NS, ext["name"], sel)
    return res


def test_the_scaled_object_is_accepted_with_kedas_crds(run):
    assert run.applied["kind"] == "ScaledObject"
    assert run.applied["spec"]["triggers"][0]["metricType"] == "AverageValue"


def test_replicas_follow_the_load_to_the_counts_worked_out_by_hand(run):
    assert run.replicas == {"start": 1, "rise": 4, "peak": 5, "fall": 1}, (run.replicas, run.seconds)
    assert run.load == pytest.approx({"start": 0.75, "rise": 3.75, "peak": 6.75, "fall": 0.75}, rel=0.01)


def test_the_hpa_controller_set_the_replicas(run):
    scale = [m for m in run.deployment["metadata"]["managedFields"] if m.get("subresource") == "scale"]
    assert {m["manager"] for m in scale} == {"kube-controller-manager"}, run.deployment["metadata"]["managedFields"]
    assert run.hpa["status"]["desiredReplicas"] == 5
    assert run.hpa["spec"]["maxReplicas"] == 5 and run.hpa["spec"]["minReplicas"] == 1
    status_writers = {m["manager"] for m in run.hpa["metadata"]["managedFields"] if m.get("subresource") == "status"}
    assert "kube-controller-manager" in status_writers


def test_the_hpa_read_the_load_through_the_aggregator_from_keda(run):
    """At the peak: the external metric KEDA's adapter serves is the record's 6.75 (1 % for the
    scrapes' timing: Prometheus stamps a sample with the scrape's start, the bytes are read a moment
    later); the HPA KEDA made reads that metric with the trigger's target, AverageValue 1."""
    assert [_quantity(i["value"]) for i in run.external["items"]] == [pytest.approx(6.75, rel=0.01)], run.external
    (metric,) = run.hpa["spec"]["metrics"]
    assert metric["type"] == "External" and metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    assert metric["external"]["metric"]["name"] == run.external["items"][0]["metricName"]


def test_no_fuse_tier_fired(run):
    """Prometheus ran every fuse tier's alert of the generated rules (KV growth's critical among
    them) the whole time; none went pending or firing."""
    names = {r["name"] for r in run.fuse_rules}
    assert "KVCacheGrowthRateHigh" in names and len(run.fuse_rules) >= 5, names
    assert run.firing_fuse == []
