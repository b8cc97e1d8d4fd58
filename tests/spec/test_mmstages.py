"""The multimodal stages' alias table (fusebox/spec/mmstages.py, docs/metrics.md section 8), what the
generator reads of it, and a real vLLM capture through the stage records.

The capture: ``tests/fixtures/collectors/datadog_vllm_metrics_fixture_opt-125m.txt`` (Datadog's vLLM
fixture with the V1 families, SOURCES.md there), whose ``vllm:mm_cache_queries_total`` and
``vllm:mm_cache_hits_total`` carry ``model_name="facebook/opt-125m"``.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from _support import ROOT, SPEC, promtools, yaml_text
from prometheus_client.parser import text_string_to_metric_families

from fusebox.generator.render_rules import render_rules
from fusebox.signal_kinds import dashboard_records, kind_of
from fusebox.spec import load_spec, mmstages, parse_spec

METRICS_DOC = ROOT / "docs" / "metrics.md"
CAPTURE = ROOT / "tests" / "fixtures" / "collectors" / "datadog_vllm_metrics_fixture_opt-125m.txt"


def _doc_rows() -> list[tuple[str, str, str, str]]:
    """(stage, producer, metric cell, status) of docs/metrics.md section 8's table."""
    text = METRICS_DOC.read_text()
    section = text[text.index("## 8 "):]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0] in mmstages.STAGES:
            rows.append((cells[0], cells[1], cells[2], cells[3]))
    return rows


def _cell(a: mmstages.StageAlias) -> str:
    """How docs/metrics.md writes an alias's metric."""
    if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", a.metric):
        return a.metric  # (none), (names in the pull request)
    name = a.metric + "".join(f'{{{k}="{v}"}}' for k, v in a.matchers)
    other = a.total or a.misses
    return f"`{name}` / `{other}`" if other else f"`{name}`"


def test_the_docs_table_is_the_code_table():
    assert _doc_rows() == [(a.stage, a.producer, _cell(a), a.status) for a in mmstages.ALIASES]


def test_every_stage_and_every_producer_the_issue_names_is_in_the_table():
    assert {a.stage for a in mmstages.ALIASES} == set(mmstages.STAGES)
    assert {a.producer for a in mmstages.ALIASES} >= {"vllm", "sglang", "smg", "dynamo", "llm-d"}
    # a cache alias has its lookups (total) or its misses, never neither
    assert all((a.total is None) != (a.misses is None) for a in mmstages.ALIASES if a.stage == "cache")
    # proposed names cite an open pull request or issue
    assert all(re.search(r"(PR|issue) #\d+ \(open", a.source) for a in mmstages.ALIASES if a.status == "proposed")


def test_the_shipped_spec_reads_the_published_names_of_its_producers_only():
    spec = load_spec(SPEC)
    # vLLM and SGLang (Spec.engines), smg (inpath.shedders names it), fusebox; not Dynamo nor llm-d
    assert mmstages.producers_of(spec) == {"vllm", "sglang", "smg", "fusebox"}
    read = mmstages.read_aliases(spec)
    assert [(a.stage, a.producer) for a in read] == [
        ("decode", "sglang"), ("encoder", "sglang"), ("encoder", "fusebox"), ("cache", "vllm"), ("cache", "sglang"),
        ("cache", "smg"), ("handoff", "sglang"), ("handoff", "fusebox")]
    rules = {r["record"]: r["expr"] for g in render_rules(spec).groups for r in g["rules"] if "record" in r}
    d = dashboard_records()
    stage, cache = rules[d["stage_p95"]], rules[d["cache_hit"]]
    for a in read:
        expr = stage if a.stage != "cache" else cache
        assert a.metric in expr, a
    text = stage + cache
    for a in mmstages.ALIASES:
        if a.status == "proposed" or a.producer in ("dynamo", "llm-d"):
            assert a.metric not in text, a  # listed, never read
    # SGLang's two spellings, as for its other series (docs/metrics.md section 2)
    assert "rate(sglang:encoder_transfer_seconds_bucket[5m]) or rate(sglang_encoder_transfer_seconds_bucket[5m])" in stage


def test_a_vllm_only_spec_without_gateway_reads_vllm_and_fusebox():
    text = SPEC.read_text().replace("global:\n", "global:\n", 1)
    data = yaml.safe_load(text)
    data["global"]["selectors"] = {"vllm": {"namespace": "inference"}}
    data["signals"]["kv_cache_time_to_full"]["sources"].pop("sglang")
    data["signals"]["preemption_rate"]["sources"].pop("sglang")
    data.pop("inpath")
    spec = parse_spec(yaml_text(data, sort_keys=False), "fusebox.yaml", base_dir=ROOT)
    assert spec.engines == ("vllm",)
    assert [(a.stage, a.producer) for a in mmstages.read_aliases(spec)] == [
        ("encoder", "fusebox"), ("cache", "vllm"), ("handoff", "fusebox")]
    # the vLLM cache record carries the backend's matchers
    cache = next(r for r in kind_of(next(s for s in spec.signals if s.kind == "quantile")).stage_rules(spec)
                 if r["record"] == dashboard_records()["cache_hit"])
    assert 'vllm:mm_cache_hits_total{namespace="inference"}' in cache["expr"]


def test_the_alignment_runbook_queries_each_stage_and_the_one_that_grew():
    spec = load_spec(SPEC)
    sig = next(s for s in spec.signals if s.kind == "quantile")
    titles = dict(kind_of(sig).diagnosis(sig, spec))
    r = dashboard_records()["stage_p95"]
    queries = {q for q in titles.values()}
    for stage in ("decode", "encoder", "handoff"):  # what the shipped producers time; no one publishes download
        assert f'{r}{{stage="{stage}"}}' in queries
    assert f'{r}{{stage="download"}}' not in queries
    assert f"topk by (cluster, host_name, engine) (1, {r} - {r} offset 1h)" in queries
    runbook = (ROOT / "runbooks" / "AlignmentLatencyP95High.md").read_text()
    assert "The stage whose P95 grew most in the last hour" in runbook


def test_the_stage_row_is_one_row_under_the_quantiles():
    from fusebox.generator.render_dashboards import dashboards

    board = dashboards(load_spec(SPEC))["alignment-latency"]
    panels = board["panels"]
    titles = [p["title"] for p in panels]
    i = titles.index("Multimodal stages: P95 per stage")
    assert titles[i + 1] == "Encoder / embedding caches: hit ratio"
    row = panels[i:i + 2]
    assert [p["gridPos"]["w"] for p in row] == [16, 8] and len({p["gridPos"]["y"] for p in row}) == 1


@pytest.mark.process
def test_real_vllm_capture_through_the_cache_record(tmp_path):
    """The capture's mm-cache counters, as the engines' PodMonitor stores them, counting 8
    lookups and 6 hits per 5 s scrape: the record says 0.75 for the pod's engine, cache vllm_mm,
    producer vllm (promtool 2 and 3 on the committed rules)."""
    fams = {f.name: f for f in text_string_to_metric_families(CAPTURE.read_text())}
    q = next(s for s in fams["vllm:mm_cache_queries"].samples if s.name.endswith("_total"))
    h = next(s for s in fams["vllm:mm_cache_hits"].samples if s.name.endswith("_total"))
    assert fams["vllm:mm_cache_queries"].type == fams["vllm:mm_cache_hits"].type == "counter"
    assert q.labels == h.labels == {"model_name": "facebook/opt-125m"}
    pod = {"namespace": "inference", "pod": "vllm-opt-5f7b9-xk2p4", "cluster": "prod-a", "host_name": "gpu-node-2",
           "instance": "10.42.1.9:8000", "job": "fusebox-engines"}

    def series(sample) -> str:
        return sample.name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted({**sample.labels, **pod}.items())) + "}"

    rec = dashboard_records()["cache_hit"]
    out = {"cluster": "prod-a", "host_name": "gpu-node-2", "engine": "inference/vllm-opt-5f7b9-xk2p4",
           "model": "facebook/opt-125m", "cache": "vllm_mm", "producer": "vllm"}
    test = {"rule_files": [str(ROOT / "rules" / "fusebox.rules.yml")], "evaluation_interval": "30s", "tests": [{
        "interval": "5s",
        "input_series": [{"series": series(q), "values": f"{q.value:g}+8x100"},
                         {"series": series(h), "values": f"{h.value:g}+6x100"}],
        # in thousandths, rounded: the two rates' extrapolation leaves 0.7500000000000001
        "promql_expr_test": [{"expr": f"round({rec} * 1000)", "eval_time": "6m", "exp_samples": [
            {"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(out.items())) + "}", "value": 750}]}],
    }]}
    path = tmp_path / "stages.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    for promtool in promtools():
        run = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"{promtool}:\n{run.stdout}\n{run.stderr}"


@pytest.mark.process
def test_the_runbook_query_names_the_stage_that_grew(tmp_path):
    """SGLang's encoder forward pass (its EPD encoder server's buckets, collector.py) slows from
    the (0.02, 0.05] bucket to (0.2, 0.5] while fusebox's hand-off histogram stays where it was:
    the runbook's "grew most" query (read from the kind, not spelled here) names stage encoder,
    producer sglang, by P95 0.2 + 0.3 x 0.95 - (0.02 + 0.03 x 0.95) = 0.4365 s."""
    spec = load_spec(SPEC)
    sig = next(s for s in spec.signals if s.kind == "quantile")
    grew = next(q for t, q in kind_of(sig).diagnosis(sig, spec) if t.startswith("The stage whose P95 grew most"))
    where = {"cluster": "prod-a", "host_name": "gpu-node-4"}
    pod = {**where, "namespace": "inference", "pod": "sglang-llava-0", "model_name": "llava-hf/llava-1.5-7b-hf",
           "tp_rank": "0", "modality": "image", "instance": "10.42.2.3:30000", "job": "fusebox-engines"}
    own = {**where, "engine": "inference/sglang-llava-0", "model": "llava-hf/llava-1.5-7b-hf", "source": "handoff",
           "instance": "gpu-node-4:9464", "job": "fusebox-latency"}
    bounds = ["0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1", "2", "5", "+Inf"]
    fast = [0, 0, 100, 100, 100, 100, 100, 100, 100, 100]  # per minute, cumulative: all in (0.02, 0.05]
    slow = [0, 0, 0, 0, 0, 100, 100, 100, 100, 100]  # all in (0.2, 0.5]

    def counter(per_min_a: float, per_min_b: float) -> str:  # 40 minutes at a, then 35 at b
        return f"0+{per_min_a:g}x40 {40 * per_min_a:g}+{per_min_b:g}x35"

    def labels(ls: dict) -> str:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(ls.items())) + "}"

    series = []
    for le, a, b in zip(bounds, fast, slow, strict=True):
        series.append({"series": "sglang:encoder_model_forward_seconds_bucket" + labels({**pod, "le": le}), "values": counter(a, b)})
        series.append({"series": "fusebox_alignment_duration_seconds_bucket" + labels({**own, "le": le}), "values": counter(a, a)})
    series.append({"series": "sglang:encoder_model_forward_seconds_count" + labels(pod), "values": counter(100, 100)})
    series.append({"series": "fusebox_alignment_duration_seconds_count" + labels(own), "values": counter(100, 100)})
    out = {**where, "engine": "inference/sglang-llava-0", "model": "llava-hf/llava-1.5-7b-hf", "stage": "encoder", "producer": "sglang"}
    test = {"rule_files": [str(ROOT / "rules" / "fusebox.rules.yml")], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": f"round(({grew}) * 1e6)", "eval_time": "70m",
                              "exp_samples": [{"labels": labels(out), "value": 436500}]}],
    }]}
    path = tmp_path / "grew.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    for promtool in promtools():
        run = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"{promtool}:\n{run.stdout}\n{run.stderr}"
