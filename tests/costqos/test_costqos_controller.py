"""The COST-QoS controller run for real: ``fusebox costqos run`` against a real API server
(etcd + kube-apiserver v1.37.2, RBAC on, the controller logged in as the ServiceAccount its
manifests bind to their ClusterRole) and a real Prometheus (Debian's 2.42) holding the workload's
history (tests/_costqos_support.py: backfilled with ``promtool tsdb create-blocks-from
openmetrics``), scraping the controller's /metrics and evaluating the alert expression of issue
38's contract (``max by (namespace, policy)(fusebox_costqos_qos_unmet) == 1``; ``for: 5s`` here in
place of the generated alert's 5m, whose boundary the promtool test below checks).

Three policies over the same history, differing in budget only (1.00, 0.70, 0.10 USD/h); their
status must show the frontier and the choice worked out by hand in tests/_costqos_support.py.
Then Prometheus is stopped: MetricsAvailable goes False, the last choice stays in the status and
on /metrics.
"""

from __future__ import annotations

import os
import ssl
import string
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import yaml
from _costqos_support import CHOICES, FRONTIER, QOS, openmetrics
from _kube_support import ControlPlane, Proc, wait_until
from _support import need
from prometheus_client.parser import text_string_to_metric_families

from fusebox.tooling import free_port

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "fusebox" / "data"
NS, CTL_NS = "inference", "monitoring"
NAMES = ("kube_deployment_spec_replicas", "workload_request_p95_latency_seconds", "workload_request_error_ratio")
LABELS = 'namespace="inference",deployment="vllm-llava"'
POLICIES = {"fits": "1.00", "capped": "0.70", "broke": "0.10"}
ALERT = "CostQoSBudgetCannotMeetQoS"
ALERT_EXPR = "max by (namespace, policy)(fusebox_costqos_qos_unmet) == 1"
INTERVAL_S = 2


def controller_manifests(namespace: str, prometheus_url: str) -> list[dict]:
    """fusebox/data/costqos-controller.yaml with its placeholders filled, as the generator does."""
    text = string.Template((DATA / "costqos-controller.yaml").read_text()).substitute(
        namespace=namespace, image="ghcr.io/example/fusebox:test", pull_policy="IfNotPresent",
        prometheus_url=prometheus_url, interval="30", step="60")
    return [d for d in yaml.safe_load_all(text) if d]


def policy(name: str, budget: str) -> dict:
    sel = "{" + LABELS + "}"
    return {"apiVersion": "fusebox.dev/v1alpha1", "kind": "CostQoSScalingPolicy", "metadata": {"name": name, "namespace": NS},
            "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-llava"},
                     "costBudget": budget, "qosConstraints": dict(QOS), "replicas": {"min": 1, "max": 8},
                     "pricePerReplicaHour": "0.21", "lookback": "6h",
                     "metrics": {"replicas": f"max({NAMES[0]}{sel})", "p95LatencySeconds": f"{NAMES[1]}{sel}",
                                 "errorRatio": f"{NAMES[2]}{sel}"}}}


class Run:
    cp: ControlPlane
    prom: Proc
    prom_url: str
    ctl: Proc
    metrics_url: str
    manifests: list[dict]


def _sa_kubeconfig(cp: ControlPlane, path: Path) -> None:
    """A kubeconfig holding a token of the controller's ServiceAccount (TokenRequest)."""
    from kubernetes import client, config

    core = client.CoreV1Api(config.new_client_from_config(config_file=str(cp.kubeconfig)))
    tok = core.create_namespaced_service_account_token("fusebox-costqos", CTL_NS, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "test", "cluster": {"server": cp.server, "certificate-authority": str(cp.ca)}}],
        "users": [{"name": "sa", "user": {"token": tok}}],
        "contexts": [{"name": "sa", "context": {"cluster": "test", "user": "sa"}}]}))
    path.chmod(0o600)


def _start_prometheus(root: Path, data: Path, ctl_port: int) -> tuple[Proc, str]:
    port = free_port()
    (root / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "costqos", "interval": "1s", "rules": [
        {"alert": ALERT, "expr": ALERT_EXPR, "for": "5s", "labels": {"severity": "warning"}}]}]}))
    (root / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(root / "rules.yml")],
        "scrape_configs": [{"job_name": "costqos", "honor_labels": True,
                            "static_configs": [{"targets": [f"127.0.0.1:{ctl_port}"]}]}]}))
    proc = Proc("prometheus", [need("prometheus", "install Debian's prometheus package (`make tools`)"),
                               f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={data}",
                               f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y",
                               "--log.level=warn"], root / "prometheus.log")
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: _ok(url + "/-/ready"), 60, "Prometheus ready", alive=proc.check, why=proc.tail)
    return proc, url


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("costqos")
    promtool = need("promtool", "install Debian's prometheus package (`make tools`)")
    res = Run()
    with ExitStack() as stack:
        cp = res.cp = ControlPlane(root / "cp", authorization="RBAC")
        stack.callback(cp.close)
        cp.start()
        cp.install_crds()  # the Prometheus Operator's: the PodMonitor is checked against its schema
        crd = yaml.safe_load((DATA / "costqos-crd.yaml").read_text())
        cp.apply(crd)
        wait_until(lambda: any(c["type"] == "Established" and c["status"] == "True" for c in
                               ((cp.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", crd["metadata"]["name"]) or {})
                                .get("status") or {}).get("conditions") or []), 60, "the CRD Established")
        cp.client.resources.invalidate_cache()
        for ns in (NS, CTL_NS):
            cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

        # the history: 126 one-minute samples ending two minutes ago
        start = int(time.time()) - 128 * 60
        (root / "history.om").write_text(openmetrics(start, NAMES, LABELS))
        r = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(root / "history.om"), str(root / "tsdb")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        ctl_port = free_port()
        res.metrics_url = f"http://127.0.0.1:{ctl_port}/metrics"
        res.prom, res.prom_url = _start_prometheus(root, root / "tsdb", ctl_port)
        stack.callback(res.prom.stop)

        # the controller's manifests (every object applied; the Deployment is not run: no kubelet),
        # and the controller run as their ServiceAccount
        res.manifests = controller_manifests(CTL_NS, res.prom_url)
        for doc in res.manifests:
            cp.apply(doc)
        _sa_kubeconfig(cp, root / "sa.kubeconfig")
        res.ctl = Proc("controller", [sys.executable, "-m", "fusebox.cli", "costqos", "run", "--prometheus", res.prom_url,
                                      "--listen", f"127.0.0.1:{ctl_port}", "--namespace", NS, "--kubeconfig",
                                      str(root / "sa.kubeconfig"), "--interval", str(INTERVAL_S), "--step", "60"],
                       root / "controller.log", env={**os.environ, "PYTHONUNBUFFERED": "1"})
        stack.callback(res.ctl.stop)
        wait_until(lambda: _ok(res.metrics_url), 60, "the controller's /metrics", alive=res.ctl.check, why=res.ctl.tail)
        for name, budget in POLICIES.items():
            cp.apply(policy(name, budget))
        yield res


def status(run: Run, name: str, pred=lambda s: "choice" in s, timeout: float = 60) -> dict:
    def get():
        s = (run.cp.get("fusebox.dev/v1alpha1", "CostQoSScalingPolicy", name, NS) or {}).get("status") or {}
        return s if pred(s) else None

    return wait_until(get, timeout, f"policy {name}'s status", alive=run.ctl.check, why=run.ctl.tail)


def conditions(s: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in s.get("conditions") or []}


def published(run: Run) -> dict[tuple[str, str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(run.metrics_url, timeout=5).text):
        for s in fam.samples:
            if s.name in ("fusebox_costqos_desired_replicas", "fusebox_costqos_qos_unmet"):
                out[(s.name, s.labels["namespace"], s.labels["policy"])] = s.value
    return out


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_status_shows_the_frontier_and_the_choice_worked_out_by_hand(run, name):
    s = status(run, name)
    got = [(f["replicas"], f["costPerHour"], f["p95LatencyMs"], f["errorRatePct"]) for f in s["frontier"]]
    assert got == [pytest.approx(f, abs=1e-6) for f in FRONTIER]
    replicas, usd, reason, unmet = CHOICES[POLICIES[name]]
    assert s["choice"] == {"replicas": replicas, "costPerHour": usd, "reason": reason}
    assert s["observedGeneration"] == 1
    cond = conditions(s)
    assert cond["QoSMet"][0] == ("False" if unmet else "True")
    assert cond["BudgetCapped"] == (("True", reason) if unmet else ("False", "WithinBudget"))
    assert cond["MetricsAvailable"] == ("True", "Read")
    got_pub = wait_until(lambda: (p := published(run)).get(("fusebox_costqos_desired_replicas", NS, name)) is not None and p,
                         30, "the published choice")
    assert got_pub[("fusebox_costqos_desired_replicas", NS, name)] == replicas
    assert got_pub[("fusebox_costqos_qos_unmet", NS, name)] == unmet


def test_a_budget_that_cannot_meet_the_qos_fires_the_alert_for_that_policy_only(run):
    status(run, "capped")

    def firing():
        body = httpx.get(run.prom_url + "/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        got = {(a["labels"]["namespace"], a["labels"]["policy"]) for a in body if a["labels"]["alertname"] == ALERT
               and a["state"] == "firing"}
        return got if len(got) == 2 else None

    # 0.70 USD/h caps at 3 replicas, 0.10 at replicas.min; 1.00 meets the QoS with 4
    assert wait_until(firing, 60, f"{ALERT} firing", why=run.prom.tail) == {(NS, "capped"), (NS, "broke")}


def test_the_printer_columns_show_the_choice_and_the_budget(run):
    status(run, "fits")
    r = httpx.get(f"{run.cp.server}/apis/fusebox.dev/v1alpha1/namespaces/{NS}/costqosscalingpolicies/fits",
                  headers={"Authorization": f"Bearer {run.cp.token}", "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
                  verify=ssl.create_default_context(cafile=str(run.cp.ca)), timeout=10)
    table = r.json()
    cols = [c["name"] for c in table["columnDefinitions"]]
    row = dict(zip(cols, table["rows"][0]["cells"], strict=True))
    assert (row["Choice"], row["Cost/h"], row["Budget"], row["QoS"]) == (4, 0.84, "1.00", "True")


def test_a_budget_is_a_decimal_string_or_a_whole_number_and_anything_else_is_refused_naming_the_field(run):
    from kubernetes.client.exceptions import ApiException

    for ok, value in (("whole", 1), ("string", "0.42")):
        doc = policy(f"ok-{ok}", "1.00")
        doc["spec"]["costBudget"] = value
        assert run.cp.apply(doc)["spec"]["costBudget"] == value
        run.cp.client.delete(run.cp.resource("fusebox.dev/v1alpha1", "CostQoSScalingPolicy"), name=f"ok-{ok}", namespace=NS)
    for bad in (0.42, -1, "cheap", "0,42"):
        doc = policy("bad", "1.00")
        doc["spec"]["costBudget"] = bad
        with pytest.raises(ApiException) as e:
            run.cp.apply(doc)
        assert e.value.status == 422 and "spec.costBudget" in e.value.body, (bad, e.value.body)


def test_the_controller_writes_status_only_and_no_replicas(run):
    """Its ClusterRole: the policies and their status, events, discovery; nothing under apps/."""
    role = next(d for d in run.manifests if d["kind"] == "ClusterRole")
    groups = {g for rule in role["rules"] for g in rule["apiGroups"]}
    assert "apps" not in groups and "autoscaling" not in groups
    assert {r for rule in role["rules"] for r in rule["resources"]} == {
        "costqosscalingpolicies", "costqosscalingpolicies/status", "events", "customresourcedefinitions", "namespaces"}


@pytest.mark.parametrize("query,reason,words", [
    ("max(", "QueryFailed", "bad_data"),
    ('{__name__=~"workload_request_.*"}', "NotOneSeries", "returned 2 series -- aggregate it to one, e.g. max(...)"),
    ('max(kube_deployment_spec_replicas{deployment="none"})', "NoSamples", "no samples in the last 21600 s"),
])
def test_an_unusable_query_is_metrics_unavailable_with_the_reason_and_no_choice(run, query, reason, words):
    name = f"bad-{reason.lower()}"
    doc = policy(name, "1.00")
    doc["spec"]["metrics"]["replicas"] = query
    run.cp.apply(doc)
    s = status(run, name, pred=lambda s: "MetricsAvailable" in conditions(s))
    assert conditions(s)["MetricsAvailable"] == ("False", reason)
    assert words in next(c["message"] for c in s["conditions"] if c["type"] == "MetricsAvailable")
    assert "choice" not in s and "frontier" not in s
    assert ("fusebox_costqos_desired_replicas", NS, name) not in published(run)


def test_a_spec_change_is_a_new_choice_and_a_deleted_policy_takes_its_series_along(run):
    run.cp.apply(policy("moving", "1.00"))
    assert status(run, "moving")["choice"]["replicas"] == 4
    run.cp.apply(policy("moving", "0.70"))
    s = status(run, "moving", pred=lambda s: s.get("observedGeneration") == 2)
    assert s["choice"] == {"replicas": 3, "costPerHour": 0.63, "reason": "BudgetCapped"}
    wait_until(lambda: published(run).get(("fusebox_costqos_qos_unmet", NS, "moving")) == 1, 30, "moving's qos_unmet 1")
    run.cp.client.delete(run.cp.resource("fusebox.dev/v1alpha1", "CostQoSScalingPolicy"), name="moving", namespace=NS)
    wait_until(lambda: not {k for k in published(run) if k[2] == "moving"}, 30, "moving's series gone", alive=run.ctl.check,
               why=run.ctl.tail)


@pytest.mark.process  # it connects to a closed loopback port
def test_metrics_unavailable_after_a_restart_publishes_the_choice_the_status_holds():
    """A controller that starts while Prometheus is down has nothing of its own to publish: it
    publishes the status' last choice (and qos_unmet from BudgetCapped) rather than nothing."""
    import asyncio

    from prometheus_client import CollectorRegistry

    from fusebox.costqos.controller import Controller, ControllerMetrics

    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    ctl = Controller(f"http://127.0.0.1:{free_port()}", 60, metrics, timeout_s=5)  # nothing listens there
    old = {"choice": {"replicas": 3, "costPerHour": 0.63, "reason": "BudgetCapped"},
           "conditions": [{"type": "BudgetCapped", "status": "True", "reason": "BudgetCapped", "message": "",
                           "lastTransitionTime": "2026-12-05T00:00:00Z"}]}

    async def once():
        try:
            return await ctl.reconcile(NS, "restarted", 7, policy("restarted", "0.70")["spec"], old)
        finally:
            await ctl.close()

    r = asyncio.run(once())
    assert r.published == 3 and metrics.published(NS, "restarted") == 3
    assert registry.get_sample_value("fusebox_costqos_qos_unmet", {"namespace": NS, "policy": "restarted"}) == 1
    assert "choice" not in r.status and r.status["observedGeneration"] == 7
    assert conditions(r.status) == {"BudgetCapped": ("True", "BudgetCapped"), "MetricsAvailable": ("False", "PrometheusUnreachable")}


def test_the_controller_started_quietly_against_a_live_api_server_and_prometheus(run):
    """Both up at start: the API server answered the first GET /version and the first query
    succeeded, so neither start-up check said a word."""
    status(run, "fits")  # it has worked a round
    log = run.ctl.log.read_text(errors="replace")
    assert "API server" not in log and "the first query failed" not in log, log[-3000:]


def test_an_api_server_that_refuses_the_credentials_still_counts_as_up(run, tmp_path):
    """GET /version with a token the API server does not know: 401 is an answer (the server is up,
    kopf reports the credentials' trouble), so the wait ends at the first attempt."""
    from fusebox.costqos.preflight import kube_client, wait_for_api

    kc = yaml.safe_load(run.cp.kubeconfig.read_text())
    for u in kc["users"]:
        u["user"] = {"token": "not-a-token-of-this-cluster"}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kc))
    api, host = kube_client(str(tmp_path / "kubeconfig"))
    try:
        assert host == run.cp.server
        assert wait_for_api(api, host, wait_s=5, sleep=lambda s: pytest.fail(f"it waited {s} s for a live server")) == 1
    finally:
        api.close()


def test_prometheus_stopped_is_metrics_unavailable_and_the_last_choice_stays(run):
    """Last in the module: it stops Prometheus."""
    before = status(run, "fits")
    run.prom.stop()
    s = status(run, "fits", pred=lambda s: conditions(s).get("MetricsAvailable", ("", ""))[0] == "False")
    assert conditions(s)["MetricsAvailable"] == ("False", "PrometheusUnreachable")
    assert s["choice"] == before["choice"] == {"replicas": 4, "costPerHour": 0.84, "reason": "CheapestMeetingQoS"}
    assert s["frontier"] == before["frontier"]
    msg = next(c["message"] for c in s["conditions"] if c["type"] == "MetricsAvailable")
    assert run.prom_url in msg
    time.sleep(INTERVAL_S * 2)  # more rounds without Prometheus: still published
    pub = published(run)
    assert pub[("fusebox_costqos_desired_replicas", NS, "fits")] == 4
    assert pub[("fusebox_costqos_desired_replicas", NS, "capped")] == 3
    assert pub[("fusebox_costqos_qos_unmet", NS, "capped")] == 1
    assert 'fusebox_costqos_metrics_errors_total{reason="PrometheusUnreachable"}' in httpx.get(run.metrics_url, timeout=5).text


PROMTOOL_TEST = """
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'fusebox_costqos_qos_unmet{namespace="inference",policy="capped",instance="a"}'
        values: '0 1x10'
      - series: 'fusebox_costqos_qos_unmet{namespace="inference",policy="fits",instance="a"}'
        values: '0x10'
    alert_rule_test:
      - {eval_time: 5m, alertname: %(alert)s, exp_alerts: []}
      - eval_time: 6m
        alertname: %(alert)s
        exp_alerts:
          - exp_labels: {namespace: inference, policy: capped, severity: warning}
"""


def test_the_contracts_alert_expression_fires_after_5m_of_qos_unmet_under_promtool(tmp_path):
    """The generated alert's shape (scaling-gen's: expression and for: 5m) under promtool: unmet from
    minute 1, pending until 5 minutes have passed (minute 6), only for the policy whose value is 1."""
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "costqos", "rules": [
        {"alert": ALERT, "expr": ALERT_EXPR, "for": "5m", "labels": {"severity": "warning"}}]}]}))
    (tmp_path / "test.yml").write_text(PROMTOOL_TEST % {"alert": ALERT})
    r = subprocess.run([need("promtool", "install Debian's prometheus package (`make tools`)"), "test", "rules", "test.yml"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr

