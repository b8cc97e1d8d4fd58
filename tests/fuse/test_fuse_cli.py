"""``fusebox fuse serve`` as a user starts it: what it says on stderr before it serves."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import httpx
import pytest
from _fuse_support import SPEC, TOKEN, free_port, wait_for

STARTUP = {
    "a dry run says it calls nothing": (
        ["--dry-run"], ["DRY RUN: decisions are logged, nothing is called"]),
    "a live run names the gateway URL it calls": (
        ["--gateway-url", "http://gateway.example:8080"], ["gateway http://gateway.example:8080/v1/control/fuse"]),
}


@pytest.mark.parametrize("extra,words", STARTUP.values(), ids=STARTUP.keys())
def test_serve_says_where_it_listens_what_it_calls_its_state_file_and_hold_time(tmp_path, extra, words):
    port = free_port()
    (tmp_path / "token").write_text(TOKEN + "\n")
    state_dir = tmp_path / "state"
    state = state_dir / "fuse.sqlite"
    p = subprocess.Popen(
        [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen", f"127.0.0.1:{port}",
         "--state-dir", str(state_dir), "--token-file", str(tmp_path / "token"), "--hold", "90", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _up(port), 20, what="fuse serve to answer /healthz")
    finally:
        p.terminate()
        _, err = p.communicate(timeout=20)
    lines = [ln for ln in err.splitlines() if ln.startswith("fusebox fuse serve:")]
    assert len(lines) == 1, err
    for w in [f"listening on http://127.0.0.1:{port}", f"state {state}", "hold 90s", *words]:
        assert w in lines[0], lines[0]
    assert state.is_file() and stat.S_IMODE(state_dir.stat().st_mode) == 0o700


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _serve_args(tmp_path, *extra):
    import argparse

    from fusebox.fuse import cli

    (tmp_path / "token").write_text(TOKEN + "\n")
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["fuse", "serve", "--spec", str(SPEC), "--state", str(tmp_path / "s.sqlite"),
                              "--token-file", str(tmp_path / "token"), "--gateway-url", "http://gw:8080", *extra])


def test_vllm_resets_get_the_attempts_given_and_the_gateway_is_retried_until_applied(tmp_path):
    from fusebox.fuse.cli import build_service

    args = _serve_args(tmp_path, "--vllm-url", "e0=http://v0:8000", "--vllm-url", "http://v1:8000",
                       "--vllm-max-attempts", "2")
    service, _ = build_service(args)
    try:
        got = {name: a.max_attempts for name, a in service.adapters.items()}
    finally:
        service.store.close()
    assert got == {"gateway": None, "vllm:e0:http://v0:8000": 2, "vllm:*:http://v1:8000": 2}


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_vllm_max_attempts_below_1_or_not_a_whole_number_is_refused(tmp_path, value, capsys):
    with pytest.raises(SystemExit) as e:
        _serve_args(tmp_path, "--vllm-max-attempts", value)
    assert e.value.code == 2
    assert "--vllm-max-attempts" in capsys.readouterr().err


@pytest.mark.parametrize("flag,value", [("--header-timeout", "0"), ("--request-timeout", "0"),
                                        ("--request-timeout", "nan"), ("--header-timeout", "inf"),
                                        ("--timeout", "nan"), ("--hold", "inf")])
def test_a_deadline_of_0_or_a_non_finite_number_of_seconds_is_refused(tmp_path, flag, value, capsys):
    # --header-timeout 0 used to start a fuse that closed every connection whose head came in two
    # reads, the liveness probe's among them; nan and inf were taken as numbers
    with pytest.raises(SystemExit) as e:
        _serve_args(tmp_path, flag, value)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


# ------------------------------------------------------------------------- where the state lives
def _state_args(tmp_path, *where):
    import argparse

    from fusebox.fuse import cli

    (tmp_path / "token").write_text(TOKEN + "\n")
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["fuse", "serve", "--spec", str(SPEC), "--token-file", str(tmp_path / "token"),
                              "--dry-run", *where])


def _built_state(args) -> str:
    from fusebox.fuse.cli import build_service

    service, _ = build_service(args)
    service.store.close()
    return service.store.path


def test_state_goes_to_the_xdg_data_directory_by_default_never_the_current_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    path = _built_state(_state_args(tmp_path))
    assert path == str(tmp_path / "data" / "fusebox" / "fuse.sqlite")
    assert stat.S_IMODE((tmp_path / "data" / "fusebox").stat().st_mode) == 0o700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "token"]


def test_without_xdg_data_home_the_state_is_under_local_share(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _built_state(_state_args(tmp_path)) == str(tmp_path / "home/.local/share/fusebox/fuse.sqlite")
    # a relative XDG_DATA_HOME is ignored, as the XDG Base Directory spec says
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")
    assert _built_state(_state_args(tmp_path)) == str(tmp_path / "home/.local/share/fusebox/fuse.sqlite")


def test_state_dir_made_under_a_loose_umask_is_still_0700(tmp_path):
    old = os.umask(0)
    try:
        _built_state(_state_args(tmp_path, "--state-dir", str(tmp_path / "s")))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "s").stat().st_mode) == 0o700


def test_state_names_an_explicit_file(tmp_path):
    assert _built_state(_state_args(tmp_path, "--state", str(tmp_path / "x" / "my.db"))) == str(tmp_path / "x" / "my.db")


def test_state_and_state_dir_together_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _state_args(tmp_path, "--state", "a.db", "--state-dir", "d")
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_state_dir_that_is_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "f").write_text("")
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--token-file",
                        str(tmp_path / "token"), "--dry-run", "--state-dir", str(tmp_path / "f")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"--state-dir {tmp_path / 'f'}: not a directory -- " in r.stderr and "Traceback" not in r.stderr


def test_the_folder_state_file_creates_is_0700_as_state_dir_makes_its_own(tmp_path):
    old = os.umask(0)
    try:
        _built_state(_state_args(tmp_path, "--state", str(tmp_path / "x" / "my.db")))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "x").stat().st_mode) == 0o700
