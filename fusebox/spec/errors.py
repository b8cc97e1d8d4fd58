"""Spec errors that point at the file, line and column that caused them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Problem:
    """One problem in a spec: where, what is wrong, how to fix it."""

    path: str
    line: int
    col: int
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.what} -- {self.fix}"


@dataclass
class SpecError(Exception):
    """Raised when a spec cannot be turned into output. Holds every problem found.

    The CLI prints each as ``PATH:LINE:COL: what is wrong -- how to fix it`` and exits 2.
    """

    problems: list[Problem] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)
