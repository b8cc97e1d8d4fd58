"""Kubernetes manifests from the spec: the PrometheusRule and fusebox's own workloads.

Pure renderers, no I/O. Every object lands in the spec's ``kubernetes.namespace`` with its
``kubernetes.labels`` (e.g. ``release: kube-prometheus-stack``, which the chart's default
rule, ServiceMonitor and PodMonitor selectors match) plus ``app.kubernetes.io/*`` labels.

* ``k8s/prometheusrule.yml``: the rules as a ``monitoring.coreos.com/v1`` PrometheusRule;
* ``k8s/collectors.yml``: the collectors as a DaemonSet on GPU nodes (NVML through the NVIDIA
  container runtime), one container per collector serving /metrics on the pod IP, and the
  PodMonitor that scrapes them; with ``kubernetes.engines`` and a ``kv`` or ``latency`` collector,
  what engine discovery needs too: the ``fusebox-engines`` ConfigMap (``engines.yaml``), the
  collectors' ServiceAccount and the ClusterRole (or a Role per engine namespace) to get, list and
  watch pods, and the kubelet's pod-resources socket (hostPath, read-only) for the ``kv`` container;
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
           "render_discovery", "engines_config", "discovering", "self_contained_spec", "render_fuse_network_policy",
           "COLLECTORS_FILE", "FUSE_FILE", "KUSTOMIZATION_FILE", "SPEC_MOUNT", "TOKEN_MOUNT", "STATE_DIR",
           "ENGINES_MOUNT", "ENGINES_KEY", "POD_RESOURCES_DIR", "POD_RESOURCES_SOCKET"]

COLLECTORS_FILE = "k8s/collectors.yml"
FUSE_FILE = "k8s/fuse.yml"
ENGINES_FILE = "k8s/engines.yml"
KUSTOMIZATION_FILE = "k8s/kustomization.yaml"
SPEC_MOUNT = "/etc/fusebox"  # the spec ConfigMap, as fusebox.yaml
TOKEN_MOUNT = "/var/run/secrets/fusebox"  # the token Secret, as its key (token)
STATE_DIR = "/var/lib/fusebox"  # the fuse service's state directory (the PVC)
STORE_ENV = C.FUSE_STORE_ENV
_SPEC_KEY = "fusebox.yaml"
ENGINES_MOUNT = "/etc/fusebox/engines"  # the fusebox-engines ConfigMap in the collectors' pod
ENGINES_KEY = "engines.yaml"
COLLECTOR_SPEC_MOUNT = "/etc/fusebox/spec"  # the spec ConfigMap in the collectors' pod (latency: its buckets)
# The kubelet's pod-resources API (v1 List: which devices each pod's containers hold), the socket
# dcgm-exporter reads; the kv collector maps a discovered engine pod to its GPU UUIDs with it.
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
POD_RESOURCES_SOCKET = f"{POD_RESOURCES_DIR}/kubelet.sock"
NODE_NAME_ENV = "NODE_NAME"
DISCOVERING = ("kv", "latency")  # the collectors that find the engines on their node


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
    tests/e2e/test_k8s_cluster.py runs both on the chart's defaults).
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
    ]
    # The gpu collector: the NVIDIA container runtime mounts the driver's libnvidia-ml and the
    # devices: all GPUs of the node (it reads every one; it requests none, so GPUs stay
    # schedulable), and only the utility capability (NVML, nvidia-smi), no compute. kv and
    # latency never call NVML (in the DaemonSet they discover their engines, so kv has no --gpu to
    # read the memory of): "void", the toolkit's value for no GPU and no driver, as runc would.
    nvml = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}]
    no_gpu = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    found = discovering(spec)
    containers = []
    for collector, extra in c.run.items():
        port_name = f"metrics-{collector}"
        container: dict[str, Any] = {
            "name": collector, "image": k.image, "imagePullPolicy": k.pull_policy,
            "args": ["collect", collector, "--no-otlp", "--metrics-port", str(c.ports[collector]),
                     "--metrics-addr", f"$({C.ENV['metrics_addr']})", "--host-name", f"$({C.ENV['host_name']})",
                     "--cluster", f"$({C.ENV['cluster']})", *_discovery_args(collector, found), *extra],
            "env": env + (nvml if collector == "gpu" else no_gpu)
            + ([_env_field(NODE_NAME_ENV, "spec.nodeName")] if collector in found else []),
            "ports": [{"name": port_name, "containerPort": c.ports[collector], "protocol": "TCP"}],
            "readinessProbe": _probe(port_name, "/metrics", 10),
            "livenessProbe": _probe(port_name, "/metrics", 30) | {"initialDelaySeconds": 10},
            "resources": c.resources.manifest(),
            "securityContext": _security(),
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *_discovery_mounts(collector, found)],
        }
        if collector == "kv" and collector in found:
            # The kubelet's socket is root's (srwxr-xr-x root root on common distributions); connecting
            # to a Unix socket needs write permission on it, so this container runs as uid 0, as
            # dcgm-exporter does for the same socket -- without any capability, escalation or
            # writable root filesystem. Its namespace must admit hostPath volumes (Pod Security
            # "privileged"; "baseline" and "restricted" refuse hostPath).
            container["securityContext"] = {**_security(), "runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0}
        containers.append(container)
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,  # the collectors call no Kubernetes API
        "securityContext": {"runAsNonRoot": True, "runAsUser": C.IMAGE_UID, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": containers,
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    template_meta: dict[str, Any] = {"labels": {**_selector(name), C.K8S_PART_OF[0]: C.K8S_PART_OF[1]}}
    if found:
        # discovery lists and watches the engine pods with the collectors' ServiceAccount token
        pod["automountServiceAccountToken"] = True
        pod["serviceAccountName"] = C.K8S["collectors_account"]
        pod["volumes"].append({"name": "engines", "configMap": {"name": C.K8S["engines_configmap"]}})
        if "kv" in found:
            del pod["securityContext"]["runAsNonRoot"]  # the kv container runs as root (its securityContext says why)
            pod["volumes"].append({"name": "pod-resources", "hostPath": {"path": POD_RESOURCES_DIR, "type": "Directory"}})
        if "latency" in found:
            pod["volumes"].append({"name": "spec", "configMap": {"name": C.K8S["spec_configmap"]}})
        # a changed engines.yaml (a model added) rolls the pods: a ConfigMap mount alone would not restart them
        template_meta["annotations"] = {"fusebox/engines-sha256": hashlib.sha256(engines_yaml(spec).encode()).hexdigest()}
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
            "template": {"metadata": template_meta, "spec": pod},
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


def discovering(spec: Spec) -> tuple[str, ...]:
    """The collectors of ``kubernetes.collectors.run`` that discover the engine pods on their node
    (``kv``, ``latency``; the spec refuses them without ``kubernetes.engines``); none when the
    collectors are disabled."""
    c = spec.kubernetes.collectors
    if not c.enabled or spec.kubernetes.engines is None:
        return ()
    return tuple(n for n in c.run if n in DISCOVERING)


def _discovery_args(collector: str, found: tuple[str, ...]) -> list[str]:
    """``--discover engines.yaml --node-name $(NODE_NAME)`` (kv: and the pod-resources socket;
    latency: and the spec, for its buckets), as the collectors' CLI takes them."""
    if collector not in found:
        return []
    args = ["--discover", f"{ENGINES_MOUNT}/{ENGINES_KEY}", "--node-name", f"$({NODE_NAME_ENV})"]
    if collector == "kv":
        args += ["--pod-resources-socket", POD_RESOURCES_SOCKET]
    if collector == "latency":
        args += ["--spec", f"{COLLECTOR_SPEC_MOUNT}/{_SPEC_KEY}"]
    return args


def _discovery_mounts(collector: str, found: tuple[str, ...]) -> list[dict[str, Any]]:
    if collector not in found:
        return []
    mounts = [{"name": "engines", "mountPath": ENGINES_MOUNT, "readOnly": True}]
    if collector == "kv":
        mounts.append({"name": "pod-resources", "mountPath": POD_RESOURCES_DIR, "readOnly": True})
    if collector == "latency":
        mounts.append({"name": "spec", "mountPath": COLLECTOR_SPEC_MOUNT, "readOnly": True})
    return mounts


def engines_config(spec: Spec) -> dict[str, Any]:
    """``engines.yaml``, what the discovering collectors read (``kubernetes.engines`` resolved):
    ``{namespaces: [...] ([] = all), selector: {label: value}, port: name, path, models: {served
    model name: {layers, kv_heads, head_dim, dtype_bytes}}}`` -- every geometry as integers, the
    dtype's size in bytes after any ``kv_dtype``; bytes per token = 2 x the four."""
    e = spec.kubernetes.engines
    assert e is not None
    return {"namespaces": list(e.namespaces), "selector": dict(e.selector), "port": e.port, "path": e.path,
            "models": {name: {"layers": g.layers, "kv_heads": g.kv_heads, "head_dim": g.head_dim, "dtype_bytes": g.dtype_bytes}
                       for name, g in e.models.items()}}


def engines_yaml(spec: Spec) -> str:
    """:func:`engines_config` as the ConfigMap's ``engines.yaml`` text, with its header."""
    return "# Code generated by fusebox generate from kubernetes.engines. DO NOT EDIT.\n" + dump_yaml(engines_config(spec))


def render_discovery(spec: Spec) -> list[dict[str, Any]]:
    """What the discovering collectors need besides their DaemonSet: the ``fusebox-engines``
    ConfigMap (key ``engines.yaml``), the ServiceAccount ``fusebox-collectors``, and the right to
    get, list and watch pods: a ClusterRole and ClusterRoleBinding when ``kubernetes.engines.
    namespaces`` is empty (every namespace), else a Role and RoleBinding in each listed namespace.
    Empty when no collector discovers (:func:`discovering`)."""
    if not discovering(spec):
        return []
    ns = spec.kubernetes.namespace
    account = C.K8S["collectors_account"]
    e = spec.kubernetes.engines
    assert e is not None
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": object_meta(spec, C.K8S["engines_configmap"], "collectors"),
                 "data": {ENGINES_KEY: engines_yaml(spec)}}
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object_meta(spec, account, "collectors")}
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    subjects = [{"kind": "ServiceAccount", "name": account, "namespace": ns}]
    rbac: list[dict[str, Any]] = []
    if not e.namespaces:
        meta = object_meta(spec, account, "collectors")
        del meta["namespace"]  # cluster-scoped
        rbac += [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta, "rules": rules},
                 {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": dict(meta),
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": account},
                  "subjects": subjects}]
    for where in e.namespaces:
        meta = object_meta(spec, account, "collectors", namespace=where)
        rbac += [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
                 {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": dict(meta),
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
                  "subjects": subjects}]
    return [configmap, sa, *rbac]


def self_contained_spec(spec: Spec) -> dict[str, Any]:
    """``spec.raw`` with each ``kubernetes.engines.models`` entry as its resolved geometry (``{layers,
    kv_heads, head_dim, dtype}``) instead of a ``config:`` path: the copy the pods read (the spec
    ConfigMap) loads where the config.json files are not. The dtype is named by its size (float32,
    bfloat16, fp8): only the size counts."""
    e = spec.kubernetes.engines
    raw = spec.raw
    if e is None or not e.models:
        return raw
    names = {4: "float32", 2: "bfloat16", 1: "fp8"}
    models = {name: {"layers": g.layers, "kv_heads": g.kv_heads, "head_dim": g.head_dim, "dtype": names[g.dtype_bytes]}
              for name, g in e.models.items()}
    kube = {**raw["kubernetes"], "engines": {**raw["kubernetes"]["engines"], "models": models}}
    return {**raw, "kubernetes": kube}


def _spec_configmap(spec: Spec, component: str) -> tuple[dict[str, Any], str]:
    """The spec ConfigMap (key fusebox.yaml, :func:`self_contained_spec`) and its text."""
    text = dump_yaml(self_contained_spec(spec))
    return ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": object_meta(spec, C.K8S["spec_configmap"], component),
             "data": {_SPEC_KEY: text}}, text)


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
    ServiceMonitor, NetworkPolicy (:func:`render_fuse_network_policy`, unless disabled).

    SQLite (the default): one replica, strategy Recreate: the state (breaker, outbox, audit) is one
    file, which has one writer; two pods would each keep their own state and both act on every
    alert, and a rolling update would run two for a while. PostgreSQL (``store_secret``): the URL
    from the Secret in env ``FUSEBOX_FUSE_STORE``, no PVC, ``replicas`` pods spread over nodes,
    RollingUpdate (replicas share the state), and with two or more a PDB of ``minAvailable: 1``.
    """
    k, f = spec.kubernetes, spec.kubernetes.fuse
    name, port = C.K8S["fuse"], C.K8S["fuse_port"]
    configmap, spec_text = _spec_configmap(spec, "fuse")
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
            *([{"name": "gateway-key", "mountPath": C.K8S["gateway_key_dir"], "readOnly": True}] if f.gateway_secret else []),
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
                        # the gateways' control-plane key (fuse.adapters.*.credentials_file), a whole-folder
                        # mount (not subPath), so a rotated Secret reaches the running pod
                        *([{"name": "gateway-key", "secret": {
                            "secretName": f.gateway_secret[0], "defaultMode": 0o440,
                            "items": [{"key": f.gateway_secret[1], "path": f.gateway_secret[1]}]}}] if f.gateway_secret else []),
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
    return [configmap, *([] if pg else [pvc]), deployment, service, pdb, servicemonitor,
            *([render_fuse_network_policy(spec)] if f.network_policy.enabled else [])]


# The label the API server puts on every namespace, its name (Kubernetes >= 1.21).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def render_fuse_network_policy(spec: Spec) -> dict[str, Any]:
    """The fuse's NetworkPolicy: ingress to its port only from Alertmanager's pods (the webhook)
    and Prometheus' pods (the scrape of /metrics), selected by ``kubernetes.fuse.network_policy``'s
    labels in its namespace (the Prometheus Operator's ``app.kubernetes.io/name`` by default, in
    ``kubernetes.namespace``). Egress is not restricted (policyTypes: Ingress only): the fuse calls
    gateways at the addresses its adapters name or discover, PostgreSQL and Prometheus, which no
    selector known here covers. Enforced only by a network plugin that implements NetworkPolicy;
    the kubelet's probes come from the node, which a NetworkPolicy always lets in."""
    n = spec.kubernetes.fuse.network_policy
    namespace = {"matchLabels": {NAMESPACE_NAME_LABEL: n.namespace or spec.kubernetes.namespace}}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": object_meta(spec, C.K8S["fuse"], "fuse"),
        "spec": {
            "podSelector": {"matchLabels": _selector(C.K8S["fuse"])},
            "policyTypes": ["Ingress"],
            # one peer per client: namespaceSelector and podSelector in ONE peer must both match
            "ingress": [{"from": [{"namespaceSelector": namespace, "podSelector": {"matchLabels": dict(who)}}
                                  for who in (n.alertmanager, n.prometheus)],
                         "ports": [{"protocol": "TCP", "port": C.K8S["fuse_port"]}]}],
        },
    }


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
        # the latency collector reads the spec's buckets from the spec ConfigMap, k8s/fuse.yml's when the fuse runs
        own_spec = [_spec_configmap(spec, "collectors")[0]] if "latency" in discovering(spec) and not spec.kubernetes.fuse.enabled else []
        out[COLLECTORS_FILE] = _documents(h, [*render_discovery(spec), *own_spec, *render_collectors(spec)])
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
