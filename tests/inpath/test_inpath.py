"""The in-path shedders' settings (inpath/, docs/inpath.md): generated from the spec's thresholds,
checked against the fuse, refused with file:line when the spec is wrong.

Every expected number is worked out here from the shipped spec's figures (checked against its
YAML first): GPU memory's warning tier 72 % and critical (fuse) tier 78.3 % held for 30 s; idle
55 %; 2 % per running request; 2 engines; max_generation 10 m; mean_generation 16 s."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _cli import run_cli
from _support import ROOT, SPEC, trimmed_outputs, yaml_data, yaml_text

from fusebox.generator.cli import run_inpath_check
from fusebox.generator.outputs import render_all, spec_warnings
from fusebox.generator.render_inpath import inpath_warnings
from fusebox.spec import parse_spec
from fusebox.spec.errors import SpecError

FUSEBOX = [str(Path(sys.executable).parent / "fusebox")]
RAW = yaml_data(SPEC.read_text())

# In percent, so the arithmetic below is exact.
WARNING, CRITICAL, IDLE, PER_REQUEST, ENGINES = 72, 78.3, 55, 2, 2
PER_ENGINE = (WARNING - IDLE) // PER_REQUEST  # 8
MAX_GENERATION_S, MEAN_GENERATION_S, FUSE_FOR_S = 600, 16, 30


def test_the_figures_are_the_shipped_specs():
    tiers = RAW["signals"]["gpu_memory_utilization"]["tiers"]
    assert (tiers["warning"]["threshold"], tiers["critical"]["threshold"]) == ("72.0%", "78.3%")
    assert tiers["critical"]["for"] == "30s" and tiers["critical"]["fuse"]
    ip = RAW["inpath"]
    assert (ip["max_generation"], ip["mean_generation"]) == ("10m", "16s")
    for name in ("gateway", "gateway_0_3", "engine"):
        s = ip["shedders"][name]
        assert (s["signal"], s["idle"], s["per_request"]) == ("gpu_memory_utilization", "55%", "2%")
        assert "shed_at" not in s and "set" not in s
    assert ip["shedders"]["gateway"]["engines"] == ip["shedders"]["gateway_0_3"]["engines"] == ENGINES


def _flags(text: str) -> dict[str, str]:
    pairs = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    return {flag: value for flag, value in pairs}


GATEWAY = {
    "--max-concurrent-requests": str(ENGINES * PER_ENGINE),  # 16
    "--queue-size": "0",
    "--queue-timeout-secs": str(FUSE_FOR_S),
    "--rate-limit-tokens-per-second": str(math.ceil(ENGINES * PER_ENGINE / MEAN_GENERATION_S)),  # 1
    "--request-timeout-secs": str(MAX_GENERATION_S),
    "--cb-window-duration-secs": str(MAX_GENERATION_S),
}
# smg 1.13 alone also gets its worker overload veto stated: the shipped spec gives no overload block
# and has no gauge of either quantity, so smg's own defaults (0.8 KV-cache token usage, 8 waiting
# requests); sglang-router 0.3.2 has no such veto (tests/inpath/test_inpath_overload.py)
SMG_VETO = {"--worker-overload-token-usage": "0.8", "--worker-overload-waiting-requests": "8"}


@pytest.mark.parametrize("name,expect", [("gateway", GATEWAY | SMG_VETO), ("gateway_0_3", GATEWAY),
                                         ("engine", {"--max-num-queued-reqs": str(PER_ENGINE)})])
def test_the_shipped_flags(name, expect):
    text = (ROOT / "inpath" / f"{name}.flags").read_text()
    assert _flags(text) == expect
    assert text == render_all(parse_spec(SPEC.read_text(), "fusebox.yaml"))[f"inpath/{name}.flags"]
    # each flag says which spec key its number follows
    assert "signals.gpu_memory_utilization.tiers.warning.threshold" in text


def test_the_shipped_spec_sheds_before_its_fuse(capsys):
    spec = parse_spec(SPEC.read_text(), "fusebox.yaml")
    assert inpath_warnings(spec) == []
    assert run_inpath_check(spec) == 0
    assert capsys.readouterr().out.startswith("ok ")


def _spec(mutate) -> str:
    data = yaml_data(SPEC.read_text())
    mutate(data["inpath"])
    return yaml_text(data, sort_keys=False)


def _gw(**fields):
    def m(ip):
        ip["shedders"]["gateway"].update(fields)
    return m


def test_a_shedder_above_the_fuse_is_flagged_with_both_numbers(capsys):
    spec = parse_spec(_spec(_gw(shed_at="80%")))
    found = inpath_warnings(spec)
    assert len(found) == 1
    assert "inpath.shedders.gateway" in found[0] and "80%" in found[0] and f"{CRITICAL}%" in found[0]
    assert run_inpath_check(spec) == 1
    assert "FAIL" in capsys.readouterr().out


def test_a_bound_that_lets_the_signal_reach_the_fuse_is_flagged():
    # 24 over 2 engines: 55 % + 12 x 2 % = 79 %, over the fuse's 78.3 %
    found = inpath_warnings(parse_spec(_spec(_gw(set={"max_concurrent_requests": 24}))))
    assert len(found) == 1 and "79%" in found[0] and f"{CRITICAL}%" in found[0] and "24" in found[0]
    # 22: 55 % + 11 x 2 % = 77 %, under it
    assert inpath_warnings(parse_spec(_spec(_gw(set={"max_concurrent_requests": 22})))) == []


def test_the_vllm_bound_is_checked_per_engine():
    def m(ip):
        ip["shedders"]["engine"]["set"] = {"max_num_queued_reqs": 12}  # 55 % + 12 x 2 % = 79 %
    found = inpath_warnings(parse_spec(_spec(m)))
    assert len(found) == 1 and "inpath.shedders.engine" in found[0] and "79%" in found[0]


def test_a_breaker_window_shorter_than_the_longest_generation_is_flagged():
    found = inpath_warnings(parse_spec(_spec(_gw(set={"cb_window": "5m"}))))
    assert len(found) == 1
    assert "--cb-window-duration-secs 300" in found[0] and f"{MAX_GENERATION_S} s" in found[0]
    spec = parse_spec(_spec(_gw(set={"cb_window": "5m"})))
    assert any("--cb-window-duration-secs 300" in w for w in spec_warnings(spec))  # generate prints it too


def test_an_override_replaces_the_derived_number():
    spec = parse_spec(_spec(_gw(set={"queue_size": 4, "cb_failure_threshold": 25, "queue_timeout": "1m"})))
    flags = _flags(render_all(spec)["inpath/gateway.flags"])
    assert flags["--queue-size"] == "4" and flags["--cb-failure-threshold"] == "25"
    assert flags["--queue-timeout-secs"] == "60"
    assert flags["--max-concurrent-requests"] == str(ENGINES * PER_ENGINE)


def test_without_generation_times_the_gateway_gets_no_timeouts():
    def m(ip):
        del ip["max_generation"], ip["mean_generation"]
    flags = _flags(render_all(parse_spec(_spec(m)))["inpath/gateway.flags"])
    assert set(flags) == {"--max-concurrent-requests", "--queue-size", "--queue-timeout-secs", *SMG_VETO}


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    return [str(p) for p in e.value.problems]


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("fields,needle,what", [
    ({"kind": "envoy"}, "kind: envoy", "kind"),
    ({"signal": "no_such_signal"}, "signal: no_such_signal", "unknown signal"),
    ({"idle": "55 MB/s"}, "idle: 55 MB/s", "idle"),
    ({"shed_at": "50%"}, "shed_at: 50%", "not above idle"),
    ({"per_request": "20%"}, "per_request: 20%", "not one request"),
    ({"set": {"queue_sise": 0}}, "queue_sise", "no setting 'queue_sise'"),
    ({"set": {"queue_size": -1}}, "queue_size: -1", "whole number"),
    ({"set": {"cb_window": "1500ms"}}, "cb_window: 1500ms", "whole number of seconds"),
    ({"engines": 0}, "engines: 0", "engines 0"),
    ({"per_request": "1e-320%"}, "per_request: 1e-320%", "a billion requests"),
])
def test_spec_errors_name_the_line(fields, needle, what):
    text = _spec(_gw(**fields))
    problems = _problems(text)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"fusebox.yaml:{_line_of(text, needle)}:"), problems
    assert what in problems[0] and " -- " in problems[0]


def test_a_generation_time_must_be_a_duration():
    def m(ip):
        ip["max_generation"] = "ten minutes"
    text = _spec(m)
    problems = _problems(text)
    assert len(problems) == 1 and problems[0].startswith(f"fusebox.yaml:{_line_of(text, 'max_generation: ten')}:")
    assert "inpath.max_generation" in problems[0]


def test_a_bad_spec_exits_2_and_writes_nothing(tmp_path):
    spec = tmp_path / "fusebox.yaml"
    spec.write_text(_spec(_gw(signal="no_such_signal")))
    out = tmp_path / "out"
    r = run_cli("generate", "--spec", str(spec), "--out", str(out))
    assert r.returncode == 2
    assert f"{spec}:{_line_of(spec.read_text(), 'signal: no_such_signal')}:" in r.stderr
    assert not out.exists() or not any(out.iterdir())


def test_generate_warns_of_a_shedder_after_its_fuse(tmp_path):
    spec = tmp_path / "fusebox.yaml"
    spec.write_text(_spec(_gw(shed_at="80%")))
    r = run_cli("generate", "--spec", str(spec), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if "inpath.shedders.gateway" in x)
    assert line.startswith("fusebox generate: warning:") and "80%" in line and f"{CRITICAL}%" in line
    assert (tmp_path / "out" / "inpath" / "gateway.flags").is_file()


@pytest.mark.tools
def test_fusebox_check_fails_a_shedder_after_its_fuse(tmp_path):
    """The whole `fusebox check` (its tool checks pass on this spec): exit 1, both numbers named."""
    # 55 % + 12 x 2 % = 79 %; GPU memory's signal alone (its tools' cases run in seconds, not minutes)
    spec = trimmed_outputs(tmp_path, text=_spec(_gw(set={"max_concurrent_requests": 24})))
    r = subprocess.run([*FUSEBOX, "check", "--spec", str(spec), "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL fusebox inpath" in r.stdout
    assert r.stdout.rstrip().endswith(" passed, 1 failed")  # the in-path finding alone fails it, and is counted
    line = next(x for x in r.stderr.splitlines() if "inpath.shedders.gateway" in x)
    assert "79%" in line and f"{CRITICAL}%" in line


def _waiting(data: dict, *, keep: tuple[str, ...] = ("gateway", "gateway_0_3", "engine")) -> str:
    """The shipped spec with GPU memory's critical tier set to wait for shedding, and only the
    shedders named in ``keep``."""
    data["signals"]["gpu_memory_utilization"]["tiers"]["critical"]["after_shedding"] = True
    data["inpath"]["shedders"] = {k: v for k, v in data["inpath"]["shedders"].items() if k in keep}
    return yaml_text(data, sort_keys=False)


def test_a_waiting_tier_adds_the_gateways_refusals_to_its_alert_and_says_so():
    """The gate reads the admission counter both gateways publish (smg_http_rate_limit_total,
    result rejected), over a minute at the shipped 5 s scrape (four scrapes would be 20 s), and
    fails open where no gateway is scraped; the warning tier and the other signals are unchanged."""
    spec = parse_spec(_waiting(yaml_data(SPEC.read_text())), "fusebox.yaml")
    rules = yaml.safe_load(render_all(spec)["rules/fusebox.rules.yml"])
    gpu = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GPUMemoryUtilizationHigh"]
    crit = next(r for r in gpu if r["labels"]["severity"] == "critical")
    warn = next(r for r in gpu if r["labels"]["severity"] == "warning")
    assert crit["expr"] == ("(\n  gpu:fusebox_gpu_memory_utilization:ratio >= 0.783\n)\nand on () (\n"
                            '  (sum((smg_http_rate_limit_total{result="rejected"} - smg_http_rate_limit_total{result="rejected"}'
                            ' offset 1m) >= 0 or smg_http_rate_limit_total{result="rejected"}) > 0)'
                            " or on () absent(smg_http_rate_limit_total)\n)")
    assert crit["for"] == "30s"
    assert warn["expr"] == "gpu:fusebox_gpu_memory_utilization:ratio >= 0.72"
    assert "gateways have been refusing requests" in crit["annotations"]["description"]
    shipped = yaml.safe_load(render_all(parse_spec(SPEC.read_text(), "fusebox.yaml"))["rules/fusebox.rules.yml"])
    others = lambda rs: [r for g in rs["groups"] for r in g["rules"] if r.get("alert") != "GPUMemoryUtilizationHigh"]  # noqa: E731
    assert others(rules) == others(shipped)


def test_a_waiting_tier_without_a_gateway_on_its_signal_is_refused_at_its_line():
    text = _waiting(yaml_data(SPEC.read_text()), keep=("engine",))  # a vLLM bound publishes no refusals
    problems = _problems(text)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"fusebox.yaml:{_line_of(text, 'after_shedding: true')}:")
    assert "no in-path gateway sheds on signal 'gpu_memory_utilization'" in problems[0]
    assert "kind: smg or sglang_router" in problems[0]
