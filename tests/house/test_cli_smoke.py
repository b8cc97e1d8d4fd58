"""The installed `fusebox` console script, run as a user runs it: one process per command whose other
tests run in-process (tests/_cli.py), so the script, its argument parsing and its exit statuses stay
covered end to end. The commands that serve (`fuse serve`, `fuse gateway`, `collect gpu`) and
`check` (it runs promtool, amtool, vmalert) keep their process tests in their own files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from _support import FIXTURES, ROOT, SPEC, yaml_data

FUSEBOX = str(Path(sys.executable).parent / "fusebox")  # the script pip wrote from [project.scripts]


def _fusebox(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([FUSEBOX, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_version_and_an_unknown_command():
    r = _fusebox("--version")
    assert (r.returncode, r.stdout.split()[0]) == (0, "fusebox"), r.stderr
    r = _fusebox("no-such-command")
    assert r.returncode == 2 and "invalid choice: 'no-such-command'" in r.stderr


def test_generate_check_finds_the_committed_outputs_current():
    r = _fusebox("generate", "--spec", SPEC, "--out", ROOT, "--check")
    assert r.returncode == 0, r.stdout + r.stderr


def test_budget_prints_every_fuse_tier_as_json():
    r = _fusebox("budget", "--spec", SPEC, "--json")
    assert r.returncode == 0, r.stderr
    fused = {(s["alert"], name) for s in yaml_data(SPEC.read_text())["signals"].values()
             for name, t in s["tiers"].items() if t.get("fuse")}
    assert {(t["alert"], t["tier"]) for t in json.loads(r.stdout)["tiers"]} == fused


def test_init_writes_the_starter_spec_then_refuses_to_overwrite_it(tmp_path):
    assert _fusebox("init", cwd=tmp_path).returncode == 0
    assert (tmp_path / "fusebox.yaml").read_bytes() == SPEC.read_bytes()
    r = _fusebox("init", cwd=tmp_path)
    assert r.returncode == 2 and "a spec is already there" in r.stderr


def test_schema_prints_a_draft_07_json_schema():
    r = _fusebox("schema")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["$schema"] == "http://json-schema.org/draft-07/schema#"


def test_alertmanager_merge_writes_a_config_routing_ours_first(tmp_path):
    out = tmp_path / "merged.yml"
    r = _fusebox("alertmanager", "merge", "--base", FIXTURES / "alertmanager" / "kube-prometheus-stack.yml",
                 "--spec", SPEC, "--out", out, "--allow-silent-people")
    assert r.returncode == 0, r.stderr
    assert "notify nobody" in r.stderr  # the shipped spec's bare people receiver, allowed explicitly
    first = yaml.safe_load(out.read_text())["route"]["routes"][0]
    assert first["matchers"] == ['fusebox="multimodal-inference"']


def test_collect_refuses_a_time_outside_the_scenario():
    r = _fusebox("collect", "scenario", "--once-at", "999")
    assert r.returncode == 2 and "outside the scenario (0..300 s" in r.stderr


def test_demo_refuses_a_speed_out_of_range(tmp_path):
    r = _fusebox("demo", "--once", "--speed", "0", "--spec", SPEC, "--workdir", tmp_path / "w")
    assert (r.returncode, r.stdout) == (2, "")
    assert "--speed 0 is out of range" in r.stderr


def test_backtest_refuses_a_missing_recording(tmp_path):
    r = _fusebox("backtest", "--openmetrics", tmp_path / "none.om", "--spec", SPEC)
    assert r.returncode == 2 and f"{tmp_path / 'none.om'}: no such file" in r.stderr
