"""Code-shape limits of the product code, checked by `make lint` (issue 37's "done when").

Every module under fusebox/, generator/, collectors/ and fuse/ (what installs as ``fusebox``) must
have a radon maintainability index of at least ``MIN_MI`` (radon's multi-line-strings-as-comments
MI, 0-100, as ``radon mi -s`` prints it), at most ``MAX_LINES`` lines, and no function or method
of cyclomatic complexity over ``MAX_CC`` (radon's McCabe count, as ``radon cc -s``; every function,
method and function nested in one counts, not radon's class figure, which averages its methods). One
line per breach, ``path:line: what, limit``; exit 1 on any, 0 with a one-line summary otherwise.

Usage: python tools/code_shape.py [ROOT]   (default: the repository holding this file)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radon.complexity import cc_visit
from radon.metrics import mi_visit
from radon.visitors import Class

AREAS = ("fusebox", "generator", "collectors", "fuse")
MIN_MI = 20.0
MAX_LINES = 700
MAX_CC = 40


@dataclass(frozen=True)
class Shape:
    """One module's figures: maintainability index (0-100), lines, and its most complex block."""

    path: str
    mi: float
    lines: int
    worst_cc: int
    worst_name: str
    worst_line: int


def functions(code: str) -> list[tuple[str, int, int]]:
    """``[(qualified name, line, complexity)]`` of every function, method and nested function of
    ``code``, in line order: radon's blocks with the classes opened (their methods, inner classes)
    and each function's closures named ``outer.inner``."""
    seen: dict[tuple[int, int], tuple[str, int, int]] = {}

    def walk(block: Any, prefix: str) -> None:
        if isinstance(block, Class):
            for b in [*block.methods, *block.inner_classes]:
                walk(b, f"{prefix}{block.name}.")
            return
        name = f"{prefix}{block.name}"
        seen.setdefault((block.lineno, block.col_offset), (name, block.lineno, block.complexity))
        for c in block.closures:
            walk(c, f"{name}.")

    for b in cc_visit(code):
        if isinstance(b, Class) or not b.is_method:  # a method is reached from its class, with its name
            walk(b, "")
    return sorted(seen.values(), key=lambda f: f[1])


def shape_of(path: str, code: str) -> Shape:
    """The figures of one module's source ``code`` (radon's MI with multi-line strings as comments)."""
    worst = max(functions(code), key=lambda f: f[2], default=("", 0, 0))
    return Shape(path, mi_visit(code, multi=True), len(code.splitlines()), worst[2], worst[0], worst[1])


def problems(shape: Shape, code: str) -> list[str]:
    """Each limit ``shape`` breaks, as ``path:line: what`` (every function over MAX_CC is named)."""
    out = []
    if shape.mi < MIN_MI:
        out.append(f"{shape.path}:1: maintainability index {shape.mi:.1f}, under {MIN_MI:g} -- split the module")
    if shape.lines > MAX_LINES:
        out.append(f"{shape.path}:1: {shape.lines} lines, over {MAX_LINES} -- split the module")
    if shape.worst_cc > MAX_CC:
        for name, line, cc in functions(code):
            if cc > MAX_CC:
                out.append(f"{shape.path}:{line}: {name} has cyclomatic complexity {cc}, over {MAX_CC} -- split it")
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    shapes, found = [], []
    for area in AREAS:
        for p in sorted((root / area).rglob("*.py")):
            code = p.read_text(encoding="utf-8")
            s = shape_of(str(p.relative_to(root)), code)
            shapes.append(s)
            found += problems(s, code)
    for line in found:
        print(line)
    if not shapes:
        print(f"code shape: no module under {root}/{{{','.join(AREAS)}}}", file=sys.stderr)
        return 1
    low = min(shapes, key=lambda s: s.mi)
    long = max(shapes, key=lambda s: s.lines)
    cx = max(shapes, key=lambda s: s.worst_cc)
    print(f"code shape: {len(shapes)} module{'s' if len(shapes) != 1 else ''}; lowest MI {low.mi:.1f} ({low.path}, limit {MIN_MI:g}); longest "
          f"{long.lines} lines ({long.path}, limit {MAX_LINES}); most complex {cx.worst_cc} ({cx.worst_name}, "
          f"{cx.path}, limit {MAX_CC})" + (f"; {len(found)} over a limit" if found else ""))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
