"""What every signal kind provides, and the helpers the kinds share.

A kind (gauge, gpu_memory, deriv, quantile) is one module in this package holding everything
about it: the validation of its spec fields, its recording-rule names and rules, the synthetic
series its generated promtool tests feed, and its dashboard panels. Renderers ask the kind
(:func:`fusebox.signal_kinds.kind_of`) and never switch on its name; adding a kind is adding a
module and listing it in ``fusebox/signal_kinds/registry.py`` (docs/architecture.md, "Where to add a signal kind").

Panels are plain data here (:class:`PanelDef`, :class:`DashboardDef`); the generator turns them
into grafanalib objects. Rules are typed dicts (:class:`Rule`), as in a Prometheus rule file; the
hooks take the normalised spec's types (:mod:`fusebox.spec.normalised`), imported for the type
checker only (the spec's loader imports this package).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, NotRequired, Protocol, TypedDict

from fusebox import conventions as C
from fusebox.spec import mmstages
from fusebox.spec.promql import metrics_in_expr
from fusebox.spec.units import format_duration, format_number

if TYPE_CHECKING:  # the spec's loader imports the kinds: its types are for the checker only
    from fusebox.spec.budget import Budget
    from fusebox.spec.normalised import Signal, Spec, Tier
    from fusebox.spec.schema import RawSignal, RawSource

# ------------------------------------------------------------------------ what hooks return
class Rule(TypedDict):
    """One recording rule, as in a Prometheus rule file."""

    record: str
    expr: str
    labels: NotRequired[dict[str, str]]


class InputSeries(TypedDict):
    """One promtool ``input_series`` entry: a series and its values (promtool's expanding notation)."""

    series: str
    values: str


class ExpSample(TypedDict):
    labels: str  # "{}" or a series' label set
    value: float


class ExprTest(TypedDict):
    """One promtool ``promql_expr_test``."""

    expr: str
    eval_time: str
    exp_samples: list[ExpSample]


class AlertTest(TypedDict):
    """One promtool ``alert_rule_test``: the alerts expected (labels and annotations) at ``eval_time``."""

    eval_time: str
    alertname: str
    exp_alerts: list[dict[str, dict[str, str]]]


class TestGroup(TypedDict):
    """One promtool test group beyond the per-tier ones (:meth:`Kind.extra_tests`)."""

    interval: str
    input_series: list[InputSeries]
    alert_rule_test: list[AlertTest]
    promql_expr_test: list[ExprTest]


# ------------------------------------------------------------------------------- PromQL
SENDER = f"{C.LABEL['instance']}, {C.LABEL['job']}"
# Every label the scraper adds (conventions.TARGET_LABELS): what a GPU-level record drops, so one
# GPU is one series whichever collector pod, service or endpoint sent it.
TARGET = ", ".join(C.TARGET_LABELS)
# Source backends the generator itself reads (the dashboard records, GPU health); global.selectors
# is keyed by these and by the signals' own sources.
FUSEBOX, DCGM, VLLM, SGLANG = "fusebox", "dcgm", "vllm", "sglang"
KNOWN_BACKENDS = (FUSEBOX, DCGM, VLLM, SGLANG)


def selector(metric: str, spec: Spec, extra: dict[str, str] | None = None, regex: dict[str, str] | None = None,
             *, backend: str = "fusebox") -> str:
    """``metric{k="v",...}`` with the matchers of the source ``backend`` (``global.selectors[backend]``,
    else ``global.selector``: :meth:`fusebox.spec.Spec.selector_for`), then ``extra`` and ``regex`` matchers."""
    parts = [f'{k}="{v}"' for k, v in sorted({**spec.selector_for(backend), **(extra or {})}.items())]
    parts += [f'{k}=~"{v}"' for k, v in sorted((regex or {}).items())]
    return f"{metric}{{{','.join(parts)}}}" if parts else metric


def le_regex(bound: float) -> str:
    """Match a bucket bound whether written "1" (Prometheus 2, OTel exporter) or "1.0" (Prometheus 3)."""
    text = format_number(bound)
    if re.fullmatch(r"-?\d+", text):
        return f"{text}|{text}\\\\.0"
    return re.escape(text).replace("\\", "\\\\")


def gigabytes(x: float) -> str:
    """Bytes as ``"76.50 GB"`` (decimal gigabytes, two decimals), as ``fusebox budget`` prints them."""
    return f"{x / 1e9:.2f} GB"


def by(labels: tuple[str, ...], extra: tuple[str, ...] = ()) -> str:
    return ", ".join(labels + extra)


def dcgm_labels(expr: str) -> str:
    """dcgm-exporter's UUID and Hostname (hostname since #655) as fusebox's hw_id and host_name.

    On a MIG instance dcgm-exporter writes the parent GPU's ``UUID`` and the instance in
    ``GPU_I_ID``: hw_id is then ``UUID/GPU_I_ID`` (``GPU-.../1``), so instances of one GPU stay
    apart (one series, alert and fuse scope each), and ``hw_gpu_mig`` is ``"true"``. A whole GPU
    (no ``GPU_I_ID``) keeps its ``UUID`` as hw_id."""
    expr = f'label_replace({expr}, "hw_id", "$1", "UUID", "(.+)")'
    expr = f'label_join({expr}, "hw_id", "/", "hw_id", "GPU_I_ID")'
    expr = f'label_replace({expr}, "hw_id", "$1", "hw_id", "(.*)/")'  # a whole GPU: no trailing "/"
    expr = f'label_replace({expr}, "{C.LABEL["mig"]}", "true", "GPU_I_ID", ".+")'
    expr = f'label_replace({expr}, "host_name", "$1", "Hostname", "(.+)")'
    return f'label_replace({expr}, "host_name", "$1", "hostname", "(.+)")'


POD_ENGINE = "fusebox_pod"  # namespace/pod of an engine's series, while the engine label is rebuilt


def engine_labels(expr: str, sig: Signal) -> str:
    """An engine's identity from its pod where the engine's own label is an index.

    vLLM's ``engine`` label (from about 0.10, docs/metrics.md section 1) is the engine's index in
    its process (``"0"``), so every pod's engine 0 would be one series and one fuse scope. For a
    signal reading the ``vllm`` or ``sglang`` source and keeping ``engine`` (its level or one of its ``by`` labels),
    ``engine`` becomes ``NAMESPACE/POD`` wherever the series carries both (a scrape by a
    ServiceMonitor or PodMonitor); elsewhere it stays as the source wrote it. ``expr`` is an
    instant vector; the temporary label :data:`POD_ENGINE` is dropped by the ``by`` aggregation
    (a gauge without ``by`` keeps it). Where ``by`` keeps ``model``, it is the engines' ``model_name``
    (vLLM and SGLang write no ``model``), so the alert and the dashboards' model variable name it."""
    if sig.source.backend not in (VLLM, SGLANG) or not (sig.level == "engine" or "engine" in sig.by):
        return expr
    return pod_engine(expr, model=C.LABEL["model"] in sig.by)


def pod_engine(expr: str, *, model: bool = True) -> str:
    """``expr`` (an instant vector of an engine's series) with ``engine`` made ``NAMESPACE/POD``
    where the series carries both, and with ``model`` (``model=True``) made the engines'
    ``model_name`` where it has one: :func:`engine_labels` without the signal."""
    expr = f'label_join({expr}, "{POD_ENGINE}", "/", "namespace", "pod")'
    expr = f'label_replace({expr}, "engine", "$1", "{POD_ENGINE}", "(.+/.+)")'
    if model:  # the engines name it model_name: the model the by (and the panels) keep
        expr = f'label_replace({expr}, "{C.LABEL["model"]}", "$1", "model_name", "(.+)")'
    return expr


def window_word(seconds: float) -> str:
    """60 -> "1m", 300 -> "5m", 90 -> "1m30s": the window as it appears in rule names."""
    return format_duration(seconds)


def dashboard_records() -> dict[str, str]:
    """Recording-rule names the dashboards read beyond the signals' own, by role.

    They live in the ``fusebox-dashboard`` rule group and raise no alert; none of them adds an
    absent alert (vLLM and SGLang metrics are optional). Roles and labels:

    * ``kv_usage``, ``kv_limit``: KV-cache bytes in use / pool bytes per engine (summed over the
      engine's GPUs; labels cluster, host_name, engine, model), bytes;
    * ``kv_ratio``: ``kv_usage / kv_limit`` per engine, ratio 0-1;
    * ``gpu_used``, ``gpu_reserved``: device memory used (total - free) and driver-reserved per
      GPU / MIG instance, bytes, whichever backend the GPU-memory signal reads (NVML or DCGM);
    * ``host_power``: GPU power summed per host (cluster, host_name), watts;
    * ``host_tokens``: generated tokens per second per host, vLLM and SGLang engines each counted
      once, rate over :data:`fusebox.conventions.DASHBOARD_RATE_WINDOW_S`;
    * ``energy_per_token``: ``host_power / host_tokens``, joules per generated token (no sample
      where no token was generated). The engines' series need ``cluster`` and ``host_name`` (the
      node) for this join: the PodMonitor of ``kubernetes.engines`` adds them (docs/kubernetes.md),
      a monitor of your own needs the same relabelings;
    * ``prefix_hit_vllm``: vLLM prefix-cache hits over queries (counters, either name
      generation), per cluster, host_name, model_name, ratio 0-1 over the rate window;
    * ``prefix_hit_sglang``: SGLang's ``cache_hit_rate`` gauge averaged per cluster, host_name,
      model_name, ratio 0-1;
    * ``stage_p95``: P95 seconds of each multimodal stage per engine (labels ``stage``,
      ``producer``), ``cache_hit``: each encoder / embedding cache's hit ratio 0-1 (labels
      ``cache``, ``producer``), over the rate window: :mod:`fusebox.spec.mmstages`.
    """
    w = window_word(C.DASHBOARD_RATE_WINDOW_S)
    rn = C.record_name
    return {
        "kv_usage": rn("engine", "fusebox_kv_cache_usage", "bytes"),
        "kv_limit": rn("engine", "fusebox_kv_cache_limit", "bytes"),
        "kv_ratio": rn("engine", "fusebox_kv_cache_usage", "ratio"),
        "gpu_used": rn("gpu", "fusebox_gpu_memory_used", "bytes"),
        "gpu_reserved": rn("gpu", "fusebox_gpu_memory_reserved", "bytes"),
        "host_power": rn("host", "fusebox_gpu_power", "watts"),
        "host_tokens": rn("host", "fusebox_generation_tokens", f"rate{w}"),
        "energy_per_token": rn("host", "fusebox_energy_per_generated_token", f"joules_rate{w}"),
        "prefix_hit_vllm": rn("model", "fusebox_vllm_prefix_cache_hit", f"ratio_rate{w}"),
        "prefix_hit_sglang": rn("model", "fusebox_sglang_prefix_cache_hit", "ratio"),
        # the alignment signal's stages (fusebox/spec/mmstages.py; the quantile kind records them)
        **mmstages.records(w),
    }


# ----------------------------------------------------------------------- test synthesis
DELTA = 0.001  # "just above/below": 0.1 % of the threshold
GPU_LIMIT_BYTES = 80_000_000_000
DCGM_TOTAL_MIB = 81_920
DCGM_RESERVED_MIB = 512
KV_BASE_BYTES = 2_000_000_000
OBS_PER_STEP = 1000

GPU_LABELS = {"hw_id": "GPU-5a3c1f2e-0000-4000-8000-000000000001", "hw_gpu_index": "0",
              "host_name": "gpu-node-1", "cluster": "test", "instance": "gpu-node-1:9464", "job": "fusebox-gpu"}
ENGINE_LABELS = {"engine": "engine-0", "model": "llava-1.5-7b", "host_name": "gpu-node-1", "cluster": "test",
                 "instance": "gpu-node-1:9464", "job": "fusebox-kv"}

# Values of the labels a signal of another level may be aggregated by, as a vLLM pod scraped by
# kube-prometheus-stack carries them (vLLM names its model label model_name).
SYNTH_VALUES = {"cluster": "test", "namespace": "inference", "pod": "vllm-llava-7b-6d9f7c8b5-x2l9q",
                "container": "vllm", "service": "vllm-llava-7b", "endpoint": "http", "node": "gpu-node-1",
                "model_name": "llava-hf/llava-1.5-7b-hf", "model": "llava-1.5-7b", "engine": "engine-0",
                "host_name": "gpu-node-1", "hw_id": GPU_LABELS["hw_id"], "instance": "10.42.3.17:8000",
                # what the alignment histogram measured: the stand-in of stock vLLM / SGLang
                C.ALIGNMENT_SOURCE_LABEL: "ttft"}


def metric_of(sig: Signal) -> str:
    """The raw metric the signal's source reads, where its kind needs one (a metric-only kind, or a
    source validated to name a metric). ValueError for a source that gives an expression."""
    if sig.source.metric is None:
        raise ValueError(f"signal {sig.name} reads an expression, not a raw metric")
    return sig.source.metric


def quantile_of(sig: Signal) -> float:
    """The quantile (0-1) a quantile-kind signal alerts on (the spec requires it). ValueError without one."""
    if sig.quantile is None:
        raise ValueError(f"signal {sig.name} has no quantile")
    return sig.quantile


def reads_alignment_histogram(sig: Signal) -> bool:
    """Whether the signal reads fusebox's own alignment histogram, whose ``source`` label says
    what was measured (conventions.ALIGNMENT_SOURCES: handoff, encoder or ttft)."""
    return sig.source.backend == "fusebox" and sig.source.metric == C.PROM["alignment_duration"]


def kept_by(sig: Signal) -> tuple[str, ...]:
    """The labels a ``by`` aggregation keeps: the signal's ``by``, plus ``source`` when it reads
    fusebox's alignment histogram (one engine's hand-off times and its TTFT stand-in are
    different measurements and stay apart; ``source`` is no scope label, so the fuse still sees
    one scope per engine). Empty without ``by``."""
    by_ = tuple(sig.by or ())
    if by_ and reads_alignment_histogram(sig) and C.ALIGNMENT_SOURCE_LABEL not in by_:
        return by_ + (C.ALIGNMENT_SOURCE_LABEL,)
    return by_


def label_str(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def segments(values: Sequence[tuple[int, float, float]]) -> str:
    """[(n_samples, start, step)] -> promtool series notation, then ``stale``."""
    parts = []
    for n, start, step in values:
        if n <= 0:
            continue
        if step == 0:
            parts.append(f"{format_number(start)}x{n - 1}" if n > 1 else format_number(start))
        else:
            sign = "+" if step > 0 else "-"
            parts.append(f"{format_number(start)}{sign}{format_number(abs(step))}x{n - 1}")
    return " ".join(parts + ["stale"])


@dataclass
class Synth:
    """The world a generated test group runs in: the signal, the spec, the input labels."""

    sig: Signal
    spec: Spec
    interval: float
    labels: dict[str, str]

    @classmethod
    def of(cls, sig: Signal, spec: Spec) -> Synth:
        """gpu and host signals get :data:`GPU_LABELS`, engine signals :data:`ENGINE_LABELS`; a
        signal of any other level (pod, model_name, ...) gets its ``by`` labels, valued as a
        Kubernetes scrape of the source would (:data:`SYNTH_VALUES`), plus ``instance`` and ``job``.
        Each ``by`` label the base lacks is added; the source backend's selector matchers win."""
        if sig.level in ("gpu", "host"):
            base = dict(GPU_LABELS)
        elif sig.level == "engine":
            base = dict(ENGINE_LABELS)
        else:
            base = {"instance": SYNTH_VALUES["instance"], "job": sig.source.backend}
        for label in kept_by(sig):
            base.setdefault(label, SYNTH_VALUES.get(label, f"{label}-0"))
        return cls(sig, spec, spec.test_interval_s, {**base, **spec.selector_for(sig.source.backend)})


# ---------------------------------------------------------------------------- dashboards
# Signal unit -> Grafana unit id. SI bytes: the spec writes "14.7 MB/s" as 14,700,000 B/s.
UNITS = {
    "ratio": "percentunit",
    "seconds": "s",
    "bytes": "decbytes",
    "bytes_per_second": "Bps",
    "count": "short",
}

# Template variables: name -> (label the filter matches, human label). "instance" filters on
# host_name: after OTLP the Prometheus `instance` label is the sender's service.instance.id
# (HOST/SERVICE for the fusebox collectors), not the host.
VARIABLES = {
    "cluster": (C.LABEL["cluster"], "Cluster"),
    # The Kubernetes mixins' convention: cluster, namespace, pod. They filter the signals that keep
    # those labels (aggregated by them); the engines' pods are listed from their own series.
    "namespace": ("namespace", "Namespace"),
    "pod": ("pod", "Pod"),
    "instance": (C.LABEL["host"], "Instance (host)"),
    "gpu": (C.LABEL["gpu_id"], "GPU / MIG instance"),
    "engine": (C.LABEL["engine"], "Engine"),
    "model": (C.LABEL["model"], "Model"),
}
# Which variables filter a series of a given level (labels the recording rules keep).
LEVEL_VARS = {
    "gpu": ("cluster", "instance", "gpu"),
    "engine": ("cluster", "instance", "engine", "model"),
    "host": ("cluster", "instance"),
    "hw_id": ("gpu",),  # per-GPU records summed by hw_id alone (KV free, total)
}
LEGEND = {
    "gpu": "{{host_name}} {{hw_id}}",
    "engine": "{{host_name}} {{engine}} {{model}}",
    "host": "{{cluster}} {{host_name}}",
}


def signal_vars(sig: Signal) -> tuple[str, ...]:
    """The template variables that filter a signal's records: its level's (gpu, engine, host),
    else those whose label is one of its ``by`` labels (a pod-level signal by cluster, namespace,
    pod, model_name is filtered by cluster)."""
    if sig.level in LEVEL_VARS:
        return LEVEL_VARS[sig.level]
    return tuple(v for v, (label, _) in VARIABLES.items() if label in sig.by)


def signal_sel(sig: Signal, metric: str) -> str:
    """:func:`sel` with the filters of :func:`signal_vars`."""
    matchers = [f'{VARIABLES[v][0]}=~"${v}"' for v in signal_vars(sig)]
    return f"{metric}{{{', '.join(matchers)}}}" if matchers else metric


def signal_legend(sig: Signal) -> str:
    """Its level's legend (gpu, engine, host), else the ``by`` labels but cluster ({{pod}} {{model_name}});
    then ``{{source}}`` where :func:`kept_by` adds it (what the alignment histogram measured)."""
    extra = " {{" + C.ALIGNMENT_SOURCE_LABEL + "}}" if kept_by(sig) != tuple(sig.by or ()) else ""
    if sig.level in LEGEND:
        return LEGEND[sig.level] + extra
    return (" ".join(f"{{{{{label}}}}}" for label in sig.by if label != C.LABEL["cluster"]) or "{{instance}}") + extra


def sel(metric: str, level: str, extra: str = "") -> str:
    """``metric{cluster=~"$cluster", ...}`` with the template filters for ``level``."""
    matchers = [f'{VARIABLES[v][0]}=~"${v}"' for v in LEVEL_VARS[level]]
    if extra:
        matchers.append(extra)
    return f"{metric}{{{', '.join(matchers)}}}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelDef:
    """One panel before grafanalib: what it shows, against which tiers, for which alerts."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str
    alerts: tuple[str, ...]  # runbooks linked (the alert(s) the panel shows)
    tiers: tuple = ()  # spec Tier objects drawn as threshold lines
    kind: str = "timeseries"  # timeseries | stat
    mappings: tuple = ()
    steps: tuple | None = None  # explicit (color, value) steps for stat panels
    width: int = 12
    soft_max: float | None = None
    no_value: str = "no data"  # what a stat panel says when the query returns nothing
    lower_bound: bool = False  # the tiers fire below their thresholds (direction: below): red at the bottom


@dataclass(frozen=True)
class DashboardDef:
    name: str  # file stem and UID seed
    title: str
    description: str
    panels: tuple[PanelDef, ...]
    annotations: tuple[dict, ...] = field(default_factory=tuple)


def signal_panel(sig: Signal, title: str, description: str, expr: str, legend: str,
                 *, tiers: bool = True, width: int = 12, unit: str | None = None) -> PanelDef:
    return PanelDef(
        title=title, description=description, queries=(Query(expr, legend),),
        unit=unit or UNITS[sig.unit], alerts=(sig.alert,), tiers=sig.tiers if tiers else (),
        width=width, soft_max=1.0 if (unit or UNITS[sig.unit]) == "percentunit" else None,
        lower_bound=sig.direction == "below",
    )


def tier_text(sig: Signal) -> str:
    return ", ".join(f"{t.name} {t.threshold_text}" for t in sig.tiers)


# ---------------------------------------------------------------------------- the kind
Err = Callable[..., None]  # err(path, what, fix, *, key=False)


def check_scrapes(window: float, scrape: float, least: int, fn: str, why: str, path: tuple, err: Err) -> None:
    """A ``fn(...[window])`` window of under ``least`` scrape intervals (seconds both) is an error at
    ``path``'s ``window``, the same words for every kind: the least window and both fixes."""
    if window < least * scrape:
        err(path + ("window",), f"{fn} window {format_duration(window)} is under {least} scrape intervals "
            f"({format_duration(least * scrape)} at global.scrape_interval {format_duration(scrape)})",
            f"use a window of at least {format_duration(least * scrape)}, or a shorter global.scrape_interval: {why}")


class ScenarioModel(Protocol):
    """What a scenario (:class:`fusebox.collectors.scenario.Scenario`) offers a kind predicting its
    signal: entity ids, and each modelled quantity at a time ``t`` in seconds from the start."""

    @property
    def gpu_ids(self) -> tuple[str, ...]: ...  # GPU UUIDs (hw_id)

    @property
    def engine_ids(self) -> tuple[str, ...]: ...  # engine ids (engine)

    def effective_memory_ratio(self, gpu: str, t: float) -> float: ...  # ratio 0-1, the KV-corrected one

    def kv_used_bytes(self, eid: str, t: float) -> float: ...  # bytes

    def quantile_series(self, eid: str, times: list[float], q: float, buckets: Sequence[float],
                        window: float) -> list[float]: ...  # seconds: histogram_quantile over window


class Kind:
    """The interface of a signal kind. Subclasses override what differs from these defaults.

    Spec side (called while the spec loads, before any Signal exists):
      ``check_raw_source`` (the pool fields, then ``check_source``), ``check_window``, ``check_fields``,
      ``check_threshold``.
    Rules: ``records``, ``raw_metrics``, ``rules``, ``alert_expr``, ``panel_rules``, ``dashboard_records``,
      ``diagnosis`` (the runbook's standard queries).
    Tests: ``window``, ``first_true``, ``exact``, ``series``, ``result_labels``, ``extra_tests``.
    Panels: ``dashboard`` (one drill-down for all signals of the kind), ``variable_source``, ``variable_record``.
    Generator: ``time_left``, ``grows_pool_bytes`` (``fusebox budget``), ``reads_gpu_series``, ``unread_inputs_warning``.
    """

    name: ClassVar[str] = ""
    # Window: None = the kind takes none; else the least number of scrape intervals it needs.
    window_min_scrapes: ClassVar[int | None] = None
    # Alerts on growth only (direction: below is refused).
    growth_only: ClassVar[bool] = False
    # The one direction the kind's tiers fire in (time to full: below), checked by check_fields;
    # None: either. Under another direction the tier order is not judged (its advice would be wrong).
    required_direction: ClassVar[str | None] = None
    # Reads a raw metric (the gauge for deriv, the histogram family for quantile), never an expr.
    metric_only: ClassVar[bool] = False
    # Whether the generated tests also drive the value to exactly each threshold (it must fire:
    # ``>=``); for kinds whose alert condition is not the value record's own comparison.
    edge_tested: ClassVar[bool] = False
    # Template variables fed by this kind's record (:meth:`variable_record`): (scope, preference;
    # lower wins). The generator takes the first such record that the deployment feeds and whose
    # series carry the variable's label (generator/tracing.py), other kinds' records after.
    variable_source: ClassVar[tuple[str, int] | None] = None

    # Takes a pool's 'capacity' / 'free' metrics in its sources (time_to_full); refused elsewhere.
    takes_pool: ClassVar[bool] = False
    # The unit of a source's metric, where known, is judged against the signal's unit
    # (fusebox/spec/sourceunits.check): False where the kind reads sources of its own (gpu_memory).
    judges_source_unit: ClassVar[bool] = True
    # The value is compared as read: a metric in a non-base unit (percent, MiB, ms) needs a scale.
    needs_base_unit: ClassVar[bool] = False
    # A source of the wrong dimension is refused saying that a scale does not help.
    scale_cannot_help: ClassVar[bool] = True

    # -- spec --------------------------------------------------------------------------
    def check_raw_source(self, backend: str, src: RawSource, spath: tuple, err: Err) -> None:
        """What the spec's loader calls for one entry of ``sources``: the pool fields refused where
        the kind takes none (:attr:`takes_pool`), then :meth:`check_source`."""
        if (src.capacity is not None or src.free is not None) and not self.takes_pool:
            err(spath, f"'capacity' and 'free' belong to time_to_full signals, not to a {self.name} signal",
                "remove them, or make the signal 'kind: time_to_full'")
        self.check_source(backend, src, spath, err)

    def check_source(self, backend: str, src: RawSource, spath: tuple, err: Err) -> None:
        """One entry of ``sources``: exactly one of ``metric`` or ``expr``."""
        if (src.metric is None) == (src.expr is None):
            err(spath, f"source {backend!r} needs exactly one of 'metric' or 'expr'",
                "name the raw metric (metric: NAME) or give a PromQL expression (expr: ...)")
        if self.metric_only and src.expr is not None:
            err(spath + ("expr",), f"a {self.name} signal reads a raw metric, not an expression",
                "use 'metric: NAME' (the gauge for deriv, the histogram family for quantile)")

    def source_dimension(self, dim: str) -> str | None:
        """The dimension the kind makes of a metric of dimension ``dim`` (fraction, size, time, rate,
        count: :data:`fusebox.spec.sourceunits.UNITS`); None where no signal unit names the result."""
        return dim

    def made_of(self, metric: str) -> str:
        """What the kind computes from ``metric``, as the unit error names it: ``NAME(metric)``."""
        return f"{self.name}({metric})"

    def check_window(self, window: float, scrape: float, path: tuple, err: Err) -> None:
        """Called with the parsed window when the kind takes one."""

    def check_fields(self, raw: RawSignal, path: tuple, err: Err) -> tuple[float, ...]:
        """Kind-specific fields; returns the histogram buckets (none for most kinds)."""
        return ()

    def check_threshold(self, threshold: float, buckets: tuple[float, ...], tp: tuple, err: Err) -> None:
        """A tier's threshold in base units, beyond the unit check every kind gets."""

    # -- rules -------------------------------------------------------------------------
    def records(self, sig: Signal) -> dict[str, str]:
        """Recording-rule names by role; ``value`` is the one the alert reads."""
        raise NotImplementedError

    def raw_metrics(self, sig: Signal) -> list[str]:
        """The raw metric names whose absence blinds the signal's alerts (each gets an absent alert)."""
        src = sig.source
        if src.metric:
            return [src.metric]
        return metrics_in_expr(src.expr or "")

    def rules(self, sig: Signal, spec: Spec) -> list[Rule]:
        """The signal's recording rules the alert reads, in evaluation order (the alert comes
        after them, in the same group, at ``global.evaluation_interval``)."""
        raise NotImplementedError

    def alert_expr(self, sig: Signal, tier: Tier, spec: Spec) -> str:
        """The alerting rule's condition for ``tier`` (threshold in base units): the ``value``
        record against the threshold, ``>=`` above or ``<=`` below."""
        op = ">=" if sig.direction == "above" else "<="
        return f"{self.records(sig)['value']} {op} {format_number(tier.threshold)}"

    def panel_rules(self, sig: Signal, spec: Spec) -> list[Rule]:
        """Records only panels read, no alert (e.g. a quantile's P50/P99 lines): the generator puts
        them in the signal's own group at ``global.slow_evaluation_interval``
        (``fusebox-<signal>-panels``). They may read the records of :meth:`rules`."""
        return []

    def slow_rules(self, sig: Signal, spec: Spec) -> list[Rule]:
        """Records of static inputs the alert's records read (e.g. a GPU's total memory): the
        generator puts them in the ``fusebox-static`` group at ``global.slow_evaluation_interval``.
        A value that has not been recorded yet must leave the alert's record well defined."""
        return []

    def diagnosis(self, sig: Signal, spec: Spec) -> list[tuple[str, str]]:
        """The runbook's standard diagnosis queries, ``(title, PromQL)``, first in its list: built
        from the records :meth:`rules` and :meth:`panel_rules` write (:meth:`records`) and the
        raw series of the signal's own source, so a changed window, level or source renames them
        with the rules. The spec's ``runbook.diagnosis`` entries follow them."""
        return [(f"The value the alert reads, per {sig.level} ({sig.unit.replace('_', ' ')})", self.records(sig)["value"])]

    def kept_labels(self, sig: Signal) -> tuple[str, ...] | None:
        """The labels the value record (and so the alert) keeps: its ``by`` labels when it is
        aggregated by them, or None when it keeps those of its source's series (then the level's
        usual ones are assumed: hw_id, host_name for gpu; engine, model, host_name for engine)."""
        return tuple(sig.by) if sig.by else None

    def measured(self, sig: Signal) -> list[tuple[str, str, str, str]]:
        """What the signal's series may have measured, where its source says it in a label:
        ``(label value, short name, what it is, what to do when the alert reads it)``, the
        alert's annotations and the runbook name it. Empty: the signal says it in its description."""
        return []

    def dashboard_records(self, sigs: list[Signal], spec: Spec) -> list[Rule]:
        """Records the kind's drill-down panels read beyond the signals' own (no alerts)."""
        return []

    def reports_lost_gpus(self, sig: Signal) -> bool:
        """Whether the signal's source reports a lost GPU as ``fusebox_gpu_up 0``."""
        return False

    # Its source is where the GPUs' own series are read (the GPU-memory signal): GPU power per
    # host is then read from the same backend (generator/producers.gpu_power_backend).
    reads_gpu_series: ClassVar[bool] = False

    def grows_pool_bytes(self, sig: Signal) -> bool:
        """Whether the signal's thresholds are a KV pool's growth in bytes per second: the lowest
        critical one is the growth ``fusebox budget`` fills a GPU at without ``budget.gpu_growth``."""
        return False

    def time_left(self, sig: Signal, tier: Tier, budget: Budget, growth_bps: float | None) -> tuple[float | None, str]:
        """``fusebox budget``: seconds from the ``tier`` firing until its resource is exhausted,
        with how they were worked out (None and why not where the kind exhausts no pool at a known
        rate). ``growth_bps``: the growth to assume in bytes per second (``budget.gpu_growth``, else
        the lowest critical threshold of the :meth:`grows_pool_bytes` signals), None without one."""
        return None, f"n/a: a {sig.kind} in {sig.unit.replace('_', ' ')} has no pool that fills at a known rate"

    def unread_inputs_warning(self, sig: Signal, metrics: list[str]) -> str | None:
        """What ``fusebox generate`` says when the signal's rules read ``metrics`` that nothing the
        deployment runs publishes, where the kind says it better than the general warning (the
        rules do not stay empty but compute something else); None: the general warning."""
        return None

    # -- scenario player -------------------------------------------------------------------
    def scenario_series(self, sig: Signal, scenario: ScenarioModel, times: list[float]) -> dict[str, list[float]]:
        """The value the signal's record takes at each of ``times`` (seconds from the scenario's
        start) under ``scenario``, per entity (GPU UUID or engine id), as the generated rules would
        compute it from what the scenario's collectors publish; empty when the scenario does not
        model what the signal reads (the player then predicts nothing for it)."""
        return {}

    # -- generated tests -----------------------------------------------------------------
    def testable(self, sig: Signal) -> bool:
        """Whether synthetic series can drive the signal (a custom expression cannot)."""
        return True

    def window(self, sig: Signal) -> float:
        return sig.window_s if self.window_min_scrapes is not None else 0.0

    def first_true(self, sig: Signal, interval: float) -> float:
        """When the value record first exists: rate/deriv need two samples, one interval in."""
        return interval if self.window_min_scrapes is not None else 0.0

    def exact(self, synth: Synth, v: float) -> float:
        """The value the rules compute when the series target ``v``."""
        return v

    def series(self, synth: Synth, phases: list[tuple[int, float]]) -> list[InputSeries]:
        """phases: [(n_samples, target value)] -> promtool input_series."""
        raise NotImplementedError

    def alert_value(self, synth: Synth, tier: Tier, v: float) -> float:
        """The ``tier`` alert's value (``$value``) while the series hold target ``v``: the value
        record's (:meth:`exact`), where the alert compares it with the threshold."""
        return self.exact(synth, v)

    def result_labels(self, synth: Synth) -> dict[str, str]:
        """The labels of the value record (and so of the alert) for the synthetic input."""
        return dict(synth.labels)

    def extra_tests(self, synth: Synth) -> list[tuple[str, TestGroup]]:
        """Test groups beyond the per-tier ones (e.g. zero traffic)."""
        return []

    # -- panels --------------------------------------------------------------------------
    def dashboard(self, spec: Spec, sigs: list[Signal]) -> DashboardDef | None:
        return None

    def variable_record(self, sig: Signal) -> str:
        """The record template variables list values from: one that has a series for every entity
        as long as its source does (the value record, unless it comes and goes with traffic)."""
        return self.records(sig)["value"]
