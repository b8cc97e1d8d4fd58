"""The spec's raw schema: pydantic models of the YAML as written (``extra="forbid"``: an unknown
key is an error, placed at its line by :mod:`.validation`).

Values are as the user wrote them (``"78.3%"``, ``"5m"``); the normalisers (:mod:`.model` and the
section modules it calls) turn them into the frozen :class:`~.model.Spec`. The ``kind`` of a signal
is one of the registered signal kinds (:data:`fusebox.signal_kinds.registry.KINDS`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, FiniteFloat, StrictBool, model_validator

from fusebox import conventions as C
from fusebox.signal_kinds.registry import KINDS

from . import units
from .adapters import RawAdapter
from .budget import RawBudget
from .connections import RawConnections
from .deploy import RawGrafana, RawKubernetes, RawOtelcol
from .inpath import RawInpath
from .scaling import RawScaling
from .slo import RawSlo

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
    # time_to_full only (fusebox/signal_kinds/time_to_full.py): the pool's size, or its free part,
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
    kind: Literal[tuple(KINDS)] = Field(  # type: ignore[valid-type]  # the registered kinds (fusebox/signal_kinds)
        description="How the value is computed: gauge (as read), deriv (growth per second), quantile (from a histogram), "
                    "gpu_memory (device-memory ratio with the KV-pool correction), time_to_full (seconds until a pool "
                    "is full at its current growth; direction: below), rate (a counter's events per second, e.g. preemptions), "
                    "connection_idle (a share or quantile of the idle time before each connection use).")
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
    # optional: absent, no scaling outputs (fusebox/spec/scaling.py, docs/scaling.md)
    scaling: RawScaling | None = None
    signals: dict[str, RawSignal]
    # optional: service-level objectives on latency histograms (fusebox/spec/slo.py, docs/slo.md)
    slos: dict[str, RawSlo] = {}
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
