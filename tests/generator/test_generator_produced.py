"""Every metric the generated rules read is published by an exporter the spec names or produced by
something k8s/ deploys (issue 21, items 1 and "Done when").

The cluster of the issue: dcgm-exporter for GPU memory, vLLM engines scraped by the user's own
ServiceMonitor, ``kubernetes.collectors.enabled: false``. Published names come from real
captures (tests/fixtures/generator/SOURCES.md): dcgm-exporter 4.5's default counters CSV (each
field is one ``DCGM_FI_*`` metric), and the vLLM V1 ``/metrics`` captures. What ``k8s/`` deploys
is read from the generated manifests: a container running ``fuse`` publishes the fuse service's
metrics (fusebox.conventions.FUSE_METRICS), one running ``collect NAME`` that collector's. The
stack the rules run on adds Prometheus' own series (``up``) and Alertmanager's
(``alertmanager_notifications_failed_total``, from the user's Alertmanager the AlertmanagerConfig
routes through).

vLLM and SGLang publish no KV bytes and no alignment histogram (docs/metrics.md sections 1-2), so
such a cluster keeps only the signals that have a dcgm or vLLM source; the KV-growth, alignment
and PCIe signals need the fusebox collectors, and ``fusebox generate`` says so, naming each.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest
import yaml
from _cli import Result, run_cli
from _support import FIXTURES, SPEC, without_signals, yaml_data, yaml_text
from prometheus_client.parser import text_string_to_metric_families

from fusebox import conventions as C
from fusebox.generator.deadselectors import SYNTHETIC, dead_selectors, load_captures, load_rules
from fusebox.spec.promql import vector_selectors

GEN = FIXTURES / "generator"
VLLM_CAPTURES = [GEN / "hardware-aware-router_vllm-v1_qwen1.5-0.5b-chat_idle_2025-11.txt",
                 GEN / "hardware-aware-router_vllm-v1_tinyllama-1.1b_idle_2025-11.txt"]
DCGM_CSV = GEN / "default-counters_4.5.3-4.8.2.csv"
# The in-path gateways of the shipped spec's inpath.shedders, captured from the lock's binaries
# (tests/fixtures/generator/SOURCES.md): smg 1.13 and sglang-router 0.3.2.
GATEWAY_CAPTURES = sorted(GEN.glob("smg-1.13.0_*_metrics.txt")) + sorted(GEN.glob("sglang-router-0.3.2_*_metrics.txt"))
# Signals with neither a dcgm nor a vLLM source in the shipped spec (fusebox collectors only).
COLLECTOR_ONLY = ("pcie_link_utilization", "alignment_latency_p95", "kv_cache_growth_rate", "kv_cache_growth_oom",
                  "pcie_root_complex_utilization",
                  "connection_idle_p95", "connection_cold_start_share")


def dcgm_names() -> set[str]:
    """The DCGM_FI_* fields of dcgm-exporter 4.5's default counters (first CSV column)."""
    out = set()
    for line in DCGM_CSV.read_text().splitlines():
        field = line.split(",")[0].strip()
        if field.startswith("DCGM_FI_"):
            out.add(field)
    return out


def exposition_names(paths: list[Path]) -> set[str]:
    """Every sample name in Prometheus text-format captures (families' _bucket, _count, _total ...)."""
    out = set()
    for p in paths:
        for fam in text_string_to_metric_families(p.read_text()):
            out.update(s.name for s in fam.samples)
    return out


def deployed_names(k8s: Path) -> set[str]:
    """Metrics of what the generated k8s/ manifests run: the fuse service, the fusebox collectors."""
    out: set[str] = set()
    for f in sorted(k8s.glob("*.yml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if not doc or doc.get("kind") not in ("Deployment", "DaemonSet"):
                continue
            for c in doc["spec"]["template"]["spec"]["containers"]:
                args = c.get("args", [])
                if args[:1] == ["fuse"]:
                    out.update(C.FUSE_METRICS.values())
                    out.update(f"{m}_{s}" for m in C.FUSE_METRICS.values() for s in ("bucket", "count", "sum"))
                if args[:1] == ["collect"]:
                    out.add(f"collector:{args[1]}")
    return out


def dcgm_vllm_spec(keep_collector_signals: bool = False) -> str:
    data = yaml_data(SPEC.read_text())
    data["global"]["source"] = "dcgm"
    data["global"]["selectors"] = {"vllm": {}}  # the engines are vLLM (no SGLang)
    data["kubernetes"]["collectors"]["enabled"] = False
    data["signals"]["kv_cache_time_to_full"]["source"] = "vllm"  # the engine's own KV fraction, no collector
    if not keep_collector_signals:
        without_signals(data, *COLLECTOR_ONLY)
    return yaml_text(data, sort_keys=False)


def _generate(tmp_path: Path, text: str) -> Result:
    spec = tmp_path / "fusebox.yaml"
    spec.write_text(text)
    return run_cli("generate", "--spec", str(spec), "--out", str(tmp_path / "out"))


def rule_reads(rules_file: Path) -> dict[str, set[str]]:
    """metric name -> the rules reading it, for every selector of every rule that is not a record."""
    rules = load_rules(rules_file)
    recorded = {r.name for r in rules if r.record}
    reads: dict[str, set[str]] = {}
    for r in rules:
        for sel in vector_selectors(r.expr):
            if sel.name not in recorded:
                reads.setdefault(sel.name, set()).add(r.name)
    return reads


def test_every_metric_the_rules_read_is_published_or_deployed(tmp_path):
    r = _generate(tmp_path, dcgm_vllm_spec())
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    assert len(GATEWAY_CAPTURES) == 4
    published = (dcgm_names() | exposition_names(VLLM_CAPTURES) | exposition_names(GATEWAY_CAPTURES)
                 | deployed_names(out / "k8s") | set(SYNTHETIC))
    stack = {C.AM_NOTIFICATIONS_FAILED}  # the user's Alertmanager, which the fuse's route goes through
    reads = rule_reads(out / "rules/fusebox.rules.yml")
    assert {m for m in reads if m.startswith("DCGM_FI_")}, "GPU memory reads dcgm-exporter"
    assert {m for m in reads if m.startswith("vllm:")}, "the dashboard records read vLLM"
    # The prefix-cache record also reads vLLM's pre-0.9 spelling with `or` (docs/pitfalls.md P4;
    # renamed in vLLM PR #18354, removed in PR #29330): no capture here has it, a vLLM of 0.9 or
    # later matches the other side of the `or`. The only names allowed without a capture.
    compat = {C.VLLM_PREFIX_CACHE_HITS_OLD, C.VLLM_PREFIX_CACHE_QUERIES_OLD}
    unpublished = {m: sorted(rs) for m, rs in reads.items() if m not in published | stack | compat}
    assert unpublished == {}
    # and the vLLM selectors' label matchers match the captures (no le="120" kind of mistake)
    vllm_caps = load_captures(VLLM_CAPTURES)
    rep = dead_selectors(load_rules(out / "rules/fusebox.rules.yml"), vllm_caps)
    assert [d.selector for d in rep.dead if d.selector.startswith("vllm:") and d.selector not in compat] == []
    # the in-path records' selectors match the gateways' captures (result="rejected" and all)
    gw = {m for m in reads if m.startswith(C.GATEWAY_PREFIX)}
    assert gw == {C.GATEWAY_ADMISSIONS, C.GATEWAY_OVERLOAD_SHED, C.GATEWAY_BREAKER_STATE}
    rep = dead_selectors(load_rules(out / "rules/fusebox.rules.yml"), load_captures(GATEWAY_CAPTURES))
    assert [d.selector for d in rep.dead if d.selector.startswith(C.GATEWAY_PREFIX)] == []
    # nothing to warn about but the starter spec's placeholders (the runbook URL, the people's receiver)
    # and energy per token: without kubernetes.engines nothing gives the engines' tokens the node to
    # divide its power by
    [energy] = [ln for ln in r.stderr.splitlines() if "warning:" in ln and "runbook_base_url" not in ln
                and "warning: fuse.human_receiver 'oncall' has no configs" not in ln]
    assert "panel 'Energy per generated token' (dashboards/fusebox-secondary.json) stays empty" in energy
    assert "set kubernetes.engines" in energy


def test_generate_names_each_signal_that_reads_what_nothing_deploys(tmp_path):
    r = _generate(tmp_path, dcgm_vllm_spec(keep_collector_signals=True))
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if "warning:" in ln]
    for name, metric in (("kv_cache_growth_rate", C.PROM["kv_cache_usage"]),
                         ("alignment_latency_p95", C.PROM["alignment_duration"] + "_bucket")):
        [w] = [w for w in warnings if f"signal {name!r} reads" in w]
        assert metric in w and "nothing k8s/ deploys produces" in w
    # the mechanical check agrees: those metrics are read, and nothing publishes them
    reads = rule_reads(tmp_path / "out/rules/fusebox.rules.yml")
    published = dcgm_names() | exposition_names(VLLM_CAPTURES) | deployed_names(tmp_path / "out/k8s")
    assert {C.PROM["kv_cache_usage"], C.PROM["alignment_duration"] + "_count"} <= set(reads) - published


def test_generate_says_what_device_memory_alone_does_on_a_preallocating_engine(tmp_path):
    """The starter spec runs the GPU collector only: the GPU-memory signal's KV correction has no
    input, so it reads device memory, which vLLM holds at ~90% (gpu_memory_utilization 0.9) --
    over the 78.3% critical line. The warning says that, not "stays empty"."""
    r = _generate(tmp_path, SPEC.read_text())
    assert r.returncode == 0, r.stderr
    [w] = [ln for ln in r.stderr.splitlines() if "signal 'gpu_memory_utilization'" in ln]
    assert "reads device memory alone" in w and "stay empty" not in w
    assert "critical tier (78.3%, fuse freeze_admissions)" in w and "kubernetes.collectors.run: {kv:" in w
    for name in ("kv_cache_growth_rate", "alignment_latency_p95"):  # these do stay empty
        [w] = [ln for ln in r.stderr.splitlines() if f"signal {name!r} reads" in ln]
        assert "stay empty" in w


MIB = 1_048_576
DCGM_MIG = GEN / "dcgm-exporter_4.5_h100-mig_shape.txt"
UUID = "GPU-3f9a6c21-7d4e-4b8a-9c2f-5e1d0a7b8c90"


def _wait(base: str, expr: str, n: int, timeout: float = 90.0) -> list[dict]:
    import time

    from _dashboards_support import query

    end = time.monotonic() + timeout
    while True:
        got = query(base, expr)
        if len(got) >= n or time.monotonic() > end:
            return got
        time.sleep(0.5)


@pytest.mark.tools
def test_the_rules_on_a_real_prometheus_over_dcgm_and_vllm_captures(tmp_path):
    """A real Prometheus scrapes dcgm-exporter 4.5's shape (an H100 in two MIG instances) and a
    vLLM V1 capture, running the generated rules: each GPU record has one series per MIG
    instance (hw_id UUID/GPU_I_ID), with the values worked out from the MiB fields by hand."""
    from _dashboards_support import prometheus, serve_text

    r = _generate(tmp_path, dcgm_vllm_spec())
    assert r.returncode == 0, r.stderr
    servers = [serve_text(DCGM_MIG.read_bytes()), serve_text(VLLM_CAPTURES[1].read_bytes())]
    try:
        jobs = [{"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{s.server_address[1]}"]}]}
                for job, s in zip(("dcgm-exporter", "vllm"), servers, strict=False)]
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
               "rule_files": [str(tmp_path / "out/rules/fusebox.rules.yml")], "scrape_configs": jobs}
        with prometheus(tmp_path, cfg) as base:
            # MIG 3g.40gb (GPU_I_ID 1): USED 33500 + FREE 6500 + RESERVED 192 = 40192 MiB, 1 - 6500/40192
            # MIG 2g.20gb (GPU_I_ID 5): 5200 + 14800 + 96 = 20096 MiB, 1 - 14800/20096
            want = {f"{UUID}/1": (1 - 6500 / 40192, 40192), f"{UUID}/5": (1 - 14800 / 20096, 20096)}
            util = _wait(base, "gpu:fusebox_gpu_memory_utilization:ratio", 2)
            assert {s["metric"]["hw_id"]: float(s["value"][1]) for s in util} == pytest.approx(
                {k: v for k, (v, _) in want.items()})
            assert {s["metric"]["hw_gpu_mig"] for s in util} == {"true"}
            assert {s["metric"]["host_name"] for s in util} == {"gpu-node-1"}
            total = _wait(base, "gpu:fusebox_gpu_memory_total:bytes", 2)
            assert {s["metric"]["hw_id"]: float(s["value"][1]) for s in total} == {k: t * MIB for k, (_, t) in want.items()}
            bw = _wait(base, "gpu:fusebox_memory_bandwidth_saturation:ratio", 2)
            assert {s["metric"]["hw_id"]: float(s["value"][1]) for s in bw} == {f"{UUID}/1": 0.613, f"{UUID}/5": 0.048}
            power = _wait(base, "host:fusebox_gpu_power:watts", 1)
            assert [(s["metric"].get("host_name"), float(s["value"][1])) for s in power] == [("gpu-node-1", 412.5)]
            # the idle vLLM capture: tokens per second 0, a sample all the same
            assert [float(s["value"][1]) for s in _wait(base, "host:fusebox_generation_tokens:rate5m", 1)] == [0.0]
            # 0.838 >= 78.3 % on instance 1 only: its critical alert is pending (for: 30s) or firing
            alerts = _wait(base, 'ALERTS{alertname="GPUMemoryUtilizationHigh", severity="critical"}', 1)
            assert {s["metric"]["hw_id"] for s in alerts} == {f"{UUID}/1"}
    finally:
        for s in servers:
            s.shutdown()


KV_POOL_SIGNAL = """
kv_pool_usage:
  alert: VLLMKVPoolUsageHigh
  description: Share of the vLLM engine's KV-cache blocks in use.
  kind: gauge
  unit: ratio
  level: engine
  by: [engine, model_name]
  sources:
    vllm: {metric: "vllm:kv_cache_usage_perc"}
  tiers:
    warning: {threshold: 90%, for: 1m}
  runbook: {symptom: KV pool nearly full., impact: The engine preempts requests.}
"""


def test_engine_identity_comes_from_the_pod_where_vllms_engine_label_is_an_index(tmp_path):
    """Two vLLM pods, each with engine="0" as vLLM writes it (the V1 capture's labels, the pod's
    namespace and pod added by the scrape): two series and two alerts, engine NAMESPACE/POD."""
    data = yaml.safe_load(dcgm_vllm_spec())
    data["signals"].update(yaml.safe_load(KV_POOL_SIGNAL))
    r = _generate(tmp_path, yaml_text(data, sort_keys=False))
    assert r.returncode == 0, r.stderr
    model = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
    series = [{"series": f'vllm:kv_cache_usage_perc{{engine="0",model_name="{model}",namespace="inference",'
                         f'pod="{pod}",job="vllm"}}', "values": f"{v}x20"} for pod, v in (("vllm-a", 0.95), ("vllm-b", 0.93))]
    pods = (("vllm-a", 0.95), ("vllm-b", 0.93))
    records = {"expr": "engine:fusebox_kv_pool_usage:ratio", "eval_time": "10s", "exp_samples": [
        {"labels": f'engine:fusebox_kv_pool_usage:ratio{{engine="inference/{pod}",model_name="{model}"}}', "value": v}
        for pod, v in pods]}
    # one alert per pod (ALERTS carries the alert's labels; the annotations are not what is tested)
    alerts = {"expr": 'count by (engine) (ALERTS{alertname="VLLMKVPoolUsageHigh", alertstate="firing"})',
              "eval_time": "90s", "exp_samples": [{"labels": f'{{engine="inference/{pod}"}}', "value": 1} for pod, _ in pods]}
    test = {"rule_files": [str(tmp_path / "out/rules/fusebox.rules.yml")], "evaluation_interval": "5s",
            "tests": [{"interval": "5s", "input_series": series, "promql_expr_test": [records, alerts]}]}
    path = tmp_path / "engine.test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    from _dashboards_support import promtool_binary

    out = subprocess.run([promtool_binary(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_dashboard_query_reads_a_record_or_a_published_metric(tmp_path):
    """The dashboards of the dcgm + vLLM cluster: every panel query and template variable reads a
    record the rules make or a metric the exporters publish (no panel bound to be empty for want
    of a series); no namespace and pod variables, which no panel filters by (issue 33)."""
    import json
    import re

    r = _generate(tmp_path, dcgm_vllm_spec())
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    recorded = {rule.name for rule in load_rules(out / "rules/fusebox.rules.yml") if rule.record}
    published = dcgm_names() | exposition_names(VLLM_CAPTURES) | deployed_names(out / "k8s") | set(SYNTHETIC)
    exprs: list[tuple[str, str]] = []
    for f in sorted((out / "dashboards").glob("*.json")):
        d = json.loads(f.read_text())
        exprs += [(f.name, t["expr"]) for p in d["panels"] for t in p.get("targets", [])]
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                exprs.append((f.name, re.fullmatch(r"label_values\((.*), \w+\)", v["query"]).group(1)))
                assert v["name"] not in ("namespace", "pod")
    read = {}
    for name, expr in exprs:
        for sel in vector_selectors(re.sub(r"\$(\w+)", ".*", expr)):
            read.setdefault(sel.name, name)
    assert {m: f for m, f in read.items() if m not in recorded | published} == {}


@contextlib.contextmanager
def _dcgm_and_a_generating_vllm(tmp_path: Path, engine_labels: dict[str, str]):
    """A real Prometheus running tmp_path/out's rules over dcgm-exporter's MIG capture and a vLLM
    generating 100 tokens per second, its scrape adding ``engine_labels`` (what a monitor's
    relabelings add); yields its base URL."""
    import re
    import time

    from _dashboards_support import prometheus, serve_text

    capture = VLLM_CAPTURES[1].read_text()
    start = time.time()

    def exposition() -> bytes:
        tokens = 100.0 * (time.time() - start)
        return re.sub(r"^(vllm:generation_tokens_total\{[^}]*\}) \S+$", lambda m: f"{m.group(1)} {tokens}",
                      capture, flags=re.M).encode()

    engine = serve_text(exposition)
    dcgm = serve_text(DCGM_MIG.read_bytes())
    try:
        jobs = [{"job_name": "dcgm-exporter", "static_configs": [{"targets": [f"127.0.0.1:{dcgm.server_address[1]}"]}]},
                {"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{engine.server_address[1]}"],
                                                         "labels": engine_labels}]}]
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
               "rule_files": [str(tmp_path / "out/rules/fusebox.rules.yml")], "scrape_configs": jobs}
        with prometheus(tmp_path, cfg) as base:
            yield base
    finally:
        engine.shutdown()
        dcgm.shutdown()


@pytest.mark.tools
def test_energy_per_token_joins_dcgm_power_and_vllm_tokens_with_the_engines_podmonitors_labels(tmp_path):
    """With kubernetes.engines the vLLM series get host_name from their node (the PodMonitor's
    relabeling; emulated here as the scrape's target label, the same result) and, dcgm-exporter's
    series carrying no cluster, no cluster: energy per generated token joins dcgm's power on the
    node: J per token x tokens per second = dcgm's 412.5 W. generate's tracing says it is fed."""
    from _dashboards_support import query

    data = yaml.safe_load(dcgm_vllm_spec())
    data["kubernetes"]["engines"] = {"selector": {"app.kubernetes.io/name": "vllm"}, "port": "http"}
    r = _generate(tmp_path, yaml_text(data, sort_keys=False))
    assert r.returncode == 0, r.stderr
    assert "Energy per generated token" not in r.stderr
    [pm] = [d for d in yaml.safe_load_all((tmp_path / "out/k8s/engines.yml").read_text()) if d]
    relabel = pm["spec"]["podMetricsEndpoints"][0]["relabelings"]
    # no cluster: dcgm-exporter has none (and the node as the shard key, docs/rule-engines.md "Sharding")
    assert [x["targetLabel"] for x in relabel] == ["host_name", "__tmp_hash"]
    with _dcgm_and_a_generating_vllm(tmp_path, {"host_name": "gpu-node-1"}) as base:
        got = _wait(base, "host:fusebox_energy_per_generated_token:joules_rate5m", 1)
        assert [s["metric"].get("host_name") for s in got] == ["gpu-node-1"]
        # Until the 5m window has filled, rate() divides the tokens so far by 300 s (not 100/s
        # yet); at one instant, J per token x tokens per second is the GPU's 412.5 W.
        at = float(got[0]["value"][0])
        [joules] = query(base, "host:fusebox_energy_per_generated_token:joules_rate5m", at)
        [tokens] = query(base, "host:fusebox_generation_tokens:rate5m", at)
        assert tokens["metric"].get("host_name") == "gpu-node-1" and float(tokens["value"][1]) > 0
        assert float(joules["value"][1]) * float(tokens["value"][1]) == pytest.approx(412.5)


@pytest.mark.tools
def test_without_the_engines_node_energy_per_token_stays_empty_as_generate_says(tmp_path):
    """The same scrape without kubernetes.engines (the user's own monitor, no relabeling): power per
    host and tokens per host each have a series, and their join none -- the panel generate named as
    staying empty (issue 33), because the tokens carry no host_name (generator/tracing.py)."""
    from _dashboards_support import query

    data = yaml.safe_load(dcgm_vllm_spec())
    data["global"]["slow_evaluation_interval"] = "5s"  # the dashboard records' group at once
    r = _generate(tmp_path, yaml_text(data, sort_keys=False))
    assert r.returncode == 0, r.stderr
    [w] = [ln for ln in r.stderr.splitlines() if "panel 'Energy per generated token'" in ln]
    assert "host:fusebox_generation_tokens:rate5m does not carry" in w
    with _dcgm_and_a_generating_vllm(tmp_path, {}) as base:
        [tokens] = _wait(base, "host:fusebox_generation_tokens:rate5m > 0", 1)
        assert "host_name" not in tokens["metric"]
        at = float(tokens["value"][0])
        [power] = query(base, "host:fusebox_gpu_power:watts", at)
        assert power["metric"].get("host_name") == "gpu-node-1"
        # the energy record runs right after the tokens' in the same group evaluation: none
        assert query(base, "host:fusebox_energy_per_generated_token:joules_rate5m", at) == []
