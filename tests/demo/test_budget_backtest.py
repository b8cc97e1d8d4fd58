"""`fusebox budget` and `fusebox backtest` agree on when a tier fires (issue 33, point 8).

At kube-prometheus-stack's 30 s scrape and evaluation intervals the shipped KVCacheTimeToFullLow
critical tier keeps its ``for: 15s``: shorter than its group's interval. Prometheus (and vmalert)
fire a pending alert at the first evaluation at least ``for`` after it went pending, so it fires
30 s after, not 15 s. The budget's ``eval + for`` terms (the floor without the scrape, the
notification and the fuse) must bound what the real engines do from the first sample showing the
crossing, and by no more than one evaluation interval.

The recording is written here with sample times chosen by hand: one engine's KV pool (10 GB)
filling at 1 MB/s, a sample every 30 s, each one second after an evaluation (the worst phase:
the crossing sample waits 29 s for the next evaluation). Its time left at each sample is
(10 GB - used) / 1 MB/s, falling 30 s per sample: 75 s, then 45 s at ``T_C``, the first at or
below the tier's 60 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _support import spec_text_at_30s

from fusebox.backtest import backtest
from fusebox.backtest.recording import read_openmetrics
from fusebox.generator.budget import budget_rows
from fusebox.spec import load_spec
from fusebox.tooling import victoriametrics_tool

pytestmark = [pytest.mark.tools]

INTERVAL = 30
POOL = 10_000_000_000  # bytes
GROWTH = 1_000_000  # bytes per second
GRID = (1_700_000_000 // INTERVAL) * INTERVAL  # an evaluation of every 30 s group
S0 = GRID + 1  # the first sample, one second after an evaluation
N = 24
T_C = S0 + 19 * INTERVAL  # time left 615 - 30 k: 45 s at k = 19, 75 s before
LABELS = 'cluster="c1",engine="engine-0",host_name="node-1",instance="node-1:9411",job="fusebox-kv",model="m"'


def _spec_30s(tmp_path: Path) -> Path:
    path = tmp_path / "fusebox-30s.yaml"
    path.write_text(spec_text_at_30s())
    return path


def _recording(path: Path) -> None:
    used = [(S0 + INTERVAL * k, POOL - (615 - INTERVAL * k) * GROWTH) for k in range(N)]
    assert [(POOL - u) // GROWTH for t, u in used if t in (T_C - INTERVAL, T_C)] == [75, 45]
    lines = ["# TYPE fusebox_kv_cache_usage_bytes gauge"]
    lines += [f"fusebox_kv_cache_usage_bytes{{{LABELS}}} {u} {t}" for t, u in used]
    lines.append("# TYPE fusebox_kv_cache_limit_bytes gauge")
    lines += [f"fusebox_kv_cache_limit_bytes{{{LABELS}}} {POOL} {t}" for t, _u in used]
    path.write_text("\n".join(lines) + "\n# EOF\n")


def test_budget_and_backtest_agree_on_a_for_under_the_evaluation_interval(tmp_path):
    victoriametrics_tool("victoria-metrics"), victoriametrics_tool("vmalert")  # ToolMissing fails, never skips
    spec_path = _spec_30s(tmp_path)
    spec = load_spec(spec_path)
    sig = spec.signal("kv_cache_time_to_full")
    (tier,) = [t for t in sig.tiers if t.name == "critical"]
    assert (spec.evaluation_interval_s, tier.for_s) == (INTERVAL, 15.0)  # a `for` under the interval
    (row,) = [r for r in budget_rows(spec) if (r.alert, r.tier) == (sig.alert, "critical")]
    to_fire = row.terms["eval"] + row.terms["records"] + row.terms["for"] + row.terms["lag"]

    rec_path = tmp_path / "pool.om"
    _recording(rec_path)
    result = backtest(spec_path, read_openmetrics(rec_path), hold_s=10.0)
    (ep,) = [a for a in result.alerts if a.alertname == sig.alert and a.severity == tier.severity]
    # the engines: pending at the first evaluation after the crossing sample, firing one whole
    # evaluation later (15 s is not an evaluation)
    assert ep.pending_at == T_C + (INTERVAL - 1)
    assert ep.firing_at == ep.pending_at + INTERVAL
    # the budget: its for term is that wait, and eval + for bounds the firing within one interval
    assert row.terms["for"] == ep.firing_at - ep.pending_at
    fired_after = ep.firing_at - T_C
    assert fired_after <= to_fire <= fired_after + INTERVAL, (fired_after, row.terms)
