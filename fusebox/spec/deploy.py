"""Where the outputs run: the spec's ``kubernetes:``, ``grafana:`` and ``otelcol:`` blocks.

Raw (pydantic) shapes, their semantic checks and the frozen, normalised values the renderers read:

* ``kubernetes:``: namespace and labels of every generated manifest, the Grafana dashboard
  sidecar's label and folder annotation, the image, the collectors' DaemonSet and the fuse
  service's Deployment (generator/render_k8s.py);
* ``grafana:``: the file provisioning (generator/render_grafana_provisioning.py);
* ``otelcol:``: the OpenTelemetry Collector config (generator/render_otelcol.py).

Objects Kubernetes itself defines (tolerations, resources) keep Kubernetes' own spelling, so they
can be copied from a manifest; the block's own keys are snake_case like the rest of the spec.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from fusebox import conventions as C

from .k8sengines import Engines, RawEngines, normalise_engines
from .k8snames import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    IMAGE_TAG,
    K8S_LABEL_NAME,
    LABEL_FIX,
    QUANTITY,
    Err,
    check_labels,
    check_port,
    image_repository_problem,
    object_name,
)
from .traces import RawTraces, Traces, normalise_traces

COLLECTORS = ("gpu", "kv", "latency")  # `fusebox collect NAME` that may run in the DaemonSet


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class RawImage(_Strict):
    repository: StrictStr = C.IMAGE[0]
    tag: StrictStr = C.IMAGE[1]
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"


class RawGrafanaSidecar(_Strict):
    # kube-prometheus-stack's Grafana sidecar (grafana.sidecar.dashboards): label grafana_dashboard,
    # labelValue "1"; it reads the folder annotation only when its folderAnnotation names it.
    sidecar_label: StrictStr = "grafana_dashboard"
    sidecar_label_value: StrictStr = "1"
    folder_annotation: StrictStr = "grafana_folder"


class RawToleration(_Strict):
    key: StrictStr | None = None
    operator: Literal["Exists", "Equal"] = "Exists"
    value: StrictStr | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: StrictInt | None = None


def _quantity_text(v: Any) -> Any:
    """``cpu: 1`` as ``"1"``: YAML reads a bare quantity as a number (a boolean stays an error)."""
    return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


Quantity = Annotated[StrictStr, BeforeValidator(_quantity_text)]


class RawResources(_Strict):
    requests: dict[StrictStr, Quantity] = {}
    limits: dict[StrictStr, Quantity] = {}


class RawCollectors(_Strict):
    enabled: StrictBool = True
    # GPU nodes: the label NVIDIA's GPU feature discovery / GPU Operator sets.
    node_selector: dict[StrictStr, StrictStr] = {"nvidia.com/gpu.present": "true"}
    tolerations: list[RawToleration] = [RawToleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")]
    # NVML comes from the NVIDIA container runtime; "" leaves runtimeClassName out (the runtime is the node's default).
    runtime_class_name: StrictStr = "nvidia"
    resources: RawResources = RawResources(requests={"cpu": "50m", "memory": "128Mi"}, limits={"cpu": "500m", "memory": "256Mi"})
    # collector name -> extra `fusebox collect NAME` arguments; each runs as one container
    run: dict[StrictStr, list[StrictStr]] = {"gpu": []}
    port: StrictInt = 9410  # the first collector's /metrics port; the next ones take port + 1, + 2 ...
    cluster: StrictStr | None = None  # the `cluster` label; default: the spec's metadata.name


class RawSecretRef(_Strict):
    name: StrictStr
    key: StrictStr


# kube-prometheus-stack's Alertmanager and Prometheus pods as the Prometheus Operator labels them
# (v0.85.0 makeSelectorLabels, pkg/alertmanager/operator.go and pkg/prometheus/server/operator.go):
# app.kubernetes.io/name is "alertmanager" / "prometheus" whatever the release's name.
ALERTMANAGER_POD_LABELS = {"app.kubernetes.io/name": "alertmanager"}
PROMETHEUS_POD_LABELS = {"app.kubernetes.io/name": "prometheus"}


class RawNetworkPolicy(_Strict):
    enabled: StrictBool = True
    # where Alertmanager and Prometheus run (kube-prometheus-stack's release namespace); None: kubernetes.namespace
    namespace: StrictStr | None = None
    alertmanager: dict[StrictStr, StrictStr] = dict(ALERTMANAGER_POD_LABELS)  # their pods' labels
    prometheus: dict[StrictStr, StrictStr] = dict(PROMETHEUS_POD_LABELS)


class RawFuseWorkload(_Strict):
    enabled: StrictBool = True
    # More than one replica needs the PostgreSQL store (SQLite has one writer): store_secret names
    # the Secret key holding its postgresql:// URL (env FUSEBOX_FUSE_STORE, not in the pod's args).
    replicas: StrictInt = 1
    store_secret: RawSecretRef | None = None
    # The Secret key holding the gateways' control-plane key (smg --control-plane-api-keys), mounted
    # under K8S gateway_key_dir; fuse.adapters.<name>.credentials_file names <that folder>/<key>.
    gateway_secret: RawSecretRef | None = None
    resources: RawResources = RawResources(requests={"cpu": "50m", "memory": "128Mi"}, limits={"cpu": "1", "memory": "512Mi"})
    # The SQLite state (breaker state, outbox, audit) on a PersistentVolumeClaim of this size.
    state_size: Quantity = "1Gi"
    storage_class: StrictStr | None = None  # None: the cluster's default StorageClass
    # PodDisruptionBudget: how many of the one replica a drain may evict (0 blocks `kubectl drain`).
    max_unavailable: StrictInt = 1
    args: list[StrictStr] = ["--dry-run"]  # more `fusebox fuse serve` arguments (--gateway-url URL ...)
    # --prometheus-url for fuse.adapters.*.discover, e.g. kube-prometheus-stack's Service
    # http://<fullname>-prometheus.<namespace>:9090 (release kps: kps-kube-prometheus-stack-prometheus)
    prometheus_url: StrictStr | None = None
    # the NetworkPolicy of k8s/fuse.yml: only these pods reach the fuse's port
    network_policy: RawNetworkPolicy = RawNetworkPolicy()


class RawKubernetes(_Strict):
    # Namespace and labels of every generated Kubernetes object (PrometheusRule, ConfigMaps,
    # AlertmanagerConfig, workloads), e.g. labels: {release: kube-prometheus-stack} for the
    # Prometheus Operator's default ruleSelector.
    namespace: StrictStr = "monitoring"
    labels: dict[StrictStr, StrictStr] = {}
    grafana: RawGrafanaSidecar = RawGrafanaSidecar()
    image: RawImage = RawImage()
    collectors: RawCollectors = RawCollectors()
    fuse: RawFuseWorkload = RawFuseWorkload()
    # A PodMonitor for the engines (k8s/engines.yml) that adds host_name (the node) and cluster
    # to their series; None: your own ServiceMonitor or PodMonitor scrapes them.
    engines: RawEngines | None = None


class RawGrafana(_Strict):
    prometheus_url: StrictStr = "http://prometheus:9090"
    dashboards_path: StrictStr = "/var/lib/grafana/dashboards/fusebox"
    folder: StrictStr = "fusebox"
    # Where traces go, as Grafana reaches it: a Jaeger query service (docker-compose's would be
    # http://jaeger:16686). Set: a Jaeger data source (uid jaeger) and the Prometheus data source's
    # exemplars linked to it by trace_id (docs/exemplars.md). None: neither.
    traces_url: StrictStr | None = None


class RawOtelcol(_Strict):
    remote_write_url: StrictStr | None = None
    debug: StrictBool = False
    scrape_targets: list[StrictStr] = []
    scrape_interval: Any | None = None  # a duration; None: global.scrape_interval
    memory_limit_percentage: Annotated[StrictInt, Field(ge=1, le=100)] = 80
    memory_spike_percentage: Annotated[StrictInt, Field(ge=1, le=100)] = 20
    # The traces pipeline (OTLP in, OTLP gRPC out to a trace backend) and its span metrics
    # (fusebox/spec/traces.py, docs/exemplars.md). None: no traces pipeline.
    traces: RawTraces | None = None


# ------------------------------------------------------------------------ normalised
@dataclass(frozen=True)
class Resources:
    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)

    def manifest(self) -> dict[str, dict[str, str]]:
        """The container's ``resources`` (empty maps left out)."""
        return {k: dict(v) for k, v in (("requests", self.requests), ("limits", self.limits)) if v}


@dataclass(frozen=True)
class Collectors:
    """The collectors' DaemonSet: one container per collector, each serving /metrics on ``ports[name]``."""

    enabled: bool = True
    node_selector: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    tolerations: tuple[dict[str, Any], ...] = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)
    runtime_class_name: str = "nvidia"
    resources: Resources = Resources({"cpu": "50m", "memory": "128Mi"}, {"cpu": "500m", "memory": "256Mi"})
    run: dict[str, tuple[str, ...]] = field(default_factory=lambda: {"gpu": ()})
    ports: dict[str, int] = field(default_factory=lambda: {"gpu": 9410})
    cluster: str = ""


@dataclass(frozen=True)
class NetworkPolicy:
    """``kubernetes.fuse.network_policy``: the pods allowed to reach the fuse's port (the ingress of
    the generated NetworkPolicy), Alertmanager's and Prometheus', by their labels, in ``namespace``
    (None: ``kubernetes.namespace``)."""

    enabled: bool = True
    namespace: str | None = None
    alertmanager: dict[str, str] = field(default_factory=lambda: dict(ALERTMANAGER_POD_LABELS))
    prometheus: dict[str, str] = field(default_factory=lambda: dict(PROMETHEUS_POD_LABELS))


@dataclass(frozen=True)
class FuseWorkload:
    """The fuse service's Deployment, Service, PVC (SQLite) and PDB: one replica on SQLite, or
    ``replicas`` on the PostgreSQL store whose URL is in Secret ``store_secret`` = (name, key)
    (see docs/kubernetes.md)."""

    enabled: bool = True
    replicas: int = 1
    store_secret: tuple[str, str] | None = None
    resources: Resources = Resources({"cpu": "50m", "memory": "128Mi"}, {"cpu": "1", "memory": "512Mi"})
    state_size: str = "1Gi"
    storage_class: str | None = None
    max_unavailable: int = 1
    args: tuple[str, ...] = ("--dry-run",)
    prometheus_url: str | None = None  # the Deployment's --prometheus-url (GPU-to-worker discovery)
    # (Secret name, key) of the gateways' control-plane key, mounted at gateway_key_file()
    gateway_secret: tuple[str, str] | None = None
    network_policy: NetworkPolicy = field(default_factory=NetworkPolicy)

    def gateway_key_file(self) -> str | None:
        """Where the Deployment mounts ``gateway_secret``'s key (None: no Secret named)."""
        return f"{C.K8S['gateway_key_dir']}/{self.gateway_secret[1]}" if self.gateway_secret else None


@dataclass(frozen=True)
class Kubernetes:
    """The ``kubernetes:`` block: namespace and labels of every generated manifest, and the rest."""

    namespace: str = "monitoring"
    labels: dict[str, str] = field(default_factory=dict)
    sidecar_label: str = "grafana_dashboard"
    sidecar_label_value: str = "1"
    folder_annotation: str = "grafana_folder"
    image: str = ":".join(C.IMAGE)
    pull_policy: str = "IfNotPresent"
    collectors: Collectors = field(default_factory=Collectors)
    fuse: FuseWorkload = field(default_factory=FuseWorkload)
    engines: Engines | None = None


@dataclass(frozen=True)
class Grafana:
    """The ``grafana:`` block (Grafana file provisioning)."""

    prometheus_url: str = "http://prometheus:9090"
    dashboards_path: str = "/var/lib/grafana/dashboards/fusebox"
    folder: str = "fusebox"
    traces_url: str | None = None  # the Jaeger query service exemplars link to; None: no link


@dataclass(frozen=True)
class Otelcol:
    """The ``otelcol:`` block. ``scrape_interval_s`` None: the spec's scrape interval."""

    remote_write_url: str | None = None
    debug: bool = False
    scrape_targets: tuple[str, ...] = ()
    scrape_interval_s: float | None = None
    memory_limit_percentage: int = 80
    memory_spike_percentage: int = 20
    traces: Traces | None = None


# ------------------------------------------------------------------------ validation


def _check_resources(r: RawResources, path: tuple, err: Err) -> Resources:
    for part in ("requests", "limits"):
        for name, q in getattr(r, part).items():
            if name not in ("cpu", "memory", "ephemeral-storage"):
                err(path + (part, name), f"unknown resource {name!r}", "use cpu, memory or ephemeral-storage", key=True)
            elif not QUANTITY.match(q):
                err(path + (part, name), f"{q!r} is not a Kubernetes quantity", "e.g. cpu: 100m, memory: 256Mi")
    return Resources(dict(r.requests), dict(r.limits))


def normalise_kubernetes(k: RawKubernetes, spec_name: str, err: Err, base_dir: Path | None = None) -> Kubernetes:
    """Check the ``kubernetes:`` block; ``err(path, what, fix, key=False)`` records each problem.
    ``base_dir``: the folder ``kubernetes.engines.models.*.config`` paths are relative to (the
    spec's; None: the working directory)."""
    p = ("kubernetes",)
    if spec_name.strip() and not DNS_LABEL.match(object_name(spec_name)):
        err(("metadata", "name"), f"metadata.name {spec_name!r} has no letter a-z or digit to name the Kubernetes objects "
            "(fusebox-<its letters and digits, lowercased>)", "use lowercase letters, digits and '-', e.g. multimodal-inference")
    if not DNS_LABEL.match(k.namespace):
        err(p + ("namespace",), f"{k.namespace!r} is not a Kubernetes namespace name",
            "use at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit")
    check_labels(k.labels, p + ("labels",), err)
    g = k.grafana
    check_labels({g.sidecar_label: g.sidecar_label_value}, p + ("grafana", "sidecar_label"), err)
    prefix, _, name = g.folder_annotation.rpartition("/")
    if not K8S_LABEL_NAME.match(name) or (prefix and not DNS_SUBDOMAIN.match(prefix)):
        err(p + ("grafana", "folder_annotation"), f"{g.folder_annotation!r} is not a Kubernetes annotation key", LABEL_FIX)
    img = k.image
    bad_repo = image_repository_problem(img.repository)
    if bad_repo:
        err(p + ("image", "repository"), f"{img.repository!r} is not an image repository: {bad_repo}",
            "write [registry/]path with the path in lower case, e.g. ghcr.io/acme/fusebox or acme/fusebox")
    if not IMAGE_TAG.match(img.tag):
        err(p + ("image", "tag"), f"{img.tag!r} is not an image tag", "use letters, digits, '_', '.', '-' (at most 128)")
    return Kubernetes(
        namespace=k.namespace, labels=dict(k.labels),
        sidecar_label=g.sidecar_label, sidecar_label_value=g.sidecar_label_value, folder_annotation=g.folder_annotation,
        image=f"{img.repository}:{img.tag}", pull_policy=img.pull_policy,
        collectors=_collectors(k.collectors, spec_name, p + ("collectors",), err, discovery=k.engines is not None),
        fuse=_fuse(k.fuse, p + ("fuse",), err),
        engines=normalise_engines(k.engines, p + ("engines",), err, base_dir or Path()) if k.engines is not None else None,
    )


# What the generated DaemonSet passes a discovering collector (kv, latency), and what discovery replaces.
DISCOVERY_ARGS = frozenset({"--discover", "--node-name", "--pod-resources-socket", "--endpoint", "--model-config", "--gpu",
                            "--engine-id", "--spec"})


# the flags the generated DaemonSet sets on every collector itself
_DAEMONSET_ARGS = frozenset({"--metrics-port", "--metrics-addr", "--no-otlp", "--cluster", "--host-name"})


def _check_tolerations(tolerations: list[RawToleration], p: tuple, err: Err) -> None:
    for i, t in enumerate(tolerations):
        if t.operator == "Exists" and t.value:
            err(p + (i, "value"), "a toleration with operator Exists takes no value", "remove value, or use operator: Equal")
        if t.tolerationSeconds is not None and t.effect != "NoExecute":
            err(p + (i, "tolerationSeconds"), "tolerationSeconds applies to effect NoExecute only",
                "remove it, or set effect: NoExecute")


def _check_run_args(name: str, args: list[str], p: tuple, err: Err) -> None:
    """No argument of collector ``name`` (at ``p``, ``kubernetes.collectors.run.NAME``) may be one
    the DaemonSet sets, nor, for a discovering collector, one discovery replaces."""
    for j, a in enumerate(args):
        flag = a.split("=", 1)[0]
        if flag in _DAEMONSET_ARGS:
            err(p, f"{flag} is set by the generated DaemonSet",
                "remove it (the port is kubernetes.collectors.port, the cluster kubernetes.collectors.cluster)")
        elif name in ("kv", "latency") and flag in DISCOVERY_ARGS:
            err(p + (j,), f"{flag} is set by the generated DaemonSet: the {name} collector "
                "discovers the engine pods on its node (kubernetes.engines)",
                "remove it; list the engines' models under kubernetes.engines.models")


def _collectors(c: RawCollectors, spec_name: str, p: tuple, err: Err, *, discovery: bool = False) -> Collectors:
    check_labels(c.node_selector, p + ("node_selector",), err)
    if c.runtime_class_name and not DNS_SUBDOMAIN.match(c.runtime_class_name):
        err(p + ("runtime_class_name",), f"{c.runtime_class_name!r} is not a RuntimeClass name",
            "use the name of your cluster's NVIDIA RuntimeClass (the GPU Operator's is 'nvidia'), or '' for the default runtime")
    _check_tolerations(c.tolerations, p + ("tolerations",), err)
    if c.enabled and not c.run:
        err(p + ("run",), "no collector to run", f"name at least one of {', '.join(COLLECTORS)}, or set enabled: false")
    ports: dict[str, int] = {}
    for i, name in enumerate(c.run):
        if name not in COLLECTORS:
            err(p + ("run", name), f"unknown collector {name!r}", f"use one of {', '.join(COLLECTORS)}", key=True)
        _check_run_args(name, c.run[name], p + ("run", name), err)
        if c.enabled and name in ("kv", "latency") and not discovery:
            err(p + ("run", name), f"the {name} collector has no way to find the engines: in a DaemonSet it cannot be "
                "given each engine's --endpoint" + (", --model-config and --gpu" if name == "kv" else " and --engine-id"),
                "add kubernetes.engines (the engine pods' selector, port and namespaces"
                + (", and their models' config.json or geometry" if name == "kv" else "")
                + "): the collector then discovers the engine pods on its node", key=True)
        ports[name] = c.port + i
    check_port(c.port, p + ("port",), err)
    check_port(c.port + max(len(c.run) - 1, 0), p + ("port",), err)
    cluster = spec_name if c.cluster is None else c.cluster
    if c.cluster is not None and not c.cluster.strip():  # an empty metadata.name is reported at its own line
        err(p + ("cluster",), "the cluster name is empty", "name your cluster, or leave the key out for metadata.name")
    return Collectors(
        enabled=c.enabled, node_selector=dict(c.node_selector),
        tolerations=tuple(t.model_dump(exclude_none=True, by_alias=True) for t in c.tolerations),
        runtime_class_name=c.runtime_class_name, resources=_check_resources(c.resources, p + ("resources",), err),
        run={k: tuple(v) for k, v in c.run.items()}, ports=ports, cluster=cluster,
    )


def _fuse(f: RawFuseWorkload, p: tuple, err: Err) -> FuseWorkload:
    if not QUANTITY.match(f.state_size):
        err(p + ("state_size",), f"{f.state_size!r} is not a Kubernetes quantity", "e.g. 1Gi")
    if f.storage_class is not None and not DNS_SUBDOMAIN.match(f.storage_class):
        err(p + ("storage_class",), f"{f.storage_class!r} is not a StorageClass name", "name one of `kubectl get storageclass`, or leave it out")
    if f.max_unavailable < 0:
        err(p + ("max_unavailable",), "max_unavailable must not be negative", "use 1 (drains may move the fuse) or 0 (they may not)")
    if f.replicas < 1:
        err(p + ("replicas",), f"replicas must be at least 1, got {f.replicas}", "use 1 (SQLite) or 2 (PostgreSQL)")
    elif f.replicas > 1 and f.store_secret is None:
        err(p + ("replicas",), f"replicas: {f.replicas} needs a PostgreSQL store: the default SQLite file has one "
            "writer", "set store_secret: {name, key} (a Secret holding the postgresql:// URL), or replicas: 1")
    secret = _secret_ref(f.store_secret, p + ("store_secret",), "the postgresql:// URL", "fusebox-fuse-store", "url", err)
    gateway = _secret_ref(f.gateway_secret, p + ("gateway_secret",), "the gateways' control-plane key",
                          "fusebox-gateway-key", "key", err)
    reserved = {"--spec", "--listen", "--state", "--state-dir", "--store", "--webhook-token-file", "--token-file"}
    if f.prometheus_url is not None:
        reserved.add("--prometheus-url")
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", f.prometheus_url):
            err(p + ("prometheus_url",), f"prometheus_url must be an http(s) URL, got {f.prometheus_url[:100]!r}",
                "e.g. http://kps-kube-prometheus-stack-prometheus.monitoring:9090 (kube-prometheus-stack's Service)")
    for a in f.args:
        if a.split("=", 1)[0] in reserved:
            err(p + ("args",), f"{a.split('=', 1)[0]} is set by the generated Deployment", "remove it from args")
    n = f.network_policy
    np = p + ("network_policy",)
    if n.namespace is not None and not DNS_LABEL.fullmatch(n.namespace):
        err(np + ("namespace",), f"{n.namespace[:100]!r} is not a Kubernetes namespace name",
            "name the namespace Alertmanager and Prometheus run in, e.g. monitoring (kube-prometheus-stack's release "
            "namespace), or leave it out for kubernetes.namespace")
    for who, labels in (("alertmanager", n.alertmanager), ("prometheus", n.prometheus)):
        if not labels:
            err(np + (who,), f"no labels select the {who} pods: an empty selector lets every pod of the namespace in",
                "e.g. {app.kubernetes.io/name: " + who + "} (the Prometheus Operator's label)")
        check_labels(labels, np + (who,), err)
    return FuseWorkload(enabled=f.enabled, resources=_check_resources(f.resources, p + ("resources",), err),
                        state_size=f.state_size, storage_class=f.storage_class, max_unavailable=f.max_unavailable,
                        args=tuple(f.args), replicas=f.replicas, store_secret=secret, gateway_secret=gateway,
                        prometheus_url=f.prometheus_url.rstrip("/") if f.prometheus_url else None,
                        network_policy=NetworkPolicy(n.enabled, n.namespace, dict(n.alertmanager), dict(n.prometheus)))


def _secret_ref(ref: RawSecretRef | None, p: tuple, holding: str, example: str, example_key: str,
                err: Err) -> tuple[str, str] | None:
    """``{name, key}`` of a Secret: a Secret name and a Secret key, else a problem at its line."""
    if ref is None:
        return None
    if not DNS_SUBDOMAIN.match(ref.name):
        err(p + ("name",), f"{ref.name!r} is not a Secret name", f"name the Secret holding {holding}, e.g. {example}")
    if not re.fullmatch(r"[-._a-zA-Z0-9]{1,253}", ref.key):
        err(p + ("key",), f"{ref.key!r} is not a Secret key", f"e.g. {example_key}")
    return ref.name, ref.key


def check_gateway_secret(fuse: FuseWorkload, adapters: tuple, err: Err) -> None:
    """``kubernetes.fuse.gateway_secret`` and the adapters' ``credentials_file`` agree: the generated
    Deployment mounts the Secret's key at :meth:`FuseWorkload.gateway_key_file`, so every adapter
    with a ``credentials_file`` must name that file, and a Secret no adapter reads is a mistake."""
    if fuse.gateway_secret is None or not fuse.enabled:
        return
    want = fuse.gateway_key_file()
    readers = [a for a in adapters if a.credentials_file]
    if not readers:
        err(("kubernetes", "fuse", "gateway_secret"), "no fuse.adapters entry reads the gateway Secret",
            f"set credentials_file: {want} on the sglang_gateway / vllm_router adapters, or remove gateway_secret", key=True)
    for a in readers:
        if a.credentials_file != want:
            err(("fuse", "adapters", a.name, "credentials_file"),
                f"the generated fuse Deployment mounts kubernetes.fuse.gateway_secret at {want}, not {a.credentials_file}",
                f"credentials_file: {want}")


def normalise_grafana(g: RawGrafana, err: Err) -> Grafana:
    if not g.folder.strip():
        err(("grafana", "folder"), "the Grafana folder name is empty", "name a folder, e.g. fusebox")
    if not g.dashboards_path.startswith("/"):
        err(("grafana", "dashboards_path"), f"{g.dashboards_path!r} is not an absolute path", "e.g. /var/lib/grafana/dashboards/fusebox")
    if g.traces_url is not None and not re.fullmatch(r"https?://[^\s/]+(/\S*)?", g.traces_url):
        err(("grafana", "traces_url"), f"traces_url must be an http(s) URL, got {g.traces_url[:100]!r}",
            "the Jaeger query service as Grafana reaches it, e.g. http://jaeger:16686, or leave it out")
    return Grafana(prometheus_url=g.prometheus_url, dashboards_path=g.dashboards_path, folder=g.folder,
                   traces_url=g.traces_url)


def normalise_otelcol(o: RawOtelcol, duration: Callable[[Any, tuple], float], err: Err,
                      scrape_interval_s: float = 15.0) -> Otelcol:
    """Check the ``otelcol:`` block; ``scrape_interval_s`` (the spec's) is the default span-metrics
    flush interval of ``otelcol.traces``."""
    interval = None if o.scrape_interval is None else duration(o.scrape_interval, ("otelcol", "scrape_interval"))
    if interval is not None and interval <= 0 and o.scrape_interval is not None:
        err(("otelcol", "scrape_interval"), "scrape_interval must be positive", "e.g. '15s', or leave it out for global.scrape_interval")
    for i, t in enumerate(o.scrape_targets):
        host, sep, port = t.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            err(("otelcol", "scrape_targets", i), f"{t!r} is not host:port", "e.g. vllm-0.inference:8000")
    if o.memory_spike_percentage >= o.memory_limit_percentage:
        err(("otelcol", "memory_spike_percentage"), "the spike allowance must be below the limit",
            "e.g. memory_limit_percentage: 80, memory_spike_percentage: 20")
    return Otelcol(remote_write_url=o.remote_write_url, debug=o.debug, scrape_targets=tuple(o.scrape_targets),
                   scrape_interval_s=interval, memory_limit_percentage=o.memory_limit_percentage,
                   memory_spike_percentage=o.memory_spike_percentage,
                   traces=normalise_traces(o.traces, scrape_interval_s, duration, err))
