"""bench/bench_fuse.py --fleet at a small size runs whole and counts what the real processes did:
one gateway call per change on each fuse and none twice, every resolved alert of the big
notification held for release. No timing is asserted (speed lives in bench/)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from _support import ROOT

pytestmark = pytest.mark.process

SCOPES, CHANGES = 120, 100


def test_fleet_mode_counts_one_gateway_call_per_change_and_prints_every_target():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_fuse.py"), "--fleet", "--no-postgresql",
                          "--scopes", str(SCOPES), "--changes", str(CHANGES)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {m[1]: m for m in re.finditer(
        r"^SQLite, 1 replica +(held|empty|echo|call) +(\d+) +([\d.]+)ms +([\d.]+)ms +([\d.]+)ms +\d+% +(\S+) +(\S+)$",
        out.stdout, re.M)}
    assert set(rows) == {"held", "empty", "echo", "call"}, out.stdout
    # each notification trips level 3 of one GPU: one call to the reference gateway, never two; the
    # call target makes the same one call per notification, the bare echo none
    for target in ("held", "empty", "call"):
        assert (rows[target][6], rows[target][7]) == (str(CHANGES), "0"), out.stdout
        assert float(rows[target][5]) > 0  # CPU per notification, read from /proc
    assert (rows["echo"][6], rows["echo"][7]) == ("-", "-")
    assert "fuse / echo rate" in out.stdout and "fuse / call" in out.stdout
    # the big notification resolves the alert of every seeded scope: each waits out its hold
    assert f"{SCOPES} resolved alerts in one notification on the held fuse" in out.stdout
    assert f"({SCOPES} release_pending)" in out.stdout


@pytest.mark.parametrize("arg", ["--changes", "--scopes", "--concurrency"])
def test_fleet_mode_refuses_a_count_under_one_before_starting_anything(arg):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_fuse.py"), "--fleet", arg, "0"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and out.stdout == ""
    assert f"argument {arg}: 0 is too small: give 1 or more" in out.stderr


def test_hostile_mode_prints_the_webhooks_p99_alone_under_readers_and_under_slow_bodies():
    """--hostile at a small size: three phases of 40 notifications, every one answered 200 alone;
    the readers' answers and the flood's sockets counted (no timing is asserted)."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_fuse.py"), "--hostile", "--scopes", "300",
                          "--changes", "40", "--readers", "3", "--slow-sockets", "60"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {m[1]: m for m in re.finditer(r"^(alone|readers|slow bodies) +([\d.]+)ms +([\d.]+|inf)ms +(\S+)ms +(\d+) ",
                                         out.stdout, re.M)}
    assert set(rows) == {"alone", "readers", "slow bodies"}, out.stdout
    assert rows["alone"][5] == "0", out.stdout  # no reader, no flood: every notification answered 200
    assert "40 notifications per phase" in out.stdout and "300 scopes with 256-character labels" in out.stdout
    assert re.search(r"^readers: 3 clients .*: (\d+) answered 200", out.stdout, re.M), out.stdout
    # how many stay open is the fuse's choice (its connection caps): the flood ran and was counted
    assert re.search(r"^slow bodies: 60 sockets, .*; \d+ open at the last drip, \d+ closed", out.stdout, re.M), out.stdout
    assert "target: each phase's p99 within 2x the p99 alone" in out.stdout
