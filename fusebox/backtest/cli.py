"""``fusebox backtest``: when each alert would have gone pending, fired and resolved over a
recorded window, and when the fuse would have tripped and released.

Exit codes: 0 the backtest ran; 2 bad input (the recording, the window, the spec) or a tool missing;
1 an engine failed.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["register", "moves"]

EVENTS = ("pending_at", "firing_at", "resolved_at")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "backtest", help="run the generated rules over a recorded window: when alerts fire and the fuse trips",
        description="Replay the spec's generated rules over a recording with VictoriaMetrics and vmalert -replay, "
                    "then feed what fired to the fuse's own breaker as Alertmanager would send it (nothing is "
                    "called). Reports when each alert went pending, fired and resolved, and each fuse trip and "
                    "release (docs/backtest.md).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--openmetrics", metavar="FILE",
                     help="recording: OpenMetrics (promtool tsdb dump-openmetrics) or concatenated "
                          "/federate answers")
    src.add_argument("--url", metavar="URL", help="a Prometheus or VictoriaMetrics to read the window from "
                                                  "(with --start and --end)")
    p.add_argument("--start", metavar="T", help="with --url: window start, Unix seconds or RFC 3339")
    p.add_argument("--end", metavar="T", help="with --url: window end, Unix seconds or RFC 3339")
    p.add_argument("--spec", default=None,
                   help="spec file (default: fusebox.yaml in the current folder, as the other commands read it; "
                        "the shipped one where there is none)")
    p.add_argument("--compare", metavar="OTHER_SPEC", help="also backtest OTHER_SPEC and show how each event moves")
    p.add_argument("--hold", type=float, default=None, metavar="S",
                   help="the fuse's release hold time, seconds (default: fusebox fuse serve's, 300)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.set_defaults(func=cmd_backtest)


def _time(text: str | None, flag: str) -> float:
    if not text:
        raise ValueError(f"{flag} is required with --url (Unix seconds or RFC 3339, e.g. 2026-01-02T15:04:05Z)")
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{flag} {text!r} is neither Unix seconds nor RFC 3339 (2026-01-02T15:04:05Z)") from None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def _err(msg: str) -> None:
    print(f"fusebox backtest: {msg}", file=sys.stderr)


def _unreadable_spec(args, specs: list[str]) -> str | None:
    """Why a spec to backtest cannot be read (``PATH: no such file -- pass --spec ...``), or None:
    checked before the recording is read and the engines started."""
    from fusebox.spec.errors import open_error, unreadable

    for path in specs:
        e = open_error(path)
        if e is not None:
            flag = "--compare" if args.compare and path == args.compare and path != args.spec else "--spec"
            return unreadable(path, e, f"pass {flag} with a fusebox spec file"
                              + (" (default: fusebox.yaml in the current folder)" if flag == "--spec" else ""))
    return None


def cmd_backtest(args) -> int:
    from fusebox.fuse.intake.breaker import DEFAULT_HOLD_S
    from fusebox.spec import SpecError
    from fusebox.tooling import ToolMissing

    from . import RecordingError, ReplayError, backtest, rule_groups
    from .recording import metric_names_in, read_openmetrics, read_url

    hold = DEFAULT_HOLD_S if args.hold is None else args.hold
    if hold < 0:
        _err("--hold must be >= 0")
        return 2
    specs = []
    with resources.as_file(resources.files("fusebox").joinpath("data", "fusebox.yaml")) as shipped:
        default = "fusebox.yaml" if Path("fusebox.yaml").is_file() else str(shipped)
        for path in [args.spec or default] + ([args.compare] if args.compare else []):
            specs.append(path)
        bad = _unreadable_spec(args, specs)
        if bad:
            _err(bad)
            return 2
        try:
            start = end = None
            if args.openmetrics:
                if args.start or args.end:
                    raise ValueError("--start/--end go with --url; a recording file's window is its samples' span")
                rec = read_openmetrics(args.openmetrics)
            else:
                start, end = _time(args.start, "--start"), _time(args.end, "--end")
                from fusebox.spec import load_spec

                wanted: set[str] = set()
                for path in specs:
                    wanted |= metric_names_in(rule_groups(load_spec(path)))
                rec = read_url(args.url, start, end, wanted)
            results = [backtest(path, rec, hold_s=hold, start=start, end=end,
                                display="fusebox.yaml (shipped)" if path == str(shipped) else path) for path in specs]
        except (SpecError, RecordingError, ValueError) as e:
            _err(str(e))
            return 2
        except ToolMissing as e:
            _err(str(e))
            return 2
        except ReplayError as e:
            _err(str(e))
            return 1
    doc: dict[str, Any] = results[0].to_dict()
    doc["hold_s"] = hold
    if len(results) > 1:
        doc["compare"] = results[1].to_dict()
        doc["moves"] = moves(results[0], results[1])
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=False))
    else:
        _print(doc)
    return 0


def _alert_key(a: dict) -> tuple:
    labels = {k: v for k, v in a["labels"].items() if k not in ("fuse_action", "fuse_level")}
    return (a["alertname"], a["severity"], tuple(sorted(labels.items())))


def moves(before, after) -> dict[str, list[dict]]:
    """How each event moved from ``before`` to ``after`` (two :class:`~fusebox.backtest.Result`).

    Alerts are matched by alertname, severity and labels (``fuse_action``/``fuse_level`` aside),
    the n-th episode with the n-th; fuse events by scope, level and trip/release, the n-th with the
    n-th. Returns ``{"alerts": [{alertname, severity, labels, event, before, after, delta_s}],
    "fuse": [{scope, level, action, before, after, delta_s}]}``; ``delta_s`` is None when the event
    happens in one run only (``before`` or ``after`` None)."""
    def pair(xs: list[dict], ys: list[dict], key) -> list[tuple[dict | None, dict | None]]:
        seen: dict[tuple, list[dict]] = {}
        order: list[tuple] = []
        for x in xs + ys:
            k = key(x)
            if k not in seen:
                order.append(k)
                seen[k] = []
        out = []
        for k in order:
            a = [x for x in xs if key(x) == k]
            b = [y for y in ys if key(y) == k]
            for i in range(max(len(a), len(b))):
                out.append((a[i] if i < len(a) else None, b[i] if i < len(b) else None))
        return out

    res: dict[str, list[dict]] = {"alerts": [], "fuse": []}
    for a, b in pair([x.to_dict() for x in before.alerts], [x.to_dict() for x in after.alerts], _alert_key):
        ref = a or b
        assert ref is not None
        for ev in EVENTS:
            x, y = (a or {}).get(ev), (b or {}).get(ev)
            if x is None and y is None:
                continue
            res["alerts"].append({"alertname": ref["alertname"], "severity": ref["severity"], "labels": ref["labels"],
                                  "event": ev, "before": x, "after": y,
                                  "delta_s": None if x is None or y is None else y - x})
    for a, b in pair([x.to_dict() for x in before.fuse], [x.to_dict() for x in after.fuse],
                     lambda f: (f["scope_key"], f["level"], f["action"])):
        ref = a or b
        assert ref is not None
        x, y = (a or {}).get("at"), (b or {}).get("at")
        res["fuse"].append({"scope": ref["scope"], "level": ref["level"], "action": ref["action"],
                            "fuse_action": ref["fuse_action"], "before": x, "after": y,
                            "delta_s": None if x is None or y is None else y - x})
    return res


def _at(t: float | None, start: float) -> str:
    if t is None:
        return "-"
    stamp = datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")
    return f"{stamp} (+{t - start:g}s)"


def _scope(labels: dict) -> str:
    from fusebox.conventions import SCOPE_LABELS

    scope = [f"{k}={labels[k]}" for k in SCOPE_LABELS if labels.get(k)]
    if labels.get("metric"):  # an absent alert: the metric is what tells one from another
        scope.append(f"metric={labels['metric']}")
    return ",".join(scope) or "-"


def _print(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=None if sys.stdout.isatty() else 200)  # a pipe or a file: whole names on one line
    start = doc["start"]
    window = (f"{datetime.fromtimestamp(start, UTC).isoformat()} to "
              f"{datetime.fromtimestamp(doc['end'], UTC).isoformat()} ({doc['end'] - start:g} s)")
    con.print(f"backtest of {doc['spec']} over {window}; fuse hold {doc['hold_s']:g} s")
    t = Table(title="alerts")
    for col in ("alert", "severity", "scope", "pending", "firing", "resolved"):
        t.add_column(col, overflow="fold")
    for a in doc["alerts"]:
        t.add_row(a["alertname"], a["severity"], _scope(a["labels"]), *(_at(a[e], start) for e in EVENTS))
    con.print(t)
    f = Table(title="fuse")
    for col in ("at", "action", "level", "fuse action", "scope", "alerts"):
        f.add_column(col, overflow="fold")
    for e in doc["fuse"]:
        f.add_row(_at(e["at"], start), e["action"], str(e["level"]), e["fuse_action"], e["scope_key"], ",".join(e["alerts"]))
    con.print(f if doc["fuse"] else "fuse: nothing tripped")
    if "moves" in doc:
        m = Table(title=f"{doc['spec']} -> {doc['compare']['spec']}")
        for col in ("what", "scope", "event", "before", "after", "moved"):
            m.add_column(col, overflow="fold")
        same = 0  # the table lists what moved; --json holds every event
        for a in doc["moves"]["alerts"]:
            if _delta(a) == "=":
                same += 1
                continue
            m.add_row(f"{a['alertname']} {a['severity']}", _scope(a["labels"]), a["event"].replace("_at", ""),
                      _at(a["before"], start), _at(a["after"], start), _delta(a))
        for e in doc["moves"]["fuse"]:
            if _delta(e) == "=":
                same += 1
                continue
            m.add_row(f"fuse level {e['level']} {e['fuse_action']}", _scope(e["scope"]), e["action"],
                      _at(e["before"], start), _at(e["after"], start), _delta(e))
        con.print(m if m.row_count else "no event moved")
        con.print(f"{same} event(s) unchanged")


def _delta(move: dict) -> str:
    if move["after"] is None:
        return "no longer"
    if move["before"] is None:
        return "new"
    d = move["delta_s"]
    return "=" if d == 0 else f"{d:+g}s"
