"""Who watches the fuse: the ``fusebox-self`` rule group, its promtool tests and its runbooks' facts.

Everything about fusebox watching its own path lives here (as one kind lives in one file); the
rule, test and runbook renderers ask this module. From ``fuse.self_monitoring`` of the spec:

* ``FuseboxFuseDown``: a replica of the fuse's scrape job is down (``up == 0``), or the job has
  no ``up`` series at all (``absent``), for ``down_for``;
* ``FuseboxFuseActionsFailing``: ``fusebox_fuse_actions_given_up_total`` rose (a gateway call
  audited as failed and not retried);
* ``FuseboxFuseActionsStuck``: ``fusebox_fuse_oldest_pending_action_age_seconds`` above
  ``max_pending_action_age``;
* ``FuseboxFuseLevelUnapplied``: ``fusebox_fuse_unapplied_levels`` above 0 for
  ``max_pending_action_age``: a tripped level that no adapter applied (scope not mapped, no
  adapter for that level, the call given up, or still retrying);
* ``FuseboxFuseNotificationsFailing``: ``alertmanager_notifications_failed_total{integration="webhook"}``
  rose (Alertmanager gave up delivering a webhook notification, after its retries);
* ``FuseboxHeartbeat``: ``vector(1)``, always firing, routed to the fuse receiver only (as
  kube-prometheus' Watchdog); the fuse records ``fusebox_fuse_last_notification_timestamp_seconds``
  per Alertmanager and trips nothing on it;
* ``FuseboxFuseHeartbeatMissing``: no notification from an Alertmanager for
  ``heartbeat_silent_after``, or the gauge absent that long;
* ``FuseboxFuseTokenFileRefused``: ``fusebox_fuse_token_file_valid == 0``: a token file refused
  (malformed or unreadable), its tokens revoked (the webhook's last good one kept);
* ``FuseboxFuseAuditFull``: refused alerts dropped because the audit holds ``fuse.audit.refused_max_rows``;
* ``FuseboxCollectorScrapeFailing`` / ``FuseboxCollectorGPUErrors``: the collectors' own error
  counters rose (engine /metrics scrapes failed or refused at a limit; NVML errors per GPU).

Every rule carries the marker label, none ``fuse_action``: Alertmanager routes them to the
people (render_alertmanager), and the fuse's trust rules never act on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fusebox import conventions as C
from fusebox.signal_kinds.base import label_str, segments
from fusebox.spec import Spec
from fusebox.spec.units import format_duration, format_number

__all__ = ["SelfAlert", "self_alerts", "self_rules", "self_tests", "heartbeat_labels", "self_labels",
           "increase_window_s", "runbook_facts", "GROUP"]

GROUP = "fusebox-self"
M = C.FUSE_METRICS
A = C.SELF_ALERTS
# The fuse replica and the Alertmanager the tests feed (any names would do: they are only carried).
_FUSE_INSTANCE = "fuse-0:9095"
_AM = {"instance": "alertmanager-0:9093", "job": "alertmanager"}
_AM_URLS = ("http://alertmanager-0:9093", "http://alertmanager-1:9093")


@dataclass(frozen=True)
class SelfAlert:
    """One self-monitoring alert: its name, severity and what a runbook says of it."""

    name: str
    severity: str
    summary: str
    description: str
    means: str  # one line for the docs and the runbook: what it means when it fires


def _matchers(labels: dict[str, str]) -> str:
    # Prometheus' string escaping: backslash first, then the quote.
    return ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(labels.items()))


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _sel(metric: str, labels: dict[str, str]) -> str:
    inner = _matchers(labels)
    return f"{metric}{{{inner}}}" if inner else metric


def _collector_labels(spec: Spec) -> dict[str, str]:
    return dict(spec.selector)  # the collectors' series come through the same Collector as the signals'


def _am_labels(spec: Spec) -> dict[str, str]:
    return {"integration": "webhook", **spec.self_monitoring.alertmanager_selector}


def increase_window_s(spec: Spec) -> float:
    """Window of the ``increase()`` over the error counters: 5 min, and at least four scrapes
    (a counter's increase needs two samples in the window)."""
    return max(300.0, 4 * spec.scrape_interval_s)


# Label values the whole-feed branches set, so that no annotation names an empty label.
NO_TARGET = "no target"
ANY_AM = "any"


def self_alerts(spec: Spec) -> list[SelfAlert]:
    """The self-monitoring alerts, in rule order (none when ``fuse.self_monitoring.enabled`` is false)."""
    m = spec.self_monitoring
    if not m.enabled:
        return []
    job = ", ".join(f"{k}={v}" for k, v in sorted(m.fuse_selector.items()))
    w = format_duration(increase_window_s(spec))
    return [
        SelfAlert(A["fuse_down"], "critical",
                  "The fuse service is down or not scraped: instance {{ $labels.instance }}",
                  f"Prometheus has not scraped the fuse service ({job}), instance {{{{ $labels.instance }}}} "
                  f"(\"{NO_TARGET}\": the job has no target at all), for "
                  f"{format_duration(m.down_for_s)} (up 0, or no target at all). While no replica answers, "
                  "Alertmanager's notifications to the fuse fail and no fuse trips or releases.",
                  "a fuse replica is down (up == 0), or the fuse's scrape job has no target at all"),
        SelfAlert(A["actions_failing"], "critical",
                  "The fuse gave up a call to {{ $labels.adapter }} ({{ $labels.reason }})",
                  f"The fuse service {{{{ $labels.instance }}}} audited a call to {{{{ $labels.adapter }}}} as failed "
                  f"and will not retry it ({{{{ $labels.reason }}}}) within the last {w}: a decision of the fuse "
                  "was not applied at the gateway.",
                  "a gateway (or engine) call was given up: a trip or release the fuse decided did not happen"),
        SelfAlert(A["actions_stuck"], "critical",
                  "A fuse action has been pending for over " + format_duration(m.max_pending_action_age_s),
                  f"The oldest pending action of the fuse service {{{{ $labels.instance }}}} was decided over "
                  f"{format_duration(m.max_pending_action_age_s)} ago and is still not applied (the gateway "
                  "answers slowly or with retryable errors).",
                  "a decided trip or release has waited too long for the gateway"),
        SelfAlert(A["level_unapplied"], "critical",
                  "A tripped fuse level has not been applied by any adapter",
                  f"The fuse service {{{{ $labels.instance }}}} has tripped level(s) that no adapter "
                  f"applied for over {format_duration(m.max_pending_action_age_s)}: the fuse decided, but nothing "
                  "happened at the gateway (scope not mapped, no adapter applies that level, the call refused or "
                  "given up). Its status page says why for each.",
                  "a tripped level has stayed unapplied: the fuse decided, the gateway did nothing"),
        SelfAlert(A["notifications_failing"], "critical",
                  "Alertmanager {{ $labels.instance }} fails to deliver webhook notifications",
                  f"Alertmanager {{{{ $labels.instance }}}} gave up delivering webhook notifications (after its "
                  f"retries) within the last {w}. If they were the fuse's ({spec.receiver}), alerts that "
                  "request a fuse do not reach it.",
                  f"Alertmanager gave up delivering a webhook notification (the fuse's receiver {spec.receiver})"),
        SelfAlert(C.HEARTBEAT_ALERT, "none",
                  "Always firing: proves the path from Prometheus through Alertmanager to the fuse",
                  f"Always firing; routed to the fuse receiver ({spec.receiver}) only, every "
                  f"{format_duration(m.heartbeat_interval_s)}. The fuse records when each Alertmanager last "
                  f"delivered; {A['heartbeat_missing']} pages when that stops. It never trips a fuse.",
                  "always firing; goes to the fuse, never to people; trips nothing"),
        SelfAlert(A["heartbeat_missing"], "critical",
                  "No notification has reached the fuse for " + format_duration(m.heartbeat_silent_after_s),
                  f"The fuse service has had no notification for {format_duration(m.heartbeat_silent_after_s)} from "
                  f"Alertmanager {{{{ $labels.alertmanager }}}} (\"{ANY_AM}\": from no Alertmanager at all), "
                  f"though {C.HEARTBEAT_ALERT} is always firing: the feed from "
                  "Alertmanager to the fuse is broken.",
                  "the feed from Prometheus through Alertmanager to the fuse has fallen silent"),
        SelfAlert(A["token_file_refused"], "warning",
                  "The fuse refused its {{ $labels.file }} token file: instance {{ $labels.instance }}",
                  "The fuse service {{ $labels.instance }} refused its {{ $labels.file }} token file (malformed or "
                  "unreadable; its log names the line). A people or read file's tokens are all revoked until it is "
                  "fixed (fail closed: no one may override, or no read token reads); the webhook file's last good "
                  "token stays in use.",
                  "a token file is malformed or unreadable: its tokens are revoked (the webhook's last good one kept)"),
        SelfAlert(A["audit_full"], "warning",
                  "The fuse's refused-alert audit is full: instance {{ $labels.instance }}",
                  f"The fuse service {{{{ $labels.instance }}}} no longer audits refused alerts: the audit holds "
                  f"fuse.audit.refused_max_rows ({spec.audit.refused_max_rows:,}) of them, and refusals within the "
                  f"last {w} were only counted. A sender floods the fuse with alerts it refuses, or the audit is "
                  "never pruned.",
                  "the refused-alert audit reached its row bound: refusals are counted, no longer audited"),
        SelfAlert(A["collector_scrape"], "warning",
                  "The collector {{ $labels.job }} fails to scrape engine {{ $labels.engine }}",
                  f"The collector {{{{ $labels.job }}}} on {{{{ $labels.host_name }}}} failed or refused to scrape "
                  f"engine {{{{ $labels.engine }}}} within the last {w}: the engine's signals may be stale or absent.",
                  "a collector fails to read an engine's /metrics (errors, or refused at a size or time limit)"),
        SelfAlert(A["collector_gpu"], "warning",
                  "The GPU collector fails to read GPU {{ $labels.hw_id }} ({{ $labels.reason }})",
                  f"NVML calls for GPU {{{{ $labels.hw_id }}}} on {{{{ $labels.host_name }}}} failed "
                  f"({{{{ $labels.reason }}}}) within the last {w}: its memory series are missing or stale.",
                  "the GPU collector's NVML calls fail for a GPU"),
    ][:None if spec.fusebox_collectors else -2]  # the collectors' alerts only where they run


# FuseboxFuseHeartbeatMissing's three rules, told apart by this label (promtool refuses two rules
# with equal labels): the whole feed stale, never seen since the fuse started, one Alertmanager stale.
HEARTBEAT_RULE_LABEL = ("heartbeat", ("stale", "absent", "stale_alertmanager"))


def self_labels(spec: Spec, alert: SelfAlert, rule: int = 0) -> dict[str, str]:
    """The marker (``global.labels`` too) and severity; never ``fuse_action``. ``rule``: which of
    the alert's rules (FuseboxFuseHeartbeatMissing's are told apart by ``heartbeat``; the one about a
    single Alertmanager is a warning: in an Alertmanager cluster one peer sends each notification,
    and which one can change while the feed as a whole is alive)."""
    labels = {**spec.labels, C.LABEL["marker"]: spec.name, C.LABEL["severity"]: alert.severity}
    if alert.name == A["heartbeat_missing"]:
        labels[HEARTBEAT_RULE_LABEL[0]] = HEARTBEAT_RULE_LABEL[1][rule]
        if rule == 2:
            labels[C.LABEL["severity"]] = "warning"
    return labels


def heartbeat_labels(spec: Spec) -> dict[str, str]:
    """Labels of the heartbeat alert (the route tests and the fuse's tests send these)."""
    hb = next(a for a in self_alerts(spec) if a.name == C.HEARTBEAT_ALERT)
    return self_labels(spec, hb)


def _annotations(spec: Spec, alert: SelfAlert) -> dict[str, str]:
    return {"summary": alert.summary, "description": alert.description, "runbook_url": spec.runbook_url(alert.name)}


def _exprs(spec: Spec) -> dict[str, list[tuple[str, float]]]:
    """alert name -> [(expr, for seconds)]: one rule each."""
    m = spec.self_monitoring
    f = m.fuse_selector
    w = format_duration(increase_window_s(spec))
    coll = _collector_labels(spec)
    last = _sel(M["last_notification"], f)
    return {
        # == 0: a replica scraped and down; absent: no replica is even a target (a wrong job name,
        # a ServiceMonitor the operator never picked up). absent() carries the selector's labels.
        # The absent branch names its instance "no target", so no annotation shows an empty label.
        A["fuse_down"]: [(f"{_sel('up', f)} == 0 or label_replace(absent({_sel('up', f)}), \"{C.LABEL['instance']}\", "
                          f"\"{NO_TARGET}\", \"\", \"\")", m.down_for_s)],
        A["actions_failing"]: [(f"increase({_sel(M['actions_given_up'], f)}[{w}]) > 0", 0.0)],
        A["actions_stuck"]: [(f"{_sel(M['oldest_pending_age'], f)} > {format_number(m.max_pending_action_age_s)}", 0.0)],
        A["level_unapplied"]: [(f"{_sel(M['unapplied_levels'], f)} > 0", m.max_pending_action_age_s)],
        # Alertmanager counts a notification failed once its retries are spent (0.25 labels it by
        # integration only: any webhook receiver's failure counts; alertmanager_selector narrows it).
        A["notifications_failing"]: [(f"increase({_sel(C.AM_NOTIFICATIONS_FAILED, _am_labels(spec))}[{w}]) > 0", 0.0)],
        C.HEARTBEAT_ALERT: [("vector(1)", 0.0)],
        # max: the feed is alive if any replica heard from any Alertmanager (critical); absent, with a
        # `for` (a fuse that just started has heard nothing yet): it never heard from one; max by
        # alertmanager: one Alertmanager fell silent (a warning, inhibited while the critical fires).
        A["heartbeat_missing"]: [
            (f"label_replace(time() - max({last}) > {format_number(m.heartbeat_silent_after_s)}, "
             f"\"{C.ALERTMANAGER_LABEL}\", \"{ANY_AM}\", \"\", \"\")", 0.0),
            (f"label_replace(absent({last}), \"{C.ALERTMANAGER_LABEL}\", \"{ANY_AM}\", \"\", \"\")", m.heartbeat_silent_after_s),
            (f"time() - max by ({C.ALERTMANAGER_LABEL}) ({last}) > {format_number(m.heartbeat_silent_after_s)}", 0.0)],
        A["token_file_refused"]: [(f"{_sel(M['token_file_valid'], f)} == 0", 0.0)],
        A["audit_full"]: [(f"increase({_sel(M['audit_refused_dropped'], {**f, 'reason': 'full'})}[{w}]) > 0", 0.0)],
        # `or` keeps both: the refused series carry a `reason` label the errors do not
        A["collector_scrape"]: [(f"increase({_sel(C.PROM_SELF['scrape_errors'], coll)}[{w}]) > 0 "
                                 f"or increase({_sel(C.PROM_SELF['scrape_refused'], coll)}[{w}]) > 0", 0.0)],
        A["collector_gpu"]: [(f"increase({_sel(C.PROM_SELF['gpu_errors'], coll)}[{w}]) > 0", 0.0)],
    }


def self_rules(spec: Spec) -> list[dict[str, Any]]:
    """The ``fusebox-self`` group's rules (empty when self-monitoring is off)."""
    exprs = _exprs(spec)
    out = []
    for a in self_alerts(spec):
        for i, (expr, for_s) in enumerate(exprs[a.name]):
            rule: dict[str, Any] = {"alert": a.name, "expr": expr}
            if for_s:
                rule["for"] = format_duration(for_s)
            rule["labels"] = self_labels(spec, a, i)
            rule["annotations"] = _annotations(spec, a)
            out.append(rule)
    return out


# ---------------------------------------------------------------------------------- runbooks
_RUNBOOK: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # alert -> (diagnosis, SOP)
    A["fuse_down"]: (
        ("Which replicas: `up{JOB}`; no series at all means no target: check the scrape job's name "
         "(`fuse.self_monitoring.fuse_selector`) against Prometheus' targets page, and that the ServiceMonitor was picked up.",
         "The fuse's log, and `GET /healthz` on its port (9095).",
         "Alertmanager's log shows the webhook failing (`Notify for alerts failed`)."),
        ("Restart the fuse service (`fusebox fuse serve`; in Kubernetes the Deployment restarts it). Its state "
         "(breaker, outbox, audit) is in the store and is restored at start.",
         "While it is down, watch the GPU and engine alerts yourself: no fuse trips or releases until it is back.")),
    A["actions_failing"]: (
        ("The audit on the fuse's status page (`GET /`) names the call, the adapter and the gateway's answer.",
         "`fusebox_fuse_action_failures_total` by adapter: a burst of retryable errors before the give-up?",
         "Is the gateway reachable from the fuse, with the credentials the fuse is given?"),
        ("Apply the decision by hand at the gateway, or `POST /override` the scope again once the gateway answers.",
         "Fix the gateway (or the adapter's configuration) before the next incident.")),
    A["actions_stuck"]: (
        ("`fusebox_fuse_actions_pending` and `fusebox_fuse_action_failures_total` by adapter: the gateway is failing "
         "with retryable errors (5xx, 408, 429) or not answering.",
         "The fuse's log names each retry and its error."),
        ("Bring the gateway back; the fuse retries with backoff and applies the pending calls in order.",
         "If the call is no longer wanted, release or trip the scope by hand (`POST /override`).")),
    A["level_unapplied"]: (
        ("The fuse's status page (`GET /`) or `GET /state`: each tripped level says `applied` and, when false, "
         "`not_applied` (adapter and why: `retrying: ...` while an adapter is still retrying) and `pending` (still retrying).",
         "`scope not mapped`: no static target matches the scope and no `discover` resolves it (a GPU scope or an "
         "engine scope `namespace/pod` needs `discover` on the gateway adapter, with kube-state-metrics in Prometheus "
         "and, for a GPU, dcgm-exporter's pod mapping).",
         "`no adapter applies level N`: no adapter of `fuse.adapters` lists that level's action (see `fusebox generate`'s warnings).",
         "`retrying: gateway refused the control-plane credential (HTTP 401/403)` "
         f"(`{M['credential_refusals']}`): the key in the adapter's `credentials_file` (the Secret of "
         "`kubernetes.fuse.gateway_secret`) is not one of the gateway's `--control-plane-api-keys`, or not of role `admin`."),
        ("Apply the level by hand at the gateway (take the workers out), then fix the spec's adapters.",
         "A refused key: put the gateway's admin key into the Secret; the fuse reads the file again and applies the "
         "pending trip at its next retry, without a restart.",
         "A GPU not attributed to any pod, or no GPU with pod labels: check dcgm-exporter's Kubernetes pod mapping "
         "(its `pod` label, `exported_pod` where the scrape does not honor it) and `discover.attribution`; "
         "`ambiguous`: two pods on one IP (hostNetwork) or one pod with two IPs in `kube_pod_info`: act by hand.")),
    A["notifications_failing"]: (
        ("Alertmanager's log: `Notify for alerts failed` names the receiver and the error (connection refused, 401, 400, 503).",
         "A 401: the token file Alertmanager reads (`fuse.credentials_file`) differs from the fuse's `--webhook-token-file`.",
         f"A 503: the fuse's store failed (see {A['fuse_down']} and the fuse's log)."),
        ("Fix the cause; Alertmanager delivers the group again at its next group_interval.",
         "Meanwhile alerts that request a fuse do not trip it: act on them by hand (`POST /override`).")),
    C.HEARTBEAT_ALERT: (
        ("Nothing to diagnose when it fires: it always does. Its absence on Alertmanager's UI means Prometheus "
         "does not evaluate fusebox's rules or cannot reach Alertmanager.",),
        ("Never silence or inhibit it: the fuse's last-notification gauge and "
         f"{A['heartbeat_missing']} depend on it.",)),
    A["heartbeat_missing"]: (
        ("`fusebox_fuse_last_notification_timestamp_seconds` by `alertmanager` on the fuse's /metrics: which "
         "Alertmanager fell silent. No series: the fuse has heard from none since it started.",
         f"Is `{C.HEARTBEAT_ALERT}` firing in Alertmanager (its UI or `amtool alert`)? If not, Prometheus does not "
         "load fusebox's rules or cannot reach Alertmanager.",
         f"If it is firing, the route or the webhook fails: see {A['notifications_failing']}, and `amtool config routes "
         f"test alertname={C.HEARTBEAT_ALERT} fusebox=<metadata.name>`."),
        ("Repair the path (rules loaded, Alertmanager reachable, the fuse's route and token).",
         "An Alertmanager removed for good keeps its series on the fuse until the fuse restarts: restart it.")),
    A["token_file_refused"]: (
        ("The fuse's log: `token file <file> refused: <path>: line <n>: ...` names the file, the line and what is wrong "
         "(a line that is not `NAME TOKEN`, a trailing comment, a token under 32 characters, a name twice).",
         f"`{M['token_file_valid']}` by `file` (1 in force, 0 refused) and `{M['token_file_refused']}` (reads that "
         "refused it, on change and on SIGHUP)."),
        ("Fix the file (one `NAME TOKEN` per line, `#` comments on lines of their own) and write it atomically (a new "
         "file renamed over the old, or the Secret updated); the fuse reads it again on change or on `kill -HUP`.",
         "Until then the file's tokens are revoked: people override with a token of a valid file only, or act at the "
         "gateway by hand. A refused webhook file keeps its last good token: Alertmanager's notifications still work.")),
    A["audit_full"]: (
        ("`fusebox_fuse_audit_refused_dropped_total` by `reason` (`full`: the row bound; `rate`: the per-minute "
         "bound) and `fusebox_fuse_alerts_total` by `result`: what the fuse refuses (untrusted, no_scope, ...).",
         "The audit's refused rows (the status page, or `fusebox fuse audit`): which alert names, fingerprints or "
         "senders fill it."),
        ("Stop the sender that posts alerts the fuse refuses (an Alertmanager route sending other alerts to the fuse, "
         "or a neighbour that can post to Alertmanager), then `fusebox fuse audit prune` to make room.",
         "Raise `fuse.audit.refused_max_rows` only with room on the state volume (docs/fuse.md, Audit retention).")),
    A["collector_scrape"]: (
        ("The collector's log names the engine endpoint and the error.",
         "`fusebox_collector_scrape_refused_total` by reason: `body_too_large`, `decompressed_too_large` or "
         "`deadline` (a limit of the collector, see its --help)."),
        ("Restart or fix the engine; raise the collector's limit only if the engine's /metrics is legitimately that large.",)),
    A["collector_gpu"]: (
        ("The `reason` label is NVML's error (`gpu_is_lost`, `unknown`, ...); `dmesg | grep -i xid` on the node.",
         f"`fusebox_gpu_up == 0` and {C.GPU_DOWN_ALERT} for a GPU that is lost."),
        ("Drain the node's engines; reset or replace the GPU.",)),
}


def runbook_facts(spec: Spec) -> dict[str, dict[str, Any]]:
    """alert name -> what runbook_self.md.j2 renders (description, meaning, rules, routing, diagnosis, SOP)."""
    exprs = _exprs(spec)
    job = "{" + _matchers(spec.self_monitoring.fuse_selector) + "}"
    out = {}
    for a in self_alerts(spec):
        diagnosis, sop = _RUNBOOK[a.name]
        route = (f"the fuse receiver `{spec.receiver}` only, every {format_duration(spec.self_monitoring.heartbeat_interval_s)}"
                 if a.name == C.HEARTBEAT_ALERT else f"the people (`{spec.human_receiver.get('name')}`), never the fuse")
        placeholder = re.sub(r"\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", r"`<\1>`", a.description)
        out[a.name] = {"description": placeholder, "means": a.means, "severity": a.severity, "route": route,
                       "rules": [{"expr": e, "for": format_duration(f) if f else ""} for e, f in exprs[a.name]],
                       "diagnosis": [d.replace("{JOB}", job) for d in diagnosis], "sop": list(sop)}
    return out


# ---------------------------------------------------------------------------- promtool tests
def _expand(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", lambda mt: labels.get(mt.group(1), ""), template)


def _exp(spec: Spec, alert: SelfAlert, series_labels: dict[str, str], rule: int = 0) -> dict[str, Any]:
    return {"exp_labels": {**series_labels, **self_labels(spec, alert, rule)},
            "exp_annotations": {k: _expand(v, series_labels) for k, v in _annotations(spec, alert).items()}}


def _check(t: float, name: str, alerts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"eval_time": format_duration(t), "alertname": name, "exp_alerts": alerts}


def _step(n: int, jump_at: int) -> str:
    """A counter: 0 for ``jump_at`` samples, then 1 for the rest (``n`` in all), then stale."""
    return segments([(jump_at, 0, 0), (n - jump_at, 1, 0)])


def self_tests(spec: Spec) -> list[tuple[str, dict[str, Any]]]:
    """[(title, promtool test group)]: each alert on both sides of its edge, from series shaped as
    the fuse, Alertmanager 0.25 and the collectors expose them (names from conventions)."""
    alerts = {a.name: a for a in self_alerts(spec)}
    if not alerts:
        return []
    m = spec.self_monitoring
    I = spec.test_interval_s
    itv = format_duration(I)
    W = increase_window_s(spec)
    f = dict(m.fuse_selector)
    fuse = {**f, "instance": _FUSE_INSTANCE}
    groups: list[tuple[str, dict[str, Any]]] = []

    # 1. up: one replica down beside a healthy one
    n = int((m.down_for_s + 4 * I) // I) + 1
    down = {**f, "instance": "fuse-1:9095"}
    groups.append((f"{A['fuse_down']}: a replica down (up 0) alerts after {format_duration(m.down_for_s)}; "
                   "the healthy one does not", {
                       "interval": itv,
                       "input_series": [{"series": "up" + label_str(fuse), "values": segments([(n, 1, 0)])},
                                        {"series": "up" + label_str(down), "values": segments([(n, 0, 0)])}],
                       "alert_rule_test": [_check(max(m.down_for_s - I, 0), A["fuse_down"], []) if m.down_for_s >= I else None,
                                           _check(m.down_for_s + I, A["fuse_down"], [_exp(spec, alerts[A["fuse_down"]], down)])]}))
    # 2. nothing scraped from the fuse at all: down (absent) and the heartbeat feed missing; the
    # heartbeat itself fires from the first evaluation
    t_absent = max(m.down_for_s, m.heartbeat_silent_after_s) + I
    groups.append((f"Nothing scraped from the fuse: {A['fuse_down']} and {A['heartbeat_missing']} fire (absent), "
                   f"and {C.HEARTBEAT_ALERT} always fires", {
                       "interval": itv, "input_series": [],
                       "alert_rule_test": [
                           _check(I, C.HEARTBEAT_ALERT, [_exp(spec, alerts[C.HEARTBEAT_ALERT], {})]),
                           _check(t_absent, A["fuse_down"], [_exp(spec, alerts[A["fuse_down"]], {**f, "instance": NO_TARGET})]),
                           _check(t_absent, A["heartbeat_missing"],
                                  [_exp(spec, alerts[A["heartbeat_missing"]], {**f, C.ALERTMANAGER_LABEL: ANY_AM}, 1)]),
                           _check(t_absent, A["actions_failing"], []), _check(t_absent, A["actions_stuck"], [])]}))
    # 3. counters that rise once: the alert fires while the window holds the rise, then resolves
    jump = 4
    n = int((jump * I + W + 4 * I) // I) + 1
    # the fuse publishes every adapter's given-up series at 0 from start (Alertmanager its failed
    # counter per integration likewise): their 0 here is what Prometheus scrapes before the rise
    given_up = {**fuse, "adapter": "gateway", "reason": "retries_exhausted"}
    am_fail = {**_AM, **_am_labels(spec)}
    am_other = {**_AM, **{**_am_labels(spec), "integration": "email"}}
    coll = _collector_labels(spec)
    scrape = {**coll, "job": C.SERVICE["kv"], "instance": "gpu-node-1:9464", "host_name": "gpu-node-1", "engine": "engine-0"}
    refused = {**scrape, "engine": "engine-1", "reason": "body_too_large"}
    gpu = {**coll, "job": C.SERVICE["gpu"], "instance": "gpu-node-1:9464", "host_name": "gpu-node-1",
           "hw_id": "GPU-5a3c1f2e-0000-4000-8000-000000000001", "hw_gpu_index": "0", "reason": "gpu_is_lost"}
    rising = [(M["actions_given_up"], given_up, A["actions_failing"]),
              (C.AM_NOTIFICATIONS_FAILED, am_fail, A["notifications_failing"]),
              (C.PROM_SELF["scrape_errors"], scrape, A["collector_scrape"]),
              (C.PROM_SELF["scrape_refused"], refused, A["collector_scrape"]),
              (C.PROM_SELF["gpu_errors"], gpu, A["collector_gpu"])]
    rising = [r for r in rising if r[2] in alerts]  # the collectors' alerts only where they run
    series = [{"series": metric + label_str(labels), "values": _step(n, jump)} for metric, labels, _ in rising]
    series.append({"series": C.AM_NOTIFICATIONS_FAILED + label_str(am_other), "values": _step(n, jump)})
    names = sorted({name for _, _, name in rising})
    before, during, after = (jump - 2) * I, (jump + 1) * I, jump * I + W + 2 * I
    checks = []
    for name in names:
        firing = [_exp(spec, alerts[name], labels) for _, labels, nm in rising if nm == name]
        checks += [_check(before, name, []), _check(during, name, firing), _check(after, name, [])]
    groups.append((f"Error counters rising once ({', '.join(names)}): each alerts while its {format_duration(W)} "
                   "window holds the rise and resolves after; another integration's failures do not count", {
                       "interval": itv, "input_series": series, "alert_rule_test": checks}))
    # 4. the oldest pending action ages one second per second
    n = int((m.max_pending_action_age_s + 4 * I) // I) + 1
    groups.append((f"{A['actions_stuck']}: an action pending for over {format_duration(m.max_pending_action_age_s)} alerts, "
                   "not before", {
                       "interval": itv,
                       "input_series": [{"series": M["oldest_pending_age"] + label_str(fuse),
                                         "values": segments([(n, 0, I)])}],
                       "alert_rule_test": [_check(m.max_pending_action_age_s - I, A["actions_stuck"], []),
                                           _check(m.max_pending_action_age_s + I, A["actions_stuck"],
                                                  [_exp(spec, alerts[A["actions_stuck"]], fuse)])]}))
    # 4b. a tripped level unapplied: the gauge at 1 alerts once it has stayed so for the bound, not before
    n = int((m.max_pending_action_age_s + 6 * I) // I) + 1
    lu = alerts[A["level_unapplied"]]
    groups.append((f"{A['level_unapplied']}: a tripped level unapplied for over {format_duration(m.max_pending_action_age_s)} "
                   "alerts, not before", {
                       "interval": itv,
                       "input_series": [{"series": M["unapplied_levels"] + label_str(fuse),
                                         "values": segments([(2, 0, 0), (n - 2, 1, 0)])}],
                       "alert_rule_test": [_check(2 * I + m.max_pending_action_age_s - I, A["level_unapplied"], []),
                                           _check(2 * I + m.max_pending_action_age_s + I, A["level_unapplied"],
                                                  [_exp(spec, lu, fuse)])]}))
    # 5. two Alertmanagers notify every interval; the first falls silent after `quiet`, the second
    # after `quiet2`: a warning for the first alone, then the critical for the whole feed
    S = m.heartbeat_silent_after_s
    quiet = 4
    quiet2 = quiet + int(S // I) + 4
    n = int((quiet2 * I + S + 4 * I) // I) + 1
    hm = alerts[A["heartbeat_missing"]]
    one, two = ({C.ALERTMANAGER_LABEL: url} for url in _AM_URLS)
    last = [{"series": M["last_notification"] + label_str({**fuse, **one}),
             "values": segments([(quiet + 1, 0, I), (n - quiet - 1, quiet * I, 0)])},
            {"series": M["last_notification"] + label_str({**fuse, **two}),
             "values": segments([(quiet2 + 1, 0, I), (n - quiet2 - 1, quiet2 * I, 0)])}]
    groups.append((f"{A['heartbeat_missing']}: one Alertmanager silent for over {format_duration(S)} is a warning "
                   "naming it; every one silent is critical", {
                       "interval": itv, "input_series": last,
                       "alert_rule_test": [
                           _check(quiet * I + S - I, A["heartbeat_missing"], []),
                           _check(quiet * I + S + I, A["heartbeat_missing"], [_exp(spec, hm, one, 2)]),
                           _check(quiet2 * I + S - I, A["heartbeat_missing"], [_exp(spec, hm, one, 2)]),
                           _check(quiet2 * I + S + I, A["heartbeat_missing"],
                                  [_exp(spec, hm, {C.ALERTMANAGER_LABEL: ANY_AM}, 0), _exp(spec, hm, one, 2), _exp(spec, hm, two, 2)])]}))
    # 6. a refused token file alerts at once, naming the file; a valid one does not
    tf = alerts[A["token_file_refused"]]
    people, hook = {**fuse, "file": "people"}, {**fuse, "file": "webhook"}
    groups.append((f"{A['token_file_refused']}: a refused token file (gauge 0) alerts naming it; a valid one does not", {
        "interval": itv,
        "input_series": [{"series": M["token_file_valid"] + label_str(people), "values": segments([(2, 1, 0), (4, 0, 0)])},
                         {"series": M["token_file_valid"] + label_str(hook), "values": segments([(6, 1, 0)])}],
        "alert_rule_test": [_check(I, A["token_file_refused"], []),
                            _check(3 * I, A["token_file_refused"], [_exp(spec, tf, people)])]}))
    # 7. refusals dropped because the audit is full alert; those dropped at the per-minute rate do not
    af = alerts[A["audit_full"]]
    full, rate = {**fuse, "reason": "full"}, {**fuse, "reason": "rate"}
    groups.append((f"{A['audit_full']}: refusals dropped at the row bound alert; at the per-minute bound they do not", {
        "interval": itv,
        "input_series": [{"series": M["audit_refused_dropped"] + label_str(full), "values": segments([(3, 0, 0), (3, 5, 0)])},
                         {"series": M["audit_refused_dropped"] + label_str(rate), "values": segments([(1, 0, 0), (5, 0, 9)])}],
        "alert_rule_test": [_check(2 * I, A["audit_full"], []),
                            _check(4 * I, A["audit_full"], [_exp(spec, af, full)])]}))
    for _, g in groups:
        g["alert_rule_test"] = [c for c in g["alert_rule_test"] if c is not None]
    return groups
