"""The external programs fusebox runs (promtool, amtool, Prometheus, Alertmanager, the
OpenTelemetry Collector, VictoriaMetrics, Thanos, Jaeger): where the pinned builds live, the error when one is missing, and a
free loopback port for the ones it starts.

A leaf module: standard library only. ``fusebox check``, the demo, the benchmarks and the tests
all use these, so a changed cache folder or error text changes everywhere at once.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

__all__ = ["JAEGER_VERSION", "OTELCOL_ENV", "OTELCOL_VERSION", "PORTS_ENV", "THANOS_VERSION", "TOOLS_ENV", "VICTORIAMETRICS_VERSION",
           "ToolMissing", "free_port", "jaeger_tool", "otelcol_tool", "port_slice", "thanos_tool", "tools_dir", "victoriametrics_tool"]

# The VictoriaMetrics release tools/build-victoriametrics.sh builds (single node, vmalert, vmalert-tool).
VICTORIAMETRICS_VERSION = "v1.151.0"
# The Thanos release tools/build-thanos.sh builds (fusebox runs its `tools rules-check`).
THANOS_VERSION = "v0.42.4"
# The Jaeger release tools/build-jaeger.sh builds (its v2 `jaeger` command, the trace backend); the Go
# module's v1.x tag, which Jaeger releases beside the v2.x one.
JAEGER_VERSION = "v1.75.0"
# The folder tools/build-otelcol.sh builds the Collector into: its VERSION, the core version and the
# first 12 hex digits of tools/otelcol/manifest.yaml's sha256 (a manifest change, a new folder).
OTELCOL_VERSION = "v0.165.0-fad73c3a4fa3"
# A Collector binary to use instead of the pinned build.
OTELCOL_ENV = "FUSEBOX_OTELCOL"

# Where tools/bootstrap.sh builds the pinned Go tools (the Makefile exports the same default).
TOOLS_ENV = "FUSEBOX_TOOLS"


def tools_dir() -> Path:
    """``$FUSEBOX_TOOLS``, or ``~/.cache/fusebox/tools`` when it is unset or empty."""
    return Path(os.environ.get(TOOLS_ENV) or Path.home() / ".cache" / "fusebox" / "tools")


class ToolMissing(RuntimeError):
    """A program fusebox needs is absent or too old; ``str()`` says how to install it."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now, for a child process to bind.

    Chosen at random below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, by
    default 32768-60999), where ``bind(port 0)`` and every outgoing connection draw theirs: a port
    from that range can be taken by a client socket between this call and the child's bind
    ("Address already in use"). Never returns the same port twice in one process.

    ``$FUSEBOX_PORTS`` (``LOW-HIGH``, both included) narrows the draw: parallel test workers each
    take their own slice, so two processes cannot pick the same port before either binds it.
    Raises ``ValueError`` for a malformed ``$FUSEBOX_PORTS``.
    """
    first, last = _port_range()
    for _ in range(1000):
        port = random.randint(first, last)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as s:  # everything below the range is taken: fall back to the OS's pick
        s.bind((host, 0))
        return int(s.getsockname()[1])


PORTS_ENV = "FUSEBOX_PORTS"


def _port_range() -> tuple[int, int]:
    """The ports free_port draws from: ``$FUSEBOX_PORTS``, else the 12,000 below the ephemeral range."""
    text = os.environ.get(PORTS_ENV, "").strip()
    if not text:
        low = _EPHEMERAL[0]
        return max(1024, low - 12000), low - 1
    try:
        first, last = (int(part) for part in text.split("-"))
    except ValueError:
        raise ValueError(f"${PORTS_ENV}={text!r}: expected LOW-HIGH, e.g. 20768-26767") from None
    if not 1024 <= first <= last <= 65535:
        raise ValueError(f"${PORTS_ENV}={text!r}: expected 1024 <= LOW <= HIGH <= 65535")
    return first, last


def port_slice(index: int, count: int) -> str:
    """Slice ``index`` of ``count`` equal slices of free_port's default range, as ``LOW-HIGH``
    for ``$FUSEBOX_PORTS`` (one per parallel test worker)."""
    first, last = max(1024, _EPHEMERAL[0] - 12000), _EPHEMERAL[0] - 1
    size = (last - first + 1) // count
    return f"{first + index * size}-{first + (index + 1) * size - 1}"


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_EPHEMERAL = _ephemeral_range()
_GIVEN: set[int] = set()


def _built(project: str, version: str, name: str) -> Path:
    """``tools_dir()/<project>-<version>/<name>``, the binary tools/build-<project>.sh builds;
    ToolMissing (saying to run ``make tools``) when it is not there or not executable."""
    path = tools_dir() / f"{project}-{version}" / name
    if not os.access(path, os.X_OK):
        raise ToolMissing(f"missing {name} {version} ({path}): run `make tools` "
                          f"(tools/build-{project}.sh builds it with Go)")
    return path


def victoriametrics_tool(name: str) -> Path:
    """The pinned VictoriaMetrics binary ``name`` (``victoria-metrics``, ``vmalert`` or
    ``vmalert-tool``) that tools/build-victoriametrics.sh builds into
    ``tools_dir()/victoriametrics-<VICTORIAMETRICS_VERSION>/``.

    Raises:
        ToolMissing: the binary is not there; the message says to run ``make tools``.
    """
    return _built("victoriametrics", VICTORIAMETRICS_VERSION, name)


def thanos_tool() -> Path:
    """The pinned ``thanos`` binary that tools/build-thanos.sh builds into
    ``tools_dir()/thanos-<THANOS_VERSION>/``.

    Raises:
        ToolMissing: the binary is not there; the message says to run ``make tools``.
    """
    return _built("thanos", THANOS_VERSION, "thanos")


def jaeger_tool() -> Path:
    """The pinned Jaeger v2 ``jaeger`` binary that tools/build-jaeger.sh builds into
    ``tools_dir()/jaeger-<JAEGER_VERSION>/``; tools/jaeger/loopback.yaml runs it on chosen ports.

    Raises:
        ToolMissing: the binary is not there; the message says to run ``make tools``.
    """
    return _built("jaeger", JAEGER_VERSION, "jaeger")


def otelcol_tool() -> Path:
    """``$FUSEBOX_OTELCOL``, else the pinned Collector ``otelcol-fusebox`` that
    tools/build-otelcol.sh builds into ``tools_dir()/otelcol-<OTELCOL_VERSION>/``.

    Raises:
        ToolMissing: the binary is not there (or ``$FUSEBOX_OTELCOL`` names no executable file);
            the message says to run ``make tools``.
    """
    chosen = os.environ.get(OTELCOL_ENV)
    if not chosen:
        return _built("otelcol", OTELCOL_VERSION, "otelcol-fusebox")
    if not os.access(chosen, os.X_OK):
        raise ToolMissing(f"missing the OpenTelemetry Collector ${OTELCOL_ENV}={chosen}: not an executable file "
                          "(unset it to use the one `make tools` builds)")
    return Path(chosen)
