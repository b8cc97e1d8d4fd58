"""Run the ``fusebox`` command inside the test's own process (import as `from _cli import run_cli`).

`run_cli("budget", "--spec", path)` calls the console script's entry point (pyproject.toml
[project.scripts] `fusebox`, found through the installed package's metadata, as the script
itself finds it) with ``sys.argv`` set as the shell would set it, and returns what a
`subprocess.run([fusebox, ...], capture_output=True, text=True)` would have: the exit status,
standard output and standard error as text. It saves and restores what a command may change in
the process: the working directory, the environment, ``sys.argv``, the standard streams, the
root logger's handlers and level, and the SIGINT/SIGTERM/SIGHUP handlers.

A test that uses it starts no process of its own, so it is `unit` by tests/_unit_rule.py unless
the command does (``fusebox check`` runs promtool: mark such a test ``process``). Keep one
subprocess run per command elsewhere (test_cli_smoke.py), so the console script itself and its
exit status stay covered end to end.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path


@dataclass(frozen=True)
class Result:
    """One run of the command: ``code`` the exit status (0 success; what ``sys.exit`` was given),
    ``stdout`` and ``stderr`` the text it wrote (UTF-8)."""

    code: int
    stdout: str
    stderr: str

    @property
    def returncode(self) -> int:
        """``code``, by the name subprocess.CompletedProcess gives it."""
        return self.code


@cache
def entry_point() -> Callable[[], object]:
    """The ``fusebox`` console script's function (``fusebox.cli:main``), loaded from the installed
    distribution's entry points; KeyError when fusebox is not installed (`make venv`)."""
    (ep,) = entry_points(group="console_scripts", name="fusebox") or (None,)
    if ep is None:
        raise KeyError("no `fusebox` console script: install fusebox (make venv)")
    return ep.load()


class _Stream(io.TextIOWrapper):
    """A text stream over bytes (a command may write to ``sys.stdout.buffer``) with no file
    descriptor, like pytest's own capture; ``text()`` is everything written."""

    def __init__(self, initial: str = "") -> None:
        super().__init__(io.BytesIO(initial.encode()), encoding="utf-8", errors="backslashreplace",
                         newline=None, write_through=True)

    def text(self) -> str:
        self.flush()
        return self.buffer.getvalue().decode("utf-8", "backslashreplace")  # type: ignore[attr-defined]


def _exit_code(code: object, stderr: io.TextIOBase) -> int:
    """What the interpreter makes of ``sys.exit(code)``: None is 0, an int itself, anything else
    is printed to standard error and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=stderr)
    return 1


@contextmanager
def _restored(cwd: str | Path | None, env: Mapping[str, str | None] | None):
    """Put back the process state a command may change, whatever it did."""
    saved_cwd, saved_env, saved_argv = os.getcwd(), dict(os.environ), sys.argv
    streams = (sys.stdin, sys.stdout, sys.stderr)
    root = logging.getLogger()
    handlers, level, disabled = list(root.handlers), root.level, logging.root.manager.disable
    handlers_of = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        for h in handlers:  # pytest's log capture: the command's logging goes to its own stderr
            root.removeHandler(h)
        if cwd is not None:
            os.chdir(cwd)
        for k, v in (env or {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
        sys.stdin, sys.stdout, sys.stderr = streams
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
        logging.disable(disabled)
        for s, h in handlers_of.items():
            if h is not None:
                signal.signal(s, h)


def run_cli(*argv: str | Path, stdin: str | None = None, env: Mapping[str, str | None] | None = None,
            cwd: str | Path | None = None) -> Result:
    """Run ``fusebox ARGV...`` in this process and return its Result.

    ``stdin``: the text on standard input (default: empty). ``env``: variables to set (a value of
    None unsets one) on top of this process's environment, for the run only. ``cwd``: the working
    directory for the run (default: the current one). An exception the command does not handle is
    what the interpreter makes of it: its traceback on stderr and status 1 (KeyboardInterrupt 130 is
    the command's own). Not thread-safe: it swaps process-wide state.
    """
    main = entry_point()
    out, err = _Stream(), _Stream()
    with _restored(cwd, env):
        sys.argv = ["fusebox", *map(str, argv)]
        sys.stdin, sys.stdout, sys.stderr = _Stream(stdin or ""), out, err
        try:
            code = _exit_code(main(), err)  # the console script is `sys.exit(main())`
        except SystemExit as e:
            code = _exit_code(e.code, err)
        except Exception:  # noqa: BLE001  (as the interpreter reports it, on the command's stderr)
            traceback.print_exc(file=err)
            code = 1
        out.flush()
        err.flush()
    return Result(code, out.text(), err.text())
