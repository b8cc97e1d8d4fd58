"""A GPU-level trip takes exactly the workers on that GPU out of the REAL SGLang Model Gateway's
rotation, resolved from trusted series only: dcgm-exporter's pod attribution and kube-state-metrics'
pod IPs, scraped by a REAL Prometheus from a tiny exposition server on loopback, joined with the
gateway's own worker list. ``/state`` tells applied from refused; ``fusebox_fuse_unapplied_levels``
counts what no adapter applied.

The engines listen on distinct loopback addresses (127.0.0.2...), which stand for their pod IPs.
"""

from __future__ import annotations

import httpx
import pytest
from _dashboards_support import prometheus, query, serve_text
from _fuse_support import GW_TOKEN, SPEC, TOKEN, LiveService, alert, payload, wait_for
from _gateways import SMG, StandInEngine, sglang_gateway, sglang_workers, vllm_router, vllm_workers
from _support import yaml_text
from test_fuse_adapters import write_spec

from fusebox.fuse.adapters import build_adapters
from fusebox.fuse.control import ControlCall
from fusebox.spec import load_spec

CLUSTER, NODE = "prod-a", "gpu-node-1"
GPU_A = "GPU-0a0a0a0a-0000-4000-8000-00000000000a"  # engine-a and engine-c share it
GPU_B = "GPU-0b0b0b0b-0000-4000-8000-00000000000b"  # engine-b
GPU_IDLE = "GPU-0c0c0c0c-0000-4000-8000-00000000000c"  # no pod on it
PODS = {"engine-a": ("127.0.0.2", GPU_A), "engine-b": ("127.0.0.3", GPU_B), "engine-c": ("127.0.0.4", GPU_A)}


def exposition() -> bytes:
    """What dcgm-exporter 4.5 (Kubernetes pod mapping on: pod, namespace, container) and
    kube-state-metrics publish for these pods; the idle GPU has no pod labels."""
    lines = ["# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).", "# TYPE DCGM_FI_DEV_FB_USED gauge"]
    for i, (pod, (_ip, gpu)) in enumerate(PODS.items()):
        lines.append(f'DCGM_FI_DEV_FB_USED{{gpu="{i}",UUID="{gpu}",pci_bus_id="00000000:0{i}:00.0",device="nvidia{i}",'
                     f'modelName="NVIDIA H100 80GB HBM3",Hostname="{NODE}",container="engine",namespace="llm",'
                     f'pod="{pod}"}} 40000')
    lines.append(f'DCGM_FI_DEV_FB_USED{{gpu="3",UUID="{GPU_IDLE}",pci_bus_id="00000000:03:00.0",device="nvidia3",'
                 f'modelName="NVIDIA H100 80GB HBM3",Hostname="{NODE}"}} 0')
    lines += ["# HELP kube_pod_info Information about pod.", "# TYPE kube_pod_info gauge"]
    for pod, (ip, _gpu) in PODS.items():
        lines.append(f'kube_pod_info{{namespace="llm",pod="{pod}",uid="u-{pod}",host_ip="10.0.0.1",pod_ip="{ip}",'
                     f'node="{NODE}",created_by_kind="StatefulSet",created_by_name="engine",priority_class="",'
                     'host_network="false"} 1')
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def cluster(tmp_path):
    """(Prometheus URL, {pod: engine}, the SGLang gateway) with the attribution series scraped."""
    engines = {pod: StandInEngine(ip) for pod, (ip, _gpu) in PODS.items()}
    exporter = serve_text(exposition())
    gw = None
    try:
        config = {"global": {"scrape_interval": "1s"},
                  "scrape_configs": [{"job_name": "dcgm", "honor_labels": True,
                                      "static_configs": [{"targets": [f"127.0.0.1:{exporter.server_address[1]}"]}]}]}
        with prometheus(tmp_path, config) as prom:
            wait_for(lambda: len(query(prom, "kube_pod_info")) == len(PODS), 30, what="the attribution scraped")
            gw = sglang_gateway([e.url for e in engines.values()], tmp_path / "sglang.log")
            yield prom, engines, gw
    finally:
        if gw:
            gw.stop()
        exporter.shutdown()
        for e in engines.values():
            e.stop()


def adapters(prom: str, gw) -> dict:
    return {"sglang": {"kind": "sglang_gateway", "url": gw.url, "actions": ["freeze_admissions"], "timeout": "2s",
                       "discover": {"prometheus": prom, "ttl": "30s"}}}


def gpu(hw_id: str) -> dict:
    return {"cluster": CLUSTER, "host_name": NODE, "hw_id": hw_id}


def level(svc: LiveService, scope: dict, lvl: str) -> dict:
    from fusebox.fuse.rules import scope_key

    key = scope_key(scope)
    (sc,) = [s for s in svc.state()["scopes"] if s["key"] == key]
    return sc["levels"][lvl]


def metric(svc: LiveService, name: str) -> float:
    text = httpx.get(svc.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).text
    (line,) = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(line.split()[1])


def test_a_gpu_trip_takes_out_exactly_the_workers_on_that_gpu_and_state_tells_applied_from_refused(cluster, tmp_path):
    prom, engines, gw = cluster
    on_a = {engines["engine-a"].url, engines["engine-c"].url}
    everyone = {e.url for e in engines.values()}
    spec = load_spec(write_spec(tmp_path, adapters(prom, gw)))
    with LiveService(tmp_path / "fuse.sqlite", adapters=build_adapters(spec.adapters), hold_s=0.3) as svc:
        assert svc.post(payload(alert("GPUMemoryUtilizationHigh", starts=1_700_000_000, **gpu(GPU_A)))).status_code == 200
        wait_for(lambda: set(sglang_workers(gw.url)) == everyone - on_a, 15, what="the workers on GPU A out")
        st = wait_for(lambda: (s := level(svc, gpu(GPU_A), "1"))["applied"] and s, 10, what="applied in /state")
        assert (st["applied_by"], st["pending"], st["not_applied"]) == (["sglang"], [], [])

        # a GPU with no pod on it: refused, nothing sent, and /state says so
        assert svc.post(payload(alert("GPUMemoryUtilizationHigh", starts=1_700_000_000, **gpu(GPU_IDLE)))).status_code == 200
        st = wait_for(lambda: (s := level(svc, gpu(GPU_IDLE), "1"))["not_applied"] and s, 10, what="the refusal")
        assert st["tripped"] and st["applied"] is False and st["applied_by"] == []
        assert st["not_applied"][0]["adapter"] == "sglang" and "not attributed to any pod" in st["not_applied"][0]["why"]
        # a level no adapter applies (sglang_gateway applies freeze_admissions only here)
        engine = {"cluster": CLUSTER, "engine": "engine-b"}
        assert svc.post(payload(alert("AlignmentLatencyP95High", starts=1_700_000_000, **engine))).status_code == 200
        st = wait_for(lambda: level(svc, engine, "2"), 10, what="level 2 tripped")
        assert st["applied"] is False and st["not_applied"] == [
            {"adapter": None, "why": "no adapter applies level 2 (text_only_fallback)"}]
        assert metric(svc, "fusebox_fuse_unapplied_levels") == 2
        assert set(sglang_workers(gw.url)) == everyone - on_a  # nothing else moved

        # GPU A recovers: exactly its workers come back
        assert svc.post(payload(alert("GPUMemoryUtilizationHigh", "resolved", starts=1_700_000_000,
                                      **gpu(GPU_A)))).status_code == 200
        wait_for(lambda: set(sglang_workers(gw.url)) == everyone, 15, what="the workers on GPU A back")


def test_a_gpu_trip_takes_the_workers_on_that_gpu_out_of_the_real_vllm_router(cluster, tmp_path):
    """The same join through the vLLM router (GET /list_workers, POST /remove_worker, /add_worker):
    GPU A's two engines leave its list, engine-b stays; the release puts exactly them back."""
    prom, engines, _gw = cluster
    on_a = {engines["engine-a"].url, engines["engine-c"].url}
    everyone = {e.url for e in engines.values()}
    router = vllm_router(sorted(everyone), tmp_path / "vllm-router.log")
    try:
        spec = load_spec(write_spec(tmp_path, {"router": {
            "kind": "vllm_router", "url": router.url, "actions": ["freeze_admissions"], "timeout": "2s",
            "discover": {"prometheus": prom, "ttl": "30s"}}}))
        with LiveService(tmp_path / "fuse.sqlite", adapters=build_adapters(spec.adapters), hold_s=0.3) as svc:
            assert svc.post(payload(alert("GPUMemoryUtilizationHigh", starts=1_700_000_000,
                                          **gpu(GPU_A)))).status_code == 200
            wait_for(lambda: set(vllm_workers(router.url)) == everyone - on_a, 15, what="the workers on GPU A out")
            st = wait_for(lambda: (s := level(svc, gpu(GPU_A), "1"))["applied"] and s, 10, what="applied in /state")
            assert (st["applied_by"], st["pending"], st["not_applied"]) == (["router"], [], [])
            assert svc.post(payload(alert("GPUMemoryUtilizationHigh", "resolved", starts=1_700_000_000,
                                          **gpu(GPU_A)))).status_code == 200
            wait_for(lambda: set(vllm_workers(router.url)) == everyone, 15, what="the workers on GPU A back")
    finally:
        router.stop()


def test_the_resolution_is_cached_for_its_ttl_and_a_dead_prometheus_is_a_retryable_refusal(cluster):
    from fusebox.fuse.adapters.discovery import GpuWorkers, ResolveError
    from fusebox.spec.adapters import Discover

    prom, engines, gw = cluster
    now = [0.0]
    d = GpuWorkers(Discover(prom, 30.0, "DCGM_FI_DEV_FB_USED", "UUID", "pod", "namespace"), clock=lambda: now[0])
    listed = list(sglang_workers(gw.url))
    assert d.workers(gpu(GPU_B), listed) == [engines["engine-b"].url]
    assert d.workers(gpu(GPU_A), listed) == sorted([engines["engine-a"].url, engines["engine-c"].url])
    assert d.queries == 3  # one refresh: the attribution, the pod IPs, the pods that ended
    now[0] = 31.0
    assert d.workers({**gpu(GPU_B), "cluster": "other"}, listed) == [engines["engine-b"].url]  # no cluster label: any
    assert d.queries == 6
    with pytest.raises(ResolveError) as e:
        d.workers(gpu(GPU_A), [engines["engine-b"].url])  # the gateway does not list them
    assert e.value.permanent and "no gateway worker" in e.value.summary
    dead = GpuWorkers(Discover("http://127.0.0.1:1", 30.0, "DCGM_FI_DEV_FB_USED", "UUID", "pod", "namespace"))
    with pytest.raises(ResolveError) as e:
        dead.workers(gpu(GPU_A), listed)
    assert not e.value.permanent and "Prometheus" in e.value.summary


def test_mig_instances_of_one_gpu_resolve_to_their_own_pods(tmp_path):
    """dcgm-exporter on MIG writes the parent GPU's UUID on every instance and the instance in
    GPU_I_ID; the rules' hw_id is UUID/GPU_I_ID, so instance 1's trip takes out instance 1's pod only.
    Scraped as the GPU Operator's ServiceMonitor does by default (no honorLabels, the exporter's
    own namespace and pod as target labels): the pods are read from exported_*, and the idle
    instance 3 is attributed to nobody, not to dcgm-exporter's own pod."""
    from fusebox.fuse.adapters.discovery import GpuWorkers, ResolveError
    from fusebox.spec.adapters import Discover, RawAttribution

    parent = "GPU-0d0d0d0d-0000-4000-8000-00000000000d"
    pods = {"mig-one": ("127.0.0.5", "1"), "mig-two": ("127.0.0.6", "2")}
    lines = ["# TYPE DCGM_FI_DEV_FB_USED gauge"]
    lines += [f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{parent}",GPU_I_ID="{gi}",GPU_I_PROFILE="3g.40gb",device="nvidia0",'
              f'Hostname="{NODE}",container="engine",namespace="llm",pod="{pod}"}} 20000' for pod, (_ip, gi) in pods.items()]
    lines += [f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{parent}",GPU_I_ID="3",GPU_I_PROFILE="1g.10gb",device="nvidia0",'
              f'Hostname="{NODE}"}} 0']
    lines += ["# TYPE kube_pod_info gauge"]
    lines += [f'kube_pod_info{{namespace="llm",pod="{pod}",pod_ip="{ip}",node="{NODE}"}} 1' for pod, (ip, _gi) in pods.items()]
    exporter = serve_text(("\n".join(lines) + "\n").encode())
    try:
        target = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-q8z"}
        config = {"global": {"scrape_interval": "1s"},
                  "scrape_configs": [{"job_name": "dcgm", "honor_labels": False,
                                      "static_configs": [{"targets": [f"127.0.0.1:{exporter.server_address[1]}"],
                                                          "labels": target}]}]}
        with prometheus(tmp_path, config) as prom:
            wait_for(lambda: len(query(prom, "kube_pod_info{exported_pod=~'mig-.+'}")) == 2
                     and len(query(prom, "DCGM_FI_DEV_FB_USED")) == 3, 30, what="the attribution scraped")
            a = RawAttribution()  # the defaults: exported_pod, exported_namespace
            d = GpuWorkers(Discover(prom, 30.0, a.metric, a.gpu, a.pod, a.namespace))
            listed = ["http://127.0.0.5:8000", "http://127.0.0.6:8000"]
            assert d.workers(gpu(f"{parent}/1"), listed) == ["http://127.0.0.5:8000"]
            assert d.workers(gpu(f"{parent}/2"), listed) == ["http://127.0.0.6:8000"]
            with pytest.raises(ResolveError) as e:
                d.workers(gpu(f"{parent}/3"), listed)
            assert e.value.summary == "GPU not attributed to any pod: refused"
    finally:
        exporter.shutdown()


# Two engine pods of one model (the collectors name engines <namespace>/<pod>) and, once the test
# says so, a hostNetwork pod on engine-y's IP (node-exporter holds the node's IP as hostNetwork engines do).
ENGINE_PODS = {"engine-x": "127.0.0.5", "engine-y": "127.0.0.6"}
KSM_TARGET = {"namespace": "monitoring", "pod": "kps-kube-state-metrics-6c8d9-x2x"}  # kube-state-metrics' own pod


def pod_info(shared: bool) -> bytes:
    """kube-state-metrics 2.x's kube_pod_info and kube_pod_status_phase for the engine pods, a Job's
    pod that Succeeded with the IP engine-x has now, and, when ``shared``, a hostNetwork
    node-exporter pod on engine-y's IP."""
    pods = [("llm", pod, ip, "false", "Running") for pod, ip in ENGINE_PODS.items()]
    pods.append(("batch", "report-28391-abc", ENGINE_PODS["engine-x"], "false", "Succeeded"))
    if shared:
        pods.append(("monitoring", "node-exporter-n1", ENGINE_PODS["engine-y"], "true", "Running"))
    lines = ["# HELP kube_pod_info Information about pod.", "# TYPE kube_pod_info gauge"]
    lines += [f'kube_pod_info{{namespace="{ns}",pod="{pod}",uid="u-{pod}",host_ip="10.0.0.1",pod_ip="{ip}",node="{NODE}",'
              f'created_by_kind="ReplicaSet",created_by_name="{pod[:-2]}",priority_class="",host_network="{hn}"}} 1'
              for ns, pod, ip, hn, _phase in pods]
    lines += ["# HELP kube_pod_status_phase The pods current phase.", "# TYPE kube_pod_status_phase gauge"]
    lines += [f'kube_pod_status_phase{{namespace="{ns}",pod="{pod}",uid="u-{pod}",phase="{p}"}} {int(p == phase)}'
              for ns, pod, _ip, _hn, phase in pods for p in ("Pending", "Running", "Succeeded", "Failed", "Unknown")]
    return ("\n".join(lines) + "\n").encode()


def kv_bytes() -> bytes:
    """The fusebox KV collector's bytes per engine pod (the series an engine-level KV alert is scoped by)."""
    lines = ["# TYPE fusebox_kv_cache_usage_bytes gauge"]
    lines += [f'fusebox_kv_cache_usage_bytes{{cluster="{CLUSTER}",host_name="{NODE}",engine="llm/{pod}",'
              f'model="llava-1.5-7b"}} {2 ** 30 * (i + 1)}' for i, pod in enumerate(ENGINE_PODS)]
    return ("\n".join(lines) + "\n").encode()


def test_an_engine_level_critical_takes_exactly_its_pods_worker_out_of_smg_and_an_ambiguous_ip_nothing(tmp_path):
    """kube_pod_info scraped as a ServiceMonitor without honorLabels does it (the pods' labels
    renamed exported_*, namespace/pod kube-state-metrics' own), the KV bytes with them; smg 1.13 in
    front of engines on 127.0.0.5 and 127.0.0.6 (their pod IPs). The engine-level KV critical on
    llm/engine-x takes exactly 127.0.0.5's worker out (a finished Job's pod that had that IP
    before holds it no more). Then a hostNetwork pod appears on
    engine-y's IP: engine-y's critical takes nothing out and /state says why; a second adapter
    whose gateway's name does not resolve stays pending, and /state says why too."""
    shared = [False]
    engines = {pod: StandInEngine(ip) for pod, ip in ENGINE_PODS.items()}
    ksm, kv = serve_text(lambda: pod_info(shared[0])), serve_text(kv_bytes())
    gw = None
    try:
        config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [
            {"job_name": "kube-state-metrics", "honor_labels": False,
             "static_configs": [{"targets": [f"127.0.0.1:{ksm.server_address[1]}"], "labels": KSM_TARGET}]},
            {"job_name": "fusebox-kv", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{kv.server_address[1]}"]}]}]}
        with prometheus(tmp_path, config) as prom:
            wait_for(lambda: len(query(prom, "kube_pod_info{exported_pod=~'engine-.|report-.+'}")) == 3
                     and len(query(prom, "fusebox_kv_cache_usage_bytes")) == 2, 30, what="kube_pod_info and KV scraped")
            gw = sglang_gateway([e.url for e in engines.values()], tmp_path / "smg.log", package=SMG)
            everyone = {e.url for e in engines.values()}
            scopes = {s["metric"]["engine"]: {k: s["metric"][k] for k in ("cluster", "host_name", "engine", "model")}
                      for s in query(prom, "fusebox_kv_cache_usage_bytes")}
            spec = load_spec(write_spec(tmp_path, {
                "sglang": {"kind": "sglang_gateway", "url": gw.url, "actions": ["kv_cache_eviction"], "timeout": "2s",
                           "discover": {"prometheus": prom, "ttl": "1s"}},
                "elsewhere": {"kind": "sglang_gateway", "url": "http://fusebox-gateway.invalid:30000",
                              "actions": ["kv_cache_eviction"], "timeout": "2s", "discover": {"prometheus": prom}}}))
            with LiveService(tmp_path / "fuse.sqlite", adapters=build_adapters(spec.adapters), hold_s=0.3) as svc:
                x, y = scopes["llm/engine-x"], scopes["llm/engine-y"]
                assert svc.post(payload(alert("KVCacheGrowthRateHigh", **x))).status_code == 200
                wait_for(lambda: set(sglang_workers(gw.url)) == everyone - {engines["engine-x"].url}, 15,
                         what="engine-x's worker out")
                st = wait_for(lambda: (s := level(svc, x, "3"))["applied"] and s["not_applied"] and s, 15,
                              what="applied in /state, and why the other adapter is pending")
                assert (st["applied_by"], st["pending"]) == (["sglang"], ["elsewhere"])
                (why,) = st["not_applied"]
                assert why["adapter"] == "elsewhere" and why["why"].startswith("retrying: ConnectError"), why

                shared[0] = True
                wait_for(lambda: len(query(prom, "kube_pod_info{exported_pod='node-exporter-n1'}")) == 1, 30,
                         what="the hostNetwork pod scraped")
                assert svc.post(payload(alert("KVCacheGrowthRateHigh", **y))).status_code == 200
                st = wait_for(lambda: (s := level(svc, y, "3"))["not_applied"] and s["pending"] == ["elsewhere"] and s, 15,
                              what="the refusal")
                assert st["applied"] is False and st["applied_by"] == []
                (refused,) = [n["why"] for n in st["not_applied"] if n["adapter"] == "sglang"]
                assert refused == "refused: IP of the engine is shared by 2 pods: ambiguous, refused", st["not_applied"]
                assert set(sglang_workers(gw.url)) == everyone - {engines["engine-x"].url}  # nothing else moved
    finally:
        if gw:
            gw.stop()
        ksm.shutdown()
        kv.shutdown()
        for e in engines.values():
            e.stop()


def _sglang(**extra) -> dict:
    return {"sglang": {"kind": "sglang_gateway", "url": "http://127.0.0.1:30000", "actions": ["freeze_admissions"],
                       "targets": [{"match": {"engine": "engine-0"}, "worker_url": "http://10.0.0.5:30001"}], **extra}}


def test_generate_warns_of_levels_no_adapter_applies_and_gpu_scopes_no_target_can_match(tmp_path):
    from fusebox.generator.outputs import adapter_warnings

    warnings = adapter_warnings(load_spec(write_spec(tmp_path, _sglang())))
    # the spec's tiers request levels 1, 2, 3; this adapter lists level 1 only
    unapplied = sorted(w.split("'")[1] for w in warnings if w.startswith("fuse action"))
    assert unapplied == ["kv_cache_eviction", "text_only_fallback"]
    # the three GPU-level signals with freeze_admissions (GPU memory, its time to full, memory
    # bandwidth): scoped by {cluster, host_name, hw_id}, the targets match engine
    scoped = [w for w in warnings if w.startswith("fuse.adapters.sglang")]
    assert sorted(w.split("'")[1] for w in scoped) == ["gpu_memory_time_to_full", "gpu_memory_utilization",
                                                        "memory_bandwidth_saturation"]
    assert all("{cluster, host_name, hw_id}" in w and "add discover:" in w for w in scoped)
    discovered = adapter_warnings(load_spec(write_spec(tmp_path, _sglang(discover={"prometheus": "http://p:9090"}))))
    assert not [w for w in discovered if w.startswith("fuse.adapters.sglang")]


@pytest.mark.parametrize("attribution, selector, warned", [
    ({"pod": "pod", "namespace": "namespace"}, {"namespace": "gpu-operator"}, True),  # the contradiction
    ({}, {"namespace": "gpu-operator"}, False),  # the defaults (exported_*) agree with the GPU Operator's scrape
    ({"pod": "pod", "namespace": "namespace"}, {"job": "nvidia-dcgm-exporter"}, False),
])
def test_generate_warns_when_the_dcgm_selector_hides_the_gpus_the_attribution_reads(tmp_path, attribution, selector, warned):
    import yaml

    from fusebox.generator.outputs import adapter_warnings

    p = write_spec(tmp_path, {"sglang": {"kind": "sglang_gateway", "url": "http://127.0.0.1:30000",
                                         "actions": ["freeze_admissions"],
                                         "discover": {"prometheus": "http://p:9090", "attribution": attribution}}})
    data = yaml.safe_load(p.read_text())
    data["global"].update({"source": "dcgm", "selectors": {"dcgm": selector}})
    p.write_text(yaml_text(data, sort_keys=False))
    found = [w for w in adapter_warnings(load_spec(p)) if w.startswith("global.selectors.dcgm")]
    assert bool(found) == warned, found
    if warned:
        assert "fuse.adapters.sglang.discover.attribution reads each GPU's pod from namespace" in found[0]
        assert "hides exactly the busy GPUs" in found[0]


@pytest.mark.parametrize("discover, where, what", [
    ({"prometheus": "p:9090"}, "prometheus", "prometheus must be an http(s) URL"),
    ({"prometheus": "http://p:9090", "ttl": "0s"}, "ttl", "ttl must be between 1s and 600s"),
    ({"prometheus": "http://p:9090", "ttl": "1h"}, "ttl", "ttl must be between 1s and 600s"),
    ({"prometheus": "http://p:9090", "attribution": {"pod": "exported-pod"}}, "pod", "is not a Prometheus label name"),
])
def test_a_bad_discover_is_a_spec_error_at_its_line(tmp_path, discover, where, what):
    from fusebox.spec.errors import SpecError

    p = write_spec(tmp_path, _sglang(discover=discover))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    lines = p.read_text().splitlines()
    msg = str(e.value)
    line = int(msg.split(":")[1])
    assert what in msg and lines[line - 1].strip().startswith(where + ":"), (msg, lines[line - 1])


def test_discover_is_refused_on_an_adapter_kind_that_cannot_use_it(tmp_path):
    from fusebox.spec.errors import SpecError

    spec = {"h": {"kind": "haproxy", "socket": "/run/haproxy.sock", "actions": ["freeze_admissions"],
                  "targets": [{"match": {"engine": "e0"}, "server": "be/e0"}], "discover": {"prometheus": "http://p:9090"}}}
    with pytest.raises(SpecError) as e:
        load_spec(write_spec(tmp_path, spec))
    assert "discover is for kinds sglang_gateway, vllm_router only" in str(e.value)


@pytest.mark.parametrize("fuse", [{"args": ["--prometheus-url", "http://prom:9090"]},
                                  {"args": ["--prometheus-url=http://prom:9090"]},
                                  {"enabled": False}])
def test_no_prometheus_url_warning_where_the_deployment_has_one_or_none_is_generated(tmp_path, fuse):
    # the Deployment's args may carry --prometheus-url themselves (kubernetes.fuse.prometheus_url
    # unset); without a generated Deployment there is none to fail to start
    import yaml

    from fusebox.generator.outputs import adapter_warnings

    p = write_spec(tmp_path, _sglang(discover={}))
    data = yaml.safe_load(p.read_text())
    data.setdefault("kubernetes", {})["fuse"] = {**data["kubernetes"].get("fuse", {}), **fuse}
    p.write_text(yaml_text(data, sort_keys=False))
    assert not [w for w in adapter_warnings(load_spec(p)) if "prometheus_url" in w]


@pytest.mark.parametrize("release, url", [
    # the chart's fullname: the release when it holds the chart's name, else <release>-kube-prometheus-stack,
    # cut to 26 characters; its Prometheus Service is <fullname>-prometheus
    ("kube-prometheus-stack", "http://kube-prometheus-stack-prometheus.monitoring:9090"),
    ("kps", "http://kps-kube-prometheus-stack-prometheus.monitoring:9090"),
    ("prometheus", "http://prometheus-kube-prometheus-prometheus.monitoring:9090"),
    ("prod-monitoring", "http://prod-monitoring-kube-prome-prometheus.monitoring:9090"),
])
def test_the_prometheus_url_warning_names_kube_prometheus_stacks_service_for_the_release(tmp_path, release, url):
    import yaml

    from fusebox.generator.outputs import adapter_warnings

    p = write_spec(tmp_path, _sglang(discover={}))
    data = yaml.safe_load(p.read_text())
    data.setdefault("kubernetes", {})["labels"] = {"release": release}
    p.write_text(yaml_text(data, sort_keys=False))
    (w,) = [w for w in adapter_warnings(load_spec(p)) if "prometheus_url is not set" in w]
    assert url in w, w


def test_the_generated_fuse_deployment_carries_the_prometheus_url_discovery_reads(tmp_path):
    import yaml

    from fusebox.generator.outputs import adapter_warnings
    from fusebox.generator.render_k8s import render_fuse

    url = "http://kps-kube-prometheus-stack-prometheus.monitoring:9090"
    p = write_spec(tmp_path, _sglang(discover={}))
    assert any("kubernetes.fuse.prometheus_url is not set" in w for w in adapter_warnings(load_spec(p)))
    with pytest.raises(ValueError, match="--prometheus-url"):
        build_adapters(load_spec(p).adapters)
    data = yaml.safe_load(p.read_text())
    data.setdefault("kubernetes", {}).setdefault("fuse", {})["prometheus_url"] = url
    p.write_text(yaml_text(data, sort_keys=False))
    spec = load_spec(p)
    assert not any("prometheus_url" in w for w in adapter_warnings(spec))
    (deployment,) = [m for m in render_fuse(spec) if m["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--prometheus-url") + 1] == url
    (adapter,) = build_adapters(spec.adapters, url)
    assert adapter.discovery.spec.prometheus == url


def test_a_gpu_trip_that_only_engine_targets_could_map_is_refused_and_state_does_not_claim_it(tmp_path):
    """The issue's case: targets per engine, a GPU-level alert; the fuse refuses it, and /state and
    /metrics say the level is tripped but not applied."""
    engine = StandInEngine()
    gw = sglang_gateway([engine.url], tmp_path / "sglang.log")
    try:
        spec = load_spec(write_spec(tmp_path, {"sglang": {
            "kind": "sglang_gateway", "url": gw.url, "actions": ["freeze_admissions"], "timeout": "2s",
            "targets": [{"match": {"engine": "engine-0"}, "worker_url": engine.url}]}}))
        with LiveService(tmp_path / "fuse.sqlite", adapters=build_adapters(spec.adapters), hold_s=0.3) as svc:
            assert svc.post(payload(alert("GPUMemoryUtilizationHigh", **gpu(GPU_A)))).status_code == 200
            st = wait_for(lambda: (s := level(svc, gpu(GPU_A), "1")).get("not_applied") and s, 10, what="the refusal")
            assert st["tripped"] and st["applied"] is False and st["applied_by"] == []
            assert "scope not mapped" in st["not_applied"][0]["why"]
            assert metric(svc, "fusebox_fuse_unapplied_levels") == 1
            assert list(sglang_workers(gw.url)) == [engine.url]  # nothing was taken out
    finally:
        gw.stop()
        engine.stop()


def test_applied_survives_a_restart_and_another_replica_reads_it_from_the_store(tmp_path):
    from fusebox.demo.gateway import ReferenceGateway, read_log
    from fusebox.fuse.adapters.gateway import HttpGateway
    from fusebox.fuse.rules import FuseRules, scope_key
    from fusebox.fuse.service import FuseService
    from fusebox.fuse.store import Store

    ref = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    # a second replica on the same store, started before the trip: it learns the outcome from the store
    other = FuseService(FuseRules.from_spec(load_spec(SPEC)), Store(tmp_path / "fuse.sqlite"), [HttpGateway(ref.url)],
                        hold_s=60)
    try:
        with LiveService(tmp_path / "fuse.sqlite", ref.url, hold_s=60) as svc:
            assert svc.post(payload(alert("GPUMemoryUtilizationHigh", **gpu(GPU_A)))).status_code == 200
            wait_for(lambda: level(svc, gpu(GPU_A), "1")["applied"], 10, what="applied")
        (sc,) = [s for s in other.state()["scopes"] if s["key"] == scope_key(gpu(GPU_A))]
        assert (sc["levels"]["1"]["applied"], sc["levels"]["1"]["applied_by"]) == (True, ["gateway"])
    finally:
        other.store.close()
        ref.stop()
    assert [r["state"] for r in read_log(tmp_path / "gw.jsonl")] == ["trip"]
    again = FuseService(FuseRules.from_spec(load_spec(SPEC)), Store(tmp_path / "fuse.sqlite"),
                        [HttpGateway(ref.url, GW_TOKEN)], hold_s=60)
    try:
        (sc,) = [s for s in again.state()["scopes"] if s["key"] == scope_key(gpu(GPU_A))]
        assert (sc["levels"]["1"]["applied"], sc["levels"]["1"]["applied_by"]) == (True, ["gateway"])
        assert again.metrics.registry.get_sample_value("fusebox_fuse_unapplied_levels") == 0
    finally:
        again.store.close()


def test_a_second_level_on_a_gpu_finds_the_workers_the_first_took_out_and_each_release_waits_for_the_other(cluster, tmp_path):
    prom, engines, gw = cluster
    (adapter,) = build_adapters(load_spec(write_spec(tmp_path, {"sglang": {
        **adapters(prom, gw)["sglang"], "actions": ["freeze_admissions", "kv_cache_eviction"]}})).adapters)
    b = engines["engine-b"].url

    def call(action: str, lvl: int, state: str) -> None:
        adapter.apply(ControlCall.from_json({"action": action, "level": lvl, "state": state, "reason": "r",
                                             "scope": gpu(GPU_B), "decision_id": f"{action}-{state}"}))

    call("freeze_admissions", 1, "trip")
    wait_for(lambda: b not in sglang_workers(gw.url), 10, what="engine-b out")
    call("kv_cache_eviction", 3, "trip")  # the gateway no longer lists engine-b: the hold still finds it
    call("freeze_admissions", 1, "release")
    assert b not in sglang_workers(gw.url)  # level 3 still holds it
    call("kv_cache_eviction", 3, "release")
    wait_for(lambda: b in sglang_workers(gw.url), 10, what="engine-b back")


def test_fuse_serve_exits_2_without_a_prometheus_url_for_discover_and_takes_it_from_the_flag(tmp_path):
    import argparse
    import subprocess
    import sys
    from pathlib import Path

    from fusebox.fuse import cli

    p = write_spec(tmp_path, _sglang(discover={}))
    (tmp_path / "token").write_text(TOKEN + "\n")
    base = ["fuse", "serve", "--spec", str(p), "--state", str(tmp_path / "s.sqlite"), "--token-file", str(tmp_path / "token"),
            "--listen", "127.0.0.1:1"]
    r = subprocess.run([str(Path(sys.executable).parent / "fusebox"), *base], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "discover names no prometheus and the fuse has no --prometheus-url -- give " \
        "--prometheus-url" in r.stderr, r.stderr
    assert f"{p}:" in r.stderr, r.stderr  # at the adapter's line of the spec
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    service, _ = cli.build_service(parser.parse_args([*base, "--prometheus-url", "http://prom.monitoring:9090/"]))
    try:
        assert service.adapters["sglang_gateway:sglang"].discovery.spec.prometheus == "http://prom.monitoring:9090"
    finally:
        service.store.close()


def test_a_refusal_reads_the_same_after_a_restart(tmp_path):
    from fusebox.fuse.rules import FuseRules, scope_key
    from fusebox.fuse.service import FuseService
    from fusebox.fuse.store import Store

    spec = load_spec(write_spec(tmp_path, _sglang()))  # engine targets only: a GPU scope is refused
    with LiveService(tmp_path / "fuse.sqlite", adapters=build_adapters(spec.adapters), hold_s=60) as svc:
        assert svc.post(payload(alert("GPUMemoryUtilizationHigh", **gpu(GPU_A)))).status_code == 200
        before = wait_for(lambda: (s := level(svc, gpu(GPU_A), "1"))["not_applied"] and s, 10, what="the refusal")
    again = FuseService(FuseRules.from_spec(spec), Store(tmp_path / "fuse.sqlite"),
                        build_adapters(spec.adapters), hold_s=60)
    try:
        (sc,) = [s for s in again.state()["scopes"] if s["key"] == scope_key(gpu(GPU_A))]
        after = sc["levels"]["1"]
    finally:
        again.store.close()
    keys = ("applied", "applied_by", "pending", "not_applied")
    assert {k: after[k] for k in keys} == {k: before[k] for k in keys} == {
        "applied": False, "applied_by": [], "pending": [],
        "not_applied": [{"adapter": "sglang", "why": "refused: scope not mapped in the spec: refused"}]}
