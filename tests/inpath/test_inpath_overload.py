"""smg 1.13's own worker overload veto (docs/inpath.md, "smg's worker overload protection"): the
generated inpath/gateway.flags always state both thresholds, from the spec's `overload:` block,
else from the safe level of the spec's signal of the same quantity, else smg's own default; the spec
is refused where a veto would act under a signal's safe level or at or above its fuse.

Every expected number is worked out here by hand. smg 1.13's defaults, read from its `--help` and
smg/router_args.py: a worker at or above 0.8 KV-cache token usage or 8 waiting requests leaves
routing. The test signals: KV usage (a gauge of vllm:kv_cache_usage_perc) warning 85 %, fuse at
95 %; waiting requests (a gauge of vllm:num_requests_waiting) warning 4.5, fuse at 20."""

from __future__ import annotations

import re

import pytest
import yaml
from _cli import run_cli
from _support import ROOT, SPEC, yaml_data, yaml_text

from fusebox.generator.outputs import render_all
from fusebox.generator.render_inpath import OVERLOAD_FLAGS, OVERLOAD_OFF, OVERLOAD_SHED
from fusebox.spec import parse_spec
from fusebox.spec.errors import SpecError

RAW = yaml_data(SPEC.read_text())
TOKEN, WAITING = OVERLOAD_FLAGS["token_usage"], OVERLOAD_FLAGS["waiting_requests"]
_RUNBOOK = {"symptom": "s", "impact": "i", "sop": {"warning": ["w"], "critical": ["c"]}}


def _gauge(metric: str, unit: str, warning, critical) -> dict:
    return {"alert": f"Test{unit.capitalize()}High", "description": "test", "kind": "gauge", "unit": unit,
            "level": "engine", "by": ["cluster", "host_name", "engine", "model"], "sources": {"vllm": {"metric": metric}},
            "tiers": {"warning": {"threshold": warning, "for": "1m"},
                      "critical": {"threshold": critical, "for": "30s", "fuse": "freeze_admissions"}},
            "runbook": _RUNBOOK}


KV = ("kv_cache_usage", _gauge("vllm:kv_cache_usage_perc", "ratio", "85%", "95%"))
QUEUE = ("requests_waiting", _gauge("vllm:num_requests_waiting", "count", 4.5, 20))


def _text(overload: dict | None, *signals: tuple[str, dict], kind: str = "smg") -> str:
    """The shipped spec with the gateway's `overload:` replaced (None: removed), its kind set, and
    ``signals`` added."""
    data = yaml_data(SPEC.read_text())
    gw = data["inpath"]["shedders"]["gateway"]
    gw.pop("overload", None)
    gw["kind"] = kind
    if overload is not None:
        gw["overload"] = overload
    for name, body in signals:
        data["signals"][name] = body
    return yaml_text(data, sort_keys=False)


def _flags(text: str) -> dict[str, str | None]:
    """flag -> value (None for a switch) of every line but the comments."""
    out: dict[str, str | None] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            flag, *value = line.split()
            out[flag] = value[0] if value else None
    return out


def _gateway(text: str) -> tuple[str, dict[str, str | None]]:
    flags = render_all(parse_spec(text, "fusebox.yaml"))["inpath/gateway.flags"]
    return flags, _flags(flags)


def _comment(flags: str, flag: str) -> str:
    return next(line for line in flags.splitlines() if line.startswith(f"# {flag}"))


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    return [str(p) for p in e.value.problems]


def _line_of(text: str, needle: str, after: str = "") -> int:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    return next(i for i, line in enumerate(lines[start:], start + 1) if needle in line)


def test_the_shipped_flags_state_smgs_veto():
    """The shipped spec gives no overload: block and has no gauge of either quantity (its KV signals
    are a growth rate and a time to full): the flags state smg 1.13's own 0.8 and 8."""
    assert "overload" not in RAW["inpath"]["shedders"]["gateway"]
    text = (ROOT / "inpath" / "gateway.flags").read_text()
    flags = _flags(text)
    assert (flags[TOKEN], flags[WAITING]) == ("0.8", "8")
    assert OVERLOAD_SHED not in flags and OVERLOAD_OFF not in flags
    assert "80%, smg 1.13's own default, stated (inpath.shedders.gateway.overload.token_usage not given" in _comment(text, TOKEN)
    assert "8, smg 1.13's own default, stated (inpath.shedders.gateway.overload.waiting_requests not given" in _comment(text, WAITING)
    assert "no signal of the spec reads KV-cache token usage" in _comment(text, TOKEN)
    assert "(inpath.shedders.gateway.overload.shed false, smg's default)" in _comment(text, OVERLOAD_SHED)
    # sglang-router 0.3.2 and vLLM have no such veto: their files say nothing of it
    for name in ("gateway_0_3", "engine"):
        assert "overload" not in (ROOT / "inpath" / f"{name}.flags").read_text()


def test_a_given_block_is_named_in_the_comments():
    text, flags = _gateway(_text({"token_usage": "80%", "waiting_requests": 8, "shed": False}))
    assert (flags[TOKEN], flags[WAITING]) == ("0.8", "8")
    assert "80% (inpath.shedders.gateway.overload.token_usage)" in _comment(text, TOKEN)
    assert "8 (inpath.shedders.gateway.overload.waiting_requests)" in _comment(text, WAITING)


def test_without_the_block_the_flags_state_smgs_defaults():
    text, flags = _gateway(_text(None))
    assert (flags[TOKEN], flags[WAITING]) == ("0.8", "8")
    assert text == (ROOT / "inpath" / "gateway.flags").read_text()  # the shipped file
    shedder = parse_spec(_text(None), "fusebox.yaml").inpath.shedders[0]
    assert shedder.veto_at == {}  # no signal of either quantity


def test_without_the_block_the_veto_follows_the_safe_level_of_its_quantity():
    """KV usage's warning is 85 %: 0.85; waiting's is 4.5 requests, so 5 whole requests (the veto
    counts whole requests, at or above; the alert fires at >= 4.5, i.e. at 5)."""
    text, flags = _gateway(_text(None, KV, QUEUE))
    assert (flags[TOKEN], flags[WAITING]) == ("0.85", "5")
    assert "(signals.kv_cache_usage.tiers.warning.threshold)" in _comment(text, TOKEN)
    assert "5 (4.5 rounded up)" in _comment(text, WAITING)
    assert "checked against signal 'kv_cache_usage'" in _comment(text, TOKEN)
    shedder = parse_spec(_text(None, KV, QUEUE), "fusebox.yaml").inpath.shedders[0]
    assert shedder.veto_at == {"kv_cache_usage": 0.85, "requests_waiting": 5.0}


def test_a_given_threshold_wins_and_is_checked():
    # 90 % is at or above the safe 85 % and under the fuse's 95 %; 19 is at or above 4.5 and under 20
    text, flags = _gateway(_text({"token_usage": "90%", "waiting_requests": 19}, KV, QUEUE))
    assert (flags[TOKEN], flags[WAITING]) == ("0.9", "19")
    assert "(inpath.shedders.gateway.overload.token_usage)" in _comment(text, TOKEN)


@pytest.mark.parametrize("overload,needle,what", [
    # at the fuse's 95 %: the veto would act only once the fuse trips
    ({"token_usage": "95%"}, "token_usage: 95%", "at or above the fuse's 95% (signals.kv_cache_usage.tiers.critical.threshold)"),
    # 0.84 is under the safe 85 %: it would shed what the spec calls safe
    ({"token_usage": 0.84}, "token_usage: 0.84", "under signal 'kv_cache_usage''s safe level 85%"),
    # 20 waiting requests: the fuse tier fires at >= 20
    ({"waiting_requests": 20}, "waiting_requests: 20", "at or above the fuse's 20 (signals.requests_waiting.tiers.critical.threshold)"),
    # 4 is under the safe 4.5
    ({"waiting_requests": 4}, "waiting_requests: 4", "under signal 'requests_waiting''s safe level 4.5"),
])
def test_a_veto_against_the_tiers_is_refused_at_its_line(overload, needle, what):
    text = _text(overload, KV, QUEUE)
    problems = _problems(text)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"fusebox.yaml:{_line_of(text, needle, after='overload:')}:"), problems
    assert what in problems[0]
    quantity = next(iter(overload))
    span = {"token_usage": "at or above 85% (signals.kv_cache_usage.tiers.warning.threshold) and under 95%",
            "waiting_requests": "at or above 4.5 (signals.requests_waiting.tiers.warning.threshold) and under 20"}
    assert problems[0].endswith(f" -- state overload.{quantity} {span[quantity]} (signals."
                                f"{'kv_cache_usage' if quantity == 'token_usage' else 'requests_waiting'}.tiers.critical.threshold)")


def test_smgs_default_over_a_fuse_is_refused_at_the_shedder():
    """A KV gauge with no warning tier and a fuse at 75 %: nothing to derive from, and smg's own
    0.8 would act after the fuse; the problem is at the shedder (the spec wrote no overload:)."""
    name, kv = KV
    kv = {**kv, "tiers": {"critical": {"threshold": "75%", "for": "30s", "fuse": "freeze_admissions"}}}
    text = _text(None, (name, kv))
    problems = _problems(text)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"fusebox.yaml:{_line_of(text, 'gateway:', after='shedders:')}:"), problems
    assert "at 80% KV-cache token usage (smg 1.13's default)" in problems[0]
    assert problems[0].endswith("-- state overload.token_usage under 75% (signals.kv_cache_usage.tiers.critical.threshold)")


def test_protection_off_writes_the_switch_and_no_threshold():
    text, flags = _gateway(_text({"protection": False}, KV))
    assert flags[OVERLOAD_OFF] is None  # a switch: no value
    assert TOKEN not in flags and WAITING not in flags and OVERLOAD_SHED not in flags
    assert "inpath.shedders.gateway.overload.protection false" in _comment(text, OVERLOAD_OFF)
    assert "80% KV-cache token usage or 8 waiting requests" in _comment(text, OVERLOAD_OFF)
    assert parse_spec(_text({"protection": False}, KV), "fusebox.yaml").inpath.shedders[0].veto_at == {}


def test_shed_writes_its_switch():
    _, flags = _gateway(_text({"token_usage": "80%", "waiting_requests": 8, "shed": True}))
    assert flags[OVERLOAD_SHED] is None and flags[TOKEN] == "0.8"


@pytest.mark.parametrize("overload,kind,needle,what", [
    ({"protection": False, "token_usage": "80%"}, "smg", "token_usage: 80%", "protection is false"),
    ({"protection": False, "shed": True}, "smg", "shed: true", "protection is false"),
    ({"token_usage": "0%"}, "smg", "token_usage: 0%", "not over 0% and at most 100%"),
    ({"token_usage": "120%"}, "smg", "token_usage: 120%", "1.2 as a ratio, outside 0..1"),
    ({"token_usage": "80 MB/s"}, "smg", "token_usage: 80 MB/s", "overload.token_usage"),
    ({"waiting_requests": 0}, "smg", "waiting_requests: 0", "under 1"),
    ({"token_usage": "80%"}, "sglang_router", "overload:", "kind sglang_router has no worker overload protection"),
    ({"protection": "no"}, "smg", "protection: 'no'", "bool"),
])
def test_a_wrong_overload_block_is_refused_at_its_line(overload, kind, needle, what):
    text = _text(overload, kind=kind)
    problems = _problems(text)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"fusebox.yaml:{_line_of(text, needle, after='gateway:')}:"), problems
    assert what in problems[0] and " -- " in problems[0]


def test_fusebox_check_exits_2_on_a_veto_after_the_fuse(tmp_path):
    spec = tmp_path / "fusebox.yaml"
    spec.write_text(_text({"token_usage": "95%"}, KV))
    r = run_cli("check", "--spec", str(spec), "--out", str(tmp_path / "out"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{spec}:{_line_of(spec.read_text(), 'token_usage: 95%', after='overload:')}:" in r.stderr
    assert "the veto acts only once the fuse trips" in r.stderr


def test_the_worked_example_queue_gauge_sets_the_waiting_veto():
    """docs/spec.md's worked example, a gauge of vllm:num_requests_waiting warning at 20 (no fuse
    tier), added to the shipped spec: the waiting-requests veto follows it to 20, as docs/inpath.md says."""
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "spec.md").read_text(), re.S)
                 if b.startswith("queue_depth:"))
    (name, body), = yaml.safe_load(block).items()
    assert body["sources"]["vllm"]["metric"] == "vllm:num_requests_waiting" and body["tiers"]["warning"]["threshold"] == 20
    text, flags = _gateway(_text(None, (name, body)))
    assert (flags[TOKEN], flags[WAITING]) == ("0.8", "20")
    assert "(signals.queue_depth.tiers.warning.threshold)" in _comment(text, WAITING)
