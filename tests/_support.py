"""Shared test helpers (import as `from _support import ...`). Tests that need an external tool fail under CI (CI=true) when it is
missing, so a green run always means the tool really ran; locally they skip with the reason."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fusebox.tooling import tools_dir

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SPEC = ROOT / "fusebox.yaml"


def need(path_or_name: str, how: str = "run `make tools`") -> str:
    """Return the tool's path, or fail (under CI) / skip (elsewhere) saying how to get it."""
    p = Path(path_or_name)
    found = str(p) if p.is_absolute() and p.exists() else shutil.which(path_or_name)
    if found:
        return found
    missing(f"{path_or_name} is missing: {how}")


def missing(msg: str):
    """Fail (under CI) or skip (elsewhere) with ``msg``, which says what is missing and how to get it."""
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def promtools() -> list[str]:
    """Debian's promtool 2.42 and the pinned Prometheus 3 promtool built by tools/bootstrap.sh."""
    return [need("promtool"), need(str(tools_dir() / "promtool-v0.316.0" / "promtool"), "run `make tools` (builds it with Go)")]


