"""smg 1.13's worker overload veto, as the generated inpath/gateway.flags set it, on the real
gateway (``python -m smg.launch_router``, from the lock) in front of two stand-in engines whose
/metrics report a KV-cache usage the test sets (``vllm:kv_cache_usage_perc``, what smg's load poll
reads from a vLLM engine).

The flag names are read from smg's own ``--help``. The numbers are worked out here: a spec with a
KV-usage gauge whose warning tier (its safe level) is 85 % and whose fuse tier is at 95 % gets the
veto at 0.85 (no `overload:` block: the safe level); smg compares at or above, so an engine at
0.85 leaves routing and one at 0.84 takes every request. Under smg's own default, 0.8, both would be
over: the generated flag is what keeps the 0.84 engine in routing."""

from __future__ import annotations

import shlex
import subprocess
import sys

import httpx
import pytest
from _fuse_support import wait_for
from _gateways import SMG, StandInEngine, sglang_gateway
from _support import ROOT, SPEC, yaml_data, yaml_text

from fusebox import conventions as C
from fusebox.generator.outputs import render_all
from fusebox.generator.render_inpath import FLAGS, OVERLOAD_FLAGS, OVERLOAD_OFF, OVERLOAD_SHED
from fusebox.spec import parse_spec
from fusebox.spec.inpath import SETTINGS
from fusebox.spec.overload import SMG_OVERLOAD_DEFAULTS

pytestmark = pytest.mark.process

MODEL = "stand-in"  # the model the stand-ins name (GET /v1/models)


def _spec(overload: dict | None) -> str:
    """The shipped spec with a KV-usage gauge (warning 85 %, fuse at 95 %) and the smg gateway's
    `overload:` replaced (None: removed)."""
    data = yaml_data(SPEC.read_text())
    data["signals"]["kv_cache_usage"] = {
        "alert": "KVCacheUsageHigh", "description": "Share of KV blocks in use per engine.", "kind": "gauge",
        "unit": "ratio", "level": "engine", "by": ["cluster", "host_name", "engine", "model"],
        "sources": {"vllm": {"metric": "vllm:kv_cache_usage_perc"}},
        "tiers": {"warning": {"threshold": "85%", "for": "1m"},
                  "critical": {"threshold": "95%", "for": "30s", "fuse": "freeze_admissions"}},
        "runbook": {"symptom": "s", "impact": "i", "sop": {"warning": ["w"], "critical": ["c"]}}}
    gw = data["inpath"]["shedders"]["gateway"]
    gw.pop("overload", None)
    if overload is not None:
        gw["overload"] = overload
    return yaml_text(data, sort_keys=False)


def _flags(text: str) -> list[str]:
    """The file's flags, as docs/inpath.md says to use it: every line but the comments."""
    return [a for line in text.splitlines() if not line.startswith("#") for a in shlex.split(line)]


def _generated(overload: dict | None) -> list[str]:
    return _flags(render_all(parse_spec(_spec(overload), "fusebox.yaml"))["inpath/gateway.flags"])


def _engine(usage: float) -> StandInEngine:
    return StandInEngine(metrics=lambda: (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{model_name="{MODEL}",engine="0"}} {usage}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="{MODEL}",engine="0"}} 0\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="{MODEL}",engine="0"}} 0\n'))


def _samples(url: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of every sample of ``name`` on a /metrics page."""
    out = {}
    for line in httpx.get(url, timeout=5).text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name):].rsplit(" ", 1)
            out[labels] = float(value)
    return out


def _run(tmp_path, flags: list[str], usages: tuple[float, float], log: str):
    """smg with ``flags`` in front of two stand-ins at ``usages``, once its load poll has read both;
    returns (gateway, engines): the caller stops them."""
    engines = [_engine(u) for u in usages]
    try:
        gw = sglang_gateway([e.url for e in engines], tmp_path / log, flags, package=SMG)
    except BaseException:
        for e in engines:
            e.stop()
        raise
    wait_for(lambda: len(_samples(gw.metrics_url, "smg_engine_token_usage")) == 2, 30, step=0.2,
             what="smg's load poll of both engines")
    return gw, engines


def _stop(gw, engines) -> None:
    gw.stop()
    for e in engines:
        e.stop()


def _posts(engine: StandInEngine) -> int:
    return sum(1 for method, _ in engine.seen if method == "POST")


def test_every_flag_the_generator_writes_for_smg_is_in_its_help():
    """Each flag the generator can write for kind smg, read from smg 1.13's own --help, and the
    defaults fusebox states for a spec without them (0.8, 8) are the ones that help gives."""
    r = subprocess.run([sys.executable, "-m", f"{SMG}.launch_router", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    tokens = set(r.stdout.replace("[", " ").replace("]", " ").replace(",", " ").split())
    written = [FLAGS[k] for k in SETTINGS["smg"]] + list(OVERLOAD_FLAGS.values()) + [OVERLOAD_OFF, OVERLOAD_SHED]
    assert [f for f in written if f not in tokens] == []
    # each option's help: from its line ("  --flag VALUE") to the next option's
    helps: dict[str, str] = {}
    flag = ""
    for line in r.stdout.splitlines():
        if line.startswith("  --"):
            flag = line.split()[0]
        if flag:
            helps[flag] = helps.get(flag, "") + " " + line.strip()
    assert helps[OVERLOAD_FLAGS["token_usage"]].endswith("(default: 0.8)")
    assert helps[OVERLOAD_FLAGS["waiting_requests"]].endswith("(default: 8)")
    assert {q: float(helps[f].rsplit("(default: ", 1)[1].rstrip(")")) for q, f in OVERLOAD_FLAGS.items()} == SMG_OVERLOAD_DEFAULTS
    assert "AT OR ABOVE" in helps[OVERLOAD_FLAGS["token_usage"]] and "AT OR ABOVE" in helps[OVERLOAD_FLAGS["waiting_requests"]]


def _overloaded(gw, n: int) -> None:
    """Wait until smg counts ``n`` workers of the model overloaded (left out of routing)."""
    wait_for(lambda: _samples(gw.metrics_url, "smg_workers_overloaded").get(f'{{model="{MODEL}"}}') == n, 30,
             step=0.2, what=f"{n} workers overloaded")


def _routes_around_the_first(tmp_path, flags: list[str], usages: tuple[float, float], log: str) -> None:
    """smg with ``flags`` in front of engines at ``usages``, the first over the veto and the second
    under: one worker overloaded, and every request goes to the second engine."""
    gw, engines = _run(tmp_path, flags, usages, log)
    try:
        _overloaded(gw, 1)
        for _ in range(3):
            assert httpx.post(gw.url + "/generate", json={"text": "hi"}, timeout=30).status_code == 200
        assert [_posts(e) for e in engines] == [0, 3]
    finally:
        _stop(gw, engines)


def test_the_shipped_flags_start_smg(tmp_path):
    """The shipped inpath/gateway.flags (smg's own 0.8 and 8, stated): smg starts with them; engines
    at 0.8 and 0.79 KV usage: the one at 0.8 leaves routing."""
    flags = _flags((ROOT / "inpath" / "gateway.flags").read_text())
    assert flags[flags.index(OVERLOAD_FLAGS["token_usage"]) + 1] == "0.8"
    _routes_around_the_first(tmp_path, flags, (0.8, 0.79), "smg-shipped.log")


def test_the_derived_veto_is_in_force(tmp_path):
    flags = _generated(None)
    assert flags[flags.index(OVERLOAD_FLAGS["token_usage"]) + 1] == "0.85"  # the KV gauge's safe level
    # at or above: the engine at 0.85 is overloaded, the one at 0.84 is not
    _routes_around_the_first(tmp_path, flags, (0.85, 0.84), "smg-derived.log")
    # the same engines under smg's own default (0.8, the flag left out): both are over it
    i = flags.index(OVERLOAD_FLAGS["token_usage"])
    gw, engines = _run(tmp_path, flags[:i] + flags[i + 2:], (0.85, 0.84), "smg-default.log")
    try:
        _overloaded(gw, 2)
    finally:
        _stop(gw, engines)


def test_protection_off_keeps_every_worker_in_routing(tmp_path):
    flags = _generated({"protection": False})
    assert OVERLOAD_OFF in flags and OVERLOAD_FLAGS["token_usage"] not in flags
    gw, engines = _run(tmp_path, flags, (0.99, 0.99), "smg-off.log")  # over any threshold
    try:
        for _ in range(4):
            assert httpx.post(gw.url + "/generate", json={"text": "hi"}, timeout=30).status_code == 200
        assert _samples(gw.metrics_url, "smg_workers_overloaded").get(f'{{model="{MODEL}"}}', 0) == 0
        assert sum(_posts(e) for e in engines) == 4
    finally:
        _stop(gw, engines)


def test_shed_refuses_when_every_worker_is_over(tmp_path):
    flags = _generated({"token_usage": "90%", "waiting_requests": 8, "shed": True})
    assert flags[flags.index(OVERLOAD_FLAGS["token_usage"]) + 1] == "0.9" and OVERLOAD_SHED in flags
    gw, engines = _run(tmp_path, flags, (0.9, 0.93), "smg-shed.log")  # both at or above 0.9
    try:
        _overloaded(gw, 2)
        r = httpx.post(gw.url + "/generate", json={"text": "hi"}, timeout=30)
        assert r.status_code == 503, r.text
        assert [_posts(e) for e in engines] == [0, 0]
        assert _samples(gw.metrics_url, "smg_worker_overload_shed_total")['{stage="selection"}'] == 1
        # admitted at the gateway's door, shed at worker selection: not a refusal of the concurrency
        # bound, so the after_shedding gate (smg_http_rate_limit_total, result rejected) does not count it
        assert _samples(gw.metrics_url, C.GATEWAY_ADMISSIONS) == {'{result="allowed"}': 1}
    finally:
        _stop(gw, engines)
