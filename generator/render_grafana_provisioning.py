"""Grafana provisioning from the spec: data source, dashboards provider, Kubernetes ConfigMaps.

Pure renderer: ``render_grafana_provisioning(spec, options) -> {relative_path: text}``; no I/O.

* ``grafana/provisioning/datasources/fusebox.yaml``: a Prometheus data source with a fixed UID
  (:data:`DATASOURCE_UID`), the default, so the dashboards' ``${datasource}`` variable resolves
  on first load; where the spec says where traces go (``grafana.traces_url``), a Jaeger data
  source (uid :data:`TRACES_DATASOURCE_UID`) too, and the Prometheus one links each exemplar's
  ``trace_id`` label to it (``exemplarTraceIdDestinations``, docs/exemplars.md);
* ``grafana/provisioning/dashboards/fusebox.yaml``: a file provider reading the generated
  dashboards from :attr:`ProvisioningOptions.dashboards_path`;
* ``k8s/grafana-dashboards.yaml``: one ConfigMap per dashboard in the spec's
  ``kubernetes.namespace`` with its ``kubernetes.labels``, labelled for the Grafana Helm chart's
  dashboard sidecar (``grafana_dashboard: "1"`` by default, kube-prometheus-stack's) and
  annotated with the folder (``grafana_folder: fusebox``; the sidecar reads it when its
  ``folderAnnotation`` names that key).

The options come from the spec (:meth:`ProvisioningOptions.from_spec`): ``grafana:`` and ``kubernetes:``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath

from fusebox import conventions as C
from fusebox.spec.units import format_duration

from .render_dashboards import dashboard_texts
from .render_k8s import object_meta
from .yamlout import dump_yaml

__all__ = ["ProvisioningOptions", "render_grafana_provisioning", "DATASOURCE_UID", "TRACES_DATASOURCE_UID"]

DATASOURCE_UID = "fusebox-prometheus"
TRACES_DATASOURCE_UID = "jaeger"


@dataclass(frozen=True)
class ProvisioningOptions:
    """Where things are, as Grafana sees them.

    Attributes:
        prometheus_url: the data source URL (inside docker-compose: ``http://prometheus:9090``).
        dashboards_path: the folder Grafana reads dashboards JSON from.
        folder: the Grafana folder the dashboards land in.
        namespace: Kubernetes namespace of the ConfigMaps.
        labels: more labels of the ConfigMaps (``kubernetes.labels``).
        sidecar_label, sidecar_label_value: the label the dashboard sidecar watches.
        folder_annotation: the annotation key holding ``folder`` (the sidecar's ``folderAnnotation``).
        traces_url: the Jaeger query service exemplars link to (``grafana.traces_url``); None:
            no trace data source and no exemplar link.
    """

    prometheus_url: str = "http://prometheus:9090"
    dashboards_path: str = "/var/lib/grafana/dashboards/fusebox"
    folder: str = "fusebox"
    namespace: str = "monitoring"
    labels: tuple[tuple[str, str], ...] = ()
    sidecar_label: str = "grafana_dashboard"
    sidecar_label_value: str = "1"
    folder_annotation: str = "grafana_folder"
    traces_url: str | None = None

    @classmethod
    def from_spec(cls, spec) -> ProvisioningOptions:
        """The spec's ``grafana:`` block and the sidecar settings of its ``kubernetes:`` block."""
        g, k = spec.grafana, spec.kubernetes
        return cls(prometheus_url=g.prometheus_url, dashboards_path=g.dashboards_path, folder=g.folder,
                   namespace=k.namespace, labels=tuple(sorted(k.labels.items())), sidecar_label=k.sidecar_label,
                   sidecar_label_value=k.sidecar_label_value, folder_annotation=k.folder_annotation,
                   traces_url=g.traces_url)


def _configmap_meta(spec, options: ProvisioningOptions, name: str) -> dict:
    """A dashboard ConfigMap's metadata: every generated object's (render_k8s.object_meta: the
    namespace, ``kubernetes.labels``, ``app.kubernetes.io/name: fusebox``, part-of, component
    ``dashboards``), plus the sidecar label and the folder annotation."""
    meta = object_meta(spec, name, "dashboards", app="fusebox", namespace=options.namespace, labels=dict(options.labels))
    meta["labels"][options.sidecar_label] = options.sidecar_label_value
    meta["annotations"] = {options.folder_annotation: options.folder}
    return meta


def _yaml(header: str, obj) -> str:
    return header + dump_yaml(obj, sort_keys=True)


def outputs(spec, header: str, boards: dict[str, str] | None = None) -> dict[str, str]:
    """The writer's entry point (generator/outputs.py): the spec's options."""
    return render_grafana_provisioning(spec, ProvisioningOptions.from_spec(spec), header=header, boards=boards)


def render_grafana_provisioning(spec, options: ProvisioningOptions = ProvisioningOptions(),
                                header: str | None = None, boards: dict[str, str] | None = None) -> dict[str, str]:
    """The provisioning files and the ConfigMaps. Deterministic (sorted keys).

    ``boards``: the dashboards' JSON text by name (:func:`~.render_dashboards.dashboard_texts`),
    when the caller already rendered them; rendered here otherwise.
    """
    header_line = header or C.GENERATED_HEADER.format(spec=PurePath(spec.file).name)
    header = "# " + header_line + "\n"
    interval = format_duration(spec.scrape_interval_s)
    prom: dict = {
        "name": "Prometheus (fusebox)", "type": "prometheus", "uid": DATASOURCE_UID, "access": "proxy",
        "url": options.prometheus_url, "isDefault": True, "editable": False,
        # timeInterval: the scrape interval, so Grafana never asks for a step below it.
        "jsonData": {"timeInterval": interval, "httpMethod": "POST"},
    }
    sources = [prom]
    if options.traces_url is not None:
        # an exemplar's trace_id label (the collectors' OpenMetrics exemplars) opens that trace
        prom["jsonData"]["exemplarTraceIdDestinations"] = [
            {"name": C.EXEMPLAR_TRACE_ID_LABEL, "datasourceUid": TRACES_DATASOURCE_UID}]
        sources.append({
            "name": "Jaeger (fusebox)", "type": "jaeger", "uid": TRACES_DATASOURCE_UID, "access": "proxy",
            "url": options.traces_url, "isDefault": False, "editable": False,
        })
    datasource = {"apiVersion": 1, "datasources": sources}
    provider = {
        "apiVersion": 1,
        "providers": [{
            "name": f"fusebox-{spec.name}", "orgId": 1, "folder": options.folder, "type": "file",
            "disableDeletion": True, "allowUiUpdates": False, "updateIntervalSeconds": 30,
            "options": {"path": options.dashboards_path, "foldersFromFilesStructure": False},
        }],
    }
    maps = []
    if boards is None:
        boards = dashboard_texts(spec, header_line)
    for name, text in boards.items():
        maps.append({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _configmap_meta(spec, options, f"fusebox-dashboard-{name}"),
            "data": {f"fusebox-{name}.json": text},
        })
    k8s = header + "".join("---\n" + dump_yaml(m, sort_keys=True) for m in maps)
    return {
        "grafana/provisioning/datasources/fusebox.yaml": _yaml(header, datasource),
        "grafana/provisioning/dashboards/fusebox.yaml": _yaml(header, provider),
        "k8s/grafana-dashboards.yaml": k8s,
    }
