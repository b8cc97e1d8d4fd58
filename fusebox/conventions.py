"""Every name fusebox emits or reads, defined once.

Renderers, collectors, the fuse service and the tests import these constants instead of
spelling names out. Sources:

* OTel names follow the hardware semantic conventions (``hw.gpu.memory.usage`` ...,
  ``docs/hardware/gpu.md``); fusebox-specific instruments live under ``fusebox.``.
* Prometheus names are what the OpenTelemetry Collector's ``prometheus`` exporter makes of
  them with its default ``UnderscoreEscapingWithSuffixes`` strategy
  (prometheus/otlptranslator ``metric_namer.go``); :func:`otel_to_prometheus` re-implements
  that translation and is golden-tested, because rules and dashboards silently stop
  receiving data when it drifts.
* Recording-rule names follow ``level:metric:operations``
  (Prometheus "Defining recording rules" best practice).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

__all__ = [
    "otel_to_prometheus",
    "OTEL",
    "PROM",
    "LABEL",
    "SCOPE_LABELS",
    "ABSENT_ALERT",
    "GPU_DOWN_ALERT",
    "FUSE_METRICS",
    "GENERATED_HEADER",
    "FUSE_LEVEL_METRIC",
    "ALERTS_METRIC",
    "dashboard_uid",
    "OVERVIEW_DASHBOARD",
]

# --- OpenTelemetry instrument names (name, unit, instrument kind) -----------------------
OTEL = {
    # hardware semantic conventions (Development stability)
    "gpu_memory_usage": ("hw.gpu.memory.usage", "By", "updowncounter"),
    "gpu_memory_limit": ("hw.gpu.memory.limit", "By", "updowncounter"),
    # usage / limit as the collector read them in one NVML call: the rules read one series, not a division
    "gpu_memory_ratio": ("hw.gpu.memory.utilization", "1", "gauge"),
    "gpu_utilization": ("hw.gpu.utilization", "1", "gauge"),
    "gpu_io": ("hw.gpu.io", "By", "counter"),
    "gpu_power": ("hw.power", "W", "gauge"),
    # fusebox-specific
    "gpu_memory_reserved": ("fusebox.gpu.memory.reserved", "By", "updowncounter"),
    "gpu_memory_bandwidth_utilization": ("fusebox.gpu.memory_bandwidth.utilization", "1", "gauge"),
    "gpu_pcie_utilization": ("fusebox.gpu.pcie.utilization", "1", "gauge"),
    "gpu_up": ("fusebox.gpu.up", "1", "updowncounter"),
    # a PCIe link several GPUs share (collectors/pcie.py): max(sum tx, sum rx) of the GPUs below it
    # over its trained capacity, per {pcie.root_complex, pcie.port, numa.node}
    "pcie_upstream_utilization": ("fusebox.gpu.pcie.upstream.utilization", "1", "gauge"),
    "kv_cache_usage": ("fusebox.kv_cache.usage", "By", "updowncounter"),
    "kv_cache_limit": ("fusebox.kv_cache.limit", "By", "updowncounter"),
    "alignment_duration": ("fusebox.alignment.duration", "s", "histogram"),
    # long-lived connections between gateway and engines, from the kernel's TCP_INFO (collect conns):
    # the longest idle time now among a peer's followed connections, the idle time each use of a
    # connection ended (a request after idle), and the uses after more than connections.cold_after
    "connection_idle_time": ("fusebox.connection.idle_time", "s", "gauge"),
    "connection_idle_before_use": ("fusebox.connection.idle_before_use", "s", "histogram"),
    "connection_cold_starts": ("fusebox.connection.cold_starts", "{use}", "counter"),
}

# What an alignment-latency observation measures: the attribute (and, after export, the label)
# ``source`` on fusebox.alignment.duration (fusebox_alignment_duration_seconds), one of:
#   handoff  the vision-encoder -> language-decoder hand-off itself (alignment_timer, record_alignment)
#   encoder  an engine's own encoder / multimodal-stage histogram (collect latency, read first)
#   ttft     the engine's time to first token (collect latency's stand-in where an engine publishes no
#            encoder timing, as stock vLLM and SGLang do not): queueing + prefill + encoder, an upper bound
ALIGNMENT_SOURCE_LABEL = "source"
ALIGNMENT_SOURCES = ("handoff", "encoder", "ttft")
# Engine histograms `collect latency` reads, in order: encoder / multimodal-stage timings first (none
# that stock vLLM or SGLang publish yet, vLLM issue #25377: name one with --encoder-metric), then the
# time to first token.
ENGINE_ENCODER_HISTOGRAMS: tuple[str, ...] = ()
ENGINE_TTFT_HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "sglang:time_to_first_token_seconds",
    "sglang_time_to_first_token_seconds",
)

# unit -> suffix, from otlptranslator's unit map (only the units we emit or test).
_UNIT_WORDS = {
    "s": "seconds",
    "ms": "milliseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "W": "watts",
    "J": "joules",
    "Cel": "celsius",
    "Hz": "hertz",
    "%": "percent",
    "bit": "bits",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
}
_PER_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "min": "minute"}


def otel_to_prometheus(name: str, unit: str, kind: str) -> str:
    """Translate an OTel metric name to the Prometheus name the Collector exports.

    Mirrors otlptranslator's ``UnderscoreEscapingWithSuffixes`` strategy:
    non ``[a-zA-Z0-9:_]`` characters become ``_`` (runs collapsed), the unit adds a suffix
    (``By`` -> ``_bytes``, ``By/s`` -> ``_bytes_per_second``, ``{...}`` annotations dropped),
    a monotonic counter adds ``_total``, a gauge with unit ``1`` adds ``_ratio``
    (not an UpDownCounter: ``hw.status`` stays ``hw_status``).

    Args:
        name: OTel instrument name, e.g. ``"hw.gpu.memory.usage"``.
        unit: UCUM unit string, e.g. ``"By"``, ``"s"``, ``"1"``, ``"{request}"``.
        kind: one of ``counter``, ``updowncounter``, ``gauge``, ``histogram``.

    Returns:
        The Prometheus metric name (histograms: the family name, without ``_bucket``).
    """
    out = re.sub(r"[^a-zA-Z0-9:_]+", "_", name).strip("_")
    out = re.sub(r"__+", "_", out)
    unit = re.sub(r"\{[^}]*\}", "", unit or "").strip()
    words: list[str] = []
    if unit and unit != "1":
        main, _, per = unit.partition("/")
        if main and main != "1":
            words.append(_UNIT_WORDS.get(main, re.sub(r"[^a-zA-Z0-9]+", "_", main)))
        if per:
            words.append("per_" + _PER_WORDS.get(per, re.sub(r"[^a-zA-Z0-9]+", "_", per)))
    elif unit == "1" and kind == "gauge":
        words.append("ratio")
    for w in words:
        if not out.endswith("_" + w):
            out += "_" + w
    if kind == "counter" and not out.endswith("_total"):
        out += "_total"
    return out


def _prom(key: str) -> str:
    return otel_to_prometheus(*OTEL[key])


# --- Prometheus names the rules read (the metric contract) ------------------------------
PROM = {key: _prom(key) for key in OTEL}
# PROM["gpu_memory_usage"] == "hw_gpu_memory_usage_bytes" and so on; golden-tested.

# Engine metrics (vLLM / SGLang), by version; see docs/metrics.md sections 1 and 2.
VLLM_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # new, old (<0.10)
VLLM_CACHE_CONFIG = "vllm:cache_config_info"
# its label: the share of each GPU's memory the engine takes (weights, activations, KV pool), 0-1
VLLM_MEMORY_SHARE_LABEL = "gpu_memory_utilization"
VLLM_GENERATION_TOKENS = "vllm:generation_tokens_total"  # counter, tokens
VLLM_PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"  # counter, tokens (>= 0.9)
VLLM_PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"  # counter, tokens (>= 0.9)
VLLM_PREFIX_CACHE_HITS_OLD = "vllm:gpu_prefix_cache_hits_total"  # counter, tokens (< 0.9; PR #18354)
VLLM_PREFIX_CACHE_QUERIES_OLD = "vllm:gpu_prefix_cache_queries_total"  # counter, tokens (< 0.9)
SGLANG_CACHE_HIT_RATE = "sglang:cache_hit_rate"  # gauge, fraction 0-1
# Requests running per engine pod, a series every version publishes: the dashboards' namespace and
# pod variables list pods from them; runbooks read them
VLLM_REQUESTS_RUNNING = "vllm:num_requests_running"  # gauge, requests, label model_name
SGLANG_REQUESTS_RUNNING = "sglang:num_running_reqs"  # gauge, requests
SGLANG_GENERATION_TOKENS = "sglang:generation_tokens_total"  # counter, tokens
# Preemption (docs/metrics.md section 7): the engines' counters the preemption signal lists, what
# its runbook reads beside them, and smg 1.13's own priority-scheduler preemptions (admission slots
# taken from a lower class, not KV: read from its /metrics HELP, "Successful preemptions by victim
# class and preempting class")
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"  # counter, preemptions (every version)
SGLANG_RETRACTIONS = "sglang:num_retracted_requests_total"  # counter, requests (the gauge num_retracted_reqs is not one)
VLLM_REQUESTS_WAITING = "vllm:num_requests_waiting"  # gauge, requests
GATEWAY_PREEMPTIONS = "smg_scheduler_preemption_total"  # counter (smg 1.13)
SGLANG_PREFIXES = ("sglang:", "sglang_")
SGLANG_TOKEN_USAGE = "sglang:token_usage"  # gauge, fraction 0-1 of the KV pool
SGLANG_REQUESTS_WAITING = "sglang:num_queue_reqs"  # gauge, requests


def sglang_names(name: str) -> tuple[str, ...]:
    """Every spelling of an SGLang metric, ``sglang:`` first: ``"sglang:cache_hit_rate"`` ->
    ``("sglang:cache_hit_rate", "sglang_cache_hit_rate")`` (the prefix varies by version)."""
    base = next((name[len(p):] for p in SGLANG_PREFIXES if name.startswith(p)), name)
    return tuple(p + base for p in SGLANG_PREFIXES)

# What smg 1.13's worker overload veto reads from each engine, by quantity (its load poll: the
# names in its binary beside "load poll"; docs/inpath.md, "smg's worker overload protection"): a
# signal of the spec reading one of these is the same quantity as the veto's threshold.
SMG_VETO_READS = {
    "token_usage": (*VLLM_KV_USAGE, *sglang_names(SGLANG_TOKEN_USAGE)),  # KV-cache token usage, 0-1
    "waiting_requests": (VLLM_REQUESTS_WAITING, *sglang_names(SGLANG_REQUESTS_WAITING)),  # requests
}

# dcgm-exporter fields (MiB for framebuffer; ratios 0-1 for DCP fields).
DCGM = {
    "fb_used": "DCGM_FI_DEV_FB_USED",
    "fb_free": "DCGM_FI_DEV_FB_FREE",
    "fb_reserved": "DCGM_FI_DEV_FB_RESERVED",
    "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "pcie_tx": "DCGM_FI_PROF_PCIE_TX_BYTES",
    "pcie_rx": "DCGM_FI_PROF_PCIE_RX_BYTES",
    "power": "DCGM_FI_DEV_POWER_USAGE",  # W, gauge (default counters)
}
MIB = 1_048_576

# --- label keys -----------------------------------------------------------------------
LABEL = {
    "gpu_id": "hw_id",  # GPU or MIG UUID; unique across a cluster, so joins need no host label
    "gpu_index": "hw_gpu_index",
    "mig": "hw_gpu_mig",  # "true" on a MIG instance
    "host": "host_name",
    "engine": "engine",
    "model": "model",
    "cluster": "cluster",
    "instance": "instance",
    "job": "job",
    "severity": "severity",
    "signal": "signal",
    "fuse_action": "fuse_action",
    "fuse_level": "fuse_level",
    "metric": "metric",
    # On every alert fusebox generates, valued with the spec's metadata.name: Alertmanager routes
    # match it (never severity alone), so other teams' alerts never reach the fuse.
    "marker": "fusebox",
}

# Labels the scraper adds to every series of a target, which name who sent a series, not what it
# measures: Prometheus adds `instance` and `job` to every target; the Prometheus Operator's
# PodMonitor / ServiceMonitor relabelling adds `namespace`, `pod`, `container` and `endpoint`
# (and `service` for a ServiceMonitor) -- kube-prometheus-stack's default for every monitor. A
# GPU-level record drops them all (`max without (...)`), so a GPU's alert keeps its identity
# {cluster, host_name, hw_id, ...} across a collector rollout (new pod name) or a second exporter.
# Engine/pod-level signals keep them where their `by` names them.
TARGET_LABELS = ("instance", "job", "namespace", "pod", "container", "endpoint", "service")

# Labels that name the blast radius of a fuse, most specific last. The fuse service keys
# its breaker on the subset present in an alert.
SCOPE_LABELS = ("cluster", "host_name", "instance", "hw_id", "engine")

ABSENT_ALERT = "FuseboxSignalAbsent"
# A GPU the collector lost (NVML error, Xid): its memory series stop, so the memory alert goes
# quiet on it; this alert says so instead.
GPU_DOWN_ALERT = "FuseboxGPUDown"
# Always firing (as kube-prometheus' Watchdog), routed to the fuse receiver, never trips a fuse: the
# fuse records when each Alertmanager last delivered, and a rule pages when that feed falls silent.
HEARTBEAT_ALERT = "FuseboxHeartbeat"
# fusebox watching its own path (fuse.self_monitoring; docs/self-monitoring.md): routed to the
# people, never to the fuse -- but the heartbeat, which goes to the fuse only.
SELF_ALERTS = {
    "fuse_down": "FuseboxFuseDown",  # a fuse replica down, or no replica scraped at all
    "actions_failing": "FuseboxFuseActionsFailing",  # gateway calls given up
    "actions_stuck": "FuseboxFuseActionsStuck",  # the oldest pending gateway call past the spec's bound
    "level_unapplied": "FuseboxFuseLevelUnapplied",  # a tripped level no adapter applied, past the same bound
    "notifications_failing": "FuseboxFuseNotificationsFailing",  # Alertmanager failing to deliver webhooks
    "heartbeat_missing": "FuseboxFuseHeartbeatMissing",  # no notification reached the fuse for too long
    "token_file_refused": "FuseboxFuseTokenFileRefused",  # a token file malformed: its tokens dropped (fail closed)
    "audit_full": "FuseboxFuseAuditFull",  # the refused-alert audit at fuse.audit.refused_max_rows: refusals no longer audited
    "collector_scrape": "FuseboxCollectorScrapeFailing",  # collectors failing to scrape their engines
    "collector_gpu": "FuseboxCollectorGPUErrors",  # the GPU collector failing to read GPUs
}
# fusebox's own alerts: no signal of the spec may take these names.
RESERVED_ALERTS = (ABSENT_ALERT, GPU_DOWN_ALERT, HEARTBEAT_ALERT, *SELF_ALERTS.values())
# Label of fusebox_fuse_last_notification_timestamp_seconds: the externalURL of the Alertmanager
# that sent the notification (the webhook payload's externalURL).
ALERTMANAGER_LABEL = "alertmanager"
# Alertmanager's own counter of notifications it gave up delivering, per integration
# (notify/notify.go; Alertmanager 0.25 labels it by `integration` only).
AM_NOTIFICATIONS_FAILED = "alertmanager_notifications_failed_total"

# The fuse service's own metrics (GET /metrics on `fusebox fuse serve`).
FUSE_METRICS = {
    "level": "fusebox_fuse_level",  # gauge, highest tripped level per scope (SCOPE_LABELS), 0 none; capped, most severe first
    "scopes": "fusebox_fuse_scopes",  # gauge {level}: scopes held by highest tripped level (every scope)
    "level_series_dropped": "fusebox_fuse_level_series_dropped",  # gauge: scopes over the level series cap
    "unapplied_levels": "fusebox_fuse_unapplied_levels",  # gauge: tripped levels no adapter applied (yet)
    "transitions": "fusebox_fuse_transitions_total",  # counter {action, state, source}
    "notifications": "fusebox_fuse_notifications_total",  # counter {outcome}
    "alerts": "fusebox_fuse_alerts_total",  # counter {result}: per alert of a notification (result "heartbeat" for FuseboxHeartbeat)
    # counter: alerts Alertmanager left out of notifications (the payload's truncatedAlerts, past
    # the webhook's max_alerts); they neither trip nor release anything
    "truncated_alerts": "fusebox_fuse_truncated_alerts_total",
    "action_failures": "fusebox_fuse_action_failures_total",  # counter {adapter}: failed attempts
    "actions_given_up": "fusebox_fuse_actions_given_up_total",  # counter {adapter, reason}: audited as failed
    "oldest_pending_age": "fusebox_fuse_oldest_pending_action_age_seconds",  # gauge: 0 when none pending
    "dispatcher_errors": "fusebox_fuse_dispatcher_errors_total",  # counter {adapter}: loop iterations that raised
    # counter {adapter}: results of a call not recorded because the claim had passed to another
    # replica meanwhile (its fencing token moved on; that replica's result counts)
    "stale_results": "fusebox_fuse_stale_results_total",
    # counter {adapter}: trips queued again because the target's own state differed (the reconciler)
    "reconciliations": "fusebox_fuse_reconciliations_total",
    "actions_pending": "fusebox_fuse_actions_pending",  # gauge
    "decision_latency": "fusebox_fuse_decision_latency_seconds",  # histogram: request -> applied
    "request_latency": "fusebox_fuse_webhook_duration_seconds",  # histogram: webhook handling
    "last_notification": "fusebox_fuse_last_notification_timestamp_seconds",  # gauge {alertmanager}: externalURL of the sender
    "dry_run": "fusebox_fuse_dry_run",  # gauge: 1 when the service calls nothing (--dry-run)
    "auth_failures": "fusebox_fuse_auth_failures_total",  # counter {role}: requests with no or a wrong token
    "auth_rate_limited": "fusebox_fuse_auth_rate_limited_total",  # counter {role}: answered 429 (too many failures)
    # counter {reason}: connections the server closed or refused itself (header_timeout, request_timeout,
    # evicted, over_capacity, head_too_large, write_timeout, slow_reader)
    "connections_closed": "fusebox_fuse_connections_closed_total",
    # counter {adapter}: calls a gateway answered 401/403: it refused the control-plane credential
    # (or wanted one and none is configured); retried with backoff, never claimed applied
    "credential_refusals": "fusebox_fuse_gateway_credential_refusals_total",
    # per adapter (its label: the spec's fuse.adapters name, ``gateway``, ``vllm:<engine>``)
    "adapter_calls": "fusebox_fuse_adapter_calls_total",  # counter {adapter, outcome}: outcome ok|error
    "adapter_call_duration": "fusebox_fuse_adapter_call_duration_seconds",  # histogram {adapter}: one apply()
    # per token file (label file: webhook, people, read): 1 in force as written, 0 refused (malformed
    # or unreadable: a people or read file's tokens dropped, the webhook's last good token kept)
    "token_file_valid": "fusebox_fuse_token_file_valid",
    "token_file_refused": "fusebox_fuse_token_file_refused_total",  # counter {file}: reads that refused it
    # counter {reason}: refused alerts not audited: "rate" (over fuse.audit.refused_per_minute),
    # "full" (the audit holds fuse.audit.refused_max_rows of them)
    "audit_refused_dropped": "fusebox_fuse_audit_refused_dropped_total",
}

# Names of the Kubernetes objects fusebox generates (k8s/), shared by the manifests that create
# them and the ones that refer to them (the AlertmanagerConfig's webhook URL and token Secret).
K8S: dict[str, Any] = {  # str names, and the port (int)
    "fuse": "fusebox-fuse",  # Deployment, Service, PodDisruptionBudget, ServiceMonitor of the fuse service
    "fuse_port": 9095,  # the fuse service's HTTP port (webhook, /metrics)
    "fuse_webhook_path": "/alertmanager",
    "token_secret": "fusebox-fuse-token",  # Secret holding the webhook bearer token (created by the user)
    "token_key": "token",
    # where the fuse Deployment mounts kubernetes.fuse.gateway_secret (the gateways' control-plane
    # key, created by the user); fuse.adapters.<name>.credentials_file names <this folder>/<key>
    "gateway_key_dir": "/var/run/secrets/fusebox-gateway",
    # Secret holding the secrets of fuse.human_receiver's configs for the AlertmanagerConfig (created by
    # the user; keys <type>-<index>-<field>, e.g. pagerduty-0-routing-key: generator/am_operator.py)
    "human_secret": "fusebox-human-receiver",
    "collectors": "fusebox-collectors",  # DaemonSet and PodMonitor of the collectors
    "engines": "fusebox-engines",  # PodMonitor of the engine pods (kubernetes.engines)
    "spec_configmap": "fusebox-spec",  # ConfigMap holding the spec the fuse service reads (key fusebox.yaml)
    "fuse_state": "fusebox-fuse-state",  # PersistentVolumeClaim of the fuse service's state directory
    # ConfigMap (key engines.yaml) the discovering collectors (kv, latency) read: kubernetes.engines resolved
    "engines_configmap": "fusebox-engines",
    # ServiceAccount, ClusterRole/Role and binding of the collectors (get, list, watch pods: engine discovery)
    "collectors_account": "fusebox-collectors",
}
# Every generated Kubernetes object carries this label (besides the spec's kubernetes.labels).
K8S_PART_OF = ("app.kubernetes.io/part-of", "fusebox")
# The image's non-root user (Dockerfile: useradd --uid); the manifests' runAsUser.
IMAGE_UID = 10001
# The image the manifests run by default (docker-compose.yml builds it; push it to your registry
# and set kubernetes.image); its tag is fusebox's version (a test keeps them equal).
IMAGE = ("fusebox", "0.1.0")
# Environment variables the collectors read as defaults (the DaemonSet sets them from the downward API).
ENV = {
    "host_name": "FUSEBOX_HOST_NAME",  # --host-name: the node name
    "metrics_addr": "FUSEBOX_METRICS_ADDR",  # --metrics-addr: the pod IP
    "cluster": "FUSEBOX_CLUSTER",  # --cluster
}

GENERATED_HEADER = "Code generated by fusebox from {spec}. DO NOT EDIT."

# The fuse service's own metrics (fusebox fuse serve, /metrics): the current level per scope,
# a gauge 0 (closed) .. the highest level of the spec's fuse.actions, with the SCOPE_LABELS present in the alert it acted on.
FUSE_LEVEL_METRIC = FUSE_METRICS["level"]
# Prometheus' synthetic alert series (one per pending/firing alert, labels of the alert).
ALERTS_METRIC = "ALERTS"


# --- scaling (the spec's `scaling:` section; generator/render_scaling.py, docs/scaling.md) ------------
# A workload's load against its set points, summed over its replicas: for each driving signal the sum
# over the workload's series of value / safe level (SCALING_SIGNAL_LOAD, label `signal`), then the
# highest of them (SCALING_LOAD). KEDA and the HPA target an average of 1 per replica, so the
# replica count they want is ceil(load): every replica back at or under its safe level.
SCALING_LOAD = "fusebox:scaling_load:ratio"
SCALING_SIGNAL_LOAD = "fusebox:scaling_signal_load:ratio"
SCALING_LABELS = {"workload": "workload", "signal": "signal"}
SCALING_GROUP = "fusebox-scaling"
# A policy whose controller chose the budget-capped point for 5 minutes (COSTQOS_METRICS["qos_unmet"]).
COSTQOS_ALERT = "CostQoSBudgetCannotMeetQoS"


# --- recording rules ------------------------------------------------------------------
def record_name(level: str, metric: str, ops: str) -> str:
    """``level:metric:operations`` (e.g. ``gpu:fusebox_gpu_memory_utilization:ratio``)."""
    return f"{level}:{metric}:{ops}"


# The SGLang Model Gateway's admission counter (smg 1.13 and sglang-router 0.3.2 alike, read from
# their /metrics): one series per result, "allowed" and "rejected" (429 by the concurrency bound,
# the rate limit or a full queue). A tier with after_shedding reads it (docs/inpath.md).
GATEWAY_ADMISSIONS = "smg_http_rate_limit_total"
GATEWAY_REJECTED = {"result": "rejected"}
# Its shedding series beside the admission counter (read from both versions' /metrics, docs/metrics.md
# section 6): requests shed because every worker of the model is overloaded, by stage (selection,
# dispatch, pd_admission; smg 1.13 only), and each worker's circuit breaker state (a gauge per
# worker URL: 0 closed, 1 open, 2 half open in smg 1.13's HELP; open reads 1 in sglang-router 0.3.2 too).
GATEWAY_OVERLOAD_SHED = "smg_worker_overload_shed_total"
GATEWAY_BREAKER_STATE = "smg_worker_cb_state"
GATEWAY_BREAKER_OPEN = 1
GATEWAY_PREFIX = "smg_"  # every series of the gateway's /metrics, both versions

# Window of the rates the dashboard records take (engine token and prefix-cache counters).
DASHBOARD_RATE_WINDOW_S = 300.0


# --- collectors: attribute keys, self-metrics, service names ---------------------------------
# OTel attribute keys the collectors set; after translation they are the LABEL values above
# (``hw.id`` -> ``hw_id``, ``hw.gpu.index`` -> ``hw_gpu_index``, ``host.name`` -> ``host_name``).
ATTR = {
    "gpu_id": "hw.id",  # GPU UUID or MIG UUID
    "gpu_index": "hw.gpu.index",
    "mig": "hw.gpu.mig",  # "true" on MIG instances
    "gpu_name": "hw.name",
    "gpu_parent": "hw.parent",  # the physical GPU's UUID, on MIG instances
    "gpu_task": "hw.gpu.task",
    "io_direction": "network.io.direction",
    "engine": "engine",
    "model": "model",
    "endpoint": "endpoint",
    "reason": "reason",
    "host": "host.name",
    "cluster": "cluster",
    "service": "service.name",
    "instance_id": "service.instance.id",  # the Collector's prometheus exporter makes it `instance`
    "alignment_source": ALIGNMENT_SOURCE_LABEL,  # handoff | encoder | ttft, on the alignment histogram
    "pcie_root_complex": "pcie.root_complex",  # the host bridge in sysfs, pci<domain>:<bus> (pci0000:17)
    "pcie_port": "pcie.port",  # the downstream port (root port, switch port) at the top of a shared link, its BDF
    "numa_node": "numa.node",  # the root port's NUMA node as sysfs gives it (-1: the platform gives none)
    # the connections collector's (semantic conventions: service.peer.name replaces peer.service;
    # network.peer.address is the peer's IP, or "other" past connections.max_peers)
    "peer_service": "service.peer.name",
    "peer_address": "network.peer.address",
}

# Collector self-metrics (health of the collectors themselves; no rule reads them).
OTEL_SELF = {
    "export_dropped": ("fusebox.collector.export.dropped", "{batch}", "counter"),
    "scrape_errors": ("fusebox.collector.scrape.errors", "{error}", "counter"),
    # engine /metrics scrapes refused at a limit: reason body_too_large, decompressed_too_large, deadline
    "scrape_refused": ("fusebox.collector.scrape.refused", "{scrape}", "counter"),
    # sample lines of an engine's /metrics dropped before parsing: reason label_too_long (a label
    # set over --max-label-chars), series_limit (past --max-series); the rest of the scrape is used
    "scrape_dropped": ("fusebox.collector.scrape.dropped", "{series}", "counter"),
    # KV collector rounds whose output is incomplete, per engine and reason: no_gpu (no --gpu, so
    # no hw_id and the GPU-memory signal cannot subtract the free KV pool), no_capacity (the
    # engine's /metrics gives no pool size, so no bytes at all, or usage without a limit),
    # model_config (vLLM: --model-config makes a pool the GPU cannot hold, so the bytes are too large),
    # unknown_model (engine discovery: the engine serves a model the engines file does not name, so no bytes)
    "kv_incomplete": ("fusebox.collector.kv.incomplete", "{round}", "counter"),
    # engine discovery (collect kv|latency --discover): rounds in which a pod that matches the engines
    # file was not scraped, per engine (namespace/pod) and reason: no_pod_ip (Pending or Running
    # without an IP yet), no_port (no container port of that name), over_cap (past --max-engines)
    "discovery_skipped": ("fusebox.collector.discovery.skipped", "{round}", "counter"),
    # engine discovery's own sources failing, per endpoint and reason: the kubelet's pod-resources
    # socket (unix://...: absent, unavailable, deadline, rpc_error) and the Kubernetes API
    # (endpoint kubernetes: list_error, watch_error, expired)
    "discovery_errors": ("fusebox.collector.discovery.errors", "{error}", "counter"),
    # GPU collection rounds that failed for a device, per hw.id, hw.gpu.index and reason: the NVML
    # error's name in snake case (NVML_ERROR_GPU_IS_LOST -> gpu_is_lost), "unexpected" for others
    "gpu_errors": ("fusebox.collector.gpu.errors", "{error}", "counter"),
    # GPUs whose PCIe topology was not followed (collectors/pcie.py), per hw.id and reason: no_bus_id,
    # not_in_sysfs, over_cap, too_deep, deadline, unreadable, no_upstream_link; counted once at start
    "pcie_skipped": ("fusebox.collector.pcie.skipped", "{gpu}", "counter"),
    # the connections collector (collect conns): connections matching the spec left out per round, by
    # reason (over_cap: past connections.max_connections), and netlink dumps that failed, by reason
    # (deadline: the dump ran past its deadline; netlink: the kernel refused or the socket failed)
    "conns_skipped": ("fusebox.collector.conns.skipped", "{connection}", "counter"),
    "conns_errors": ("fusebox.collector.conns.errors", "{error}", "counter"),
}
PROM_SELF = {key: otel_to_prometheus(*v) for key, v in OTEL_SELF.items()}

# service.name of each collector process (the Collector's prometheus exporter maps it to job).
SERVICE = {
    "gpu": "fusebox-gpu-collector",
    "kv": "fusebox-kv-collector",
    "latency": "fusebox-latency",
    "scenario": "fusebox-scenario",
    "conns": "fusebox-conns-collector",
}


# The overview dashboard's name (dashboards/fusebox-overview.json); alerts and the fuse's status
# page link to it when the spec sets global.dashboard_base_url.
OVERVIEW_DASHBOARD = "overview"


def dashboard_uid(spec_name: str, name: str) -> str:
    """Stable Grafana UID from the spec name and dashboard name (<= 40 chars, [a-z0-9-]); the
    dashboard's URL is ``<grafana>/d/<uid>``."""
    slug = re.sub(r"[^a-z0-9]+", "-", f"fusebox-{spec_name}-{name}".lower()).strip("-")
    if len(slug) <= 40:
        return slug
    digest = hashlib.sha1(slug.encode()).hexdigest()[:8]
    return f"{slug[:31].rstrip('-')}-{digest}"

# The environment variable `fusebox fuse serve` reads its --store URL from when no --store,
# --state or --state-dir is given (the generated Deployment sets it from a Secret, so that the
# PostgreSQL password is not in the pod's args).
FUSE_STORE_ENV = "FUSEBOX_FUSE_STORE"
# `fusebox fuse serve --timeout`: a gateway or vLLM call's total deadline, seconds, when no spec adapter
# names its own; `fusebox budget` counts it in every fuse's reaction time (docs/budget.md).
FUSE_CALL_TIMEOUT_S = 5.0

# --- the COST-QoS controller (`fusebox costqos run`, docs/costqos.md) ------------------------
# Its CRD (fusebox/data/costqos-crd.yaml): group, version, kind, plural.
COSTQOS_CRD = ("fusebox.dev", "v1alpha1", "CostQoSScalingPolicy", "costqosscalingpolicies")
# What it publishes on its /metrics, labels {namespace, policy}: the replica count it chose (KEDA's
# second trigger and the HPA's external metric read it), 1 when no frontier point within the budget
# meets the QoS (alert CostQoSBudgetCannotMeetQoS), and how long one policy's round takes (histogram,
# seconds: the three range queries, the frontier, the choice; the status write is kopf's, after it).
COSTQOS_METRICS = {
    "desired_replicas": "fusebox_costqos_desired_replicas",
    "qos_unmet": "fusebox_costqos_qos_unmet",
    "reconcile_duration": "fusebox_costqos_reconcile_duration_seconds",
    # the frontier and choice alone (CPU-bound part of a round), histogram, seconds
    "frontier_duration": "fusebox_costqos_frontier_duration_seconds",
    # rounds whose metrics could not be read, by reason (counter)
    "metrics_errors": "fusebox_costqos_metrics_errors_total",
}
COSTQOS_LABELS = ("namespace", "policy")
