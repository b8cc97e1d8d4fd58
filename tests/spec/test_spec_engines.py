"""``kubernetes.engines`` for engine discovery (issue 33, point 1): the models' KV geometry, the
spec errors at the user's line, the ``fusebox-engines`` ConfigMap, the collectors' RBAC and
DaemonSet, and the warnings that go away when discovery covers a signal (and only then).

The geometry expected here is worked out by hand from the config.json files of
tests/fixtures/collectors (SOURCES.md: the models' Hugging Face repositories):

* llava-hf/llava-1.5-7b-hf: its ``text_config`` is a Llama one that keeps only ``model_type`` and
  the dtype, so transformers' LlamaConfig defaults apply: 32 layers, 32 KV heads (= heads),
  head dim 4096 / 32 = 128, float16: 2 x 32 x 32 x 128 x 2 = 524,288 bytes per token;
* Qwen/Qwen2.5-VL-7B-Instruct: 28 layers, 4 KV heads, head dim 3584 / 28 = 128, bfloat16:
  2 x 28 x 4 x 128 x 2 = 57,344 bytes per token.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from _support import FIXTURES, SPEC, yaml_data, yaml_text
from test_k8s_manifests import _validate as validate

from fusebox import conventions as C
from fusebox.generator.outputs import render_all, spec_warnings
from fusebox.generator.render_k8s import engines_config, render_discovery
from fusebox.spec import SpecError, parse_spec

MODELS = FIXTURES / "collectors"
LLAVA = "llava-hf/llava-1.5-7b-hf"
QWEN = "Qwen/Qwen2.5-VL-7B-Instruct"
LLAVA_BPT = 2 * 32 * 32 * 128 * 2  # 524,288
QWEN_BPT = 2 * 28 * 4 * 128 * 2  # 57,344
KUBERNETES_VERSION = "1.32.0"  # as tests/k8s/test_k8s_manifests.py


def _spec_text(engines: dict | None, run: dict | None = None, **collectors) -> str:
    data = yaml_data(SPEC.read_text())
    if engines is not None:
        data["kubernetes"]["engines"] = engines
    if run is not None:
        data["kubernetes"]["collectors"]["run"] = run
    data["kubernetes"]["collectors"].update(collectors)
    return yaml_text(data, sort_keys=False)


def _engines(models: dict, namespaces: list[str] | None = None) -> dict:
    return {"selector": {"app.kubernetes.io/name": "vllm"}, "port": "http", "namespaces": namespaces or [],
            "models": models}


def _both_models() -> dict:
    return {LLAVA: {"config": "llava-1.5-7b-hf_config.json"},
            QWEN: {"config": "Qwen2.5-VL-7B-Instruct_config.json"}}


def _parse(text: str, base_dir: Path = MODELS):
    return parse_spec(text, "fusebox.yaml", base_dir=base_dir)


def _line(text: str, needle: str, after: str = "engines:") -> int:
    """The 1-based line of the first ``needle`` after the line ``after``."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip() == after)
    return next(i for i, ln in enumerate(lines[start:], start + 1) if needle in ln)


def _problems(text: str, base_dir: Path = MODELS) -> list:
    with pytest.raises(SpecError) as e:
        _parse(text, base_dir)
    return e.value.problems


# ------------------------------------------------------------------ the models' geometry
def test_models_are_read_from_their_config_json_relative_to_the_spec():
    spec = _parse(_spec_text(_engines(_both_models())))
    models = spec.kubernetes.engines.models
    assert (models[LLAVA].layers, models[LLAVA].kv_heads, models[LLAVA].head_dim, models[LLAVA].dtype_bytes) == (32, 32, 128, 2)
    assert models[LLAVA].bytes_per_token == LLAVA_BPT == 524_288
    assert (models[QWEN].layers, models[QWEN].kv_heads, models[QWEN].head_dim, models[QWEN].dtype_bytes) == (28, 4, 128, 2)
    assert models[QWEN].bytes_per_token == QWEN_BPT == 57_344


def test_a_model_given_by_its_geometry_and_a_kv_dtype_override():
    text = _spec_text(_engines({QWEN: {"layers": 28, "kv_heads": 4, "head_dim": 128, "dtype": "bfloat16"},
                                LLAVA: {"config": "llava-1.5-7b-hf_config.json", "kv_dtype": "fp8"}}))
    models = _parse(text).kubernetes.engines.models
    assert models[QWEN].bytes_per_token == QWEN_BPT
    assert models[LLAVA].bytes_per_token == 2 * 32 * 32 * 128 * 1  # fp8: one byte per element


def test_the_spec_loads_from_another_folder_with_load_spec(tmp_path):
    """load_spec reads config paths relative to the spec file, wherever the working directory is."""
    from fusebox.spec import load_spec

    (tmp_path / "models").mkdir()
    (tmp_path / "models/llava.json").write_text((MODELS / "llava-1.5-7b-hf_config.json").read_text())
    path = tmp_path / "fusebox.yaml"
    path.write_text(_spec_text(_engines({LLAVA: {"config": "models/llava.json"}})))
    assert load_spec(path).kubernetes.engines.models[LLAVA].bytes_per_token == LLAVA_BPT


# ------------------------------------------------------------------ spec errors at their line
def test_a_missing_config_json_is_an_error_at_the_models_config_line():
    text = _spec_text(_engines({LLAVA: {"config": "models/nope/config.json"}}))
    [p] = _problems(text)
    assert p.line == _line(text, "config: models/nope/config.json")
    assert LLAVA in p.what and "models/nope/config.json" in p.what and "cannot read" in p.what
    assert "config.json" in p.fix and "layers, kv_heads, head_dim, dtype" in p.fix


def test_a_config_json_without_derivable_geometry_is_an_error_at_its_line(tmp_path):
    (tmp_path / "mystery.json").write_text(json.dumps({"model_type": "mystery", "torch_dtype": "float16"}))
    (tmp_path / "nodtype.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8}))
    (tmp_path / "broken.json").write_text('{"num_hidden_layers": 2,\n')
    text = _spec_text(_engines({"a": {"config": "mystery.json"}, "b": {"config": "nodtype.json"},
                                "c": {"config": "broken.json"}}))
    problems = _problems(text, tmp_path)
    by_line = {p.line: p for p in problems}
    assert set(by_line) == {_line(text, "config: mystery.json"), _line(text, "config: nodtype.json"),
                            _line(text, "config: broken.json")}
    assert "no num_hidden_layers" in by_line[_line(text, "config: mystery.json")].what
    nodtype = by_line[_line(text, "config: nodtype.json")]
    assert "no dtype" in nodtype.what and "--kv-dtype" not in nodtype.what and "kv_dtype" in nodtype.fix
    assert "invalid JSON" in by_line[_line(text, "config: broken.json")].what


@pytest.mark.parametrize("model, needle, what", [
    ({"layers": 28, "kv_heads": 4, "head_dim": 128, "dtype": "bf12"}, "dtype: bf12", "unknown dtype 'bf12'"),
    ({"config": "llava-1.5-7b-hf_config.json", "kv_dtype": "fp4"}, "kv_dtype: fp4", "unknown KV-cache dtype 'fp4'"),
    ({"layers": 0, "kv_heads": 4, "head_dim": 128, "dtype": "fp16"}, "layers: 0", "layers must be at least 1"),
    ({"config": "llava-1.5-7b-hf_config.json", "layers": 32}, "layers: 32", "gives both config and layers"),
    ({"layers": 28, "kv_heads": 4}, "m1:", "has no config and no head_dim, dtype"),
    ({"layer": 28}, "layer: 28", "unknown key 'layer'"),
])
def test_a_bad_model_entry_is_an_error_at_its_line(model, needle, what):
    text = _spec_text(_engines({"m1": model}))
    [p] = _problems(text)
    assert p.line == _line(text, needle) and what in p.what, (p.line, str(p))
    assert p.fix


@pytest.mark.parametrize("collector", ["kv", "latency"])
def test_kv_or_latency_without_engines_is_an_error_at_its_line_saying_to_add_them(collector):
    text = _spec_text(None, {"gpu": [], collector: []})
    [p] = _problems(text)
    assert p.line == _line(text, f"{collector}:", after="run:")
    assert "no way to find the engines" in p.what and "add kubernetes.engines" in p.fix


def test_kv_without_engines_is_fine_when_the_collectors_do_not_run():
    spec = _parse(_spec_text(None, {"gpu": [], "kv": []}, enabled=False))
    assert spec.kubernetes.engines is None


@pytest.mark.parametrize("arg", ["--endpoint", "--gpu", "--model-config", "--engine-id", "--discover"])
def test_per_engine_arguments_are_refused_where_discovery_sets_them(arg):
    text = _spec_text(_engines(_both_models()), {"gpu": [], "kv": [arg, "x"]})
    [p] = _problems(text)
    assert p.line == _line(text, f"- {arg}", after="run:") and f"{arg} is set by the generated DaemonSet" in p.what


# ------------------------------------------------------------------ the rendered objects
def _rendered(engines: dict, run: dict, **collectors) -> tuple[dict[str, str], list[dict]]:
    spec = _parse(_spec_text(engines, run, **collectors))
    out = render_all(spec)
    docs = [d for d in yaml.safe_load_all(out["k8s/collectors.yml"]) if d]
    return out, docs


def _one(docs: list[dict], kind: str) -> dict:
    [d] = [d for d in docs if d["kind"] == kind]
    return d


def test_the_engines_configmap_holds_the_resolved_geometry():
    out, docs = _rendered(_engines(_both_models(), ["inference"]), {"gpu": [], "kv": [], "latency": []})
    cm = _one(docs, "ConfigMap")
    assert cm["metadata"]["name"] == C.K8S["engines_configmap"] == "fusebox-engines"
    assert cm["metadata"]["namespace"] == "monitoring"
    text = cm["data"]["engines.yaml"]
    assert text.startswith("# Code generated by fusebox generate from kubernetes.engines. DO NOT EDIT.\n")
    got = yaml.safe_load(text)
    assert got == {"namespaces": ["inference"], "selector": {"app.kubernetes.io/name": "vllm"}, "port": "http",
                   "path": "/metrics", "models": {LLAVA: {"layers": 32, "kv_heads": 32, "head_dim": 128, "dtype_bytes": 2},
                                                  QWEN: {"layers": 28, "kv_heads": 4, "head_dim": 128, "dtype_bytes": 2}}}
    m = got["models"][LLAVA]
    assert 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * m["dtype_bytes"] == LLAVA_BPT
    for d in docs:  # the PodMonitor against the operator's CRD, the rest against Kubernetes' schemas
        validate(d)
    assert "collectors.yml" in yaml.safe_load(out["k8s/kustomization.yaml"].split("\n", 1)[1])["resources"]


def test_the_daemonset_discovers_with_the_contracts_args_mounts_and_account():
    _, docs = _rendered(_engines(_both_models()), {"gpu": [], "kv": [], "latency": []})
    ds = _one(docs, "DaemonSet")
    kubernetes_validate.validate(ds, KUBERNETES_VERSION, strict=True)
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "fusebox-collectors" and pod["automountServiceAccountToken"] is True
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["engines"] == {"name": "engines", "configMap": {"name": "fusebox-engines"}}
    assert vols["pod-resources"]["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    c = {c["name"]: c for c in pod["containers"]}
    assert "--discover" not in c["gpu"]["args"] and c["gpu"]["securityContext"]["runAsNonRoot"] is True
    for name in ("kv", "latency"):
        args = c[name]["args"]
        assert args[args.index("--discover") + 1] == "/etc/fusebox/engines/engines.yaml"
        assert args[args.index("--node-name") + 1] == "$(NODE_NAME)"
        env = {e["name"]: e for e in c[name]["env"]}
        assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        mounts = {m["name"]: m for m in c[name]["volumeMounts"]}
        assert mounts["engines"] == {"name": "engines", "mountPath": "/etc/fusebox/engines", "readOnly": True}
        assert not {"--endpoint", "--gpu", "--model-config", "--engine-id"} & set(args)
    kv = c["kv"]
    assert kv["args"][kv["args"].index("--pod-resources-socket") + 1] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    mounts = {m["name"]: m for m in kv["volumeMounts"]}
    assert mounts["pod-resources"] == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}
    sc = kv["securityContext"]  # root for the socket, nothing else
    assert (sc["runAsUser"], sc["runAsNonRoot"], sc["allowPrivilegeEscalation"], sc["readOnlyRootFilesystem"]) == (0, False, False, True)
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert "pod-resources" not in {m["name"] for m in c["latency"]["volumeMounts"]}
    assert c["latency"]["securityContext"]["runAsNonRoot"] is True
    lat = c["latency"]["args"]
    assert lat[lat.index("--spec") + 1] == "/etc/fusebox/spec/fusebox.yaml" and vols["spec"]["configMap"]["name"] == "fusebox-spec"


def test_only_the_gpu_collector_sees_the_gpus_the_discovering_ones_get_none():
    # kv and latency read engines' /metrics and the kubelet's socket, never NVML (the DaemonSet's kv
    # always discovers, so it has no --gpu to check a model config against): under the nvidia
    # RuntimeClass they get NVIDIA_VISIBLE_DEVICES=void (the toolkit's "no GPU, no driver"), the
    # root kv container above all
    _, docs = _rendered(_engines(_both_models()), {"gpu": [], "kv": [], "latency": []})
    pod = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    env = {c["name"]: {e["name"]: e.get("value") for e in c["env"]} for c in pod["containers"]}
    assert (env["gpu"]["NVIDIA_VISIBLE_DEVICES"], env["gpu"]["NVIDIA_DRIVER_CAPABILITIES"]) == ("all", "utility")
    for name in ("kv", "latency"):
        assert env[name]["NVIDIA_VISIBLE_DEVICES"] == "void" and "NVIDIA_DRIVER_CAPABILITIES" not in env[name]


def test_all_namespaces_get_a_clusterrole_listed_namespaces_a_role_each():
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    subject = [{"kind": "ServiceAccount", "name": "fusebox-collectors", "namespace": "monitoring"}]
    _, docs = _rendered(_engines(_both_models()), {"gpu": [], "kv": []})
    cr, crb = _one(docs, "ClusterRole"), _one(docs, "ClusterRoleBinding")
    assert "namespace" not in cr["metadata"] and cr["rules"] == rules
    assert crb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "fusebox-collectors"}
    assert crb["subjects"] == subject
    assert _one(docs, "ServiceAccount")["metadata"]["namespace"] == "monitoring"
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    for d in (cr, crb):
        kubernetes_validate.validate(d, KUBERNETES_VERSION, strict=True)

    _, docs = _rendered(_engines(_both_models(), ["inference", "batch"]), {"gpu": [], "latency": []})
    roles = [d for d in docs if d["kind"] == "Role"]
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    assert [r["metadata"]["namespace"] for r in roles] == ["inference", "batch"] and all(r["rules"] == rules for r in roles)
    assert [b["metadata"]["namespace"] for b in bindings] == ["inference", "batch"]
    assert all(b["subjects"] == subject and b["roleRef"]["kind"] == "Role" for b in bindings)
    assert not [d for d in docs if d["kind"].startswith("Cluster")]
    for d in roles + bindings:
        kubernetes_validate.validate(d, KUBERNETES_VERSION, strict=True)
    # latency alone mounts no kubelet socket and runs nothing as root
    pod = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert "pod-resources" not in {v["name"] for v in pod["volumes"]}
    assert all(c["securityContext"]["runAsNonRoot"] for c in pod["containers"]) and pod["securityContext"]["runAsNonRoot"]


def test_the_validator_rejects_a_broken_role():
    _, docs = _rendered(_engines(_both_models(), ["inference"]), {"gpu": [], "kv": []})
    bad = copy.deepcopy(_one(docs, "Role"))
    bad["rules"][0]["verb"] = bad["rules"][0].pop("verbs")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_no_discovery_objects_without_a_discovering_collector():
    spec = _parse(_spec_text(_engines(_both_models()), {"gpu": []}))
    assert render_discovery(spec) == []
    docs = [d for d in yaml.safe_load_all(render_all(spec)["k8s/collectors.yml"]) if d]
    pod = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert engines_config(spec)["models"][QWEN]["kv_heads"] == 4  # resolved all the same


def test_the_spec_configmap_loads_where_the_config_json_files_are_not(tmp_path):
    """The fuse (and the latency collector) load the spec from its ConfigMap, in a pod where the
    models' config.json files are not: the ConfigMap carries each model's resolved geometry."""
    out, _ = _rendered(_engines(_both_models()), {"gpu": [], "kv": []})
    [cm] = [d for d in yaml.safe_load_all(out["k8s/fuse.yml"]) if d and d["kind"] == "ConfigMap"]
    text = cm["data"]["fusebox.yaml"]
    assert "config:" not in yaml.safe_dump(yaml.safe_load(text)["kubernetes"]["engines"])
    models = parse_spec(text, "fusebox.yaml", base_dir=tmp_path).kubernetes.engines.models  # an empty folder
    assert {n: g.bytes_per_token for n, g in models.items()} == {LLAVA: LLAVA_BPT, QWEN: QWEN_BPT}


# ------------------------------------------------------------------ the warnings
def _warned(spec_text: str) -> dict[str, list[str]]:
    w = spec_warnings(_parse(spec_text))
    # the signals' warnings, and the panels' that name the same series (dashboards tracing)
    panels = [x for x in w if x.startswith("panel ") and (C.PROM["kv_cache_usage"] in x or C.PROM["kv_cache_limit"] in x
                                                          or C.PROM["alignment_duration"] in x)]
    w = [x for x in w if not x.startswith(("panel ", "dashboard variable "))]
    return {"panels": panels, "kv": [x for x in w if C.PROM["kv_cache_usage"] in x or C.PROM["kv_cache_limit"] in x],
            "alignment": [x for x in w if C.PROM["alignment_duration"] in x],
            "models": [x for x in w if "names no models" in x]}


def test_the_kv_and_alignment_warnings_go_when_discovery_covers_them_and_only_then():
    starter = _warned(SPEC.read_text())
    assert len(starter["kv"]) == 4 and len(starter["alignment"]) == 1  # three KV signals and the GPU-memory correction
    assert starter["panels"]  # and the panels that draw them stay empty
    covered = _warned(_spec_text(_engines(_both_models()), {"gpu": [], "kv": [], "latency": []}))
    assert covered == {"panels": [], "kv": [], "alignment": [], "models": []}
    # the KV collector with engines but no model known: no bytes, so the KV warnings stay, with one more
    no_models = _warned(_spec_text(_engines({}), {"gpu": [], "kv": [], "latency": []}))
    assert len(no_models["kv"]) == 4 and no_models["alignment"] == [] and len(no_models["models"]) == 1
    # latency only: the alignment signal is produced, the KV signals are not
    latency = _warned(_spec_text(_engines(_both_models()), {"gpu": [], "latency": []}))
    assert len(latency["kv"]) == 4 and latency["alignment"] == []
    # engines listed but the collectors off: nothing is produced
    off = _warned(_spec_text(_engines(_both_models()), {"gpu": [], "kv": [], "latency": []}, enabled=False))
    assert len(off["alignment"]) == 1


@pytest.mark.parametrize("engines", [True, False])
def test_kv_and_latency_in_run_with_the_collectors_disabled_is_said_as_the_cause(engines):
    # the KV and alignment warnings say nothing publishes their series; the cause is one line
    text = _spec_text(_engines(_both_models()) if engines else None, {"gpu": [], "kv": [], "latency": []}, enabled=False)
    w = spec_warnings(_parse(text))
    [cause] = [x for x in w if x.startswith("kubernetes.collectors.run")]
    assert "kv, latency" in cause and "kubernetes.collectors.enabled is false" in cause and "enabled: true" in cause
    assert "gpu" not in cause.split(":")[0]  # the gpu collector's signals say so themselves
    # with the collectors on, no such line
    on = spec_warnings(_parse(_spec_text(_engines(_both_models()), {"gpu": [], "kv": [], "latency": []})))
    assert not [x for x in on if x.startswith("kubernetes.collectors.run")]


def test_dcgm_vllm_and_discovery_leave_no_kv_or_alignment_signal_unproduced():
    """The issue's cluster: dcgm-exporter for the GPUs, vLLM engines, the kv and latency collectors
    discovering them (no gpu collector). Every KV and alignment read is produced; what still
    warns is PCIe, whose only source is the gpu collector (not run here), and the connection
    signals, whose collector (collect conns) runs beside the gateway, never in k8s/."""
    from test_generator_produced import dcgm_vllm_spec

    data = yaml.safe_load(dcgm_vllm_spec(keep_collector_signals=True))
    data["kubernetes"]["collectors"].update(enabled=True, run={"kv": [], "latency": []})
    data["kubernetes"]["engines"] = _engines(_both_models(), ["inference"])
    warnings = spec_warnings(_parse(yaml_text(data, sort_keys=False)))
    unproduced = [w for w in warnings if "nothing k8s/ deploys produces" in w]
    assert [w.split(" reads ")[0] for w in unproduced] == ["signal 'pcie_link_utilization'",
                                                           "signal 'pcie_root_complex_utilization'",
                                                           "signal 'connection_idle_p95'",
                                                           "signal 'connection_cold_start_share'"]
    assert not [w for w in warnings if "fusebox_kv_cache" in w or "alignment" in w]


@pytest.mark.tools
def test_the_generated_rbac_lets_the_collectors_read_pods_where_the_engines_run_and_nowhere_else(tmp_path):
    """On a real kube-apiserver with RBAC authorization: the generated collectors' objects apply
    (server-side, strict), and the ServiceAccount, impersonated, may list and watch pods in the
    engines' namespace only (a Role there), not in another, not across namespaces, and no secret;
    with ``namespaces: []`` the ClusterRole lets it list pods in every namespace."""
    import httpx
    from _kube_support import ControlPlane

    cp = ControlPlane(tmp_path / "cp", authorization="RBAC")
    try:
        cp.start()
        for ns in ("monitoring", "inference", "default"):
            cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

        def apply(namespaces: list[str]) -> None:
            _, docs = _rendered(_engines(_both_models(), namespaces), {"gpu": [], "kv": [], "latency": []})
            for d in docs:
                if d["kind"] != "PodMonitor":  # a CRD this control plane has not installed; validated offline above
                    cp.apply(d)

        account = "system:serviceaccount:monitoring:fusebox-collectors"
        headers = [("Authorization", f"Bearer {cp.token}"), ("Impersonate-User", account),
                   *(("Impersonate-Group", g) for g in ("system:serviceaccounts", "system:serviceaccounts:monitoring",
                                                        "system:authenticated"))]

        def status(path: str) -> int:
            with httpx.Client(verify=cp._tls(), timeout=30) as c:
                return c.get(cp.server + path, headers=headers).status_code

        apply(["inference"])
        assert status("/api/v1/namespaces/inference/pods") == 200
        assert status("/api/v1/namespaces/inference/pods?watch=1&timeoutSeconds=1") == 200
        assert status("/api/v1/namespaces/inference/pods?fieldSelector=spec.nodeName%3Dgpu-node-1") == 200
        assert status("/api/v1/namespaces/default/pods") == 403
        assert status("/api/v1/pods") == 403
        assert status("/api/v1/namespaces/inference/secrets") == 403
        apply([])
        assert status("/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-node-1") == 200
        assert status("/api/v1/namespaces/default/pods") == 200
        assert status("/api/v1/namespaces/default/secrets") == 403
        ds = cp.get("apps/v1", "DaemonSet", "fusebox-collectors", "monitoring")
        assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "fusebox-collectors"
    finally:
        cp.close()
