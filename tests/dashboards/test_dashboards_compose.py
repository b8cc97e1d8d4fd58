"""docker-compose.yml against the Compose Specification's JSON schema, and the house rules for it.

Schema: compose-spec/compose-spec `schema/compose-spec.json`, copied into
tests/fixtures/dashboards/compose-spec.json (74,133 characters, as stored).
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import yaml
from _dashboards_support import ROOT

COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = ROOT / "tests" / "fixtures" / "dashboards" / "compose-spec.json"


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def test_compose_file_is_valid_against_the_compose_specification(compose, validator):
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_schema_rejects_a_malformed_service(validator):
    bad = {"services": {"grafana": {"image": "grafana/grafana:12.0.0", "ports": "3000:3000", "restart_policy": "always"}}}
    assert list(validator.iter_errors(bad))


def test_the_stack_has_every_part(compose):
    assert set(compose["services"]) == {"otelcol", "collectors", "fuse", "alertmanager", "prometheus", "grafana", "jaeger"}
    # the image's entry point is `fusebox` (Dockerfile): commands are its subcommands
    assert compose["services"]["collectors"]["command"][:2] == ["collect", "scenario"]
    assert compose["services"]["fuse"]["command"][:2] == ["fuse", "serve"]


def test_every_published_port_is_bound_to_loopback(compose):
    for name, svc in compose["services"].items():
        for port in svc.get("ports", []):
            assert re.match(r"^127\.0\.0\.1:\d+:\d+$", port), f"{name}: {port}"


def test_every_image_is_pinned(compose):
    for name, svc in compose["services"].items():
        image = svc.get("image", "")
        assert image, name
        assert ":" in image and not image.endswith(":latest"), f"{name}: {image}"


def test_grafana_has_no_default_admin_password(compose):
    g = compose["services"]["grafana"]
    env = g.get("environment", {})
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    assert {"path": ".env.grafana", "required": True} in g["env_file"]
    assert not (ROOT / ".env.grafana").exists() or ".env.grafana" in (ROOT / ".gitignore").read_text()


def test_mounted_generated_files_are_the_ones_fusebox_generates(compose):
    from fusebox.generator.outputs import render_all
    from fusebox.spec import load_spec

    generated = render_all(load_spec(ROOT / "fusebox.yaml", display_path="fusebox.yaml"))
    dirs = {p.split("/")[0] for p in generated}
    for svc in compose["services"].values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("./"):
                rel = src[2:]
                if rel in ("secrets/fuse.token",):
                    continue
                assert rel in generated or rel.split("/")[0] in dirs or (ROOT / rel).exists(), rel


@pytest.mark.parametrize("service", ["collectors", "fuse"])
def test_fusebox_service_commands_parse_with_the_real_cli(compose, service):
    from fusebox.cli import build_parser

    command = compose["services"][service]["command"]
    args = build_parser().parse_args(command)  # argparse exits (SystemExit) on a wrong flag
    assert callable(args.func)


def test_the_collectors_traces_reach_the_jaeger_service_and_prometheus_keeps_exemplars(compose):
    """fusebox.yaml's otelcol.traces.endpoint names this stack's Jaeger v2 by its service name and
    OTLP gRPC port (the image's all-in-one config listens on 4317), and Prometheus stores the
    exemplars that link to its traces."""
    from fusebox.spec import load_spec

    traces = load_spec(ROOT / "fusebox.yaml", display_path="fusebox.yaml").otelcol.traces
    host, _, port = traces.endpoint.rpartition(":")
    assert (host, port, traces.insecure) == ("jaeger", "4317", True)
    jaeger = compose["services"]["jaeger"]
    assert re.fullmatch(r"jaegertracing/jaeger:2\.\d+\.\d+", jaeger["image"])
    assert "jaeger" in compose["services"]["otelcol"]["depends_on"]
    assert "--enable-feature=exemplar-storage" in compose["services"]["prometheus"]["command"]
