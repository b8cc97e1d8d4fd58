"""The spec: units, defaults and overrides, and every class of bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _support import ROOT, SPEC

from fusebox.spec import SpecError, parse_spec
from fusebox.spec.units import parse_duration, parse_quantity

BASE = SPEC.read_text(encoding="utf-8")


@pytest.mark.parametrize("text,unit,expected", [
    ("78.3%", "ratio", 0.783),
    ("72.0%", "ratio", 0.72),
    (0.783, "ratio", 0.783),
    ("1.28s", "seconds", 1.28),
    ("850ms", "seconds", 0.85),
    ("14.7 MB/s", "bytes_per_second", 14_700_000),          # SI: 1 MB = 10^6 bytes
    ("9.2 MB/s", "bytes_per_second", 9_200_000),
    ("14.7 MiB/s", "bytes_per_second", 15_414_067.2),       # 14.7 x 2^20 (docs/pitfalls.md P3)
    ("8.7 GB/min", "bytes_per_second", 145_000_000),        # 8.7e9 / 60
])
def test_thresholds_are_converted_to_base_units(text, unit, expected):
    assert parse_quantity(text, unit) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("text,unit", [("1.28s", "ratio"), ("78.3%", "seconds"), ("14.7 MB", "bytes_per_second"),
                                       ("fast", "seconds"), (1.28, "seconds"), (78.3, "ratio"),
                                       ("78.3", "ratio"), ("178.3%", "ratio")])
def test_wrong_units_are_rejected(text, unit):
    with pytest.raises(ValueError):
        parse_quantity(text, unit)


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("1m", 60), ("1h30m", 5400), ("0s", 0), ("250ms", 0.25)])
def test_prometheus_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_shipped_spec_holds_the_seed_figures(spec):
    expected = {
        # signal: alert, {tier: threshold in base units}, critical fuse action
        "gpu_memory_utilization": ("GPUMemoryUtilizationHigh", {"warning": 0.72, "critical": 0.783}, "freeze_admissions"),
        "alignment_latency_p95": ("AlignmentLatencyP95High", {"warning": 0.85, "critical": 1.28}, "text_only_fallback"),
        "kv_cache_growth_rate": ("KVCacheGrowthRateHigh", {"warning": 9.2e6, "critical": 14.7e6}, "kv_cache_eviction"),
    }
    for name, (alert, thresholds, action) in expected.items():
        sig = spec.signal(name)
        assert sig.alert == alert
        assert {t.name: t.threshold for t in sig.tiers} == pytest.approx(thresholds)
        crit = next(t for t in sig.tiers if t.name == "critical")
        assert crit.fuse == action
        assert [t for t in sig.tiers if t.name == "warning"][0].fuse is None
    assert spec.signal("memory_bandwidth_saturation").tiers[0].threshold == pytest.approx(0.92)
    assert spec.signal("memory_bandwidth_saturation").tiers[0].for_s == 60
    assert spec.signal("kv_cache_growth_oom").tiers[0].threshold == pytest.approx(8.7e9 / 60)
    assert spec.signal("pcie_link_utilization").tiers[0].threshold == pytest.approx(0.95)
    assert spec.signal("pcie_link_utilization").tiers[0].for_s == 3
    assert {a.name: a.level for a in spec.actions.values()} == {
        "freeze_admissions": 1, "text_only_fallback": 2, "kv_cache_eviction": 3}


def test_overrides_change_one_tier_without_forking(spec):
    text = BASE.replace("overrides: []", """overrides:
  - alert: GPUMemoryUtilizationHigh
    tier: critical
    threshold: 80%
    for: 2m
    severity: page
  - alert: KVCacheGrowthRateHigh
    tier: warning
    enabled: false
""")
    s = parse_spec(text, "fusebox.yaml")
    gpu = {t.name: t for t in s.signal("gpu_memory_utilization").tiers}
    assert gpu["critical"].threshold == pytest.approx(0.80)
    assert gpu["critical"].for_s == 120
    assert gpu["critical"].severity == "page"
    assert gpu["warning"].threshold == pytest.approx(0.72)  # untouched
    assert [t.name for t in s.signal("kv_cache_growth_rate").tiers] == ["critical"]


def _line_of(text: str, needle: str, nth: int = 1) -> int:
    count = 0
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            count += 1
            if count == nth:
                return i
    raise AssertionError(needle)


BAD = {
    # name: (replace old, new, needle on the reported line, words in the message)
    "yaml error": ("  evaluation_interval: 5s", "  evaluation_interval: [5s", None, "YAML syntax error"),
    "misspelled for_": ("        threshold: 72.0%        # seed: safe level\n        for: 1m", "        threshold: 72.0%        # seed: safe level\n        for_: 1m", "for_: 1m", "unknown key 'for_'"),
    "ratio without percent": ("threshold: 78.3%", 'threshold: "78.3"', 'threshold: "78.3"', "outside 0..1"),
    "unknown key": ("  scrape_interval: 5s", "  scrape_interval: 5s\n  scrape_intervall: 5s", "scrape_intervall", "unknown key 'scrape_intervall'"),
    "wrong unit": ("threshold: 78.3%", "threshold: 78.3 MB/s", "threshold: 78.3 MB/s", "wrong unit"),
    "warning above critical": ("threshold: 72.0%", "threshold: 80%", "threshold: 78.3%", "not below critical"),
    "quantile off the buckets": ("threshold: 1.28s", "threshold: 1.3s", "threshold: 1.3s", "not a histogram bucket boundary"),
    "malformed duration": ("    for: 30s\n        fuse: freeze_admissions", "    for: 30 seconds\n        fuse: freeze_admissions", "for: 30 seconds", "malformed duration"),
    "duplicate signal name": ("  alignment_latency_p95:\n", "  gpu_memory_utilization:\n", None, "duplicate key 'gpu_memory_utilization'"),
    "duplicate alert name": ("alert: KVCacheGrowthRateHigh", "alert: GPUMemoryUtilizationHigh", ("alert: GPUMemoryUtilizationHigh", 2), "duplicate alert name"),
    "invalid promql": ("        metric: fusebox_gpu_memory_bandwidth_utilization_ratio", "        expr: sum(rate(x[5m]) by", "expr: sum(rate(x[5m]) by", "invalid PromQL"),
    "deriv window too short": ("    window: 1m\n    sources:\n      fusebox:\n        metric: fusebox_kv_cache_usage_bytes\n        note",
                               "    window: 10s\n    sources:\n      fusebox:\n        metric: fusebox_kv_cache_usage_bytes\n        note",
                               "window: 10s", "under 4 scrape intervals"),
}


@pytest.mark.parametrize("old, new, hint", [
    ("        threshold: 95%", "        threshold: 95%\n        treshold: 90%", "did you mean 'threshold'?"),
    ("  scrape_interval: 5s", "  scrape_interval: 5s\n  scrape_intervall: 5s", "did you mean 'scrape_interval'?"),
    ("overrides: []", "overrides:\n  - alert: GPUPCIeLinkSaturated\n    fro: 1m\n", "did you mean 'for'?"),  # the alias
    ("  collectors:\n    enabled: true", "  collectors:\n    enabeld: true\n    enabled: true", "did you mean 'enabled'?"),
])
def test_an_unknown_key_suggests_the_nearest_field(old, new, hint):
    assert old in BASE
    with pytest.raises(SpecError) as ei:
        parse_spec(BASE.replace(old, new, 1), "bad.yaml")
    (p,) = [p for p in ei.value.problems if "unknown key" in p.what]
    assert p.fix.startswith(hint), p


def test_an_unknown_key_far_from_every_field_gets_no_guess():
    with pytest.raises(SpecError) as ei:
        parse_spec(BASE.replace("  scrape_interval: 5s", "  scrape_interval: 5s\n  zzzzzz: 1", 1), "bad.yaml")
    assert "did you mean" not in str(ei.value)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_spec_points_at_file_line_and_column(case):
    old, new, needle, words = BAD[case]
    assert old in BASE, old
    text = BASE.replace(old, new, 1)
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "bad.yaml")
    msgs = [str(p) for p in ei.value.problems]
    hit = [m for m in msgs if words in m]
    assert hit, msgs
    p = next(p for p in ei.value.problems if words in str(p))
    assert p.path == "bad.yaml" and " -- " in str(p) and p.fix
    if needle:
        needle, nth = needle if isinstance(needle, tuple) else (needle, 1)
        assert p.line == _line_of(text, needle, nth), (p, needle)


def test_cli_exits_2_and_leaves_output_untouched(tmp_path):
    out = tmp_path / "out"
    (out / "rules").mkdir(parents=True)
    keep = out / "rules" / "fusebox.rules.yml"
    keep.write_text("# hand-made, must survive\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(BASE.replace("threshold: 78.3%", "threshold: 78.3 MB/s"))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "generate", "--spec", str(bad), "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    line = _line_of(bad.read_text(), "threshold: 78.3 MB/s")
    assert f"{bad}:{line}:" in r.stderr and "wrong unit" in r.stderr and " -- " in r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert keep.read_text() == "# hand-made, must survive\n"


def test_missing_spec_file_is_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "generate", "--spec", str(tmp_path / "nope.yaml"),
                        "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"fusebox generate: {tmp_path / 'nope.yaml'}: no such file -- pass --spec PATH"), r.stderr


def test_quantile_threshold_needs_a_bucket_above_it():
    text = BASE.replace("buckets: [0.05, 0.1, 0.25, 0.5, 0.75, 0.85, 1.0, 1.28, 1.5, 2.0, 2.5, 5.0, 10.0]",
                        "buckets: [0.05, 0.1, 0.25, 0.5, 0.75, 0.85, 1.0, 1.28]")
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "bad.yaml")
    assert any("highest bucket bound" in str(p) for p in ei.value.problems)


@pytest.mark.parametrize("old, new, what, fix", [
    # a bare number on a ratio: the hint names the percentage once
    ("threshold: 78.3%", "threshold: 78.3", "a bare ratio must lie in 0..1 (got 78.3)", "'78.3%'"),
    ("threshold: 78.3%", 'threshold: "78.3"', "'78.3' is 78.3 as a ratio, outside 0..1", "'78.3%'"),
    # a bare number on seconds: its unit, once
    ("threshold: 1.28s", "threshold: 1.28", "a bare number is ambiguous for a seconds threshold", "'1.28s'"),
    # a decimal comma is refused, never read as a thousands separator (78,3% is not 783%)
    ("threshold: 78.3%", "threshold: 78,3%", "'78,3%' has a decimal comma", "'78.3%'"),
    ("threshold: 1.28s", "threshold: 1,28s", "'1,28s' has a decimal comma", "'1.28s'"),
    ("threshold: 14.7 MB/s", "threshold: 14,7 MB/s", "'14,7 MB/s' has a decimal comma", "'14.7 MB/s'"),
    ("threshold: 14.7 MB/s", "threshold: 14,700 kB/s", "'14,700 kB/s' has a comma", "'14700 kB/s'"),
])
def test_a_threshold_hint_is_said_once(old, new, what, fix):
    text = BASE.replace(old, new, 1)
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "bad.yaml")
    (p,) = ei.value.problems
    assert p.line == _line_of(text, new)
    assert p.what.startswith(what), p.what
    assert fix in p.fix
    assert str(p).count(fix) == 1, str(p)
