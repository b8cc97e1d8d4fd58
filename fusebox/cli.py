"""The ``fusebox`` command. It only wires arguments to the library; each area registers its
own subcommands (generator: generate/check/alertmanager/budget, init/schema; collectors: collect; fuse: fuse; costqos; demo; backtest)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# module -> it defines register(subparsers), and the commands it registers
_AREAS = {
    "fusebox.generator.cli": ("generate", "check", "alertmanager", "budget"),
    "fusebox.generator.spec_cli": ("init", "schema"),
    "fusebox.collectors.cli": ("collect",),
    "fusebox.fuse.cli": ("fuse",),
    "fusebox.costqos.cli": ("costqos",),
    "fusebox.demo.cli": ("demo",),
    "fusebox.backtest.cli": ("backtest",),
}
# subcommands a higher layer adds under an area's command (the area may not import it, docs/architecture.md):
# area module (its register returns its subcommands' action) -> {module defining register(that action): the
# subcommands it adds}
_UNDER = {
    "fusebox.fuse.cli": {"fusebox.demo.gateway": ("gateway",)},  # `fusebox fuse gateway`: the reference gateway
}


def _areas_for(argv: list[str] | None) -> list[str]:
    """The areas to load: only the command's own when argv names one (``fusebox generate`` does
    not import the fuse service, the collectors' OTel SDK or the demo), all of them otherwise
    (``fusebox --help`` lists every command)."""
    args = sys.argv[1:] if argv is None else argv
    first = next((a for a in args if not a.startswith("-")), None)
    for name, commands in _AREAS.items():
        if first in commands:
            return [name]
    return list(_AREAS)


def _under_for(area: str, argv: list[str] | None, own: set[str]) -> list[str]:
    """The modules of ``_UNDER[area]`` to load: all unless argv names one of the area's ``own``
    subcommands (``fusebox fuse serve`` does not import the demo; ``fusebox fuse --help`` lists
    ``gateway``)."""
    args = sys.argv[1:] if argv is None else argv
    words = [a for a in args if not a.startswith("-")]
    sub = words[1] if len(words) > 1 else None
    return [m for m, subs in _UNDER.get(area, {}).items() if sub is None or sub in subs or sub not in own]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    from fusebox import __version__

    parser = argparse.ArgumentParser(
        prog="fusebox",
        description="One YAML spec to Prometheus rules, tests, dashboards, collector config, "
        "runbooks and a fuse (circuit breaker) for multimodal LLM inference.",
    )
    parser.add_argument("--version", action="version", version=f"fusebox {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _areas_for(argv):
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and (name == e.name or name.startswith(e.name + ".")):  # the area is not built yet
                continue
            raise
        added = mod.register(sub)
        for under in _under_for(name, argv, set(getattr(added, "choices", {}))):
            importlib.import_module(under).register(added)
    return parser


def _stdout_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (poll says POLLERR on the
    write end then)."""
    import select

    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor (a captured stream), no poll
        return False


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `fusebox schema | head`: the reader left, which is no error to report
        if not _stdout_gone():  # another pipe or socket of the command's own: a real error
            raise
        # Python flushes standard output again at exit, which would fail the same way: point it at
        # /dev/null first (the Python docs' signal module, "Note on SIGPIPE").
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + 13  # as a shell reports a writer ended by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
