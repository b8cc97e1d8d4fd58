"""``fusebox demo``: the real stack on loopback ports, a breach replayed, the fuse tripping.

Public surface: :func:`run` (one run, returns a :class:`RunResult`), :class:`StackOptions`,
:func:`demo_spec_text` and :data:`FAST` (the demo's intervals), :func:`floor_s`,
:func:`verify` / :func:`expectations` (what a ``--once`` run must show), :data:`ENGINES` (the
rule engines a run can use, :mod:`.rule_engines`).
"""

from .check import Expectation, expectations, verify
from .rule_engines import ENGINES
from .run import RunResult, run
from .spec import FAST, Timing, demo_spec_text, floor_s
from .stack import StackOptions, ToolMissing, find_tools

__all__ = ["ENGINES", "FAST", "Expectation", "RunResult", "StackOptions", "Timing", "ToolMissing", "demo_spec_text",
           "expectations", "find_tools", "floor_s", "run", "verify"]
