"""The terminal view: a live ``rich`` screen on a terminal, one line per event elsewhere."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from fusebox import conventions as C
from fusebox.spec.units import format_duration

from .watch import Event, Watcher, short

if TYPE_CHECKING:
    from rich.live import Live

__all__ = ["DemoView", "fmt_value", "parse_scope_key", "short_scope", "fuse_rows", "alert_rows"]

_KEY_PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_scope_key(key: str) -> dict[str, str]:
    """The fuse service's scope key (``{cluster="demo",engine="e0"}``) as a dict."""
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _KEY_PAIR.findall(key)}


def short_scope(scope: dict[str, str]) -> tuple[str, str]:
    """(what, where) of a fuse scope for a terminal: its most specific label, shortened
    (``hw_id GPU-5ca1ab1e…0000``, ``engine llava-decoder-0``), and the rest (host, cluster)."""
    present = [k for k in C.SCOPE_LABELS if scope.get(k)]
    if not present:
        return "everything", ""
    what = present[-1]
    where = ", ".join(short(scope[k]) for k in reversed(present[:-1]))
    return f"{what} {short(scope[what])}", where


def fuse_rows(levels: dict[str, int], calls: list[dict], t0: float | None = None) -> list[tuple[str, str, int, str]]:
    """One row per fuse scope: (what, where, level now, gateway calls on that scope).

    ``levels``: the fuse service's ``/state`` levels (scope key -> level; absent = 0);
    ``calls``: the gateway log's records (``scope`` dict, ``state``, ``level``, ``action``, ``at``);
    a scope seen only in calls (released since) shows level 0. Calls read
    ``trip L3 kv_cache_eviction @108.9s``, seconds from ``t0`` (wall clock) when given.
    """
    scopes: dict[tuple, dict[str, str]] = {}
    for key in levels:
        d = parse_scope_key(key)
        scopes.setdefault(tuple(sorted(d.items())), d)
    per: dict[tuple, list[str]] = {}
    for rec in calls:
        d = {k: str(v) for k, v in (rec.get("scope") or {}).items() if k in C.SCOPE_LABELS and v}
        ident = tuple(sorted(d.items()))
        scopes.setdefault(ident, d)
        at = f" @{float(rec['at']) - t0:.1f}s" if t0 and rec.get("at") is not None else ""
        per.setdefault(ident, []).append(f"{rec.get('state')} L{rec.get('level')} {rec.get('action')}{at}")
    lv = {tuple(sorted(parse_scope_key(k).items())): int(v) for k, v in levels.items()}
    rows = []
    for ident, d in scopes.items():
        what, where = short_scope(d)
        rows.append((what, where, lv.get(ident, 0), ", ".join(per.get(ident, []))))
    return sorted(rows, key=lambda r: (r[1], r[0]))


def alert_rows(alerts: dict, have_data: bool, now: float) -> list[tuple[str, str, str, str, str]]:
    """Rows of the alerts table: (alert, severity, entity, state, for).

    ``FuseboxSignalAbsent`` goes pending at every start until the collectors' first push
    arrives; while no signal has a value yet (``have_data`` False) its pending alerts are one
    row, "waiting for first data", not an alarm.
    """
    rows, waiting = [], 0
    for (alert, sev, ent), (state, since) in sorted(alerts.items()):
        if alert == C.ABSENT_ALERT and state == "pending" and not have_data:
            waiting += 1
            continue
        rows.append((alert, sev, short(ent), state, f"{now - since:.0f}s"))
    if waiting:
        rows.append((C.ABSENT_ALERT, "", "", "waiting for first data", ""))
    return rows


def fmt_value(unit: str, v: float) -> str:
    """A signal value as people read it (ratio -> %, bytes/s -> MB/s SI, seconds -> s)."""
    if v != v:
        return "idle"
    if unit == "ratio":
        return f"{100 * v:.1f}%"
    if unit == "bytes_per_second":
        return f"{v / 1e6:.1f} MB/s"
    if unit == "seconds":
        return f"{v:.2f}s"
    return f"{v:.4g}"


def feed_line(last: dict[str, float], now: float, interval: str) -> str:
    """The heartbeat's feed as the header shows it: ``last notification from Alertmanager
    http://127.0.0.1:9093: 3 s ago (heartbeat every 1m)``, one clause per Alertmanager, or that none
    has notified the fuse yet. ``last``: externalURL -> Unix seconds (the fuse's
    fusebox_fuse_last_notification_timestamp_seconds)."""
    if not last:
        return f"no notification from Alertmanager yet (heartbeat every {interval})"
    parts = [f"last notification from Alertmanager {url or '(no externalURL)'}: {max(0.0, now - t):.0f} s ago"
             for url, t in sorted(last.items())]
    return "; ".join(parts) + f" (heartbeat every {interval})"


class DemoView:
    def __init__(self, console=None, *, live: bool | None = None, title: str = "fusebox demo"):
        from rich.console import Console

        self.console = console or Console()
        self.live_mode = self.console.is_terminal if live is None else live
        self.title = title
        self.urls: dict[str, str] = {}
        self.engine = "Prometheus"  # the rule engine's name, in the tables' titles
        self._live: Live | None = None
        self._watcher: Watcher | None = None
        self._recent: list[str] = []
        self.t0: float | None = None
        self.scenario_name = ""
        self.scenario_len = 0.0
        self.speed = 1.0

    # -- lifecycle --------------------------------------------------------------------
    def say(self, msg: str) -> None:
        """A line that should stay on screen (start-up progress, the verdict)."""
        if self._live is not None:
            self._live.console.print(msg, markup=False, highlight=False, soft_wrap=True)
        else:
            self.console.print(msg, markup=False, highlight=False, soft_wrap=True)

    def start(self, urls: dict[str, str], watcher: Watcher) -> None:
        self.urls, self._watcher = urls, watcher
        for k in self._shown() + ["fuse"]:
            if k in urls:
                self.say(f"demo: {k:12s} {urls[k]}")
        if self.live_mode:
            from rich.live import Live

            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.stop()
            self._live = None

    def _t0(self) -> float | None:
        """Wall time of scenario t=0 (else of the view's start): the origin of event times."""
        return self._watcher.scenario_t0 if self._watcher and self._watcher.scenario_t0 else self.t0

    def _rel(self, at: float) -> str:
        t0 = self._t0()
        return f"{at - t0:7.1f}s" if t0 else "        "

    def update(self, new: list[Event]) -> None:
        for e in new:
            line = f"{self._rel(e.at)}  {e.kind:8s} {e.text}"
            if self._live is None:
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            self._recent.append(line)
        self._recent = self._recent[-10:]
        if self._live is not None:
            self._live.update(self._render())

    def _shown(self) -> list[str]:
        """The URLs a person opens, in order: the rule engine's UIs (Prometheus, or vmui and
        vmalert per replica), Alertmanager, Grafana; not the fuse (its own line) nor the
        loopback plumbing (OTLP, the gateways)."""
        return [k for k in self.urls if k not in ("fuse", "gateway", "otlp", "sglang")]

    # -- rendering --------------------------------------------------------------------
    def _render(self):
        from rich.console import Group
        from rich.panel import Panel
        from rich.text import Text

        ev = Text("\n".join(self._recent) or "waiting for the first events...")
        return Group(Panel(self._head()), self._signals_table(), self._alerts_table(), self._fuses_table(),
                     Panel(ev, title="events (wall seconds since scenario start)"))

    def _head(self):
        """The panel's text: the scenario's time and phase, the URLs, the feed, peers not answering."""
        from rich.text import Text

        w = self._watcher
        head = Text()
        head.append(f"{self.title}", style="bold")
        if w and w.phase:
            wall = time.time() - w.scenario_t0 if w.scenario_t0 else 0.0
            head.append(f"   scenario {self.scenario_name} t={wall * self.speed:4.0f}s/{self.scenario_len:.0f}s "
                        f"scenario time (x{self.speed:g}; {wall:.0f}s wall)  phase ")
            head.append(w.phase, style="bold cyan")
        for k in self._shown():
            head.append(f"\n{k:13s}{self.urls[k]}")
        if "fuse" in self.urls:
            head.append(f"\n{'fuse':13s}{self.urls['fuse']}/  (status page; JSON: {self.urls['fuse']}/state; "
                        "token in the work directory's fuse.token)")
        if w and "fuse" in self.urls:
            interval = format_duration(w.spec.self_monitoring.heartbeat_interval_s)
            head.append(f"\n{'feed':13s}{feed_line(w.last_notification, time.time(), interval)}")
        head.append("\nCtrl-C stops everything the demo started.", style="dim")
        if w and w.errors:  # a peer not answering right now: shown, not fatal
            head.append("\n" + "; ".join(f"{k} not answering: {v}" for k, v in sorted(w.errors.items())), style="red")
        return head

    def _signals_table(self):
        """One row per signal and entity: its value against the warning and critical thresholds."""
        from rich.table import Table
        from rich.text import Text

        sig = Table(title=f"signals (recording rules, from {self.engine})", expand=True, title_justify="left")
        for col in ("signal", "entity", "value", "warning", "critical", "state"):
            sig.add_column(col)
        w = self._watcher
        if not w:
            return sig
        for s in w.signals:
            warn = next((t for t in s.tiers if t.name == "warning"), None)
            crit = next((t for t in s.tiers if t.name == "critical"), None)
            rows = w.values.get(s.name) or [("", float("nan"))]
            for ent, v in rows:
                state, style = "ok", "green"
                if crit and v == v and v >= crit.threshold:
                    state, style = "CRITICAL", "bold red"
                elif warn and v == v and v >= warn.threshold:
                    state, style = "warning", "yellow"
                sig.add_row(s.name, short(ent), Text(fmt_value(s.unit, v), style=style),
                            warn.threshold_text if warn else "-", crit.threshold_text if crit else "-",
                            Text(state, style=style))
        return sig

    def _alerts_table(self):
        """The rule engine's alerts, firing ones coloured by severity."""
        from rich.table import Table
        from rich.text import Text

        alerts = Table(title=f"alerts ({self.engine} /api/v1/alerts)", expand=True, title_justify="left")
        for col in ("alert", "severity", "entity", "state", "for"):
            alerts.add_column(col)
        w = self._watcher
        if not w:
            return alerts
        arows = alert_rows(w.alerts, w.have_data(), time.time())
        for alert, sev, ent, state, since in arows:
            style = ("bold red" if state == "firing" and sev == "critical" else "yellow" if state == "firing"
                     else "dim")
            alerts.add_row(alert, sev, ent, Text(state, style=style), since)
        if not arows:
            alerts.add_row("-", "", "", Text("none", style="green"), "")
        return alerts

    def _fuses_table(self):
        """The fuse's level per scope, with the gateway calls made for it."""
        from rich.table import Table
        from rich.text import Text

        fuses = Table(title="fuses per scope (fuse service /state; gateway calls, wall seconds since scenario start)",
                      expand=True, title_justify="left")
        for col in ("scope", "on", "level now", "gateway calls"):
            fuses.add_column(col)
        w = self._watcher
        if not w:
            return fuses
        names = {a.level: a.name for a in w.spec.actions.values()}
        frows = fuse_rows(w.fuses, w.gateway_calls, self._t0())
        for what, where, level, calls in frows:
            lv = Text(f"{level} {names.get(level, '')}".strip() if level else "0 closed",
                      style="bold red" if level else "green")
            fuses.add_row(what, where, lv, calls)
        if not frows:
            fuses.add_row("all scopes", "", Text("0 closed", style="green"), "")
        return fuses
