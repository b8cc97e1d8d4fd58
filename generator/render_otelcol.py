"""OpenTelemetry Collector config from the spec.

Pure renderer: ``render_otelcol(spec, options) -> {"otel/otelcol.yaml": text}``; no I/O.
Targets the Collector that ``tools/build-otelcol.sh`` builds (core v0.165.0, contrib v0.165.1)
and is validated by it in the tests (``otelcol-fusebox validate --config``).

Pipeline (docs/pitfalls.md P5): ``otlp`` (gRPC + HTTP) [+ ``prometheus`` receiver scraping engines'
/metrics when asked] -> ``memory_limiter`` (first: it can only protect what comes after it)
-> ``resource`` (only on the scrape pipeline: stamps host.name / cluster on engine metrics)
-> ``batch`` -> ``prometheus`` exporter [+ ``prometheusremotewrite``] [+ ``debug`` when asked;
never the removed ``logging``].

With the spec's ``otelcol.traces`` (docs/exemplars.md): a ``traces`` pipeline, ``otlp`` ->
``memory_limiter`` -> ``batch`` -> ``otlp_grpc/traces`` (the trace backend, e.g. Jaeger v2; a
Prometheus exporter cannot take spans) [+ the ``span_metrics`` connector, whose R.E.D. metrics,
exemplars on, come out of a ``metrics/span_metrics`` pipeline into the same metric exporters], and
the ``prometheus`` exporter serves OpenMetrics, the only format that carries exemplars. Without
it the config is what it was.

Resource attributes the rules group by (``host.name`` -> ``host_name``, ``cluster``) are
promoted to labels with the exporter's ``resource_constant_labels`` (the pinned v0.165.1
deprecates ``resource_to_telemetry_conversion``); without it they would land only on
``target_info``. Listen addresses are ``${env:NAME:-default}`` references, so one generated
file serves a laptop (loopback defaults), docker-compose and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath

from fusebox import conventions as C
from fusebox.spec.traces import Traces
from fusebox.spec.units import format_duration

from .yamlout import dump_yaml

__all__ = ["OtelcolOptions", "otelcol_config", "render_otelcol", "metric_expiration_s", "PROMOTED_RESOURCE_ATTRIBUTES", "ENV"]

OUT_PATH = "otel/otelcol.yaml"

# Resource attribute -> the label the rules read (the exporter writes "." as "_").
PROMOTED_RESOURCE_ATTRIBUTES = ("host.name", "cluster", "engine", "model")

# Environment variables the generated config reads, with their defaults (loopback only).
ENV = {
    "otlp_grpc": ("FUSEBOX_OTLP_GRPC_ENDPOINT", "127.0.0.1:4317"),
    "otlp_http": ("FUSEBOX_OTLP_HTTP_ENDPOINT", "127.0.0.1:4318"),
    "prometheus": ("FUSEBOX_OTELCOL_PROMETHEUS_ENDPOINT", "127.0.0.1:8889"),
    "health": ("FUSEBOX_OTELCOL_HEALTH_ENDPOINT", "127.0.0.1:13133"),
    "telemetry_host": ("FUSEBOX_OTELCOL_TELEMETRY_HOST", "127.0.0.1"),
    "telemetry_port": ("FUSEBOX_OTELCOL_TELEMETRY_PORT", "8888"),
    "cluster": ("FUSEBOX_CLUSTER", "default"),
    "host": ("HOSTNAME", "unknown"),
}


# The trace backend's address: the spec's otelcol.traces.endpoint is the default.
TRACES_ENDPOINT_ENV = "FUSEBOX_TRACES_ENDPOINT"
TRACES_EXPORTER = "otlp_grpc/traces"  # the core otlp exporter's type in v0.165 (deprecated alias: otlp)
SPAN_METRICS = "span_metrics"  # the contrib connector's type (alias: spanmetrics)


def _env(key: str) -> str:
    name, default = ENV[key]
    return f"${{env:{name}:-{default}}}"


def go_duration(seconds: float) -> str:
    """Seconds as a Go ``time.Duration`` string, exact to the nanosecond (1.28 -> "1280ms")."""
    ns = round(seconds * 1e9)
    for unit, f in (("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if ns % f == 0:
            return f"{ns // f}{unit}"
    return f"{ns}ns"


def _span_metrics_connector(sm) -> dict:
    """The ``span_metrics`` connector: seconds (Prometheus' base unit), exemplars kept."""
    hist: dict = {"unit": "s"}
    if sm.buckets_s is not None:
        hist["explicit"] = {"buckets": [go_duration(b) for b in sm.buckets_s]}
    conn: dict = {"histogram": hist, "exemplars": {"enabled": True},
                  "metrics_flush_interval": go_duration(sm.flush_interval_s)}
    if sm.dimensions:
        conn["dimensions"] = [{"name": n} if d is None else {"name": n, "default": d} for n, d in sm.dimensions]
    return conn


def _add_traces(traces, cfg: dict, out_names: list[str]) -> None:
    """The traces pipeline (and the span-metrics one) into ``cfg``'s components and pipelines."""
    exporter: dict = {"endpoint": f"${{env:{TRACES_ENDPOINT_ENV}:-{traces.endpoint}}}"}
    if traces.insecure:
        exporter["tls"] = {"insecure": True}
    cfg["exporters"][TRACES_EXPORTER] = exporter
    cfg["exporters"]["prometheus"]["enable_open_metrics"] = True
    pipelines = cfg["service"]["pipelines"]
    pipelines["traces"] = {"receivers": ["otlp"], "processors": ["memory_limiter", "batch"], "exporters": [TRACES_EXPORTER]}
    if traces.span_metrics is not None:
        cfg["connectors"] = {SPAN_METRICS: _span_metrics_connector(traces.span_metrics)}
        pipelines["traces"]["exporters"].append(SPAN_METRICS)
        pipelines["metrics/span_metrics"] = {"receivers": [SPAN_METRICS], "processors": ["memory_limiter", "batch"],
                                             "exporters": list(out_names)}


@dataclass(frozen=True)
class OtelcolOptions:
    """What the user may change without editing the generated file.

    Attributes:
        remote_write_url: add a ``prometheusremotewrite`` exporter to this URL (e.g.
            ``http://prometheus:9090/api/v1/write``); None leaves it out.
        debug: add the ``debug`` exporter (verbosity ``basic``) to the pipeline.
        scrape_targets: ``host:port`` of engines (vLLM, SGLang) whose /metrics the Collector
            scrapes with its ``prometheus`` receiver; empty leaves the receiver out.
        scrape_interval_s: interval of that scrape; None uses the spec's scrape interval.
        memory_limit_percentage / memory_spike_percentage: ``memory_limiter`` bounds (% of
            the container's or host's memory).
        traces: the spec's ``otelcol.traces`` (:class:`fusebox.spec.traces.Traces`): the traces
            pipeline to that backend and, with ``span_metrics``, the connector; None leaves both out.
    """

    remote_write_url: str | None = None
    debug: bool = False
    scrape_targets: tuple[str, ...] = field(default_factory=tuple)
    scrape_interval_s: float | None = None
    memory_limit_percentage: int = 80
    memory_spike_percentage: int = 20
    traces: Traces | None = None

    @classmethod
    def from_spec(cls, spec) -> OtelcolOptions:
        """The spec's ``otelcol:`` block (fusebox.yaml), every attribute above."""
        o = spec.otelcol
        return cls(remote_write_url=o.remote_write_url, debug=o.debug, scrape_targets=tuple(o.scrape_targets),
                   scrape_interval_s=o.scrape_interval_s, memory_limit_percentage=o.memory_limit_percentage,
                   memory_spike_percentage=o.memory_spike_percentage, traces=o.traces)


def metric_expiration_s(spec) -> int:
    """How long the exporter keeps a series that stopped receiving points, in seconds.

    The default 5m keeps a dead collector's last values visible for 5 minutes, which delays
    every absent()-based alert (``FuseboxSignalAbsent``) by as much. Twelve push intervals (the
    spec's scrape interval), at least one minute, rides out a few late pushes.
    """
    return int(max(60, 12 * spec.scrape_interval_s))


def otelcol_config(spec, options: OtelcolOptions = OtelcolOptions()) -> dict:
    """The Collector config as a dict (see the module docstring for its shape)."""
    receivers: dict = {
        "otlp": {"protocols": {"grpc": {"endpoint": _env("otlp_grpc")}, "http": {"endpoint": _env("otlp_http")}}},
    }
    processors: dict = {
        "memory_limiter": {"check_interval": "1s", "limit_percentage": options.memory_limit_percentage,
                           "spike_limit_percentage": options.memory_spike_percentage},
        "batch": {"send_batch_size": 8192, "timeout": "1s"},
    }
    exporters: dict = {
        "prometheus": {
            "endpoint": _env("prometheus"),
            "metric_expiration": format_duration(metric_expiration_s(spec)),
            "resource_constant_labels": {"included": list(PROMOTED_RESOURCE_ATTRIBUTES)},
            "translation_strategy": "UnderscoreEscapingWithSuffixes",  # what fusebox.conventions.PROM assumes
        },
    }
    out_names = ["prometheus"]
    if options.remote_write_url:
        exporters["prometheusremotewrite"] = {
            "endpoint": options.remote_write_url,
            "resource_constant_labels": {"included": list(PROMOTED_RESOURCE_ATTRIBUTES)},
            "translation_strategy": "UnderscoreEscapingWithSuffixes",
        }
        out_names.append("prometheusremotewrite")
    if options.debug:
        exporters["debug"] = {"verbosity": "basic"}
        out_names.append("debug")
    pipelines: dict = {
        "metrics": {"receivers": ["otlp"], "processors": ["memory_limiter", "batch"], "exporters": list(out_names)},
    }
    if options.scrape_targets:
        interval = format_duration(options.scrape_interval_s or spec.scrape_interval_s)
        receivers["prometheus"] = {"config": {"scrape_configs": [{
            "job_name": "fusebox-engines", "scrape_interval": interval, "metrics_path": "/metrics",
            "static_configs": [{"targets": list(options.scrape_targets)}],
        }]}}
        # Engines do not know the host or cluster they run on: stamp them so the rules' `by`
        # labels (cluster, host_name) exist on scraped series too.
        processors["resource"] = {"attributes": [
            {"key": "host.name", "value": _env("host"), "action": "insert"},
            {"key": C.LABEL["cluster"], "value": _env("cluster"), "action": "insert"},
        ]}
        pipelines["metrics/engines"] = {"receivers": ["prometheus"], "processors": ["memory_limiter", "resource", "batch"],
                                        "exporters": list(out_names)}
    cfg = {
        "receivers": receivers,
        "processors": processors,
        "exporters": exporters,
        "extensions": {"health_check": {"endpoint": _env("health")}},
        "service": {
            "extensions": ["health_check"],
            "pipelines": pipelines,
            "telemetry": {"metrics": {"level": "basic", "readers": [{"pull": {"exporter": {"prometheus": {
                "host": _env("telemetry_host"), "port": _env("telemetry_port")}}}}]}},
        },
    }
    if options.traces is not None:
        _add_traces(options.traces, cfg, out_names)
    return cfg


def outputs(spec, header: str) -> dict[str, str]:
    """The writer's entry point (generator/outputs.py): the options of the spec's ``otelcol:`` block."""
    return render_otelcol(spec, OtelcolOptions.from_spec(spec), header=header)


def render_otelcol(spec, options: OtelcolOptions = OtelcolOptions(), header: str | None = None) -> dict[str, str]:
    """``{"otel/otelcol.yaml": text}``: the config with a generated-file header. Deterministic."""
    header = "# " + (header or C.GENERATED_HEADER.format(spec=PurePath(spec.file).name)) + "\n"
    body = dump_yaml(otelcol_config(spec, options), sort_keys=True)
    # Only the variables this config reads: the scrape pipeline's stamps exist only with scrape_targets.
    used = {k: v for k, v in ENV.items() if f"${{env:{v[0]}:-" in body}
    stamps = [used.pop(k) for k in ("host", "cluster") if k in used]
    notes = (
        "# OpenTelemetry Collector (core v0.165.0, contrib v0.165.1; tools/build-otelcol.sh).\n"
        "# Listen addresses come from the environment, with loopback defaults:\n"
        + "".join(f"#   {name} (default {default})\n" for name, default in used.values())
    )
    if stamps:
        notes += ("# The scraped engines' series are stamped from the environment:\n"
                  + "".join(f"#   {name} (default {default})\n" for name, default in stamps))
    if options.traces is not None:
        notes += f"# The trace backend's OTLP gRPC address: {TRACES_ENDPOINT_ENV} (default {options.traces.endpoint})\n"
    return {OUT_PATH: header + notes + body}
