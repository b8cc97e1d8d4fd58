"""bench/bench_scale.py's pure parts at its --quick size: the synthetic fleet has the series the
issue asks for, its history and live exposition agree, and the groups it times are the generated
rules file's. No timing here (speed lives in bench/)."""

from __future__ import annotations

import importlib
import json
import math
import re
import sys

import pytest
import yaml
from _support import ROOT

from fusebox import conventions as C

sys.path.insert(0, str(ROOT / "bench"))
bench_scale = importlib.import_module("bench_scale")

QUICK_GPUS, QUICK_ENGINES = 512, 128  # bench_scale --quick
GPU_FAMILIES = 8  # memory used/limit/utilization/reserved, bandwidth, PCIe, power, up
ENGINE_FAMILIES = 2 + 14 + 2 + 3  # KV used/limit; 14 latency buckets (+Inf included), _count, _sum; 3 vLLM counters
FUSE_SERIES = 4


def test_quick_fleet_has_gpus_times_metrics_series_and_unique_label_sets():
    fams = bench_scale.fleet(QUICK_GPUS, QUICK_ENGINES)
    assert bench_scale.series_count(fams) == QUICK_GPUS * GPU_FAMILIES + QUICK_ENGINES * ENGINE_FAMILIES + FUSE_SERIES
    per_gpu = [f for f in fams if len(f.labels) == QUICK_GPUS]
    assert len(per_gpu) == GPU_FAMILIES
    assert len({lab["host_name"] for lab in per_gpu[0].labels}) == QUICK_GPUS // 8
    keys = [(f.name, tuple(sorted(lab.items()))) for f in fams for lab in f.labels]
    assert len(keys) == len(set(keys))
    # the GPU collector's ratio is its usage over its limit, per GPU and at any time
    fam = {f.name: f for f in fams}
    usage, limit, ratio = (fam[C.PROM[k]] for k in ("gpu_memory_usage", "gpu_memory_limit", "gpu_memory_ratio"))
    for i, t in ((0, 1_764_000_000), (QUICK_GPUS - 1, 1_764_000_455)):
        assert ratio.labels[i] == usage.labels[i] and ratio.value(i, t) == usage.value(i, t) / limit.value(i, t)


def test_history_and_exposition_carry_the_same_series_and_values(tmp_path):
    fams = bench_scale.fleet(16, 4)
    ts = [1_764_000_000, 1_764_000_010]  # one 2 h window
    n, files = bench_scale.write_history(fams, ts, tmp_path / "h.om", tmp_path / "h.jsonl")
    series = bench_scale.series_count(fams)
    assert n == series * len(ts) and len(files) == 1
    om = files[0].read_text().splitlines()
    assert om[-1] == "# EOF" and sum(not x.startswith("#") for x in om) == n
    lines = [json.loads(x) for x in (tmp_path / "h.jsonl").read_text().splitlines()]
    assert len(lines) == series and all(x["timestamps"] == [t * 1000 for t in ts] for x in lines)
    expo = bench_scale.exposition(fams, ts[1]).decode().splitlines()
    assert len(expo) == series
    # the live value at ts[1] is the history's last value of the same series
    last = {x["metric"]["__name__"] + json.dumps({k: v for k, v in x["metric"].items() if k != "__name__"}, sort_keys=True): x["values"][1]
            for x in lines}
    fam = fams[0]
    key = fam.name + json.dumps(fam.labels[0], sort_keys=True)
    assert float(expo[0].rsplit(" ", 1)[1]) == last[key]


def test_latency_buckets_are_cumulative_and_quiet_under_the_spec_threshold():
    fams = {f.name + f.labels[0].get("le", ""): f for f in bench_scale.fleet(8, 1)}
    t = 1_764_000_000
    bucket = [fams[f"fusebox_alignment_duration_seconds_bucket{le}"].value(0, t) for le in bench_scale.bd.BUCKETS]
    assert bucket == sorted(bucket) and bucket[-1] == fams["fusebox_alignment_duration_seconds_count"].value(0, t)
    # P95 of the synthetic latency (lognormal median 0.4 s, sigma 0.3) is under the spec's 0.85 s warning
    assert math.exp(math.log(0.4) + 1.645 * 0.3) < 0.85


def test_timed_groups_are_the_generated_rules_files_groups():
    text = (ROOT / "rules" / "fusebox.rules.yml").read_text()
    groups = bench_scale.rule_groups(text)
    assert [g for g, _ in groups] == [g["name"] for g in yaml.safe_load(text)["groups"]]
    assert all(iv > 0 for _, iv in groups)
    assert bench_scale.rule_groups("groups:\n- name: a\n  interval: 30s\n  rules: []\n- name: b\n  rules: []\n") == [("a", 30.0), ("b", 60.0)]


def test_group_time_is_prometheus_field_or_the_sum_of_the_rules():
    assert bench_scale.group_eval_seconds({"evaluationTime": 0.25, "rules": [{"evaluationTime": 9}]}) == 0.25
    g = "2026-12-02T01:12:10.440891333Z"
    rules = [{"lastEvaluation": "2026-12-02T01:12:10.440896623Z", "evaluationTime": 0.019},
             {"lastEvaluation": "2026-12-02T01:12:10.460013996Z", "evaluationTime": 0.0026}]
    took = bench_scale.group_eval_seconds({"lastEvaluation": g, "rules": rules})
    assert abs(took - (0.460013 + 0.0026 - 0.440891)) < 2e-6
    under_way = {"lastEvaluation": g, "rules": rules[:1] + [{"lastEvaluation": "2026-12-02T01:12:05.4Z", "evaluationTime": 0.1}]}
    assert bench_scale.group_eval_seconds(under_way) is None


def test_record_levels_put_every_record_after_the_records_it_reads():
    text = (ROOT / "rules" / "fusebox.rules.yml").read_text()
    levels = bench_scale.record_levels(text)
    recorded = [r["record"] for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "record" in r]
    assert sorted(r["record"] for lv in levels for r in lv) == sorted(recorded)
    earlier: set[str] = set()
    for lv in levels:
        for r in lv:
            reads = {n for n in set(recorded) - {r["record"]} if n in r["expr"].replace(n + "_", "")}
            assert reads <= earlier, (r["record"], reads - earlier)
        earlier |= {r["record"] for r in lv}
    two = "groups:\n- name: g\n  rules:\n  - record: b:x\n    expr: a:x * 2\n  - record: a:x\n    expr: sum(raw)\n"
    assert [[r["record"] for r in lv] for lv in bench_scale.record_levels(two)] == [["a:x"], ["b:x"]]


def test_history_is_split_at_promtools_2h_block_windows(tmp_path):
    fams = bench_scale.fleet(8, 1)
    ts = [7200 * 245_000 - 10, 7200 * 245_000, 7200 * 245_000 + 10]  # crosses one window boundary
    n, files = bench_scale.write_history(fams, ts, tmp_path / "h.om", tmp_path / "h.jsonl")
    per_file = [[int(x.rsplit(" ", 1)[1]) for x in f.read_text().splitlines() if not x.startswith("#")] for f in files]
    assert [sorted(set(p)) for p in per_file] == [ts[:1], ts[1:]]
    assert sum(map(len, per_file)) == n == bench_scale.series_count(fams) * 3


def test_metric_sums_add_a_name_over_its_label_sets_and_only_that_name():
    text = ("# TYPE vmalert_iteration_duration_seconds summary\n"
            'vmalert_iteration_duration_seconds{group="a",quantile="0.5"} 7\n'
            'vmalert_iteration_duration_seconds_sum{file="r.yml",group="a"} 0.25\n'
            'vmalert_iteration_duration_seconds_sum{file="r.yml",group="b"} 1.5\n'
            'vmalert_iteration_duration_seconds_count{group="a"} 3\n'
            "process_cpu_seconds_total 12.5\n")
    got = bench_scale.sum_metrics(text, ("vmalert_iteration_duration_seconds_sum", "process_cpu_seconds_total", "absent"))
    assert got == {"vmalert_iteration_duration_seconds_sum": 1.75, "process_cpu_seconds_total": 12.5, "absent": 0.0}


@pytest.mark.process  # git show (the branch point's rules)
def test_cost_mode_runs_both_rule_files_in_one_prometheus_without_a_shared_series():
    """--cost loads the branch point's rules beside today's: every record and alert name of the
    'before' side is renamed (and every reference to its records), so neither side writes or reads
    the other's series, and each side keeps its groups, rules and intervals."""
    from fusebox.generator.outputs import RULE_FILE, render_all
    from fusebox.spec import load_spec

    before_text = bench_scale.rules_at(bench_scale.BEFORE_FALLBACK)
    after_text = render_all(load_spec(ROOT / "fusebox.yaml"))[RULE_FILE]
    before, after = bench_scale.side_by_side(before_text, after_text)
    raw_b, raw_a = yaml.safe_load(before_text)["groups"], yaml.safe_load(after_text)["groups"]
    assert [g["name"] for g in before] == ["before/" + g["name"] for g in raw_b]
    assert [g["name"] for g in after] == ["after/" + g["name"] for g in raw_a]
    assert [len(g["rules"]) for g in before] == [len(g["rules"]) for g in raw_b]
    assert [g.get("interval") for g in before + after] == [g.get("interval") for g in raw_b + raw_a]
    names_b = {r.get("record") or r.get("alert") for g in before for r in g["rules"]}
    names_a = {r.get("record") or r.get("alert") for g in after for r in g["rules"]}
    assert not names_b & names_a
    recorded_a = {r["record"] for g in after for r in g["rules"] if "record" in r}
    for g in before:
        for r in g["rules"]:
            assert not any(re.search(rf"(?<![a-zA-Z0-9_:]){re.escape(n)}(?![a-zA-Z0-9_:])", r["expr"]) for n in recorded_a), r["expr"]
    # the before P95 alert still reads its (renamed) quantile record
    p95 = [r["expr"] for g in before for r in g["rules"] if r.get("alert") == "BeforeAlignmentLatencyP95High"]
    assert p95 and all(e.startswith("before:engine:fusebox_alignment_latency_p95:rate5m >= ") for e in p95)


@pytest.mark.process  # git show
def test_same_signals_leaves_out_exactly_the_signals_the_before_spec_lacks(tmp_path):
    """--same-signals: today's spec without the signals added after 5130cd6 (the two time-to-full ones,
    preemption, the shared PCIe links, the connections; its spec watched six), so the after side evaluates none of their rules and every
    other signal's rules are today's, unchanged."""
    from fusebox.generator.outputs import RULE_FILE, render_all
    from fusebox.spec import load_spec

    spec, dropped = bench_scale.same_signals_spec(bench_scale.BEFORE_FALLBACK, tmp_path)
    assert dropped == ["preemption_rate", "kv_cache_time_to_full", "gpu_memory_time_to_full", "pcie_root_complex_utilization",
                       "connection_idle_p95", "connection_cold_start_share"]
    assert [s.name for s in spec.signals] == ["gpu_memory_utilization", "alignment_latency_p95", "kv_cache_growth_rate",
                                              "memory_bandwidth_saturation", "kv_cache_growth_oom", "pcie_link_utilization"]
    same = yaml.safe_load(render_all(spec)[RULE_FILE])["groups"]
    today = {g["name"]: g for g in yaml.safe_load(render_all(load_spec(ROOT / "fusebox.yaml"))[RULE_FILE])["groups"]}
    assert not [g["name"] for g in same if "time_to_full" in g["name"]]
    assert {g["name"] for g in same} == set(today) - {"fusebox-kv_cache_time_to_full", "fusebox-gpu_memory_time_to_full",
                                                      "fusebox-pcie_root_complex_utilization",
                                                      "fusebox-pcie_root_complex_utilization-panels",
                                                      "fusebox-preemption_rate", "fusebox-connection_idle_p95",
                                                      "fusebox-connection_idle_p95-panels",
                                                      "fusebox-connection_cold_start_share",
                                                      "fusebox-connection_cold_start_share-panels"}
    for g in same:
        if g["name"].startswith("fusebox-") and g["name"] not in ("fusebox-absent", "fusebox-self", "fusebox-health"):
            assert g == today[g["name"]], g["name"]


def test_cost_report_lists_the_rules_of_groups_at_5_percent_of_their_interval(capsys):
    use = bench_scale.Usage(wall=10.0, engine_cpu=2.0, group_wall=1.0, self_cpu=0.1, machine_busy=8.0,
                            load=((1.0, 1.0, 1.0), (1.0, 1.0, 1.0)))
    before = [{"name": "before/big", "interval": "5s", "rules": [{"record": "before:a"}, {"alert": "B"}]}]
    after = [{"name": "after/big", "interval": "5s", "rules": [{"record": "a"}]},
             {"name": "after/small", "interval": "30s", "rules": [{"record": "s"}]}]
    promql = {"before/big": 0.5, "after/big": 0.3, "after/small": 0.6}  # 10 %, 6 %, 2 % of their intervals
    per_rule = {"before/big": [("before:a", 0.2), ("B", 0.3)], "after/big": [("a", 0.3)], "after/small": [("s", 0.6)]}
    phases = {side: ({name: [0.1] for name in promql}, use, {}) for side in ("before", "after", "both")}
    assert bench_scale.report_cost(before, after, use, phases, promql, [], per_rule) == 0
    out = capsys.readouterr().out
    assert "  before/big: before:a 200.0 (4.0%); B 300.0 (6.0%)" in out
    assert "  after/big: a 300.0 (6.0%)" in out
    assert "after/small: s" not in out


@pytest.mark.process  # git
def test_the_default_before_is_never_head_itself():
    """On main the merge base with main is HEAD: --cost would time today's rules against
    themselves. The default is then the rules before the cost cuts (5130cd6)."""
    import subprocess

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    before = bench_scale.branch_point()
    assert before and not head.startswith(before)
    base = subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], capture_output=True, text=True).stdout.strip()
    assert before == (bench_scale.BEFORE_FALLBACK if base in ("", head) else base[:12])


def test_a_group_not_evaluated_in_the_window_prints_a_dash_not_nan():
    assert bench_scale._ms(float("nan")).strip() == "-" and bench_scale._pct(float("nan"), 30.0).strip() == "-"
    assert bench_scale._ms(0.0125).strip() == "12.5" and bench_scale._pct(1.5, 30.0).strip() == "5.00%"
