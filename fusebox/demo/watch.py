"""What the demo sees, polled from the stack's own APIs, as a state snapshot and an event log.

Sources: the rule engine's HTTP API (each signal's recording rule from the Prometheus-compatible
``/api/v1/query``; the active alerts from ``/api/v1/alerts``, which Prometheus and vmalert both
serve, every live replica's together (what Alertmanager merges): the evaluator's own state, not the ``ALERTS`` series that VictoriaMetrics only sees
after vmalert's remote write and its own ingestion delay), Alertmanager's
``/api/v2/alerts`` (what it holds, inhibited or not), the fuse service's ``GET /state`` and its
``/metrics`` (when each Alertmanager last notified it: the heartbeat's feed), the
reference gateway's JSON-lines log (each control call, with its own timestamp) and the
scenario player's output (phase changes, stamped as they arrive).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from fusebox import conventions as C
from fusebox.signal_kinds import records

from .stack import http_json, http_text
from .traces import SlowTrace, slowest_exemplar_trace

__all__ = ["Event", "Watcher", "primary_signals"]



def primary_signals(spec) -> list:
    """The signals the demo shows and checks: every signal not marked ``secondary`` whose tiers
    request a fuse, in spec order (the mission's three in the shipped fusebox.yaml)."""
    return [s for s in spec.signals if not s.secondary and any(t.fuse for t in s.tiers)]
_PHASE = re.compile(r"scenario t=(?P<t>[\d.]+)s (?:phase=(?P<phase>\S+)|done)")


@dataclass(frozen=True)
class Event:
    """One observed event. ``at``: wall-clock seconds (time.time()).

    kind/what: ``phase``/<phase name>, ``scenario``/``done``; ``alert``/``pending``|``firing``|
    ``resolved`` (alertname, severity, entity in ``detail``); ``fuse``/``trip``|``release``
    (gateway log: action, level, scope); ``state``/<level> (fuse /state per scope).
    """

    at: float
    kind: str
    what: str
    detail: dict = field(default_factory=dict)
    text: str = ""


def _entity(labels: dict) -> str:
    return labels.get(C.LABEL["gpu_id"]) or labels.get(C.LABEL["engine"]) or ""


def short(entity: str) -> str:
    """GPU UUIDs shortened for a terminal (``GPU-5ca1ab1e…0000``)."""
    return entity if len(entity) <= 24 else f"{entity[:12]}…{entity[-4:]}"


class Watcher:
    """Poll with :meth:`poll` (returns the new events); read :attr:`values`, :attr:`alerts`,
    :attr:`fuses`, :attr:`phase`, :attr:`events`."""

    def __init__(self, urls: dict[str, str], spec, gateway_log: Path, fuse_token: str | None = None,
                 worker_names: dict[str, str] | None = None, engine=None):
        self.urls = urls
        # the rule engine (.rule_engines.Engine): its query_urls in failover order, its alerts_urls
        # all merged, read at every poll (a replica stopped mid-run drops out); None: Prometheus
        # at urls["prometheus"]
        self.engine = engine
        self.worker_names = dict(worker_names or {})  # SGLang worker URL -> what it stands for
        self.workers: list[str] | None = None  # the SGLang Model Gateway's own worker list (GET /workers)
        self.fuse_token = fuse_token  # the fuse service's /state needs a reader token
        self.spec = spec
        self.gateway_log = Path(gateway_log)
        self.signals = primary_signals(spec)
        self.events: list[Event] = []
        self._pending: list[Event] = []
        self._lock = threading.Lock()
        self.values: dict[str, list[tuple[str, float]]] = {}  # signal -> [(entity, value)]
        self.alerts: dict[tuple[str, str, str], tuple[str, float]] = {}  # (alert, severity, entity) -> (state, since)
        self.am_alerts: dict[str, int] = {}  # "active"/"suppressed" -> count
        self.fuses: dict[str, int] = {}  # scope key -> level (fuse /state)
        # Alertmanager externalURL -> Unix time of its last notification to the fuse (fuse /metrics)
        self.last_notification: dict[str, float] = {}
        self.gateway_calls: list[dict] = []
        self.phase: str | None = None
        self.phase_t: float = 0.0
        self.scenario_t0: float | None = None  # wall time of scenario t=0 (latest run)
        self.errors: dict[str, str] = {}
        self._gw_offset = 0
        # the breach's slowest hand-off's trace (.traces.SlowTrace), looked for from the recovery on
        # where the stack runs Jaeger (urls["jaeger"])
        self.slow_trace: SlowTrace | None = None
        self._trace_tried = 0.0

    # -- scenario output (called from the supervisor's reader thread) --------------------
    def scenario_line(self, at: float, line: str) -> None:
        m = _PHASE.search(line)
        if not m:
            return
        t = float(m.group("t"))
        with self._lock:
            if m.group("phase"):
                if t == 0:
                    self.scenario_t0 = at
                self.phase, self.phase_t = m.group("phase"), at
                self._pending.append(Event(at, "phase", m.group("phase"), {"t": t}, line.split(" ", 2)[-1]))
            else:
                self._pending.append(Event(at, "scenario", "done", {"t": t}, f"scenario done at t={t:g}s"))

    # -- polling ----------------------------------------------------------------------
    def poll(self) -> list[Event]:
        new: list[Event] = []
        for name, fn in (("rule engine", self._poll_engine), ("alertmanager", self._poll_am),
                         ("fuse", self._poll_fuse), ("gateway", self._poll_gateway), ("sglang", self._poll_sglang),
                         ("jaeger", self._poll_trace)):
            try:
                new.extend(fn())
                self.errors.pop(name, None)
            except (OSError, ValueError, KeyError) as e:
                self.errors[name] = str(e)
        with self._lock:
            new = self._pending + new
            self._pending = []
        new.sort(key=lambda e: e.at)
        self.events.extend(new)
        return new

    def _poll_trace(self) -> list[Event]:
        """Once the scenario has reached its recovery: the exemplar on the slowest alignment bucket
        and its trace in Jaeger (every 2 s until found; once)."""
        if "jaeger" not in self.urls or self.slow_trace is not None or self.scenario_t0 is None:
            return []
        if not any(e.kind == "phase" and e.what == "recovery" for e in self.events) or time.time() - self._trace_tried < 2:
            return []
        self._trace_tried = time.time()
        found = slowest_exemplar_trace(self.urls["prometheus"], self.urls["jaeger"], since=self.scenario_t0)
        if found is None:
            return []
        self.slow_trace = found
        return [Event(time.time(), "trace", "found", asdict(found), found.text())]

    def _bases(self, kind: str) -> list[str]:
        if self.engine is None:
            return [self.urls["prometheus"]]
        return list(getattr(self.engine, kind))

    def _answers(self, kind: str, path: str, *, first: bool):
        """``data`` of GET ``path`` from the engine's ``kind`` bases that answer, in order: only the
        first one (``first``: failover) or every one. OSError when none answers; ValueError when
        one answers with an error."""
        bases = self._bases(kind)
        err: OSError = OSError("no rule engine replica left")
        answered = False
        for base in bases:
            try:
                body = http_json(f"{base}{path}")
            except OSError as e:
                err = e
                continue
            if body.get("status") != "success":
                raise ValueError(f"{base}: {body}")
            answered = True
            yield body["data"]
            if first:
                return
        if not answered:
            raise err

    def _get(self, kind: str, path: str) -> dict:
        """GET ``path`` from the first of the engine's ``kind`` bases that answers (failover)."""
        return next(self._answers(kind, path, first=True))

    def _all_alerts(self) -> list[dict]:
        """The active alerts of every live rule-engine replica, together: replicas evaluate their
        own copy of the data, so one can fire an evaluation before the other, and Alertmanager (so
        the fuse) acts on whichever notifies first. OSError only when no replica answers."""
        return [a for data in self._answers("alerts_urls", "/api/v1/alerts", first=False) for a in data["alerts"]]

    def _query(self, expr: str) -> list[dict]:
        return self._get("query_urls", "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))["result"]

    def _poll_engine(self) -> list[Event]:
        now = time.time()
        for sig in self.signals:
            rec = records(sig)["value"]
            rows = self._query(rec)
            self.values[sig.name] = sorted((_entity(r["metric"]), float(r["value"][1])) for r in rows)
        seen: dict[tuple[str, str, str], str] = {}
        for a in self._all_alerts():
            state = a.get("state", "")
            if state not in ("pending", "firing"):  # vmalert also lists "inactive" (resolved) ones
                continue
            m = a.get("labels") or {}
            key = (m.get("alertname", ""), m.get(C.LABEL["severity"], ""), _entity(m))
            if seen.get(key) != "firing":  # one entity's alert can be firing and pending at once
                seen[key] = state
        out = []
        for key, state in seen.items():
            old = self.alerts.get(key)
            if old is None or old[0] != state:
                self.alerts[key] = (state, now)
                out.append(self._alert_event(now, key, state))
        for key in list(self.alerts):
            if key not in seen:
                was = self.alerts.pop(key)[0]
                if was == "firing":
                    out.append(self._alert_event(now, key, "resolved"))
        return out

    def _alert_event(self, now: float, key, state: str) -> Event:
        alert, sev, ent = key
        note = ""
        if alert == C.ABSENT_ALERT and state == "pending" and not self.have_data():
            note = " (waiting for first data: the collectors' first push has not arrived yet)"
        return Event(now, "alert", state, {"alertname": alert, "severity": sev, "entity": ent},
                     f"{alert} {sev} {state}" + (f" ({short(ent)})" if ent else "") + note)

    def have_data(self) -> bool:
        """Whether any primary signal's recording rule has returned a value yet."""
        return any(v == v for rows in self.values.values() for _e, v in rows)

    def _poll_am(self) -> list[Event]:
        rows = http_json(f"{self.urls['alertmanager']}/api/v2/alerts")
        counts: dict[str, int] = {}
        for a in rows:
            st = (a.get("status") or {}).get("state", "?")
            counts[st] = counts.get(st, 0) + 1
        self.am_alerts = counts
        return []

    def _poll_fuse(self) -> list[Event]:
        now = time.time()
        levels = http_json(f"{self.urls['fuse']}/state", token=self.fuse_token).get("levels", {})
        out = []
        for scope in set(levels) | set(self.fuses):
            old, new = self.fuses.get(scope, 0), int(levels.get(scope, 0))
            if old != new:
                brief = re.sub(r'="([^"]*)"', lambda m: f'="{short(m.group(1))}"', scope)
                out.append(Event(now, "state", str(new), {"scope": scope, "from": old},
                                 f"fuse /state {brief}: level {old} -> {new}"))
        self.fuses = {k: int(v) for k, v in levels.items()}
        text = http_text(f"{self.urls['fuse']}/metrics")
        self.last_notification = {s.labels.get(C.ALERTMANAGER_LABEL, ""): s.value
                                  for fam in text_string_to_metric_families(text) for s in fam.samples
                                  if s.name == C.FUSE_METRICS["last_notification"]}
        return out

    def _poll_sglang(self) -> list[Event]:
        """The SGLang Model Gateway's own view of its workers: an event ``workers`` when it changes."""
        if "sglang" not in self.urls:
            return []
        now = time.time()
        urls = sorted(w["url"] for w in http_json(f"{self.urls['sglang']}/workers").get("workers", []))
        if urls == self.workers:
            return []
        self.workers = urls
        names = [self.worker_names.get(u, u) for u in urls]
        out = [u for u in self.worker_names if u not in urls]
        text = "SGLang gateway GET /workers: " + (", ".join(names) or "none")
        if out:
            text += " | out of rotation: " + ", ".join(self.worker_names[u] for u in out)
        return [Event(now, "workers", "changed", {"urls": urls, "out": out}, text)]

    def _poll_gateway(self) -> list[Event]:
        if not self.gateway_log.exists():
            return []
        with open(self.gateway_log, "rb") as f:
            f.seek(self._gw_offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._gw_offset += end
        out = []
        for raw in chunk[:end].splitlines():
            if not raw.strip():
                continue
            rec = json.loads(raw)
            self.gateway_calls.append(rec)
            scope = ",".join(f"{k}={short(str(v))}" for k, v in sorted(rec.get("scope", {}).items())
                             if k in (C.LABEL["gpu_id"], C.LABEL["engine"]))
            out.append(Event(float(rec["at"]), "fuse", rec["state"], rec,
                             f"gateway: {rec['state']} level {rec['level']} {rec['action']} [{scope}]"
                             + (" (duplicate)" if rec.get("duplicate") else "")))
        return out
