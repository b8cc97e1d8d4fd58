"""One demo run: prepare, start, play the scenario (once or in a loop), watch, stop, verify."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .check import verify
from .stack import Stack, StackOptions
from .view import DemoView
from .watch import Event, Watcher

__all__ = ["RunResult", "run"]


@dataclass
class RunResult:
    """``problems`` empty and ``error`` None means every expected event happened (``--once``).

    ``events``: the ordered event log; ``scenario_t0``: wall time of scenario t=0;
    ``spec``: the demo spec as loaded; ``workdir``: logs and generated files.
    """

    ok: bool
    problems: list[str]
    events: list[Event]
    scenario_t0: float | None
    spec: object
    scenario: object
    speed: float
    workdir: Path
    urls: dict = field(default_factory=dict)
    error: str | None = None
    wall_s: float = 0.0


def _start(opts: StackOptions, stack: Stack, view: DemoView) -> Watcher:
    """Generate, start the stack, and a watcher on it."""
    view.say(f"demo: generating from {opts.spec} into {stack.workdir}")
    stack.prepare()
    replicas = f" x{opts.replicas}" if opts.replicas > 1 else ""
    view.say("demo: starting gateway" + (", SGLang Model Gateway" if opts.gateway == "sglang" else "")
             + f", fuse service, Alertmanager, OpenTelemetry Collector, {stack.rule_engine.title}{replicas}"
             + (", Jaeger" if stack.traces else ""))
    stack.start()
    return Watcher(stack.urls, stack.spec, stack.gateway_log,
                   fuse_token=stack.token_path.read_text(encoding="utf-8").strip(), worker_names=stack.worker_names,
                   engine=stack.rule_engine)


def _play(stack: Stack, view: DemoView, watcher: Watcher) -> None:
    """Show the view, then start the scenario's player."""
    view.t0 = time.time()
    view.engine = stack.rule_engine.title
    view.start(stack.urls, watcher)
    stack.start_scenario(on_line=watcher.scenario_line)


def _grace_s(spec, opts: StackOptions) -> float:
    """How long after the scenario's end the last alert may still resolve and the fuse release."""
    return max(t.keep_firing_for_s for s in spec.signals for t in s.tiers) + spec.group_interval_s \
        + spec.evaluation_interval_s + opts.hold_s + 15


def _watch(opts: StackOptions, stack: Stack, view: DemoView, watcher: Watcher, sc, *, once: bool, started: float,
           stop_when: Callable[[Watcher], bool] | None, poll_s: float, max_wall_s: float | None,
           on_poll: Callable[[Stack, Watcher], None] | None) -> str | None:
    """Poll until the run is over (see :func:`run`); the error that stopped it, or None."""
    spec = stack.spec
    assert spec is not None  # prepare() loaded it
    grace = _grace_s(spec, opts)
    limit = max_wall_s or ((sc.duration_s / opts.speed + 120 + grace) if once else float("inf"))
    done_at = None
    while True:
        stack.sup.check()
        view.update(watcher.poll())
        now = time.time()
        child = stack.scenario_child
        if child is not None and child.proc.poll() == 0 and done_at is None:
            if once:
                done_at = now
            else:
                view.update(watcher.poll())
                stack.start_scenario(on_line=watcher.scenario_line)
        if on_poll is not None:
            on_poll(stack, watcher)
        if stop_when is not None and stop_when(watcher):
            return None
        if once and done_at is not None and (not verify(watcher.events, spec, sc, sglang=opts.gateway == "sglang", traces=stack.traces)
                                         or now - done_at > grace):
            return None
        if now - started > limit:
            return f"stopped after {limit:.0f}s without the scenario finishing"
        time.sleep(poll_s)


def run(opts: StackOptions, *, once: bool, view: DemoView | None = None,
        stop_when: Callable[[Watcher], bool] | None = None, poll_s: float = 0.5,
        max_wall_s: float | None = None, on_poll: Callable[[Stack, Watcher], None] | None = None) -> RunResult:
    """Run the demo.

    Args:
        once: play the scenario once, then stop and verify; otherwise loop until Ctrl-C.
        stop_when: stop as soon as it returns True (the benchmark stops at the last trip).
        on_poll: called with the running stack and the watcher after each poll (a test stops
            a replica mid-run with ``stack.stop_replica``).
        max_wall_s: stop after this long whatever happened (default: scenario length
            / speed + 120 s for ``once``; no limit otherwise).

    The stack is always stopped before returning (also on KeyboardInterrupt, re-raised).
    """
    from fusebox.collectors.scenario import load_scenario

    from .supervisor import ChildDied

    started = time.time()
    view = view or DemoView()
    sc = load_scenario(opts.scenario)
    view.scenario_name, view.scenario_len, view.speed = sc.name, sc.duration_s, opts.speed
    stack = Stack(opts, say=view.say)
    watcher: Watcher | None = None
    error = None
    try:
        watcher = _start(opts, stack, view)
        _play(stack, view, watcher)
        error = _watch(opts, stack, view, watcher, sc, once=once, started=started, stop_when=stop_when, poll_s=poll_s,
                       max_wall_s=max_wall_s, on_poll=on_poll)
    except ChildDied as e:
        error = f"{e}"
    except (RuntimeError, TimeoutError, ValueError, OSError) as e:
        error = str(e)
    finally:
        view.stop()
        if stack.sup.children:
            view.say("demo: stopping " + ", ".join(f"{c.name} (pid {c.pid})" for c in reversed(stack.sup.children)))
        stack.stop()
    events = watcher.events if watcher else []
    problems = verify(events, stack.spec, sc, sglang=opts.gateway == "sglang", traces=stack.traces) \
        if (once and watcher and not error) else []
    return RunResult(ok=error is None and not problems, problems=problems, events=list(events),
                     scenario_t0=watcher.scenario_t0 if watcher else None, spec=stack.spec, scenario=sc,
                     speed=opts.speed, workdir=stack.workdir, urls=stack.urls, error=error,
                     wall_s=time.time() - started)
