"""The preemption signal (kind ``rate``): vLLM's preemption counter and SGLang's retraction
counter read as events per second per engine, tiers that request a fuse, and a real vLLM capture
through the generated rules.

Inputs from real engines: ``tests/fixtures/collectors/hardware-aware-router_vllm-v1_qwen1.5-0.5b-chat_idle_2025-11.txt``
(vLLM V1, ``vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen1.5-0.5B-Chat"} 0.0``) and
``datadog_sglang_metrics_fixture_v0.5.10.post1.txt`` (SGLang v0.5.10.post1, whose retraction
series is the gauge ``sglang:num_retracted_reqs``); tests/fixtures/collectors/SOURCES.md cites both.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from _support import ROOT, SPEC, promtools
from prometheus_client.parser import text_string_to_metric_families

from fusebox.generator.render_rules import render_rules
from fusebox.signal_kinds import kind_of, records
from fusebox.spec import load_spec, parse_spec
from fusebox.spec.errors import SpecError

FIXTURES = ROOT / "tests" / "fixtures" / "collectors"
VLLM_CAPTURE = FIXTURES / "hardware-aware-router_vllm-v1_qwen1.5-0.5b-chat_idle_2025-11.txt"
SGLANG_CAPTURE = FIXTURES / "datadog_sglang_metrics_fixture_v0.5.10.post1.txt"


def _family(path: Path, name: str):
    """The metric family ``name`` (a counter's name without ``_total``, as prometheus_client keys it)."""
    fams = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    return fams[name]


def _preemption(spec):
    return next(s for s in spec.signals if s.kind == "rate")


def _with_override(text: str, override: str) -> str:
    return text.replace("overrides: []", f"overrides:\n{override}")


# ---------------------------------------------------------------------------- the spec
def test_shipped_spec_reads_vllm_counter_and_lists_sglang_retractions():
    spec = load_spec(SPEC)
    sig = _preemption(spec)
    assert (sig.source.backend, sig.source.metric) == ("vllm", "vllm:num_preemptions_total")
    assert sig.sources["sglang"].metric == "sglang:num_retracted_requests_total"
    # the critical tier requests the spec's freeze_admissions action, level 1
    crit = next(t for t in sig.tiers if t.name == "critical")
    assert (crit.fuse, crit.fuse_level) == ("freeze_admissions", spec.actions["freeze_admissions"].level)
    # reading vLLM names SGLang too (its other engine source): the SGLang dashboard records stay
    assert spec.engines == ("vllm", "sglang")


def test_the_capture_types_vllm_counter_and_sglang_gauge():
    """What the kind's counter check rests on, read from the real captures' # TYPE lines."""
    assert _family(VLLM_CAPTURE, "vllm:num_preemptions").type == "counter"
    assert _family(SGLANG_CAPTURE, "sglang:num_retracted_reqs").type == "gauge"


def test_a_gauge_source_is_refused_at_its_line_with_the_counter_named():
    text = SPEC.read_text().replace("metric: sglang:num_retracted_requests_total", "metric: sglang:num_retracted_reqs")
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "metric: sglang:num_retracted_reqs" in ln)
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml", base_dir=ROOT)
    msg = str(e.value)
    assert f"fusebox.yaml:{line}:" in msg
    assert "not one (no _total suffix)" in msg and "sglang:num_retracted_requests_total" in msg


def test_rate_window_under_two_scrapes_is_refused():
    text = SPEC.read_text().replace("    kind: rate\n    unit: count\n    level: engine\n    by: [cluster, host_name, engine, model]\n    window: 1m",
                                    "    kind: rate\n    unit: count\n    level: engine\n    by: [cluster, host_name, engine, model]\n    window: 5s")
    with pytest.raises(SpecError, match="rate window 5s is under 2 scrape intervals"):
        parse_spec(text, "fusebox.yaml", base_dir=ROOT)


# ---------------------------------------------------------------------------- the rules' shape
def test_rules_rate_the_counter_per_engine_and_tiers_read_the_record():
    spec = load_spec(SPEC)
    sig = _preemption(spec)
    groups = {g["name"]: g for g in render_rules(spec).groups}
    rules = groups[f"fusebox-{sig.name}"]["rules"]
    rec = records(sig)["value"]
    assert rec == "engine:fusebox_preemption_rate:rate1m"
    assert rules[0]["record"] == rec
    assert "rate(vllm:num_preemptions_total[1m])" in rules[0]["expr"]
    assert rules[0]["expr"].startswith("sum by (cluster, host_name, engine, model) (")
    alerts = [r for r in rules if "alert" in r]
    assert [(a["expr"], a["labels"]["severity"], a["labels"].get("fuse_level")) for a in alerts] == [
        (f"{rec} >= 0.1", "warning", None), (f"{rec} >= 1", "critical", "1")]
    assert kind_of(sig).raw_metrics(sig) == ["vllm:num_preemptions_total"]


def test_source_sglang_reads_the_retraction_counter():
    text = _with_override(SPEC.read_text(), "  - alert: EnginePreemptionsHigh\n    source: sglang")
    spec = parse_spec(text, "fusebox.yaml", base_dir=ROOT)
    expr = kind_of(_preemption(spec)).rules(_preemption(spec), spec)[0]["expr"]
    assert "rate(sglang:num_retracted_requests_total[1m])" in expr
    assert "vllm:" not in expr


# ---------------------------------------------------------------------------- a real capture
def _capture_series() -> tuple[str, dict[str, str], float]:
    """The capture's one preemption sample: (metric name, labels, value)."""
    fam = _family(VLLM_CAPTURE, "vllm:num_preemptions")
    (sample,) = [s for s in fam.samples if s.name.endswith("_total")]
    return sample.name, dict(sample.labels), sample.value


@pytest.mark.process
def test_real_vllm_capture_through_the_generated_rules(tmp_path):
    """The capture's series, as the engines' PodMonitor stores it (namespace, pod, cluster,
    host_name added: docs/kubernetes.md), counting 3 preemptions per 5 s scrape from the
    capture's value: 0.6 per second, over the warning's 0.1 and under the critical's 1. The
    record names the engine by its pod (vLLM's engine label is the index "0") and the model by
    vLLM's model_name; promtool 2 and 3 evaluate the committed rules."""
    name, labels, value = _capture_series()
    assert (name, labels, value) == ("vllm:num_preemptions_total", {"engine": "0", "model_name": "Qwen/Qwen1.5-0.5B-Chat"}, 0.0)
    scraped = {**labels, "namespace": "inference", "pod": "vllm-qwen-7c9d-abcde", "cluster": "prod-a",
               "host_name": "gpu-node-3", "instance": "10.42.0.7:8000", "job": "fusebox-engines"}
    series = name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(scraped.items())) + "}"
    spec = load_spec(SPEC)
    rec = records(_preemption(spec))["value"]
    out = {"engine": "inference/vllm-qwen-7c9d-abcde", "model": "Qwen/Qwen1.5-0.5B-Chat", "cluster": "prod-a", "host_name": "gpu-node-3"}
    # 40 samples at 5 s: the 1m window is full from 60 s; the warning's `for: 1m` passes by 120 s
    test = {"rule_files": [str(ROOT / "rules" / "fusebox.rules.yml")], "evaluation_interval": "5s", "tests": [{
        "interval": "5s",
        "input_series": [{"series": series, "values": f"{value:g}+3x40"}],
        "promql_expr_test": [{"expr": rec, "eval_time": "2m", "exp_samples": [{"labels": rec + "{" + ", ".join(
            f'{k}="{v}"' for k, v in sorted(out.items())) + "}", "value": 0.6}]}],
        "alert_rule_test": [{"eval_time": "3m", "alertname": "EnginePreemptionsHigh", "exp_alerts": [{
            "exp_labels": {**out, "severity": "warning", "signal": "preemption_rate", "fusebox": spec.name},
            "exp_annotations": {
                "summary": f"EnginePreemptionsHigh: preemption_rate >= 0.1 on engine {out['engine']} (warning)",
                "description": (f"preemption_rate on engine {out['engine']} ({out['model']}) on {out['host_name']} "
                                "has been >= 0.1 for 1m."),
                "runbook_url": spec.runbook_url("EnginePreemptionsHigh")}}]}],
    }]}
    path = tmp_path / "capture.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    for promtool in promtools():
        run = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"{promtool}:\n{run.stdout}\n{run.stderr}"
        assert re.search(r"SUCCESS", run.stdout + run.stderr)


def test_a_30s_scrape_refuses_every_1m_window_in_the_same_words():
    """scrape_interval 30s: deriv needs 4 x 30s = 2m, rate 2 x 30s = 1m (the shipped 1m rate windows
    pass). KV growth, KV OOM and both time-to-full signals (deriv, 1m) are refused alike, each with
    the least window and both fixes."""
    text = SPEC.read_text().replace("\n  scrape_interval: 5s\n", "\n  scrape_interval: 30s\n")
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml", base_dir=ROOT)
    msgs = [str(p) for p in e.value.problems]
    want = ("deriv window 1m is under 4 scrape intervals (2m at global.scrape_interval 30s) -- use a window of at "
            "least 2m, or a shorter global.scrape_interval: deriv needs several samples to fit a slope")
    assert len(msgs) == 4 and all(m.endswith(want) for m in msgs), msgs
    lines = text.splitlines()
    for m in msgs:
        line = int(m.split(":")[1])
        assert lines[line - 1].strip() == "window: 1m", (m, lines[line - 1])
