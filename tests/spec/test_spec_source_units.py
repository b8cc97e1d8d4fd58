"""A source whose unit cannot give the signal's unit is a spec error at its line (issue 21, item 2).

vLLM's ``vllm:kv_cache_usage_perc`` is a fraction 0-1 despite its name (docs/metrics.md section 1):
``deriv`` of it is a fraction per second, so a KV-growth signal in bytes per second reading it
(``deriv(...) >= 9200000``) could never fire. dcgm-exporter's utilizations are percent 0-100 and its
FB_* fields MiB: read with no scale they compare a ratio or byte threshold against the wrong number.
"""

from __future__ import annotations

import pytest
from _cli import run_cli
from _support import SPEC, yaml_data, yaml_text

from fusebox.spec import parse_spec
from fusebox.spec.errors import SpecError


def _spec_with(signal: str, source: dict, **fields) -> str:
    data = yaml_data(SPEC.read_text())
    sig = data["signals"][signal]
    sig["sources"] = {"engine": source}
    sig["source"] = "engine"
    sig.update(fields)
    return yaml_text(data, sort_keys=False)


def test_a_fraction_read_as_bytes_per_second_is_refused_at_its_line(tmp_path):
    text = _spec_with("kv_cache_growth_rate", {"metric": "vllm:kv_cache_usage_perc"})
    spec_file = tmp_path / "fusebox.yaml"
    spec_file.write_text(text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "metric: vllm:kv_cache_usage_perc" in ln)
    out = tmp_path / "out"
    r = run_cli("generate", "--spec", str(spec_file), "--out", str(out))
    assert r.returncode == 2, r.stderr
    assert f"{spec_file}:{line}:" in r.stderr
    assert "fraction" in r.stderr and "bytes per second" in r.stderr
    assert "fusebox_kv_cache_usage_bytes" in r.stderr  # how to fix: read KV bytes
    assert not out.exists() or not any(out.rglob("*")), "nothing half-written"


@pytest.mark.parametrize("signal, source, fields, words", [
    # deriv of a fraction, scaled or not: each engine's pool differs, no constant makes it bytes
    ("kv_cache_growth_rate", {"metric": "vllm:kv_cache_usage_perc", "scale": 4294508544}, {}, "fraction"),
    ("kv_cache_growth_rate", {"metric": "sglang_token_usage"}, {}, "fraction"),
    # a percent gauge on a ratio signal without scale 0.01: 72% would compare against 0-100
    ("memory_bandwidth_saturation", {"metric": "DCGM_FI_DEV_MEM_COPY_UTIL"}, {}, "scale: 0.01"),
    # a latency histogram for a byte signal
    ("alignment_latency_p95", {"metric": "vllm:kv_cache_usage_perc"}, {}, "fraction"),
])
def test_a_source_that_cannot_give_the_signals_unit_is_refused(signal, source, fields, words):
    with pytest.raises(SpecError) as e:
        parse_spec(_spec_with(signal, source, **fields), "fusebox.yaml")
    [problem] = [p for p in e.value.problems if "sources.engine.metric" in p.path or source["metric"] in p.what]
    assert words in f"{problem.what} -- {problem.fix}"


@pytest.mark.parametrize("signal, source", [
    ("kv_cache_growth_rate", {"metric": "fusebox_kv_cache_usage_bytes"}),
    ("memory_bandwidth_saturation", {"metric": "DCGM_FI_DEV_MEM_COPY_UTIL", "scale": 0.01}),
    ("memory_bandwidth_saturation", {"metric": "DCGM_FI_PROF_DRAM_ACTIVE"}),
    ("memory_bandwidth_saturation", {"metric": "sglang:token_usage"}),
    ("alignment_latency_p95", {"metric": "vllm:request_prefill_time_seconds"}),
    ("memory_bandwidth_saturation", {"metric": "my_own_gauge"}),  # unit unknown: not judged
])
def test_a_source_in_a_unit_the_kind_can_give_is_accepted(signal, source):
    spec = parse_spec(_spec_with(signal, source), "fusebox.yaml")
    assert spec.signal(signal).source.metric == source["metric"]
