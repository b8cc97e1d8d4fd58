"""The generated in-path settings in force on the real gateways: smg 1.13 (``python -m
smg.launch_router``) and sglang-router 0.3.2 (``python -m sglang_router.launch_router``), each
started with the flags ``make generate`` wrote into inpath/ for the shipped spec, in front of two
stand-in engines that hold every request until told (a running generation).

The bound is worked out here from the shipped spec's own figures, not read from the files: GPU
memory's warning tier (its safe level) 72 %, idle 55 %, 2 % per running request, 2 engines:
floor((72 - 55) / 2) = 8 requests per engine, 16 in all; the queue is 0, so the 17th concurrent
request gets 429 at once. The rest is read from the live gateway's own API: its worker list, and
their admission counters on /metrics (the series a tier with after_shedding reads)."""

from __future__ import annotations

import shlex
import threading
import time

import httpx
import pytest
from _fuse_support import wait_for
from _gateways import SGLANG_ROUTER, SMG, StandInEngine, sglang_gateway, sglang_workers
from _support import ROOT, SPEC, yaml_data

from fusebox import conventions as C

pytestmark = pytest.mark.process

RAW = yaml_data(SPEC.read_text())
WARNING_PCT, IDLE_PCT, PER_REQUEST_PCT, ENGINES = 72, 55, 2, 2
BOUND = ENGINES * ((WARNING_PCT - IDLE_PCT) // PER_REQUEST_PCT)  # 16


def test_the_figures_are_the_shipped_specs():
    gw = RAW["inpath"]["shedders"]["gateway"]
    assert RAW["signals"]["gpu_memory_utilization"]["tiers"]["warning"]["threshold"] == f"{WARNING_PCT}.0%"
    assert (gw["idle"], gw["per_request"], gw["engines"]) == (f"{IDLE_PCT}%", f"{PER_REQUEST_PCT}%", ENGINES)
    assert "shed_at" not in gw and "set" not in gw  # the defaults: shed at the warning tier, queue 0
    assert BOUND == 16


def _flags(name: str) -> list[str]:
    """The generated file's flags, as its docs say to use it: every line but the comments."""
    text = (ROOT / "inpath" / f"{name}.flags").read_text()
    return [a for line in text.splitlines() if not line.startswith("#") for a in shlex.split(line)]


def _metric(url: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in httpx.get(url, timeout=5).text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("package,shedder", [(SMG, "gateway"), (SGLANG_ROUTER, "gateway_0_3")])
def test_the_generated_bound_is_in_force(tmp_path, package, shedder):
    """BOUND + 1 requests at once, on connections opened beforehand: BOUND run on the engines, one
    is refused with 429 and never reaches an engine. sglang-router 0.3.2's bound is a token bucket
    refilled at --rate-limit-tokens-per-second (1 here), so there the burst must land within a
    second (measured, and named when it does not); smg 1.13 bounds standing concurrency."""
    flags = _flags(shedder)
    # the file names the bound this test worked out (the flags come from the file, not from here)
    assert flags[flags.index("--max-concurrent-requests") + 1] == str(BOUND)
    assert flags[flags.index("--queue-size") + 1] == "0"
    rate = int(flags[flags.index("--rate-limit-tokens-per-second") + 1])
    release = threading.Event()
    engines = [StandInEngine(hold=release) for _ in range(ENGINES)]
    gw = None
    n = BOUND + 1
    client = httpx.Client(limits=httpx.Limits(max_connections=n, max_keepalive_connections=n), timeout=90)
    results: list[int] = []
    barrier = threading.Barrier(n + 1)

    def warm():
        client.get(gw.url + "/readiness")  # opens this thread's connection while the others are open too
        barrier.wait(30)

    def call():
        barrier.wait(30)
        try:
            results.append(client.post(gw.url + "/generate", json={"text": "hi"}).status_code)
        except httpx.HTTPError as e:  # noted, so the count below says what went wrong
            results.append(-1)
            print(f"request failed: {e!r}")

    threads: list[threading.Thread] = []
    try:
        gw = sglang_gateway([e.url for e in engines], tmp_path / f"{package}.log", flags, package=package)
        assert set(sglang_workers(gw.url)) == {e.url for e in engines}  # the gateway's own worker list
        warmers = [threading.Thread(target=warm, daemon=True) for _ in range(n)]
        for t in warmers:
            t.start()
        barrier.wait(30)
        for t in warmers:
            t.join(10)
        threads = [threading.Thread(target=call, daemon=True) for _ in range(n)]
        for t in threads:
            t.start()
        barrier.wait(30)
        start = time.monotonic()
        wait_for(lambda: sum(e.holding for e in engines) + len(results) >= n, 20, step=0.01,
                 what=f"{n} requests admitted or refused")
        burst_s = time.monotonic() - start
        assert results == [429], (results, f"the burst took {burst_s:.3f} s; 0.3.2 refills one token each {1 / rate:g} s")
        assert sum(e.holding for e in engines) == BOUND  # the refused one never reached an engine
        # both count their admissions on /metrics under one name: what a tier with after_shedding reads
        assert _metric(gw.metrics_url, C.GATEWAY_ADMISSIONS, result="allowed") == BOUND
        assert _metric(gw.metrics_url, C.GATEWAY_ADMISSIONS, result="rejected") == 1
        release.set()
        for t in threads:
            t.join(30)
        assert sorted(results) == [200] * BOUND + [429]
    finally:
        release.set()
        client.close()
        if gw is not None:
            gw.stop()
        for e in engines:
            e.stop()
