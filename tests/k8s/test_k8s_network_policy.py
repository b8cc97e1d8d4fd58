"""The fuse's NetworkPolicy (k8s/fuse.yml): only Alertmanager and Prometheus reach the fuse's port.

The pods it must let in are labelled as the Prometheus Operator labels them (v0.85.0, the version
tools/build-prometheus-operator.sh builds): ``makeSelectorLabels`` in pkg/alertmanager/operator.go
gives every Alertmanager pod ``app.kubernetes.io/name: alertmanager``,
``app.kubernetes.io/managed-by: prometheus-operator``, ``app.kubernetes.io/instance: <name>`` and
``alertmanager: <name>``; the one in pkg/prometheus/server/operator.go gives every Prometheus pod
``app.kubernetes.io/name: prometheus``, the same managed-by and instance, ``operator.prometheus.io/name``
and ``prometheus: <name>``. kube-prometheus-stack names them ``<release>-alertmanager`` and
``<release>-prometheus``. Those label sets are written out below from that source, not from the
generator. tests/e2e/test_k8s_cluster.py checks the policy against the StatefulSets the real operator
renders.

The selectors are checked twice: as pure data (matchLabels semantics: every pair present, both
selectors of one peer, any peer), and by the real kube-apiserver, which stores the policy (strict
field validation) and evaluates each of its selectors over pods and namespaces created there. No
kubelet and no network plugin run in these tests: nothing enforces the policy.
"""

from __future__ import annotations

import copy

import pytest
import yaml
from _support import ROOT, SPEC, yaml_data, yaml_text

from fusebox import conventions as C
from fusebox.generator.render_k8s import render_fuse_network_policy
from fusebox.spec import SpecError, parse_spec

RELEASE = "kube-prometheus-stack"
OPERATOR = {"app.kubernetes.io/managed-by": "prometheus-operator"}
ALERTMANAGER_POD = {**OPERATOR, "app.kubernetes.io/name": "alertmanager",
                    "app.kubernetes.io/instance": f"{RELEASE}-alertmanager", "alertmanager": f"{RELEASE}-alertmanager"}
PROMETHEUS_POD = {**OPERATOR, "app.kubernetes.io/name": "prometheus", "app.kubernetes.io/instance": f"{RELEASE}-prometheus",
                  "operator.prometheus.io/name": f"{RELEASE}-prometheus", "prometheus": f"{RELEASE}-prometheus",
                  "operator.prometheus.io/shard": "0"}
GRAFANA_POD = {"app.kubernetes.io/name": "grafana", "app.kubernetes.io/instance": RELEASE}


def _committed_policy() -> dict:
    docs = [d for d in yaml.safe_load_all((ROOT / "k8s" / "fuse.yml").read_text()) if d]
    (pol,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    return pol


def _committed(kind: str) -> dict:
    docs = [d for d in yaml.safe_load_all((ROOT / "k8s" / "fuse.yml").read_text()) if d]
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _admits(pol: dict, pod: dict[str, str], namespace: str) -> bool:
    """Whether ``pol``'s ingress lets in a pod labelled ``pod`` from ``namespace`` (whose one label
    that matters is the one the API server sets on every namespace: kubernetes.io/metadata.name)."""
    ns = {"kubernetes.io/metadata.name": namespace}

    def holds(selector: dict | None, labels: dict[str, str]) -> bool:
        return selector is not None and all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())

    return any(holds(peer.get("namespaceSelector"), ns) and holds(peer.get("podSelector"), pod)
               for rule in pol["spec"]["ingress"] for peer in rule["from"])


def _spec(network_policy: dict | None = None, namespace: str = "monitoring"):
    data = yaml_data(SPEC.read_text())
    data.setdefault("kubernetes", {})["namespace"] = namespace
    if network_policy is not None:
        data["kubernetes"].setdefault("fuse", {})["network_policy"] = network_policy
    return parse_spec(yaml_text(data, sort_keys=False), "fusebox.yaml")


def test_the_committed_policy_admits_the_operators_alertmanager_and_prometheus_only():
    pol = _committed_policy()
    assert pol["spec"]["policyTypes"] == ["Ingress"]  # egress left open (docs/kubernetes.md says why)
    assert _admits(pol, ALERTMANAGER_POD, "monitoring") and _admits(pol, PROMETHEUS_POD, "monitoring")
    assert not _admits(pol, GRAFANA_POD, "monitoring")
    # a neighbour that copies the label in its own namespace is not let in
    assert not _admits(pol, ALERTMANAGER_POD, "tenant-a") and not _admits(pol, PROMETHEUS_POD, "tenant-a")
    # the fuse's own pods are the ones it isolates; the port is the container's
    deployment = _committed("Deployment")
    template = deployment["spec"]["template"]
    assert pol["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert all(template["metadata"]["labels"].get(k) == v for k, v in pol["spec"]["podSelector"]["matchLabels"].items())
    (port,) = template["spec"]["containers"][0]["ports"]
    assert [(p["protocol"], p["port"]) for r in pol["spec"]["ingress"] for p in r["ports"]] == [("TCP", port["containerPort"])]
    assert port["containerPort"] == C.K8S["fuse_port"]


def test_the_namespace_and_labels_come_from_kubernetes_fuse_network_policy():
    pol = render_fuse_network_policy(_spec({"namespace": "observability", "prometheus": {"app": "prometheus-server"}},
                                           namespace="inference"))
    assert pol["metadata"]["namespace"] == "inference"
    assert _admits(pol, ALERTMANAGER_POD, "observability") and not _admits(pol, ALERTMANAGER_POD, "inference")
    assert _admits(pol, {"app": "prometheus-server"}, "observability") and not _admits(pol, PROMETHEUS_POD, "observability")
    # without namespace: the fuse's own (kubernetes.namespace)
    assert _admits(render_fuse_network_policy(_spec(namespace="inference")), PROMETHEUS_POD, "inference")


def test_a_disabled_policy_is_not_generated():
    from fusebox.generator.render_k8s import render_fuse

    kinds = [d["kind"] for d in render_fuse(_spec({"enabled": False}))]
    assert "NetworkPolicy" not in kinds and "Deployment" in kinds
    assert "NetworkPolicy" in [d["kind"] for d in render_fuse(_spec())]


@pytest.mark.parametrize("block,what", [
    ({"namespace": "Monitoring"}, "'Monitoring' is not a Kubernetes namespace name"),
    ({"namespace": "monitoring\n"}, "is not a Kubernetes namespace name"),
    ({"alertmanager": {}}, "no labels select the alertmanager pods"),
    ({"prometheus": {"app kubernetes": "x"}}, "is not a Kubernetes label key"),
])
def test_a_bad_network_policy_block_is_a_spec_error_at_its_line(block, what):
    data = yaml_data(SPEC.read_text())
    data.setdefault("kubernetes", {}).setdefault("fuse", {})["network_policy"] = block
    text = yaml_text(data, sort_keys=False)
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    (p,) = e.value.problems
    assert what in p.what
    key = next(iter(block))
    assert key in text.splitlines()[p.line - 1] or next(iter(block[key] or {"": 0})) in text.splitlines()[p.line - 1]


# ----------------------------------------------------------------------- the real kube-apiserver
@pytest.mark.process
def test_the_api_server_stores_the_policy_and_its_selectors_pick_alertmanager_and_prometheus(tmp_path):
    """kube-apiserver v1.37.2 (etcd, no kubelet): the committed policy is created by server-side
    apply with strict field validation, then each selector is evaluated by the API server itself
    (list with labelSelector) over pods created with the operator's labels and a neighbour's."""
    from _kube_support import ControlPlane

    cp = ControlPlane(tmp_path / "cp")
    try:
        cp.start()
        for ns in ("monitoring", "tenant-a"):
            cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            cp.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}})
        fuse_labels = _committed("Deployment")["spec"]["template"]["metadata"]["labels"]
        pods = {("monitoring", "alertmanager-0"): ALERTMANAGER_POD, ("monitoring", "prometheus-0"): PROMETHEUS_POD,
                ("monitoring", "grafana-0"): GRAFANA_POD, ("monitoring", "fusebox-fuse-0"): fuse_labels,
                ("tenant-a", "imposter-0"): ALERTMANAGER_POD}
        for (ns, name), labels in pods.items():
            cp.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
                      "spec": {"automountServiceAccountToken": False,
                               "containers": [{"name": "c", "image": "registry.example/none:1"}]}})
        pol = _committed_policy()
        stored = cp.apply(copy.deepcopy(pol))
        assert stored["spec"] == pol["spec"] and stored["metadata"]["uid"]

        def selector(match: dict[str, str]) -> str:
            return ",".join(f"{k}={v}" for k, v in match.items())

        def pods_of(ns: str, match: dict[str, str]) -> set[tuple[str, str]]:
            items = cp.client.get(cp.resource("v1", "Pod"), namespace=ns, label_selector=selector(match)).items
            return {(ns, p.metadata.name) for p in items}

        admitted: set[tuple[str, str]] = set()
        for rule in stored["spec"]["ingress"]:
            for peer in rule["from"]:
                nss = cp.client.get(cp.resource("v1", "Namespace"),
                                    label_selector=selector(peer["namespaceSelector"]["matchLabels"])).items
                for ns in nss:
                    admitted |= pods_of(ns.metadata.name, peer["podSelector"]["matchLabels"])
        assert admitted == {("monitoring", "alertmanager-0"), ("monitoring", "prometheus-0")}
        assert pods_of(stored["metadata"]["namespace"], stored["spec"]["podSelector"]["matchLabels"]) == {
            ("monitoring", "fusebox-fuse-0")}
    finally:
        cp.close()
