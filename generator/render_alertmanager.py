"""Alertmanager routing of fusebox's alerts, from one set of data, rendered three ways.

Every alert fusebox generates carries the marker label ``fusebox: <metadata.name>``
(``conventions.LABEL["marker"]``), and a tier that requests a fuse also ``fuse_action``. The
routing is one :class:`Routing` (see :func:`routing`):

* a route matching the marker, grouped by alert, severity and scope;
* under it, first, the heartbeat (``FuseboxHeartbeat``, always firing) to the fuse receiver only,
  every ``fuse.self_monitoring.heartbeat_interval`` (its own group_interval and repeat_interval):
  the fuse records each Alertmanager's last notification, and the people never see it;
* then alerts that request a fuse (marker and ``fuse_action=~".+"``) go to the fuse receiver
  after ``group_wait_critical`` and ``continue`` to the people (``fuse.human_receiver``); every
  other fusebox alert (warnings, FuseboxSignalAbsent, the self-monitoring alerts such as
  FuseboxFuseDown) reaches the people only;
* an inhibit rule, scoped to fusebox's alerts, that mutes a warning while the critical of the same
  alert and scope fires.

Alerts without the marker (every other team's ``severity="critical"``), or with the marker of
another spec, never match the fusebox route, so they never reach the fuse receiver.

Rendered as: the standalone ``alertmanager/alertmanager.yml`` (demo, docker compose; its root
receiver is the people's), the fragment ``alertmanager/fragment.yml`` (the route, receivers and
inhibit rules to put first under an existing config's ``route.routes``:
``fusebox alertmanager merge``), and the Prometheus Operator ``AlertmanagerConfig``
``k8s/alertmanagerconfig.yml`` (monitoring.coreos.com/v1alpha1: the same route, the webhook token and
the people's secrets from Secrets; the people's receiver converted by :mod:`.am_operator`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fusebox import conventions as C
from fusebox.signal_kinds import lost_gpu_fuses
from fusebox.spec import Spec
from fusebox.spec.deploy import object_name
from fusebox.spec.units import format_duration

from . import render_slo
from .render_k8s import object_meta
from .render_rules import absent_labels, alert_labels, gpu_down_enabled, gpu_down_labels, signal_raw_metrics
from .selfmon import self_alerts, self_labels

__all__ = ["Matcher", "Routing", "routing", "render_alertmanager", "render_fragment", "render_alertmanagerconfig",
           "route_tests", "webhook_url_in_cluster", "ALERTMANAGERCONFIG_API",
           "operator_warnings", "operator_secret_keys"]

SCOPE = list(C.SCOPE_LABELS)
ALERTMANAGERCONFIG_API = "monitoring.coreos.com/v1alpha1"


@dataclass(frozen=True)
class Matcher:
    """One label matcher; ``op`` is Alertmanager's ``=``, ``!=``, ``=~`` or ``!~``."""

    name: str
    op: str
    value: str

    def text(self) -> str:
        """As Alertmanager's ``matchers`` write it: ``fusebox="multimodal-inference"`` (value quoted, ``\\`` and ``"`` escaped)."""
        value = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.op}"{value}"'

    def crd(self) -> dict[str, str]:
        """As the operator's AlertmanagerConfig writes it: ``{name, value, matchType}``."""
        return {"name": self.name, "value": self.value, "matchType": self.op}


@dataclass(frozen=True)
class Routing:
    """What every rendering of fusebox's routing is made from.

    Durations are Prometheus duration text (``30s``); ``marker`` selects fusebox's alerts of this
    spec, ``requests_fuse`` (under ``marker``) those that request a fuse.
    """

    marker: Matcher
    requests_fuse: Matcher
    fuse_receiver: str
    human_receiver: dict[str, Any]
    group_by: list[str]
    group_wait: str
    group_wait_critical: str
    group_interval: str
    repeat_interval: str
    inhibit_source: list[Matcher]  # empty: no inhibit rule (the spec has no warning tier to mute)
    inhibit_target: list[Matcher]
    inhibit_equal: list[str]
    heartbeat: Matcher | None = None  # None: self-monitoring off, no heartbeat route
    heartbeat_interval: str = "1m"

    @property
    def human(self) -> str:
        return str(self.human_receiver["name"])


def _severity_matcher(severities: list[str]) -> Matcher:
    if len(severities) == 1:
        return Matcher(C.LABEL["severity"], "=", severities[0])
    return Matcher(C.LABEL["severity"], "=~", "|".join(re.escape(s) for s in severities))


def routing(spec: Spec) -> Routing:
    """The routing of ``spec``'s alerts (see the module docstring)."""
    marker = Matcher(C.LABEL["marker"], "=", spec.name)
    # Severities from the tiers (an override may page with `severity: page`), not assumed.
    critical = sorted({t.severity for s in spec.signals for t in s.tiers if t.name == "critical"})
    warning = sorted({t.severity for s in spec.signals for t in s.tiers if t.name == "warning"} - set(critical))
    source, target = ([marker, _severity_matcher(critical)], [marker, _severity_matcher(warning)]) if critical and warning else ([], [])
    return Routing(
        marker=marker,
        requests_fuse=Matcher(C.LABEL["fuse_action"], "=~", ".+"),
        fuse_receiver=spec.receiver,
        human_receiver=dict(spec.human_receiver),
        group_by=["alertname", C.LABEL["severity"]] + SCOPE,
        group_wait=format_duration(spec.group_wait_s),
        # short: a fuse that waits 30 s is 30 s late
        group_wait_critical=format_duration(spec.group_wait_critical_s),
        group_interval=format_duration(spec.group_interval_s),
        repeat_interval=format_duration(spec.repeat_interval_s),
        inhibit_source=source,
        inhibit_target=target,
        inhibit_equal=[C.LABEL["marker"], "alertname"] + SCOPE,
        heartbeat=Matcher("alertname", "=", C.HEARTBEAT_ALERT) if spec.self_monitoring.enabled else None,
        heartbeat_interval=format_duration(spec.self_monitoring.heartbeat_interval_s),
    )


def webhook_url_in_cluster(spec: Spec) -> str:
    """The fuse Service's webhook inside the cluster: ``http://fusebox-fuse.<namespace>.svc:9095/alertmanager``
    (names from ``conventions.K8S``, namespace from ``kubernetes.namespace``)."""
    k = C.K8S
    return f"http://{k['fuse']}.{spec.kubernetes.namespace}.svc:{k['fuse_port']}{k['fuse_webhook_path']}"


# ------------------------------------------------------------- Alertmanager's own config format
def _fusebox_route(r: Routing) -> dict[str, Any]:
    """The route that takes every alert of this spec (and only those): first under ``route.routes``."""
    return {
        "matchers": [r.marker.text()],
        "receiver": r.human,
        "group_by": list(r.group_by),
        "group_wait": r.group_wait,
        "group_interval": r.group_interval,
        "repeat_interval": r.repeat_interval,
        "routes": _heartbeat_route(r) + [
            # `continue`: the people are told as well. Without the second route, an alert that
            # matched this one would not fall back to the parent's receiver (Alertmanager uses a
            # parent only when none of its children matched).
            {"matchers": [r.requests_fuse.text()], "receiver": r.fuse_receiver,
             "group_wait": r.group_wait_critical, "continue": True},
            {"receiver": r.human},
        ],
    }


def _heartbeat_route(r: Routing) -> list[dict[str, Any]]:
    """The heartbeat to the fuse only (no ``continue``: never to the people). Alertmanager resends an
    unchanged group on a group_interval tick once repeat_interval has passed, so both are the
    heartbeat's interval; no group_wait: the first heartbeat goes out at once."""
    if r.heartbeat is None:
        return []
    return [{"matchers": [r.heartbeat.text()], "receiver": r.fuse_receiver, "group_wait": "0s",
             "group_interval": r.heartbeat_interval, "repeat_interval": r.heartbeat_interval}]


def _inhibit_rules(r: Routing) -> list[dict[str, Any]]:
    if not r.inhibit_source:
        return []
    return [{"source_matchers": [m.text() for m in r.inhibit_source],
             "target_matchers": [m.text() for m in r.inhibit_target],
             "equal": list(r.inhibit_equal)}]


def _receivers(r: Routing, spec: Spec) -> list[dict[str, Any]]:
    """The fuse's webhook (bearer token read from ``credentials_file`` at send time, never written
    here) and the people's receiver as the spec writes it."""
    fuse = {
        "name": r.fuse_receiver,
        "webhook_configs": [{
            "url": spec.webhook_url,
            "send_resolved": True,
            "max_alerts": 0,
            "http_config": {"authorization": {"type": "Bearer", "credentials_file": spec.credentials_file}},
        }],
    }
    return [fuse, dict(r.human_receiver)]


def render_alertmanager(spec: Spec) -> dict[str, Any]:
    """The standalone Alertmanager configuration (as data) for the demo and docker compose.

    The root receiver is the people's (``fuse.human_receiver``): alerts that are not fusebox's end
    there, never at the fuse. Its only child route is the fusebox route (:func:`render_fragment`'s).
    """
    r = routing(spec)
    out: dict[str, Any] = {
        "route": {
            "receiver": r.human,
            "group_by": list(r.group_by),
            "group_wait": r.group_wait,
            "group_interval": r.group_interval,
            "repeat_interval": r.repeat_interval,
            "routes": [_fusebox_route(r)],
        },
    }
    rules = _inhibit_rules(r)
    if rules:
        out["inhibit_rules"] = rules
    out["receivers"] = _receivers(r, spec)
    return out


def render_fragment(spec: Spec) -> dict[str, Any]:
    """What ``fusebox alertmanager merge`` adds to an existing Alertmanager config (as data):

    ``routes`` (one route, to put first under the config's ``route.routes``), ``receivers`` (the
    fuse's webhook and ``fuse.human_receiver``) and ``inhibit_rules`` (scoped to this spec's alerts).
    """
    r = routing(spec)
    return {"routes": [_fusebox_route(r)], "receivers": _receivers(r, spec), "inhibit_rules": _inhibit_rules(r)}


# ------------------------------------------------------------ Prometheus Operator (v1alpha1 CRD)
def _crd_route(r: Routing) -> dict[str, Any]:
    """The fusebox route in the CRD's field names: :func:`_fusebox_route`, the same tree."""
    hb = ([{"receiver": r.fuse_receiver, "matchers": [r.heartbeat.crd()], "groupWait": "0s",
            "groupInterval": r.heartbeat_interval, "repeatInterval": r.heartbeat_interval}] if r.heartbeat else [])
    return {
        "receiver": r.human,
        "matchers": [r.marker.crd()],
        "groupBy": list(r.group_by),
        "groupWait": r.group_wait,
        "groupInterval": r.group_interval,
        "repeatInterval": r.repeat_interval,
        "continue": True,
        "routes": hb + [
            {"receiver": r.fuse_receiver, "matchers": [r.requests_fuse.crd()], "groupWait": r.group_wait_critical,
             "continue": True},
            {"receiver": r.human}],
    }


def render_alertmanagerconfig(spec: Spec) -> dict[str, Any]:
    """The Prometheus Operator ``AlertmanagerConfig`` (monitoring.coreos.com/v1alpha1).

    Field names are the CRD's (``matchers: [{name, value, matchType}]``, ``groupWait``,
    ``webhookConfigs``, ``httpConfig.authorization.credentials`` a Secret key reference,
    ``inhibitRules: [{sourceMatch, targetMatch, equal}]``). The fuse's webhook is the fuse Service
    in ``kubernetes.namespace``; its bearer token comes from the Secret ``fusebox-fuse-token``, key
    ``token`` (``conventions.K8S``), never inline.

    The route is the standalone config's fusebox route (:func:`_fusebox_route`): the marker, to
    the people's receiver; under it the heartbeat to the fuse only, the alerts that request a fuse
    to the fuse (``continue``) and then everything to the people. The people's receiver is
    ``fuse.human_receiver`` converted to the CRD (:func:`.am_operator.crd_receiver`: its secrets
    from the Secret ``fusebox-human-receiver``): a receiver of an AlertmanagerConfig is namespaced
    by the operator (``<namespace>/<object>/<name>``) and cannot name the main config's, and on
    kube-prometheus-stack's defaults the main config's root receiver is ``null``: an alert this
    route takes never reaches it (a parent's receiver is used only when none of its children
    matched), so the people must be here. The operator forces ``continue: true`` on the route
    (written here too): the main config's routes see fusebox's alerts as well. It also adds
    ``namespace="<this object's namespace>"`` to the route unless the Alertmanager resource sets
    ``alertmanagerConfigMatcherStrategy: {type: None}``; the PrometheusRule gives every fusebox
    alert that label (render_k8s.render_prometheusrule), so it works on the operator's default
    (docs/alertmanager.md, "The Prometheus Operator").
    """
    from .am_operator import crd_receiver

    r = routing(spec)
    k = C.K8S
    human, _issues = crd_receiver(r.human_receiver)
    out: dict[str, Any] = {
        "apiVersion": ALERTMANAGERCONFIG_API,
        "kind": "AlertmanagerConfig",
        "metadata": object_meta(spec, object_name(spec.name), "alertmanager-config", app="fusebox"),
        "spec": {
            "route": _crd_route(r),
            "receivers": [{
                "name": r.fuse_receiver,
                "webhookConfigs": [{
                    "url": webhook_url_in_cluster(spec),
                    "sendResolved": True,
                    "maxAlerts": 0,
                    "httpConfig": {"authorization": {
                        "type": "Bearer",
                        "credentials": {"name": k["token_secret"], "key": k["token_key"]},
                    }},
                }],
            }, human],
        },
    }
    if r.inhibit_source:
        out["spec"]["inhibitRules"] = [{"sourceMatch": [m.crd() for m in r.inhibit_source],
                                        "targetMatch": [m.crd() for m in r.inhibit_target],
                                        "equal": list(r.inhibit_equal)}]
    return out


def operator_warnings(spec: Spec) -> list[tuple[tuple, str, str]]:
    """What ``fusebox generate`` says about the people on the operator path: ``[(spec path, what,
    fix)]``, each printed at its spec line. Each part of ``fuse.human_receiver`` that
    ``k8s/alertmanagerconfig.yml`` cannot hold (:func:`.am_operator.crd_receiver`), and, once, a
    people's receiver left with no configs there (the starter spec's ``{name: oncall}``): fusebox's
    alerts then reach the fuse and nobody else on that path."""
    from .am_operator import crd_receiver

    human, issues = crd_receiver(dict(spec.human_receiver))
    out = [(i.path, i.what, i.fix) for i in issues]
    if set(human) == {"name"}:
        out.append((("fuse", "human_receiver"),
                    f"fuse.human_receiver {human['name']!r} has no configs k8s/alertmanagerconfig.yml can hold: on "
                    "the Prometheus Operator path fusebox's criticals reach the fuse and nobody else, and its warnings, "
                    "absent and self-monitoring alerts (FuseboxFuseDown...) nobody at all",
                    "give it configs (e.g. pagerduty_configs: [{routing_key_file: ...}], its key then read from the "
                    f"Secret {C.K8S['human_secret']!r}, docs/alertmanager.md)"))
    return out


def operator_secret_keys(spec: Spec) -> list[str]:
    """The keys of the Secret ``fusebox-human-receiver`` (``conventions.K8S["human_secret"]``) that
    ``k8s/alertmanagerconfig.yml`` reads for the people's receiver; empty when it reads none."""
    from .am_operator import crd_receiver, secret_keys

    return secret_keys(crd_receiver(dict(spec.human_receiver))[0])


# -------------------------------------------------------------------------------- route tests
FOREIGN_CRITICAL = {"alertname": "KubePodCrashLooping", "severity": "critical", "namespace": "inference"}
WATCHDOG = {"alertname": "Watchdog", "severity": "none"}


def fusebox_cases(spec: Spec) -> list[dict[str, Any]]:
    """Route-test cases for this spec's own alerts (every tier of every signal and SLO, ...), with
    the labels the generated rules give them: ``{name, labels, receivers}``. They hold for the standalone config and for any config the
    fragment was merged into."""
    r = routing(spec)
    both, human = [r.fuse_receiver, r.human], [r.human]
    out = []
    for sig in spec.signals:
        for t in sig.tiers:
            labels = {"alertname": sig.alert, **alert_labels(sig, t, spec)}
            out.append({"name": f"{sig.alert} {t.name} " + ("trips the fuse and tells the people" if t.fuse else
                                                            "tells the people only (it requests no fuse)"),
                        "labels": labels, "receivers": both if t.fuse else human})
    for slo in spec.slos:  # the burn-rate alerts: the same route as a threshold tier of the same severity
        for bt in slo.tiers:
            labels = {"alertname": slo.alert, **{lb: "test" for lb in slo.by}, **render_slo.slo_alert_labels(slo, bt, spec)}
            out.append({"name": f"{slo.alert} {bt.name} " + (f"trips the fuse ({bt.fuse}) and tells the people" if bt.fuse else
                                                               "tells the people only (it requests no fuse)"),
                        "labels": labels, "receivers": both if bt.fuse else human})
    if spec.signals:
        sig = spec.signals[0]
        metric = signal_raw_metrics(sig)[0]
        out.append({"name": f"{C.ABSENT_ALERT} tells the people only",
                    "labels": {"alertname": C.ABSENT_ALERT, **absent_labels(metric, [sig.name], spec)}, "receivers": human})
    for a in self_alerts(spec):
        labels = {"alertname": a.name, **self_labels(spec, a)}
        if a.name == C.HEARTBEAT_ALERT:
            out.append({"name": f"{a.name} reaches the fuse only, never the people", "labels": labels, "receivers": [r.fuse_receiver]})
            forged = {**labels, C.LABEL["fuse_action"]: next(iter(spec.actions), "x"), "hw_id": "GPU-0"}
            out.append({"name": f"{a.name} with a forged fuse_action still reaches the fuse only (which trips nothing on it)",
                        "labels": forged, "receivers": [r.fuse_receiver]})
        else:
            out.append({"name": f"{a.name} tells the people only, never the fuse", "labels": labels, "receivers": human})
    if gpu_down_enabled(spec):
        for action in lost_gpu_fuses(spec) or (None,):  # the GPU-down alert holds the fuse of the signals it silences
            out.append({"name": f"{C.GPU_DOWN_ALERT} " + (f"holds {action}: the fuse and the people" if action else "tells the people only"),
                        "labels": {"alertname": C.GPU_DOWN_ALERT, **gpu_down_labels(spec, action)},
                        "receivers": both if action else human})
    return out


def foreign_cases(spec: Spec) -> list[dict[str, Any]]:
    """Alerts that are not this spec's: ``{name, labels}``; none may reach the fuse receiver."""
    fuse_tier = next(((s, t) for s in spec.signals for t in s.tiers if t.fuse), None)
    out = [
        {"name": "another team's critical alert never reaches the fuse", "labels": dict(FOREIGN_CRITICAL)},
        {"name": "Watchdog never reaches the fuse", "labels": dict(WATCHDOG)},
    ]
    if fuse_tier:
        sig, t = fuse_tier
        asks = {"alertname": sig.alert, **alert_labels(sig, t, spec)}
        no_marker = {k: v for k, v in asks.items() if k != C.LABEL["marker"]}
        out.append({"name": f"a {sig.alert} without the {C.LABEL['marker']} label (a hand-written rule) never reaches the fuse",
                    "labels": no_marker})
        other = {**asks, C.LABEL["marker"]: f"{spec.name}-other"}
        out.append({"name": "an alert of another fusebox spec never reaches this one's fuse", "labels": other})
    return out


def route_tests(spec: Spec) -> list[dict[str, Any]]:
    """``[{name, labels, receivers}]`` for ``amtool config routes test`` on the standalone config:
    every tier of every signal, the absent and GPU-down alerts, the self-monitoring alerts and the
    heartbeat, and foreign alerts (they reach the
    root receiver, the people's, never the fuse)."""
    human = [routing(spec).human]
    return fusebox_cases(spec) + [{**c, "receivers": human} for c in foreign_cases(spec)]
