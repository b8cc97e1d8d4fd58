"""The fusebox spec (``apiVersion: fusebox/v1``): its schema, validation and normalised model.

``load_spec(path)`` reads YAML, checks its shape with pydantic (unknown keys are errors),
converts human units, applies defaults and overrides, and checks semantics (tier order,
windows vs scrape interval, quantile thresholds on bucket boundaries, PromQL syntax).
Every problem becomes a :class:`~fusebox.spec.errors.Problem` anchored at the line
and column of the offending YAML node. The result is a frozen :class:`Spec` that renderers
consume; renderers never see raw YAML.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, FiniteFloat, StrictBool, ValidationError, model_validator

from fusebox import conventions as C

from . import deploy, sourceunits, units
from .adapters import Adapter as FuseAdapter
from .adapters import RawAdapter, normalise_adapters
from .budget import Budget, RawBudget, normalise_budget
from .connections import Connections, RawConnections, normalise_connections
from .deploy import Grafana, Kubernetes, Otelcol, RawGrafana, RawKubernetes, RawOtelcol, normalise_grafana, normalise_kubernetes, normalise_otelcol
from .diagnosis import resolve_diagnosis
from .errors import Problem, SpecError
from .inpath import GATEWAY_KINDS, Inpath, RawInpath, normalise_inpath
from .kinds import KINDS
from .kinds.base import KNOWN_BACKENDS, SGLANG, VLLM
from .positions import Positions, load, read_text
from .validation import pydantic_problem

API_VERSION = "fusebox/v1"
TIER_ORDER = ("warning", "critical")
_NAME = re.compile(r"^[a-z][a-z0-9_]*\Z")
_ALERT = re.compile(r"^[A-Z][A-Za-z0-9]*\Z")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*\Z")
# The levels with their own conventions (labels, annotations, dashboard filters); any other
# level is a label of the signal's `by`.
STANDARD_LEVELS = ("gpu", "engine", "host")
# global.rule_engine: what evaluates the rules (docs/rule-engines.md); the first is the default.
RULE_ENGINES = ("prometheus", "victoriametrics", "mimir", "thanos")


# --------------------------------------------------------------------------- raw schema
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Number-like fields refuse YAML booleans (threshold: yes would be 1) and, for floats, inf and NaN.
Scalar = Annotated[str | int | float, BeforeValidator(units.reject_bool)]
Number = Annotated[FiniteFloat, BeforeValidator(units.reject_bool)]
Integer = Annotated[int, BeforeValidator(units.reject_bool)]


class RawTier(_Strict):
    """One alert tier: the threshold in the signal's unit and how long it must hold."""

    threshold: Scalar
    for_: Scalar | None = Field(None, alias="for")
    keep_firing_for: Scalar | None = None
    severity: str | None = None
    fuse: str | None = None
    enabled: bool = True
    # Fire only while the signal's in-path gateways are refusing requests too (spec/inpath.py):
    # the fast path has been trying for the tier's `for` and has not brought the signal back.
    after_shedding: StrictBool = False
    # What to do, as the alert's `advice` annotation: text, with {{ $value | humanizePercentage }}
    # (the alert's value) and {{ $labels.NAME }} (a label the alert keeps) where the value belongs.
    advice: str | None = None


class RawSource(_Strict):
    """One backend of a signal: a raw metric (with an optional scale to base units) or a PromQL expression."""

    metric: str | None = None
    scale: Number = 1.0
    expr: str | None = None
    note: str | None = None
    # time_to_full only (fusebox/spec/kinds/time_to_full.py): the pool's size, or its free part,
    # as a raw metric in the unit of ``metric``; neither when ``metric`` is a fraction 0-1 of it.
    capacity: str | None = None
    free: str | None = None


class RawDiagnosis(_Strict):
    title: str
    query: str = Field(description="PromQL for the runbook, after the kind's standard queries. ${SIGNAL} names a signal's "
                                   "value record, ${SIGNAL.ROLE} another of its records, ${dashboard.ROLE} a dashboard "
                                   "record; a record-shaped name no rule records is an error (docs/spec.md).")


class RawRunbook(_Strict):
    """The generated runbook's text: symptom, impact, diagnosis queries, steps per tier (sop)."""

    symptom: str
    impact: str
    diagnosis: list[RawDiagnosis] = []
    sop: dict[str, list[str]] = {}


class RawSignal(_Strict):
    """One signal and its alert: what is measured, from which sources, and its tiers."""

    alert: str = Field(description="The alert's name, CamelCase with a component word (GPUMemoryUtilizationHigh).")
    description: str = Field(description="What the signal measures, for people (alerts, runbooks, dashboards); "
                                         "${window} is replaced by the signal's window ('5m').")
    kind: Literal[tuple(KINDS)] = Field(  # type: ignore[valid-type]  # the registered kinds (fusebox/spec/kinds)
        description="How the value is computed: gauge (as read), deriv (growth per second), quantile (from a histogram), "
                    "gpu_memory (device-memory ratio with the KV-pool correction), time_to_full (seconds until a pool "
                    "is full at its current growth; direction: below), rate (a counter's events per second, e.g. preemptions).")
    unit: Literal[tuple(units.UNITS)] = Field(  # type: ignore[valid-type]
        description="The value's unit: ratio (0-1; thresholds '78.3%'), seconds ('1.28s'), bytes ('2 GB'), "
                    "bytes_per_second ('14.7 MB/s') or count (a plain number: 50).")
    level: str = Field(
        "gpu", description="What one series of the signal is about: gpu, engine or host, or any label you aggregate by "
                           "(pod, model_name, namespace, ...), which must then be one of 'by'. It prefixes the "
                           "recording rules' names (LEVEL:fusebox_NAME:OPS).")
    direction: Literal["above", "below"] = Field("above", description="Alert when the value is at or above (or below) the threshold.")
    by: list[str] | None = Field(None, description="Labels the value is aggregated by; one alert per combination. "
                                                      "The alert's summary and description name them.")
    window: Scalar | None = Field(None, description="Range of deriv and quantile signals, a Prometheus duration ('5m').")
    quantile: Number | None = Field(None, description="For quantile signals: the quantile, 0-1 (0.95).")
    buckets: list[Number] | None = Field(None, description="For quantile signals: the histogram's bucket bounds, "
                                                              "in the signal's unit; every threshold must be one.")
    source: str | None = Field(None, description="The key of 'sources' the rules read. Default: global.source when "
                                                    "the signal lists it, else the first source listed.")
    sources: dict[str, RawSource] = Field(description="Where the value comes from, per backend (fusebox, dcgm, vllm, sglang, "
                                                      "or a name of yours); global.selectors is keyed the same way.")
    tiers: dict[str, RawTier] = Field(description="'warning' and/or 'critical': threshold, for, keep_firing_for, severity, fuse.")
    runbook: RawRunbook
    secondary: bool = Field(False, description="A secondary signal: its own dashboard row, left out of the demo's checks.")


class RawOverride(_Strict):
    """A change to one alert (one tier, or both when tier is left out) without forking its signal."""

    alert: str
    tier: str | None = None
    threshold: Scalar | None = None
    for_: Scalar | None = Field(None, alias="for")
    keep_firing_for: Scalar | None = None
    severity: str | None = None
    enabled: bool | None = None
    source: str | None = None


class RawAction(_Strict):
    level: Integer
    description: str


class RawSelfMonitoring(_Strict):
    """``fuse.self_monitoring``: the rules that watch fusebox's own path (docs/self-monitoring.md)."""

    enabled: StrictBool = True
    # Matchers of the fuse service's scrape job: its `up` and its /metrics series. The generated
    # ServiceMonitor's job is the Service's name (fusebox-fuse); so is the demo's and compose's.
    fuse_selector: dict[str, str] = {"job": C.K8S["fuse"]}
    # Extra matchers on Alertmanager's notification counters (integration="webhook" is always set).
    alertmanager_selector: dict[str, str] = {}
    down_for: Scalar = "2m"  # FuseboxFuseDown's `for`
    max_pending_action_age: Scalar = "2m"  # FuseboxFuseActionsStuck: oldest pending gateway call older than this
    heartbeat_interval: Scalar = "1m"  # the heartbeat route's group_interval and repeat_interval
    heartbeat_silent_after: Scalar = "5m"  # FuseboxFuseHeartbeatMissing: no notification for this long


class RawAudit(_Strict):
    """``fuse.audit``: the bound on audit rows of refused alerts (docs/fuse.md "Audit retention")."""

    # Refused-alert rows one replica writes per minute at most; the rest are counted, not audited.
    refused_per_minute: int = Field(default=100, strict=True, ge=1, le=100_000)
    # Refused-alert rows the audit may hold at most (until `fusebox fuse audit prune`); past it, counted only.
    refused_max_rows: int = Field(default=100_000, strict=True, ge=100, le=10_000_000)


class RawFuse(_Strict):
    """The fuse service and the Alertmanager routing to it."""

    receiver: str = "fusebox-fuse"
    # Alertmanager receiver for people (your pager), as Alertmanager spells it; every fusebox
    # alert reaches it. Without configs it names a receiver of the config merged into, or notifies nobody.
    human_receiver: dict[str, Any] = {"name": "oncall"}
    webhook_url: str
    credentials_file: str
    group_wait_critical: Scalar = "5s"
    group_wait: Scalar = "30s"
    group_interval: Scalar = "1m"
    repeat_interval: Scalar = "4h"
    # Whether an alert without any scope label may trip the empty scope, i.e. the whole fleet at once.
    allow_fleet_wide_alerts: StrictBool = False
    self_monitoring: RawSelfMonitoring = RawSelfMonitoring()
    actions: dict[str, RawAction]
    # What the fuse service calls (fusebox/spec/adapters.py; docs/fuse.md "Adapters").
    adapters: dict[str, RawAdapter] = {}
    audit: RawAudit = RawAudit()


class RawAbsent(_Strict):
    enabled: bool = True
    for_: Scalar = Field(default="5m", alias="for")
    severity: str = "warning"


class RawDefaults(_Strict):
    """Defaults for every tier, and the absent-signal alert."""

    for_: Scalar = Field(default="1m", alias="for")
    keep_firing_for: Scalar = "1m"
    absent: RawAbsent = RawAbsent()


class RawGlobal(_Strict):
    """Settings for every signal."""

    scrape_interval: Scalar = Field("15s", description="Your Prometheus' scrape interval (a Prometheus duration).")
    evaluation_interval: Scalar = Field("15s", description="Your Prometheus' rule evaluation interval.")
    slow_evaluation_interval: Scalar = Field(
        "30s", description="Interval of the rule groups no alert's timing depends on: the absent alerts, the records only panels "
                           "read (quantile lines, copies of raw series) and the static GPU totals. Never shorter than "
                           "evaluation_interval (the longer of the two is used).")
    runbook_base_url: str = Field(description="Where the generated runbooks are served; each alert's runbook_url is BASE/<Alert>.md.")
    dashboard_base_url: str = Field("", description="Grafana's base URL for dashboard links in alerts; empty leaves them out.")
    selector: dict[str, str] = Field(
        {}, description="Label matchers (label: value) added to every raw selector of every source without an entry in 'selectors'.")
    selectors: dict[str, dict[str, str]] = Field(
        {}, description="Label matchers per source backend, keyed like the signals' 'sources' (fusebox, dcgm, vllm, sglang, ...); "
                        "a backend listed here uses these matchers instead of 'selector'.")
    source: str = Field("fusebox", description="The backend every signal reads when it lists it under 'sources' and names "
                                               "no 'source' of its own (e.g. dcgm: every signal with a dcgm source reads dcgm-exporter).")
    labels: dict[str, str] = Field({}, description="Labels added to every alert, e.g. {team: ml-infra}.")
    rule_engine: Literal[RULE_ENGINES] = Field(  # type: ignore[valid-type]
        "prometheus", description="What evaluates the generated rules: prometheus, victoriametrics (vmalert), mimir (its ruler) "
                                  "or thanos (Thanos Ruler); docs/rule-engines.md says what changes for each.")


class RawMetadata(_Strict):
    name: str
    description: str = ""


class RawSpec(_Strict):
    """A fusebox spec (apiVersion fusebox/v1): one file every output is generated from."""

    apiVersion: str
    kind: Literal["FuseboxSpec"]
    metadata: RawMetadata
    global_: RawGlobal = Field(alias="global")
    defaults: RawDefaults = RawDefaults()
    fuse: RawFuse
    kubernetes: RawKubernetes = RawKubernetes()
    grafana: RawGrafana = RawGrafana()
    otelcol: RawOtelcol = RawOtelcol()
    budget: RawBudget = RawBudget()
    inpath: RawInpath = RawInpath()
    connections: RawConnections = RawConnections()
    signals: dict[str, RawSignal]
    overrides: list[RawOverride] = []

    @model_validator(mode="before")
    @classmethod
    def _empty_sections_take_their_defaults(cls, data: Any) -> Any:
        """A section written with every key commented out (``budget:`` alone, YAML null) is the
        section's defaults, as if it were left out."""
        if isinstance(data, dict):
            return {k: ({} if v is None and k in _DEFAULTED_SECTIONS else v) for k, v in data.items()}
        return data


_DEFAULTED_SECTIONS = ("defaults", "kubernetes", "grafana", "otelcol", "budget", "inpath", "connections")


# ----------------------------------------------------------------------- normalised model
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


# ----------------------------------------------------------------------------- loading
def load_spec(path: str | Path, *, display_path: str | None = None) -> Spec:
    """Read, validate and normalise a spec file.

    Args:
        path: the YAML file.
        display_path: how to name the file in errors (default: ``path`` as given).

    Raises:
        SpecError: with one Problem per fault, each ``file:line:col: what -- fix`` (a file over
            1 MiB or not UTF-8 too: see :mod:`.positions`).
        OSError: when the file cannot be read (FileNotFoundError, IsADirectoryError, ...).
    """
    file = display_path or str(path)
    return parse_spec(read_text(Path(path), file), file, base_dir=Path(path).parent)


def parse_spec(text: str, file: str = "<spec>", *, base_dir: Path | None = None) -> Spec:
    """Like :func:`load_spec` on a string. ``base_dir``: the folder the spec's relative paths
    (``kubernetes.engines.models.*.config``) are read from; default: ``file``'s folder (the
    working directory for ``<spec>``)."""
    data, pos = load(text, file)
    if not isinstance(data, dict):
        raise SpecError([pos.problem((), "the spec must be a YAML mapping", "start from the shipped fusebox.yaml")])
    if data.get("apiVersion") != API_VERSION:
        raise SpecError([pos.problem(("apiVersion",), f"apiVersion must be {API_VERSION!r} (got {data.get('apiVersion')!r})",
                                     f"set 'apiVersion: {API_VERSION}'")])
    try:
        raw = RawSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError([pydantic_problem(err, pos, RawSpec, aliases=_ALIASES) for err in e.errors()]) from None
    return _Normaliser(raw, data, pos, Path(file).parent if base_dir is None else base_dir).run()


_ALIASES = {"for_": "for", "global_": "global"}


class _Normaliser:
    def __init__(self, raw: RawSpec, data: dict, pos: Positions, base_dir: Path | None = None):
        self.raw, self.data, self.pos, self.base_dir = raw, data, pos, base_dir
        self.problems: list[Problem] = []

    def err(self, path: tuple, what: str, fix: str, *, key: bool = False) -> None:
        p = self.pos.problem(path, what, fix, key=key)
        if p not in self.problems:  # a default read by every tier is reported once, at the default
            self.problems.append(p)

    def duration(self, value: Any, path: tuple) -> float:
        try:
            return units.parse_duration(value)
        except ValueError as e:
            if "out of range" in str(e):
                self.err(path, f"duration {e}", "use a shorter duration (Prometheus holds at most 292y)")
            else:
                self.err(path, f"malformed duration: {e}", "Prometheus durations are digits with a unit: ms, s, m, h, d, w, y")
            return 0.0

    def _check_shared_record(self, sig: Signal, earlier: list[Signal], path: tuple) -> None:
        """Signals whose value records share a name (two deriv signals over one gauge and window)
        share that record and its rule group, so they must compute it alike: the same label
        matchers (``global.selectors``), engine-label handling (vLLM / SGLang), ``by`` and scale."""
        g = self.raw.global_

        def identity(s: Signal) -> tuple:
            b = s.source.backend
            return tuple(sorted(g.selectors.get(b, g.selector).items())), b in (VLLM, SGLANG), s.by, s.source.scale

        value = KINDS[sig.kind].records(sig)["value"]
        for other in earlier:
            if KINDS[other.kind].records(other)["value"] == value and identity(other) != identity(sig):
                self.err(path + ("by",), f"{sig.name} and {other.name} read one metric over one window, so they share the record "
                         f"{value}, but compute it differently (source selectors, scale or by)",
                         f"give {sig.name} the same source and by as {other.name}, or a different window")

    def run(self) -> Spec:
        r = self.raw
        g = r.global_
        scrape = self.duration(g.scrape_interval, ("global", "scrape_interval"))
        evaluation = self.duration(g.evaluation_interval, ("global", "evaluation_interval"))
        if scrape <= 0:
            self.err(("global", "scrape_interval"), "scrape_interval must be positive", "e.g. '15s'")
        if evaluation <= 0:  # the rule group interval and the promtool test step
            self.err(("global", "evaluation_interval"), "evaluation_interval must be positive", "e.g. '15s'")
        slow = self.duration(g.slow_evaluation_interval, ("global", "slow_evaluation_interval"))
        if slow <= 0:
            self.err(("global", "slow_evaluation_interval"), "slow_evaluation_interval must be positive", "e.g. '30s'")
        for k, _v in list(g.selector.items()) + list(g.labels.items()):
            if not _LABEL.match(k):
                self.err(("global",), f"invalid label name {k!r}", "label names match [a-zA-Z_][a-zA-Z0-9_]*")
        if C.LABEL["marker"] in g.labels:  # Alertmanager routes to the fuse on it: fusebox alone sets it
            self.err(("global", "labels", C.LABEL["marker"]), f"label {C.LABEL['marker']!r} is set by fusebox on every alert "
                     "(valued with metadata.name)", "remove it from global.labels; rename metadata.name to change its value",
                     key=True)
        listed = {b for sig in r.signals.values() for b in sig.sources} | set(KNOWN_BACKENDS)
        for backend, matchers in g.selectors.items():
            if backend not in listed:
                self.err(("global", "selectors", backend), f"no source backend is called {backend!r}",
                         f"key global.selectors like the signals' sources: {', '.join(sorted(listed))}", key=True)
            for k in matchers:
                if not _LABEL.match(k):
                    self.err(("global", "selectors", backend, k), f"invalid label name {k!r}",
                             "label names match [a-zA-Z_][a-zA-Z0-9_]*", key=True)
        if g.source not in listed:
            self.err(("global", "source"), f"no signal lists a source {g.source!r}",
                     f"use one of: {', '.join(sorted(listed))}")
        hr = r.fuse.human_receiver
        if not isinstance(hr.get("name"), str) or not hr.get("name"):
            self.err(("fuse", "human_receiver"), "human_receiver needs a 'name'",
                     "write it as an Alertmanager receiver, e.g. {name: oncall, pagerduty_configs: [...]}")
        elif hr["name"] == r.fuse.receiver:
            self.err(("fuse", "human_receiver", "name"), f"human_receiver is named like the fuse receiver ({hr['name']!r})",
                     "give your pager's receiver its own name")
        actions: dict[str, FuseAction] = {}
        levels: dict[int, str] = {}
        for name, a in r.fuse.actions.items():
            if a.level in levels:
                self.err(("fuse", "actions", name, "level"), f"fuse level {a.level} is used by both {levels[a.level]!r} and {name!r}",
                         "give each action its own level (1 freeze admissions, 2 text-only fallback, 3 KV-cache eviction)")
            if a.level < 1:
                self.err(("fuse", "actions", name, "level"), "fuse levels start at 1", "use 1, 2, 3 ...")
            levels[a.level] = name
            actions[name] = FuseAction(name, a.level, a.description)
        d = r.defaults
        self.duration(d.for_, ("defaults", "for"))
        self.duration(d.keep_firing_for, ("defaults", "keep_firing_for"))
        def_for, def_kff = d.for_, d.keep_firing_for
        absent_for = self.duration(d.absent.for_, ("defaults", "absent", "for"))

        overrides = self._overrides()
        signals: list[Signal] = []
        alerts_seen: dict[str, str] = {}
        for name, raw_sig in r.signals.items():
            path = ("signals", name)
            if not _NAME.match(name):
                self.err(path, f"signal name {name!r} is not snake_case", "use lower-case letters, digits and '_'", key=True)
            if not _ALERT.match(raw_sig.alert):
                self.err(path + ("alert",), f"alert name {raw_sig.alert!r} is not CamelCase",
                         "use a CamelCase name with a component word, e.g. GPUMemoryUtilizationHigh")
            if raw_sig.alert in alerts_seen or raw_sig.alert in C.RESERVED_ALERTS:
                self.err(path + ("alert",), f"duplicate alert name {raw_sig.alert!r} (also used by {alerts_seen.get(raw_sig.alert, 'fusebox itself')})",
                         "one alert name per signal: rename one of them")
            alerts_seen[raw_sig.alert] = name
            sig = self._signal(name, raw_sig, path, def_for, def_kff, actions, overrides.get(raw_sig.alert, {}), scrape)
            if sig:
                self._check_shared_record(sig, signals, path)
                signals.append(sig)
        for alert, per_tier in overrides.items():
            if alert not in alerts_seen:
                idx = per_tier[next(iter(per_tier))][1]
                self.err(("overrides", idx, "alert"), f"override names unknown alert {alert!r}",
                         f"use one of: {', '.join(sorted(alerts_seen))}")
        # read before the check below: a malformed one must stop the run, not become 0
        f = r.fuse
        group_waits = {name: self.duration(getattr(f, name), ("fuse", name))
                       for name in ("group_wait", "group_wait_critical", "group_interval", "repeat_interval")}
        self_monitoring = self._self_monitoring(scrape)
        if not r.metadata.name.strip():
            self.err(("metadata", "name"), "metadata.name is empty", "name the cluster, e.g. multimodal-inference: it is the "
                     "cluster label of the rules and the fusebox label Alertmanager routes to the fuse on")
        kube = normalise_kubernetes(r.kubernetes, r.metadata.name, self.err, self.base_dir)
        grafana = normalise_grafana(r.grafana, self.err)
        otelcol = normalise_otelcol(r.otelcol, self.duration, self.err)
        adapters = normalise_adapters(r.fuse.adapters, {n: a.level for n, a in actions.items()}, self.duration, self.err)
        deploy.check_gateway_secret(kube.fuse, adapters, self.err)
        budget = normalise_budget(r.budget, self.err)
        connections = normalise_connections(r.connections, self.duration, self.err)
        inpath = normalise_inpath(r.inpath, {s.name: s for s in signals}, set(r.signals), self.err)
        self._check_after_shedding(signals, inpath)
        if self.problems:
            raise SpecError(self.problems)
        spec = Spec(
            file=self.pos.file, name=r.metadata.name, description=r.metadata.description,
            scrape_interval_s=scrape, evaluation_interval_s=evaluation, slow_evaluation_interval_s=max(slow, evaluation),
            runbook_base_url=g.runbook_base_url, dashboard_base_url=g.dashboard_base_url,
            selector=dict(g.selector), labels=dict(g.labels),
            absent_enabled=d.absent.enabled, absent_for_s=absent_for, absent_severity=d.absent.severity,
            receiver=r.fuse.receiver, human_receiver=dict(r.fuse.human_receiver), webhook_url=r.fuse.webhook_url, credentials_file=r.fuse.credentials_file,
            group_wait_s=group_waits["group_wait"], group_wait_critical_s=group_waits["group_wait_critical"],
            group_interval_s=group_waits["group_interval"], repeat_interval_s=group_waits["repeat_interval"],
            actions=actions, signals=tuple(signals), raw=self.data,
            allow_fleet_wide_alerts=r.fuse.allow_fleet_wide_alerts, adapters=adapters,
            kubernetes=kube, grafana=grafana, otelcol=otelcol, self_monitoring=self_monitoring,
            selectors={b: dict(m) for b, m in g.selectors.items()}, source=g.source, rule_engine=g.rule_engine,
            budget=budget, inpath=inpath, connections=connections,
            audit=Audit(r.fuse.audit.refused_per_minute, r.fuse.audit.refused_max_rows),
        )
        # runbook queries: references to records replaced, record-shaped names checked (spec/diagnosis.py)
        queries = resolve_diagnosis(spec, self.err)
        if self.problems:
            raise SpecError(self.problems)
        return dataclasses.replace(spec, signals=tuple(
            dataclasses.replace(s, runbook=dataclasses.replace(s.runbook, diagnosis=queries[s.name])) for s in spec.signals))

    def _check_after_shedding(self, signals: list[Signal], inpath: Inpath) -> None:
        """A tier with ``after_shedding`` needs a gateway shedder (``smg`` or ``sglang_router``,
        whose admission counter the rule reads) that sheds on its signal."""
        for sig in signals:
            for t in sig.tiers:
                if not t.after_shedding:
                    continue
                gateways = [sh.name for sh in inpath.shedders if sh.signal == sig.name and sh.kind in GATEWAY_KINDS]
                if not gateways:
                    self.err(t.path + ("after_shedding",),
                             f"after_shedding: no in-path gateway sheds on signal {sig.name!r}, so this tier would wait for nothing",
                             f"add one under inpath.shedders (kind: smg or sglang_router, signal: {sig.name}), "
                             "or remove after_shedding")

    def _self_monitoring(self, scrape_s: float) -> SelfMonitoring:
        """``fuse.self_monitoring``: positive durations, label names, and a silence bound the
        heartbeat's own period cannot reach (Alertmanager resends on a group_interval tick after
        repeat_interval, so two periods can pass between two heartbeats)."""
        m = self.raw.fuse.self_monitoring
        base = ("fuse", "self_monitoring")
        d: dict[str, float] = {}
        for name in ("down_for", "max_pending_action_age", "heartbeat_interval", "heartbeat_silent_after"):
            before = len(self.problems)
            d[name] = self.duration(getattr(m, name), base + (name,))
            if name != "down_for" and d[name] <= 0 and len(self.problems) == before:  # not twice for one value
                self.err(base + (name,), f"{name} must be positive", "e.g. '2m'")
        for key in ("fuse_selector", "alertmanager_selector"):
            for k in getattr(m, key):
                if not _LABEL.match(k):
                    self.err(base + (key,), f"invalid label name {k!r}", "label names match [a-zA-Z_][a-zA-Z0-9_]*")
        if d["heartbeat_interval"] > 0 and d["heartbeat_silent_after"] < 3 * d["heartbeat_interval"]:
            self.err(base + ("heartbeat_silent_after",),
                     f"heartbeat_silent_after ({m.heartbeat_silent_after}) is under three heartbeat intervals "
                     f"({m.heartbeat_interval} each): a heartbeat can come two intervals apart, so this would page on a healthy feed",
                     "raise heartbeat_silent_after to at least 3 x heartbeat_interval, e.g. 5m for 1m")
        if 0 < d["max_pending_action_age"] < 2 * scrape_s:
            self.err(base + ("max_pending_action_age",),
                     f"max_pending_action_age ({m.max_pending_action_age}) is under two scrape intervals",
                     "raise it to at least two global.scrape_interval")
        return SelfMonitoring(enabled=m.enabled, fuse_selector=dict(m.fuse_selector),
                              alertmanager_selector=dict(m.alertmanager_selector),
                              down_for_s=d["down_for"], max_pending_action_age_s=d["max_pending_action_age"],
                              heartbeat_interval_s=d["heartbeat_interval"], heartbeat_silent_after_s=d["heartbeat_silent_after"])

    def _overrides(self) -> dict[str, dict[str, tuple[RawOverride, int]]]:
        out: dict[str, dict[str, tuple[RawOverride, int]]] = {}
        for i, o in enumerate(self.raw.overrides):
            key = o.tier or "*"
            if o.tier is not None and o.tier not in TIER_ORDER:
                self.err(("overrides", i, "tier"), f"unknown tier {o.tier!r}", "use 'warning' or 'critical', or leave it out for both")
            if o.tier is not None and o.source is not None:  # one source per signal: a tier's would be ignored
                self.err(("overrides", i, "source"), f"an override's source applies to the whole signal, not to tier {o.tier!r}",
                         f"move 'source: {o.source}' to an override of {o.alert} without 'tier'")
            if key in out.setdefault(o.alert, {}):
                self.err(("overrides", i), f"a second override for {o.alert} tier {key}", "merge the two overrides into one")
            out[o.alert][key] = (o, i)
        return out

    def _signal(self, name, s: RawSignal, path, def_for, def_kff, actions, ovr, scrape) -> Signal | None:
        n_before = len(self.problems)
        # an override's source, else the signal's own, else global.source when listed, else the first listed
        source_name = s.source or (self.raw.global_.source if self.raw.global_.source in s.sources else next(iter(s.sources), ""))
        chosen = bool(s.source) or self.raw.global_.source in s.sources or len(s.sources) == 1
        whole = ovr.get("*")
        source_path = path + ("source",)
        if whole and whole[0].source:
            source_name, source_path = whole[0].source, ("overrides", whole[1], "source")
            chosen = True
        for tname, (_o, idx) in ovr.items():
            if tname in TIER_ORDER and tname not in s.tiers:  # it would change nothing
                self.err(("overrides", idx, "tier"), f"override of {s.alert} tier {tname!r}: signal {name} has no {tname} tier",
                         f"use tier: {' or '.join(t for t in s.tiers if t in TIER_ORDER) or '(none)'}, "
                         f"or add a {tname} tier under signals.{name}.tiers")
        if not s.sources:
            self.err(path + ("sources",), "a signal needs at least one source",
                     "add e.g. 'sources: {vllm: {metric: vllm:num_requests_waiting}}'")
        elif source_name not in s.sources:
            self.err(source_path, f"source {source_name!r} is not listed under sources",
                     f"use one of: {', '.join(s.sources)}")
        kind = KINDS[s.kind]
        sources: dict[str, Source] = {}
        for backend, src in s.sources.items():
            spath = path + ("sources", backend)
            if (src.capacity is not None or src.free is not None) and not getattr(kind, "takes_pool", False):
                self.err(spath, f"'capacity' and 'free' belong to time_to_full signals, not to a {s.kind} signal",
                         "remove them, or make the signal 'kind: time_to_full'")
            kind.check_source(backend, src, spath, self.err)
            if src.expr is not None:
                self._check_promql(src.expr, spath + ("expr",))
            if src.metric is not None and not re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$", src.metric):
                self.err(spath + ("metric",), f"{src.metric!r} is not a valid Prometheus metric name",
                         "metric names match [a-zA-Z_:][a-zA-Z0-9_:]*")
            elif src.metric is not None:  # a unit the kind cannot turn into the signal's: never fires (or always)
                bad = sourceunits.check(s.kind, src.metric, s.unit, src.scale)
                if bad:
                    self.err(spath + ("metric",), *bad)
            if src.scale == 0:  # the rules divide by it
                self.err(spath + ("scale",), "scale must not be 0", "leave it out for 1, or give the factor to base units")
            sources[backend] = Source(backend, src.metric, src.scale, src.expr, src.note, src.capacity, src.free)
        by = tuple(s.by) if s.by is not None else ()
        for lb in by:
            if not _LABEL.match(lb):
                self.err(path + ("by",), f"invalid label name {lb!r}", "label names match [a-zA-Z_][a-zA-Z0-9_]*")
        if not _LABEL.match(s.level) or s.level.startswith("__"):
            self.err(path + ("level",), f"level {s.level!r} is not a label name",
                     f"use {', '.join(STANDARD_LEVELS)} or a label the signal is aggregated by (pod, model_name, namespace, ...)")
        elif s.level not in STANDARD_LEVELS and s.level not in by:
            self.err(path + ("level",) if s.by is None else path + ("by",),
                     f"level {s.level!r} is not one of the signal's 'by' labels",
                     # without a by: the namespace and the level (docs/spec.md: cluster is never in 'by')
                     f"aggregate by it: by: [{', '.join(by + (s.level,)) if by else ', '.join(dict.fromkeys(('namespace', s.level)))}]")
        scopes = [lb for lb in C.SCOPE_LABELS if lb != C.LABEL["cluster"]]
        if s.level not in STANDARD_LEVELS and not set(by) & set(scopes):
            for tname, t in s.tiers.items():
                if t.fuse is not None:  # the fuse service scopes a trip by these labels; cluster alone is a whole cluster
                    self.err(path + ("tiers", tname, "fuse"),
                             f"a {s.level}-level signal by [{', '.join(by)}] has no fuse scope label ({', '.join(scopes)})",
                             "add the engine or host_name label to 'by' (e.g. with label_replace in an expr), or remove the fuse")
        window = 0.0
        if kind.window_min_scrapes is not None:
            if s.window is None:
                self.err(path, f"a {s.kind} signal needs a 'window'",
                         f"add e.g. 'window: 1m' (at least {kind.window_min_scrapes} scrape intervals)")
            else:
                window = self.duration(s.window, path + ("window",))
                kind.check_window(window, scrape, path, self.err)
        elif s.window is not None:
            self.err(path + ("window",), f"'window' means nothing for a {s.kind} signal", "remove it")
        buckets = kind.check_fields(s, path, self.err)

        tiers: list[Tier] = []
        threshold_at: dict[str, tuple] = {}  # tier -> where its threshold was written (the tier or an override)
        for tname, t in s.tiers.items():
            tpath = path + ("tiers", tname)
            if tname not in TIER_ORDER:
                self.err(tpath, f"unknown tier {tname!r}", "use 'warning' and/or 'critical'", key=True)
                continue
            o = ovr.get(tname, (None, None))[0]
            w = whole[0] if whole else None
            def pick(attr, default, o=o, w=w):
                for src in (o, w):
                    v = getattr(src, attr) if src is not None else None
                    if v is not None:
                        return v
                return default
            def where(attr, name, tname=tname, tpath=tpath, t=t):  # where the value came from: an override, the tier, the defaults
                for src, idx in (ovr.get(tname, (None, None)), whole or (None, None)):
                    if src is not None and getattr(src, attr) is not None:
                        return ("overrides", idx, name)
                return tpath + (name,) if getattr(t, attr) is not None else ("defaults", name)
            threshold_raw = pick("threshold", t.threshold)
            tp = threshold_at[tname] = where("threshold", "threshold")
            try:
                threshold = units.parse_quantity(threshold_raw, s.unit)
            except ValueError as e:
                what, fix = (e.what, e.fix) if isinstance(e, units.QuantityError) else (str(e), None)
                self.err(tp, what, fix or f"signal {name}'s unit is {s.unit}: write the threshold as e.g. {units.EXAMPLES[s.unit]}")
                continue
            if threshold == 0 and s.direction == "above":  # "-0 MB/s" too: ">= 0" holds for every sample
                self.err(tp, f"a threshold of {str(threshold_raw).strip()!r} on an upper bound fires whenever the signal exists",
                         f"give the level it should fire at, e.g. {units.EXAMPLES[s.unit]}")
                continue
            for_s = self.duration(pick("for_", t.for_ if t.for_ is not None else def_for), where("for_", "for"))
            kff = self.duration(pick("keep_firing_for", t.keep_firing_for if t.keep_firing_for is not None else def_kff),
                                where("keep_firing_for", "keep_firing_for"))
            enabled = pick("enabled", t.enabled)
            if t.fuse is not None and t.fuse not in actions:
                self.err(tpath + ("fuse",), f"unknown fuse action {t.fuse!r}", f"use one of: {', '.join(actions)}")
            kind.check_threshold(threshold, buckets, tp, self.err)
            if not enabled:
                continue
            tiers.append(Tier(
                name=tname, threshold=threshold, threshold_text=str(threshold_raw), for_s=for_s, keep_firing_for_s=kff,
                severity=pick("severity", t.severity or tname), fuse=t.fuse,
                fuse_level=actions[t.fuse].level if t.fuse in actions else 0, path=tpath, after_shedding=t.after_shedding,
                advice=t.advice,
            ))
        tiers.sort(key=lambda t: TIER_ORDER.index(t.name))
        by_name = {t.name: t for t in tiers}
        wrong_direction = kind.required_direction is not None and s.direction != kind.required_direction
        if "warning" in by_name and "critical" in by_name and not wrong_direction:
            wt, ct = by_name["warning"], by_name["critical"]
            wp, cp = threshold_at["warning"], threshold_at["critical"]
            # at the threshold an override wrote (the critical one's when both were), else the critical tier's
            at = wp if wp[0] == "overrides" and cp[0] != "overrides" else cp
            both = " (this override has no 'tier', so it sets both tiers' threshold)" if wp == cp else ""
            fix_both = "add 'tier: critical' or 'tier: warning' to this override"
            if s.direction == "above" and wt.threshold >= ct.threshold:
                self.err(at, f"warning threshold ({wt.threshold_text}) is not below critical ({ct.threshold_text}) for an upper bound{both}",
                         fix_both if both else "lower the warning threshold or raise the critical one")
            if s.direction == "below" and wt.threshold <= ct.threshold:
                self.err(at, f"warning threshold ({wt.threshold_text}) is not above critical ({ct.threshold_text}) for a lower bound{both}",
                         fix_both if both else "raise the warning threshold or lower the critical one")
        if kind.growth_only and s.direction != "above":
            self.err(path + ("direction",), f"a {s.kind} signal alerts on growth only", "remove 'direction: below'")
        for tname in s.runbook.sop:
            if tname not in TIER_ORDER:
                self.err(path + ("runbook", "sop", tname), f"unknown tier {tname!r} in runbook.sop", "use 'warning' and/or 'critical'", key=True)
        if len(self.problems) > n_before:
            return None
        rb = s.runbook
        return Signal(
            # ${window}: the signal's own window as the rules write it, so the text follows it
            name=name, alert=s.alert, description=s.description.strip().replace("${window}", units.format_duration(window)),
            kind=s.kind, unit=s.unit, level=s.level,
            direction=s.direction, by=by, window_s=window, quantile=s.quantile, buckets=buckets,
            source=sources[source_name], sources=sources, tiers=tuple(tiers),
            runbook=Runbook(rb.symptom.strip(), rb.impact.strip(), tuple((d.title, d.query) for d in rb.diagnosis),
                            {k: tuple(v) for k, v in rb.sop.items()}),
            secondary=s.secondary, path=path, source_chosen=chosen,
        )

    def _check_promql(self, expr: str, path: tuple) -> None:
        try:
            import promql_parser
        except ImportError:  # pragma: no cover - it is a dependency
            return
        try:
            promql_parser.parse(expr)
        except Exception as e:
            self.err(path, f"invalid PromQL: {str(e).splitlines()[0]}", "fix the expression; `promtool check rules` shows the same error on output")
