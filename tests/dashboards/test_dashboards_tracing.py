"""What feeds every panel and variable of the dashboards, for what a deployment runs (issue 33, point 7).

Two deployments, traced query by query by hand from the dashboards the spec renders:

* the shipped spec: the fusebox GPU collector (``kubernetes.collectors.run: {gpu: []}``), the fuse,
  the SGLang Model Gateway (``inpath.shedders``), engines of either kind scraped by the user's own
  monitor (no ``kubernetes.engines``). 51 panels: 24 stay empty -- the alignment histogram (7
  panels: the overview's, the drill-down's 3 and the SLO board's 3 of the alignment SLO), KV bytes (overview: growth, OOM, time to full;
  KV drill-down: 4; GPU memory: KV pool free bytes; time to full: the KV pool's) and the connection
  idle histogram (7: the overview's 2, the connections drill-down's 5; ``fusebox collect conns``
  runs in the gateway's network namespace, never in the collectors' DaemonSet) have no producer,
  and energy per token joins node power with engine tokens that carry no node. The deployments
  below that run every collector leave the connection signals out for that reason. The SLO board's
  3 panels of the TTFT SLO read vLLM's own histogram through the SLO group's records: fed.
  Only the SLO board's 6 panels are new since the burn-rate SLOs (issue 35): 45 panels, 21 empty before.
* a dcgm + vLLM cluster (:func:`dcgm_vllm`): ``global.source: dcgm`` (GPU memory, bandwidth and
  GPU time to full from dcgm-exporter), KV time to full from ``vllm:kv_cache_usage_perc``,
  alignment from the fusebox latency collector, the engines' PodMonitor (``kubernetes.engines``),
  no KV collector (so no KV growth signals), PCIe (per GPU and per shared link) disabled as
  docs/spec.md says. 25 panels (PCIe's four are left out: nothing can feed them), one empty: KV
  pool free bytes per GPU; with the SLO board's 6 (alignment from the latency collector, TTFT from
  vLLM, both fed) 34.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from _support import SPEC, without_signals

from fusebox import conventions as C
from fusebox.generator import render_dashboards
from fusebox.generator.outputs import render_all, spec_warnings
from fusebox.generator.render_rules import render_rules
from fusebox.generator.tracing import Tracer, empty_panel_warnings, trace_dashboards
from fusebox.spec import load_spec

# The shipped spec's panels that stay empty, (dashboard, title), worked out by hand (module doc).
SHIPPED_EMPTY = {
    ("overview", "AlignmentLatencyP95High: alignment latency p95"),
    ("overview", "KVCacheGrowthRateHigh: kv cache growth rate"),
    ("overview", "KVCacheGrowthOOMImminent: kv cache growth oom"),
    ("overview", "KVCacheTimeToFullLow: kv cache time to full"),
    ("alignment-latency", "AlignmentLatencyP95High: P50 / P95 / P99 per engine and source"),
    ("alignment-latency", "Share of observations over each threshold"),
    ("alignment-latency", "Observations per second"),
    ("kv-cache", "KVCacheGrowthRateHigh: growth per engine"),
    ("kv-cache", "KVCacheGrowthOOMImminent: growth per engine"),
    ("kv-cache", "KV-cache bytes per engine"),
    ("kv-cache", "KV pool usage per engine"),
    ("gpu-memory", "KV pool free bytes per GPU"),
    ("time-to-full", "KVCacheTimeToFullLow: seconds until full"),
    ("secondary", "Energy per generated token"),
    ("overview", "ConnectionIdleP95High: connection idle p95"),
    ("overview", "ConnectionColdStartsHigh: connection cold start share"),
    ("connections", "ConnectionIdleP95High: idle time before a use, P50 / P95 / P99"),
    ("connections", "ConnectionIdleP95High: share of uses over warning 45s"),
    ("connections", "ConnectionColdStartsHigh: idle time before a use, P50 / P92 / P99"),
    ("connections", "ConnectionColdStartsHigh: share of uses over warning 30s"),
    ("connections", "Connection uses per second"),
    # the SLO board (generator/render_slo.py): the alignment SLO's row reads the same histogram
    ("slo", "AlignmentLatencyErrorBudgetBurn: alignment latency error budget left"),
    ("slo", "AlignmentLatencyErrorBudgetBurn: alignment latency burn rate, page windows"),
    ("slo", "AlignmentLatencyErrorBudgetBurn: alignment latency burn rate, ticket windows"),
}
# The signals of `fusebox collect conns` (the gateway's network namespace, no k8s/ collector).
CONNECTION_SIGNALS = ("connection_idle_p95", "connection_cold_start_share")
ENGINES = {"selector": {"app.kubernetes.io/name": "vllm"}, "port": "http", "namespaces": ["inference"]}


def dcgm_vllm(**edit) -> dict:
    """The dcgm + vLLM cluster's spec (module doc), from the shipped one."""
    data = yaml.safe_load(SPEC.read_text())
    data["global"]["source"] = "dcgm"
    data["global"]["selectors"] = {"vllm": {}}  # the engines are vLLM
    data["kubernetes"]["collectors"]["run"] = {"latency": []}
    data["kubernetes"]["engines"] = dict(ENGINES)
    data["signals"]["kv_cache_time_to_full"]["source"] = "vllm"
    without_signals(data, "kv_cache_growth_rate", "kv_cache_growth_oom", *CONNECTION_SIGNALS)  # KV bytes: no collector here
    data["overrides"] = [{"alert": "GPUPCIeLinkSaturated", "enabled": False},  # no dcgm source (docs/spec.md)
                         {"alert": "PCIeRootComplexLinkSaturated", "enabled": False}]
    data.update(edit)
    return data


def _load(tmp_path: Path, data: dict):
    path = tmp_path / "fusebox.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path)


def _trace(spec):
    groups = render_rules(spec).groups
    return trace_dashboards(spec, render_dashboards.dashboards(spec, groups=groups), groups)


def test_the_shipped_spec_leaves_24_of_51_panels_empty_and_every_variable_with_values():
    feds = _trace(load_spec(SPEC))
    panels = [f for f in feds if f.what == "panel"]
    # 33 before the preemption signal (its overview panel), the alignment row's two stage panels,
    # the shared PCIe links' two panels (overview, secondary), the connection signals' 7 and the SLO board's 6
    assert len(panels) == 51
    assert {(f.dashboard, f.title) for f in panels if not f.fed} == SHIPPED_EMPTY
    assert sum(f.fed for f in panels) == 27
    variables = {f.title: f for f in feds if f.what == "variable"}
    # namespace and pod filter no panel: left out; engine and model list the preemption record, which
    # vLLM's own counter feeds (the alignment record they listed before has no collector here)
    assert list(variables) == ["cluster", "instance", "gpu", "engine", "model"]
    assert [v for v, f in variables.items() if not f.fed] == []
    # each empty panel names the metric nothing publishes, or the join that cannot match
    why = {f.title: f.why for f in panels if not f.fed}
    assert "publishes fusebox_alignment_duration_seconds_bucket" in why["Share of observations over each threshold"]
    assert "publishes fusebox_kv_cache_usage_bytes" in why["KV-cache bytes per engine"]
    assert why["Energy per generated token"] == (
        "it joins host:fusebox_gpu_power:watts with host:fusebox_generation_tokens:rate5m on cluster, host_name, "
        "which host:fusebox_generation_tokens:rate5m does not carry")


def test_with_every_collector_and_the_engines_podmonitor_every_shipped_panel_is_fed(tmp_path):
    """What tests/dashboards/test_dashboards_prometheus.py shows on a real Prometheus (every panel query of the
    shipped dashboards returns data on a breach that publishes every collector's series, the
    engines' with host_name): the tracer agrees, panel by panel."""
    data = yaml.safe_load(SPEC.read_text())
    data["kubernetes"]["collectors"]["run"] = {"gpu": [], "kv": [], "latency": []}
    without_signals(data, *CONNECTION_SIGNALS)  # collect conns: not a DaemonSet collector (module doc)
    # the KV collector publishes bytes only for the models whose geometry it knows
    data["kubernetes"]["engines"] = dict(ENGINES, models={
        "llava-hf/llava-1.5-7b-hf": {"layers": 32, "kv_heads": 32, "head_dim": 128, "dtype": "float16"}})
    feds = _trace(_load(tmp_path, data))
    assert len([f for f in feds if f.what == "panel"]) == 44  # 38 and the SLO board's 6
    assert [(f.dashboard, f.title) for f in feds if not f.fed] == []


def test_a_dcgm_vllm_cluster_feeds_33_of_34_panels_and_every_variable(tmp_path):
    spec = _load(tmp_path, dcgm_vllm())
    feds = _trace(spec)
    panels = [f for f in feds if f.what == "panel"]
    # 25 before the preemption signal's overview panel and the two stage panels; 28 before the SLO board's 6
    assert len(panels) == 34
    assert [(f.dashboard, f.title) for f in panels if not f.fed] == [("gpu-memory", "KV pool free bytes per GPU")]
    variables = [f for f in feds if f.what == "variable"]
    assert [(f.title, f.fed) for f in variables] == [(v, True) for v in ("cluster", "instance", "gpu", "engine", "model")]
    # dcgm-exporter's series carry no cluster: the variable lists the latency collector's; engine and
    # model the alignment histogram's observation rate (a series whenever the histogram exists)
    queries = {t["name"]: t.get("query") for t in render_dashboards.dashboards(spec)["overview"]["templating"]["list"]}
    assert queries["cluster"] == "label_values(engine:fusebox_alignment_duration_seconds:count_rate5m, cluster)"
    assert queries["instance"].startswith("label_values(gpu:fusebox_gpu_memory_utilization:ratio{")
    assert queries["engine"].startswith("label_values(engine:fusebox_alignment_duration_seconds:count_rate5m{")


def test_without_the_alignment_collector_the_engine_variables_read_vllms_kv_time_to_full(tmp_path):
    """vLLM writes model_name, not model: the KV record keeps model from it (engine_labels), so the
    model variable lists the served models, and engine the pods (NAMESPACE/POD)."""
    data = dcgm_vllm()
    without_signals(data, "alignment_latency_p95")
    data["kubernetes"]["collectors"]["enabled"] = False
    spec = _load(tmp_path, data)
    feds = {f.title: f for f in _trace(spec) if f.what == "variable"}
    assert feds["engine"].fed and feds["model"].fed
    queries = {t["name"]: t.get("query") for t in render_dashboards.dashboards(spec)["overview"]["templating"]["list"]}
    assert queries["model"].startswith("label_values(engine:fusebox_kv_cache_time_to_full:seconds_deriv1m{")
    # nothing read carries cluster (dcgm-exporter, vLLM without it): the variable filters nothing away, no warning
    assert not feds["cluster"].fed and feds["cluster"].moot
    assert not [w for w in empty_panel_warnings(feds.values()) if "$cluster" in w]


@pytest.mark.parametrize(("source", "engines", "fed"), [
    ("fusebox", None, False),  # the engines' series carry neither cluster nor host_name
    ("fusebox", ENGINES, True),  # the PodMonitor adds both, as the GPU collector labels power
    ("dcgm", ENGINES, True),  # dcgm-exporter's power has no cluster, nor then the engines': host_name alone
    ("dcgm", None, False),
])
def test_energy_per_token_is_fed_where_the_engines_series_carry_the_node(tmp_path, source, engines, fed):
    data = yaml.safe_load(SPEC.read_text())
    data["global"]["source"] = source
    if engines:
        data["kubernetes"]["engines"] = engines
    spec = _load(tmp_path, data)
    [energy] = [f for f in _trace(spec) if f.title == "Energy per generated token"]
    assert energy.fed is fed
    if not fed:
        assert "set kubernetes.engines" in energy.fix
        assert "host:fusebox_generation_tokens:rate5m does not carry" in energy.why


def test_generate_warns_once_per_empty_panel_and_per_variable_without_values():
    spec = load_spec(SPEC)
    warnings = spec_warnings(spec)
    panels = [w for w in warnings if w.startswith("panel ")]
    assert len(panels) == len(SHIPPED_EMPTY) == 24
    for dashboard, title in SHIPPED_EMPTY:
        [w] = [w for w in panels if w.startswith(f"panel {title!r} (dashboards/fusebox-{dashboard}.json) stays empty: ")]
        assert " -- " in w  # and how to fix it
    # the engine and model variables list the preemption record, fed by vLLM's own counter
    assert [w.split(" lists")[0] for w in warnings if w.startswith("dashboard variable")] == []
    [kv] = [w for w in panels if w.startswith("panel 'KV pool usage per engine'")]
    assert "kubernetes.collectors.run: {kv:" in kv


def test_a_dcgm_vllm_cluster_warns_about_the_kv_pool_panel_alone(tmp_path):
    spec = _load(tmp_path, dcgm_vllm())
    panel_lines = [w for w in spec_warnings(spec) if w.startswith(("panel ", "dashboard variable"))]
    assert [w.split(" stays empty")[0] for w in panel_lines] == [
        "panel 'KV pool free bytes per GPU' (dashboards/fusebox-gpu-memory.json)"]


def test_the_tracer_follows_or_and_joins_label_by_label():
    spec = load_spec(SPEC)
    t = Tracer(spec, [{"rules": [{"record": "x:tokens", "expr": "sum by (cluster, host_name) (rate(vllm:generation_tokens_total[5m]))"},
                                 {"record": "x:power", "expr": f"sum by (cluster, host_name) ({C.PROM['gpu_power']})"}]}])
    assert t.expr("x:power").labels == {"cluster", "host_name"}
    assert t.expr("x:tokens").fed and t.expr("x:tokens").labels == frozenset()
    assert not t.expr("x:power / x:tokens").fed
    assert t.expr("x:power / on () x:tokens").fed  # matched on nothing: one series each side
    assert t.expr("x:power or fusebox_kv_cache_usage_bytes").fed  # either side
    assert not t.expr("x:power and fusebox_kv_cache_usage_bytes").fed  # both
    assert t.expr("x:power unless fusebox_kv_cache_usage_bytes").fed
    assert t.expr("1 - x:power").labels == {"cluster", "host_name"}
    # the label the engines lack is added where its source label is carried, as Prometheus would
    node = 'label_replace(vllm:num_requests_running, "host_name", "$1", "pod", "(.+)")'
    assert "host_name" in t.expr(node).labels
    assert "host_name" not in t.expr('label_replace(vllm:num_requests_running, "host_name", "$1", "node", "(.+)")').labels
    assert t.expr('label_replace(vllm:num_requests_running, "k", "v", "", "")').labels >= {"k"}
    assert "le" not in t.expr("histogram_quantile(0.9, fusebox_gpu_x_bucket)").labels


def test_pcie_left_enabled_on_the_dcgm_cluster_gets_its_absent_alert_and_warnings(tmp_path):
    """Not disabled, PCIe still reads the GPU collector, which this cluster does not run: its alert
    group holds its alert, its metric an absent alert, and generate names the signal and both panels."""
    spec = _load(tmp_path, dcgm_vllm(overrides=[]))
    groups = render_rules(spec).groups
    [own] = [g for g in groups if g["name"] == "fusebox-pcie_link_utilization"]
    assert [r.get("alert") for r in own["rules"]] == ["GPUPCIeLinkSaturated"]
    [absent] = [g for g in groups if g["name"] == "fusebox-absent"]
    assert "absent(fusebox_gpu_pcie_utilization_ratio)" in [r["expr"] for r in absent["rules"]]
    warnings = [w for w in spec_warnings(spec) if "fusebox_gpu_pcie_utilization_ratio" in w]
    assert [w.split(" (dashboards/")[0].split(" reads ")[0] for w in warnings] == [
        "signal 'pcie_link_utilization'", "panel 'GPUPCIeLinkSaturated: pcie link utilization'",
        "panel 'GPUPCIeLinkSaturated: pcie link utilization'"]


@pytest.mark.process
def test_the_dcgm_vllm_rules_have_no_empty_group_and_promtool_passes_them(tmp_path):
    """PCIe disabled with nothing to feed it: no group of its own (it was an empty one), no record,
    no absent alert; Debian's promtool checks the rule file; and vLLM's model_name becomes the
    KV record's model (what the model variable lists)."""
    from _dashboards_support import promtool_binary

    spec = _load(tmp_path, dcgm_vllm())
    out = render_all(spec)
    rules = yaml.safe_load(out["rules/fusebox.rules.yml"])
    assert [g["name"] for g in rules["groups"] if not g["rules"]] == []
    assert "pcie" not in out["rules/fusebox.rules.yml"]
    assert not any("pcie" in name for name in out if name.startswith("dashboards/"))
    rule_file = tmp_path / "fusebox.rules.yml"
    rule_file.write_text(out["rules/fusebox.rules.yml"])
    promtool = promtool_binary()
    r = subprocess.run([promtool, "check", "rules", str(rule_file)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    n_rules = sum(len(g["rules"]) for g in rules["groups"])
    assert f"SUCCESS: {n_rules} rules found" in r.stdout
    model = "llava-hf/llava-1.5-7b-hf"
    series = {"series": f'vllm:kv_cache_usage_perc{{engine="0",model_name="{model}",namespace="inference",pod="vllm-a",'
                        'job="vllm",instance="10.0.0.7:8000"}', "values": "0.1+0.001x40"}
    record = "engine:fusebox_kv_cache_time_to_full:seconds_deriv1m"
    test = {"rule_files": [rule_file.name], "evaluation_interval": "5s", "tests": [{
        "interval": "5s", "input_series": [series],
        "promql_expr_test": [{"expr": f"count by (engine, model) ({record})", "eval_time": "2m",
                              "exp_samples": [{"labels": f'{{engine="inference/vllm-a",model="{model}"}}', "value": 1}]}]}]}
    (tmp_path / "kv.test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    r = subprocess.run([promtool, "test", "rules", "kv.test.yml"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


SLO_BOARD = "slo"


def test_every_slo_panel_reads_records_the_slo_groups_write_and_is_fed_where_the_histogram_is(tmp_path):
    """The SLO board's queries name only records of the SLO groups (the error ratio per window,
    the budget left), never a raw histogram; where the histograms are published (the latency
    collector, vLLM's PodMonitor) every one of its 6 panels is fed and generate warns about none."""
    spec = _load(tmp_path, dcgm_vllm())
    groups = render_rules(spec).groups
    slo_records = {r["record"] for g in groups if g["name"].startswith("fusebox-slo-") for r in g["rules"] if "record" in r}
    board = render_dashboards.dashboards(spec, groups=groups)[SLO_BOARD]
    import promql_parser

    def names(node):
        kind = type(node).__name__
        if kind == "VectorSelector":
            return {node.name}
        return set().union(*(names(getattr(node, a)) for a in ("lhs", "rhs", "expr", "vector_selector") if hasattr(node, a)))

    read = [n for p in board["panels"] for t in p["targets"] for n in names(promql_parser.parse(t["expr"].replace("$cluster", ".*")))]
    assert len(board["panels"]) == 6 and len(read) == 2 * (1 + 4 + 4)  # per SLO: the budget, 4 page and 4 ticket windows
    assert set(read) <= slo_records and "slo:fusebox_time_to_first_token_error_budget:remaining_ratio" in read
    feds = [f for f in trace_dashboards(spec, {SLO_BOARD: board}, groups) if f.what == "panel"]
    assert [(f.title, f.fed) for f in feds if not f.fed] == []
    assert not [w for w in spec_warnings(spec) if "fusebox-slo.json" in w]


def test_an_slo_panel_on_a_record_no_rule_writes_is_reported_empty(tmp_path):
    """The trace is not vacuous: a burn-rate query on a window the SLO group does not record
    (ratio_rate10m) is an empty panel."""
    spec = _load(tmp_path, dcgm_vllm())
    groups = render_rules(spec).groups
    board = render_dashboards.dashboards(spec, groups=groups)[SLO_BOARD]
    target = board["panels"][1]["targets"][0]
    assert target["expr"].startswith("slo:fusebox_alignment_latency_errors:ratio_rate1h{")
    target["expr"] = target["expr"].replace("ratio_rate1h", "ratio_rate10m")
    board["panels"] = board["panels"][1:2]
    board["panels"][0]["targets"] = [target]
    [fed] = [f for f in trace_dashboards(spec, {SLO_BOARD: board}, groups) if f.what == "panel"]
    assert not fed.fed and "publishes slo:fusebox_alignment_latency_errors:ratio_rate10m" in fed.why
