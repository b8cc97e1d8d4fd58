"""The layers of docs/architecture.md, checked on every import statement of the source tree.

Layer 0 (fusebox.conventions, fusebox.promsim) imports nothing of fusebox; layer 1 (fusebox.spec
and fusebox.signal_kinds) imports layer 0 and layer 1; layer 2 (generator, collectors, fuse, costqos) imports layers 0 and 1 and its
own package, never another layer-2 package; only the demo and the top-level CLI wire them.
Function-level (lazy) imports count too. And the runtime code (collectors, fuse, demo) holds no
signal id and no mission threshold: it reads them from the spec.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fusebox.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
# source folder -> the package it installs as (pyproject.toml's package-dir)
FOLDERS = {"fusebox": "fusebox", "generator": "fusebox.generator", "collectors": "fusebox.collectors", "fuse": "fusebox.fuse"}
FLOOR = ("fusebox.conventions", "fusebox.promsim", "fusebox.tooling")
SPEC = ("fusebox.spec", "fusebox.signal_kinds")
ALLOWED = {
    "fusebox.conventions": (),
    "fusebox.promsim": (),
    "fusebox.tooling": (),
    "fusebox.spec": FLOOR + SPEC,
    "fusebox.signal_kinds": FLOOR + SPEC,
    "fusebox.generator": FLOOR + SPEC + ("fusebox.generator",),
    "fusebox.collectors": FLOOR + SPEC + ("fusebox.collectors",),
    "fusebox.fuse": FLOOR + SPEC + ("fusebox.fuse",),
    "fusebox.costqos": FLOOR + SPEC + ("fusebox.costqos",),
}


def _modules():
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            name = ".".join([package, *parts])
            is_pkg = path.name == "__init__.py"
            yield name, is_pkg, path


def _layer(module: str) -> str | None:
    for key in sorted(ALLOWED, key=len, reverse=True):
        if module == key or module.startswith(key + "."):
            return key
    return None


def _imports(name: str, is_pkg: bool, path: Path) -> list[tuple[int, str]]:
    out = []
    package = name if is_pkg else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from fusebox import conventions` imports fusebox.conventions
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return [(line, t) for line, t in out if t == "fusebox" or t.startswith("fusebox.")]


MODULES = list(_modules())


def test_the_tree_has_the_four_layers():
    layers = {_layer(n) for n, _, _ in MODULES} - {None}
    assert layers == set(ALLOWED)


@pytest.mark.parametrize("name,is_pkg,path", [m for m in MODULES if _layer(m[0])], ids=lambda x: str(x) if isinstance(x, str) else "")
def test_imports_go_down_the_layers_only(name, is_pkg, path):
    own = _layer(name)
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {target}" for line, target in _imports(name, is_pkg, path)
           if not any(target == a or target.startswith(a + ".") for a in ALLOWED[own])]
    assert not bad, "\n".join(bad)


def _runtime_constants():
    """(file, line, value) of every string and number constant in runtime code, docstrings left out."""
    for folder in ("collectors", "fuse", "fusebox/costqos", "fusebox/demo", "fusebox/backtest"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                          if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                          and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            for n in ast.walk(tree):
                if isinstance(n, ast.Constant) and id(n) not in docstrings:
                    yield path.relative_to(ROOT), n.lineno, n.value


def test_runtime_code_names_no_signal_and_holds_no_mission_threshold():
    spec = load_spec(ROOT / "fusebox.yaml")
    names = {s.name for s in spec.signals}
    # The mission's thresholds in base units (seed figures: 72.0 % / 78.3 %, 0.85 s / 1.28 s,
    # 9.2 / 14.7 MB/s), each a tier of the shipped spec.
    thresholds = {0.72, 0.783, 0.85, 1.28, 9.2e6, 14.7e6}
    assert thresholds <= {t.threshold for s in spec.signals for t in s.tiers}
    found = [f"{f}:{line}: {v!r}" for f, line, v in _runtime_constants()
             if (isinstance(v, str) and v in names)
             or (isinstance(v, float) and any(abs(v - t) < 1e-12 * max(1.0, t) for t in thresholds))]
    assert not found, "read these from the spec instead:\n" + "\n".join(found)


def test_every_package_folder_is_in_the_wheel():
    """pyproject.toml lists packages by hand (the folders map onto fusebox.*): a package missing
    there is missing from every non-editable install, the Docker image included."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {name for name, is_pkg, _ in MODULES if is_pkg}
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def _type_checking_lines(path: Path) -> set[int]:
    """Lines inside `if TYPE_CHECKING:` blocks: imports there never run, so they make no cycle."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def import_graph() -> dict[str, dict[str, str]]:
    """module -> {module it imports: "file:line" of the first such import}, over every fusebox
    module, function-level imports included (`from .x import y` counts as importing `.x`)."""
    names = {n for n, _, _ in MODULES}
    graph: dict[str, dict[str, str]] = {}
    for name, is_pkg, path in MODULES:
        skip = _type_checking_lines(path)
        edges = graph.setdefault(name, {})
        for line, target in _imports(name, is_pkg, path):
            parts = target.split(".")
            mod = next((m for k in range(len(parts), 0, -1) if (m := ".".join(parts[:k])) in names), None)
            if mod and mod != name and line not in skip:
                edges.setdefault(mod, f"{path.relative_to(ROOT)}:{line}")
    return graph


def cycle_through(start: str, graph: dict[str, dict[str, str]]) -> list[str] | None:
    """The shortest chain of imports from ``start`` back to ``start`` ("file:line imports module"
    steps), or None."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for mod in frontier:
            for dep in graph.get(mod, {}):
                if dep in came_from:
                    continue
                came_from[dep] = mod
                if dep == start:
                    chain, at = [], start
                    while True:
                        src = came_from[at]
                        chain.append(f"{graph[src][at]} imports {at}")
                        at = src
                        if at == start:
                            return chain[::-1]
                nxt.append(dep)
        frontier = nxt
    return None


def test_cycle_through_finds_a_function_level_cycle_and_names_each_import():
    graph = {"p.a": {"p.b": "a.py:3"}, "p.b": {"p.c": "b.py:9"}, "p.c": {"p.a": "c.py:40", "p.d": "c.py:41"}, "p.d": {}}
    assert cycle_through("p.a", graph) == ["a.py:3 imports p.b", "b.py:9 imports p.c", "c.py:40 imports p.a"]
    assert cycle_through("p.d", graph) is None


def test_no_import_cycle_inside_a_package():
    """No import cycle among fusebox's modules, counting function-level imports (a cycle hidden in
    a function still ties the two modules' designs together) but not `if TYPE_CHECKING:` ones."""
    graph = import_graph()
    cycles = {frozenset(s.rsplit(" ", 1)[1] for s in c): c for m in graph if (c := cycle_through(m, graph))}
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles.values())


def _loads_demo(argv: list[str]) -> tuple[bool, list[str]]:
    """(whether parsing ``fusebox <argv>`` imported fusebox.demo, the fuse command's subcommands),
    in a fresh interpreter (this one may have imported the demo already)."""
    import json
    import subprocess
    import sys

    code = ("import json, sys\nfrom fusebox.cli import build_parser\nargv = json.loads(sys.argv[1])\n"
            "p = build_parser(argv)\nfuse = p._subparsers._group_actions[0].choices['fuse']\n"
            "subs = sorted(fuse._subparsers._group_actions[0].choices)\n"
            "print(json.dumps(['fusebox.demo' in sys.modules, subs]))")
    r = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, timeout=120, check=True)
    loaded, subs = json.loads(r.stdout)
    return loaded, subs


def test_the_reference_gateway_is_the_demos_and_fuse_serve_does_not_import_it():
    """`fusebox fuse gateway` lives in layer 3 (fusebox/demo/gateway.py): the top-level CLI adds it
    under `fuse` for that subcommand and the help, never for `fuse serve` (docs/architecture.md)."""
    assert not (ROOT / "fuse" / "gateway.py").exists()
    serve = ["fuse", "serve", "--spec", "fusebox.yaml", "--token-file", "t"]
    assert _loads_demo(serve) == (False, ["audit", "override", "serve"])
    for argv in (["fuse", "gateway", "--log", "g.jsonl"], ["fuse"]):
        assert _loads_demo(argv) == (True, ["audit", "gateway", "override", "serve"]), argv


@pytest.mark.parametrize("first", ["fusebox.signal_kinds", "fusebox.signal_kinds.base", "fusebox.spec", "fusebox.spec.model"])
def test_the_spec_and_the_signal_kinds_load_whichever_is_imported_first(first):
    """The spec's loader asks the kinds and the kinds read the spec's units (both layer 1): a fresh
    interpreter importing either first gets both, the registry complete."""
    import subprocess
    import sys

    code = f"import {first}\nfrom fusebox.signal_kinds import KINDS\nprint(len(KINDS))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "7"  # gpu_memory, deriv, time_to_full, quantile, gauge, rate, connection_idle
