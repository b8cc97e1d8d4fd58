"""Every generated dashboard against the rules of Grafana's own dashboard JSON schema.

Source: grafana/grafana-foundation-sdk ``jsonschema/dashboard.jsonschema.json`` at commit
b30d142ba78f903da70f70dbcf4e5faf7adf8eda (branch ``next+cog-v0.0.x``: the classic dashboard model
whose ``schemaVersion`` default is 41, the version fusebox writes). That file is not vendored;
tests/fixtures/dashboards/grafana-dashboard-rules.json states, as a draft-07 schema written for
these tests, the rules of it that fusebox's dashboards exercise: its closed objects with the
properties they allow, their types and required keys (docs/dashboards.md says how to check the
output against the full file). Validated against the full file too when this was written: 0 errors.

What is validated: the committed dashboards/*.json, the dashboards inside the ConfigMaps of
k8s/grafana-dashboards.yaml (what the Grafana sidecar provisions), and a fresh render of
fusebox.yaml (so a renderer change is caught before `fusebox generate` rewrites the files).
"""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
import yaml
from _dashboards_support import ROOT

from fusebox.generator.render_dashboards import SCHEMA_VERSION, dashboards
from fusebox.spec import load_spec

SCHEMA = ROOT / "tests" / "fixtures" / "dashboards" / "grafana-dashboard-rules.json"


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _committed() -> dict[str, dict]:
    out = {str(p.relative_to(ROOT)): json.loads(p.read_text()) for p in sorted((ROOT / "dashboards").glob("*.json"))}
    for cm in yaml.safe_load_all((ROOT / "k8s" / "grafana-dashboards.yaml").read_text()):
        for key, text in (cm or {}).get("data", {}).items():
            out[f"k8s/grafana-dashboards.yaml:{cm['metadata']['name']}:{key}"] = json.loads(text)
    return out


COMMITTED = _committed()


@pytest.fixture(scope="module")
def rendered():
    return dashboards(load_spec(ROOT / "fusebox.yaml", display_path="fusebox.yaml"))


def _errors(validator, doc) -> list[str]:
    return sorted(f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(doc))


def test_the_committed_files_hold_nine_dashboards_twice():
    # the overview, seven drill-downs and the SLO board (fusebox-slo.json, the shipped spec's slos)
    assert len([k for k in COMMITTED if k.startswith("dashboards/")]) == 9
    assert len([k for k in COMMITTED if k.startswith("k8s/")]) == 9


@pytest.mark.parametrize("where", sorted(COMMITTED))
def test_every_committed_dashboard_is_valid(validator, where):
    assert _errors(validator, COMMITTED[where]) == []


def test_every_rendered_dashboard_is_valid(validator, rendered):
    assert sorted(rendered) == ["alignment-latency", "connections", "gpu-memory", "in-path-shedding", "kv-cache", "overview",
                                "secondary", "slo", "time-to-full"]
    for name, d in rendered.items():
        assert d["schemaVersion"] == SCHEMA_VERSION == 41
        assert _errors(validator, d) == [], name


# What grafanalib 0.7.1 writes and the adapter removes: each put back into a valid dashboard must
# be rejected by the schema (so the test above can fail, and these faults cannot come back).
def _timepicker_time_options(d):
    d["timepicker"]["time_options"] = ["5m", "15m", "1h"]


def _panel_editable(d):
    d["panels"][0]["editable"] = True


def _null_typed_field(d):
    d["panels"][0]["fieldConfig"]["defaults"]["decimals"] = None


def _null_threshold_base(d):
    d["panels"][0]["fieldConfig"]["defaults"]["thresholds"]["steps"][0]["value"] = None


def _empty_datasource_current(d):
    d["templating"]["list"][0]["current"] = {}


def _null_variable_datasource(d):
    d["templating"]["list"][0]["datasource"] = None


def _bare_panel_link(d):
    d["panels"][0]["links"] = [{"title": "Runbook", "url": "https://example.org/r.md", "targetBlank": True}]


@pytest.mark.parametrize("fault", [_timepicker_time_options, _panel_editable, _null_typed_field, _null_threshold_base,
                                   _empty_datasource_current, _null_variable_datasource, _bare_panel_link])
def test_the_schema_rejects_what_grafanalib_writes(validator, rendered, fault):
    d = copy.deepcopy(rendered["overview"])
    assert _errors(validator, d) == []
    fault(d)
    assert _errors(validator, d), fault.__name__
