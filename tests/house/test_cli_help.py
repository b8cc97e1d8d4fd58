"""``fusebox --help``: every command's one-line description says what it does. A command with
actions of its own names each of them (``alertmanager`` is merge and test, not merge alone),
``generate`` names every kind of output it writes, and each area's list of commands in
fusebox/cli.py is the list it registers (``fusebox budget`` loads only its own area)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest
from _support import SPEC

from fusebox.cli import _AREAS, build_parser
from fusebox.generator.outputs import render_all
from fusebox.spec import load_spec


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _one_liners() -> dict[str, str]:
    return {a.dest: a.help or "" for a in _subparsers(build_parser([]))._choices_actions}


@pytest.mark.parametrize("module", sorted(_AREAS))
def test_each_area_lists_the_commands_it_registers(module):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(module).register(sub)
    assert tuple(sub.choices) == _AREAS[module]


def test_every_command_has_a_one_line_description():
    helps = _one_liners()
    assert set(helps) == {c for cmds in _AREAS.values() for c in cmds}
    assert all(len(h) > 20 for h in helps.values()), helps


@pytest.mark.parametrize("command", ["alertmanager", "fuse", "collect"])
def test_a_command_with_actions_names_each_of_them(command):
    actions = _subparsers(_subparsers(build_parser([command])).choices[command]).choices
    assert len(actions) >= 2
    help_ = _one_liners()[command]
    missing = [a for a in actions if a not in help_]
    assert not missing, f"`fusebox --help` says of {command}: {help_!r}; it does not name {missing}"


# each top-level folder `fusebox generate` writes -> how its one-line description names it
OUTPUT_WORDS = {"rules": "rules", "runbooks": "runbooks", "dashboards": "dashboards", "alertmanager": "Alertmanager",
                "otel": "Collector", "grafana": "Grafana", "k8s": "k8s/", "inpath": "in-path"}


def test_generate_names_every_kind_of_output_it_writes():
    folders = {path.split("/")[0] for path in render_all(load_spec(SPEC))}
    assert folders == set(OUTPUT_WORDS), "a new output folder: name it in generate's help and here"
    help_ = _one_liners()["generate"]
    assert [w for w in OUTPUT_WORDS.values() if w not in help_] == [], help_


def test_output_into_a_closed_pipe_is_no_traceback():
    """``fusebox schema | head -1``: the reader leaves before the writer is done; the command ends
    as a shell reports a writer ended by SIGPIPE (128 + 13), without a traceback."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "fusebox.cli", "schema"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # before the child writes: its first write fails with EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141 and err == "", err


def test_the_readmes_commands_block_lists_every_command():
    """README's "Commands" block shows a usage line for every command `fusebox --help` lists."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    block = readme.split("## Commands\n", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    shown = {line.split()[1] for line in block.splitlines() if line.startswith("fusebox ")}
    assert shown == set(_one_liners()), sorted(set(_one_liners()) - shown)


def test_check_says_it_checks_the_scaling_order_in_its_help_and_make_help():
    """`fusebox check` fails a scaler after its shedder or fuse (run_scaling_check): its one-liner
    and `make help`'s check line say so beside the budget and the in-path shedders."""
    assert "scaling" in _one_liners()["check"]
    makefile = (Path(__file__).parents[2] / "Makefile").read_text()
    (line,) = [x for x in makefile.splitlines() if x.startswith("check:")]
    assert "scaling" in line.split("## ", 1)[1], line
    phony = {t for x in makefile.splitlines() if x.startswith(".PHONY:") for t in x.split(":", 1)[1].split()}
    targets = {x.split(":", 1)[0] for x in makefile.splitlines() if " ## " in x and x.split(":", 1)[0].replace("-", "").isalnum()}
    assert targets <= phony, sorted(targets - phony)
