"""What ``fusebox generate`` writes under ``k8s/``, applied to a real Kubernetes control plane
shaped as kube-prometheus-stack leaves it with its DEFAULT values, and run: does the fuse act?

**Real here**: etcd, kube-apiserver v1.37.2 and the Prometheus Operator v0.85.0 (built by ``make
tools``) on loopback; the operator's CRDs (all of them); the ``Prometheus``, ``Alertmanager``,
Alertmanager config Secret and Alertmanager Service kube-prometheus-stack creates with its default
values (chart 88.5.3, tests/fixtures/k8s/kube-prometheus-stack/ and
tests/fixtures/alertmanager/kube-prometheus-stack.yml): rule, ServiceMonitor and PodMonitor
selectors on ``release: kube-prometheus-stack``, ``alertmanagerConfigSelector: {}``, no
``alertmanagerConfigMatcherStrategy`` (so the operator's default, OnNamespace), the ``null``
receiver, Watchdog route and the default inhibit rules; the user's two Secrets
(``fusebox-fuse-token``, ``fusebox-fuse-store`` with a PostgreSQL URL and password); every object
of ``k8s/`` by server-side apply, as ``kubectl apply -k k8s/ --server-side`` sends them. Then what
the operator renders (the Prometheus config Secret, the rule-file ConfigMap, the generated
Alertmanager config Secret, the two StatefulSets) is read back and run: Debian's Prometheus and
Alertmanager with the StatefulSets' own arguments on those files; the fuse as the generated
Deployment runs it (tests/_k8s_pods.py), two replicas on PostgreSQL, in front of the real SGLang
Model Gateway (three stand-in engines) and the reference gateway (``--gateway-url``, the one
adapter for level 2, which the SGLang gateway cannot apply); the collectors' DaemonSet pod.

**Substituted**, each the boundary of "no kubelet, no pod network, no GPU" (tests/_kube_net.py):

* ``kubernetes_sd_configs`` become static targets carrying the ``__meta_kubernetes_*`` labels
  Prometheus' SD would give for the running pods and the Services read back from the API server,
  so the operator's relabelings run unchanged;
* each pod has a loopback address of its own (its pod IP: the manifests' ports as written); the
  ``fusebox-fuse`` Service is a small proxy on another loopback address (its ClusterIP) that
  forwards to the Ready fuse pods only (readiness polled as the kubelet polls it, every second
  instead of every 10 s to keep the test short), and ``fusebox-fuse.monitoring.svc`` in the
  Alertmanager config is that address (cluster DNS);
* paths the pods mount (``/etc/prometheus/...``, ``/etc/alertmanager/...``, ``/etc/fusebox``) are
  folders of each pod under the test's temporary folder; the config reloader's decompression and
  ``$(POD_NAME)``/``$(SHARD)`` expansion is done here, as its init container does;
* the ``spec.version`` of the Prometheus and Alertmanager objects says which binaries run the
  rendered files (Debian's, not the chart's images), as a user pinning those versions would set
  ``prometheusSpec.version`` / ``alertmanagerSpec.version``; the operator renders for that version;
* the collectors' container runs ``fusebox collect scenario`` in place of ``fusebox collect gpu``
  (no GPU here: the scenario answers NVML calls through the same collector code), with the rest of
  its arguments and env as the DaemonSet gives them; its scenario
  (tests/fixtures/k8s/cluster-breach.yaml) plays GPU A past the memory critical, GPU B past the
  warning only, and the engine's KV growth and alignment latency past their criticals, then
  recovery;
* the spec is ``fusebox.yaml`` with short intervals (fusebox.demo.spec.demo_spec_text with 1 s
  scrapes and evaluations, 10 s ``for``), an ``sglang_gateway`` adapter mapping the scenario's
  GPUs and engine to the stand-in workers, and the ``kubernetes:`` block of a two-replica
  PostgreSQL fuse (``--gateway-url``, ``--hold 5``). The chart's own Prometheus intervals are
  left as they are: the PodMonitor, ServiceMonitor and rule groups carry the spec's.

What must happen, worked out from the scenario and the spec's thresholds (not from what the code
prints): GPU A (84 % >= 78.3 %) trips level 1 (freeze_admissions) on its hw_id; the engine's
alignment P95 (about 1.9 s >= 1.28 s) trips level 2 and its KV growth (25 MB/s >= 14.7 MB/s,
under the 8.7 GB/min OOM tier) level 3, on the engine; GPU B (75 %: warning only) and GPU C
trip nothing. Each level is tripped once and released once at the gateway; the SGLang gateway's
own worker list loses A's and C's workers once each and gets them back, and never loses B's; a
foreign critical (KubePodCrashLooping in namespace monitoring, posted to Alertmanager) never
reaches the fuse; every fuse-tripping critical reaches the fuse and the people's webhook (a small
HTTP sink whose URL the AlertmanagerConfig reads from the Secret ``fusebox-human-receiver``), the
heartbeat the fuse only; ``fusebox alertmanager test`` passes the operator's rendered config, and
tests/fixtures/alertmanager/operator-rendered.yml is that config (the unit tests of ``fusebox
alertmanager test`` read it); GPU B's warning reaches the people's route and is muted only by A's
critical of the same alert (the chart's inhibit rule: every fusebox alert carries the namespace).

One run takes about 2.5 minutes on 2 cores (measured 145 to 160 s, the same with both cores kept
busy by other processes): about 25 s to start the control plane, apply and read back, the rest
the scenario (the releases come about 110 s into it) and the few seconds after the last release
in which a repeated call would show.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from _gateways import StandInEngine, sglang_gateway, sglang_workers
from _k8s_pods import Pod, expand
from _kube_net import ReadinessProber, RunningPod, ServiceProxy, map_service_urls, static_sd
from _kube_support import ControlPlane, gunzip_text, secret_data, secret_doc, wait_until
from _pg_support import PgServer
from _support import FIXTURES, ROOT, SPEC, need, prometheus_and_alertmanager
from test_fuse_alertmanager import _People

from fusebox import conventions as C
from fusebox.collectors.scenario import load_scenario
from fusebox.demo.gateway import read_log
from fusebox.demo.spec import Timing, demo_spec_text
from fusebox.spec.adapter_kinds import ADAPTER_LEVELS
from fusebox.tooling import free_port

pytestmark = pytest.mark.tools

NS = "monitoring"
RELEASE = "kube-prometheus-stack"
CHART = FIXTURES / "k8s" / "kube-prometheus-stack"
SCENARIO = FIXTURES / "k8s" / "cluster-breach.yaml"
PROMETHEUS = f"{RELEASE}-prometheus"  # the chart's object names for this release
ALERTMANAGER = f"{RELEASE}-alertmanager"
PASSWORD = "Pg-" + secrets.token_hex(12)
HOLD_S = 5
# Short intervals for a test of minutes; the thresholds, windows and buckets stay the spec's.
TIMING = Timing(scrape_interval="1s", evaluation_interval="1s", warning_for="10s", critical_for="10s",
                keep_firing_for="5s", group_wait_critical="1s", group_wait="5s", group_interval="5s")

SC = load_scenario(str(SCENARIO))
GPU_A, GPU_B, GPU_C = (g.uuid for g in SC.gpus)
ENGINE = SC.engines[0].id
# level -> (action, scope label, value, alert): worked out in the module docstring
EXPECTED = {1: ("freeze_admissions", "hw_id", GPU_A, "GPUMemoryUtilizationHigh"),
            2: ("text_only_fallback", "engine", ENGINE, "AlignmentLatencyP95High"),
            3: ("kv_cache_eviction", "engine", ENGINE, "KVCacheGrowthRateHigh")}
HUMAN = "oncall"  # fuse.human_receiver: a webhook whose URL the AlertmanagerConfig reads from a Secret
HUMAN_RECEIVER = f"{NS}/fusebox-multimodal-inference/{HUMAN}"  # as the operator names it
OPERATOR_FIXTURE = FIXTURES / "alertmanager" / "operator-rendered.yml"
FOREIGN = {"alertname": "KubePodCrashLooping", "severity": "critical", "namespace": NS,
           "pod": "some-app-7d4b9c-x2x9z", "container": "app", "job": "kube-state-metrics"}


@dataclass
class Run:
    """Everything a run saw; the tests below assert on it."""

    applied: dict[str, dict] = field(default_factory=dict)  # "Kind/name" -> the object as the server stored it
    k8s_docs: list[dict] = field(default_factory=list)  # every document of k8s/ applied
    prometheus_config: dict = field(default_factory=dict)  # as the operator rendered it
    rulefiles: dict[str, str] = field(default_factory=dict)  # ConfigMap key -> rule file text
    am_config: dict = field(default_factory=dict)  # the generated Alertmanager config
    am_config_file: Path | None = None  # it, as the operator wrote it into the generated Secret
    people: list[dict] = field(default_factory=list)  # what the people's webhook received (alerts)
    prometheusrule: dict = field(default_factory=dict)
    readyz: dict[str, int] = field(default_factory=dict)  # pod -> /readyz status
    workers: list[tuple[float, frozenset]] = field(default_factory=list)  # SGLang GET /workers over time
    worker_urls: dict[str, str] = field(default_factory=dict)  # "A", "B", "C" -> stand-in URL
    server_info_calls: dict[str, tuple[int, int]] = field(default_factory=dict)  # worker -> (before, after)
    calls: list[dict] = field(default_factory=list)  # the reference gateway's log
    am_snapshots: list[tuple[float, list[dict]]] = field(default_factory=list)
    foreign: list[dict] = field(default_factory=list)  # the foreign alert as Alertmanager reports it
    proxied: list[tuple[str, str, bytes, str | None]] = field(default_factory=list)  # what the fuse Service carried
    pod_ips: dict[str, str] = field(default_factory=dict)  # fuse pod -> its IP
    alertmanagers: list[str] = field(default_factory=list)  # Prometheus' discovered Alertmanagers
    am_address: str = ""  # the Alertmanager pod's IP:port
    audit: list[tuple] = field(default_factory=list)
    up: list[dict] = field(default_factory=list)  # Prometheus: up{job="fusebox-fuse"}
    heartbeat: list[dict] = field(default_factory=list)  # fusebox_fuse_last_notification_timestamp_seconds
    logs: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    token: str = ""
    people_url: str = ""  # the people's webhook (in the Secret fusebox-human-receiver)
    spec_path: Path | None = None
    error: str | None = None
    # StatefulSet name -> the pod template's labels, as the operator rendered the StatefulSet
    operator_pod_labels: dict[str, dict[str, str]] = field(default_factory=dict)


# ------------------------------------------------------------------------------ the spec
def cluster_spec_text(sglang_url: str, workers: dict[str, str], gateway_url: str) -> str:
    """fusebox.yaml with the test's intervals, its SGLang adapter and the kubernetes: block."""
    from fusebox.spec import load_spec

    levels = {a.level: n for n, a in load_spec(SPEC).actions.items()}
    targets = [{"match": {"hw_id": GPU_A}, "worker_url": workers["A"]},
               {"match": {"hw_id": GPU_B}, "worker_url": workers["B"]},
               {"match": {"hw_id": GPU_C}, "worker_url": workers["C"]},
               {"match": {"engine": ENGINE}, "worker_url": workers["C"]}]
    adapters = {"sglang": {"kind": "sglang_gateway", "url": sglang_url, "timeout": "5s", "targets": targets,
                           "actions": [levels[lv] for lv in ADAPTER_LEVELS["sglang_gateway"] if lv in levels]}}
    text = demo_spec_text(SPEC.read_text(), webhook_url=f"http://{C.K8S['fuse']}.{NS}.svc:9095/alertmanager",
                          credentials_file=f"/etc/alertmanager/secrets/{C.K8S['token_secret']}/token",
                          timing=TIMING, adapters=adapters, source="fusebox.yaml")
    data = yaml.safe_load(text)
    # the expectations below are worked out for the threshold signals the scenario plays past their
    # lines; time to full (its own tiers on the same GPUs and engines) is left out here and checked
    # by its generated tests, the backtest of the recorded breach and the demo
    data["signals"] = {n: sig for n, sig in data["signals"].items() if sig.get("kind") != "time_to_full"}
    # no autoscaling here: its ScaledObjects need KEDA's CRDs and the engines' namespace (docs/scaling.md)
    data.pop("scaling", None)
    k = data.setdefault("kubernetes", {})
    k["namespace"] = NS
    k["labels"] = {"release": RELEASE}
    k.setdefault("collectors", {})["cluster"] = SC.cluster
    # the people: a webhook whose URL is a secret (url_file), so the AlertmanagerConfig reads it from
    # the Secret fusebox-human-receiver (key webhook-0-url), created below as the docs say
    data["fuse"]["human_receiver"] = {"name": HUMAN, "webhook_configs": [
        {"url_file": "/etc/alertmanager/secrets/people/url", "send_resolved": True}]}
    k.setdefault("fuse", {}).update({"replicas": 2, "store_secret": {"name": "fusebox-fuse-store", "key": "url"},
                                     "args": ["--gateway-url", gateway_url, "--hold", str(HOLD_S)]})
    return yaml.safe_dump(data, sort_keys=False, width=120)


# ------------------------------------------------------------------------------ helpers
def documented_token() -> str:
    """The token file the README's step 4 makes (its own command, run here), byte for byte: what
    ``kubectl create secret generic fusebox-fuse-token --from-file=token=fuse.token`` puts in the
    Secret."""
    m = re.search(r"python3 -c '([^']+)' > fuse\.token", (ROOT / "README.md").read_text())
    assert m, "README: no `python3 -c '...' > fuse.token` command in the Kubernetes walk-through"
    r = subprocess.run([sys.executable, "-c", m.group(1)], capture_output=True, text=True, timeout=30, check=True)
    return r.stdout


def _load_fixture(name: str) -> dict:
    return yaml.safe_load((CHART / name).read_text())


def _binary_version(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    first = (out.stdout or out.stderr).split("version ", 1)[1].split()[0]
    return "v" + first.split("+")[0]


def _secrets(cp: ControlPlane) -> dict[str, dict[str, bytes | str]]:
    """Every Secret of the namespace as a pod's volume would hold it (decoded; text where it is)."""
    out: dict[str, dict[str, bytes | str]] = {}
    for s in cp.list("v1", "Secret", NS):
        data: dict[str, bytes | str] = {}
        for k in (s.get("data") or {}):
            raw = secret_data(s, k)
            try:
                data[k] = raw.decode()
            except UnicodeDecodeError:
                data[k] = raw
        out[s["metadata"]["name"]] = data
    return out


def _configmaps(cp: ControlPlane) -> dict[str, dict[str, str]]:
    return {c["metadata"]["name"]: dict(c.get("data") or {}) for c in cp.list("v1", "ConfigMap", NS)}


def _localize(obj: Any, pod: Pod) -> Any:
    """Every absolute path in a config pointed at the pod's own folder for that mount."""
    if isinstance(obj, dict):
        return {k: _localize(v, pod) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_localize(v, pod) for v in obj]
    if isinstance(obj, str) and obj.startswith("/"):
        return pod.local(obj)
    return obj


def _reloader_env(sts: dict, pod: Pod) -> dict[str, str]:
    """The env of the StatefulSet's config-reloader (POD_NAME, SHARD), for $(VAR) expansion."""
    spec = sts["spec"]["template"]["spec"]
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        if "reloader" in c["name"]:
            env = {}
            for e in c.get("env", []):
                if "value" in e:
                    env[e["name"]] = e["value"]
                elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                    env[e["name"]] = pod.name
            return env
    raise AssertionError(f"no config-reloader container in {sts['metadata']['name']}")


def _statefulset_pod(cp: ControlPlane, root: Path, sts_name: str, container: str, exe: str) -> Pod:
    sts = cp.get("apps/v1", "StatefulSet", sts_name, NS)
    assert sts is not None
    return Pod(sts, root / sts_name, secrets=_secrets(cp), configmaps=_configmaps(cp), name=f"{sts_name}-0",
               container=container, entrypoint=[exe])


def _running(pod: Pod, controller_kind: str, controller_name: str, ready=lambda: True) -> RunningPod:
    return RunningPod(name=pod.name, namespace=NS, ip=pod.ip, labels=pod.labels, containers=pod.spec["containers"],
                      controller_kind=controller_kind, controller_name=controller_name, node=pod.node, ready=ready,
                      host_ports=pod.host_ports)


def _get(url: str, **kw) -> Any:
    r = httpx.get(url, timeout=10, **kw)
    r.raise_for_status()
    return r.json()


def _query(prom_url: str, q: str) -> list[dict]:
    return _get(prom_url + "/api/v1/query", params={"query": q})["data"]["result"]


def _am_alerts(am_url: str) -> list[dict]:
    return _get(am_url + "/api/v2/alerts")


def _rows(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as c:
        return c.execute(sql).fetchall()


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + "Z"


# ------------------------------------------------------------------------------ the run
@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    res = Run()
    t_start = time.monotonic()
    root = tmp_path_factory.mktemp("cluster")
    prometheus_exe, am_exe = prometheus_and_alertmanager()
    with ExitStack() as stack:
        # 1. the control plane ------------------------------------------------------------
        cp = ControlPlane(root / "control-plane")
        stack.callback(cp.close)
        cp.start()
        res.timings["api_server_ready_s"] = time.monotonic() - t_start
        cp.install_crds()
        cp.start_operator()
        res.timings["operator_synced_s"] = time.monotonic() - t_start

        # 2. PostgreSQL, the stand-in engines, the SGLang Model Gateway, the reference gateway
        pg = PgServer()
        stack.callback(pg.close)
        pg.start()
        store_url = pg.create_user("fusebox", PASSWORD)
        engines = {k: StandInEngine() for k in "ABC"}
        for e in engines.values():
            stack.callback(e.stop)
        res.worker_urls = {k: e.url for k, e in engines.items()}
        sg = sglang_gateway(list(res.worker_urls.values()), root / "sglang.log")
        stack.callback(sg.stop)
        gw_log = root / "gateway.jsonl"
        gw_url = f"http://127.0.0.1:{free_port()}"
        with (root / "gateway.log").open("wb") as out:
            gw = subprocess.Popen([sys.executable, "-m", "fusebox.cli", "fuse", "gateway", "--listen",
                                   gw_url.removeprefix("http://"), "--log", str(gw_log)],
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        stack.callback(lambda: (gw.terminate(), gw.wait(10)))
        wait_until(lambda: _up(gw_url + "/healthz"), 30, "the reference gateway")

        # 3. generate (what `make generate` writes) from the derived spec ------------------
        spec_path = root / "fusebox.yaml"
        spec_path.write_text(cluster_spec_text(sg.url, res.worker_urls, gw_url))
        res.spec_path = spec_path
        out_dir = root / "generated"
        r = subprocess.run([sys.executable, "-m", "fusebox.cli", "generate", "--spec", str(spec_path), "--out",
                            str(out_dir)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr

        # 4. kube-prometheus-stack's objects (chart defaults), the user's Secrets, k8s/ -----
        def applied(doc: dict) -> None:
            res.applied[f"{doc['kind']}/{doc['metadata']['name']}"] = cp.apply(doc)

        applied({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        am_secret = secret_doc(f"alertmanager-{ALERTMANAGER}", NS,
                               {"alertmanager.yaml": (FIXTURES / "alertmanager" / "kube-prometheus-stack.yml").read_text()},
                               labels=_load_fixture("alertmanager.yaml")["metadata"]["labels"])
        applied(am_secret)
        applied(_load_fixture("alertmanager-service.yaml"))
        prom_obj, am_obj = _load_fixture("prometheus.yaml"), _load_fixture("alertmanager.yaml")
        # the one change to the chart's objects: the versions of the binaries that run what the
        # operator renders (it renders for the version it is told)
        prom_obj["spec"]["version"] = _binary_version(prometheus_exe)
        am_obj["spec"]["version"] = _binary_version(am_exe)
        applied(prom_obj)
        applied(am_obj)
        res.token = documented_token()
        applied(secret_doc(C.K8S["token_secret"], NS, {C.K8S["token_key"]: res.token}))
        applied(secret_doc("fusebox-fuse-store", NS, {"url": store_url}))
        people = _People()
        stack.callback(people.close)
        applied(secret_doc(C.K8S["human_secret"], NS, {"webhook-0-url": people.url}))
        res.people_url = people.url
        kustomization = yaml.safe_load((out_dir / "k8s" / "kustomization.yaml").read_text())
        for f in kustomization["resources"]:
            for doc in yaml.safe_load_all((out_dir / "k8s" / f).read_text()):
                if doc:
                    res.k8s_docs.append(doc)
                    applied(doc)
        res.prometheusrule = next(d for d in res.k8s_docs if d["kind"] == "PrometheusRule")
        res.timings["applied_s"] = time.monotonic() - t_start

        # 5. what the operator renders ------------------------------------------------------
        def rendered_prometheus() -> dict | None:
            s = cp.get("v1", "Secret", f"prometheus-{PROMETHEUS}", NS)
            if not s or "prometheus.yaml.gz" not in (s.get("data") or {}):
                return None
            cfg = yaml.safe_load(gunzip_text(secret_data(s, "prometheus.yaml.gz")))
            jobs = {j["job_name"] for j in cfg.get("scrape_configs") or []}
            return cfg if {f"serviceMonitor/{NS}/{C.K8S['fuse']}/0", f"podMonitor/{NS}/fusebox-collectors/0"} <= jobs else None

        res.prometheus_config = wait_until(rendered_prometheus, 90, "the operator's Prometheus config", step=0.5,
                                           alive=cp.check, why=cp.operator_log)

        def rulefiles() -> dict[str, str]:
            out = {}
            for cm in cp.list("v1", "ConfigMap", NS):
                if cm["metadata"]["name"].startswith(f"prometheus-{PROMETHEUS}-rulefiles-"):
                    out.update(cm.get("data") or {})
            return out if any(f"{NS}-{res.prometheusrule['metadata']['name']}-" in k for k in out) else {}

        res.rulefiles = wait_until(rulefiles, 60, "the rule-file ConfigMap", step=0.5, alive=cp.check,
                                   why=cp.operator_log)

        def rendered_alertmanager() -> dict | None:
            s = cp.get("v1", "Secret", f"alertmanager-{ALERTMANAGER}-generated", NS)
            if not s or "alertmanager.yaml.gz" not in (s.get("data") or {}):
                return None
            text = gunzip_text(secret_data(s, "alertmanager.yaml.gz"))
            cfg = yaml.safe_load(text)
            if "fusebox-fuse" not in json.dumps(cfg):
                return None
            res.am_config_file = root / "operator-alertmanager.yaml"
            res.am_config_file.write_text(text)
            return cfg

        res.am_config = wait_until(rendered_alertmanager, 90, "the operator's Alertmanager config", step=0.5,
                                   alive=cp.check, why=cp.operator_log)
        for sts in (f"prometheus-{PROMETHEUS}", f"alertmanager-{ALERTMANAGER}"):
            wait_until(lambda sts=sts: cp.get("apps/v1", "StatefulSet", sts, NS), 60, f"StatefulSet {sts}",
                       alive=cp.check, why=cp.operator_log)
        res.timings["operator_rendered_s"] = time.monotonic() - t_start

        # 6. the fuse, two replicas, as the generated Deployment runs it ---------------------
        dep = cp.get("apps/v1", "Deployment", C.K8S["fuse"], NS)
        assert dep is not None
        pods = [Pod(dep, root / f"fuse-{i}", secrets=_secrets(cp), configmaps=_configmaps(cp),
                    name=f"{C.K8S['fuse']}-{i}") for i in range(dep["spec"]["replicas"])]
        for p in pods:
            p.start()
            stack.callback(p.stop, 10)
        for p in pods:
            p.wait_ready(timeout=90, period=1.0)  # the kubelet's probe, polled every second here
        res.readyz = {p.name: httpx.get(p.url() + "/readyz", timeout=10).status_code for p in pods}
        prober = ReadinessProber({p.name: p.probe for p in pods}, period=1.0)
        stack.callback(prober.stop)
        svc = cp.get("v1", "Service", C.K8S["fuse"], NS)
        assert svc is not None
        sport = svc["spec"]["ports"][0]
        proxy = ServiceProxy(C.K8S["fuse"], sport["port"], lambda: [
            f"{p.ip}:{p.ports[sport['targetPort']] if isinstance(sport['targetPort'], str) else p.host_ports[sport['targetPort']]}"
            for p in pods if prober.ready[p.name]])
        stack.callback(proxy.stop)

        # 7. Alertmanager from the generated config, as its StatefulSet runs it -------------
        am_pod = _statefulset_pod(cp, root, f"alertmanager-{ALERTMANAGER}", "alertmanager", am_exe)
        am_sts = cp.get("apps/v1", "StatefulSet", f"alertmanager-{ALERTMANAGER}", NS)
        res.operator_pod_labels[f"alertmanager-{ALERTMANAGER}"] = dict(am_sts["spec"]["template"]["metadata"]["labels"])
        am_cfg = yaml.safe_load(expand(yaml.safe_dump(res.am_config), _reloader_env(am_sts, am_pod)))
        am_cfg = map_service_urls(_localize(am_cfg, am_pod), {(NS, C.K8S["fuse"]): proxy})
        _write_config_out(am_pod, "alertmanager.env.yaml", am_cfg)
        am_pod.start()
        stack.callback(am_pod.stop, 10)
        am_pod.wait_ready(timeout=60, period=0.5)
        am_url = am_pod.url(am_pod.container["readinessProbe"]["httpGet"]["port"])

        # 8. the collectors' pod and Prometheus ----------------------------------------------
        ds = cp.get("apps/v1", "DaemonSet", "fusebox-collectors", NS)
        assert ds is not None
        ds = copy.deepcopy(ds)
        args = ds["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[:2] == ["collect", "gpu"], args
        # no GPU here: the scenario in place of NVML, through the same collector code; it and the
        # spec (for the latency buckets) are files in the pod's /tmp
        args[1:2] = ["scenario", "/tmp/scenario.yaml", "--speed", "1", "--spec", "/tmp/fusebox.yaml"]
        coll = Pod(ds, root / "collectors", secrets={}, configmaps={}, name="fusebox-collectors-x7k2p",
                   node=SC.host)
        shutil.copy(SCENARIO, coll.mounts["/tmp"] / "scenario.yaml")
        shutil.copy(spec_path, coll.mounts["/tmp"] / "fusebox.yaml")
        prom_pod = _statefulset_pod(cp, root, f"prometheus-{PROMETHEUS}", "prometheus", prometheus_exe)
        prom_sts = cp.get("apps/v1", "StatefulSet", f"prometheus-{PROMETHEUS}", NS)
        res.operator_pod_labels[f"prometheus-{PROMETHEUS}"] = dict(prom_sts["spec"]["template"]["metadata"]["labels"])
        world = [*(_running(p, "ReplicaSet", f"{C.K8S['fuse']}-5c9d7f", ready=lambda p=p: prober.ready[p.name])
                   for p in pods),
                 _running(coll, "DaemonSet", "fusebox-collectors"),
                 _running(am_pod, "StatefulSet", f"alertmanager-{ALERTMANAGER}"),
                 _running(prom_pod, "StatefulSet", f"prometheus-{PROMETHEUS}")]
        services = cp.list("v1", "Service", NS)
        env = _reloader_env(prom_sts, prom_pod)
        cfg = yaml.safe_load(expand(yaml.safe_dump(res.prometheus_config), env))
        cfg = _localize(static_sd(cfg, services, world), prom_pod)
        _write_config_out(prom_pod, "prometheus.env.yaml", cfg)
        if not any(a.startswith("--web.listen-address") for a in prom_pod.container.get("args", [])):
            # Prometheus listens on every address of its pod by default: here, the pod's own one
            prom_pod.container.setdefault("args", []).append(f"--web.listen-address={prom_pod.local(':9090')}")
        prom_pod.start()
        stack.callback(prom_pod.stop, 10)
        prom_pod.wait_ready(timeout=60, period=0.5)
        prom_url = prom_pod.url(prom_pod.container["readinessProbe"]["httpGet"]["port"])
        res.server_info_calls = {k: (_count(e, "/server_info"), 0) for k, e in engines.items()}
        coll.start()
        stack.callback(coll.stop, 10)
        t0 = time.time()
        res.timings["scenario_start_s"] = time.monotonic() - t_start
        coll.wait_ready(timeout=60, period=0.5)

        # 9. a foreign critical alert, as kube-state-metrics' rules would raise it -------------
        r2 = httpx.post(am_url + "/api/v2/alerts", timeout=10, json=[
            {"labels": FOREIGN, "annotations": {"summary": "a pod of another team crash-loops"},
             "startsAt": _iso(time.time()), "endsAt": _iso(time.time() + 600)}])
        assert r2.status_code == 200, r2.text

        # 10. watch: the gateways, Alertmanager, until every level is released ----------------
        # the scenario's end (its player exits then): every release is due well before
        deadline = time.monotonic() + SC.duration_s - 5
        full = frozenset(res.worker_urls.values())
        done_at: float | None = None
        try:
            while time.monotonic() < deadline:
                for p in [*pods, am_pod, prom_pod, coll]:
                    if p.proc is not None and p.proc.poll() is not None:
                        raise AssertionError(f"pod {p.name} exited {p.proc.returncode}: {p.output()[-3000:]}")
                now = time.time() - t0
                try:
                    ws = frozenset(sglang_workers(sg.url))
                except httpx.HTTPError:
                    ws = None
                if ws is not None and (not res.workers or res.workers[-1][1] != ws):
                    res.workers.append((now, ws))
                res.am_snapshots.append((now, _am_alerts(am_url)))
                res.calls = read_log(gw_log)
                released = {c["level"] for c in res.calls if c["state"] == "release"}
                if done_at is None and released >= set(EXPECTED) and ws == full:
                    done_at = time.monotonic()
                # a few seconds more after the last release: anything repeated would show
                if done_at is not None and time.monotonic() - done_at > 8:
                    break
                time.sleep(0.5)
            else:
                res.error = f"not every level was released within {SC.duration_s - 5:.0f}s of the scenario's start"
        except AssertionError as e:
            res.error = str(e)
        finally:
            res.timings["watched_s"] = time.time() - t0
            res.calls = read_log(gw_log)
            res.foreign = [a for a in _am_alerts(am_url) if a["labels"].get("alertname") == FOREIGN["alertname"]]
            res.people = list(people.alerts)
            res.proxied = list(proxy.seen)
            res.audit = _rows(store_url, "SELECT kind, scope_key, level, action, source, reason, detail FROM audit")
            res.alertmanagers = [a["url"] for a in _get(prom_url + "/api/v1/alertmanagers")["data"]["activeAlertmanagers"]]
            res.pod_ips = {p.name: p.ip for p in pods}
            res.am_address = am_url.removeprefix("http://")
            res.up = _query(prom_url, f'up{{job="{C.K8S["fuse"]}"}}')
            res.heartbeat = _query(prom_url, f'fusebox_fuse_last_notification_timestamp_seconds{{job="{C.K8S["fuse"]}"}}')
            res.server_info_calls = {k: (res.server_info_calls[k][0], _count(e, "/server_info"))
                                     for k, e in engines.items()}
            res.logs = {p.name: p.output() for p in [*pods, am_pod, prom_pod, coll]}
            res.logs["operator"] = cp.operator_log()
            (root / "run.json").write_text(json.dumps(
                {"error": res.error, "calls": res.calls, "workers": [(t, sorted(w)) for t, w in res.workers],
                 "am": res.am_snapshots, "audit": res.audit, "timings": res.timings,
                 "server_info": res.server_info_calls},
                default=str, indent=1))
    res.timings["total_s"] = time.monotonic() - t_start
    print("cluster test timings:", {k: round(v, 1) for k, v in res.timings.items()})
    return res


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code < 500
    except httpx.HTTPError:
        return False


def _count(engine: StandInEngine, path: str) -> int:
    return sum(1 for _m, p in list(engine.seen) if p.startswith(path))


FIXTURE_HEADER = """\
# The Alertmanager config the Prometheus Operator v0.85.0 rendered (the Secret
# alertmanager-kube-prometheus-stack-alertmanager-generated, key alertmanager.yaml.gz, unzipped) from
# kube-prometheus-stack's default config and the k8s/alertmanagerconfig.yml of tests/e2e/test_k8s_cluster.py's
# spec, captured by that test; only the fuse's token and the people's webhook URL (both from Secrets)
# are replaced. `fusebox alertmanager test` is tested on it (tests/generator/test_alertmanager_routing.py)
# without an operator; the cluster test fails when the operator renders anything else.
"""
FIXTURE_TOKEN = "fixture-token-not-a-secret"
FIXTURE_PEOPLE_URL = "http://people.example:9/people"


def operator_fixture_text(rendered: str, token: str, people_url: str) -> str:
    """The operator's rendered config as tests/fixtures/alertmanager/operator-rendered.yml holds it."""
    assert token in rendered and people_url in rendered
    return FIXTURE_HEADER + rendered.replace(token, FIXTURE_TOKEN).replace(people_url, FIXTURE_PEOPLE_URL)


def _write_config_out(pod: Pod, name: str, cfg: dict) -> None:
    """What the config reloader's init container writes into the pod's config_out folder."""
    outs = [where for mount, where in pod.mounts.items() if mount.endswith("/config_out")]
    assert len(outs) == 1, sorted(pod.mounts)
    (outs[0] / name).write_text(yaml.safe_dump(cfg, sort_keys=False))


# ------------------------------------------------------------------------------ the tests
def test_the_api_server_accepted_every_object_of_k8s_and_the_charts(run):
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in run.k8s_docs)
    assert {"PrometheusRule/fusebox-multimodal-inference", "AlertmanagerConfig/fusebox-multimodal-inference",
            "Deployment/fusebox-fuse", "Service/fusebox-fuse", "ServiceMonitor/fusebox-fuse",
            "DaemonSet/fusebox-collectors", "PodMonitor/fusebox-collectors"} <= set(kinds), kinds
    for k in kinds:
        obj = run.applied[k]
        assert obj["metadata"].get("uid") and obj["metadata"]["namespace"] == NS, k
        assert obj["metadata"]["labels"].get("release") == RELEASE, k  # what the chart's selectors need
    # and the chart's own objects, as the chart renders them (the API server refuses an unknown field)
    assert {f"Prometheus/{PROMETHEUS}", f"Alertmanager/{ALERTMANAGER}", f"Secret/alertmanager-{ALERTMANAGER}",
            f"Service/{ALERTMANAGER}", "Secret/fusebox-fuse-token", "Secret/fusebox-fuse-store"} <= set(run.applied)


def test_the_fuse_network_policy_lets_in_the_pods_the_operator_rendered_and_no_other(run):
    """The NetworkPolicy as the API server stored it, against the labels the operator gave the
    Alertmanager and Prometheus pods (their StatefulSets' templates) and the labels the API server
    gave the namespace. No kubelet and no network plugin run here, so nothing enforces it: this
    checks what it selects, not that packets are dropped."""
    pol = run.applied[f"NetworkPolicy/{C.K8S['fuse']}"]["spec"]
    ns_labels = run.applied[f"Namespace/{NS}"]["metadata"]["labels"]

    def admitted(pod_labels: dict[str, str], namespace_labels: dict[str, str]) -> bool:
        # matchLabels: every pair present; a peer's two selectors both hold; any peer admits
        return any(all(namespace_labels.get(k) == v for k, v in peer["namespaceSelector"]["matchLabels"].items())
                   and all(pod_labels.get(k) == v for k, v in peer["podSelector"]["matchLabels"].items())
                   for rule in pol["ingress"] for peer in rule["from"])

    assert pol["policyTypes"] == ["Ingress"]
    assert {name: admitted(labels, ns_labels) for name, labels in run.operator_pod_labels.items()} == {
        f"alertmanager-{ALERTMANAGER}": True, f"prometheus-{PROMETHEUS}": True}
    assert not admitted(run.operator_pod_labels[f"alertmanager-{ALERTMANAGER}"], {"kubernetes.io/metadata.name": "tenant"})
    deployment = run.applied[f"Deployment/{C.K8S['fuse']}"]["spec"]["template"]
    collectors = run.applied["DaemonSet/fusebox-collectors"]["spec"]["template"]
    assert not admitted(collectors["metadata"]["labels"], ns_labels)
    assert all(deployment["metadata"]["labels"].get(k) == v for k, v in pol["podSelector"]["matchLabels"].items())
    (port,) = deployment["spec"]["containers"][0]["ports"]
    assert [p["port"] for rule in pol["ingress"] for p in rule["ports"]] == [port["containerPort"]]


def test_the_operator_selected_the_prometheusrule_into_its_rule_files(run):
    key = next(k for k in run.rulefiles if k.startswith(f"{NS}-fusebox-multimodal-inference-"))
    groups = yaml.safe_load(run.rulefiles[key])["groups"]
    mine = run.prometheusrule["spec"]["groups"]
    assert [g["name"] for g in groups] == [g["name"] for g in mine]
    assert sum(len(g["rules"]) for g in groups) == sum(len(g["rules"]) for g in mine)
    # and Prometheus loads that folder, with the fuse's ServiceMonitor and the collectors' PodMonitor jobs
    cfg = run.prometheus_config
    assert any(f"prometheus-{PROMETHEUS}-rulefiles-0" in f for f in cfg["rule_files"]), cfg["rule_files"]
    jobs = {j["job_name"] for j in cfg["scrape_configs"]}
    assert {f"serviceMonitor/{NS}/fusebox-fuse/0", f"podMonitor/{NS}/fusebox-collectors/0"} <= jobs


def _routes(route: dict) -> list[dict]:
    out = []
    for r in route.get("routes") or []:
        out.append(r)
        out.extend(_routes(r))
    return out


def test_the_alertmanagerconfig_route_got_the_operators_namespace_matcher_and_the_token(run):
    cfg = run.am_config
    fuse_receiver = f"{NS}/fusebox-multimodal-inference/fusebox-fuse"
    top = [r for r in cfg["route"]["routes"] if r.get("receiver") == HUMAN_RECEIVER]
    assert len(top) == 1, cfg["route"]
    matchers = top[0]["matchers"]
    assert f'namespace="{NS}"' in matchers  # the default strategy (OnNamespace) is in force
    assert 'fusebox="multimodal-inference"' in matchers
    assert top[0].get("continue") is True
    # the chart's own routes follow, unchanged: the null receiver, the Watchdog
    assert cfg["route"]["receiver"] == "null"
    assert any(r.get("receiver") == "null" and [m.replace(" ", "") for m in r.get("matchers", [])] == ['alertname="Watchdog"']
               for r in cfg["route"]["routes"])
    hooks = [w for rc in cfg["receivers"] if rc["name"] == fuse_receiver for w in rc.get("webhook_configs", [])]
    assert len(hooks) == 1
    assert hooks[0]["url"] == f"http://fusebox-fuse.{NS}.svc:9095/alertmanager"
    # the token from the Secret, as the operator copies it: byte for byte, so a newline at its end
    # would reach Alertmanager's Authorization header (which it refuses to send)
    assert hooks[0]["http_config"]["authorization"] == {"type": "Bearer", "credentials": run.token}
    assert run.token == run.token.strip() and len(run.token) >= 32
    # the people's webhook: its URL read from the Secret fusebox-human-receiver (key webhook-0-url)
    (people,) = [rc for rc in cfg["receivers"] if rc["name"] == HUMAN_RECEIVER]
    assert [w["url"] for w in people["webhook_configs"]] == [run.people_url]


def test_the_committed_operator_fixture_is_what_the_operator_rendered(run):
    captured = operator_fixture_text(run.am_config_file.read_text(), run.token, run.people_url)
    (run.am_config_file.parent / OPERATOR_FIXTURE.name).write_text(captured)  # to copy when it changed
    assert OPERATOR_FIXTURE.read_text() == captured, f"copy {run.am_config_file.parent / OPERATOR_FIXTURE.name} " \
                                                     f"to {OPERATOR_FIXTURE}"


def test_fusebox_alertmanager_test_passes_the_config_the_operator_rendered(run):
    """`fusebox alertmanager test` (amtool routes test) on the generated Secret's alertmanager.yaml:
    every fusebox critical reaches the fuse and the people, every other alert the people."""
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "alertmanager", "test", "--config", str(run.am_config_file),
                        "--spec", str(run.spec_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    ok = [ln for ln in r.stdout.splitlines() if ln.startswith("ok ")]
    assert any("GPUMemoryUtilizationHigh critical trips the fuse and tells the people" in ln for ln in ok), r.stdout
    assert any("FuseboxFuseDown tells the people only" in ln for ln in ok), r.stdout
    # the same by hand, amtool on the operator's file: the receivers in route order
    amtool = need("amtool", "install Debian's prometheus-alertmanager package (`make tools`)")
    crit = next(a["labels"] for a in run.people if a["labels"].get("hw_id") == GPU_A
                and a["labels"]["severity"] == "critical")
    got = subprocess.run([amtool, "config", "routes", "test", f"--config.file={run.am_config_file}",
                          *(f"{k}={v}" for k, v in crit.items())], capture_output=True, text=True, timeout=60)
    assert got.stdout.split() == [f"{NS}/fusebox-multimodal-inference/fusebox-fuse,{HUMAN_RECEIVER}"], got


def test_a_fusebox_critical_reached_the_fuse_and_the_people_and_the_heartbeat_only_the_fuse(run):
    firing = {(a["labels"]["alertname"], a["labels"]["severity"], a["labels"].get("hw_id") or a["labels"].get("engine"))
              for a in run.people if a["status"] == "firing"}
    for _level, (_action, _label, value, alert) in EXPECTED.items():
        assert (alert, "critical", value) in firing, sorted(firing)  # each fuse-tripping critical, to the people too
    crit_a = [a for a in run.people if a["labels"].get("hw_id") == GPU_A and a["labels"]["severity"] == "critical"]
    assert {a["status"] for a in crit_a} == {"firing", "resolved"}, crit_a  # send_resolved: the all-clear as well
    assert crit_a[0]["labels"]["fuse_action"] == EXPECTED[1][0]
    # the same critical reached the fuse (through its Service)
    assert any(GPU_A.encode() in b and b'"severity":"critical"' in b.replace(b" ", b"") for _m, _p, b, _to in run.proxied)
    names = {a["labels"]["alertname"] for a in run.people}
    assert C.HEARTBEAT_ALERT not in names  # the fuse only
    assert FOREIGN["alertname"] not in names  # not fusebox's: the chart's null receiver
    assert all(a["labels"].get("fusebox") == "multimodal-inference" for a in run.people)


def test_both_fuse_replicas_become_ready_on_postgresql(run):
    assert run.readyz == {f"{C.K8S['fuse']}-0": 200, f"{C.K8S['fuse']}-1": 200}
    # Prometheus scrapes both through the ServiceMonitor, under the job the self-monitoring rules read
    assert sorted(s["metric"]["pod"] for s in run.up) == sorted(run.readyz)
    assert all(s["value"][1] == "1" for s in run.up)


def test_the_heartbeat_reaches_the_fuse_through_the_operators_route(run):
    assert run.heartbeat, "no fusebox_fuse_last_notification_timestamp_seconds on the fuse's job"


def test_every_fuse_level_tripped_once_and_released_once_at_the_gateway(run):
    assert run.error is None, (run.error, run.calls, _tail(run))
    calls = run.calls
    assert len(calls) == 2 * len(EXPECTED), calls
    for level, (action, label, value, _alert) in EXPECTED.items():
        mine = [c for c in calls if c["level"] == level]
        assert [c["state"] for c in mine] == ["trip", "release"], mine
        assert all(c["action"] == action and c["scope"].get(label) == value for c in mine), mine
    assert not any(c.get("duplicate") for c in calls)
    # the fuse's own audit (shared in PostgreSQL) says which adapter applied what: the reference
    # gateway every level, the SGLang gateway levels 1 and 3 (it has no text-only path)
    applied = sorted((row[4], row[2], row[5].split()[0]) for row in run.audit if row[0] == "applied")
    assert applied == sorted([("gateway", lv, st) for lv in EXPECTED for st in ("trip", "release")]
                             + [("sglang", lv, st) for lv in (1, 3) for st in ("trip", "release")]), run.audit


def test_the_sglang_gateways_worker_list_lost_a_and_c_once_and_never_b(run):
    urls = run.worker_urls
    full = frozenset(urls.values())
    assert run.workers and run.workers[0][1] == full and run.workers[-1][1] == full, run.workers
    for k, lost_once in (("A", True), ("B", False), ("C", True)):
        present = [urls[k] in ws for _t, ws in run.workers]
        gone_spans = sum(1 for i in range(1, len(present)) if present[i - 1] and not present[i])
        assert gone_spans == (1 if lost_once else 0), (k, run.workers)
    # the gateway probed each worker it added back once more (POST /workers: /server_info)
    before, after = ({k: v[i] for k, v in run.server_info_calls.items()} for i in (0, 1))
    assert {k: after[k] - before[k] for k in "ABC"} == {"A": 1, "B": 0, "C": 1}, run.server_info_calls


def test_a_foreign_critical_alert_never_reaches_the_fuse(run):
    assert run.foreign, "Alertmanager lost the foreign alert"
    assert all({r["name"] for r in a["receivers"]} == {"null"} for a in run.foreign), run.foreign
    assert not [b for _m, _p, b, _to in run.proxied if FOREIGN["alertname"].encode() in b]
    assert not [row for row in run.audit if FOREIGN["alertname"] in json.dumps(row, default=str)]
    # while the fuse did receive fusebox's own notifications through the Service
    assert any(b"fuse_action" in b for _m, _p, b, _to in run.proxied)


def test_prometheus_found_the_charts_alertmanager_through_the_operators_relabelling(run):
    # the alertmanager-operated Service selects the same pod; the operator keeps the chart's Service only
    assert run.alertmanagers == [f"http://{run.am_address}/api/v2/alerts"], run.alertmanagers


def test_both_replicas_took_notifications_and_share_one_state_in_postgresql(run):
    hooks = [to for m, p, _b, to in run.proxied if m == "POST" and p == "/alertmanager"]
    ips = {ip: name for name, ip in run.pod_ips.items()}
    assert {ips[to.rsplit(":", 1)[0]] for to in hooks if to} == set(run.pod_ips), hooks
    # one decision per change in the shared audit, whichever replica took the notification
    decided = sorted((row[0], row[2]) for row in run.audit if row[0] in ("trip", "release"))
    assert decided == sorted([("trip", lv) for lv in EXPECTED] + [("release", lv) for lv in EXPECTED]), run.audit


def test_gpu_bs_warning_goes_to_the_people_and_only_as_criticals_mute_it(run):
    """Every fusebox alert carries the namespace on the operator path (so its route takes it), so
    the chart's default inhibit rule (critical mutes warning|info with equal namespace and
    alertname) mutes GPU B's warning while GPU A's critical of the same alert fires: that, and
    nothing else (docs/alertmanager.md)."""
    both = 0
    for _t, alerts in run.am_snapshots:
        mem = [a for a in alerts if a["labels"].get("alertname") == "GPUMemoryUtilizationHigh"]
        a_crit = {a["fingerprint"] for a in mem if a["labels"].get("hw_id") == GPU_A
                  and a["labels"]["severity"] == "critical"}
        b_warn = [a for a in mem if a["labels"].get("hw_id") == GPU_B and a["labels"]["severity"] == "warning"]
        for b in b_warn:
            assert {r["name"] for r in b["receivers"]} == {HUMAN_RECEIVER}, b  # the people, never the fuse
            assert set(b["status"]["inhibitedBy"]) <= a_crit, (b, a_crit)
        if a_crit and b_warn:
            both += 1
        assert not [a for a in mem if a["labels"].get("hw_id") == GPU_B and a["labels"]["severity"] == "critical"]
    assert both >= 5, "GPU A's critical and GPU B's warning were never active together"


def test_no_pod_wrote_the_password_and_no_fuse_replica_an_error(run):
    for name, log in run.logs.items():
        assert PASSWORD not in log, name
    for name in (f"{C.K8S['fuse']}-0", f"{C.K8S['fuse']}-1"):
        assert " ERROR " not in run.logs[name], run.logs[name][-3000:]


def _tail(run: Run) -> str:
    return "\n".join(f"--- {k}\n{v[-1500:]}" for k, v in run.logs.items())

