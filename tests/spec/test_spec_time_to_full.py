"""Time to full as a signal kind (issue 25, item 1): seconds until an engine's KV pool or a GPU's
memory is full at its current growth, (capacity - used) / deriv(used), with no sample where the
pool does not grow; tiers fire when the time left is at or BELOW the threshold.

The spec side (which sources are accepted, which refused, at their line), the generated promtool
and vmalert-tool cases on the dcgm backend (the shipped spec's own are run by
test_generator_promtool.py and test_generator_rule_engines.py), and that those cases can fail: a rule
without the growth filter (``> 0``) breaks the steady, shrinking and restart cases. The values a
pool gives are computed by hand in tests/promtool/time_to_full.test.yml."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from _support import SPEC, need, promtools, trimmed_spec, yaml_data, yaml_text

from fusebox.generator.outputs import render_all
from fusebox.generator.writer import write_outputs
from fusebox.spec import parse_spec
from fusebox.spec.errors import SpecError
from fusebox.tooling import ToolMissing, victoriametrics_tool

KV, GPU = "kv_cache_time_to_full", "gpu_memory_time_to_full"


def _spec_with(signal: str, sources: dict | None = None, **fields) -> str:
    data = yaml_data(SPEC.read_text())
    sig = data["signals"][signal]
    if sources is not None:
        sig["sources"] = sources
        sig["source"] = next(iter(sources))
    sig.update({k: v for k, v in fields.items() if v is not None})
    for k in (k for k, v in fields.items() if v is None):  # None: leave the key out
        del sig[k]
    return yaml_text(data, sort_keys=False)


def _line_of(text: str, signal: str, needle: str) -> int:
    """The line of the first ``needle`` after the signal's own key."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip() == f"{signal}:")
    return next(i for i, ln in enumerate(lines[start:], start + 1) if ln.strip() == needle)


def _problems(text: str) -> list:
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    return e.value.problems


# ------------------------------------------------------------------------------ the spec
def test_the_shipped_spec_has_time_to_full_tiers_for_kv_and_gpu_memory():
    spec = parse_spec(SPEC.read_text(), "fusebox.yaml")
    kv, gpu = spec.signal(KV), spec.signal(GPU)
    assert (kv.kind, kv.unit, kv.direction, kv.level) == ("time_to_full", "seconds", "below", "engine")
    assert (gpu.kind, gpu.unit, gpu.direction, gpu.level) == ("time_to_full", "seconds", "below", "gpu")
    assert {t.name: (t.threshold, t.fuse) for t in kv.tiers} == {"warning": (300.0, None), "critical": (60.0, "kv_cache_eviction")}
    assert {t.name: (t.threshold, t.fuse) for t in gpu.tiers} == {"warning": (300.0, None), "critical": (45.0, "freeze_admissions")}
    assert (kv.source.metric, kv.source.capacity) == ("fusebox_kv_cache_usage_bytes", "fusebox_kv_cache_limit_bytes")
    assert (gpu.sources["dcgm"].metric, gpu.sources["dcgm"].free) == ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")


def test_the_alert_compares_downwards():
    from fusebox.generator.render_rules import render_rules

    rules = render_rules(parse_spec(SPEC.read_text(), "fusebox.yaml"))
    exprs = {(r["alert"], r["labels"]["severity"]): r["expr"] for g in rules.groups for r in g["rules"]
             if r.get("alert") == "KVCacheTimeToFullLow"}
    assert exprs == {("KVCacheTimeToFullLow", "warning"): "engine:fusebox_kv_cache_time_to_full:seconds_deriv1m <= 300",
                     ("KVCacheTimeToFullLow", "critical"): "engine:fusebox_kv_cache_time_to_full:seconds_deriv1m <= 60"}


@pytest.mark.parametrize("signal, sources", [
    (KV, {"fusebox": {"metric": "fusebox_kv_cache_usage_bytes", "capacity": "fusebox_kv_cache_limit_bytes"}}),
    (KV, {"vllm": {"metric": "vllm:kv_cache_usage_perc"}}),  # a fraction: capacity 1
    (KV, {"sglang": {"metric": "sglang_token_usage"}}),
    (KV, {"sglang": {"metric": "sglang:num_used_tokens", "capacity": "sglang:max_total_num_tokens"}}),  # tokens / tokens
    (GPU, {"fusebox": {"metric": "hw_gpu_memory_usage_bytes", "capacity": "hw_gpu_memory_limit_bytes"}}),
    (GPU, {"dcgm": {"metric": "DCGM_FI_DEV_FB_USED", "free": "DCGM_FI_DEV_FB_FREE"}}),  # MiB / MiB
    (GPU, {"mine": {"metric": "my_used", "capacity": "my_total"}}),  # units unknown: not judged
])
def test_pool_sources_in_one_unit_are_accepted(signal, sources):
    spec = parse_spec(_spec_with(signal, sources), "fusebox.yaml")
    assert spec.signal(signal).source.metric == next(iter(sources.values()))["metric"]


@pytest.mark.parametrize("sources, key, words", [
    # bytes with no pool size: the time left is unknown
    ({"fusebox": {"metric": "fusebox_kv_cache_usage_bytes"}}, "metric", "add 'capacity: METRIC'"),
    # a fraction has capacity 1
    ({"vllm": {"metric": "vllm:kv_cache_usage_perc", "capacity": "fusebox_kv_cache_limit_bytes"}}, "capacity", "its capacity is 1"),
    # bytes against MiB: off by 2^20
    ({"dcgm": {"metric": "hw_gpu_memory_usage_bytes", "free": "DCGM_FI_DEV_FB_FREE"}}, "free", "a size in MiB"),
    # both ways of giving the pool
    ({"fusebox": {"metric": "fusebox_kv_cache_usage_bytes", "capacity": "fusebox_kv_cache_limit_bytes",
                  "free": "fusebox_kv_cache_free_bytes"}}, "free", "not both"),
    # a time or a byte rate is no amount that fills a pool
    ({"fusebox": {"metric": "fusebox_alignment_duration_seconds", "capacity": "x_seconds"}}, "metric", "a time in seconds"),
    ({"fusebox": {"metric": "DCGM_FI_PROF_PCIE_TX_BYTES", "capacity": "y"}}, "metric", "a byte rate"),
    # a pool metric that is no metric name
    ({"fusebox": {"metric": "fusebox_kv_cache_usage_bytes", "capacity": "limit bytes"}}, "capacity", "not a valid Prometheus metric name"),
])
def test_pool_sources_that_give_no_time_are_refused_at_their_key(sources, key, words):
    [(backend, src)] = sources.items()
    text = _spec_with(KV, sources)
    line = _line_of(text, KV, f"{key}: {src[key]}")
    problems = _problems(text)
    assert any(p.line == line and words in f"{p.what} -- {p.fix}" for p in problems), [str(p) for p in problems]


def test_the_direction_must_be_written_below():
    [p] = [p for p in _problems(_spec_with(KV, direction=None)) if "BELOW" in p.what]
    assert p.fix == "write 'direction: below'"
    text = _spec_with(KV, direction="above")
    [p] = [p for p in _problems(text) if "BELOW" in p.what]
    assert p.line == _line_of(text, KV, "direction: above")
    # and no advice on the tiers' order for an upper bound (it would reverse them)
    assert not [p for p in _problems(text) if "upper bound" in p.what], [str(p) for p in _problems(text)]


def test_a_time_to_full_signal_is_in_seconds_with_positive_thresholds():
    assert any("in seconds, not ratio" in p.what for p in _problems(_spec_with(KV, unit="ratio")))
    data = yaml_data(SPEC.read_text())
    data["signals"][KV]["tiers"]["critical"]["threshold"] = "0s"
    text = yaml_text(data, sort_keys=False)
    [p] = _problems(text)
    assert "positive" in p.what and p.line == _line_of(text, KV, "threshold: 0s")


def test_capacity_on_another_kind_is_refused():
    sources = {"fusebox": {"metric": "fusebox_kv_cache_usage_bytes", "capacity": "fusebox_kv_cache_limit_bytes"}}
    [p] = _problems(_spec_with("kv_cache_growth_rate", sources))
    assert "belong to time_to_full signals" in p.what


def test_the_error_names_the_file_and_line():
    text = _spec_with(KV, {"fusebox": {"metric": "fusebox_kv_cache_usage_bytes"}})
    [p] = _problems(text)
    assert str(p).startswith(f"fusebox.yaml:{_line_of(text, KV, 'metric: fusebox_kv_cache_usage_bytes')}:"), str(p)


# ---------------------------------------------------------------------- generated cases
def test_the_generated_cases_cover_steady_growing_shrinking_idle_and_restart():
    from fusebox.generator.render_rules import render_rules
    from fusebox.generator.render_tests import render_rule_tests

    spec = parse_spec(SPEC.read_text(), "fusebox.yaml")
    titles = [t for t, _ in render_rule_tests(spec, render_rules(spec), "fusebox.rules.yml")]
    for alert in ("KVCacheTimeToFullLow", "GPUMemoryTimeToFullLow"):
        mine = [t for t in titles if t.startswith(alert)]
        for words in ("steady pool", "shrinking pool", "no traffic", "restart", "critical: ", "warning: "):
            assert any(words in t for t in mine), (alert, words, mine)


def _generate(tmp_path: Path, text: str) -> Path:
    write_outputs(render_all(parse_spec(text, "fusebox.yaml")), tmp_path)
    return tmp_path / "rules"


def _vmalert_tool() -> str:
    try:
        return need(str(victoriametrics_tool("vmalert-tool")))
    except ToolMissing as e:
        return need("vmalert-tool", str(e))


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600)


DCGM_TEXT = SPEC.read_text().replace("  source: fusebox\n", "  source: dcgm\n", 1)


@pytest.mark.tools
@pytest.mark.parametrize("which", [0, 1], ids=["promtool-2.42", "promtool-3"])
def test_dcgm_time_to_full_cases_pass_promtool(tmp_path, which):
    rules = _generate(tmp_path, trimmed_spec(DCGM_TEXT, "gpu_memory_time_to_full"))  # the tools' run in seconds
    text = (rules / "fusebox.rules.test.yml").read_text()
    assert "DCGM_FI_DEV_FB_FREE" in text and "GPUMemoryTimeToFullLow: an engine restart" in text
    r = _run([promtools()[which], "test", "rules", "fusebox.rules.test.yml"], rules)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.tools
def test_dcgm_time_to_full_cases_pass_vmalert_tool(tmp_path):
    rules = _generate(tmp_path, trimmed_spec(DCGM_TEXT, "gpu_memory_time_to_full"))
    r = _run([_vmalert_tool(), "unittest", "--files=fusebox.rules.vmalert.test.yml"], rules)
    assert r.returncode == 0 and "FAILED" not in r.stdout, r.stdout + r.stderr


@pytest.mark.tools
def test_the_cases_fail_when_flat_pools_give_a_sample(tmp_path):
    """Without the growth filter a flat pool reads +Inf and a shrinking one a negative time, which
    is below every threshold: the generated cases must catch it."""
    rules = _generate(tmp_path, trimmed_spec(SPEC.read_text(), "kv_cache_time_to_full"))
    path = rules / "fusebox.rules.yml"
    text = path.read_text()
    broken, n = re.subn(r"(deriv\(fusebox_kv_cache_usage_bytes\[1m\])\) > 0\)", r"\1))", text)
    assert n == 1
    path.write_text(broken)
    r = _run([promtools()[1], "test", "rules", "fusebox.rules.test.yml"], rules)
    assert r.returncode != 0
    assert "KVCacheTimeToFullLow" in r.stdout + r.stderr
