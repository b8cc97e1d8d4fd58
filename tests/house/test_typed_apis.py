"""The kind APIs and the control call carry no ``Any``: a new signal kind, a new adapter kind and
the call from a decision to the adapters are checked by mypy end to end.

Checked: every module of the signal kinds (fusebox/signal_kinds/), of the adapter kinds
(fusebox/spec/adapter_kinds/ and the runtime adapters, fuse/adapters/), the control call
(fuse/control.py), the dispatcher that hands it to the adapters (fuse/dispatch/), the outbox's
store operations (fuse/store/outbox.py) and the outbox row (``OutboxRow`` in fuse/rows.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("fusebox/signal_kinds", "fusebox/spec/adapter_kinds", "fuse/adapters", "fuse/dispatch")
FILES = ("fuse/control.py", "fuse/store/outbox.py")
CLASSES = {"fuse/rows.py": ("OutboxRow",)}  # a module whose other rows may hold free JSON: these classes only


def _any_uses(tree: ast.AST, rel: str) -> list[str]:
    """``rel:line: text`` of each ``Any`` in ``tree``: a name, ``typing.Any``, an import of it, or a
    string annotation naming it."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "Any" or isinstance(node, ast.Attribute) and node.attr == "Any":
            out.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and any(a.name == "Any" for a in node.names):
            out.append(f"{rel}:{node.lineno}: from {node.module} import Any")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.strip() == "Any":
            out.append(f"{rel}:{node.lineno}: 'Any'")
    return out


def _checked() -> list[tuple[str, list[ast.AST]]]:
    """(path relative to the root, the trees to check) of every checked module."""
    out: list[tuple[str, list[ast.AST]]] = []
    paths = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))] + [ROOT / f for f in FILES]
    for path in paths:
        out.append((str(path.relative_to(ROOT)), [ast.parse(path.read_text(encoding="utf-8"))]))
    for rel, names in CLASSES.items():
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in names]
        assert sorted(n.name for n in found) == sorted(names), f"{rel}: {names} not all found"
        out.append((rel, list(found)))
    return out


def test_the_checked_modules_exist():
    """The lists above name real modules: a folder moved away would make the check below vacuous."""
    rels = [rel for rel, _ in _checked()]
    for folder in FOLDERS:
        assert any(r.startswith(folder + "/") for r in rels), folder
    assert {"fuse/control.py", "fuse/store/outbox.py", "fuse/rows.py", "fusebox/signal_kinds/base.py",
            "fusebox/spec/adapter_kinds/base.py", "fuse/adapters/protocol.py"} <= set(rels)


@pytest.mark.parametrize("rel,trees", _checked(), ids=lambda x: x if isinstance(x, str) else "")
def test_no_any_in_the_kind_apis_and_the_control_call(rel, trees):
    """No ``Any`` in the module (a JSON value is ``object`` or a TypedDict; a store is a Protocol)."""
    found = [u for t in trees for u in _any_uses(t, rel)]
    assert found == [], "Any in a typed API (type it -- see docs/architecture.md):\n" + "\n".join(found)


def test_the_check_finds_any_where_it_is():
    """The detector itself: each form of ``Any`` is found, and a word in a docstring is not."""
    src = ('"""Any row."""\nfrom typing import Any\nimport typing\n'
           'def f(a: Any, b: "Any") -> typing.Any:\n    """Any value."""\n')
    assert sorted(_any_uses(ast.parse(src), "m.py")) == [
        "m.py:2: from typing import Any", "m.py:4: 'Any'", "m.py:4: Any", "m.py:4: typing.Any"]
