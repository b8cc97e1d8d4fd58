"""The scenario: default timeline, values at chosen times worked out by hand from the YAML's
targets, predicted crossing order, the real collectors' output, and bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fusebox.collectors.export import Pipeline
from fusebox.collectors.scenario import ScenarioError, ScenarioRunner, default_scenario_path, load_scenario
from fusebox.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
MIB = 1_048_576
TOTAL = 81559 * MIB
GPU0, GPU1 = "GPU-5ca1ab1e-0000-4000-8000-000000000000", "GPU-5ca1ab1e-0000-4000-8000-000000000001"
ENGINE = "llava-decoder-0"


@pytest.fixture(scope="module")
def sc():
    return load_scenario()


@pytest.fixture(scope="module")
def crossings(sc):
    return sc.predict(load_spec(str(ROOT / "fusebox.yaml")))


def test_default_scenario_is_packaged_and_lasts_about_five_minutes(sc):
    assert default_scenario_path().name == "breach.yaml"
    assert [p.name for p in sc.phases] == ["baseline", "pressure", "breach", "recovery", "steady"]
    assert [(p.start_s, p.end_s) for p in sc.phases] == [(0, 45), (45, 105), (105, 195), (195, 255), (255, 300)]
    assert 240 <= sc.duration_s <= 300
    assert sc.phase_at(100).name == "pressure" and sc.phase_at(105).name == "breach"


def test_state_at_chosen_times_by_hand(sc):
    # GPU 0 ramps 55 % -> 76 % over pressure (45..105 s): at 75 s, 55 + 21 x 30/60 = 65.5 %
    assert sc.effective_memory_ratio(GPU0, 75) == pytest.approx(0.655)
    # KV: 8 GB + 1 MB/s x 45 s + 11 MB/s x 60 s = 8.705 GB at 105 s; + 18 MB/s x 45 s at 150 s
    assert sc.kv_used_bytes(ENGINE, 105) == pytest.approx(8.705e9)
    assert sc.kv_used_bytes(ENGINE, 150) == pytest.approx(9.515e9)
    # GPU 1 (decoder) holds a 52 GiB preallocated pool: device ~90 %, effective 25 % + KV used / total
    assert sc.device_memory_ratio(GPU1, 150) == pytest.approx((0.25 * TOTAL + 52 * 1024**3 // (16 * 524288) * 16 * 524288) / TOTAL)
    assert sc.effective_memory_ratio(GPU1, 150) == pytest.approx(0.25 + 9.515e9 / TOTAL)


def test_the_decoder_gpu_is_above_78_3_on_device_basis_but_never_effectively(sc):
    for t in range(0, 301, 5):
        assert sc.device_memory_ratio(GPU1, t) > 0.783
        assert sc.effective_memory_ratio(GPU1, t) < 0.72


def _first(crossings, signal, tier, event, entity=None):
    for c in crossings:
        if (c.signal, c.tier, c.event) == (signal, tier, event) and (entity is None or c.entity == entity):
            return c.time_s
    raise AssertionError(f"no {signal} {tier} {event}")


def test_gpu_memory_crossings_follow_the_ramp(crossings):
    # 72 %: 45 + 60 x (72 - 55) / (76 - 55) = 93.6 s -> first 5 s sample: 95 s
    assert _first(crossings, "gpu_memory_utilization", "warning", "above", GPU0) == 95
    # 78.3 %: 105 + 90 x (78.3 - 76) / (83 - 76) = 134.6 s -> 135 s
    assert _first(crossings, "gpu_memory_utilization", "critical", "above", GPU0) == 135
    # back under 78.3 %: 195 + 60 x (83 - 78.3) / (83 - 55) = 205.1 s -> 210 s
    assert _first(crossings, "gpu_memory_utilization", "critical", "below", GPU0) == 210
    assert not [c for c in crossings if c.entity == GPU1]


def test_every_signal_breaches_both_tiers_then_recovers_within_the_run(sc, crossings):
    for signal in ("gpu_memory_utilization", "kv_cache_growth_rate", "alignment_latency_p95"):
        w_above = _first(crossings, signal, "warning", "above")
        c_above = _first(crossings, signal, "critical", "above")
        c_fires = _first(crossings, signal, "critical", "fires")
        c_below = _first(crossings, signal, "critical", "below")
        w_res = _first(crossings, signal, "warning", "resolves")
        assert w_above <= c_above < c_fires < c_below <= w_res <= sc.duration_s, signal
        assert sc.phase_at(c_above).name in ("pressure", "breach")


def test_kv_growth_crosses_14_7_mb_s_only_while_growing_at_18_mb_s(crossings):
    t = _first(crossings, "kv_cache_growth_rate", "critical", "above")
    assert 105 < t < 165  # deriv over 1 m catches up with the 18 MB/s phase within its window


def test_the_runner_feeds_the_real_collectors_and_matches_the_timeline(sc):
    pipe = Pipeline("scenario", ScenarioRunner.KEYS, histogram_buckets=load_spec(str(ROOT / "fusebox.yaml"))
                    .signal("alignment_latency_p95").buckets, host=sc.host, cluster=sc.cluster)
    runner = ScenarioRunner(sc, pipe)
    runner.step(150)
    samples = {}
    for fam in text_string_to_metric_families(pipe.prometheus_text()):
        for s in fam.samples:
            samples.setdefault(s.name, []).append(s)
    usage = {s.labels["hw_id"]: s.value for s in samples["hw_gpu_memory_usage_bytes"]}
    # GPU 0 at 150 s: 76 % + 7 % x 45/90 = 79.5 % of 81559 MiB (no KV pool on it)
    assert usage[GPU0] == pytest.approx(0.795 * TOTAL, abs=1)
    kv = samples["fusebox_kv_cache_usage_bytes"][0]
    assert kv.labels["hw_id"] == GPU1 and kv.labels["engine"] == ENGINE and kv.value == pytest.approx(9.515e9)
    assert kv.labels["cluster"] == "demo" and kv.labels["host_name"] == "demo-node-0"
    count = [s.value for s in samples["fusebox_alignment_duration_seconds_count"]][0]
    assert count == 45 * 20 + 60 * 20 + 45 * 10  # observations per second x seconds, per phase
    buckets = {s.labels["le"]: s.value for s in samples["fusebox_alignment_duration_seconds_bucket"]}
    expect = sc.cumulative_buckets(ENGINE, 150, (0.85, 1.28))
    assert (buckets["0.85"], buckets["1.28"]) == (expect[0], expect[1])


def test_runner_announces_phases_in_order_at_any_speed(sc):
    pipe = Pipeline("scenario", ScenarioRunner.KEYS, histogram_buckets=(0.85, 1.28), host="h")
    said = []
    now = [0.0]
    ScenarioRunner(sc, pipe).run(speed=100.0, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                                 say=said.append)
    phases = [m.split("phase=")[1].split()[0] for m in said if "phase=" in m]
    assert phases == ["baseline", "pressure", "breach", "recovery", "steady"]
    assert now[0] == pytest.approx(300 / 100.0)
    assert said[-1] == "scenario t=300s done"


def test_cli_timeline_json_and_once_at(capsys):
    from fusebox.cli import main

    assert main(["collect", "scenario", "--timeline", "json", "--spec", str(ROOT / "fusebox.yaml")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in data["phases"]][0] == "baseline" and data["duration_s"] == 300
    assert any(c["event"] == "fires" and c["tier"] == "critical" for c in data["crossings"])
    assert main(["collect", "scenario", "--once-at", "150", "--spec", str(ROOT / "fusebox.yaml")]) == 0
    out = capsys.readouterr().out
    assert "# fusebox: scenario breach t=150s phase=breach" in out
    assert "fusebox_kv_cache_limit_bytes{" in out and 'le="1.28"' in out


def test_a_bad_scenario_points_at_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "kind: FuseboxScenario\n"
        "gpus:\n"
        "  - {uuid: GPU-1, index: 0, memory: 80 GB}\n"
        "phases:\n"
        "  - name: a\n"
        "    duration: 10s\n"
        "    gpu_memory: {7: 50%}\n"
        "  - name: b\n"
        "    duration: ten\n"
    )
    with pytest.raises(ScenarioError) as e:
        load_scenario(bad)
    msg = str(e.value)
    assert f"{bad}:7:" in msg and "unknown GPU 7" in msg
    assert f"{bad}:9:" in msg and "duration" in msg


def test_a_misspelt_or_misshapen_scenario_key_is_refused_at_its_line_like_the_specs(tmp_path):
    """Scenarios are checked as the spec is (a pydantic shape, then the meaning): a misspelt phase
    key no longer passes silently (the phase would keep the previous KV growth), and a list where
    a mapping or one value belongs is one error at its line, not one per union member."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "kind: FuseboxScenario\n"
        "gpus:\n"
        "  - {uuid: GPU-1, index: 0, memory: 80 GB}\n"
        "engines:\n"
        "  - id: e0\n"
        "    gpus: [0]\n"
        "    kv_geometry: {layers: 32, kv_heads: 32, head_dim: 128}\n"
        "    kv_pool: 40 GiB\n"
        "phases:\n"
        "  - name: a\n"
        "    duration: 10s\n"
        "    kv_grwoth: {e0: 1 MB/s}\n"
        "  - name: b\n"
        "    duration: 5s\n"
        "    gpu_memory: [50%]\n"
    )
    with pytest.raises(ScenarioError) as e:
        load_scenario(bad)
    lines = str(e.value).splitlines()
    assert lines[0] == (f"{bad}:12:5: unknown key 'kv_grwoth' in phases.0 -- did you mean 'kv_growth'? "
                        "remove it or check its spelling against collectors/scenarios/breach.yaml")
    assert len(lines) == 2 and lines[1].startswith(f"{bad}:15:17: phases.1.gpu_memory: ")


def test_with_a_tracer_each_ticks_slowest_hand_off_is_a_span_and_its_buckets_exemplar(sc):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    buckets = load_spec(str(ROOT / "fusebox.yaml")).signal("alignment_latency_p95").buckets
    pipe = Pipeline("scenario", ScenarioRunner.KEYS, histogram_buckets=buckets, host=sc.host, cluster=sc.cluster)
    spans = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    runner = ScenarioRunner(sc, pipe, tracer=provider.get_tracer("t"))
    runner.step(110)  # ticks 0..109: baseline 45, pressure 60, breach 5 (ticks 105..109)
    got = spans.get_finished_spans()
    assert len(got) == 110  # one engine with hand-offs, one span per tick
    assert {s.name for s in got} == {"mm.handoff"}
    # the breach (p95 2.0 s, 10 a second): the slowest of a tick is 2.0/0.95 x 9.5/10 = 2.0 s
    last = got[-1]
    assert (last.end_time - last.start_time) / 1e9 == pytest.approx(2.0, abs=1e-9)
    assert last.attributes["engine"] == ENGINE and last.attributes["gen_ai.request.model"] == last.attributes["model"]
    # baseline (p95 0.40 s, 20 a second): 0.40/0.95 x 19.5/20 = 0.4105 s
    assert (got[0].end_time - got[0].start_time) / 1e9 == pytest.approx(0.4 / 0.95 * 19.5 / 20, abs=1e-9)
    # the 2.0 s hand-off is the exemplar of (1.5, 2.0], with the last breach span's trace id
    fam = [f for f in pipe.families() if f.name == "fusebox_alignment_duration_seconds"]
    ex = {s.labels["le"]: s.exemplar for f in fam for s in f.samples if s.name.endswith("_bucket")}
    assert ex["2.0"].labels["trace_id"] == format(last.context.trace_id, "032x") and ex["2.0"].value == 2.0
    assert ex["2.5"] is None and ex["+Inf"] is None
    # observations are counted as before: every hand-off, traced or not
    count = [s.value for f in fam for s in f.samples if s.name.endswith("_count")][0]
    assert count == 45 * 20 + 60 * 20 + 5 * 10


def test_without_a_tracer_no_exemplars(sc):
    buckets = load_spec(str(ROOT / "fusebox.yaml")).signal("alignment_latency_p95").buckets
    pipe = Pipeline("scenario", ScenarioRunner.KEYS, histogram_buckets=buckets, host=sc.host, cluster=sc.cluster)
    ScenarioRunner(sc, pipe).step(110)
    fam = [f for f in pipe.families() if f.name == "fusebox_alignment_duration_seconds"]
    assert all(s.exemplar is None for f in fam for s in f.samples)
