"""The in-path records (generator/shedding.py) on a live gateway: smg 1.13 (``python -m
smg.launch_router``) started with the flags ``make generate`` wrote into inpath/gateway.flags for
the shipped spec, in front of two stand-in engines that hold every request, scraped every second by
a real Prometheus (2.42, Debian's) that runs the ``fusebox-inpath`` group the spec generates (its
interval set to 1 s so the test need not wait 30 s).

Worked out here from the shipped spec's own figures, not read from the files: GPU memory's warning
tier 72 %, idle 55 %, 2 % per running request, 2 engines -> floor((72 - 55) / 2) = 8 per engine, 16
in all, queue 0. With 16 requests held, each further request is refused at once: the test sends 3,
so the gateway counts 3 rejected, and the refusal record, the refusals within its 1 m window over
60 s, reads 3 / 60 = 0.05 requests/s. The gateway writes no rejected series before its first
refusal (checked below), so a plain rate() would miss those 3; the record does not, nor does the
after_shedding gate, which reads the same count (3 refused in its minute: open). Both workers'
breakers stay closed (0, none open), and smg's three overload stages shed nothing (0/s each).

A second gateway, the same flags with ``--cb-failure-threshold 2`` (the breaker opens at a worker's
second failure in a row, smg's own --help) and round robin, fronts a stand-in and an engine that
answers every POST with 500: after its two failures that worker's breaker is open, so the breaker
record reads 1 for it and 0 for the other, and one worker is open in all."""

from __future__ import annotations

import shlex
import threading

import httpx
import pytest
import yaml
from _dashboards_support import prometheus, query
from _fuse_support import wait_for
from _gateways import SMG, StandInEngine, sglang_gateway
from _support import ROOT, SPEC

from fusebox import conventions as C
from fusebox.generator import shedding
from fusebox.generator.outputs import RULE_FILE, render_all
from fusebox.generator.render_rules import shedding_gate
from fusebox.spec import load_spec

pytestmark = [pytest.mark.process, pytest.mark.tools]

WARNING_PCT, IDLE_PCT, PER_REQUEST_PCT, ENGINES = 72, 55, 2, 2
BOUND = ENGINES * ((WARNING_PCT - IDLE_PCT) // PER_REQUEST_PCT)  # 16
REFUSED = 3
WINDOW_S = 60  # a minute: the shipped spec scrapes every 15 s or less (four scrapes fit)


def _flags() -> list[str]:
    text = (ROOT / "inpath" / "gateway.flags").read_text()
    return [a for line in text.splitlines() if not line.startswith("#") for a in shlex.split(line)]


def _samples(text: str, name: str) -> dict[str, float]:
    """``{label text: value}`` of the samples of ``name`` on a /metrics page."""
    return {line[len(name):].rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(name + "{")}


def _rules(tmp_path):
    spec = load_spec(SPEC, display_path="fusebox.yaml")
    groups = yaml.safe_load(render_all(spec)[RULE_FILE])["groups"]
    [group] = [g for g in groups if g["name"] == shedding.GROUP]
    assert group["interval"] == "30s"  # the slow interval, as generated
    group["interval"] = "1s"
    path = tmp_path / "inpath.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    return path, shedding.records(spec)


def _value(url: str, expr: str) -> dict[str, float]:
    return {str(sorted(r["metric"].items())): float(r["value"][1]) for r in query(url, expr)}


def test_the_records_count_the_refusals_a_live_smg_made(tmp_path):
    flags = _flags()
    assert flags[flags.index("--max-concurrent-requests") + 1] == str(BOUND)
    assert flags[flags.index("--queue-size") + 1] == "0"
    rules, names = _rules(tmp_path)
    assert shedding.window_s(load_spec(SPEC, display_path="fusebox.yaml")) == WINDOW_S
    release = threading.Event()
    engines = [StandInEngine(hold=release) for _ in range(ENGINES)]
    gw = None
    held: list[threading.Thread] = []
    results: list[int] = []
    try:
        gw = sglang_gateway([e.url for e in engines], tmp_path / "smg.log", flags, package=SMG)
        before = httpx.get(gw.metrics_url, timeout=5).text
        # measured: no admission series before the first request, no rejected one before the first refusal
        assert _samples(before, C.GATEWAY_ADMISSIONS) == {}
        assert set(_samples(before, C.GATEWAY_BREAKER_STATE)) == {f'{{worker="{e.url}"}}' for e in engines}
        target = gw.metrics_url.removeprefix("http://").removesuffix("/metrics")
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rules)],
                  "scrape_configs": [{"job_name": "smg", "static_configs": [{"targets": [target]}]}]}
        with prometheus(tmp_path, config) as prom:
            wait_for(lambda: query(prom, 'up{job="smg"} == 1'), 30, step=0.5, what="Prometheus scraping the gateway")

            def call():
                results.append(httpx.post(gw.url + "/generate", json={"text": "hi"}, timeout=90).status_code)

            held = [threading.Thread(target=call, daemon=True) for _ in range(BOUND)]
            for t in held:
                t.start()
            wait_for(lambda: sum(e.holding for e in engines) == BOUND, 30, what=f"{BOUND} requests running")
            refused = [httpx.post(gw.url + "/generate", json={"text": "hi"}, timeout=30).status_code for _ in range(REFUSED)]
            assert refused == [429] * REFUSED
            assert sum(e.holding for e in engines) == BOUND  # the refused ones never reached an engine
            page = httpx.get(gw.metrics_url, timeout=5).text
            assert _samples(page, C.GATEWAY_ADMISSIONS)['{result="rejected"}'] == REFUSED  # the gateway's own count

            def refused_rate():  # a scrape between two of the refusals (a loaded machine) shows 1 or 2 first
                got = _value(prom, names["refused"])
                return got if got and list(got.values())[0] >= REFUSED / WINDOW_S - 1e-9 else None

            got = wait_for(refused_rate, 60, step=0.5, what=f"{names['refused']} counting all {REFUSED} refusals")
            # one series (the scrape carries no cluster label), 3 refusals in the window over 60 s
            assert list(got.values()) == [pytest.approx(REFUSED / WINDOW_S, rel=1e-12)]
            # a plain rate() over the same minute misses them: the series was born with its 3
            plain = query(prom, f'sum(rate({C.GATEWAY_ADMISSIONS}{{result="rejected"}}[1m]))')
            assert [float(r["value"][1]) for r in plain] in ([], [0.0])
            # the after_shedding gate reads the same count: open, with the 3 refusals
            gate = query(prom, shedding_gate(load_spec(SPEC, display_path="fusebox.yaml")))
            assert [float(r["value"][1]) for r in gate] == [REFUSED]
            # breakers: both workers closed, none open; overload: smg's three stages at 0/s
            wait_for(lambda: _value(prom, names["breakers_open"]), 20, step=0.5, what=names["breakers_open"])
            assert list(_value(prom, names["breakers_open"]).values()) == [0.0]
            workers = {r["metric"]["worker"]: float(r["value"][1]) for r in query(prom, names["breaker_open"])}
            assert workers == {e.url: 0.0 for e in engines}
            stages = {r["metric"]["stage"]: float(r["value"][1]) for r in query(prom, names["overload_shed"])}
            assert stages == {"selection": 0.0, "dispatch": 0.0, "pd_admission": 0.0}
            release.set()
            for t in held:
                t.join(30)
            assert sorted(results) == [200] * BOUND
    finally:
        release.set()
        if gw is not None:
            gw.stop()
        for e in engines:
            e.stop()


def test_the_breaker_records_show_the_worker_a_live_smg_cut_off(tmp_path):
    rules, names = _rules(tmp_path)
    good, bad = StandInEngine(), StandInEngine(fail_posts=True)
    gw = None
    try:
        flags = [*_flags(), "--cb-failure-threshold", "2", "--policy", "round_robin", "--retry-max-retries", "1"]
        gw = sglang_gateway([good.url, bad.url], tmp_path / "smg.log", flags, package=SMG)
        target = gw.metrics_url.removeprefix("http://").removesuffix("/metrics")
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rules)],
                  "scrape_configs": [{"job_name": "smg", "static_configs": [{"targets": [target]}]}]}
        with prometheus(tmp_path, config) as prom:
            wait_for(lambda: query(prom, 'up{job="smg"} == 1'), 30, step=0.5, what="Prometheus scraping the gateway")
            codes = [httpx.post(gw.url + "/generate", json={"text": "hi"}, timeout=30).status_code for _ in range(10)]
            assert codes.count(500) == 2, codes  # round robin: the failing worker's two failures, then it is cut off
            page = httpx.get(gw.metrics_url, timeout=5).text
            assert _samples(page, C.GATEWAY_BREAKER_STATE) == {f'{{worker="{bad.url}"}}': 1.0, f'{{worker="{good.url}"}}': 0.0}

            def open_workers():
                got = _value(prom, names["breakers_open"])
                return got if got and list(got.values()) == [1.0] else None

            wait_for(open_workers, 20, step=0.5, what=f"{names['breakers_open']} at 1")
            workers = {r["metric"]["worker"]: float(r["value"][1]) for r in query(prom, names["breaker_open"])}
            assert workers == {bad.url: 1.0, good.url: 0.0}
    finally:
        if gw is not None:
            gw.stop()
        good.stop()
        bad.stop()
