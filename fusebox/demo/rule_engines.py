"""The rule engines the demo can run the generated rules on, behind one interface.

``prometheus`` (default): one Prometheus scrapes the Collector and the fuse service, evaluates
``rules/fusebox.rules.yml`` and notifies the demo's Alertmanager.

``victoriametrics``: VictoriaMetrics single node scrapes the same targets with the same scrape
configuration (its built-in ``-promscrape.config``) and vmalert evaluates the same rules file
against it, writes recording-rule results and alert state back into it and notifies the same
Alertmanager. With ``replicas`` > 1, the HA topology of VictoriaMetrics' docs: that many
independent VictoriaMetrics + vmalert pairs, each node scraping the same targets itself (the
docs' "identically configured instances" with the data replicated to each) and each vmalert
reading and writing only its own node, all notifying the one Alertmanager, which merges the
identical alerts (https://docs.victoriametrics.com/victoriametrics/single-server-victoriametrics/#high-availability,
https://docs.victoriametrics.com/victoriametrics/vmalert/#ha-vmalert). Losing one pair loses
nothing: the others hold the same data and alerts.

Every flag set here and why: docs/rule-engines.md, "Running on VictoriaMetrics".
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from fusebox.spec.units import format_duration
from fusebox.tooling import VICTORIAMETRICS_VERSION, ToolMissing, tools_dir, victoriametrics_tool

if TYPE_CHECKING:
    from .supervisor import Child, Supervisor

__all__ = ["ENGINES", "Engine", "PrometheusEngine", "VictoriaMetricsEngine", "engine_class", "make_engine", "prometheus_config",
           "scrape_config", "VM_VISIBILITY_DELAY"]

ENGINES = ("prometheus", "victoriametrics")

# VictoriaMetrics makes freshly ingested samples searchable when it flushes its pending rows,
# every 2 s (lib/storage/raw_row.go, pendingRowsFlushInterval, v1.151.0): a query for an instant
# at least that far back sees every sample of it. Used as -search.latencyOffset (default 30 s)
# and vmalert's -rule.evalDelay (default 30 s; its help: "should be equal to
# -search.latencyOffset"), so rules see complete data 2 s late instead of 30 s late.
VM_VISIBILITY_DELAY = "2s"


def scrape_config(spec, ports) -> dict:
    """The scrape part both engines share: ``global.scrape_interval`` and the two jobs.

    Both jobs use ``honor_labels``: the Collector's exporter carries the collectors' own
    ``job``/``instance`` (their ``service.name``/``service.instance.id``), and the fuse
    service's ``fusebox_fuse_level`` carries the fuse scope's labels, ``instance`` among them;
    without it the scraper would rename that one ``exported_instance`` and put the fuse
    service's address in ``instance``, which the overview's fuse-state panel groups by.
    """
    return {
        "global": {"scrape_interval": format_duration(spec.scrape_interval_s)},
        "scrape_configs": [
            {"job_name": "otelcol", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{ports.otel_prometheus}"]}]},
            {"job_name": "fusebox-fuse", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{ports.fuse}"]}]},
        ],
    }


def prometheus_config(spec, rules_file: Path | str, ports) -> dict:
    """The demo Prometheus' configuration (a dict for ``prometheus.yml``): :func:`scrape_config`
    plus the evaluation interval, the rules file and the demo's Alertmanager."""
    cfg = scrape_config(spec, ports)
    cfg["global"]["evaluation_interval"] = format_duration(spec.evaluation_interval_s)
    return {
        "global": cfg["global"],
        "rule_files": [str(rules_file)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports.alertmanager}"]}]}]},
        "scrape_configs": cfg["scrape_configs"],
    }


@dataclass
class StartContext:
    """What an engine needs from the stack to start: the supervisor, the readiness wait
    (``ready(child, url)``: raises ChildDied / TimeoutError) and the work directory."""

    sup: Supervisor
    ready: Callable[[Child, str], None]
    workdir: Path


class Engine:
    """One rule engine of the demo. Subclasses set :attr:`name` and :attr:`title` and implement
    :meth:`find_tools`, :meth:`prepare` and :meth:`start`.

    ``query_urls``: Prometheus-compatible query API bases (``/api/v1/query``), in failover
    order; ``alerts_urls``: bases whose ``/api/v1/alerts`` lists the rule engine's active alerts
    (Prometheus' and vmalert's share that shape), every live one read and merged; ``ui_urls``: what a person opens.
    """

    name = ""
    title = ""

    def __init__(self, ports, replicas: int = 1):
        self.ports = ports
        self.replicas = replicas
        self.tools: dict[str, str] = {}

    @classmethod
    def find_tools(cls) -> tuple[dict[str, str], list[str]]:
        """(found paths, descriptions of the missing ones)."""
        raise NotImplementedError

    def prepare(self, workdir: Path, spec, rules_file: Path) -> None:
        """Write the engine's configuration into ``workdir``."""
        raise NotImplementedError

    def start(self, ctx: StartContext) -> None:
        """Start the engine's processes under ``ctx.sup`` and wait until each is ready."""
        raise NotImplementedError

    def stop_replica(self, sup: Supervisor, index: int) -> list[Child]:
        """Stop replica ``index`` (all of its processes) for good; returns what it stopped."""
        raise ValueError(f"the {self.name} engine has no replicas to stop")

    @property
    def query_urls(self) -> list[str]:
        raise NotImplementedError

    @property
    def alerts_urls(self) -> list[str]:
        raise NotImplementedError

    @property
    def ui_urls(self) -> dict[str, str]:
        raise NotImplementedError


class PrometheusEngine(Engine):
    name = "prometheus"
    title = "Prometheus"

    def __init__(self, ports, replicas: int = 1):
        if replicas != 1:
            raise ValueError("--replicas applies to the victoriametrics engine only")
        super().__init__(ports, replicas)

    @classmethod
    def find_tools(cls) -> tuple[dict[str, str], list[str]]:
        p = os.environ.get("FUSEBOX_PROMETHEUS") or shutil.which("prometheus")
        return ({"prometheus": p}, []) if p else ({}, ["prometheus (>= 2.42)"])

    def prepare(self, workdir: Path, spec, rules_file: Path) -> None:
        self.config_file = workdir / "prometheus.yml"
        self.config_file.write_text(yaml.safe_dump(prometheus_config(spec, rules_file, self.ports), sort_keys=False))

    def start(self, ctx: StartContext) -> None:
        url = self.query_urls[0]
        prom = ctx.sup.start("prometheus", [self.tools["prometheus"], f"--config.file={self.config_file}",
                                            f"--storage.tsdb.path={ctx.workdir / 'prometheus'}",
                                            f"--web.listen-address=127.0.0.1:{self.ports.prometheus}",
                                            "--enable-feature=exemplar-storage",  # the alignment buckets' trace ids
                                            "--log.level=warn"])
        ctx.ready(prom, f"{url}/-/ready")

    @property
    def query_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{self.ports.prometheus}"]

    alerts_urls = query_urls

    @property
    def ui_urls(self) -> dict[str, str]:
        return {"prometheus": self.query_urls[0]}


class VictoriaMetricsEngine(Engine):
    """VictoriaMetrics single node + vmalert, ``replicas`` independent pairs (HA when > 1)."""

    name = "victoriametrics"
    title = "VictoriaMetrics + vmalert"

    def __init__(self, ports, replicas: int = 1):
        if not 1 <= replicas <= len(ports.victoriametrics):
            raise ValueError(f"replicas must be 1..{len(ports.victoriametrics)} (ports picked for that many)")
        super().__init__(ports, replicas)
        self.children: list[list[Child]] = [[] for _ in range(replicas)]
        self.stopped: set[int] = set()

    @classmethod
    def find_tools(cls) -> tuple[dict[str, str], list[str]]:
        found, missing = {}, []
        for tool in ("victoria-metrics", "vmalert"):
            try:
                found[tool] = str(victoriametrics_tool(tool))
            except ToolMissing:
                missing.append(f"{tool} {VICTORIAMETRICS_VERSION} ({tools_dir()}/victoriametrics-{VICTORIAMETRICS_VERSION}/{tool})")
        return found, missing

    def prepare(self, workdir: Path, spec, rules_file: Path) -> None:
        # The same scrape jobs Prometheus gets; only global/scrape_configs, since
        # -promscrape.config refuses Prometheus' rule_files/alerting keys (strict parsing).
        self.scrape_file = workdir / "promscrape.yml"
        self.scrape_file.write_text(yaml.safe_dump(scrape_config(spec, self.ports), sort_keys=False))
        self.rules_file = rules_file
        self.evaluation_interval = format_duration(spec.evaluation_interval_s)

    def _suffix(self, i: int) -> str:
        return "" if self.replicas == 1 else f"-{i + 1}"

    def node_args(self, i: int, workdir: Path) -> list[str]:
        """Command line of VictoriaMetrics node ``i``."""
        return [self.tools["victoria-metrics"],
                f"-httpListenAddr=127.0.0.1:{self.ports.victoriametrics[i]}",
                f"-storageDataPath={workdir / ('victoriametrics' + self._suffix(i))}",
                "-retentionPeriod=1d",  # the smallest VictoriaMetrics accepts; a demo run lasts minutes
                f"-promscrape.config={self.scrape_file}",
                f"-search.latencyOffset={VM_VISIBILITY_DELAY}",
                f"-vmalert.proxyURL={self.vmalert_url(i)}",  # vmui's alerting tabs show this node's vmalert
                "-loggerLevel=WARN"]

    def vmalert_args(self, i: int) -> list[str]:
        """Command line of vmalert ``i``: reads, writes and restores from its own node only."""
        node = self.node_url(i)
        return [self.tools["vmalert"],
                f"-httpListenAddr=127.0.0.1:{self.ports.vmalert[i]}",
                f"-rule={self.rules_file}",
                f"-datasource.url={node}", f"-remoteWrite.url={node}", f"-remoteRead.url={node}",
                f"-notifier.url=http://127.0.0.1:{self.ports.alertmanager}",
                # groups without their own interval; the generated ones all carry the spec's
                f"-evaluationInterval={self.evaluation_interval}",
                f"-rule.evalDelay={VM_VISIBILITY_DELAY}",
                # a recording-rule result reaches the node within one evaluation (default 2 s)
                f"-remoteWrite.flushInterval={self.evaluation_interval}",
                # alerts carry exactly the rule's labels, as on Prometheus: the same Alertmanager
                # routes, inhibitions, fingerprints and fuse scopes, and replicas' alerts merge
                "-disableAlertgroupLabel",
                f"-external.url={self.vmalert_url(i)}",
                "-loggerLevel=WARN"]

    def start(self, ctx: StartContext) -> None:
        for i in range(self.replicas):
            node = ctx.sup.start("victoriametrics" + self._suffix(i), self.node_args(i, ctx.workdir))
            self.children[i].append(node)
            ctx.ready(node, f"{self.node_url(i)}/health")
            va = ctx.sup.start("vmalert" + self._suffix(i), self.vmalert_args(i))
            self.children[i].append(va)
            ctx.ready(va, f"{self.vmalert_url(i)}/health")

    def stop_replica(self, sup: Supervisor, index: int) -> list[Child]:
        if self.replicas < 2:
            raise ValueError("stopping the only VictoriaMetrics node would stop the demo; run with replicas >= 2")
        if index in self.stopped or not 0 <= index < self.replicas:
            raise ValueError(f"no running replica {index}")
        gone = list(reversed(self.children[index]))  # vmalert first, then its node
        for child in gone:
            sup.retire(child)
        self.stopped.add(index)
        return gone

    def node_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports.victoriametrics[i]}"

    def vmalert_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports.vmalert[i]}"

    def _live(self) -> list[int]:
        return [i for i in range(self.replicas) if i not in self.stopped]

    @property
    def query_urls(self) -> list[str]:
        return [self.node_url(i) for i in self._live()]

    @property
    def alerts_urls(self) -> list[str]:
        return [self.vmalert_url(i) for i in self._live()]

    @property
    def ui_urls(self) -> dict[str, str]:
        out = {}
        for i in range(self.replicas):
            out["vmui" + self._suffix(i)] = f"{self.node_url(i)}/vmui/"
            out["vmalert" + self._suffix(i)] = f"{self.vmalert_url(i)}/vmalert/"
        return out


def engine_class(name: str) -> type[Engine]:
    """The class of the engine called ``name`` (one of :data:`ENGINES`); ValueError if unknown."""
    classes: dict[str, type[Engine]] = {"prometheus": PrometheusEngine, "victoriametrics": VictoriaMetricsEngine}
    if name not in classes:
        raise ValueError(f"unknown engine {name!r}: one of {', '.join(ENGINES)}")
    return classes[name]


def make_engine(name: str, ports, replicas: int = 1, tools: dict[str, str] | None = None) -> Engine:
    """The engine called ``name`` (one of :data:`ENGINES`) on ``ports``.

    Raises:
        ValueError: unknown name, or replicas the engine does not support.
    """
    engine = engine_class(name)(ports, replicas)
    if tools:
        engine.tools = dict(tools)
    return engine
