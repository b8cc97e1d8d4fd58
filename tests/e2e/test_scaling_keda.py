"""Scale first, fuse last: a load the test controls raises the engine Deployment's ``spec.replicas``
through the REAL scaling path, before any fuse tier fires, and lowers it again.

**Real here** (tests/_scaling_support.py): etcd and kube-apiserver v1.37.2 with its aggregator;
kube-controller-manager v1.37.2 (its HPA, deployment, replicaset and serviceaccount controllers,
with the HPA sync period the spec's ``scaling.hpa.sync_period`` states: 1 s); KEDA v2.21.0's
operator and metrics API server (the APIService ``v1beta1.external.metrics.k8s.io``) with KEDA's own
CRDs; Debian's Prometheus running the rules ``fusebox generate`` writes (every fuse tier's alert and
the ``fusebox:scaling_load:ratio`` record) for the shipped spec at the demo's 1 s intervals with the
test's ``scaling:`` section; the generated ``k8s/scaling.yml`` ScaledObject, applied as
``kubectl apply --server-side`` sends it. Also applied (dry run, strict validation): the ScaledObject
the shipped spec generates and the HPA its KEDA-less variant generates.

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

The fall takes about a minute: the record's ``deriv(...[1m])`` keeps a series that left for as long
as it has samples in its window (a range vector does not end at a staleness marker), then the 5 s
stabilization. One run takes 80 to 90 s on 2 shared cores (about 30 s of it the control plane,
KEDA and the first HPA sync).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import yaml
from _kube_support import wait_until
from _scaling_support import HPA_SYNC_PERIOD_S, KVEngines, ScalingStack, generate, prom_query, scaling_section, spec_with_scaling, yaml_docs
from _support import SPEC

from fusebox.demo.spec import Timing

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


@dataclass
class Run:
    replicas: dict[str, int] = field(default_factory=dict)  # phase -> the Deployment's spec.replicas reached
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> load change to that count
    load: dict[str, float] = field(default_factory=dict)  # phase -> fusebox:scaling_load:ratio then
    firing_fuse: list[dict[str, Any]] = field(default_factory=list)  # fuse-tier alerts seen pending/firing
    hpa: dict[str, Any] = field(default_factory=dict)
    deployment: dict[str, Any] = field(default_factory=dict)
    applied: dict[str, Any] = field(default_factory=dict)  # the generated ScaledObject as the API server stored it
    generated: dict[str, Any] = field(default_factory=dict)  # as `fusebox generate` wrote it
    shipped_docs: list[dict[str, Any]] = field(default_factory=list)  # the shipped spec's ScaledObjects and HPAs
    accepted: list[dict[str, Any]] = field(default_factory=list)  # each, as the API server would store it (dry run)
    external: dict[str, Any] = field(default_factory=dict)
    fuse_rules: list[dict[str, Any]] = field(default_factory=list)  # the loaded alerting rules with a fuse_action


def _spec_text() -> str:
    """The shipped spec at the demo's 1 s intervals with the test's ``scaling:`` section."""
    return spec_with_scaling(scaling_section(WORKLOAD, DEPLOYMENT, NS, MODEL, (MIN_REPLICAS, MAX_REPLICAS),
                                             HPA_SYNC_PERIOD_S, SCALE_DOWN_STABILIZATION_S, MON), TIMING)


def _hpa_variant(text: str) -> str:
    """``text`` with KEDA off and plain HPAs on (the clusters without KEDA)."""
    data = yaml.safe_load(text)
    data["scaling"]["keda"] = {**data["scaling"].get("keda", {}), "enabled": False}
    data["scaling"]["hpa"] = {**data["scaling"].get("hpa", {}), "enabled": True}
    return yaml.safe_dump(data, sort_keys=False, width=120)


def _kept(sent: Any, got: Any) -> bool:
    """Every field of ``sent`` is in ``got`` with its value (the server only adds defaults)."""
    if isinstance(sent, dict):
        return isinstance(got, dict) and all(k in got and _kept(v, got[k]) for k, v in sent.items())
    if isinstance(sent, list):
        return isinstance(got, list) and len(sent) == len(got) and all(map(_kept, sent, got))
    return bool(sent == got)


def _quantity(text: str) -> float:
    """A Kubernetes quantity as the metrics API writes one ("6748m", "6.748")."""
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


@pytest.fixture(scope="module")
def run(tmp_path_factory, generated) -> Run:
    root = tmp_path_factory.mktemp("scaling")
    res = Run()
    spec = generate(_spec_text(), root)
    (scaled_object,) = yaml_docs(root / "gen" / "k8s" / "scaling.yml")
    res.generated = scaled_object
    # every ScaledObject and HPA generated from the shipped spec and from its HPA variant
    generate(_hpa_variant(SPEC.read_text()), root / "hpa-variant")
    res.shipped_docs = yaml_docs(generated / "k8s" / "scaling.yml") + yaml_docs(root / "hpa-variant" / "gen" / "k8s" / "scaling.yml")
    engines = KVEngines(NS, DEPLOYMENT, MODEL, PER_ENGINE_BPS)
    engines.set(PHASES[0][1])
    # the HPA sync period the spec states (what `fusebox budget` adds) is the one the controller runs
    st = ScalingStack(root, root / "gen" / "rules" / "fusebox.rules.yml", engines,
                      hpa_sync_period_s=spec.scaling.sync_period_s, prometheus_namespace=MON)
    try:
        res.applied = st.start(scaled_object)
        plane, prom_url = st.plane, st.prom_url
        res.accepted = [plane.apply(d, dry_run=True) for d in res.shipped_docs]

        def alive() -> None:
            st.check()
            res.firing_fuse += prom_query(prom_url, 'ALERTS{fuse_action!=""}')

        rules = httpx.get(prom_url + "/api/v1/rules", params={"type": "alert"}, timeout=10).json()["data"]["groups"]
        res.fuse_rules = [r for g in rules for r in g["rules"] if r["labels"].get("fuse_action")]
        for name, n in PHASES:
            engines.set(n)
            t0 = time.monotonic()
            want = expected_replicas(n)
            wait_until(lambda want=want, n=n: st.replicas() == want and st.load(WORKLOAD) == pytest.approx(n * 0.75, rel=0.01),
                       120, f"{name}: {n} engines, spec.replicas {want}", step=0.5, alive=alive, why=st.why)
            res.seconds[name] = time.monotonic() - t0
            res.replicas[name] = st.replicas()
            res.load[name] = st.load(WORKLOAD)
            if name == "peak":
                res.hpa = plane.get("autoscaling/v2", "HorizontalPodAutoscaler", f"keda-hpa-{WORKLOAD}", NS) or {}
                res.deployment = plane.get("apps/v1", "Deployment", DEPLOYMENT, NS) or {}
                ext = res.hpa["spec"]["metrics"][0]["external"]["metric"]
                sel = ",".join(f"{k}={v}" for k, v in ext["selector"]["matchLabels"].items())
                res.external = plane.external_metric(NS, ext["name"], sel)
    finally:
        st.close()
        engines.stop()
    return res


def test_every_generated_scaled_object_and_hpa_is_accepted_by_the_api_server(run):
    """The shipped spec's ScaledObject (two triggers: the load and the COST-QoS choice) with KEDA's
    CRDs installed, and its HPA variant's HPA (autoscaling/v2), server-side applied with strict
    field validation (dry run): accepted, nothing dropped."""
    kinds = [d["kind"] for d in run.shipped_docs]
    assert kinds == ["ScaledObject", "HorizontalPodAutoscaler"], kinds
    for sent, got in zip(run.shipped_docs, run.accepted, strict=True):
        assert got["kind"] == sent["kind"] and got["metadata"]["name"] == sent["metadata"]["name"]
        assert _kept(sent["spec"], got["spec"]), (sent["spec"], got["spec"])
    so = run.shipped_docs[0]["spec"]
    assert [t["metadata"]["query"] for t in so["triggers"]] == [
        'fusebox:scaling_load:ratio{workload="llava-7b"}', 'max(fusebox_costqos_desired_replicas{namespace="inference",policy="llava-7b"})']


def test_the_test_specs_scaled_object_is_the_contracts(run):
    """What the test applied is what `fusebox generate` wrote for its spec: KV growth's record,
    threshold 1 per replica (AverageValue), 1 to 5 replicas, the 5 s scale-down stabilization."""
    spec = run.generated["spec"]
    assert spec["minReplicaCount"] == 1 and spec["maxReplicaCount"] == 5
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": DEPLOYMENT}
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["query"] == f'fusebox:scaling_load:ratio{{workload="{WORKLOAD}"}}'
    assert trigger["metadata"]["threshold"] == "1"
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"] == {
        "stabilizationWindowSeconds": SCALE_DOWN_STABILIZATION_S}
    assert run.applied["spec"]["triggers"][0]["metadata"]["query"] == trigger["metadata"]["query"]


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
