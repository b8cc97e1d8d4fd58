"""The generated scaling objects on a real kube-apiserver (tests/_kube_support.py's control plane):
KEDA v2.21.0's ScaledObject CRD (tests/fixtures/k8s/keda/) and fusebox's CostQoSScalingPolicy CRD
installed as they are, then the shipped spec's ScaledObject, the HPA of the same spec with
``hpa.enabled``, the policy and the controller's objects, applied server-side with strict field
validation, each stored as sent. The API server's own checks refuse what the CRD refuses (its CEL rule min <= max, a bare
decimal budget)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from _support import SPEC, yaml_data, yaml_text

from fusebox.generator.outputs import render_all
from fusebox.spec import parse_spec

pytestmark = pytest.mark.tools

KEDA_CRD = Path(__file__).parents[1] / "fixtures" / "k8s" / "keda" / "keda.sh_scaledobjects.yaml"


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def _established(cp, name: str) -> bool:
    crd = cp.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name) or {}
    return any(c["type"] == "Established" and c["status"] == "True" for c in (crd.get("status") or {}).get("conditions") or [])


def test_the_scaling_objects_apply_on_a_real_api_server_and_its_checks_hold(tmp_path):
    from _kube_support import ControlPlane, wait_until
    from kubernetes.client.exceptions import ApiException

    shipped = render_all(parse_spec(SPEC.read_text(), "fusebox.yaml"))
    data = yaml_data(SPEC.read_text())
    data["scaling"]["keda"]["enabled"], data["scaling"]["hpa"]["enabled"] = False, True
    with_hpa = render_all(parse_spec(yaml_text(data, sort_keys=False), "fusebox.yaml"))
    cp = ControlPlane(tmp_path / "cp")
    try:
        cp.start()
        (keda,) = _docs(KEDA_CRD.read_text())
        (ours,) = _docs(shipped["k8s/costqos-crd.yml"])
        for crd in (keda, ours):
            cp.apply(crd)
        for name in (keda["metadata"]["name"], ours["metadata"]["name"]):
            wait_until(lambda n=name: _established(cp, n), 60, f"CRD {name} Established")
        cp.client.resources.invalidate_cache()
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "inference"}})

        (so,) = _docs(shipped["k8s/scaling.yml"])
        (policy,) = _docs(shipped["k8s/costqos-policies.yml"])
        (hpa,) = _docs(with_hpa["k8s/scaling.yml"])
        for doc in (so, policy, hpa):
            stored = cp.apply(doc)
            sent = {**doc["spec"], **({"lookback": "6h"} if doc is policy else {})}  # the CRD's default lookback
            if doc is hpa:  # the API server adds the HPA's default scaling policies beside the windows sent
                behavior = stored["spec"].pop("behavior")
                assert {k: v["stabilizationWindowSeconds"] for k, v in behavior.items()} == {"scaleUp": 0, "scaleDown": 300}
                sent.pop("behavior")
            assert stored["spec"] == sent, doc["kind"]
            assert stored["metadata"]["namespace"] == "inference"
        assert cp.get("keda.sh/v1alpha1", "ScaledObject", "llava-7b", "inference")["spec"]["triggers"][0]["metadata"]["query"] == \
            'fusebox:scaling_load:ratio{workload="llava-7b"}'

        # the controller's account, role, binding and Deployment (its PodMonitor: validated offline, tests/k8s)
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}})
        for doc in _docs(shipped["k8s/costqos-controller.yml"]):
            if doc["kind"] != "PodMonitor":
                cp.apply(doc)
        assert cp.get("apps/v1", "Deployment", "fusebox-costqos", "monitoring") is not None

        # what the API server refuses: min over max (the CRD's CEL rule), a bare 0.42 (no "number or string" type)
        swapped = copy.deepcopy(policy)
        swapped["metadata"]["name"] = "swapped"
        swapped["spec"]["replicas"] = {"min": 9, "max": 8}
        bare = copy.deepcopy(policy)
        bare["metadata"]["name"] = "bare"
        bare["spec"]["costBudget"] = 0.42
        typo = copy.deepcopy(so)
        typo["metadata"]["name"] = "typo"
        typo["spec"]["maxReplicas"] = typo["spec"].pop("maxReplicaCount")
        for doc, words in ((swapped, "replicas.min must not exceed replicas.max"), (bare, "costBudget"),
                           (typo, "maxReplicas")):
            with pytest.raises(ApiException) as e:
                cp.apply(doc)
            assert words in str(e.value.body), e.value.body
    finally:
        cp.close()
