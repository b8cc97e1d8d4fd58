"""Alignment-latency instrumentation: spec buckets, context manager, decorator, fallback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fusebox.collectors.export import Pipeline
from fusebox.collectors.latency import EngineHistogramFallback, alignment_timer, spec_buckets

ROOT = Path(__file__).resolve().parents[2]
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "collectors"


def buckets_of(pipe, engine="e1"):
    out = {}
    for fam in text_string_to_metric_families(pipe.prometheus_text()):
        for s in fam.samples:
            if s.name == "fusebox_alignment_duration_seconds_bucket" and s.labels.get("engine") == engine:
                out[s.labels["le"]] = s.value
    return out


@pytest.fixture
def pipe():
    return Pipeline("latency", (), histogram_buckets=spec_buckets(ROOT / "fusebox.yaml"), host="h")


def test_spec_buckets_bracket_every_latency_threshold():
    b = spec_buckets(ROOT / "fusebox.yaml")
    for thr in (0.85, 1.28):  # warning and critical of alignment_latency_p95 (docs/pitfalls.md P2)
        i = b.index(thr)
        assert 0 < i < len(b) - 1, "a threshold needs neighbours on both sides"


def test_context_manager_records_the_hand_off_into_the_spec_buckets(pipe):
    ticks = iter([10.0, 10.9])  # perf_counter before and after: 0.9 s
    with alignment_timer(engine="e1", model="m1", meter=pipe.meter, clock=lambda: next(ticks)) as t:
        pass
    assert t.elapsed == pytest.approx(0.9)
    b = buckets_of(pipe)
    assert b["0.85"] == 0 and b["1.0"] == 1 and b["+Inf"] == 1


def test_decorator_on_sync_and_async_functions_and_on_failure(pipe):
    @alignment_timer(engine="e1", model="m1", meter=pipe.meter)
    def align(x):
        return x * 2

    @alignment_timer(engine="e1", model="m1", meter=pipe.meter)
    async def align_async(x):
        return x + 1

    @alignment_timer(engine="e1", model="m1", meter=pipe.meter)
    def broken():
        raise RuntimeError("encoder failed")

    assert align(2) == 4
    assert asyncio.run(align_async(1)) == 2
    with pytest.raises(RuntimeError):
        broken()
    assert buckets_of(pipe)["+Inf"] == 3  # the failed hand-off is timed too


def test_pitfall_p2_alignments_at_2s_land_above_1_28(pipe):
    for _ in range(20):
        with alignment_timer(engine="e1", model="m1", meter=pipe.meter, clock=iter([0.0, 2.0]).__next__):
            pass
    b = buckets_of(pipe)
    # all 20 in (1.5, 2.0]: histogram_quantile(0.95) = 1.5 + 0.5 x 0.95 = 1.975 s > 1.28 (a breach seen)
    assert b["1.28"] == 0 and b["1.5"] == 0 and b["2.0"] == 20


def test_fallback_rebuckets_vllm_ttft_increases_and_says_which(pipe):
    real = (FIX / "datadog_vllm_metrics_fixture_opt-125m_v0-only_2024.txt").read_text()
    ttft = "vllm:time_to_first_token_seconds_bucket"
    before = "\n".join(l.replace("} 1.0", "} 0.0") if l.startswith(ttft) else l for l in real.splitlines())
    # later: 4 more first tokens in (1.0, 2.5]
    later = "\n".join(
        l.replace("} 1.0", "} 5.0") if l.startswith(ttft) and any(f'le="{x}"' in l for x in ("2.5", "5.0", "7.5", "10.0", "+Inf"))
        else l for l in real.splitlines())  # fmt: skip
    texts = iter([before, real, later])
    fb = EngineHistogramFallback(pipe.alignment, engine="e1", fetch=lambda _e, _t: next(texts))
    assert fb.poll() == 0  # baseline only
    assert fb.poll() == 1  # one observation in (0.25, 0.5] -> recorded at its middle, 0.375
    assert fb.source == "vllm:time_to_first_token_seconds"
    b = buckets_of(pipe)
    assert b["0.25"] == 0 and b["0.5"] == 1
    assert fb.poll() == 4  # spread at 1.1875, 1.5625, 1.9375, 2.3125
    b = buckets_of(pipe)
    assert (b["1.28"], b["1.5"], b["2.0"], b["2.5"]) == (2, 2, 4, 5)


def test_fallback_survives_a_down_engine(pipe):
    def down(_e, _t):
        raise ConnectionError("refused")

    fb = EngineHistogramFallback(pipe.alignment, engine="e1", fetch=down)
    assert fb.poll() == 0 and fb.errors == 1


def _dp_page(per_engine):
    """vLLM >= 0.10 text for data-parallel engine cores: {engine: (<=0.5, <=1.0, +Inf)} cumulative."""
    out = "# TYPE vllm:time_to_first_token_seconds histogram\n"
    for eng, counts in per_engine.items():
        for le, c in zip(("0.5", "1.0", "+Inf"), counts, strict=False):
            out += f'vllm:time_to_first_token_seconds_bucket{{engine="{eng}",le="{le}",model_name="m"}} {c}\n'
        out += f'vllm:time_to_first_token_seconds_count{{engine="{eng}",model_name="m"}} {counts[-1]}\n'
        out += f'vllm:time_to_first_token_seconds_sum{{engine="{eng}",model_name="m"}} 1\n'
    return out


def test_fallback_differences_each_data_parallel_engine_core_separately(pipe):
    # two DP engine cores (engine="0", "1") each gain 10 first tokens <= 0.5 s between polls:
    # 20 observations, none above 0.5 s (keying on model_name alone merged the two bucket
    # lists into one with duplicate le values and recorded 1310, ~500 of them in (1, 2] s)
    pages = iter([_dp_page({"0": (100, 100, 100), "1": (500, 500, 500)}),
                  _dp_page({"0": (110, 110, 110), "1": (510, 510, 510)})])
    fb = EngineHistogramFallback(pipe.alignment, engine="e1", fetch=lambda _e, _t: next(pages))
    assert fb.poll() == 0
    assert fb.poll() == 20
    b = buckets_of(pipe)
    # 20 spread evenly in (0, 0.5]: 0.0125, 0.0375, ... 0.4875 -> 2 <= 0.05, 4 <= 0.1, 10 <= 0.25
    assert (b["0.05"], b["0.1"], b["0.25"], b["0.5"], b["+Inf"]) == (2, 4, 10, 20, 20)
    # one fused series: engine = --engine-id, model = model_name; the DP rank is summed away
    fams = {s.labels["engine"] for f in text_string_to_metric_families(pipe.prometheus_text())
            for s in f.samples if s.name == "fusebox_alignment_duration_seconds_count"}
    assert fams == {"e1"}


def test_fallback_counter_reset_of_one_engine_core_leaves_the_other_alone(pipe):
    # engine "0" restarts (its counts fall to 3 <= 0.5 s and 2 in (0.5, 1.0]: all new);
    # engine "1" gains 10 <= 0.5 s and 2 in (0.5, 1.0]. Increases summed per bucket:
    # 13 in (0, 0.5], 4 in (0.5, 1.0] spread at 0.5625, 0.6875, 0.8125, 0.9375.
    pages = iter([_dp_page({"0": (100, 100, 100), "1": (500, 500, 500)}),
                  _dp_page({"0": (3, 5, 5), "1": (510, 512, 512)})])
    fb = EngineHistogramFallback(pipe.alignment, engine="e1", fetch=lambda _e, _t: next(pages))
    fb.poll()
    assert fb.poll() == 17
    b = buckets_of(pipe)
    assert (b["0.5"], b["0.75"], b["0.85"], b["1.0"], b["+Inf"]) == (13, 15, 16, 17, 17)
