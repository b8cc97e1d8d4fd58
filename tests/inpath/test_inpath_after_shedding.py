"""A fuse tier that waits for the in-path shedders (``after_shedding: true``): replayed by
``fusebox backtest`` on the real engines (VictoriaMetrics + ``vmalert -replay``) and the fuse's own
breaker, over recordings written here with the gateway's admission counter as smg 1.13 and
sglang-router 0.3.2 publish it (``smg_http_rate_limit_total{result="allowed"|"rejected"}``, read from
both binaries' /metrics: tests/inpath/test_inpath_live.py checks the names on the running gateways).

The shipped spec with its GPU-memory critical tier (78.3 %, for 30 s, freeze_admissions) set to
wait. GPU memory goes one point over that line at T0 (a multiple of 60 s, on every evaluation grid):

* the gateway is scraped but refuses nothing: the fast path has not tried, the tier waits and
  the fuse does not trip (the same recording without the counter trips: the rule fails open where
  no gateway is scraped);
* the gateway refuses requests from T0 and memory stays up: the tier fires once its ``for`` has
  passed (one evaluation later at most) and the fuse trips once;
* the gateway refuses requests from T0 and memory is back under the line at T0 + 20 s, before
  ``for`` ends: shedding brought it back, no trip.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _support import SPEC
from test_backtest import SCOPE, T0, _gpu_signal, _json, _one, _tier, _write_breach

from fusebox import conventions as C
from fusebox.spec import load_spec
from fusebox.tooling import victoriametrics_tool

pytestmark = [pytest.mark.tools]


@pytest.fixture(scope="module", autouse=True)
def _engines_built():
    victoriametrics_tool("victoria-metrics"), victoriametrics_tool("vmalert")  # ToolMissing fails the module, never skips


@pytest.fixture(scope="module")
def waiting_spec(tmp_path_factory) -> Path:
    text = SPEC.read_text()
    start = text.index("\n  gpu_memory_utilization:\n")
    line = "        fuse: freeze_admissions\n"
    at = text.index(line, start) + len(line)
    path = tmp_path_factory.mktemp("spec") / "fusebox.yaml"
    path.write_text(text[:at] + "        after_shedding: true\n" + text[at:])
    return path


def _with_gateway(path: Path, spec, *, rejecting: bool, above_s: int) -> Path:
    """The breach of test_backtest (memory over the critical line from T0 for ``above_s``) plus the
    gateway's admission counter every 5 s: 10 admitted a second throughout, and 5 refused a second
    from T0 when ``rejecting`` (else none)."""
    _write_breach(path, spec, above_s=above_s)
    text = path.read_text().removesuffix("# EOF\n")
    lines = [f"# TYPE {C.GATEWAY_ADMISSIONS.removesuffix('_total')} counter"]
    for t in range(T0 - 120, T0 + 241, 5):
        lines.append(f'{C.GATEWAY_ADMISSIONS}{{result="allowed"}} {10 * (t - T0 + 120)} {t}')
        refused = 5 * (t - T0) if rejecting and t >= T0 else 0
        lines.append(f'{C.GATEWAY_ADMISSIONS}{{result="rejected"}} {refused} {t}')
    path.write_text(text + "\n".join(lines) + "\n# EOF\n")
    return path


def _critical(doc, spec):
    sig = _gpu_signal(spec)
    crit = _tier(sig, "critical")
    return [a for a in doc["alerts"] if a["alertname"] == sig.alert and a["severity"] == crit.severity], crit


def _assert_nothing_fired(capsys, rec, spec, waiting_spec):
    doc = _json(capsys, "--openmetrics", rec, "--spec", waiting_spec, "--hold", 10)
    fired, _ = _critical(doc, spec)
    assert all(a["firing_at"] is None for a in fired), fired
    assert [f for f in doc["fuse"] if f["action"] == "trip"] == []


def test_the_tier_waits_while_the_gateway_refuses_nothing(capsys, spec, waiting_spec, tmp_path):
    _assert_nothing_fired(capsys, _with_gateway(tmp_path / "quiet.om", spec, rejecting=False, above_s=150),
                          spec, waiting_spec)
    # the same memory without the gateway's counter in the recording: the rule fails open and trips
    bare = tmp_path / "bare.om"
    _write_breach(bare, spec, above_s=150)
    doc = _json(capsys, "--openmetrics", bare, "--spec", waiting_spec, "--hold", 10)
    assert [(f["level"], f["scope"]) for f in doc["fuse"] if f["action"] == "trip"] == [
        (spec.actions[_tier(_gpu_signal(spec), "critical").fuse].level, SCOPE)]


def test_the_tier_fires_once_shedding_has_not_brought_the_signal_back_for_its_for(capsys, spec, waiting_spec, tmp_path):
    rec = _with_gateway(tmp_path / "shedding.om", spec, rejecting=True, above_s=150)
    doc = _json(capsys, "--openmetrics", rec, "--spec", waiting_spec, "--hold", 10)
    fired, crit = _critical(doc, spec)
    a = _one(fired, fired[0]["alertname"], crit.severity)
    step = spec.evaluation_interval_s
    # memory over the line from T0, the refusals' rate from T0 + one sample: for 30 s after that
    assert T0 + crit.for_s <= a["firing_at"] <= T0 + crit.for_s + 2 * step
    trips = [f for f in doc["fuse"] if f["action"] == "trip"]
    assert [(f["level"], f["fuse_action"], f["scope"]) for f in trips] == [(spec.actions[crit.fuse].level, crit.fuse, SCOPE)]
    assert trips[0]["at"] == a["firing_at"] + spec.group_wait_critical_s


def test_no_trip_when_shedding_brings_the_signal_back_before_the_for_ends(capsys, spec, waiting_spec, tmp_path):
    _assert_nothing_fired(capsys, _with_gateway(tmp_path / "recovered.om", spec, rejecting=True, above_s=20),
                          spec, waiting_spec)


def test_the_waiting_spec_loads_and_its_tier_says_so(waiting_spec):
    sig = _gpu_signal(load_spec(waiting_spec))
    assert [t.name for t in sig.tiers if t.after_shedding] == ["critical"]
