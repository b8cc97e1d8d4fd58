"""What `fusebox generate` derives from the spec's ``scaling:`` section (generator/render_scaling.py),
what `fusebox budget` says of its scale-out and what `fusebox check` says of its order.

Expected numbers are worked out here from the shipped spec's YAML: KV growth's safe level 9.2 MB/s
and trip 14.7 MB/s, scrape and evaluation 5 s, the slow interval 30 s, KEDA's polling 15 s, the
HPA's sync 15 s and scale-up stabilization 0 s, pod_start 90 s, the budget's 52 GiB pool at 90 %."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from _cli import run_cli
from _support import SPEC, promtools, yaml_text

from fusebox import conventions as C
from fusebox.generator import render_scaling
from fusebox.generator.budget import scaling_rows
from fusebox.generator.cli import run_scaling_check
from fusebox.generator.outputs import render_all, spec_warnings
from fusebox.spec import parse_spec
from fusebox.spec.scaling import order_problems

TEXT = SPEC.read_text()
SHIPPED = parse_spec(TEXT, "fusebox.yaml")
KEDA_CRD = Path(__file__).parents[1] / "fixtures" / "k8s" / "keda" / "keda.sh_scaledobjects.yaml"
OUR_CRD = Path(__file__).parents[2] / "fusebox" / "data" / "costqos-crd.yaml"
SCALING_FILES = {"k8s/scaling.yml", "k8s/costqos-crd.yml", "k8s/costqos-policies.yml", "k8s/costqos-controller.yml",
                 "runbooks/CostQoSBudgetCannotMeetQoS.md"}

# The budget's figures: the KV pool's free part at 90 % over the critical growth.
FREE = 52 * 2**30 * (1 - 0.9)  # 5,583,457,484.8 B
KV_TIME_LEFT = FREE / 14.7e6  # 379.827 s


def _edited(edit) -> str:
    data = yaml.safe_load(TEXT)
    edit(data)
    return yaml_text(data, sort_keys=False)


def _schema(crd_path: Path) -> dict:
    """The CRD's v1alpha1 schema, strict like the API server's field validation (tests/k8s's helper)."""
    from test_k8s_manifests import _strict

    crd = next(d for d in yaml.safe_load_all(crd_path.read_text()) if d)
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return _strict(v["schema"]["openAPIV3Schema"])


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


# ------------------------------------------------------------------------------- objects
def test_the_shipped_scaledobject_scales_on_the_load_and_the_policys_choice():
    out = render_all(SHIPPED)
    (so,) = _docs(out["k8s/scaling.yml"])
    assert (so["apiVersion"], so["kind"], so["metadata"]["name"], so["metadata"]["namespace"]) == (
        "keda.sh/v1alpha1", "ScaledObject", "llava-7b", "inference")
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-llava"}
    assert (spec["pollingInterval"], spec["cooldownPeriod"], spec["minReplicaCount"], spec["maxReplicaCount"]) == (15, 300, 1, 8)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == {
        "scaleUp": {"stabilizationWindowSeconds": 0}, "scaleDown": {"stabilizationWindowSeconds": 300}}
    load, choice = spec["triggers"]
    assert load == {"type": "prometheus", "name": "scaling-load", "metricType": "AverageValue", "metadata": {
        "serverAddress": "http://prometheus-operated.monitoring.svc:9090", "query": 'fusebox:scaling_load:ratio{workload="llava-7b"}',
        "threshold": "1", "ignoreNullValues": "false"}}
    assert choice["metadata"]["query"] == 'max(fusebox_costqos_desired_replicas{namespace="inference",policy="llava-7b"})'
    assert (choice["metricType"], choice["metadata"]["threshold"]) == ("AverageValue", "1")
    jsonschema.validate(so, _schema(KEDA_CRD), cls=jsonschema.Draft4Validator)  # KEDA v2.21.0's own CRD


def test_keda_v2_21s_schema_refuses_a_broken_scaledobject():
    """Not vacuous: a misspelt field and a replica count that is no integer fail its CRD's schema."""
    (so,) = _docs(render_all(SHIPPED)["k8s/scaling.yml"])
    schema = _schema(KEDA_CRD)
    typo = copy.deepcopy(so)
    typo["spec"]["maxReplicas"] = typo["spec"].pop("maxReplicaCount")
    bad = copy.deepcopy(so)
    bad["spec"]["minReplicaCount"] = "one"
    for doc in (typo, bad):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema, cls=jsonschema.Draft4Validator)


def test_with_hpa_enabled_the_hpas_are_autoscaling_v2_on_the_external_metrics():
    def hpa(d):
        d["scaling"]["keda"]["enabled"] = False
        d["scaling"]["hpa"]["enabled"] = True
    out = render_all(parse_spec(_edited(hpa), "fusebox.yaml"))
    (h,) = _docs(out["k8s/scaling.yml"])
    kubernetes_validate.validate(h, "1.32.0", strict=True)  # autoscaling/v2's shape
    assert (h["kind"], h["spec"]["minReplicas"], h["spec"]["maxReplicas"]) == ("HorizontalPodAutoscaler", 1, 8)
    assert [m["external"]["metric"] for m in h["spec"]["metrics"]] == [
        {"name": "fusebox_scaling_load_ratio", "selector": {"matchLabels": {"workload": "llava-7b"}}},
        {"name": "fusebox_costqos_desired_replicas", "selector": {"matchLabels": {"namespace": "inference", "policy": "llava-7b"}}}]
    assert {m["external"]["target"]["averageValue"] for m in h["spec"]["metrics"]} == {"1"}
    bad = copy.deepcopy(h)
    bad["spec"]["metrics"][0]["external"]["target"]["type"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.32.0", strict=True)


def test_the_policy_carries_the_seeds_figures_and_fits_the_crd():
    out = render_all(SHIPPED)
    (p,) = _docs(out["k8s/costqos-policies.yml"])
    assert (p["apiVersion"], p["kind"], p["metadata"]["namespace"]) == ("fusebox.dev/v1alpha1", "CostQoSScalingPolicy", "inference")
    s = p["spec"]
    assert (s["costBudget"], s["pricePerReplicaHour"], s["qosConstraints"]) == ("0.42", "0.21", {"p95LatencyMs": 200, "errorRatePct": 0.5})
    assert s["replicas"] == {"min": 1, "max": 8} and s["lookback"] == "6h"
    assert s["metrics"]["replicas"] == 'max(kube_deployment_spec_replicas{namespace="inference",deployment="vllm-llava"})'
    jsonschema.validate(p, _schema(OUR_CRD), cls=jsonschema.Draft4Validator)
    (crd,) = _docs(out["k8s/costqos-crd.yml"])
    names = crd["spec"]["names"]
    assert (crd["spec"]["group"], names["kind"], names["plural"], names["shortNames"], crd["spec"]["scope"]) == (
        "fusebox.dev", "CostQoSScalingPolicy", "costqosscalingpolicies", ["cqsp"], "Namespaced")
    kubernetes_validate.validate(crd, "1.32.0", strict=True)


@pytest.mark.tools
def test_the_policys_queries_read_one_replica_series_and_only_the_targets_own_pods(tmp_path):
    """Hand-written series, evaluated by promtool's PromQL engine: kube-state-metrics twice (an HA
    pair: two series of 3 replicas for vllm-llava) and a vllm-llava-13b Deployment at 5; HTTP
    counters of vllm-llava's pod vllm-llava-7d9f8b6c5-x2x4q (1 req/s, 0.1 of them 5xx) and of
    vllm-llava-13b's pod vllm-llava-13b-5c6d7f8b9-abcde (1 req/s, all 5xx). replicas reads one
    series, 3; the error ratio is vllm-llava's alone: 0.1 (with ``vllm-llava-.*`` it was
    (0.1 + 1) / 2 = 0.55). A StatefulSet's pods are NAME-ORDINAL: vllm-llava-0, not vllm-llava-13b-0."""
    (p,) = _docs(render_all(SHIPPED)["k8s/costqos-policies.yml"])
    m = p["spec"]["metrics"]
    ksm = [{"series": f'kube_deployment_spec_replicas{{namespace="inference",deployment="{d}",instance="ksm-{i}:8080"}}',
            "values": f"{n}x40"} for i in (0, 1) for d, n in (("vllm-llava", 3), ("vllm-llava-13b", 5))]
    http = []
    for pod, ok, bad in (("vllm-llava-7d9f8b6c5-x2x4q", 54, 6), ("vllm-llava-13b-5c6d7f8b9-abcde", 0, 60)):
        for status, per_min in (("2xx", ok), ("5xx", bad)):  # per scrape of 1 m: per_min requests
            if per_min:
                http.append({"series": f'http_requests_total{{namespace="inference",pod="{pod}",status="{status}"}}',
                             "values": f"0+{per_min}x40"})
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": ksm + http, "promql_expr_test": [
            {"expr": m["replicas"], "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 3}]},
            {"expr": m["errorRatio"], "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 0.1}]}]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    for promtool in promtools():
        r = subprocess.run([promtool, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, promtool + r.stdout + r.stderr
    sts = dataclasses.replace(SHIPPED.scaling.workloads[0], target_kind="StatefulSet")
    assert render_scaling.pod_regex(sts) == "vllm-llava-[0-9]+"
    assert render_scaling.pod_regex(dataclasses.replace(sts, target_name="llava.v1")) == "llava\\\\.v1-[0-9]+"


def test_the_controller_runs_in_the_specs_namespace_on_the_scalers_prometheus():
    """fusebox/data/costqos-controller.yaml filled in: kubernetes.namespace (monitoring), the image
    fusebox:0.1.0, scaling.prometheus_address, the controller's own 30 s interval and 60 s step."""
    docs = {d["kind"]: d for d in _docs(render_all(SHIPPED)["k8s/costqos-controller.yml"])}
    assert set(docs) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "PodMonitor"}
    dep = docs["Deployment"]
    assert dep["metadata"]["namespace"] == "monitoring"
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert (c["image"], c["imagePullPolicy"]) == ("fusebox:0.1.0", "IfNotPresent")
    assert c["args"] == ["costqos", "run", "--prometheus", "http://prometheus-operated.monitoring.svc:9090", "--listen",
                         "0.0.0.0:8080", "--all-namespaces", "--interval", "30", "--step", "60"]
    assert docs["ClusterRoleBinding"]["subjects"] == [{"kind": "ServiceAccount", "name": "fusebox-costqos", "namespace": "monitoring"}]
    kubernetes_validate.validate(dep, "1.32.0", strict=True)


def test_without_scaling_nothing_of_it_is_generated_and_the_rest_is_unchanged():
    shipped = render_all(SHIPPED)
    plain = render_all(parse_spec(_edited(lambda d: d.pop("scaling")), "fusebox.yaml"))
    assert set(shipped) - set(plain) == SCALING_FILES
    for path in ("rules/fusebox.rules.yml", "rules/fusebox.rules.test.yml", "k8s/prometheusrule.yml"):
        assert "scaling" not in plain[path] and C.COSTQOS_ALERT not in plain[path], path
    assert "scaling.yml" not in plain["k8s/kustomization.yaml"]
    # the rules differ by the scaling rules alone: drop them from the shipped groups and they match
    shipped_groups = yaml.safe_load(shipped["rules/fusebox.rules.yml"])["groups"]
    for g in shipped_groups:
        g["rules"] = [r for r in g["rules"] if r.get("record") not in (C.SCALING_LOAD, C.SCALING_SIGNAL_LOAD)
                      and r.get("alert") != C.COSTQOS_ALERT]
    assert [g for g in shipped_groups if g["rules"]] == yaml.safe_load(plain["rules/fusebox.rules.yml"])["groups"]


# ------------------------------------------------------------------------------- records
def test_each_load_record_sits_beside_the_value_it_reads():
    groups = {g["name"]: g for g in yaml.safe_load(render_all(SHIPPED)["rules/fusebox.rules.yml"])["groups"]}
    kv = groups["fusebox-kv_cache_growth_rate"]
    (rule,) = [r for r in kv["rules"] if r.get("record") == C.SCALING_SIGNAL_LOAD]
    assert rule["labels"] == {"workload": "llava-7b", "signal": "kv_cache_growth_rate"}
    assert rule["expr"] == ('sum(max by (cluster, host_name, engine, model) (clamp_min(engine:fusebox_kv_cache_usage_bytes:deriv1m'
                            '{model="llava-hf/llava-1.5-7b-hf"}, 0) >= 0)) / 9200000')
    assert kv["interval"] == "5s"
    # the workload's load: in the alignment P95's panels group (30 s), which reads the KV one from a 5 s group
    panels = groups["fusebox-alignment_latency_p95-panels"]
    assert panels["interval"] == "30s"
    assert {"record": C.SCALING_LOAD, "expr": 'max by (workload) (fusebox:scaling_signal_load:ratio{workload="llava-7b"})'} in panels["rules"]
    assert [r["alert"] for r in groups["fusebox-scaling"]["rules"]] == [C.COSTQOS_ALERT]


@pytest.mark.tools
def test_two_replicas_at_1_11_times_the_safe_level_read_load_2_22_under_promtool(tmp_path):
    """Hand-written: engines 0 and 1 of the model grow their KV bytes at 10.212 MB/s (1.11 x 9.2 MB/s),
    an engine of another model at 46 MB/s: load 2 x 1.11 = 2.22, ceil 3 replicas; a trip-threshold
    set point would read 2 x 10.212 / 14.7 = 1.389. The record is in the 30 s group: read at 90 s."""
    rules = tmp_path / "fusebox.rules.yml"
    rules.write_text(render_all(SHIPPED)["rules/fusebox.rules.yml"])
    lab = 'cluster="test", host_name="h", instance="h:9464", job="fusebox-kv"'
    series = [{"series": f'fusebox_kv_cache_usage_bytes{{{lab}, engine="e{i}", model="llava-hf/llava-1.5-7b-hf"}}',
               "values": "1000000000+51060000x30"} for i in range(2)]  # 10.212 MB/s x 5 s = 51.06 MB a scrape
    series.append({"series": f'fusebox_kv_cache_usage_bytes{{{lab}, engine="e9", model="other"}}', "values": "0+230000000x30"})
    test = {"rule_files": [rules.name], "evaluation_interval": "5s", "tests": [{
        "interval": "5s", "input_series": series, "promql_expr_test": [
            {"expr": 'fusebox:scaling_load:ratio{workload="llava-7b"}', "eval_time": "90s",
             "exp_samples": [{"labels": 'fusebox:scaling_load:ratio{workload="llava-7b"}', "value": 2.22}]},
            {"expr": 'fusebox:scaling_signal_load:ratio{signal="kv_cache_growth_rate"}', "eval_time": "90s",
             "exp_samples": [{"labels": 'fusebox:scaling_signal_load:ratio{signal="kv_cache_growth_rate",workload="llava-7b"}',
                              "value": 2.22}]}]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    for promtool in promtools():
        r = subprocess.run([promtool, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, promtool + r.stdout + r.stderr


@pytest.mark.tools
def test_the_generated_cases_fail_on_rules_whose_set_point_is_the_trip_threshold(tmp_path):
    """Not vacuous: the generated cases, run against rules rendered with each driving signal's fuse
    threshold as its set point, fail (load 1.389 instead of 2.22, one replica instead of two)."""
    out = render_all(SHIPPED)
    assert SHIPPED.scaling is not None
    trips = {d.name: min(t.threshold for t in SHIPPED.signal(d.name).tiers if t.fuse)
             for w in SHIPPED.scaling.workloads for d in w.signals}
    wrong = dataclasses.replace(SHIPPED, scaling=dataclasses.replace(SHIPPED.scaling, workloads=tuple(
        dataclasses.replace(w, signals=tuple(dataclasses.replace(d, set_point=trips[d.name]) for d in w.signals))
        for w in SHIPPED.scaling.workloads)))
    (tmp_path / "fusebox.rules.yml").write_text(render_all(wrong)["rules/fusebox.rules.yml"])
    tests = yaml.safe_load(out["rules/fusebox.rules.test.yml"])
    tests["tests"] = [g for g in tests["tests"] if "promql_expr_test" in g and "scaling_load" in str(g["promql_expr_test"])]
    assert len(tests["tests"]) == 4  # two driving signals, two cases each
    (tmp_path / "t.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    r = subprocess.run([promtools()[-1], "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    said = r.stdout + r.stderr
    assert r.returncode == 1, said
    assert 'exp: {workload="llava-7b"} 3E+00\n        got: {workload="llava-7b"} 2E+00' in said, said
    assert 'exp: {workload="llava-7b"} 2E+00\n        got: {workload="llava-7b"} 1E+00' in said, said
    assert "exp: {__name__=\"fusebox:scaling_load:ratio\", workload=\"llava-7b\"} 2.22E+00" in said, said


def _kv_usage_by_pod(d):
    """A vLLM KV usage gauge per pod (by namespace, pod, instance, model; no engine label) driving
    the shipped workload at its safe level 85 %."""
    _kv_usage(d)
    d["signals"]["kv_usage"].update(level="pod", by=["namespace", "pod", "instance", "model"])


@pytest.mark.tools
def test_the_generated_cases_pass_on_a_gauge_whose_by_keeps_no_engine_label(tmp_path):
    """The case's two replicas at 1.11 x 85 % = 94.35 % each must be two series of the gauge's own
    ``by`` (namespace, pod, instance, model): the load is 2 x 1.11 = 2.22, ceil 3. Replicas apart
    only in ``engine``, a label the rule's ``max by`` drops, were one series: load 1.11."""
    spec = parse_spec(_edited(_kv_usage_by_pod), "fusebox.yaml")
    out = render_all(spec)
    (tmp_path / "fusebox.rules.yml").write_text(out["rules/fusebox.rules.yml"])
    tests = yaml.safe_load(out["rules/fusebox.rules.test.yml"])
    tests["tests"] = [g for g in tests["tests"] if "promql_expr_test" in g and "scaling_load" in str(g["promql_expr_test"])]
    two = tests["tests"][0]
    assert [c["exp_samples"][0]["value"] for c in two["promql_expr_test"]] == [2.22, 3]
    ours = [s["series"] for s in two["input_series"] if 'model="llava-hf/llava-1.5-7b-hf"' in s["series"]]
    assert len(ours) == 2 and 'namespace="inference"' in ours[0] and 'namespace="inference"' in ours[1]
    pods = {s.split('pod="')[1].split('"')[0] for s in ours}
    assert len(pods) == 2  # apart in the replica's own labels, not in the namespace they share
    (tmp_path / "t.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    for promtool in promtools():
        r = subprocess.run([promtool, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, promtool + r.stdout + r.stderr


def test_check_fails_a_stale_scaling_manifest_naming_it_and_generate(tmp_path, capsys):
    """k8s/scaling.yml as another spec generates it (KEDA polling 30 s, not the shipped 15 s; as
    after a hand edit, or an edit of the spec's scaling alone): the rules and Alertmanager files are
    as the spec generates them, the ScaledObject is not. The check fails (1) naming that file and
    `fusebox generate`; the files as generated pass."""
    from fusebox.generator.cli import run_fresh_check
    from fusebox.generator.writer import write_outputs

    outputs = render_all(SHIPPED)
    write_outputs(outputs, tmp_path)
    assert run_fresh_check(SHIPPED, tmp_path, "fusebox.yaml") == 0
    assert capsys.readouterr().out == (f"ok   generated files match fusebox.yaml: {len(outputs)} of {len(outputs)} "
                                       "generated files as the spec generates them\n")
    edited = parse_spec(_edited(lambda d: d["scaling"]["keda"].update(polling_interval="30s")), "fusebox.yaml")
    (tmp_path / "k8s/scaling.yml").write_text(render_all(edited)["k8s/scaling.yml"])
    assert "pollingInterval: 30" in (tmp_path / "k8s/scaling.yml").read_text()
    assert run_fresh_check(SHIPPED, tmp_path, "fusebox.yaml") == 1
    out = capsys.readouterr().out
    assert out.startswith(f"FAIL generated files match fusebox.yaml: {len(outputs) - 1} of {len(outputs)} generated files"), out
    assert (f"     {tmp_path / 'k8s/scaling.yml'}: differs from what fusebox.yaml generates -- run `fusebox generate "
            f"--spec fusebox.yaml --out {tmp_path}` first") in out
    assert out.count(" differs ") == 1, out


# -------------------------------------------------------------------------------- budget
def test_the_shipped_scale_out_is_within_the_kv_pools_time():
    (row,) = scaling_rows(SHIPPED)
    # 5 scrape + 30 eval (the load's group) + 5 (the KV load record, from a 5 s group) + 0 lag (Prometheus)
    # + 15 HPA sync (no KEDA polling: the HPA's query reaches the trigger live) + 0 stabilization
    # + 90 pod start = 145 s, against 379.827 s
    assert row.terms == {"scrape": 5.0, "eval": 30.0, "records": 5.0, "lag": 0.0, "sync": 15.0,
                         "stabilization": 0.0, "pod_start": 90.0}
    assert row.path_s == 145.0
    assert row.time_left_s == pytest.approx(KV_TIME_LEFT, abs=1e-6) and round(KV_TIME_LEFT, 3) == 379.827
    assert row.ok and row.margin_s == pytest.approx(234.827, abs=1e-3)


def test_keda_polling_is_on_the_path_only_from_zero_replicas():
    """KEDA's polling loop would be on the path only to activate a workload from 0, which the spec
    refuses (its load comes from its own engines); above 0 the shipped 15 s pollingInterval adds
    nothing: the path stays 145 s, and a slower polling (60 s) leaves it 145 s too."""
    from fusebox.spec import SpecError
    with pytest.raises(SpecError) as e:
        parse_spec(_edited(lambda d: d["scaling"]["workloads"][0]["replicas"].update(min=0)), "fusebox.yaml")
    assert any("replicas.min 0 is under 1" in str(p) and "use min: 1" in str(p) for p in e.value.problems)
    (row,) = scaling_rows(parse_spec(_edited(lambda d: d["scaling"]["keda"].update(polling_interval="60s")), "fusebox.yaml"))
    assert "polling" not in row.terms and row.path_s == 145.0


def test_a_scale_out_slower_than_the_kv_pool_fails_budget_naming_both_numbers(tmp_path):
    """pod_start 400 s: 5 + 30 + 5 + 0 + 15 + 0 + 400 = 455 s, over the 379.827 s the pool has left."""
    spec = tmp_path / "fusebox.yaml"
    spec.write_text(_edited(lambda d: d["scaling"]["workloads"][0].update(pod_start="400s")))
    r = run_cli("budget", "--spec", spec, "--json")
    assert r.code == 1, r.stderr
    doc = json.loads(r.stdout)
    assert not doc["ok"] and doc["scaling"][0]["path_s"] == 455.0
    assert "scale-out of workload 'llava-7b' is late: a new replica is Ready 455 s after" in r.stderr
    assert "the KV pool is full 379.827 s after" in r.stderr
    assert "polling" not in r.stderr  # KEDA's polling is no term of the path: the fix does not name it
    # generate warns of it too, as of the order findings (and still writes: a warning, not a refusal)
    late = [w for w in spec_warnings(parse_spec(spec.read_text(), "fusebox.yaml")) if w.startswith("scale-out of")]
    assert late == [r.stderr.split("fusebox budget: ", 1)[1].strip()], late
    assert "455 s" in late[0] and "379.827 s" in late[0]


def test_a_workloads_path_is_its_own_beside_another_workload():
    """A second workload (llava-13b on its own Deployment) driven by KV growth alone: its load record
    sits in KV growth's 5 s group beside its signal load, so 5 scrape + 5 eval + 0 records + 0 lag
    + 15 sync + 0 stabilization + 90 pod start = 115 s, alone or beside the shipped llava-7b (145 s).
    The signal load's name is recorded for llava-7b in the 30 s alignment group too: matched by name
    alone, llava-13b read it from there (35 s of records, 150 s)."""
    def second(keep_shipped):
        def edit(d):
            w = copy.deepcopy(d["scaling"]["workloads"][0])
            w.update(name="llava-13b", model="llava-hf/llava-1.5-13b-hf", signals=["kv_cache_growth_rate"])
            w.pop("cost_qos")
            w["target"]["name"] = "vllm-llava-13b"
            d["scaling"]["workloads"] = d["scaling"]["workloads"][:1] * keep_shipped + [w]
        return {r.workload: (r.terms, r.path_s) for r in scaling_rows(parse_spec(_edited(edit), "fusebox.yaml"))}
    alone, beside = second(False), second(True)
    terms = {"scrape": 5.0, "eval": 5.0, "records": 0.0, "lag": 0.0, "sync": 15.0, "stabilization": 0.0, "pod_start": 90.0}
    assert alone == {"llava-13b": (terms, 115.0)}
    assert beside["llava-13b"] == (terms, 115.0) and beside["llava-7b"][1] == 145.0


def test_on_vmalert_the_load_is_a_chain_of_three_records_late():
    """The load reads the alignment P95's signal load, which reads its P95, which reads the bucket
    rates, all in the 30 s panels group: vmalert stores it 3 evaluations late, 90 s: 145 + 90 = 235 s."""
    (row,) = scaling_rows(parse_spec(TEXT.replace("rule_engine: prometheus", "rule_engine: victoriametrics"), "fusebox.yaml"))
    assert (row.terms["lag"], row.path_s) == (90.0, 235.0)


def test_plain_hpas_have_no_polling_term():
    def hpa(d):
        d["scaling"]["keda"]["enabled"] = False
        d["scaling"]["hpa"].update(enabled=True, scale_up_stabilization="60s")
    (row,) = scaling_rows(parse_spec(_edited(hpa), "fusebox.yaml"))
    assert "polling" not in row.terms
    assert (row.terms["stabilization"], row.path_s) == (60.0, 5 + 30 + 5 + 0 + 15 + 60 + 90)


# --------------------------------------------------------------------------------- order
def test_the_shipped_scaler_acts_before_its_shedders_and_fuses(capsys):
    assert order_problems(SHIPPED) == []
    assert run_scaling_check(SHIPPED) == 0
    assert capsys.readouterr().out.startswith("ok   fusebox scaling: 1 workload(s), 0 set point(s)")


def test_a_fuse_on_the_same_quantity_at_the_set_point_fails_check(capsys):
    """KV OOM (the same deriv of KV bytes as KV growth) tripping at 9 MB/s, under KV growth's safe
    level 9.2 MB/s: the fuse trips before a replica is added."""
    spec = parse_spec(_edited(lambda d: d["signals"]["kv_cache_growth_oom"]["tiers"]["critical"].update(threshold="9 MB/s")),
                      "fusebox.yaml")
    (p,) = order_problems(spec)
    assert p.startswith("scaling workload 'llava-7b' scales on 'kv_cache_growth_rate' at 9.2 MB/s "
                        "(signals.kv_cache_growth_rate.tiers.warning.threshold), adding a replica above 10.12 MB/s (the HPA's tolerance "
                        "10%: scaling.hpa.tolerance), not before the fuse of KVCacheGrowthOOMImminent "
                        "critical at 9 MB/s (signals.kv_cache_growth_oom.tiers.critical.threshold)")
    assert run_scaling_check(spec) == 1
    assert "fusebox check: scaling workload 'llava-7b'" in capsys.readouterr().err
    assert p in spec_warnings(spec)  # generate says it too


def test_a_shedder_at_the_set_point_fails_check():
    """A vLLM engine bound shedding on KV growth at its default level, the warning tier: 9.2 MB/s is
    not strictly before the scaler's 9.2 MB/s."""
    def shed(d):
        d["inpath"]["shedders"]["kv"] = {"kind": "vllm", "signal": "kv_cache_growth_rate", "idle": "0 MB/s", "per_request": "1 MB/s"}
    spec = parse_spec(_edited(shed), "fusebox.yaml")
    problems = order_problems(spec)
    assert any(p.endswith("10.12 MB/s (the HPA's tolerance 10%: scaling.hpa.tolerance), "
                          "not before inpath.shedders.kv, which sheds at 9.2 MB/s (signals.kv_cache_growth_rate.tiers.warning.threshold): "
                          "the shedder refuses work before a replica is added -- shed above 10.12 MB/s (set point x "
                          "(1 + scaling.hpa.tolerance)): inpath.shedders.kv.shed_at, or scale on another signal") for p in problems), problems
    # shedding above the safe level, under the fuse: in order
    def shed_later(d):
        shed(d)
        d["inpath"]["shedders"]["kv"]["shed_at"] = "12 MB/s"
    assert order_problems(parse_spec(_edited(shed_later), "fusebox.yaml")) == []


def test_the_costqos_alert_has_its_runbook_and_link():
    out = render_all(SHIPPED)
    groups = yaml.safe_load(out["rules/fusebox.rules.yml"])["groups"]
    (alert,) = [r for g in groups for r in g["rules"] if r.get("alert") == C.COSTQOS_ALERT]
    assert (alert["expr"], alert["for"]) == ("max by (namespace, policy) (fusebox_costqos_qos_unmet) == 1", "5m")
    assert alert["annotations"]["runbook_url"] == SHIPPED.runbook_url(C.COSTQOS_ALERT)
    assert "max by (namespace, policy) (fusebox_costqos_qos_unmet) == 1" in out[f"runbooks/{C.COSTQOS_ALERT}.md"]


def test_the_crd_is_one_source():
    assert render_scaling.crd() == next(d for d in yaml.safe_load_all(OUR_CRD.read_text()) if d)


def _kv_usage(d):
    """A KV usage gauge (vLLM's kv_cache_usage_perc, what smg's veto reads), safe level 85 %, driving the workload."""
    d["signals"]["kv_usage"] = {
        "alert": "KVCacheUsageHigh", "description": "Share of KV blocks in use per engine.", "kind": "gauge",
        "unit": "ratio", "level": "engine", "by": ["cluster", "host_name", "engine", "model"],
        "sources": {"vllm": {"metric": "vllm:kv_cache_usage_perc"}},
        "tiers": {"warning": {"threshold": "85%"}, "critical": {"threshold": "95%", "fuse": "kv_cache_eviction"}},
        "runbook": {"symptom": "KV blocks are running out.", "impact": "Preemptions follow."}}
    d["scaling"]["workloads"][0]["signals"] = ["kv_usage"]


def test_smgs_worker_overload_veto_at_the_set_point_fails_check():
    """A KV usage gauge (vLLM's kv_cache_usage_perc, what smg's veto reads) drives the workload at its
    safe level 85 %; the shipped smg gateway's veto, stated by default at that signal's safe level,
    is at 85 % too: smg takes workers out of routing as the scaler starts, not after."""
    spec = parse_spec(_edited(_kv_usage), "fusebox.yaml")
    problems = order_problems(spec)
    assert [p for p in problems if "worker overload veto" in p] == [
        "scaling workload 'llava-7b' scales on 'kv_usage' at 85% (signals.kv_usage.tiers.warning.threshold), adding a replica "
        "above 93.5% (the HPA's tolerance 10%: scaling.hpa.tolerance), not before "
        "inpath.shedders.gateway's worker overload veto at 85% (signals.kv_usage.tiers.warning.threshold): smg takes workers "
        "out of routing before a replica is added -- set the veto above 93.5% (set point x (1 + scaling.hpa.tolerance)): "
        "inpath.shedders.gateway.overload, or scale on another signal"], problems
    # the veto stated above 85% x 1.1 = 93.5%, where the HPA adds a replica, and under the fuse's 95%: in order
    def vetoed_later(d):
        _kv_usage(d)
        d["inpath"]["shedders"]["gateway"]["overload"] = {"token_usage": "94%"}
    assert order_problems(parse_spec(_edited(vetoed_later), "fusebox.yaml")) == []


def test_a_shedder_between_the_set_point_and_the_hpas_tolerance_fails_check():
    """KV growth's safe level 9.2 MB/s: the HPA controller keeps the count until the load passes
    9.2 x (1 + 0.1) = 10.12 MB/s per replica (its default tolerance), so a shedder at 10 MB/s, above
    the set point, still sheds first; at 11 MB/s it is after the scaler; with scaling.hpa.tolerance
    0% (a controller run with --horizontal-pod-autoscaler-tolerance 0) 10 MB/s is in order."""
    def shed_at(level, tolerance=None):
        def edit(d):
            d["inpath"]["shedders"]["kv"] = {"kind": "vllm", "signal": "kv_cache_growth_rate", "idle": "0 MB/s",
                                             "per_request": "1 MB/s", "shed_at": level}
            if tolerance is not None:
                d["scaling"]["hpa"]["tolerance"] = tolerance
        return order_problems(parse_spec(_edited(edit), "fusebox.yaml"))
    (p,) = shed_at("10 MB/s")
    assert "adding a replica above 10.12 MB/s" in p and "which sheds at 10 MB/s" in p
    assert shed_at("11 MB/s") == []
    assert shed_at("10 MB/s", "0%") == []
    assert shed_at("10.2 MB/s", "15%") != []  # 9.2 x 1.15 = 10.58


def test_an_order_finding_says_the_level_its_shedder_or_veto_needs():
    """A shedder at 9.8 MB/s, above KV growth's 9.2 MB/s set point but under 9.2 x 1.1 = 10.12 MB/s
    where the HPA adds a replica: the fix names 10.12 MB/s. smg's veto stated as 0.9 under a KV
    usage gauge's 85 % x 1.1 = 93.5 %: it is printed as the signal's 90 %, and the fix names 93.5 %."""
    def shed(d):
        d["inpath"]["shedders"]["kv"] = {"kind": "vllm", "signal": "kv_cache_growth_rate", "idle": "0 MB/s",
                                         "per_request": "1 MB/s", "shed_at": "9.8 MB/s"}
    (p,) = order_problems(parse_spec(_edited(shed), "fusebox.yaml"))
    assert "which sheds at 9.8 MB/s" in p
    assert p.endswith("-- shed above 10.12 MB/s (set point x (1 + scaling.hpa.tolerance)): inpath.shedders.kv.shed_at, "
                      "or scale on another signal"), p

    def veto(d):
        _kv_usage(d)
        d["inpath"]["shedders"]["gateway"]["overload"] = {"token_usage": 0.9}
    (v,) = [p for p in order_problems(parse_spec(_edited(veto), "fusebox.yaml")) if "worker overload veto" in p]
    assert "worker overload veto at 90% (" in v and "0.9" not in v, v
    assert v.endswith("-- set the veto above 93.5% (set point x (1 + scaling.hpa.tolerance)): inpath.shedders.gateway.overload, "
                      "or scale on another signal"), v

