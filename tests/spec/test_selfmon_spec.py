"""fuse.self_monitoring: its validation (file:line:col errors) and what turning it off removes."""

from __future__ import annotations

import pytest
from _support import SPEC

from fusebox.generator.render_alertmanager import render_alertmanager
from fusebox.generator.render_rules import render_rules
from fusebox.spec import SpecError, parse_spec

ANCHOR = "  allow_fleet_wide_alerts: false\n"


def _with(block: str) -> str:
    text = SPEC.read_text()
    assert ANCHOR in text
    return text.replace(ANCHOR, ANCHOR + "  self_monitoring:\n" + block, 1)


def _line(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


@pytest.mark.parametrize("block, needle, what", [
    ("    heartbeat_interval: 1m\n    heartbeat_silent_after: 2m\n", "heartbeat_silent_after: 2m", "under three heartbeat intervals"),
    ("    max_pending_action_age: 2 minutes\n", "max_pending_action_age: 2 minutes", "malformed duration"),
    ("    heartbeat_interval: 0s\n", "heartbeat_interval: 0s", "must be positive"),
    ("    max_pending_action_age: 5s\n", "max_pending_action_age: 5s", "under two scrape intervals"),
    ("    fuse_selector: {job-name: x}\n", "fuse_selector:", "invalid label name"),
], ids=["silence within two heartbeats", "malformed", "zero interval", "shorter than two scrapes", "bad label"])
def test_bad_self_monitoring_settings_are_line_anchored_errors(block, needle, what):
    text = _with(block)
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    line = _line(text, needle)
    assert any(p.line == line and what in p.what for p in e.value.problems), str(e.value)
    assert all(str(p).startswith(f"fusebox.yaml:{p.line}:") and " -- " in str(p) for p in e.value.problems)


def test_the_defaults_watch_the_job_the_generated_servicemonitor_gives_the_fuse():
    spec = parse_spec(SPEC.read_text(), "fusebox.yaml")
    m = spec.self_monitoring
    # the ServiceMonitor's job is its Service's name, fusebox-fuse (k8s/fuse.yml), as in compose and the demo
    assert m.fuse_selector == {"job": "fusebox-fuse"}
    assert (m.heartbeat_interval_s, m.heartbeat_silent_after_s, m.max_pending_action_age_s, m.down_for_s) == (60, 300, 120, 120)
    group = next(g for g in render_rules(spec).groups if g["name"] == "fusebox-self")
    assert ('up{job="fusebox-fuse"} == 0 or label_replace(absent(up{job="fusebox-fuse"}), "instance", "no target", "", "")'
            in [r["expr"] for r in group["rules"]])


def test_turned_off_there_is_no_self_group_and_no_heartbeat_route():
    spec = parse_spec(_with("    enabled: false\n"), "fusebox.yaml")
    assert "fusebox-self" not in [g["name"] for g in render_rules(spec).groups]
    routes = render_alertmanager(spec)["route"]["routes"][0]["routes"]
    assert not any("FuseboxHeartbeat" in str(r.get("matchers")) for r in routes)
