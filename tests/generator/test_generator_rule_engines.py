"""The rules on other engines than one Prometheus (global.rule_engine, docs/rule-engines.md): the
generated tests under the real vmalert-tool and vmalert (VictoriaMetrics v1.151.0, built by
tools/build-victoriametrics.sh), group sizes within Grafana Mimir's default ruler limits with every
recording chain whole, Thanos' partial_response_strategy, and the spec field itself.

Lags, chains and limits are worked out here from the rule text with a regex, not with the
generator's own helpers."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _cli import run_cli
from _support import ROOT, SPEC, need, promtools, trimmed_outputs, trimmed_spec, yaml_data

from fusebox.generator.outputs import render_all
from fusebox.generator.writer import write_outputs
from fusebox.spec import SpecError, parse_spec
from fusebox.spec.units import parse_duration
from fusebox.tooling import ToolMissing, thanos_tool, victoriametrics_tool

VM_TESTS = "fusebox.rules.vmalert.test.yml"
# Grafana Mimir's default ruler limits: -ruler.max-rules-per-rule-group and
# -ruler.max-rule-groups-per-tenant (https://grafana.com/docs/mimir/latest/configure/configuration-parameters/).
MIMIR_RULES_PER_GROUP = 20
MIMIR_GROUPS_PER_TENANT = 70


def _vm(name: str) -> str:
    try:
        return need(str(victoriametrics_tool(name)))
    except ToolMissing as e:
        return need(name, str(e))


def _run(cmd, cwd=None):
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600)


def _unittest(rules_dir: Path) -> subprocess.CompletedProcess:
    return _run([_vm("vmalert-tool"), "unittest", f"--files={rules_dir / VM_TESTS}"], cwd=rules_dir)


def _spec_text(**replace: str) -> str:
    text = SPEC.read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def _generate(tmp_path: Path, text: str) -> Path:
    write_outputs(render_all(parse_spec(text, "fusebox.yaml")), tmp_path)
    return tmp_path


def _records(groups) -> dict[str, str]:
    """record name -> the group that records it."""
    return {r["record"]: g["name"] for g in groups for r in g["rules"] if "record" in r}


def _reads(expr: str, names) -> set[str]:
    """The record names an expression selects: the name, not followed by more name characters."""
    return {n for n in names if re.search(r"(?<![\w:])" + re.escape(n) + r"(?![\w:])", expr)}


def _lag(group) -> dict[str, int]:
    """Alert name -> levels of same-group records between the alert and the raw series."""
    recs = {r["record"]: r["expr"] for r in group["rules"] if "record" in r}

    def depth(expr: str) -> int:
        return max((1 + depth(recs[n]) for n in _reads(expr, recs)), default=0)

    return {r["alert"]: depth(r["expr"]) for r in group["rules"] if "alert" in r}


# -------------------------------------------------------------------------- vmalert-tool
@pytest.mark.tools
def test_vmalert_dry_run_accepts_the_generated_rules(shipped_check):
    """vmalert -dryRun on the shipped rules, as `fusebox check` ran it (conftest's shipped_check)."""
    _vm("vmalert")
    assert re.search(r"^ok   vmalert -dryRun -rule=\S+/rules/fusebox\.rules\.yml$", shipped_check.stdout, re.M), \
        shipped_check.stdout + shipped_check.stderr


@pytest.mark.tools
def test_generated_vmalert_tests_pass_under_vmalert_tool(shipped_check):
    """vmalert-tool unittest on the shipped vmalert test file, as `fusebox check` ran it."""
    _vm("vmalert-tool")
    assert re.search(r"^ok   vmalert-tool unittest --files=\S*fusebox\.rules\.vmalert\.test\.yml$", shipped_check.stdout,
                     re.M), shipped_check.stdout + shipped_check.stderr


@pytest.mark.tools
def test_generated_vmalert_tests_fail_when_a_threshold_drifts(tmp_path):
    """The vmalert-tool tests can fail: nudge the critical GPU line from 0.783 to 0.7839."""
    rules = trimmed_outputs(tmp_path).parent / "rules"
    text = (rules / "fusebox.rules.yml").read_text()
    assert ">= 0.783\n" in text
    (rules / "fusebox.rules.yml").write_text(text.replace(">= 0.783\n", ">= 0.7839\n"))
    r = _unittest(rules)
    assert r.returncode != 0
    assert "GPUMemoryUtilizationHigh" in r.stdout + r.stderr


@pytest.mark.tools
def test_vmalert_tests_fail_without_the_lag(tmp_path):
    """The lag is needed: the P95 alert's cases at the promtool file's times fail on vmalert."""
    rules = trimmed_outputs(tmp_path, "alignment_latency_p95").parent / "rules"
    vm = yaml.safe_load((rules / VM_TESTS).read_text())
    for group in vm["tests"]:
        for c in group.get("alert_rule_test", []):
            if c["alertname"] == "AlignmentLatencyP95High":
                c["eval_time"] = f"{int(parse_duration(c['eval_time']) - 10)}s"  # its lag: 2 x 5 s
    (rules / VM_TESTS).write_text(yaml.safe_dump(vm, sort_keys=False))
    r = _unittest(rules)
    assert r.returncode != 0 and "AlignmentLatencyP95High" in r.stdout + r.stderr


def test_vmalert_tests_are_the_promtool_cases_shifted_by_each_alerts_lag(generated):
    rules = yaml_data((generated / "rules/fusebox.rules.yml").read_text())
    lags = {a: lag for g in rules["groups"] for a, lag in _lag(g).items()}
    # worked out by hand from the shipped spec: the P95 alert reads the quantile record, which
    # reads the bucket-rate record (2 levels); the GPU memory alert reads utilization, which reads
    # the device ratio (2); the single-record signals 1; the absent alerts read raw series (0)
    assert lags["AlignmentLatencyP95High"] == 2 and lags["GPUMemoryUtilizationHigh"] == 2
    assert lags["KVCacheGrowthRateHigh"] == 1 and lags["FuseboxSignalAbsent"] == 0
    text = (generated / "rules" / VM_TESTS).read_text()
    assert "#   AlignmentLatencyP95High (fusebox-alignment_latency_p95): 2 x 5s = 10s" in text
    vm = yaml.safe_load(text)
    prom = yaml_data((generated / "rules/fusebox.rules.test.yml").read_text())
    assert len(vm["tests"]) == len(prom["tests"]) and vm["rule_files"] == prom["rule_files"]
    def titles(t: str) -> list[str]:
        return re.findall(r"^# (\S.*)$", t.split("\ntests:\n", 1)[1], re.M)

    assert titles(text) == titles((generated / "rules/fusebox.rules.test.yml").read_text())
    interval = parse_duration(prom["evaluation_interval"])
    group_of = {r["alert"]: g["name"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    for vg, pg in zip(vm["tests"], prom["tests"], strict=False):
        assert "promql_expr_test" not in vg
        assert len(vg.get("metricsql_expr_test", [])) == len(pg.get("promql_expr_test", []))
        want = [(c["alertname"], parse_duration(c["eval_time"]) + lags[c["alertname"]] * interval)
                for c in pg.get("alert_rule_test", []) if c["alertname"] in lags]
        got = [(c["alertname"], parse_duration(c["eval_time"])) for c in vg.get("alert_rule_test", [])]
        assert got == want
        for c in vg.get("alert_rule_test", []):
            assert c["groupname"] == group_of[c["alertname"]]


# ---------------------------------------------------------------------- zero traffic
def test_zero_traffic_quantile_is_absent_not_nan_in_the_rules(generated):
    rules = yaml_data((generated / "rules/fusebox.rules.yml").read_text())
    group = next(g for g in rules["groups"] if g["name"] == "fusebox-alignment_latency_p95")
    rate = next(r["record"] for r in group["rules"] if r["record"].endswith(":count_rate5m"))
    for r in group["rules"]:
        if "histogram_quantile" in r.get("expr", ""):
            assert f"({rate} > 0)" in r["expr"], r
    tests = (generated / "rules/fusebox.rules.test.yml").read_text()
    assert "absent(engine:fusebox_alignment_latency_p95:rate5m)" in tests
    assert "!=" not in tests  # the NaN check (x != x) is gone: nothing is NaN any more


# -------------------------------------------------------------------------- splitting
def _many_signals(n: int) -> str:
    out = []
    for i in range(n):
        out.append(f"""
  extra_gauge_{i}:
    alert: ExtraGaugeHigh{i}
    description: A gauge added to grow the rule groups.
    kind: gauge
    unit: ratio
    level: gpu
    sources:
      fusebox:
        metric: fusebox_extra_gauge_{i}_ratio
    tiers:
      warning: {{threshold: 70%}}
      critical: {{threshold: 90%, fuse: freeze_admissions}}
    runbook: {{symptom: High., impact: Higher.}}
""")
    return "".join(out)


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """The shipped spec plus 20 gauge signals: 28 absent alerts, over Mimir's 20 per group."""
    text = _spec_text(**{"# Per-alert changes without forking": _many_signals(20) + "\n# Per-alert changes without forking"})
    return _generate(tmp_path_factory.mktemp("many"), text)


def test_every_group_is_within_mimirs_limits_and_chains_stay_together(many):
    groups = yaml.safe_load((many / "rules/fusebox.rules.yml").read_text())["groups"]
    names = [g["name"] for g in groups]
    assert len(names) == len(set(names)) <= MIMIR_GROUPS_PER_TENANT
    absent = [g for g in groups if g["name"].startswith("fusebox-absent")]
    assert [g["name"] for g in absent] == ["fusebox-absent-1", "fusebox-absent-2"]
    # the shipped 11 metrics (GPU memory: ratio, usage, limit; the preemption counter; the shared PCIe
    # links; the connection idle histogram, one for its two signals), the TTFT SLO's histogram (the
    # alignment SLO's is its signal's) and one per new signal
    assert sum(len(g["rules"]) for g in absent) == 11 + 1 + 20
    for g in groups:
        assert len(g["rules"]) <= MIMIR_RULES_PER_GROUP, (g["name"], len(g["rules"]))
    owner = _records(groups)
    interval = {g["name"]: g["interval"] for g in groups}
    for g in groups:
        for r in g["rules"]:
            for name in _reads(r["expr"], owner):
                # an alert reads its own group's records; a record may also read a static input
                # (fusebox-static) or, in a slow group, a record of a group at the evaluation interval
                across = "record" in r and (owner[name] == "fusebox-static" or interval[owner[name]] == "5s" != interval[g["name"]])
                assert owner[name] == g["name"] or across, (g["name"], r.get("record") or r.get("alert"), name)


def test_a_big_group_splits_with_its_chains_whole():
    from fusebox.generator.rule_engines import split_groups

    # 3 chains of 8 rules (a record, a record reading it, 6 alerts reading the second) = 24 rules
    rules = []
    for c in range(3):
        rules.append({"record": f"c{c}:a", "expr": f"sum(raw_{c})"})
        rules.append({"record": f"c{c}:b", "expr": f"c{c}:a * 2"})
        rules += [{"alert": f"A{c}", "expr": f"c{c}:b > {k}"} for k in range(6)]
    out = split_groups([{"name": "g", "interval": "5s", "rules": rules}])
    assert [(g["name"], len(g["rules"])) for g in out] == [("g-1", 16), ("g-2", 8)]
    assert all(g["interval"] == "5s" for g in out)
    owner = _records(out)
    for g in out:
        for r in g["rules"]:
            assert all(owner[n] == g["name"] for n in _reads(r["expr"], owner))


@pytest.fixture(scope="module")
def few_and_many(tmp_path_factory):
    """GPU memory and the 20 gauge signals alone (_support.trimmed_spec): 23 absent alerts, still over
    Mimir's 20 per group, in a test file the tools run in seconds (the shipped cases run once, in
    conftest's shipped_check)."""
    text = _spec_text(**{"# Per-alert changes without forking": _many_signals(20) + "\n# Per-alert changes without forking"})
    return _generate(tmp_path_factory.mktemp("few-and-many"), trimmed_spec(text, *(f"extra_gauge_{i}" for i in range(20))))


@pytest.mark.tools
@pytest.mark.parametrize("tool", ["promtool-2.42", "promtool-3", "vmalert-tool"])
def test_split_groups_pass_promtool_and_vmalert_tool(few_and_many, tool):
    groups = [g["name"] for g in yaml.safe_load((few_and_many / "rules/fusebox.rules.yml").read_text())["groups"]]
    assert ["fusebox-absent-1", "fusebox-absent-2"] == [g for g in groups if g.startswith("fusebox-absent")]  # split
    if tool == "vmalert-tool":
        r = _unittest(few_and_many / "rules")
    else:
        pts = promtools()
        assert len(pts) == 2, pts  # promtool 2.42 (Debian) and the pinned Prometheus 3 build
        r = _run([pts[0 if tool == "promtool-2.42" else 1], "test", "rules", "fusebox.rules.test.yml"],
                 cwd=few_and_many / "rules")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mimir_warns_over_its_group_limit(tmp_path):
    from fusebox.generator.outputs import spec_warnings

    text = _spec_text(**{"rule_engine: prometheus": "rule_engine: mimir",
                         "# Per-alert changes without forking": _many_signals(70) + "\n# Per-alert changes without forking"})
    warnings = spec_warnings(parse_spec(text, "fusebox.yaml"))
    assert any("-ruler.max-rule-groups-per-tenant" in w and "70" in w for w in warnings), warnings
    shipped = parse_spec(_spec_text(**{"rule_engine: prometheus": "rule_engine: mimir"}), "fusebox.yaml")
    assert not any("max-rule-groups" in w for w in spec_warnings(shipped))


# ----------------------------------------------------------------------------- Thanos
def test_thanos_groups_abort_on_partial_responses(tmp_path):
    out = _generate(tmp_path, _spec_text(**{"rule_engine: prometheus": "rule_engine: thanos"}))
    groups = yaml.safe_load((out / "rules/fusebox.rules.yml").read_text())["groups"]
    assert groups and all(g["partial_response_strategy"] == "abort" for g in groups)
    pr = yaml.safe_load((out / "k8s/prometheusrule.yml").read_text())
    assert all(g["partial_response_strategy"] == "abort" for g in pr["spec"]["groups"])
    # the default engine writes no such key
    assert "partial_response_strategy" not in (ROOT / "rules/fusebox.rules.yml").read_text()


@pytest.mark.tools
def test_thanos_rules_are_checked_on_a_copy_without_the_key(tmp_path):
    from fusebox.generator.toolcheck import check_rules_and_tests, rules_for_tools

    out = trimmed_outputs(tmp_path, text=_spec_text(**{"rule_engine: prometheus": "rule_engine: thanos"})).parent
    pt = promtools()[0]
    r = _run([pt, "check", "rules", str(out / "rules/fusebox.rules.yml")])
    assert r.returncode != 0 and "partial_response_strategy" in r.stdout + r.stderr  # why the copy exists
    results = check_rules_and_tests(out, promtools())
    assert all(x.ok for x in results), [x.output for x in results if not x.ok]
    with rules_for_tools(out) as rules:
        assert rules != out / "rules"
        r = _unittest(rules)
        assert r.returncode == 0, r.stdout + r.stderr
    assert not rules.exists()  # the copy is gone


def _thanos() -> str:
    try:
        return need(str(thanos_tool()))
    except ToolMissing as e:
        return need("thanos", str(e))


def _rules_check(path: Path) -> subprocess.CompletedProcess:
    return _run([_thanos(), "tools", "rules-check", f"--rules={path}"])


@pytest.mark.tools
def test_thanos_rules_check_accepts_the_thanos_rules_and_counts_every_rule(tmp_path):
    out = _generate(tmp_path, _spec_text(**{"rule_engine: prometheus": "rule_engine: thanos"}))
    rules = out / "rules/fusebox.rules.yml"
    want = sum(len(g["rules"]) for g in yaml.safe_load(rules.read_text())["groups"])
    r = _rules_check(rules)
    assert r.returncode == 0, r.stdout + r.stderr
    # Thanos' own count of the rules it parsed (tools.go logs result=SUCCESS rulesfound=N)
    assert re.search(rf"result=SUCCESS rulesfound={want}\b", r.stdout + r.stderr), r.stdout + r.stderr


@pytest.mark.tools
def test_thanos_rules_check_refuses_a_strategy_thanos_does_not_know(tmp_path):
    out = _generate(tmp_path / "g", _spec_text(**{"rule_engine: prometheus": "rule_engine: thanos"}))
    text = (out / "rules/fusebox.rules.yml").read_text()
    bad = tmp_path / "bad.rules.yml"
    bad.write_text(text.replace("partial_response_strategy: abort", "partial_response_strategy: fail", 1))
    r = _rules_check(bad)
    assert r.returncode != 0 and "ABORT,WARN" in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.mark.tools
def test_fusebox_check_runs_thanos_rules_check_for_the_thanos_engine(tmp_path):
    from fusebox.generator.toolcheck import check_thanos

    out = _generate(tmp_path / "g", _spec_text(**{"rule_engine: prometheus": "rule_engine: thanos"}))
    [ok] = check_thanos(out, _thanos())
    assert ok.ok and ok.name.startswith("thanos") and "tools rules-check" in ok.name, ok
    rules = out / "rules/fusebox.rules.yml"
    rules.write_text(rules.read_text().replace("partial_response_strategy: abort", "partial_response_strategy: maybe", 1))
    [bad] = check_thanos(out, _thanos())
    assert not bad.ok and "maybe" in bad.output


def test_fusebox_check_needs_thanos_for_the_thanos_engine(tmp_path, monkeypatch):
    need("promtool")
    need("amtool")
    text = _spec_text(**{"rule_engine: prometheus": "rule_engine: thanos"})
    out = _generate(tmp_path / "g", text)
    spec = tmp_path / "fusebox.yaml"
    spec.write_text(text)
    monkeypatch.setenv("FUSEBOX_TOOLS", str(tmp_path / "no-tools"))
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "check", "--spec", str(spec), "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "missing thanos" in r.stderr and "run `make tools`" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------- spec field
def test_rule_engine_rejects_an_unknown_engine():
    text = _spec_text(**{"rule_engine: prometheus": "rule_engine: cortex"})
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "rule_engine: cortex" in l)
    msg = str(e.value)
    assert f"fusebox.yaml:{line}:" in msg and "global.rule_engine" in msg
    for engine in ("prometheus", "victoriametrics", "mimir", "thanos"):
        assert engine in msg


def test_rule_engine_is_in_the_schema_and_defaults_to_prometheus():
    r = run_cli("schema", cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert '"rule_engine"' in r.stdout
    for engine in ("prometheus", "victoriametrics", "mimir", "thanos"):
        assert f'"{engine}"' in r.stdout
    text = SPEC.read_text().replace("  rule_engine: prometheus\n", "")
    assert parse_spec(text, "fusebox.yaml").rule_engine == "prometheus"


# --------------------------------------------------------------------------- fusebox check
@pytest.mark.tools
def test_fusebox_check_runs_vmalert_and_vmalert_tool(shipped_check):
    promtools()
    _vm("vmalert-tool")
    r = shipped_check
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^ok   vmalert -dryRun -rule=\S+fusebox.rules.yml$", r.stdout, re.M), r.stdout
    assert re.search(r"^ok   vmalert-tool unittest --files=\S*fusebox.rules.vmalert.test.yml$", r.stdout, re.M), r.stdout
    # and the SLO burn-rate cases' own vmalert-tool file (docs/slo.md), beside their promtool runs
    assert re.search(r"^ok   vmalert-tool unittest --files=\S*fusebox.slo.vmalert.test.yml$", r.stdout, re.M), r.stdout


def test_fusebox_check_needs_vmalert_for_the_victoriametrics_engine(tmp_path, monkeypatch):
    need("promtool")
    need("amtool")
    out = _generate(tmp_path / "g", _spec_text(**{"rule_engine: prometheus": "rule_engine: victoriametrics"}))
    spec = tmp_path / "fusebox.yaml"
    spec.write_text(_spec_text(**{"rule_engine: prometheus": "rule_engine: victoriametrics"}))
    monkeypatch.setenv("FUSEBOX_TOOLS", str(tmp_path / "no-tools"))
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "check", "--spec", str(spec), "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "missing vmalert" in r.stderr and "run `make tools`" in r.stderr and "Traceback" not in r.stderr
