"""Render every output of a spec in memory: {relative path: file text}. No I/O here."""

from __future__ import annotations

import importlib
from pathlib import PurePath
from typing import Any

import yaml

from fusebox import conventions as C

from .render_alertmanager import render_alertmanager, route_tests
from .render_k8s import render_prometheusrule
from .render_rules import render_rules
from .render_runbooks import render_runbooks
from .render_tests import render_rule_tests
from fusebox.spec import Spec

RULE_FILE = "rules/fusebox.rules.yml"
RULE_TEST_FILE = "rules/fusebox.rules.test.yml"
ALERTMANAGER_FILE = "alertmanager/alertmanager.yml"
ROUTE_TEST_FILE = "alertmanager/route-tests.yml"
PROMETHEUSRULE_FILE = "k8s/prometheusrule.yml"

# Renderers of other areas, each a module in this package with outputs(spec, header) -> {path: text}.
EXTRA_RENDERERS = ("render_dashboards", "render_grafana_provisioning", "render_otelcol")


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # libyaml when present: 10x faster
    pass


def _str(dumper: yaml.SafeDumper, s: str):
    style = "|" if "\n" in s else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True)


def header_for(spec: Spec) -> str:
    """The "Code generated ... DO NOT EDIT." line. It names the spec by its base name only, so the
    outputs do not depend on how --spec was spelled (absolute, relative, from another folder) and
    ``--check`` finds no drift for another spelling."""
    return C.GENERATED_HEADER.format(spec=PurePath(spec.file).name)


def render_all(spec: Spec) -> dict[str, str]:
    """Every generated file for ``spec``; raises nothing for a validated spec."""
    header = header_for(spec)
    h = f"# {header}\n"
    rules = render_rules(spec)
    out: dict[str, str] = {RULE_FILE: h + dump_yaml({"groups": rules.groups})}

    test_text = [h, dump_yaml({"rule_files": ["fusebox.rules.yml"],
                               "evaluation_interval": f"{int(spec.evaluation_interval_s * 1000)}ms"
                               if spec.evaluation_interval_s % 1 else f"{int(spec.evaluation_interval_s)}s"}),
                 "tests:\n"]
    for title, group in render_rule_tests(spec, rules, "fusebox.rules.yml"):
        whys = [c.pop("_why") for c in group.get("alert_rule_test", []) if "_why" in c]
        test_text.append(f"# {title}\n" + "".join(f"#  - {w}\n" for w in whys))
        test_text.append(dump_yaml([group]))
    out[RULE_TEST_FILE] = "".join(test_text)

    out[ALERTMANAGER_FILE] = h + dump_yaml(render_alertmanager(spec))
    out[ROUTE_TEST_FILE] = h + dump_yaml({"tests": route_tests(spec)})
    out[PROMETHEUSRULE_FILE] = h + dump_yaml(render_prometheusrule(spec, rules))
    out.update(render_runbooks(spec, rules, header))
    for name in EXTRA_RENDERERS:
        try:
            mod = importlib.import_module(f"fusebox.generator.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"fusebox.generator.{name}":
                continue
            raise
        out.update(mod.outputs(spec, header))
    return dict(sorted(out.items()))
