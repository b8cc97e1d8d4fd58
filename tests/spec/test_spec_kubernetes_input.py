"""``kubernetes:`` input: an image repository with capital letters is a spec error at its line, and
``labels: {}`` (the starter spec's own value: no extra labels) leaves every selector of the
generated k8s/ matching what it selects (they are fusebox's ``app.kubernetes.io/name`` alone)."""

from __future__ import annotations

import pytest
import yaml
from _support import SPEC

from fusebox.generator.outputs import render_all
from fusebox.spec import SpecError, parse_spec

BASE = SPEC.read_text(encoding="utf-8")
REPO_LINE = "    repository: fusebox\n"  # fusebox.yaml's kubernetes.image.repository
assert BASE.count(REPO_LINE) == 1


@pytest.mark.parametrize("repo, named", [
    ("Acme/fusebox", "'Acme'"),            # Docker would take Acme for a registry host
    ("acme/Fusebox", "'Fusebox'"),
    ("ghcr.io/Acme/fusebox", "'Acme'"),    # the registry host may have capitals, the path not
    ("FuseBox", "'FuseBox'"),
])
def test_an_image_repository_with_capitals_is_refused_at_its_line(repo, named):
    text = BASE.replace(REPO_LINE, f"    repository: {repo}\n")
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "fusebox.yaml")
    (p,) = ei.value.problems
    assert p.line == text.splitlines().index(f"    repository: {repo}") + 1 and p.col == len("    repository: ") + 1
    assert p.what.startswith(f"{repo!r} is not an image repository: capital letters in {named}"), p.what
    assert "lower case" in p.fix


@pytest.mark.parametrize("repo", ["ghcr.io/acme/fusebox", "GHCR.io/acme/fusebox", "localhost:5000/fusebox",
                                  "registry.example.com:5000/ml/fuse-box", "acme/fusebox"])
def test_a_lower_case_repository_is_taken_as_written(repo):
    s = parse_spec(BASE.replace(REPO_LINE, f"    repository: {repo}\n"), "fusebox.yaml")
    assert s.kubernetes.image == f"{repo}:{s.raw['kubernetes']['image']['tag']}"


def _docs(outputs: dict[str, str]) -> list[dict]:
    return [d for k, v in outputs.items() if k.startswith("k8s/") for d in yaml.safe_load_all(v) if d and "kind" in d]


def test_empty_labels_break_no_selector_of_the_generated_k8s():
    assert "  labels: {}\n  # The Grafana dashboard sidecar" in BASE  # the starter spec's kubernetes.labels
    docs = _docs(render_all(parse_spec(BASE, "fusebox.yaml")))

    def covers(selector: dict, labels: dict) -> bool:
        return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

    pods = {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] in ("Deployment", "DaemonSet")}
    services = {d["metadata"]["name"]: d["metadata"]["labels"] for d in docs if d["kind"] == "Service"}
    checked = 0
    for d in docs:
        kind, name, spec = d["kind"], (d.get("metadata") or {}).get("name"), d.get("spec") or {}
        if kind in ("Deployment", "DaemonSet", "PodDisruptionBudget", "PodMonitor"):
            assert covers(spec["selector"]["matchLabels"], pods[name]), (kind, name)
        elif kind == "Service":
            assert covers(spec["selector"], pods[name]), (kind, name)
        elif kind == "ServiceMonitor":
            assert covers(spec["selector"]["matchLabels"], services[name]), (kind, name)
        else:
            continue
        checked += 1
    # collectors: DaemonSet, PodMonitor; fuse: Deployment, Service, PodDisruptionBudget, ServiceMonitor;
    # the CostQoS controller (scaling.workloads[].cost_qos): Deployment, PodMonitor
    assert checked == 8


@pytest.mark.parametrize("value", ['"monitoring\\n"', '"monitoring\\n\\n"'])
def test_a_namespace_ending_in_a_newline_is_refused_at_its_line(value):
    # Python's `$` also matches before a final newline: "monitoring\n" passed the DNS-label check and
    # reached kubectl (the k8s API refuses it, the generated files carried it).
    line = "  namespace: monitoring\n"
    assert BASE.count(line) == 1
    text = BASE.replace(line, f"  namespace: {value}\n")
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "fusebox.yaml")
    (p,) = [p for p in ei.value.problems if "namespace" in p.what or "DNS" in p.what]
    assert p.line == text.splitlines().index(f"  namespace: {value}") + 1
