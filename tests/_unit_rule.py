"""Which tests are `unit` (start no process), and the guard that holds them to it.

The rule, worked out from the test files alone (no list to keep): a test is `unit` unless it is
marked `tools`, `otelcol` or `process`, or the test function or a fixture it uses (the whole
fixture closure pytest computes) reaches, in the files under tests/, a process or a port: the
modules `subprocess`, `socket`, `socketserver`, `http.server`, `multiprocessing`, `uvicorn`,
`os.fork`/`os.system`/`os.posix_spawn`/..., `asyncio.create_subprocess_*`/`asyncio.start_server`,
or a function or class of any tests/*.py file that does. A new test file is classified
the same way with no mark.

What the reading cannot see (product code that starts a program, e.g. the `fusebox check` run of
promtool) the guard catches: while a `unit` test sets up and runs, starting a process
(`subprocess.Popen`, `os.fork`, `os.posix_spawn`, `os.system`) or binding, listening on or
connecting a network socket fails the test in a run that selects `-m unit` (`make test-unit`),
naming what it did (elsewhere, `make test`, the same words are a warning): mark such a test
`@pytest.mark.process` (a module: `pytestmark = pytest.mark.process`). Not checked: what threads
that were running before the test do (a server another test left), and the teardown (then pytest
also ends the module's and the session's fixtures, which other tests started).
"""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pytest

NOT_UNIT_MARKS = ("tools", "otelcol", "process")
PROCESS_MODULES = ("subprocess", "socket", "socketserver", "http.server", "multiprocessing", "uvicorn")
PROCESS_CALLS = frozenset(
    {f"os.{n}" for n in ("fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnv", "spawnl",
                          "execv", "execvp", "execve", "execl", "execlp")}
    | {"asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell", "asyncio.start_server"}
)

Key = tuple[str, str]  # (module name, qualified name), e.g. ("_fuse_support", "LiveService")


def _starts_process(dotted: str) -> bool:
    return dotted in PROCESS_CALLS or any(dotted == m or dotted.startswith(m + ".") for m in PROCESS_MODULES)


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


class _Module:
    """One tests/*.py file: what its names are bound to, and what each top-level def refers to."""

    def __init__(self, name: str, tree: ast.Module) -> None:
        self.name = name
        self.bound: dict[str, str] = {}  # local name -> dotted origin ("subprocess", "_support.need")
        self.defs: dict[str, list[str]] = {}  # qualname -> dotted names it refers to (and its parameters)
        for node in ast.walk(tree):  # imports anywhere in the file, also inside functions
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.bound[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defs[node.name] = self._refs(node)
            elif isinstance(node, ast.ClassDef):
                self.defs[node.name] = self._refs(node)  # a class: any of its methods counts
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.defs[f"{node.name}.{sub.name}"] = self._refs(sub)

    @staticmethod
    def _refs(node: ast.AST) -> list[str]:
        out = []
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Attribute, ast.Name)):
                d = _dotted(sub)
                if d:
                    out.append(d)
        return out

    def resolve(self, dotted: str) -> str:
        """The dotted name with its first part replaced by what it is bound to in this file."""
        head, _, rest = dotted.partition(".")
        if head in self.bound:
            return self.bound[head] + ("." + rest if rest else "")
        if head in self.defs:
            return f"{self.name}.{dotted}"
        return dotted


TESTS = Path(__file__).resolve().parent  # the shared helpers (_support.py, conftest.py, ...) live here


def modules(folder: Path) -> dict[str, _Module]:
    """The *.py files of one test folder and of tests/ itself (the shared helpers), read (not imported)."""
    paths = sorted({*TESTS.glob("*.py"), *folder.resolve().glob("*.py")})
    return {p.stem: _read(p) for p in paths}


@cache
def _read(path: Path) -> _Module:
    """One file, parsed once per session (the shared helpers are read for every folder)."""
    return _Module(path.stem, ast.parse(path.read_text(), filename=str(path)))


@cache
def process_defs(folder: Path) -> frozenset[Key]:
    """Every (module, qualname) in ``folder`` and the shared helpers that reaches a process or a port, to a fixed point."""
    return reaching(modules(folder))


def reaching(mods: dict[str, _Module]) -> frozenset[Key]:
    """The defs of ``mods`` that reach a process or a port, directly or through one another."""
    found: set[Key] = set()
    users: dict[Key, set[Key]] = {}  # a def -> the defs that refer to it
    for mod in mods.values():
        for qual, refs in mod.defs.items():
            key = (mod.name, qual)
            for origin in {mod.resolve(ref) for ref in set(refs)}:
                if _starts_process(origin):
                    found.add(key)
                parts = origin.split(".")
                if parts[0] in mods:  # a def of a tests/ file: `_fuse_support.LiveService.start` names two
                    for n in range(2, len(parts) + 1):
                        users.setdefault((parts[0], ".".join(parts[1:n])), set()).add(key)
    todo = list(found)
    while todo:
        for user in users.get(todo.pop(), ()):
            if user not in found:
                found.add(user)
                todo.append(user)
    return frozenset(found)


def is_unit(item) -> bool:
    """The rule in the module docstring, for one collected pytest item (read in the folder of its file and tests/)."""
    if any(item.get_closest_marker(m) for m in NOT_UNIT_MARKS):
        return False
    found = process_defs(Path(item.path).parent)
    info = getattr(item, "_fixtureinfo", None)
    funcs = [getattr(item, "function", None)]
    funcs += [d.func for name in item.fixturenames for d in (info.name2fixturedefs.get(name, ()) if info else ())]
    return not any((getattr(f, "__module__", ""), getattr(f, "__qualname__", "")) in found for f in funcs)


@contextmanager
def guard(seen: list[str], refuse: bool = True) -> Iterator[None]:
    """Record in ``seen`` every process start or network socket use while inside, made by this
    thread or a thread started inside, and refuse it (RuntimeError) when ``refuse``; threads already
    running (a server another test left behind) pass, as they are none of the test's doing."""
    patches = []
    earlier = set(threading.enumerate()) - {threading.current_thread()}

    def patch(owner, attr: str, what: str, only=None):
        original = getattr(owner, attr)
        shown_arg = 0 if owner is os else 1  # show the argv or address, not `self`

        def replacement(*args, **kwargs):
            if threading.current_thread() in earlier or (only is not None and not only(args[0])):
                return original(*args, **kwargs)
            seen.append(f"{what}({repr(args[shown_arg])[:160] if len(args) > shown_arg else ''})")
            if not refuse:
                return original(*args, **kwargs)
            raise RuntimeError(f"a unit test may not call {what}: mark the test @pytest.mark.process")

        setattr(owner, attr, replacement)
        patches.append((owner, attr, original))

    network = (socket.AF_INET, socket.AF_INET6)
    patch(subprocess.Popen, "_execute_child", "subprocess.Popen")
    for name in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            patch(os, name, f"os.{name}")
    patch(socket.socket, "bind", "socket.bind")
    patch(socket.socket, "listen", "socket.listen")
    for name in ("connect", "connect_ex"):
        patch(socket.socket, name, f"socket.{name}", only=lambda s: s.family in network)
    try:
        yield
    finally:
        for owner, attr, original in reversed(patches):
            setattr(owner, attr, original)


def pytest_configure(config):
    config.addinivalue_line("markers", "unit: starts no process and binds no port (given by tests/_unit_rule.py; `make test-unit`)")
    config.addinivalue_line("markers", "process: starts a process or uses a port where tests/_unit_rule.py cannot see it")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if is_unit(item):
            item.add_marker(pytest.mark.unit)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _guarded(item))


def _guarded(item):
    """Run one phase of ``item``. A `unit` item that starts a process or uses a port fails, saying
    what it did, in a run that selects `-m unit`; in other runs (`make test`) it goes ahead and the
    same words are a warning, so that a test misread by the rule (say, a new one that starts a
    program through product code) stops the inner loop, not the whole suite."""
    if not item.get_closest_marker("unit"):
        return (yield)
    strict = re.search(r"\bunit\b", item.config.option.markexpr or "") is not None
    seen: list[str] = []
    with guard(seen, refuse=strict):
        try:
            result = yield
        except BaseException:
            if not (seen and strict):
                raise
    if seen:  # told here, not above, so that code which swallowed the refusal is caught too
        msg = (f"{item.nodeid} is `unit` by tests/_unit_rule.py but called {'; '.join(seen)}: "
               "mark it @pytest.mark.process (or its module: pytestmark = pytest.mark.process)")
        if strict:
            raise pytest.fail.Exception(msg, pytrace=False) from None
        item.warn(pytest.PytestWarning(msg))
    return result
