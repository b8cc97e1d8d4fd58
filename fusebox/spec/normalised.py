"""The normalised spec: the frozen dataclasses every renderer consumes (:class:`Spec` and its
signals, tiers, sources and fuse settings). Values are in Prometheus base units (ratio 0-1,
seconds, bytes, bytes per second); :func:`fusebox.spec.load_spec` builds them."""

from __future__ import annotations

from dataclasses import dataclass, field

from fusebox import conventions as C

from .adapters import Adapter as FuseAdapter
from .budget import Budget
from .connections import Connections
from .deploy import Grafana, Kubernetes, Otelcol
from .inpath import Inpath
from .scaling import Scaling
from .slo import Slo


@dataclass(frozen=True)
class Tier:
    """One alert tier of a signal. ``threshold`` is in the signal's base unit."""

    name: str  # "warning" | "critical"
    threshold: float
    threshold_text: str  # as the spec wrote it, for humans
    for_s: float
    keep_firing_for_s: float
    severity: str
    fuse: str | None  # action name from fuse.actions, or None
    fuse_level: int  # 0 when no fuse
    path: tuple  # YAML path, for error reports
    after_shedding: bool = False  # fires only while the in-path gateways shed (generator/render_rules.shedding_gate)
    advice: str | None = None  # the alert's `advice` annotation (a template: $value, $labels)


@dataclass(frozen=True)
class Source:
    backend: str
    metric: str | None
    scale: float
    expr: str | None
    note: str | None
    capacity: str | None = None  # time_to_full: the pool's size metric (same unit as metric)
    free: str | None = None  # time_to_full: the pool's free part (same unit as metric)


@dataclass(frozen=True)
class Runbook:
    symptom: str
    impact: str
    diagnosis: tuple[tuple[str, str], ...]
    sop: dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class Signal:
    """A signal and its alert. Values are in Prometheus base units (ratio 0-1, s, B, B/s)."""

    name: str
    alert: str
    description: str
    kind: str
    unit: str
    level: str
    direction: str
    by: tuple[str, ...]
    window_s: float
    quantile: float | None
    buckets: tuple[float, ...]
    source: Source
    sources: dict[str, Source]
    tiers: tuple[Tier, ...]  # enabled tiers only, warning before critical
    runbook: Runbook
    secondary: bool
    path: tuple
    # the source was chosen (the signal's or an override's `source:`, global.source, or the only one
    # listed), not the first of several taken by default: only a chosen one names the cluster's engine
    source_chosen: bool = True
    # the warning tier as written, enabled or not (an override's `enabled: false` turns off its alert,
    # not the level): the safe level the autoscalers' set point is (spec/scaling.py); None without one
    safe_level: Tier | None = None


@dataclass(frozen=True)
class SelfMonitoring:
    """``fuse.self_monitoring``, normalised: durations in seconds, selectors as label -> value."""

    enabled: bool = True
    fuse_selector: dict = field(default_factory=lambda: {"job": C.K8S["fuse"]})
    alertmanager_selector: dict = field(default_factory=dict)
    down_for_s: float = 120.0
    max_pending_action_age_s: float = 120.0
    heartbeat_interval_s: float = 60.0
    heartbeat_silent_after_s: float = 300.0


@dataclass(frozen=True)
class Audit:
    """``fuse.audit``, normalised: refused-alert audit rows per minute (per replica) and in all."""

    refused_per_minute: int = 100
    refused_max_rows: int = 100_000


@dataclass(frozen=True)
class FuseAction:
    name: str
    level: int
    description: str


ENGINES = ("vllm", "sglang")  # the serving engines' source backends (Spec.engines)


@dataclass(frozen=True)
class Spec:
    """The normalised spec every renderer consumes."""

    file: str
    name: str
    description: str
    scrape_interval_s: float
    evaluation_interval_s: float
    slow_evaluation_interval_s: float  # max(global.slow_evaluation_interval, evaluation_interval_s)
    runbook_base_url: str
    dashboard_base_url: str
    selector: dict[str, str]  # global.selector: matchers for every backend without its own
    labels: dict[str, str]
    absent_enabled: bool
    absent_for_s: float
    absent_severity: str
    receiver: str
    human_receiver: dict
    webhook_url: str
    credentials_file: str
    group_wait_s: float
    group_wait_critical_s: float
    group_interval_s: float
    repeat_interval_s: float
    actions: dict[str, FuseAction]
    signals: tuple[Signal, ...]
    raw: dict = field(repr=False, compare=False, default_factory=dict)
    allow_fleet_wide_alerts: bool = False  # fuse.allow_fleet_wide_alerts
    adapters: tuple[FuseAdapter, ...] = ()  # fuse.adapters, in spec order
    kubernetes: Kubernetes = field(default_factory=Kubernetes)
    grafana: Grafana = field(default_factory=Grafana)
    otelcol: Otelcol = field(default_factory=Otelcol)
    selectors: dict[str, dict[str, str]] = field(default_factory=dict)  # global.selectors, per backend
    source: str = "fusebox"  # global.source
    rule_engine: str = "prometheus"  # global.rule_engine: one of RULE_ENGINES
    budget: Budget = field(default_factory=Budget)  # budget: sizes `fusebox budget` reads (spec/budget.py)
    inpath: Inpath = field(default_factory=Inpath)  # inpath: the in-path shedders (spec/inpath.py)
    audit: Audit = field(default_factory=Audit)  # fuse.audit: the refused-alert audit's bound
    connections: Connections = field(default_factory=Connections)  # connections: what `collect conns` follows (spec/connections.py)
    slos: tuple[Slo, ...] = ()  # slos: the service-level objectives (spec/slo.py), in spec order
    scaling: Scaling | None = None  # scaling: the workloads to autoscale (spec/scaling.py); None without the section

    def selector_for(self, backend: str) -> dict[str, str]:
        """The label matchers of a source backend's raw selectors: ``global.selectors[backend]``
        when the spec lists it, else ``global.selector``."""
        return self.selectors.get(backend, self.selector)
    self_monitoring: SelfMonitoring = field(default_factory=SelfMonitoring)

    @property
    def engines(self) -> tuple[str, ...]:
        """The serving engines (``vllm``, ``sglang``) the spec names, in that order: a backend of
        ``global.selectors`` or a signal's chosen source (its or an override's ``source:``,
        ``global.source``, or the only one listed; not the first of several taken by default: the
        preemption signal lists vLLM's counter and SGLang's and reads vLLM's unless told, which
        says nothing of the cluster, docs/metrics.md section 7). None named: both (the dashboard
        records then read either engine's metrics, whichever the cluster has)."""
        named = set(self.selectors) | {s.source.backend for s in self.signals if s.source_chosen}
        return tuple(e for e in ENGINES if e in named) or ENGINES

    @property
    def test_interval_s(self) -> float:
        """The step of the generated rule tests, seconds: their input series' sample spacing and
        the test files' ``evaluation_interval`` (promtool and vmalert-tool evaluate every group at
        it), ``min(global.scrape_interval, global.evaluation_interval)``. Where the scrape is the
        shorter, samples come a scrape apart, as on a server; at the evaluation interval alone a 1m
        window at a 30s or 1m evaluation_interval held one or two samples under Prometheus 3's
        left-open ranges, and deriv() read nothing where the server, scraping every 5s, reads twelve.
        Where the evaluation is the shorter, the samples are denser than the server's (docs/spec.md)."""
        return min(self.scrape_interval_s, self.evaluation_interval_s)

    @property
    def fusebox_collectors(self) -> bool:
        """Whether the fusebox collectors' series are expected: ``k8s/`` runs them
        (``kubernetes.collectors.enabled``), or a signal's selected source reads the ``fusebox``
        backend (the collectors then run elsewhere, e.g. docker-compose or ``fusebox collect``)."""
        return self.kubernetes.collectors.enabled or any(s.source.backend == "fusebox" for s in self.signals)

    def signal(self, name: str) -> Signal:
        for s in self.signals:
            if s.name == name:
                return s
        raise KeyError(name)

    def runbook_url(self, alert: str) -> str:
        return f"{self.runbook_base_url.rstrip('/')}/{alert}.md"
