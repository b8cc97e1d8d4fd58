"""The read-only status page, rendered by headless Chromium (`--dump-dom`)."""

from __future__ import annotations

import re
import subprocess

import pytest

from _fuse_support import TOKEN, LiveService, alert, need_tool, payload

pytestmark = pytest.mark.tools  # headless Chromium


def test_status_page_lists_scopes_levels_holders_and_decisions(tmp_path):
    chromium = need_tool("chromium", "chromium-browser", "google-chrome")
    with LiveService(tmp_path / "s.sqlite", dry_run=True, hold_s=600) as svc:
        a = alert("KVCacheGrowthRateHigh", cluster="prod-a", host_name="node-7", engine="vllm-0")
        assert svc.post(payload(a)).status_code == 200
        body = {"scope": {"cluster": "prod-a", "hw_id": "GPU-5f3c"}, "level": 1, "mode": "trip",
                "reason": "SRE <b>manual</b> freeze", "expires_in_s": 600}
        assert svc.post(body, path="/override").status_code == 200
        out = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chromium-profile'}", "--dump-dom",
             # the page needs a reader token; a browser sends it as Basic credentials (any user name)
             svc.url.replace("http://", f"http://sre:{TOKEN}@") + "/"],
            capture_output=True, text=True, timeout=90)
    dom = out.stdout
    assert "<table" in dom, out.stderr[-2000:]
    rows = re.findall(r'<tr class="(tripped|ok)" data-scope="([^"]*)" data-level="(\d)">(.*?)</tr>', dom, re.S)
    got = {(html_unescape(scope), level, cls) for cls, scope, level, _ in rows}
    assert got == {('{cluster="prod-a",host_name="node-7",engine="vllm-0"}', "3", "tripped"),
                   ('{cluster="prod-a",hw_id="GPU-5f3c"}', "1", "tripped")}
    kv_row = next(r for r in rows if r[2] == "3")[3]
    assert "KVCacheGrowthRateHigh/" + a["fingerprint"] in kv_row
    # the override's reason is shown as text, never as markup
    assert "&lt;b&gt;manual&lt;/b&gt;" in dom and "<b>manual</b>" not in dom
    decisions = dom.split('id="decisions"')[1]
    assert decisions.count("<td>trip</td>") == 2 and "<td>override</td>" in decisions
    assert "dry-run" in dom
    assert "<script" not in dom  # read-only, no build step, no script


def html_unescape(s: str) -> str:
    import html

    return html.unescape(s)
