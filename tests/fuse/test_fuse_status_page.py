"""The read-only status page, rendered by headless Chromium: the DOM (``--dump-dom``) and a
screenshot (``--screenshot``), kept as a build artefact in the test's temporary folder.

Expected values are worked out from the inputs, not from the page: the times from the fake clock,
the runbook URL from fusebox.yaml's ``runbook_base_url``, the dashboard UID from the generated
dashboards/fusebox-overview.json, Alertmanager's address from the notification's ``externalURL``.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from _fuse_support import ROOT, SPEC, TOKEN, LiveService, alert, need_tool, payload, wait_for

from fusebox.fuse.adapters.gateway import HttpGateway
from fusebox.fuse.http.status import StatusLinks
from fusebox.spec import load_spec

pytestmark = pytest.mark.tools  # headless Chromium

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
T0_ISO = "2027-01-15T08:00:00Z"
KV = {"cluster": "prod-a", "host_name": "node-7", "engine": "vllm-0"}
GPU = {"cluster": "prod-a", "host_name": "node-7", "hw_id": "GPU-5f3c"}
RUNBOOKS = "https://github.com/your-org/monitoring/blob/main/runbooks"  # fusebox.yaml global.runbook_base_url
GRAFANA = "https://grafana.example.org"
AM = "http://alertmanager:9093"  # the externalURL payload() sends


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def overview_uid() -> str:
    return json.loads((ROOT / "dashboards" / "fusebox-overview.json").read_text())["uid"]


def links() -> StatusLinks:
    spec = dataclasses.replace(load_spec(SPEC), dashboard_base_url=GRAFANA + "/")
    return StatusLinks.from_spec(spec)


def chromium_page(svc: LiveService, tmp_path: Path, shot: Path) -> str:
    """The page's DOM after Chromium ran it, and its screenshot written to ``shot``."""
    chromium = need_tool("chromium", "chromium-browser", "google-chrome")
    url = svc.url.replace("http://", f"http://sre:{TOKEN}@") + "/"  # a browser sends the token as Basic
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--hide-scrollbars", f"--user-data-dir={tmp_path / 'chromium-profile'}"]
    out = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=90)
    assert "<table" in out.stdout, out.stderr[-2000:]
    shot_run = subprocess.run([*common, "--window-size=1280,1000", f"--screenshot={shot}", url],
                              capture_output=True, text=True, timeout=90)
    assert shot.is_file() and shot.stat().st_size > 10_000, shot_run.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return out.stdout


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of an 8-bit, non-interlaced RGB or RGBA PNG (what
    Chromium writes), decoded with the standard library (PNG spec, section 9: filters 0-4)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, ihdr = 8, [], (0, 0, 8, 2, 0, 0, 0)
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", data[pos + 8:pos + 8 + n])
        elif kind == b"IDAT":
            idat.append(data[pos + 8:pos + 8 + n])
        pos += 12 + n
    w, h, depth, color, _, _, interlace = ihdr
    assert depth == 8 and color in (2, 6) and interlace == 0, ihdr
    bpp, raw = (3 if color == 2 else 4), zlib.decompress(b"".join(idat))
    stride, prev, rows = w * bpp, bytearray(w * bpp), []
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride) if f else ():
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 255
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line) if bpp == 3 else bytes(v for j, v in enumerate(line) if j % 4 != 3))
        prev = line
    return w, h, rows


def assert_nothing_overflows(shot: Path, banner: bool) -> None:
    """The page fits the window: the rightmost 8 pixel columns hold only the page's margin (white)
    and, with the dry-run banner, its red and its black rule; a table wider than the window would
    put its cells and borders there."""
    w, _, rows = png_pixels(shot.read_bytes())
    edge = {row[x * 3:x * 3 + 3] for row in rows for x in range(w - 8, w)}
    allowed = {b"\xff\xff\xff"} | ({b"\xb0\x00\x20", b"\x00\x00\x00"} if banner else set())
    assert edge <= allowed, sorted(edge - allowed)[:5]


def rows_of(dom: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(scope key, level) -> (row class, row HTML)."""
    found = re.findall(r'<tr class="(\w+)" data-scope="([^"]*)" data-level="(\d)">(.*?)</tr>', dom, re.S)
    return {(html.unescape(scope), level): (cls, body) for cls, scope, level, body in found}


def hrefs(fragment: str, cls: str) -> list[str]:
    return [html.unescape(h) for h in re.findall(rf'<a class="{cls}" href="([^"]*)"', fragment)]


def text(fragment: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment))).strip()


def test_dry_run_page_shows_banner_tripped_since_links_and_pending_release(tmp_path):
    clock = Clock(T0)
    with LiveService(tmp_path / "s.sqlite", dry_run=True, hold_s=1200, tick_s=0.05, clock=clock,
                     links=links()) as svc:
        kv = alert("KVCacheGrowthRateHigh", **KV)
        gpu = alert("GPUMemoryUtilizationHigh", **GPU)
        assert svc.post(payload(kv, gpu)).status_code == 200
        clock.t = T0 + 60  # the GPU alert resolves: its level waits out the 1200 s hold
        assert svc.post(payload(alert("GPUMemoryUtilizationHigh", status="resolved", **GPU))).status_code == 200
        clock.t = T0 + 120
        body = {"scope": {"cluster": "prod-b", "engine": "sglang-1"}, "level": 2, "mode": "trip",
                "reason": "SRE <b>manual</b> fallback", "expires_in_s": 3600}
        assert svc.post(body, path="/override").status_code == 200
        wait_for(lambda: svc.state()["pending_actions"] == 0, 5, what="dry-run decisions audited")
        clock.t = T0 + 12 * 60 + 30  # 12.5 minutes after the trip
        shot = tmp_path / "status-dry-run.png"
        dom = chromium_page(svc, tmp_path, shot)
        assert_nothing_overflows(shot, banner=True)
        metrics = svc.service.metrics
        assert metrics.registry.get_sample_value("fusebox_fuse_dry_run") == 1.0

    # the banner, first thing in the body
    body_start = dom.split("<body>", 1)[1].lstrip()
    assert body_start.startswith('<div id="dry-run" role="alert">DRY RUN: nothing is applied')
    rows = rows_of(dom)
    kv_key = '{cluster="prod-a",host_name="node-7",engine="vllm-0"}'
    gpu_key = '{cluster="prod-a",host_name="node-7",hw_id="GPU-5f3c"}'
    ov_key = '{cluster="prod-b",engine="sglang-1"}'
    assert {k: v[0] for k, v in rows.items()} == {(kv_key, "3"): "tripped", (gpu_key, "1"): "releasing",
                                                   (ov_key, "2"): "tripped"}
    kv_row = rows[(kv_key, "3")][1]
    # tripped since: the absolute time (UTC ISO-8601) and how long
    since = re.search(r'<td class="since">(.*?)</td>', kv_row, re.S)
    assert since and text(since.group(1)) == f"{T0_ISO} for 12 min"
    assert "TRIPPED" in kv_row and "3 kv_cache_eviction" in text(kv_row)
    # the alert holding it, with its runbook, Alertmanager (externalURL) and dashboard links
    assert "KVCacheGrowthRateHigh" in text(kv_row) and kv["fingerprint"] in kv_row
    assert hrefs(kv_row, "runbook") == [f"{RUNBOOKS}/KVCacheGrowthRateHigh.md"]
    assert hrefs(kv_row, "am") == [
        AM + "/#/alerts?silenced=true&inhibited=true&filter=%7Balertname%3D%22KVCacheGrowthRateHigh%22%2C"
        "cluster%3D%22prod-a%22%2Chost_name%3D%22node-7%22%2Cengine%3D%22vllm-0%22%7D"]
    start_ms = int((T0 - 900) * 1000)
    assert hrefs(kv_row, "dashboard") == [
        f"{GRAFANA}/d/{overview_uid()}?var-cluster=prod-a&var-instance=node-7&var-engine=vllm-0"
        f"&from={start_ms}&to=now"]
    # the adapter call, which dry-run did not make
    assert "dry-run: trip not applied (dry-run)" in text(kv_row)
    assert "applied by" not in dom
    # the pending release: when, in how long
    gpu_row = rows[(gpu_key, "1")][1]
    assert "RELEASE PENDING" in gpu_row
    assert "release 2027-01-15T08:21:00Z (in 8 min)" in text(gpu_row)  # T0+60+1200; now T0+750
    assert f"{T0_ISO} for 12 min" in text(gpu_row)
    assert hrefs(gpu_row, "runbook") == []  # its alert resolved: nothing holds it, the hold runs
    # the override: its reason as text, never markup; a scope without alerts links to no runbook
    ov_row = rows[(ov_key, "2")][1]
    assert "&lt;b&gt;manual&lt;/b&gt;" in ov_row and "<b>manual</b>" not in dom
    assert "override trip until 2027-01-15T09:02:00Z (in 49 min)" in text(ov_row)
    assert "2027-01-15T08:02:00Z for 10 min" in text(ov_row)
    assert hrefs(ov_row, "runbook") == []
    # last decisions: dry-run rows read "not applied (dry-run)"
    decisions = dom.split('id="decisions"')[1]
    assert decisions.count("<td>not applied (dry-run)</td>") == 3
    assert "<script" not in dom  # read-only, no build step, no script


def test_live_page_shows_applied_failed_and_pending_calls(tmp_path):
    from test_fuse_delivery import Stub

    # the gateway applies level 3, refuses level 1 (400: permanent) and is overloaded for engine vllm-1
    gw = Stub(lambda path, body, n: 503 if body["scope"].get("engine") == "vllm-1"
              else 400 if body["level"] == 1 else 200)
    clock = Clock(T0)
    try:
        with LiveService(tmp_path / "s.sqlite", adapters=[HttpGateway(gw.url)], hold_s=600, tick_s=0.05,
                         backoff_s=0.05, backoff_max_s=0.05, clock=clock, links=links()) as svc:
            assert svc.post(payload(alert("KVCacheGrowthRateHigh", **KV),
                                    alert("GPUMemoryUtilizationHigh", **GPU),
                                    alert("AlignmentLatencyP95High", cluster="prod-a", engine="vllm-1"))
                            ).status_code == 200
            wait_for(lambda: len([r for r in gw.requests if r[3] == 2]) >= 3, 10, what="three failed attempts")
            wait_for(lambda: svc.state()["pending_actions"] == 1, 10, what="the 200 and the 400 settled")
            clock.t = T0 + 3 * 3600 + 5 * 60
            dom = chromium_page(svc, tmp_path, tmp_path / "status-live.png")
            assert_nothing_overflows(tmp_path / "status-live.png", banner=False)
            assert svc.service.metrics.registry.get_sample_value("fusebox_fuse_dry_run") == 0.0
    finally:
        gw.stop()

    assert 'id="dry-run"' not in dom and "live (decisions applied)" in dom
    rows = rows_of(dom)
    kv_row = rows[('{cluster="prod-a",host_name="node-7",engine="vllm-0"}', "3")][1]
    assert re.search(r"gateway: trip applied 2027-01-15T08:00:00Z", text(kv_row))
    assert "APPLIED by gateway" in text(kv_row)
    assert f"{T0_ISO} for 3 h 5 min" in text(kv_row)
    gpu_row = rows[('{cluster="prod-a",host_name="node-7",hw_id="GPU-5f3c"}', "1")][1]
    assert "gateway: trip FAILED" in text(gpu_row) and "HTTP 400" in text(gpu_row)
    assert "NOT APPLIED" in text(gpu_row) and "gateway: refused: HTTP 400" in text(gpu_row)
    pending_row = rows[('{cluster="prod-a",engine="vllm-1"}', "2")][1]
    m = re.search(r"gateway: trip PENDING, (\d+) attempt\(s\) failed, retrying", text(pending_row))
    assert m and int(m.group(1)) >= 3
    assert "NOT APPLIED (pending: gateway)" in text(pending_row)
    assert gw.url not in dom  # adapters are named by label, never by URL
