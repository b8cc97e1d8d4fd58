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


def unreadable(path: object, e: OSError | UnicodeDecodeError, fix: str) -> str:
    """Why an input file named on the command line could not be read, as ``PATH: what -- fix``:
    ``fusebox.yaml: no such file -- pass --spec PATH``. A command prints it after its own name
    (``fusebox backtest: ...``). It has no ``:LINE:COL``: there is no line to point at.

    Args:
        path: the file as the user named it.
        e: the error opening or reading it (FileNotFoundError, IsADirectoryError, PermissionError,
            another OSError, or UnicodeDecodeError for a file that is not UTF-8).
        fix: how to fix it, e.g. which flag names the file.
    """
    if isinstance(e, FileNotFoundError):
        what = "no such file"
    elif isinstance(e, IsADirectoryError):
        what = "a directory, not a file"
    elif isinstance(e, PermissionError):
        what = "permission denied"
    elif isinstance(e, UnicodeDecodeError):
        what = "not UTF-8 text"
    else:
        what = f"cannot read it ({e.strerror or type(e).__name__})"
    return f"{path}: {what} -- {fix}"


def open_error(path: object) -> OSError | None:
    """The error opening ``path`` to read it (FileNotFoundError, IsADirectoryError for a folder,
    PermissionError, ...), or None when it opens: checked before a command starts its work, so
    that :func:`unreadable` can say so first."""
    import os

    try:
        if os.path.isdir(str(path)):
            raise IsADirectoryError(str(path))
        with open(str(path), "rb"):
            return None
    except OSError as e:
        return e
