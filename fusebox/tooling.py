"""The external programs fusebox runs (promtool, amtool, Prometheus, Alertmanager, the
OpenTelemetry Collector): where the pinned builds live, the error when one is missing, and a
free loopback port for the ones it starts.

A leaf module: standard library only. ``fusebox check``, the demo, the benchmarks and the tests
all use these, so a changed cache folder or error text changes everywhere at once.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["TOOLS_ENV", "ToolMissing", "free_port", "tools_dir"]

# Where tools/bootstrap.sh builds the pinned Go tools (the Makefile exports the same default).
TOOLS_ENV = "FUSEBOX_TOOLS"


def tools_dir() -> Path:
    """``$FUSEBOX_TOOLS``, or ``~/.cache/fusebox/tools`` when it is unset or empty."""
    return Path(os.environ.get(TOOLS_ENV) or Path.home() / ".cache" / "fusebox" / "tools")


class ToolMissing(RuntimeError):
    """A program fusebox needs is absent or too old; ``str()`` says how to install it."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (the OS picks it; another process may take it before
    the caller binds, which on loopback in a test run does not happen in practice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
