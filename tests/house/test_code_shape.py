"""tools/code_shape.py, `make lint`'s code-shape limits: it names what breaks a limit, and only that.
McCabe's count for a function is its decision points plus one, so ``n`` plain ``if`` statements
give complexity n + 1 (the figure radon prints). `make lint` runs it over the product code."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("code_shape", ROOT / "tools" / "code_shape.py")
assert _spec and _spec.loader
shape = importlib.util.module_from_spec(_spec)
sys.modules["code_shape"] = shape  # its dataclass looks its module up
_spec.loader.exec_module(shape)


def _function(ifs: int) -> str:
    body = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(ifs))
    return f"def decide(x):\n{body}    return -1\n"


def test_complexity_41_is_named_with_its_line_and_40_passes():
    assert shape.MAX_CC == 40
    code = "import os\n\n\n" + _function(40)
    s = shape.shape_of("pkg/mod.py", code)
    assert (s.worst_cc, s.worst_name, s.worst_line) == (41, "decide", 4)
    assert [p for p in shape.problems(s, code) if "complexity" in p] == [
        "pkg/mod.py:4: decide has cyclomatic complexity 41, over 40 -- split it"]
    ok = _function(39)
    assert shape.shape_of("pkg/mod.py", ok).worst_cc == 40
    assert not [p for p in shape.problems(shape.shape_of("pkg/mod.py", ok), ok) if "complexity" in p]


def test_701_lines_is_over_and_700_is_not():
    at = "x = 1\n" * 700
    over = at + "x = 2\n"
    assert not [p for p in shape.problems(shape.shape_of("m.py", at), at) if "lines" in p]
    assert [p for p in shape.problems(shape.shape_of("m.py", over), over) if "lines" in p] == [
        "m.py:1: 701 lines, over 700 -- split the module"]


def test_a_module_under_mi_20_is_named(tmp_path):
    # one long function of many distinct operands and branches: radon's MI falls under 20
    code = _function(40) + "".join(f"\ndef f{i}(a, b, c):\n    return (a * {i} + b ** {i} - c / {i + 1}) % {i + 7} or "
                                    f"(a and b or c) if a > {i} else b < {i}\n" for i in range(150))
    s = shape.shape_of("big.py", code)
    assert s.mi < 20
    assert f"big.py:1: maintainability index {s.mi:.1f}, under 20 -- split the module" in shape.problems(s, code)



def test_a_nested_function_and_a_method_count_and_a_class_does_not():
    inner = "".join(f"        if y == {i}:\n            return {i}\n" for i in range(44))
    code = f"def outer(y):\n    def inner(y):\n{inner}        return -1\n    return inner(y)\n"
    method = "".join(f"        if x == {i}:\n            return {i}\n" for i in range(44))
    code += f"\n\nclass C:\n    def meth(self, x):\n{method}        return -1\n"
    s = shape.shape_of("m.py", code)
    assert [p for p in shape.problems(s, code) if "complexity" in p] == [
        "m.py:2: outer.inner has cyclomatic complexity 45, over 40 -- split it",
        "m.py:96: C.meth has cyclomatic complexity 45, over 40 -- split it"]
