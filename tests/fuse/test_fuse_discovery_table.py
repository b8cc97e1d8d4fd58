"""The resolution tables of ``discover`` (fuse/adapters/discovery.py) as Prometheus' query API returns their
series: pod -> IP and IP -> pod from kube_pod_info, with the labels a scrape without honorLabels
renames (``exported_*``), conflicts refused both ways, series with and without ``cluster``.

The series are written as kube-state-metrics 2.x and dcgm-exporter 4.x label them, and, where a
ServiceMonitor does not honor the exporter's labels, with the target's own ``namespace``/``pod``
(the exporter's pod) and the exporter's renamed ``exported_namespace``/``exported_pod``.
"""

from __future__ import annotations

import pytest

from fusebox.fuse.adapters.discovery import FINISHED_QUERY, GpuWorkers, ResolveError, attribution_table, engine_pod, pod_table, resolve_ips
from fusebox.fuse.dispatch.applied import AppliedLevels
from fusebox.spec.adapters import Discover, RawAttribution

KSM = {"job": "kube-state-metrics", "namespace": "monitoring", "pod": "kps-kube-state-metrics-7d9f-x2x"}
DCGM = {"job": "nvidia-dcgm-exporter", "namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-q8z"}
DEFAULTS = RawAttribution()
SPEC = Discover("http://p:9090", 30.0, DEFAULTS.metric, DEFAULTS.gpu, DEFAULTS.pod, DEFAULTS.namespace)


def info(ns: str, pod: str, ip: str, honored: bool = True, **extra) -> dict:
    """A kube_pod_info series: honored, the pod's own labels; else the scrape's target labels
    (kube-state-metrics' own pod) and the pod's renamed."""
    m = {"job": "kube-state-metrics", "namespace": ns, "pod": pod} if honored else \
        {**KSM, "exported_namespace": ns, "exported_pod": pod}
    return {"metric": {"__name__": "kube_pod_info", "pod_ip": ip, "uid": f"u-{pod}", **m, **extra}, "value": [0, "1"]}


def fb(uuid: str, ns: str | None, pod: str | None, honored: bool, **extra) -> dict:
    """A DCGM_FI_DEV_FB_USED series of GPU ``uuid`` running pod ``ns/pod`` (None: idle)."""
    m = {"job": "nvidia-dcgm-exporter", "UUID": uuid, "gpu": "0", "Hostname": "node-1", **extra}
    if honored:  # idle: the target's own namespace/pod stay (the exporter wrote none)
        m.update({"namespace": ns, "pod": pod} if pod else {"namespace": DCGM["namespace"], "pod": DCGM["pod"]})
    else:
        m.update({"namespace": DCGM["namespace"], "pod": DCGM["pod"]})
        if pod:
            m.update({"exported_namespace": ns, "exported_pod": pod})
    return {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", **m}, "value": [0, "40000"]}


@pytest.mark.parametrize("honored", [True, False])
def test_pod_ips_read_the_pods_own_labels_whether_or_not_the_scrape_honored_them(honored):
    table = pod_table([info("llm", "engine-a", "10.1.0.5", honored), info("llm", "engine-b", "10.1.0.6", honored)])
    assert table.ips == {("", "llm", "engine-a"): {"10.1.0.5"}, ("", "llm", "engine-b"): {"10.1.0.6"}}
    assert resolve_ips(table, [("", "llm", "engine-b")], "prod-a", "engine") == {"10.1.0.6"}
    # kube-state-metrics' own pod is never taken for the pods it describes
    assert ("", "monitoring", KSM["pod"]) not in table.ips


def test_without_exported_labels_the_last_series_does_not_win_a_pod_with_two_ips_is_refused():
    # two series for one pod that disagree (a stale kube-state-metrics replica, a pod re-created
    # with its name): the fuse does not pick one
    table = pod_table([info("llm", "engine-a", "10.1.0.5"), info("llm", "engine-a", "10.1.0.9", uid="u-new")])
    with pytest.raises(ResolveError) as e:
        resolve_ips(table, [("", "llm", "engine-a")], None, "engine")
    assert e.value.permanent and "2 IPs" in str(e.value) and "10.1.0.5, 10.1.0.9" in str(e.value)
    assert "ambiguous" in e.value.summary


def test_two_pods_on_one_ip_are_refused():
    # hostNetwork pods hold their node's IP: a worker at that IP could be either
    table = pod_table([info("llm", "engine-a", "10.0.0.1", host_network="true"),
                       info("monitoring", "node-exporter-abc", "10.0.0.1", host_network="true"),
                       info("llm", "engine-b", "10.1.0.6")])
    with pytest.raises(ResolveError) as e:
        resolve_ips(table, [("", "llm", "engine-a")], None, "engine")
    assert e.value.permanent and "held by 2 pods" in str(e.value) and "llm/engine-a, monitoring/node-exporter-abc" in str(e.value)
    assert resolve_ips(table, [("", "llm", "engine-b")], None, "engine") == {"10.1.0.6"}  # the others still resolve


def test_clusters_keep_their_pods_apart_and_cluster_less_series_match_any_cluster():
    table = pod_table([info("llm", "engine-a", "10.1.0.5", cluster="prod-a"),
                       info("llm", "engine-a", "10.2.0.5", cluster="prod-b"),
                       info("llm", "engine-c", "10.3.0.7")])  # one Prometheus per cluster: no cluster label
    assert resolve_ips(table, [("", "llm", "engine-a")], "prod-a", "engine") == {"10.1.0.5"}
    assert resolve_ips(table, [("", "llm", "engine-a")], "prod-b", "engine") == {"10.2.0.5"}
    assert resolve_ips(table, [("", "llm", "engine-c")], "prod-b", "engine") == {"10.3.0.7"}
    with pytest.raises(ResolveError, match="2 IPs"):  # no cluster in the scope: the pod is in both
        resolve_ips(table, [("", "llm", "engine-a")], None, "engine")
    # the same IP in two clusters is two pods only for a scope that names no cluster
    shared = pod_table([info("llm", "engine-a", "10.9.0.1", cluster="prod-a"),
                        info("llm", "engine-z", "10.9.0.1", cluster="prod-b")])
    assert resolve_ips(shared, [("", "llm", "engine-a")], "prod-a", "engine") == {"10.9.0.1"}


@pytest.mark.parametrize("honored", [True, False])
def test_a_pod_that_ended_holds_no_ip_so_the_pod_that_now_has_it_is_not_ambiguous(honored):
    """A CronJob's pod that Succeeded stays in the API server (and kube_pod_info) with the IP it had;
    the network gave that IP to an engine pod since."""
    done = info("batch", "report-28391-abc", "10.1.0.5", honored)
    phase = {"metric": {**done["metric"], "__name__": "kube_pod_status_phase", "phase": "Succeeded"}}
    del phase["metric"]["pod_ip"]
    series = [done, info("llm", "engine-a", "10.1.0.5", honored)]
    with pytest.raises(ResolveError, match="held by 2 pods"):
        resolve_ips(pod_table(series), [("", "llm", "engine-a")], None, "engine")
    assert resolve_ips(pod_table(series, [phase]), [("", "llm", "engine-a")], None, "engine") == {"10.1.0.5"}


def test_a_pod_without_an_ip_and_an_unknown_pod_are_refused_with_their_reason():
    table = pod_table([info("llm", "engine-p", "")])
    with pytest.raises(ResolveError) as e:
        resolve_ips(table, [("", "llm", "engine-p")], None, "engine")
    assert e.value.permanent and "without an IP" in str(e.value)
    with pytest.raises(ResolveError) as e:
        resolve_ips(table, [("", "llm", "gone")], None, "engine")
    assert "without an IP" not in str(e.value) and "no known IP" in e.value.summary


@pytest.mark.parametrize("engine, pod", [("llm/engine-a", ("llm", "engine-a")), ("engine-0", None), ("a/b/c", None),
                                         ("/engine-a", None), ("llm/", None), (None, None), (7, None)])
def test_an_engine_id_names_a_pod_only_as_namespace_slash_pod(engine, pod):
    assert engine_pod(engine) == pod


def test_the_gpu_operators_default_scrape_attributes_busy_gpus_by_exported_labels_and_idle_ones_to_nobody():
    """honorLabels false (the GPU Operator's ServiceMonitor): every series carries gpu-operator's
    namespace and the exporter's pod; a busy GPU's pod is in exported_*; an idle GPU has none,
    and is not attributed to the exporter's own pod."""
    t = attribution_table([fb("GPU-a", "llm", "engine-a", False), fb("GPU-idle", None, None, False)], SPEC)
    assert t.pods == {"GPU-a": {("", "llm", "engine-a")}} and t.gpus == {"GPU-a", "GPU-idle"}
    # honorLabels true: the same defaults read the plain labels (no exported_* in that job)
    t = attribution_table([fb("GPU-a", "llm", "engine-a", True)], SPEC)
    assert t.pods == {"GPU-a": {("", "llm", "engine-a")}}


def query_stub(series: dict[str, list[dict]]):
    """Prometheus' answers per fixed query (the pods that ended: none unless given)."""
    def q(expr: str) -> list[dict]:
        return series.get(expr, []) if expr == FINISHED_QUERY else series[expr]
    return q


def test_the_refusal_says_the_attribution_labels_are_missing_not_that_the_gpu_runs_no_pod():
    # dcgm-exporter without Kubernetes pod mapping, honorLabels false: no series has exported_pod,
    # but an attribution told to read the plain labels would see gpu-operator's own pod; with
    # explicit exported labels nothing is attributed, and the refusal says why
    spec = Discover("http://p:9090", 30.0, "DCGM_FI_DEV_FB_USED", "UUID", "exported_pod", "exported_namespace")
    series = [{"metric": {"job": "dcgm", "UUID": "GPU-a"}}, {"metric": {"job": "dcgm", "UUID": "GPU-b"}}]
    d = GpuWorkers(spec)
    d._query = query_stub({"DCGM_FI_DEV_FB_USED": series, "kube_pod_info": []})  # type: ignore[method-assign]
    with pytest.raises(ResolveError) as e:
        d.workers({"hw_id": "GPU-a"}, ["http://10.1.0.5:8000"])
    assert "attribution labels missing" in e.value.summary and "pod mapping is off" in str(e.value)
    d = GpuWorkers(spec)
    d._query = query_stub({"DCGM_FI_DEV_FB_USED": [], "kube_pod_info": []})  # type: ignore[method-assign]
    with pytest.raises(ResolveError, match="no DCGM_FI_DEV_FB_USED series"):
        d.workers({"hw_id": "GPU-a"}, [])


def test_an_engine_scope_resolves_to_the_workers_at_its_pods_ip_and_nothing_else():
    d = GpuWorkers(SPEC)
    d._query = query_stub({"DCGM_FI_DEV_FB_USED": [], "kube_pod_info": [  # type: ignore[method-assign]
        info("llm", "engine-a", "10.1.0.5", False), info("llm", "engine-b", "10.1.0.6", False)]})
    listed = ["http://10.1.0.5:8000", "http://10.1.0.6:8000", "http://10.1.0.6:8001/"]
    scope = {"cluster": "prod-a", "host_name": "node-1", "engine": "llm/engine-b", "model": "m"}
    assert d.workers(scope, listed) == ["http://10.1.0.6:8000", "http://10.1.0.6:8001"]
    with pytest.raises(ResolveError) as e:
        d.workers({**scope, "engine": "engine-0"}, listed)
    assert e.value.permanent and "no namespace/pod" in e.value.summary
    with pytest.raises(ResolveError) as e:
        d.workers({**scope, "engine": "llm/engine-a"}, listed[1:])
    assert e.value.summary == "no gateway worker on the engine: refused"


def test_state_says_why_an_adapter_is_still_pending():
    """Every retried failure (not only a refused key) shows under not_applied while the adapter
    stays pending; its outcome replaces it."""
    a = AppliedLevels()
    a.decided("{k}", 1, "trip", "d1", ["smg", "lb"], "freeze_admissions")
    a.retrying("{k}", 1, "d1", "smg", "retrying: ConnectError: [Errno -2] Name or service not known")
    a.retrying("{k}", 1, "other-decision", "lb", "not this trip's")
    a.outcome("{k}", 1, "d1", "lb", True)
    assert a.view("{k}", 1) == {"applied": True, "applied_by": ["lb"], "pending": ["smg"], "not_applied": [
        {"adapter": "smg", "why": "retrying: ConnectError: [Errno -2] Name or service not known"}]}
    a.outcome("{k}", 1, "d1", "smg", False, "gave up: ConnectError")
    assert a.view("{k}", 1) == {"applied": True, "applied_by": ["lb"], "pending": [], "not_applied": [
        {"adapter": "smg", "why": "gave up: ConnectError"}]}
