"""Generated rules and tests under the real tools: promtool 2.42 (Debian) and 3.x (pinned build),
amtool's config check and routing tests; plus hand-written promtool tests (tests/promtool/)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _support import FIXTURES, ROOT, SPEC, need, promtools, trimmed_outputs, trimmed_spec

from fusebox.generator.outputs import render_all
from fusebox.generator.writer import write_outputs
from fusebox.spec import parse_spec

pytestmark = pytest.mark.tools
HAND = Path(__file__).resolve().parents[1] / "promtool"


def _run(cmd, cwd=None):
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.parametrize("which", [0, 1], ids=["promtool-2.42", "promtool-3"])
def test_generated_rules_pass_check_and_generated_tests(shipped_check, which):
    """promtool's `check rules` and `test rules` on the shipped outputs, as `fusebox check` ran them
    (conftest's shipped_check: one run for the session, promtool 2.42 then the pinned 3.x)."""
    pt = promtools()[which]
    version = "2.42" if which == 0 else r"3\.\d+"
    assert re.search(rf"^ok   promtool {version} check rules \S+/rules/fusebox\.rules\.yml$", shipped_check.stdout, re.M), \
        (pt, shipped_check.stdout + shipped_check.stderr)
    assert re.search(rf"^ok   promtool {version} test rules fusebox\.rules\.test\.yml$", shipped_check.stdout, re.M), \
        (pt, shipped_check.stdout + shipped_check.stderr)


def test_generated_tests_cover_every_tier_both_sides(generated, spec):
    text = (generated / "rules/fusebox.rules.test.yml").read_text()
    for sig in spec.signals:
        for t in sig.tiers:
            assert f"{sig.alert} {t.name}: {sig.name} just above {t.threshold_text}" in text
            assert f"{sig.alert} {t.name}: {sig.name} just below {t.threshold_text}" in text
    assert "zero traffic gives no quantile sample (absent, not NaN) and no alert" in text
    assert "only the absent alert fires" in text
    doc = yaml.safe_load(text)
    # zero traffic: no P50/P95/P99 sample, no alert, and no absent alert for the histogram's own metrics
    zero = next(g for g in doc["tests"] if any(s["series"].startswith("fusebox_alignment_duration_seconds_count")
                                               for s in g["input_series"]) and "promql_expr_test" in g)
    assert {c["expr"] for c in zero["promql_expr_test"]} == {
        f"absent(engine:{n})" for n in ("fusebox_alignment_duration_seconds:p50_rate5m",
                                        "fusebox_alignment_latency_p95:rate5m", "fusebox_alignment_duration_seconds:p99_rate5m")}
    checks = {c["alertname"]: c for c in zero["alert_rule_test"]}
    assert checks["AlignmentLatencyP95High"]["exp_alerts"] == []
    absent = {a["exp_labels"]["metric"] for a in checks["FuseboxSignalAbsent"]["exp_alerts"]}
    assert absent and not any(m.startswith("fusebox_alignment_duration_seconds") for m in absent)
    for group in doc["tests"]:
        for s in group["input_series"]:
            assert s["values"].endswith("stale"), s


@pytest.mark.parametrize("which", [0, 1], ids=["promtool-2.42", "promtool-3"])
def test_generated_tests_fail_when_a_threshold_drifts(tmp_path, which):
    """The generated tests can fail: nudge the critical GPU line from 0.783 to 0.7839 (on the
    GPU-memory-only spec: its cases are the shipped spec's GPU cases)."""
    pt = promtools()[which]
    trimmed_outputs(tmp_path)
    rules = tmp_path / "rules/fusebox.rules.yml"
    text = rules.read_text()
    assert ">= 0.783\n" in text
    rules.write_text(text.replace(">= 0.783\n", ">= 0.7839\n"))
    r = _run([pt, "test", "rules", "fusebox.rules.test.yml"], cwd=tmp_path / "rules")
    assert r.returncode != 0
    assert "GPUMemoryUtilizationHigh" in r.stdout + r.stderr


def _hand_test(out: Path, name: str, pt: str):
    shutil.copy(HAND / name, out / "rules" / name)
    r = _run([pt, "test", "rules", name], cwd=out / "rules")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("which", [0, 1], ids=["promtool-2.42", "promtool-3"])
@pytest.mark.parametrize("name", ["gpu_memory.test.yml", "gpu_scope.test.yml", "gpu_target_labels.test.yml", "kv_growth.test.yml", "alignment_p95.test.yml",
                                  "time_to_full.test.yml", "gauge_filter_first.test.yml",
                                  "dashboard_records.test.yml", "inpath_records.test.yml"])
def test_hand_written_values(generated, tmp_path, name, which):
    out = tmp_path / "g"
    shutil.copytree(generated, out)
    _hand_test(out, name, promtools()[which])


@pytest.mark.parametrize("which", [0, 1], ids=["promtool-2.42", "promtool-3"])
def test_mib_threshold_keeps_14_8_mb_per_s_silent(tmp_path, which):
    text = SPEC.read_text().replace("overrides: []", """overrides:
  - alert: KVCacheGrowthRateHigh
    tier: critical
    threshold: 14.7 MiB/s
""")
    spec = parse_spec(text, "fusebox.yaml")
    write_outputs(render_all(spec), tmp_path)
    assert ">= 15414067.2" in (tmp_path / "rules/fusebox.rules.yml").read_text()
    _hand_test(tmp_path, "kv_growth_mib.test.yml", promtools()[which])


@pytest.mark.parametrize("which", [0, 1], ids=["promtool-2.42", "promtool-3"])
def test_dashboard_gpu_bytes_from_dcgm_in_bytes(tmp_path, which):
    """With the dcgm source, the GPU drill-down's used and reserved bytes come from MiB fields."""
    text = SPEC.read_text().replace("    level: gpu\n    sources:\n", "    level: gpu\n    source: dcgm\n    sources:\n", 1)
    spec = parse_spec(text, "fusebox.yaml")
    assert spec.signal("gpu_memory_utilization").source.backend == "dcgm"
    write_outputs(render_all(spec), tmp_path)
    _hand_test(tmp_path, "dashboard_records_dcgm.test.yml", promtools()[which])


def test_alertmanager_config_and_routes(generated, spec):
    amtool = need("amtool")
    cfg = generated / "alertmanager/alertmanager.yml"
    r = _run([amtool, "check-config", str(cfg)])
    assert r.returncode == 0, r.stdout + r.stderr
    doc = yaml.safe_load(cfg.read_text())
    hook = doc["receivers"][0]["webhook_configs"][0]
    assert hook["url"] == "http://127.0.0.1:9095/alertmanager"
    assert hook["http_config"]["authorization"]["credentials_file"]
    assert "credentials" not in hook["http_config"]["authorization"]  # never inline
    ours = doc["route"]["routes"][0]
    assert ours["matchers"] == ['fusebox="multimodal-inference"']  # metadata.name of the shipped spec
    heartbeat, to_fuse = (r for r in ours["routes"] if r["receiver"] == "fusebox-fuse")
    assert heartbeat["matchers"] == ['alertname="FuseboxHeartbeat"'] and "continue" not in heartbeat
    assert to_fuse["matchers"] == ['fuse_action=~".+"'] and to_fuse["group_wait"] == "5s" and to_fuse["continue"] is True
    assert doc["inhibit_rules"][0]["source_matchers"] == ['fusebox="multimodal-inference"', 'severity="critical"']
    assert "alertname" in doc["inhibit_rules"][0]["equal"] and "hw_id" in doc["inhibit_rules"][0]["equal"]
    # routing (amtool prints the receiver names): a critical tier that requests a fuse reaches the
    # fuse and the people; a warning the people only; severity alone reaches nothing but the people
    crit = ["alertname=GPUMemoryUtilizationHigh", "severity=critical", "fusebox=multimodal-inference",
            "fuse_action=freeze_admissions"]
    for labels, receivers in ((crit, "fusebox-fuse,oncall"),
                              (["alertname=KVCacheGrowthRateHigh", "severity=warning", "fusebox=multimodal-inference"], "oncall"),
                              (["alertname=GPUMemoryUtilizationHigh", "severity=critical"], "oncall"),
                              (["alertname=Other"], "oncall"),
                              (["alertname=FuseboxHeartbeat", "severity=none", "fusebox=multimodal-inference"], "fusebox-fuse"),
                              (["alertname=FuseboxFuseDown", "severity=critical", "fusebox=multimodal-inference"], "oncall")):
        r = _run([amtool, "config", "routes", "test", f"--config.file={cfg}", *labels])
        assert r.returncode == 0 and r.stdout.strip() == receivers, (labels, r.stdout + r.stderr)


def test_fusebox_check_cli_runs_all_tools(shipped_check):
    promtools()
    r = shipped_check
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed" in r.stdout
    assert f"ok   generated files match {SPEC}" in r.stdout
    assert r.stdout.count("test rules fusebox.rules.test.yml") == 2  # 2.42 and 3.x
    assert "promtool 2.42 test rules" in r.stdout
    # before each slow tool family, a line on stderr says what runs (a minute or more each on 2 cores)
    running = [ln for ln in r.stderr.splitlines() if ln.startswith("fusebox check: running ")]
    assert [ln.split(":")[1].split(",")[0].split()[1:] for ln in running] == [
        ["promtool", "2.42"], ["vmalert", "-dryRun"], ["thanos", "tools", "rules-check"], ["amtool", "check-config"]], running
    assert re.match(r"fusebox check: running promtool 2\.42, promtool 3\.\d+: check rules, test rules", running[0]), running


def test_fusebox_check_reports_failure_against_the_spec(tmp_path):
    promtools()
    out = tmp_path / "g"
    spec = trimmed_outputs(out, "kv_cache_growth_rate")
    text = spec.read_text()
    rules = out / "rules/fusebox.rules.yml"
    assert rules.read_text().count(">= 14700000\n") == 1
    rules.write_text(rules.read_text().replace(">= 14700000\n", ">= 15000000\n"))
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "check", "--spec", str(spec), "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 1
    line = next(i for i, l in enumerate(text.splitlines(), 1) if l.startswith("  kv_cache_growth_rate:"))
    assert f"{spec}:{line}:" in r.stdout and "KVCacheGrowthRateHigh" in r.stdout


def test_fusebox_check_fails_files_the_spec_no_longer_generates(tmp_path):
    """The spec's GPU memory critical tier moved from 78.3 % to 80 % without `fusebox generate`: the
    tools pass the old files, the check does not (exit 1), naming each stale file and the fix."""
    promtools()
    generated = tmp_path / "g"
    spec = trimmed_outputs(generated)
    text = spec.read_text()
    assert text.count("threshold: 78.3%") == 1
    spec.write_text(text.replace("threshold: 78.3%", "threshold: 80%"))
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "check", "--spec", str(spec), "--out", str(generated)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"FAIL generated files match {spec}" in r.stdout
    for rel in ("rules/fusebox.rules.yml", "rules/fusebox.rules.test.yml"):
        assert f"{generated / rel}: differs from what {spec} generates -- run `fusebox generate --spec {spec}" in r.stdout
    assert "alertmanager.yml: differs" not in r.stdout  # routing does not read the threshold
    assert r.stdout.rstrip().endswith(" passed, 1 failed"), r.stdout  # every tool passed the old files
    # the same files against the spec that generated them pass: test_fusebox_check_cli_runs_all_tools


def test_fusebox_check_against_engine_captures_fails_on_dead_selectors(tmp_path):
    """An engine's own /metrics holds none of the collectors' series: the check fails (exit 1)
    and names them, with the hint to capture the collectors too."""
    promtools()
    spec = trimmed_outputs(tmp_path, "kv_cache_growth_rate")
    captures = sorted(str(p) for p in FIXTURES.glob("generator/*vllm*.txt"))
    assert captures
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "check", "--spec", str(spec), "--out", str(tmp_path),
                        "--against", *captures], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert ": FuseboxGPUDown: fusebox_gpu_up matches no series: no metric fusebox_gpu_up in the captures" in r.stdout
    assert "hint: fusebox_* and hw_* series come from the fusebox collectors" in r.stdout
    # the tools themselves passed: only the dead-selector check failed
    assert r.stdout.rstrip().endswith(", 1 failed") and "FAIL" not in r.stdout


def test_missing_promtool_is_a_clear_message(generated, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "check", "--spec", str(SPEC), "--out", str(generated)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 3
    assert "promtool not found" in r.stderr and "apt-get install prometheus" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("which", [0, 1], ids=["promtool-2.42", "promtool-3"])
def test_selector_and_extra_labels_reach_rules_and_generated_tests(tmp_path, which):
    text = SPEC.read_text().replace("  selector: {}", '  selector: {cluster: prod-a}').replace(
        "  labels: {}", "  labels: {team: ml-infra}")
    spec = parse_spec(trimmed_spec(text, "kv_cache_growth_rate"), "fusebox.yaml")  # the tools' run in seconds
    write_outputs(render_all(spec), tmp_path)
    rules = (tmp_path / "rules/fusebox.rules.yml").read_text()
    assert 'hw_gpu_memory_usage_bytes{cluster="prod-a"}' in rules
    assert 'absent(fusebox_kv_cache_usage_bytes{cluster="prod-a"})' in rules
    doc = yaml.safe_load(rules)
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert all(a["labels"]["team"] == "ml-infra" for a in alerts)
    pt = promtools()[which]
    r = _run([pt, "test", "rules", "fusebox.rules.test.yml"], cwd=tmp_path / "rules")
    assert r.returncode == 0, r.stdout + r.stderr


EXTRA_SIGNALS = '''
  gpu_free_headroom:
    alert: GPUFreeMemoryLow
    description: Share of device memory still free (a lower bound).
    kind: gauge
    unit: ratio
    level: gpu
    direction: below
    sources:
      fusebox:
        metric: fusebox_gpu_memory_free_ratio
    tiers:
      warning: {threshold: 20%}
      critical: {threshold: 10%, fuse: freeze_admissions}
    runbook: {symptom: Little device memory is left., impact: The next batch may OOM.}
  custom_expr:
    alert: CustomMeanLatencyHigh
    description: Mean request latency from a custom expression.
    kind: gauge
    unit: seconds
    level: engine
    sources:
      fusebox:
        expr: max by (engine) (rate(foo_seconds_sum[5m]) / rate(foo_seconds_count[5m]))
    tiers:
      critical: {threshold: 2s}
    runbook: {symptom: Slow., impact: Slower.}
'''


@pytest.mark.parametrize("which", [0, 1], ids=["promtool-2.42", "promtool-3"])
def test_lower_bound_and_custom_expression_signals(tmp_path, which):
    text = SPEC.read_text().replace("# Per-alert changes without forking", EXTRA_SIGNALS + "\n# Per-alert changes without forking")
    spec = parse_spec(trimmed_spec(text, "gpu_free_headroom", "custom_expr"), "fusebox.yaml")  # the tools' run in seconds
    write_outputs(render_all(spec), tmp_path)
    rules = yaml.safe_load((tmp_path / "rules/fusebox.rules.yml").read_text())
    alerts = {(r["alert"], r["labels"]["severity"]): r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert alerts[("GPUFreeMemoryLow", "critical")]["expr"] == "gpu:fusebox_gpu_free_headroom:ratio <= 0.1"
    absent = {r["labels"]["metric"] for (name, _), r in alerts.items() if name == "FuseboxSignalAbsent"} | {
        r["labels"]["metric"] for g in rules["groups"] for r in g["rules"] if r.get("alert") == "FuseboxSignalAbsent"}
    assert {"foo_seconds_sum", "foo_seconds_count", "fusebox_gpu_memory_free_ratio"} <= absent
    tests = (tmp_path / "rules/fusebox.rules.test.yml").read_text()
    assert "GPUFreeMemoryLow critical: gpu_free_headroom just below 10%" in tests  # the firing side
    r = _run([promtools()[which], "test", "rules", "fusebox.rules.test.yml"], cwd=tmp_path / "rules")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("which", [0, 1], ids=["promtool-2.42", "promtool-3"])
def test_generated_tests_pass_at_prometheus_default_evaluation_interval(tmp_path, which):
    """``evaluation_interval: 1m`` (Prometheus's own default) with the 5s scrape: the generated
    tests step at the scrape interval (Spec.test_interval_s), as the samples come on a server, and
    pass. Stepping at 1m they had failed: a 1m window then held one sample under Prometheus 3's
    left-open ranges (KV growth's deriv(...[1m]) and the scaling load read nothing at 3m), and
    under promtool 2 the restarted engine's two samples after the drop gave a time-to-full sample
    where the case expects none."""
    text = SPEC.read_text()
    assert "\n  scrape_interval: 5s\n  evaluation_interval: 5s\n" in text
    text = text.replace("\n  evaluation_interval: 5s\n", "\n  evaluation_interval: 1m\n")
    trimmed_outputs(tmp_path, "alignment_latency_p95", "kv_cache_growth_rate", "kv_cache_time_to_full", text=text)
    rules = yaml.safe_load((tmp_path / "rules/fusebox.rules.yml").read_text())
    assert {g["interval"] for g in rules["groups"] if g["name"] == "fusebox-kv_cache_growth_rate"} == {"1m"}  # the rules keep 1m
    tests = yaml.safe_load((tmp_path / "rules/fusebox.rules.test.yml").read_text())
    assert tests["evaluation_interval"] == "5s" and {g["interval"] for g in tests["tests"]} == {"5s"}
    titles = (tmp_path / "rules/fusebox.rules.test.yml").read_text()
    assert "an engine restart (used drops to about 0)" in titles and "Scaling llava-7b on kv_cache_growth_rate" in titles
    r = _run([promtools()[which], "test", "rules", "fusebox.rules.test.yml"], cwd=tmp_path / "rules")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
