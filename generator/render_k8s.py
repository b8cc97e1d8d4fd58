"""The same rules as a Prometheus Operator PrometheusRule."""

from __future__ import annotations

from typing import Any

from .render_rules import Rules
from fusebox.spec import Spec


def render_prometheusrule(spec: Spec, rules: Rules) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": f"fusebox-{spec.name}",
            "labels": {"app.kubernetes.io/name": "fusebox", "app.kubernetes.io/part-of": "fusebox",
                       "role": "alert-rules"},
        },
        "spec": {"groups": rules.groups},
    }
