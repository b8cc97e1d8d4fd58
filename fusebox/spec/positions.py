"""Load YAML into plain Python data plus a table of source positions.

PyYAML's composer keeps a mark (line, column) on every node; we walk the node tree once and
record, for each path of keys and indexes, where its value (and, for mapping entries, its
key) starts. Duplicate mapping keys, which PyYAML silently overwrites, are reported.

A spec is input from people and from other tools, so loading it has fixed limits, each reported
as a :class:`Problem` rather than a crash: at most :data:`MAX_SPEC_BYTES` (8 MiB), printable
characters only, nesting at most :data:`MAX_DEPTH` levels, and aliases that expand to at most
:data:`MAX_ALIAS_NODES` values in all (a "billion laughs" file of a few hundred bytes would
otherwise expand to billions of values), none of them containing itself.
"""

from __future__ import annotations

import os
import re
from pathlib import Path as FilePath
from typing import Any

import yaml

from .errors import Problem, SpecError

Path = tuple[Any, ...]

# The shipped spec is about 11 KiB; a thousand signals would still fit.
MAX_SPEC_BYTES = 8 << 20  # 8 MiB: a 1,000-signal spec with runbooks is about 1.4 MiB
# The shipped spec nests 7 levels deep; the walk below recurses once per level.
MAX_DEPTH = 64
# Values reached through aliases, counted each time an alias is expanded (nested ones too).
# An anchor on a short list or a few scalars reused across signals stays far below it.
MAX_ALIAS_NODES = 10_000
# What YAML 1.1 (and so PyYAML) accepts in a stream; anything else is refused up front so the
# message can name the character and its place.
_NON_PRINTABLE = re.compile("[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]")


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


def _too_big(file: str, size: int) -> SpecError:
    return SpecError([Problem(file, 1, 1, f"the spec is over the {MAX_SPEC_BYTES >> 20} MiB limit ({size / (1 << 20):.1f} MiB or more)",
                              "a spec is a short hand-written file: check that --spec names the right file")])


def read_text(path: str | FilePath, file: str) -> str:
    """Read a spec file as UTF-8 text, reading no more than :data:`MAX_SPEC_BYTES` + 1 bytes.

    Args:
        path: the file to read.
        file: how to name it in problems.

    Raises:
        SpecError: the file is over MAX_SPEC_BYTES, or is not UTF-8 (with the line and column of the first bad byte).
        OSError: the file cannot be opened or read (FileNotFoundError, IsADirectoryError, ...).
    """
    with open(path, "rb") as f:  # bounded read: --spec /dev/zero must not hang
        data = f.read(MAX_SPEC_BYTES + 1)
        if len(data) > MAX_SPEC_BYTES:
            raise _too_big(file, max(os.fstat(f.fileno()).st_size, len(data)))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        head = data[:e.start].decode("utf-8")
        line, col = head.count("\n") + 1, len(head) - (head.rfind("\n") + 1) + 1
        raise SpecError([Problem(file, line, col, f"the spec is not UTF-8 text (byte 0x{data[e.start]:02x} here)",
                                 "save the file as UTF-8 (a UTF-16 file or a binary file cannot be a spec)")]) from None


def _check_text(text: str, file: str) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise _too_big(file, size)
    m = _NON_PRINTABLE.search(text)
    if m:
        head = text[:m.start()]
        line, col = head.count("\n") + 1, m.start() - (head.rfind("\n") + 1) + 1
        ch = ord(m.group())
        raise SpecError([Problem(file, line, col, f"unacceptable character #x{ch:04x} in the spec",
                                 "remove it: a spec holds printable text only (write special characters in a "
                                 "double-quoted string as an escape such as \"\\t\")")])


_STR_TAG = "tag:yaml.org,2002:str"


def _tab_problem(text: str, file: str, line: int, col: int) -> Problem | None:
    """The problem for a YAML syntax error at a TAB (1-based ``line``, ``col``), else None.

    YAML indents with spaces only (YAML 1.2, 6.1 "Indentation Spaces"), and PyYAML separates
    tokens with spaces only too; its own words ("found character '\\t' that cannot start any
    token", the C parser's without the character) do not say a tab is the cause."""
    lines = text.splitlines()
    row = lines[line - 1] if 0 < line <= len(lines) else ""
    if row[col - 1:col] != "\t":
        return None
    if not row[:col - 1].strip():
        return Problem(file, line, col, "a tab in the indentation: tabs are not allowed in YAML indentation",
                       "indent with spaces (e.g. 2 per level, as the shipped fusebox.yaml does; most editors convert tabs to spaces)")
    return Problem(file, line, col, "a tab between two tokens: YAML (as PyYAML reads it) separates them with spaces only",
                   "replace the tab with a space")


def load(text: str, file: str) -> tuple[Any, Positions]:
    """Parse YAML text; return (data, positions).

    Raises:
        SpecError: on syntax errors, and past the limits in the module docstring (size, characters,
            nesting, alias expansion, a recursive alias).
    """
    _check_text(text, file)
    pos = Positions(file)
    try:
        node = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise SpecError([_tab_problem(text, file, line, col) or Problem(
            file, line, col, f"YAML syntax error: {e.problem or e}",
            "fix the indentation or quoting at this place (a value with ':' or '#' needs quotes)")]) from None
    except yaml.YAMLError as e:  # a ReaderError has no mark; _check_text catches what it reports
        raise SpecError([Problem(file, 1, 1, f"YAML error: {e}", "start from the shipped fusebox.yaml")]) from None
    if node is None:
        raise SpecError([Problem(file, 1, 1, "the spec is empty",
                                 "start from the shipped fusebox.yaml")])
    problems: list[Problem] = []
    constructor = yaml.SafeLoader("")
    # The composer hands an alias back as the very node its anchor made, so a node met a second
    # time is an alias use; one met while still inside it is an alias to itself.
    seen: set[int] = set()
    open_nodes: set[int] = set()
    aliased = 0
    alias_site: Path | None = None  # where the outermost alias now being expanded is used

    def refuse(n: yaml.Node, what: str, fix: str) -> SpecError:
        return SpecError([Problem(file, n.start_mark.line + 1, n.start_mark.column + 1, what, fix)])

    def walk(n: yaml.Node, path: Path) -> Any:
        nonlocal aliased, alias_site
        if id(n) in open_nodes:
            raise refuse(n, "recursive YAML alias: this value contains an alias to itself",
                         "replace the alias inside it with the value it should hold")
        if id(n) in seen:
            aliased += 1
            if aliased > MAX_ALIAS_NODES:
                # name the place of the outermost alias being expanded, not the anchored value
                site = alias_site if alias_site is not None else path
                line, col = pos.at(site[:-1]) if site and isinstance(site[-1], int) else pos.at(site, key=True)
                raise SpecError([Problem(file, line, col,
                                         f"YAML aliases expand to more than {MAX_ALIAS_NODES} values (an alias bomb?)",
                                         "write the values out, or use anchors and aliases only for small values")])
            if alias_site is None:
                alias_site = path
        seen.add(id(n))
        try:
            return _walk(n, path)
        finally:
            if alias_site == path:
                alias_site = None

    def _walk(n: yaml.Node, path: Path) -> Any:
        if len(path) > MAX_DEPTH:
            raise refuse(n, f"the spec nests deeper than {MAX_DEPTH} levels",
                         "start from the shipped fusebox.yaml: its values nest 7 levels at most")
        pos._value[path] = (n.start_mark.line + 1, n.start_mark.column + 1)
        if isinstance(n, yaml.MappingNode):
            open_nodes.add(id(n))
            out: dict[Any, Any] = {}
            for k, v in n.value:
                key = walk(k, path + ("<key>",)) if isinstance(k, yaml.CollectionNode) else scalar(k)
                if isinstance(key, (dict, list)):
                    key = str(key)
                if key in out:
                    problems.append(Problem(file, k.start_mark.line + 1, k.start_mark.column + 1,
                                            f"duplicate key {key!r}",
                                            "each name may appear once here; merge or rename the entries"))
                pos._key[path + (key,)] = (k.start_mark.line + 1, k.start_mark.column + 1)
                out[key] = walk(v, path + (key,))
            open_nodes.discard(id(n))
            return out
        if isinstance(n, yaml.SequenceNode):
            open_nodes.add(id(n))
            out_list = [walk(v, path + (i,)) for i, v in enumerate(n.value)]
            open_nodes.discard(id(n))
            return out_list
        return scalar(n)

    def scalar(n: yaml.Node) -> Any:
        if n.tag == _STR_TAG:  # most of a spec: SafeConstructor would return the value as it is
            return n.value
        try:
            return constructor.construct_object(n)
        except Exception as e:  # a tag such as !!float or !!binary on text it cannot read, or an unknown tag
            what = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise refuse(n, f"cannot read this value ({what})",
                         "remove the '!' tag or quote the value to make it plain text") from None

    data = walk(node, ())
    if problems:
        raise SpecError(problems)
    return data, pos
