"""``fusebox demo``: the whole stack on loopback ports, a breach replayed, the fuse tripping.

Exit codes: 0 OK (``--once``: every expected event happened; otherwise stopped by Ctrl-C),
1 an expected event was missing or a process died, 2 a tool is missing or bad input.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from .rule_engines import ENGINES


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="the whole stack on loopback (Prometheus or VictoriaMetrics, Alertmanager, the Collector, the "
                     "collectors, the fuse, a gateway) replaying a breach scenario, live",
        description="Start the real stack on free loopback ports (Prometheus, or VictoriaMetrics with vmalert; "
                    "Alertmanager, the OpenTelemetry Collector, the scenario collector, the fuse service and a "
                    "reference gateway), replay a breach and show signals, alerts and fuses live. Ctrl-C stops "
                    "everything it started.")
    p.add_argument("--once", action="store_true",
                   help="play the scenario once, stop, and exit 0 only if every expected event happened")
    p.add_argument("--spec", default="fusebox.yaml", help="spec to derive the demo spec from (default fusebox.yaml)")
    p.add_argument("--scenario", default=None, metavar="PATH", help="scenario file (default: the packaged 'breach')")
    p.add_argument("--speed", type=float, default=1.25, metavar="X",
                   help="scenario seconds per wall second (default 1.25: the breach scenario in 4 minutes; "
                        "above that its KV growth, per wall second, passes the critical threshold in the pressure phase)")
    p.add_argument("--hold", type=float, default=10.0, metavar="S", help="fuse release hold time (default 10 s)")
    p.add_argument("--default-intervals", action="store_true",
                   help="keep the spec's own intervals, for and group_wait instead of the demo's fast ones")
    p.add_argument("--workdir", default=".fusebox-demo", help="generated files, logs, state (default .fusebox-demo)")
    p.add_argument("--grafana-url", default=None, metavar="URL", help="your Grafana, shown beside the other URLs")
    p.add_argument("--gateway", choices=["sglang", "reference"], default="sglang",
                   help="sglang (default): the real SGLang Model Gateway in front of stand-in engines as well as the "
                        "reference gateway; reference: the reference gateway alone")
    p.add_argument("--engine", choices=list(ENGINES), default="prometheus",
                   help="what evaluates the generated rules: prometheus (default), or victoriametrics "
                        "(VictoriaMetrics single node scraping the same targets, vmalert evaluating the same rules file)")
    p.add_argument("--replicas", type=int, default=1, metavar="N",
                   help="victoriametrics only: N independent VictoriaMetrics + vmalert pairs notifying the one "
                        "Alertmanager (the HA topology; default 1)")
    p.add_argument("--plain", action="store_true", help="one line per event instead of the live screen")
    p.set_defaults(func=cmd_demo)


def _term(_signum, _frame):
    raise KeyboardInterrupt


def cmd_demo(args) -> int:
    from fusebox.collectors.scenario import ScenarioError, load_scenario
    from fusebox.spec.errors import open_error, unreadable

    from .run import run
    from .spec import FAST
    from .stack import StackOptions, ToolMissing, find_tools
    from .view import DemoView

    bad = open_error(args.spec)
    if bad is not None:
        print("fusebox demo: " + unreadable(args.spec, bad, "pass --spec with a fusebox spec file, or run from the "
                                                            "directory holding fusebox.yaml"), file=sys.stderr)
        return 2
    try:  # before anything starts: a missing or bad scenario file is bad input (exit 2), not a failed run
        load_scenario(args.scenario)
    except ScenarioError as e:
        print(f"fusebox demo: {e}", file=sys.stderr)
        return 2
    if not 0 < args.speed <= 10:
        print(f"fusebox demo: --speed {args.speed:g} is out of range: it must be in (0, 10] (1 is real time)",
              file=sys.stderr)
        return 2
    if args.replicas != 1 and (args.engine != "victoriametrics" or not 1 <= args.replicas <= 3):
        print("fusebox demo: --replicas must be 1..3, and above 1 only with --engine victoriametrics", file=sys.stderr)
        return 2
    try:
        find_tools(args.engine)
    except ToolMissing as e:
        print(f"fusebox demo: {e}", file=sys.stderr)
        return 2
    old = signal.signal(signal.SIGTERM, _term)
    view = DemoView(live=False if (args.plain or args.once and not sys.stdout.isatty()) else None)
    opts = StackOptions(workdir=Path(args.workdir), spec=Path(args.spec), scenario=args.scenario, speed=args.speed,
                        gateway=args.gateway, engine=args.engine, replicas=args.replicas,
                        timing=None if args.default_intervals else FAST, hold_s=args.hold, grafana_url=args.grafana_url)
    try:
        res = run(opts, once=args.once, view=view)
    except KeyboardInterrupt:
        view.say("demo: stopped (every process it started is stopped)")
        return 0 if not args.once else 130
    finally:
        signal.signal(signal.SIGTERM, old)
    if res.error:
        view.say(f"demo: FAILED {res.error}")
        return 1
    if not args.once:
        return 0
    summary(view, res)
    if res.problems:
        view.say("demo: FAILED " + "; ".join(res.problems))
        return 1
    view.say(f"demo: OK (warning before critical on 3 signals, fuse levels 1, 2, 3 tripped once and released "
             f"after recovery, nothing else called; {res.wall_s:.0f}s)")
    return 0


def summary(view, res) -> None:
    """The event log of a finished run, relative to scenario t=0 (wall seconds)."""
    t0 = res.scenario_t0 or (res.events[0].at if res.events else 0)
    view.say(f"demo: events (wall seconds from scenario start, speed x{res.speed:g}):")
    for e in res.events:
        if e.kind in ("phase", "fuse", "trace") or (e.kind == "alert" and e.what in ("firing", "resolved")):
            view.say(f"  {e.at - t0:7.1f}s  {e.kind:6s} {e.text}")
