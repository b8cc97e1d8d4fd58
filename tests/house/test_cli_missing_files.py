"""A file named on the command line that is not there: every command says so the same way,
``fusebox COMMAND: PATH: no such file -- how to fix it`` on standard error, exit status 2, no
traceback, and no ``PATH:1:1`` (there is no line to point at). Run in-process through
``fusebox.cli.main``, as the console script runs it."""

from __future__ import annotations

import pytest
from _support import FIXTURES, ROOT

from fusebox.cli import main

SPEC = str(ROOT / "fusebox.yaml")
RULES = str(ROOT / "rules/fusebox.rules.yml")
CAPTURE = str(next((FIXTURES / "generator").glob("*.txt")))


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.err


# (argv with NOPE where the missing file goes, the command's name, the flag the fix names)
CASES = {
    "backtest --openmetrics": (["backtest", "--openmetrics", "NOPE", "--spec", SPEC], "backtest", "--openmetrics"),
    "backtest --spec": (["backtest", "--openmetrics", CAPTURE, "--spec", "NOPE"], "backtest", "--spec"),
    "backtest --compare": (["backtest", "--openmetrics", CAPTURE, "--spec", SPEC, "--compare", "NOPE"], "backtest", "--compare"),
    "generate --spec": (["generate", "--spec", "NOPE", "--out", "OUT"], "generate", "--spec"),
    "check --spec": (["check", "--spec", "NOPE", "--out", "OUT"], "check", "--spec"),
    "check --rules": (["check", "--rules", "NOPE", "--against", CAPTURE], "check", "--rules"),
    "check --against": (["check", "--rules", RULES, "--against", "NOPE"], "check", "--against"),
    "budget --spec": (["budget", "--spec", "NOPE"], "budget", "--spec"),
    "alertmanager merge --spec": (["alertmanager", "merge", "--base", SPEC, "--spec", "NOPE"], "alertmanager merge", "--spec"),
    "alertmanager merge --base": (["alertmanager", "merge", "--base", "NOPE", "--spec", SPEC], "alertmanager merge", "--base"),
    "alertmanager test --config": (["alertmanager", "test", "--config", "NOPE", "--spec", SPEC], "alertmanager test", "--config"),
    "collect scenario PATH": (["collect", "scenario", "NOPE", "--once-at", "1", "--spec", SPEC], "collect", "scenario file"),
    "collect scenario --spec": (["collect", "scenario", "--once-at", "1", "--spec", "NOPE"], "collect", "--spec"),
    "collect gpu --replay": (["collect", "gpu", "--replay", "NOPE", "--once"], "collect", "--replay"),
    "demo --spec": (["demo", "--once", "--spec", "NOPE"], "demo", "--spec"),
    "demo --scenario": (["demo", "--once", "--spec", SPEC, "--scenario", "NOPE"], "demo", "scenario file"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_missing_input_file_is_one_clear_line(case, tmp_path, capsys, monkeypatch):
    argv, command, flag = CASES[case]
    monkeypatch.chdir(tmp_path)  # no fusebox.yaml here: the defaults do not stand in
    nope = str(tmp_path / "nope" / "missing.yaml")
    rc, err = _run(capsys, [nope if a == "NOPE" else str(tmp_path / "out") if a == "OUT" else a for a in argv])
    assert rc == 2, err
    prefix = f"fusebox {command}: {nope}: no such file -- "
    assert err.startswith(prefix), err
    assert flag in err[len(prefix):].splitlines()[0], err
    assert "Traceback" not in err and ":1:1:" not in err and "[Errno" not in err
    assert not (tmp_path / "out").exists()


def test_fuse_serve_names_a_missing_spec_and_token_file(tmp_path, capsys, monkeypatch):
    import fusebox.fuse.logs

    monkeypatch.setattr(fusebox.fuse.logs, "setup", lambda *a, **k: None)  # leaves the root logger to pytest
    token = tmp_path / "token"
    token.write_text("t" * 40 + "\n")
    token.chmod(0o600)
    nope = str(tmp_path / "nope")
    base = ["fuse", "serve", "--dry-run", "--state", str(tmp_path / "state.db")]
    rc, err = _run(capsys, base + ["--spec", nope, "--token-file", str(token)])
    assert rc == 2 and err.startswith(f"fusebox fuse: {nope}: no such file -- pass --spec "), err
    rc, err = _run(capsys, base + ["--spec", SPEC, "--token-file", nope])
    assert rc == 2 and err.startswith(f"fusebox fuse: {nope}: no such file -- check the path given to --webhook-token-file"), err
    assert not (tmp_path / "state.db").exists()


def test_a_folder_where_a_file_belongs_is_named_too(tmp_path, capsys):
    rc, err = _run(capsys, ["generate", "--spec", str(tmp_path), "--out", str(tmp_path / "out")])
    assert rc == 2 and err.startswith(f"fusebox generate: {tmp_path}: a directory, not a file -- pass --spec"), err


def test_check_on_a_folder_never_generated_says_so_first_and_claims_nothing(capsys, tmp_path):
    """`fusebox check --out` a folder without the generated files: no `ok` line for files it never
    read (it once printed "ok generated files match ...: 0 of 0 checked files"), one line naming the
    five files the checks read and `fusebox generate`, exit 2, before any tool runs."""
    rc = main(["check", "--spec", SPEC, "--out", str(tmp_path)])
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == "", cap.out
    assert cap.err == (f"fusebox check: rules/fusebox.rules.yml, rules/fusebox.rules.test.yml, "
                       f"rules/fusebox.rules.vmalert.test.yml, alertmanager/alertmanager.yml, alertmanager/route-tests.yml "
                       f"not found under {tmp_path}/ -- run `fusebox generate --spec {SPEC} --out {tmp_path}` first\n")
