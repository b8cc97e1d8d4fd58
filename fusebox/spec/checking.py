"""What every section's normaliser shares: the problem list (``file:line:col: what -- fix``, each
reported once, in the order found), durations read with their errors, PromQL syntax, and the
name patterns the sections check against."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import units
from .errors import Problem
from .positions import Positions

TIER_ORDER = ("warning", "critical")
NAME = re.compile(r"^[a-z][a-z0-9_]*\Z")
ALERT = re.compile(r"^[A-Z][A-Za-z0-9]*\Z")
LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*\Z")
LABEL_FIX = "label names match [a-zA-Z_][a-zA-Z0-9_]*"
# The levels with their own conventions (labels, annotations, dashboard filters); any other
# level is a label of the signal's `by`.
STANDARD_LEVELS = ("gpu", "engine", "host")


class Checker:
    """The problems found so far in one spec, and how to add one.

    ``pos`` places a YAML path (``("signals", "x", "tiers", "warning")``) at its line and column;
    ``base_dir`` is the folder the spec's relative paths are read from."""

    def __init__(self, pos: Positions, base_dir: Path | None = None):
        self.pos, self.base_dir = pos, base_dir
        self.problems: list[Problem] = []

    def err(self, path: tuple, what: str, fix: str, *, key: bool = False) -> None:
        """Report ``what -- fix`` at ``path`` (at its key with ``key=True``); a second identical
        problem is dropped (a default read by every tier is reported once, at the default)."""
        p = self.pos.problem(path, what, fix, key=key)
        if p not in self.problems:
            self.problems.append(p)

    def duration(self, value: Any, path: tuple) -> float:
        """A Prometheus duration in seconds; 0.0 after reporting a malformed or out-of-range one."""
        try:
            return units.parse_duration(value)
        except ValueError as e:
            if "out of range" in str(e):
                self.err(path, f"duration {e}", "use a shorter duration (Prometheus holds at most 292y)")
            else:
                self.err(path, f"malformed duration: {e}", "Prometheus durations are digits with a unit: ms, s, m, h, d, w, y")
            return 0.0

    def promql(self, expr: str, path: tuple) -> None:
        """Report ``expr`` at ``path`` when it is not valid PromQL."""
        try:
            import promql_parser
        except ImportError:  # pragma: no cover - it is a dependency
            return
        try:
            promql_parser.parse(expr)
        except Exception as e:
            self.err(path, f"invalid PromQL: {str(e).splitlines()[0]}", "fix the expression; `promtool check rules` shows the same error on output")

    def labels(self, names: Iterable[str], path: tuple, *, key: bool = False) -> None:
        """Report each of ``names`` that is no Prometheus label name, at ``path``."""
        for k in names:
            if not LABEL.match(k):
                self.err(path, f"invalid label name {k!r}", LABEL_FIX, key=key)
