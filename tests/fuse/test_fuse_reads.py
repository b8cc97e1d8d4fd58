"""Reads that cannot starve writes (issue 34, defect 3): eight clients reading the largest page of
``/state`` over and over, on a `fusebox fuse serve` process holding 10,000 scopes whose five scope
labels are 256 characters each, while real notifications arrive. On main, eight readers of
``/state?limit=10000`` delayed a notification by 5.7-21 s and ``/healthz`` by 3-4.6 s, and the
process peaked at 786 MB against the Deployment's 512 MiB.

The bounds asserted are the deployed ones, not speed targets: every notification and every
``/healthz`` answered 200 within the liveness probe's timeoutSeconds of the Deployment that
``make generate`` writes (k8s/fuse.yml, 5 s: a /healthz slower than that is a failed probe, and
three restart the pod; the starved notifications above took 5.7-21 s), and the process's peak
resident memory (VmHWM) under that Deployment's memory limit. The latency target is
bench/bench_fuse.py --hostile's (each phase's p99 within 2x the p99 alone, with the CPU busy share
beside it; alone a notification's p50 is 6-8 ms): here a 1 s bound failed a CI run once at 1.02 s,
on a 2-core machine running four test workers, which measured the machine, not the fuse."""

from __future__ import annotations

import base64
import hashlib
import itertools
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from _fuse_support import ROOT, SPEC, TOKEN, alert, dry_run_service, payload, serve_dry_run, wait_for, wait_ok
from fastapi.testclient import TestClient

from fusebox.fuse import Breaker, FuseRules, parse_payload
from fusebox.fuse.http.app import create_app
from fusebox.fuse.store import open_store
from fusebox.spec import load_spec

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SCOPES = 10_000
LABEL = 256  # characters of every scope label value
READERS = 8
NOTIFICATIONS = 12


def _scope(i: int) -> dict:
    """Scope ``i``: five labels of LABEL characters each, distinct from the first characters on."""
    return {k: f"{k[0]}{i:05d}".ljust(LABEL, "x") for k in ("cluster", "host_name", "instance", "hw_id", "engine")}


def _memory_limit_bytes() -> int:
    """The fuse container's memory limit in the generated Deployment (k8s/fuse.yml), bytes."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for doc in yaml.safe_load_all((ROOT / "k8s" / "fuse.yml").read_text()):
        if doc and doc.get("kind") == "Deployment":
            (container,) = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "fuse"]
            text = str(container["resources"]["limits"]["memory"])
            return int(text[:-2]) * units[text[-2:]] if text[-2:] in units else int(text)
    raise AssertionError("k8s/fuse.yml holds no Deployment")


def _probe_timeout_s() -> float:
    """The fuse container's liveness probe timeoutSeconds in the generated Deployment (k8s/fuse.yml), s."""
    for doc in yaml.safe_load_all((ROOT / "k8s" / "fuse.yml").read_text()):
        if doc and doc.get("kind") == "Deployment":
            (container,) = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "fuse"]
            return float(container["livenessProbe"]["timeoutSeconds"])
    raise AssertionError("k8s/fuse.yml holds no Deployment")


def _vm_hwm(pid: int) -> int:
    """Peak resident memory of process ``pid`` so far, bytes (/proc/PID/status VmHWM, in kB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _get(url: str, **params) -> httpx.Response:
    """GET ``url`` as a reader that honours a 503's Retry-After (the fuse serves one read at a time)."""
    for _ in range(10):
        r = httpx.get(url, params=params, headers=AUTH, timeout=60)
        if r.status_code != 503:
            return r
        time.sleep(float(r.headers["retry-after"]))
    raise AssertionError(f"{url} still 503 after 10 tries")


@pytest.mark.process
def test_eight_readers_of_the_largest_page_neither_delay_notifications_nor_pass_the_memory_limit(tmp_path):
    t0 = time.time() - 120
    breaker = Breaker(FuseRules.from_spec(load_spec(SPEC)), 3600, max_scopes=SCOPES)
    breaker.on_notification(parse_payload(payload(*[alert("GPUMemoryUtilizationHigh", starts=t0, **_scope(i))
                                                    for i in range(SCOPES)]), t0), t0)
    store = open_store(f"sqlite:///{tmp_path / 'fuse.sqlite'}")
    store.commit(breaker.snapshot())
    store.close()
    del breaker
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    proc, url = serve_dry_run(tmp_path / "fuse.sqlite", tmp_path / "token")
    stop = threading.Event()
    pages: list[tuple[int, int, int, str | None]] = []  # (limit, status, bytes, Retry-After)

    def read():
        # the reader (limit=10000, the most before: now over it) and the largest page served
        with httpx.Client(headers=AUTH, timeout=60) as c:
            for limit in itertools.cycle((10_000, 1000)):
                if stop.is_set():
                    return
                r = c.get(url + "/state", params={"limit": limit})
                pages.append((limit, r.status_code, len(r.content), r.headers.get("retry-after")))

    readers = [threading.Thread(target=read) for _ in range(READERS)]
    try:
        wait_ok(url + "/healthz", proc)
        first = _get(url + "/state", limit=1000)
        assert first.status_code == 200 and first.json()["total"] == SCOPES
        for t in readers:
            t.start()
        wait_for(lambda: len(pages) >= READERS, 30, 0.01, "the readers under way")
        took, probes = [], []
        with httpx.Client(headers=AUTH, timeout=60) as c:
            for i in range(NOTIFICATIONS):
                t = time.perf_counter()
                r = c.post(url + "/alertmanager", json=payload(alert("KVCacheGrowthRateHigh", starts=t0 + 1,
                                                                      **_scope(i))))
                took.append(time.perf_counter() - t)
                assert r.status_code == 200 and r.json()["alerts"] == {"tripped": 1}, r.text
                t = time.perf_counter()
                assert c.get(url + "/healthz").status_code == 200
                probes.append(time.perf_counter() - t)
        stop.set()
        for t in readers:
            t.join(60)
        peak = _vm_hwm(proc.pid)
        # the notifications were applied: level 3 (the spec's KVCacheGrowthRateHigh) on each of their scopes
        level3 = _get(url + "/state", level=3).json()
        assert level3["total"] == NOTIFICATIONS
        empty = _get(url + "/state", offset=SCOPES)
    finally:
        stop.set()
        proc.terminate()
        proc.wait(10)
    bound = _probe_timeout_s()
    assert bound == 5  # worked from the generated Deployment: the starved notifications (5.7-21 s) fail it
    assert max(took) < bound, f"notifications took {sorted(took)} s while {READERS} clients read /state"
    assert max(probes) < bound, f"/healthz took {sorted(probes)} s while {READERS} clients read /state"
    assert peak < _memory_limit_bytes(), f"VmHWM {peak / 2**20:.0f} MiB over the Deployment's limit"
    assert empty.json()["scopes"] == [] and empty.json().get("tripped_total") == SCOPES
    assert len(empty.content) < 200_000, len(empty.content)  # 100 tripped keys of 1.3 kB, not 10,000
    assert {code for limit, code, _, _ in pages if limit == 10_000} == {400}  # over the most: refused
    served = [n for limit, code, n, _ in pages if limit == 1000 and code == 200]
    assert served and max(served) <= 4 << 20  # the largest page within its 4 MiB
    assert {code for limit, code, _, _ in pages if limit == 1000} <= {200, 503}
    assert all(after == "1" for _, code, _, after in pages if code == 503)  # busy: Retry-After, at once


def test_the_status_page_and_state_send_security_headers_and_refuse_a_page_over_the_most(tmp_path):
    svc = dry_run_service(tmp_path)
    try:
        svc.handle(parse_payload(payload(alert("GPUMemoryUtilizationHigh", starts=1_700_000_000.0, cluster="a",
                                               hw_id="G0")), 1_700_000_001.0), 1_700_000_001.0)
        client = TestClient(create_app(svc, TOKEN))
        page = client.get("/", headers=AUTH)
        assert page.status_code == 200
        csp = {d.split(" ", 1)[0]: d.split(" ", 1)[1:] for d in page.headers["content-security-policy"].split("; ")}
        assert csp["default-src"] == ["'none'"] and csp["frame-ancestors"] == ["'none'"]
        assert "script-src" not in csp and "<script" not in page.text  # no script at all
        # the one style block the browser sees, hashed here: the policy allows exactly it
        (style,) = re.findall(r"<style>(.*?)</style>", page.text, flags=re.S)
        digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
        assert csp["style-src"] == [f"'sha256-{digest}'"]
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["referrer-policy"] == "no-referrer"
        assert page.headers["cache-control"] == "no-store"
        state = client.get("/state", headers=AUTH)
        assert state.headers["x-content-type-options"] == "nosniff" and state.headers["cache-control"] == "no-store"
        assert state.json()["tripped"] == {'{cluster="a",hw_id="G0"}': 1} and state.json()["tripped_total"] == 1
        for path, most in (("/state", 1000), ("/", 100)):
            assert client.get(path, params={"limit": most}, headers=AUTH).status_code == 200
            over = client.get(path, params={"limit": most + 1}, headers=AUTH)
            assert over.status_code == 400 and over.json()["field"].endswith("limit"), over.text
    finally:
        svc.store.close()


def test_a_read_while_another_is_built_is_answered_503_with_retry_after_at_once(tmp_path):
    svc = dry_run_service(tmp_path)
    try:
        app = create_app(svc, TOKEN)
        client = TestClient(app)
        app.state.readers_busy = 1  # a build under way (the one reader thread)
        busy = client.get("/state", headers=AUTH)
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1", busy.text
        page = client.get("/", headers=AUTH)  # a browser's: a page that asks again by itself
        assert page.status_code == 503 and page.headers["retry-after"] == "1"
        assert '<meta http-equiv="refresh" content="1">' in page.text
        assert page.headers["x-frame-options"] == "DENY"
        assert client.get("/state").status_code == 401  # the token first, busy or not
        app.state.readers_busy = 0
        assert client.get("/state", headers=AUTH).status_code == 200
    finally:
        svc.store.close()
