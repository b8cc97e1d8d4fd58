"""Load YAML into plain Python data plus a table of source positions.

PyYAML's composer keeps a mark (line, column) on every node; we walk the node tree once and
record, for each path of keys and indexes, where its value (and, for mapping entries, its
key) starts. Duplicate mapping keys, which PyYAML silently overwrites, are reported.
"""

from __future__ import annotations

from typing import Any

import yaml

from .errors import Problem, SpecError

Path = tuple[Any, ...]


class Positions:
    """Path -> (line, col), both 1-based, with fallback to the nearest known parent."""

    def __init__(self, file: str):
        self.file = file
        self._value: dict[Path, tuple[int, int]] = {}
        self._key: dict[Path, tuple[int, int]] = {}

    def at(self, path: Path, *, key: bool = False) -> tuple[int, int]:
        path = tuple(path)
        while True:
            table = self._key if key else self._value
            if path in table:
                return table[path]
            if path in self._value:
                return self._value[path]
            if not path:
                return (1, 1)
            path = path[:-1]

    def problem(self, path: Path, what: str, fix: str, *, key: bool = False) -> Problem:
        line, col = self.at(path, key=key)
        return Problem(self.file, line, col, what, fix)


def load(text: str, file: str) -> tuple[Any, Positions]:
    """Parse YAML text; return (data, positions). Raises SpecError on syntax errors."""
    pos = Positions(file)
    try:
        node = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise SpecError(
            [Problem(file, line, col, f"YAML syntax error: {e.problem or e}",
                     "fix the indentation or quoting at this place (a value with ':' or '#' needs quotes)")]
        ) from None
    if node is None:
        raise SpecError([Problem(file, 1, 1, "the spec is empty",
                                 "start from the shipped fusebox.yaml")])
    problems: list[Problem] = []
    constructor = yaml.SafeLoader("")

    def walk(n: yaml.Node, path: Path) -> Any:
        pos._value[path] = (n.start_mark.line + 1, n.start_mark.column + 1)
        if isinstance(n, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for k, v in n.value:
                key = constructor.construct_object(k, deep=True)
                if isinstance(key, (dict, list)):
                    key = str(key)
                if key in out:
                    problems.append(Problem(file, k.start_mark.line + 1, k.start_mark.column + 1,
                                            f"duplicate key {key!r}",
                                            "each name may appear once here; merge or rename the entries"))
                pos._key[path + (key,)] = (k.start_mark.line + 1, k.start_mark.column + 1)
                out[key] = walk(v, path + (key,))
            return out
        if isinstance(n, yaml.SequenceNode):
            return [walk(v, path + (i,)) for i, v in enumerate(n.value)]
        return constructor.construct_object(n, deep=True)

    data = walk(node, ())
    if problems:
        raise SpecError(problems)
    return data, pos
