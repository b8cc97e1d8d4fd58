"""The terminal view: a live ``rich`` screen on a terminal, one line per event elsewhere."""

from __future__ import annotations

import time
from typing import Optional

from .watch import Event, Watcher, short

__all__ = ["DemoView", "fmt_value"]


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


class DemoView:
    def __init__(self, console=None, *, live: Optional[bool] = None, title: str = "fusebox demo"):
        from rich.console import Console

        self.console = console or Console()
        self.live_mode = self.console.is_terminal if live is None else live
        self.title = title
        self.urls: dict[str, str] = {}
        self._live = None
        self._watcher: Optional[Watcher] = None
        self._recent: list[str] = []
        self.t0: Optional[float] = None
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
        for k in ("prometheus", "alertmanager", "grafana", "fuse"):
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

    def _rel(self, at: float) -> str:
        t0 = self._watcher.scenario_t0 if self._watcher and self._watcher.scenario_t0 else self.t0
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

    # -- rendering --------------------------------------------------------------------
    def _render(self):
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        w = self._watcher
        head = Text()
        head.append(f"{self.title}", style="bold")
        if w and w.phase:
            t = (time.time() - w.scenario_t0) * self.speed if w.scenario_t0 else 0.0
            head.append(f"   scenario {self.scenario_name} t={t:5.0f}s/{self.scenario_len:.0f}s (x{self.speed:g})  phase ")
            head.append(w.phase, style="bold cyan")
        for k in ("prometheus", "alertmanager", "grafana"):
            if k in self.urls:
                head.append(f"\n{k:13s}{self.urls[k]}")
        head.append("\nCtrl-C stops everything the demo started.", style="dim")
        if w and w.errors:  # a peer not answering right now: shown, not fatal
            head.append("\n" + "; ".join(f"{k} not answering: {v}" for k, v in sorted(w.errors.items())), style="red")

        sig = Table(title="signals (recording rules, from Prometheus)", expand=True, title_justify="left")
        for col in ("signal", "entity", "value", "warning", "critical", "state"):
            sig.add_column(col)
        alerts = Table(title="alerts (Prometheus ALERTS)", expand=True, title_justify="left")
        for col in ("alert", "severity", "entity", "state", "for"):
            alerts.add_column(col)
        fuses = Table(title="fuses (fuse service /state, gateway calls)", expand=True, title_justify="left")
        for col in ("scope", "level", "gateway calls"):
            fuses.add_column(col)
        if w:
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
            now = time.time()
            for (alert, sev, ent), (state, since) in sorted(w.alerts.items()):
                style = "bold red" if state == "firing" and sev == "critical" else "yellow" if state == "firing" else "dim"
                alerts.add_row(alert, sev, short(ent), Text(state, style=style), f"{now - since:.0f}s")
            if not w.alerts:
                alerts.add_row("-", "", "", Text("none", style="green"), "")
            calls: dict[str, list[str]] = {}
            for rec in w.gateway_calls:
                calls.setdefault(str(rec.get("level")), []).append(f"{rec['state']} {rec['action']}")
            for scope, level in sorted(w.fuses.items()):
                fuses.add_row(scope, Text(str(level), style="bold red"), "")
            if not w.fuses:
                fuses.add_row("all scopes", Text("0 (closed)", style="green"), "")
            for lvl in sorted(calls):
                fuses.add_row("", f"level {lvl}", ", ".join(calls[lvl]))
        ev = Text("\n".join(self._recent) or "waiting for the first events...")
        return Group(Panel(head), sig, alerts, fuses, Panel(ev, title="events"))
