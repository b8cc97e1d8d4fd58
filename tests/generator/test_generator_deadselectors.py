"""`fusebox check --rules FILE... --against CAPTURE...`: any rule file, real captures, no spec.

The expected findings were worked out by reading the files: vLLM's published PrometheusRule
(tests/fixtures/generator/vllm_examples_k8s-monitoring_prometheusrule.yaml) has eight rules; six
read series that the five vLLM captures hold (or, for `up{job="vllm"}`, that Prometheus makes
itself), and two can never fire: line 121 reads `vllm:num_preemptions` (every capture writes
`vllm:num_preemptions_total`) and line 73 reads `le="120"` (the captures write `le="120.0"`).
"""

from __future__ import annotations

import subprocess
import sys

import yaml
from _support import FIXTURES, ROOT

RULE = FIXTURES / "generator/vllm_examples_k8s-monitoring_prometheusrule.yaml"
CAPTURES = sorted(FIXTURES.glob("generator/*vllm*.txt"))
PREEMPT = "vllm:num_preemptions"
LE120 = 'vllm:e2e_request_latency_seconds_bucket{le="120"}'


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fusebox.cli", "check", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def findings(stdout: str) -> dict[str, str]:
    """selector -> its whole line, for the lines naming a dead selector."""
    out = {}
    for line in stdout.splitlines():
        if " matches no series: " in line:
            out[line.split(": ", 2)[2].split(" matches no series")[0]] = line
    return out


def rules_file(tmp_path, *rules: dict) -> str:
    p = tmp_path / "rules.yml"
    p.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": list(rules)}]}, sort_keys=False))
    return str(p)


def test_vllm_prometheusrule_names_exactly_its_two_dead_selectors_and_fails():
    assert len(CAPTURES) == 5
    r = check("--rules", str(RULE), "--against", *map(str, CAPTURES))
    assert r.returncode == 1, r.stdout + r.stderr
    found = findings(r.stdout)
    assert set(found) == {PREEMPT, LE120}
    assert found[PREEMPT].startswith(f"{RULE}:121:18: VllmPreemptionSpike: ")
    assert "vllm:num_preemptions_total" in found[PREEMPT]
    assert found[LE120].startswith(f"{RULE}:73:15: VllmSlowRequestsPresent: ")
    assert 'le="120.0"' in found[LE120]
    assert "2 dead selector(s)" in r.stdout


def test_allow_dead_excuses_known_selectors():
    r = check("--rules", str(RULE), "--against", *map(str, CAPTURES), "--allow-dead", PREEMPT, "--allow-dead", LE120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert findings(r.stdout) == {}
    # one excused, the other still fails; spacing and quoting need not match the rule's text
    r = check("--rules", str(RULE), "--against", *map(str, CAPTURES), "--allow-dead", "vllm:e2e_request_latency_seconds_bucket{ le = '120' }")
    assert r.returncode == 1 and set(findings(r.stdout)) == {PREEMPT}


def test_allow_dead_that_excuses_nothing_is_named():
    r = check("--rules", str(RULE), "--against", *map(str, CAPTURES), "--allow-dead", PREEMPT, "--allow-dead", LE120,
              "--allow-dead", "vllm:num_requests_waiting")
    assert r.returncode == 0
    assert "--allow-dead vllm:num_requests_waiting excused nothing" in r.stdout


def test_plain_rule_file_gives_the_same_findings_as_the_prometheusrule(tmp_path):
    groups = yaml.safe_load(RULE.read_text())["spec"]["groups"]
    plain = tmp_path / "vllm.rules.yml"
    plain.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    r = check("--rules", str(plain), "--against", *map(str, CAPTURES))
    assert r.returncode == 1
    found = findings(r.stdout)
    assert set(found) == {PREEMPT, LE120}
    assert f"{plain}:" in found[PREEMPT] and "VllmPreemptionSpike" in found[PREEMPT]


def test_regex_matchers_are_fully_anchored(tmp_path):
    b = "vllm:e2e_request_latency_seconds_bucket"
    f = rules_file(
        tmp_path,
        {"record": "a:either_spelling", "expr": f'{b}{{le=~"120(\\\\.0)?"}}'},
        {"record": "a:posix_class", "expr": f'{b}{{le=~"[[:digit:]]+\\\\.0"}}'},
        {"record": "a:not_re", "expr": f'{b}{{le!~"120\\\\.0"}}'},
        {"record": "a:model", "expr": 'vllm:num_requests_waiting{model_name=~"facebook/.*"}'},
        {"record": "a:prefix_only", "expr": f'{b}{{le=~"12"}}'},  # "120.0" is not all of "12"
        {"record": "a:every_model_excluded", "expr": 'vllm:num_requests_waiting{model_name!~".+"}'},
    )
    r = check("--rules", f, "--against", *map(str, CAPTURES))
    assert r.returncode == 1
    found = findings(r.stdout)
    assert set(found) == {f'{b}{{le=~"12"}}', 'vllm:num_requests_waiting{model_name!~".+"}'}
    assert 'le=~"12" excludes all' in found[f'{b}{{le=~"12"}}']


def test_labels_no_capture_carries_are_target_labels_not_judged(tmp_path):
    f = rules_file(tmp_path, {"alert": "Waiting", "expr": 'vllm:num_requests_waiting{namespace="inference", pod=~"vllm-.*"} > 50'})
    r = check("--rules", f, "--against", *map(str, CAPTURES))
    assert r.returncode == 0, r.stdout
    assert "note: matchers on namespace, pod not judged" in r.stdout


def test_recorded_names_and_prometheus_own_series_are_not_dead(tmp_path):
    f = rules_file(tmp_path, {"record": "model:waiting:sum", "expr": "sum by (model_name) (vllm:num_requests_waiting)"},
                   {"alert": "W", "expr": "model:waiting:sum > 1 and on() count(up == 1) > 0 unless ALERTS"})
    r = check("--rules", f, "--against", *map(str, CAPTURES))
    assert r.returncode == 0, r.stdout


def test_near_miss_hints(tmp_path):
    f = rules_file(tmp_path, {"record": "a:hist", "expr": "rate(vllm:e2e_request_latency_seconds[5m])"},
                   {"record": "a:typo", "expr": "vllm:num_requests_waitin"})
    found = findings(check("--rules", f, "--against", *map(str, CAPTURES)).stdout)
    assert "vllm:e2e_request_latency_seconds_bucket, _count, _sum" in found["vllm:e2e_request_latency_seconds"]
    assert "close names: vllm:num_requests_waiting" in found["vllm:num_requests_waitin"]


def test_bad_rule_files_are_file_line_errors_with_exit_2(tmp_path):
    bad_yaml = tmp_path / "bad.yml"
    bad_yaml.write_text("groups:\n  - name: g\n    rules:\n      - alert: X\n        expr: [\n")
    r = check("--rules", str(bad_yaml), "--against", str(CAPTURES[0]))
    assert r.returncode == 2 and r.stderr.startswith(f"{bad_yaml}:6:1: YAML syntax error"), r.stderr

    bad_expr = tmp_path / "expr.yml"
    bad_expr.write_text("groups:\n  - name: g\n    rules:\n      - alert: X\n        expr: rate(foo[5m]\n")
    r = check("--rules", str(bad_expr), "--against", str(CAPTURES[0]))
    assert r.returncode == 2 and r.stderr.startswith(f"{bad_expr}:5:15: X: expr is not valid PromQL"), r.stderr

    no_groups = tmp_path / "none.yml"
    no_groups.write_text("apiVersion: v1\nkind: ConfigMap\n")
    r = check("--rules", str(no_groups), "--against", str(CAPTURES[0]))
    assert r.returncode == 2 and r.stderr.startswith(f"{no_groups}:1:1: no rule groups found"), r.stderr
    assert "Traceback" not in r.stderr


def test_bad_capture_and_bad_allow_dead_exit_2(tmp_path):
    cap = tmp_path / "cap.txt"
    cap.write_text("ok_metric 1\nbroken{ 2\n")
    r = check("--rules", str(RULE), "--against", str(cap))
    assert r.returncode == 2 and r.stderr.startswith(f"{cap}:2:1: not Prometheus text exposition format"), r.stderr
    r = check("--rules", str(RULE), "--against", str(CAPTURES[0]), "--allow-dead", "rate(foo[5m])")
    assert r.returncode == 2 and "is not one vector selector" in r.stderr
    r = check("--rules", str(RULE))
    assert r.returncode == 2 and "--rules needs --against" in r.stderr


def test_a_manifest_bundle_is_read_document_by_document(tmp_path):
    """`kustomize build` output: other kinds are skipped, positions count from the file's top."""
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n---\n" + RULE.read_text() + "---\n# end\n")
    r = check("--rules", str(bundle), "--against", *map(str, CAPTURES))
    assert r.returncode == 1, r.stdout + r.stderr
    found = findings(r.stdout)
    assert found[PREEMPT].startswith(f"{bundle}:125:18: VllmPreemptionSpike: ")  # 121 + the 4 lines above
    assert found[LE120].startswith(f"{bundle}:77:15: VllmSlowRequestsPresent: ")
    bad = tmp_path / "bad-bundle.yaml"
    bad.write_text("kind: ConfigMap\n---\ngroups:\n  - name: g\n    rules: [{alert: X, expr: 'rate(x[5m]'}]\n")
    r = check("--rules", str(bad), "--against", str(CAPTURES[0]))
    assert r.returncode == 2 and r.stderr.startswith(f"{bad}:5:"), r.stderr


def test_re2_syntax_python_lacks_is_named_not_guessed(tmp_path):
    f = rules_file(tmp_path, {"record": "a:unicode_class", "expr": 'vllm:num_requests_waiting{model_name=~"\\\\pL.*"}'})
    r = check("--rules", f, "--against", *map(str, CAPTURES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'note: model_name=~"\\\\pL.*" not judged' in r.stdout
