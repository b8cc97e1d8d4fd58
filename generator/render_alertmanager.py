"""Alertmanager config routing fusebox alerts to the fuse webhook, with its routing tests."""

from __future__ import annotations

from typing import Any

from fusebox import conventions as C

from fusebox.spec import Spec
from fusebox.spec.units import format_duration

SCOPE = list(C.SCOPE_LABELS)


def render_alertmanager(spec: Spec) -> dict[str, Any]:
    """Alertmanager configuration (as data).

    Critical alerts reach the fuse after ``group_wait_critical`` (short: a fuse that waits
    30 s is 30 s late); warnings after ``group_wait``. The bearer token is read from
    ``credentials_file`` at send time and never written here. A critical alert inhibits the
    warning of the same alert and scope.
    """
    receiver = {
        "name": spec.receiver,
        "webhook_configs": [{
            "url": spec.webhook_url,
            "send_resolved": True,
            "max_alerts": 0,
            "http_config": {"authorization": {"type": "Bearer", "credentials_file": spec.credentials_file}},
        }],
    }
    group_by = ["alertname", "severity"] + SCOPE
    human = spec.human_receiver["name"]
    return {
        "route": {
            "receiver": human,
            "group_by": group_by,
            "group_wait": format_duration(spec.group_wait_s),
            "group_interval": format_duration(spec.group_interval_s),
            "repeat_interval": format_duration(spec.repeat_interval_s),
            "routes": [
                # The fuse sees every alert (it trips on critical tiers and records the rest);
                # `continue` so people are paged as well: the webhook discards what trips nothing.
                {"matchers": ['severity="critical"'], "receiver": spec.receiver,
                 "group_wait": format_duration(spec.group_wait_critical_s), "continue": True},
                {"matchers": ['severity="warning"'], "receiver": spec.receiver, "continue": True},
                {"receiver": human},
            ],
        },
        "inhibit_rules": [{
            "source_matchers": ['severity="critical"'],
            "target_matchers": ['severity="warning"'],
            "equal": ["alertname"] + SCOPE,
        }],
        "receivers": [receiver, dict(spec.human_receiver)],
    }


def route_tests(spec: Spec) -> list[dict[str, Any]]:
    """[{labels, receivers, group_wait}] for `amtool config routes test`, one per alert tier."""
    out = []
    for sig in spec.signals:
        for t in sig.tiers:
            out.append({"labels": {"alertname": sig.alert, "severity": t.severity},
                        "receivers": [spec.receiver, spec.human_receiver["name"]]})
    for alert, severity in ((C.ABSENT_ALERT, spec.absent_severity), (C.GPU_DOWN_ALERT, "warning")):
        out.append({"labels": {"alertname": alert, "severity": severity},
                    "receivers": [spec.receiver, spec.human_receiver["name"]]})
    return out
