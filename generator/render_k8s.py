"""Kubernetes manifests from the spec: the PrometheusRule and fusebox's own workloads.

Pure renderers, no I/O. Every object lands in the spec's ``kubernetes.namespace`` with its
``kubernetes.labels`` (e.g. ``release: kube-prometheus-stack``, which the chart's default
rule, ServiceMonitor and PodMonitor selectors match) plus ``app.kubernetes.io/*`` labels.

* ``k8s/prometheusrule.yml``: the rules as a ``monitoring.coreos.com/v1`` PrometheusRule;
* ``k8s/collectors.yml``: the collectors as a DaemonSet on GPU nodes (NVML through the NVIDIA
  container runtime), one container per collector serving /metrics on the pod IP, and the
  PodMonitor that scrapes them;
* ``k8s/fuse.yml``: the fuse service: the spec as a ConfigMap, a PersistentVolumeClaim for its
  SQLite state, a one-replica Deployment (strategy Recreate), its Service, PodDisruptionBudget
  and ServiceMonitor; its webhook token comes from the user's Secret ``fusebox-fuse-token``;
* ``k8s/kustomization.yaml``: every generated ``k8s/`` manifest, for ``kubectl apply -k k8s/``.

Names: :data:`fusebox.conventions.K8S`. Details and the reasons: docs/kubernetes.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from fusebox import conventions as C
from fusebox.spec import Spec
from fusebox.spec.deploy import object_name
from fusebox.spec.units import format_duration

from .render_rules import Rules, gpu_power_backend
from .yamlout import dump_yaml

__all__ = ["render_prometheusrule", "render_collectors", "render_fuse", "render_kustomization", "workload_outputs", "kustomization_output",
           "COLLECTORS_FILE", "FUSE_FILE", "KUSTOMIZATION_FILE", "SPEC_MOUNT", "TOKEN_MOUNT", "STATE_DIR"]

COLLECTORS_FILE = "k8s/collectors.yml"
FUSE_FILE = "k8s/fuse.yml"
ENGINES_FILE = "k8s/engines.yml"
KUSTOMIZATION_FILE = "k8s/kustomization.yaml"
SPEC_MOUNT = "/etc/fusebox"  # the spec ConfigMap, as fusebox.yaml
TOKEN_MOUNT = "/var/run/secrets/fusebox"  # the token Secret, as its key (token)
STATE_DIR = "/var/lib/fusebox"  # the fuse service's state directory (the PVC)
STORE_ENV = C.FUSE_STORE_ENV
_SPEC_KEY = "fusebox.yaml"


def object_meta(spec: Spec, name: str, component: str | None = None, app: str | None = None, *,
                namespace: str | None = None, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """metadata: name, the spec's namespace, its labels and fusebox's (fusebox's win a clash).

    ``namespace`` / ``labels``, when given, stand for the spec's ``kubernetes.namespace`` /
    ``kubernetes.labels`` (a renderer's options that came from them)."""
    out = dict(spec.kubernetes.labels if labels is None else labels)
    out.update(_selector(app or name))
    out[C.K8S_PART_OF[0]] = C.K8S_PART_OF[1]
    if component:
        out["app.kubernetes.io/component"] = component
    return {"name": name, "namespace": spec.kubernetes.namespace if namespace is None else namespace, "labels": out}


def _selector(name: str) -> dict[str, str]:
    # Selectors are immutable on Deployments and DaemonSets: one label that never changes.
    return {"app.kubernetes.io/name": name}


def _own_namespace_alerts(spec: Spec) -> frozenset[str]:
    """The alerts of signals whose ``by`` holds ``namespace``: their series carry their own
    namespace, which a static label would overwrite (spec_warnings says what that means for the
    fuse route)."""
    return frozenset(s.alert for s in spec.signals if "namespace" in (s.by or ()))


def _operator_labels(spec: Spec, rule: dict[str, Any], keep_own: frozenset[str]) -> dict[str, Any]:
    """``rule`` with ``namespace: <kubernetes.namespace>`` among its labels: every alert (a signal
    whose ``by`` holds ``namespace`` keeps its own). The operator's default
    ``alertmanagerConfigMatcherStrategy`` (``OnNamespace``) adds ``namespace="<the
    AlertmanagerConfig's namespace>"`` to the route of ``k8s/alertmanagerconfig.yml``; fusebox's
    GPU, engine and host alerts aggregate the namespace away, so without the label the route takes
    none of them: on kube-prometheus-stack's defaults (root receiver ``null``) the fuse would get no
    critical and the people (``fuse.human_receiver``, in that route) no alert at all. The price, on
    the chart's default inhibit rule (``severity=critical`` mutes ``severity=~warning|info`` with
    equal ``namespace`` and ``alertname``): while one scope's critical fires, the same alert's
    warnings of other scopes are muted (docs/alertmanager.md, "The Prometheus Operator";
    tests/test_k8s_cluster.py runs both on the chart's defaults).
    """
    labels = rule.get("labels") or {}
    alert = rule.get("alert")
    if not alert or alert in keep_own or "namespace" in labels:
        return rule
    return {**rule, "labels": {**labels, "namespace": spec.kubernetes.namespace}}


def render_prometheusrule(spec: Spec, rules: Rules) -> dict[str, Any]:
    """The PrometheusRule: ``{apiVersion, kind, metadata, spec: {groups}}`` (``spec`` last): the
    rules of ``rules``, with the ``namespace`` label of :func:`_operator_labels` on every alert."""
    meta = object_meta(spec, object_name(spec.name), "alert-rules", app="fusebox")
    meta["labels"]["role"] = "alert-rules"
    keep = _own_namespace_alerts(spec)
    groups = [{**g, "rules": [_operator_labels(spec, r, keep) for r in g.get("rules", [])]} for g in rules.groups]
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": meta,
            "spec": {"groups": groups}}


def _security(read_only: bool = True) -> dict[str, Any]:
    """A restricted-profile container: non-root, nothing escalated, every capability dropped."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": read_only, "runAsNonRoot": True,
            "runAsUser": C.IMAGE_UID, "runAsGroup": C.IMAGE_UID, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}


def _env_field(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _probe(port: str, path: str, period: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "timeoutSeconds": 5, "failureThreshold": 3}


def render_collectors(spec: Spec) -> list[dict[str, Any]]:
    """The collectors' DaemonSet and PodMonitor.

    Each collector of ``kubernetes.collectors.run`` is a container running
    ``fusebox collect NAME --no-otlp --metrics-port PORT --metrics-addr <pod IP>`` with the node
    name as ``--host-name`` and ``kubernetes.collectors.cluster`` as ``--cluster``; the same
    values are in the environment (``FUSEBOX_*``, the collectors' own defaults).
    """
    k, c = spec.kubernetes, spec.kubernetes.collectors
    name = C.K8S["collectors"]
    interval = format_duration(spec.scrape_interval_s)
    env = [
        _env_field(C.ENV["host_name"], "spec.nodeName"),
        _env_field(C.ENV["metrics_addr"], "status.podIP"),
        {"name": C.ENV["cluster"], "value": c.cluster},
        # The NVIDIA container runtime mounts the driver's libnvidia-ml and the devices: all GPUs of
        # the node (the collector reads every one; it requests none, so GPUs stay schedulable),
        # and only the utility capability (NVML, nvidia-smi), no compute.
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
    ]
    containers = []
    for collector, extra in c.run.items():
        port_name = f"metrics-{collector}"
        containers.append({
            "name": collector, "image": k.image, "imagePullPolicy": k.pull_policy,
            "args": ["collect", collector, "--no-otlp", "--metrics-port", str(c.ports[collector]),
                     "--metrics-addr", f"$({C.ENV['metrics_addr']})", "--host-name", f"$({C.ENV['host_name']})",
                     "--cluster", f"$({C.ENV['cluster']})", *extra],
            "env": env,
            "ports": [{"name": port_name, "containerPort": c.ports[collector], "protocol": "TCP"}],
            "readinessProbe": _probe(port_name, "/metrics", 10),
            "livenessProbe": _probe(port_name, "/metrics", 30) | {"initialDelaySeconds": 10},
            "resources": c.resources.manifest(),
            "securityContext": _security(),
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        })
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,  # the collectors call no Kubernetes API
        "securityContext": {"runAsNonRoot": True, "runAsUser": C.IMAGE_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": containers,
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    if c.runtime_class_name:
        pod["runtimeClassName"] = c.runtime_class_name
    if c.node_selector:
        pod["nodeSelector"] = dict(c.node_selector)
    if c.tolerations:
        pod["tolerations"] = [dict(t) for t in c.tolerations]
    daemonset = {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": object_meta(spec, name, "collectors"),
        "spec": {
            "selector": {"matchLabels": _selector(name)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": {**_selector(name), C.K8S_PART_OF[0]: C.K8S_PART_OF[1]}}, "spec": pod},
        },
    }
    podmonitor = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": object_meta(spec, name, "collectors"),
        "spec": {
            "selector": {"matchLabels": _selector(name)},
            # honorLabels: the collectors' own labels (host_name, cluster, hw_id ...) are the rules' labels
            "podMetricsEndpoints": [{"port": f"metrics-{collector}", "path": "/metrics", "interval": interval,
                                     "honorLabels": True, "relabelings": [dict(SHARD_BY_NODE)]} for collector in c.run],
        },
    }
    return [daemonset, podmonitor]


# Prometheus Operator `shards`: each shard keeps the targets whose hashmod of `__tmp_hash` (by
# default the target's `__address__`) is its own number. The rules join a GPU's series with its
# engines' (KV pools on hw_id, power and tokens on host_name), all from pods on one node: hashing
# the node keeps them on one shard (docs/rule-engines.md, "Sharding"). Without shards it changes nothing.
SHARD_BY_NODE = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "__tmp_hash", "action": "replace"}
# Targets every shard scrapes: the fuse (one per cluster; its self-monitoring alerts run on every shard).
SHARD_EVERYWHERE = {"targetLabel": "__tmp_disable_sharding", "replacement": "true", "action": "replace"}


def render_engines_monitor(spec: Spec) -> dict[str, Any]:
    """The engines' PodMonitor (``kubernetes.engines``): scrapes the engine pods' ``/metrics`` and
    adds what the records joining engine series with GPU series group by (``by (cluster,
    host_name)``: energy per generated token, prefix-cache hit rate): ``host_name`` from the
    node the pod runs on (``__meta_kubernetes_pod_node_name``) and ``cluster``
    (``kubernetes.collectors.cluster``), as the collectors label the GPUs; no ``cluster`` where GPU
    power comes from dcgm-exporter, whose series carry none (the join must match on both sides).
    A ServiceMonitor of your own needs the same relabelings, else those records stay empty."""
    e = spec.kubernetes.engines
    assert e is not None
    name = C.K8S["engines"]
    ns_sel: dict[str, Any] = {"matchNames": list(e.namespaces)} if e.namespaces else {"any": True}
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": C.LABEL["host"], "action": "replace"},
               dict(SHARD_BY_NODE)]
    if gpu_power_backend(spec) != "dcgm":  # dcgm-exporter's series carry no cluster label to join with
        relabel.append({"targetLabel": C.LABEL["cluster"], "replacement": spec.kubernetes.collectors.cluster,
                        "action": "replace"})
    return {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": object_meta(spec, name, "engines"),
        "spec": {
            "selector": {"matchLabels": dict(e.selector)},
            "namespaceSelector": ns_sel,
            "podMetricsEndpoints": [{
                "port": e.port, "path": e.path, "interval": format_duration(spec.scrape_interval_s),
                "relabelings": relabel,
            }],
        },
    }


def render_fuse(spec: Spec) -> list[dict[str, Any]]:
    """The fuse service: spec ConfigMap, state PVC (SQLite), Deployment, Service, PodDisruptionBudget,
    ServiceMonitor.

    SQLite (the default): one replica, strategy Recreate: the state (breaker, outbox, audit) is one
    file, which has one writer; two pods would each keep their own state and both act on every
    alert, and a rolling update would run two for a while. PostgreSQL (``store_secret``): the URL
    from the Secret in env ``FUSEBOX_FUSE_STORE``, no PVC, ``replicas`` pods spread over nodes,
    RollingUpdate (replicas share the state), and with two or more a PDB of ``minAvailable: 1``.
    """
    k, f = spec.kubernetes, spec.kubernetes.fuse
    name, port = C.K8S["fuse"], C.K8S["fuse_port"]
    spec_text = dump_yaml(spec.raw)
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": object_meta(spec, C.K8S["spec_configmap"], "fuse"),
                 "data": {_SPEC_KEY: spec_text}}
    pvc_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": f.state_size}}}
    if f.storage_class is not None:
        pvc_spec["storageClassName"] = f.storage_class
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": object_meta(spec, C.K8S["fuse_state"], "fuse"),
           "spec": pvc_spec}
    pg = f.store_secret is not None
    where = [] if pg else ["--state-dir", STATE_DIR]
    container = {
        "name": "fuse", "image": k.image, "imagePullPolicy": k.pull_policy,
        "args": ["fuse", "serve", "--spec", f"{SPEC_MOUNT}/{_SPEC_KEY}", "--listen", f"0.0.0.0:{port}",
                 "--webhook-token-file", f"{TOKEN_MOUNT}/{C.K8S['token_key']}", *where,
                 *(["--prometheus-url", f.prometheus_url] if f.prometheus_url else []), *f.args],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": _probe("http", "/readyz", 10),
        "livenessProbe": _probe("http", "/healthz", 30) | {"initialDelaySeconds": 10},
        "resources": f.resources.manifest(),
        "securityContext": _security(),
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
            {"name": "token", "mountPath": TOKEN_MOUNT, "readOnly": True},
            *([] if pg else [{"name": "state", "mountPath": STATE_DIR}]),
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    if f.store_secret is not None:
        # the URL (with its password) in the environment, not in the args `ps` shows
        container["env"] = [{"name": STORE_ENV, "valueFrom": {"secretKeyRef": {
            "name": f.store_secret[0], "key": f.store_secret[1]}}}]
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": object_meta(spec, name, "fuse"),
        "spec": {
            "replicas": f.replicas,  # SQLite: 1, one writer (see the docstring)
            "strategy": ({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}} if pg
                         else {"type": "Recreate"}),
            "selector": {"matchLabels": _selector(name)},
            "template": {
                "metadata": {"labels": {**_selector(name), C.K8S_PART_OF[0]: C.K8S_PART_OF[1]},
                             # a changed spec rolls the pod (a ConfigMap mount alone would not restart it)
                             "annotations": {"fusebox/spec-sha256": hashlib.sha256(spec_text.encode()).hexdigest()}},
                "spec": {
                    "automountServiceAccountToken": False,  # the fuse calls no Kubernetes API
                    "securityContext": {"runAsNonRoot": True, "runAsUser": C.IMAGE_UID, "fsGroup": C.IMAGE_UID,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [
                        {"name": "spec", "configMap": {"name": C.K8S["spec_configmap"]}},
                        # the user's Secret (kubectl create secret generic fusebox-fuse-token --from-file=token=...)
                        {"name": "token", "secret": {"secretName": C.K8S["token_secret"], "defaultMode": 0o440,
                                                     "items": [{"key": C.K8S["token_key"], "path": C.K8S["token_key"]}]}},
                        *([] if pg else [{"name": "state", "persistentVolumeClaim": {"claimName": C.K8S["fuse_state"]}}]),
                        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": object_meta(spec, name, "fuse"),
        "spec": {"selector": _selector(name), "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]},
    }
    budget = {"minAvailable": 1} if f.replicas > 1 else {"maxUnavailable": f.max_unavailable}
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": object_meta(spec, name, "fuse"),
           "spec": {**budget, "selector": {"matchLabels": _selector(name)}}}
    if f.replicas > 1:  # one node lost takes one replica
        pod_spec = deployment["spec"]["template"]["spec"]
        pod_spec["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": _selector(name)},
                                                "topologyKey": "kubernetes.io/hostname"}}]}}
    servicemonitor = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": object_meta(spec, name, "fuse"),
        "spec": {
            "selector": {"matchLabels": _selector(name)},
            # honorLabels: the fuse's level series carry the alert's scope labels (hw_id, engine ...)
            "endpoints": [{"port": "http", "path": "/metrics", "interval": format_duration(spec.scrape_interval_s),
                           "honorLabels": True, "relabelings": [dict(SHARD_EVERYWHERE)]}],
        },
    }
    return [configmap, *([] if pg else [pvc]), deployment, service, pdb, servicemonitor]


def render_kustomization(spec: Spec, resources: list[str]) -> dict[str, Any]:
    """``kustomization.yaml`` listing ``resources`` (paths relative to k8s/), sorted."""
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": sorted(resources)}


def _documents(header: str, docs: list[dict[str, Any]]) -> str:
    return header + "".join("---\n" + dump_yaml(d) for d in docs)


def workload_outputs(spec: Spec, header: str) -> dict[str, str]:
    """``{path: text}`` of the workloads' files the spec enables (``k8s/collectors.yml``, ``k8s/fuse.yml``,
    ``k8s/engines.yml``)."""
    h = f"# {header}\n"
    out = {}
    if spec.kubernetes.collectors.enabled:
        out[COLLECTORS_FILE] = _documents(h, render_collectors(spec))
    if spec.kubernetes.fuse.enabled:
        out[FUSE_FILE] = _documents(h, render_fuse(spec))
    if spec.kubernetes.engines is not None:
        out[ENGINES_FILE] = _documents(h, [render_engines_monitor(spec)])
    return out


def kustomization_output(spec: Spec, header: str, paths: list[str]) -> dict[str, str]:
    """``{k8s/kustomization.yaml: text}`` listing every generated manifest among ``paths``."""
    resources = [p.removeprefix("k8s/") for p in paths
                 if p.startswith("k8s/") and p.endswith((".yml", ".yaml")) and p != KUSTOMIZATION_FILE]
    return {KUSTOMIZATION_FILE: f"# {header}\n" + dump_yaml(render_kustomization(spec, resources))}
