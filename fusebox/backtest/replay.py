"""The generated rules replayed by the real engines: VictoriaMetrics single node holds the
recording, ``vmalert -replay`` evaluates the recording and alerting rules over the window and
writes what it computed (records, ``ALERTS``, ``ALERTS_FOR_STATE``) back through remote write;
the ``ALERTS`` series read back give each alert's pending, firing and resolved times.

Why VictoriaMetrics and vmalert (docs/backtest.md): ``vmalert -replay`` is the one rule engine
that evaluates a rules file over a past range and records every state it went through;
``promtool test rules`` only answers whether an alert matches an expectation at a given time.

What this module adds to the engines, and why:

* **Chained records in stages.** ``vmalert -replay`` replays one rule at a time over the whole
  range and only sleeps (``-replay.rulesDelay``) before the next, hoping the previous rule's
  output became searchable. Instead the rules are split by how deep they read other records
  (stage 0 reads raw series only, stage n reads records of stages < n; the groups, their names
  and intervals stay as rendered), each stage is one ``vmalert -replay`` run, and
  VictoriaMetrics' ``/internal/force_flush`` makes its output searchable before the next.
  A record is thus read at the timestamp it was computed for, as Prometheus reads a record
  evaluated earlier in the same group.
* **Labels as Prometheus gives them.** ``-disableAlertgroupLabel``: vmalert's own ``alertgroup``
  label would change the alerts' fingerprints (and match nothing across specs whose groups differ).
* **keep_firing_for.** vmalert's replay ignores it (app/vmalert/rule/alerting.go, execRange,
  v1.151.0): a firing alert whose expression stops matching is applied Prometheus' rule here:
  it keeps firing until ``keep_firing_for`` has passed since the first evaluation without it,
  and resolves then; when the expression matches again meanwhile, it never stopped firing.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from fusebox.spec.units import parse_duration
from fusebox.tooling import free_port, victoriametrics_tool

from .recording import Recording

__all__ = ["duration_s", "ReplayError", "AlertEpisode", "RuleTiming", "replay", "stages", "rule_timings", "episodes"]

ALERTS_METRIC = "ALERTS"
_STATE = "alertstate"


class ReplayError(RuntimeError):
    """An engine failed (did not start, refused the rules or the samples); the message holds its
    own last lines."""


@dataclass(frozen=True)
class RuleTiming:
    """What an alerting rule's state machine needs: its group's ``interval_s``, ``for_s``,
    ``keep_firing_for_s`` (seconds)."""

    interval_s: float
    for_s: float
    keep_firing_for_s: float


@dataclass
class AlertEpisode:
    """One pending-to-resolved run of one alert (one label set). Times are Unix seconds, None when
    it did not happen in the window (``resolved_at`` None: still firing, or resolving only after
    the window's last evaluation)."""

    alertname: str
    severity: str
    labels: dict[str, str]
    pending_at: float | None
    firing_at: float | None
    resolved_at: float | None
    last_seen: float = field(default=0.0, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"alertname": self.alertname, "severity": self.severity, "labels": dict(self.labels),
                "pending_at": self.pending_at, "firing_at": self.firing_at, "resolved_at": self.resolved_at}


def duration_s(value: Any) -> float:
    """A rule file's duration text (``30s``, ``1m``) in seconds; 0 when absent."""
    return parse_duration(str(value)) if value not in (None, "") else 0.0


def rule_timings(groups: list[dict]) -> dict[tuple[str, str], RuleTiming]:
    """(alertname, severity) -> :class:`RuleTiming`, from the rendered groups (their own
    ``interval``, never assumed)."""
    out = {}
    for g in groups:
        interval = duration_s(g.get("interval"))
        for r in g.get("rules", []):
            if "alert" in r:
                sev = str((r.get("labels") or {}).get("severity", ""))
                out[(r["alert"], sev)] = RuleTiming(interval, duration_s(r.get("for")),
                                                     duration_s(r.get("keep_firing_for")))
    return out


def stages(groups: list[dict]) -> list[list[dict]]:
    """The groups split by depth: stage n holds, per group (name and interval kept, only the
    ``name``/``interval``/``rules`` keys), the rules that read records of stages < n only.

    Raises:
        ReplayError: records read each other in a cycle (not a valid rules file).
    """
    produced = {r["record"] for g in groups for r in g.get("rules", []) if "record" in r}
    reads: dict[int, set[str]] = {}
    rules = [(gi, r) for gi, g in enumerate(groups) for r in g.get("rules", [])]
    for i, (_, r) in enumerate(rules):
        expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", str(r.get("expr", "")))
        reads[i] = {t for t in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr) if t in produced}
    depth_of_record: dict[str, int] = {}
    depth: dict[int, int] = {}
    todo = set(range(len(rules)))
    while todo:
        ready = [i for i in sorted(todo) if all(n in depth_of_record for n in reads[i] - {rules[i][1].get("record")})]
        if not ready:
            names = sorted({str(rules[i][1].get("record") or rules[i][1].get("alert")) for i in todo})
            raise ReplayError(f"the rules read each other in a cycle: {', '.join(names[:6])}")
        for i in ready:
            depth[i] = max((depth_of_record[n] + 1 for n in reads[i] if n != rules[i][1].get("record")), default=0)
        for i in ready:
            rec = rules[i][1].get("record")
            if rec:
                depth_of_record[rec] = max(depth_of_record.get(rec, 0), depth[i])
            todo.discard(i)
    out: list[list[dict]] = []
    for d in range(max(depth.values(), default=-1) + 1):
        stage = []
        for gi, g in enumerate(groups):
            rs = [r for i, (gj, r) in enumerate(rules) if gj == gi and depth[i] == d]
            if rs:
                stage.append({"name": g["name"], "interval": g.get("interval"), "rules": rs})
        out.append(stage)
    return out


def _http(url: str, data: bytes | None = None, timeout_s: float = 60.0) -> bytes:
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (loopback, our own process)
        return bytes(resp.read())


class _VictoriaMetrics:
    """A VictoriaMetrics single node on a free loopback port, its storage in ``workdir``."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "victoria-metrics.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> _VictoriaMetrics:
        binary = victoriametrics_tool("victoria-metrics")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(binary), f"-storageDataPath={self.workdir / 'data'}", f"-httpListenAddr=127.0.0.1:{self.port}",
                 "-retentionPeriod=100y", "-search.disableCache", "-loggerLevel=ERROR"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ReplayError(f"victoria-metrics exited ({self.proc.returncode}): {_tail(self.log)}")
            try:
                if _http(f"{self.url}/health", timeout_s=1).strip() == b"OK":
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise ReplayError(f"victoria-metrics did not answer /health within 30 s: {_tail(self.log)}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def flush(self) -> None:
        _http(f"{self.url}/internal/force_flush")

    def import_text(self, text: str) -> None:
        try:
            _http(f"{self.url}/api/v1/import/prometheus", text.encode())
        except urllib.error.HTTPError as e:
            raise ReplayError(f"victoria-metrics refused the samples: HTTP {e.code} "
                              f"{e.read()[:300].decode('utf-8', 'replace')}") from None
        self.flush()

    def export(self, match: str, start_ms: int, end_ms: int) -> list[dict]:
        q = urllib.parse.urlencode({"match[]": match, "start": str(start_ms // 1000), "end": str(-(-end_ms // 1000))})
        body = _http(f"{self.url}/api/v1/export?{q}").decode()
        return [json.loads(line) for line in body.splitlines() if line.strip()]


def _tail(path: Path, n: int = 15) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def replay(rec: Recording, groups: list[dict], start_s: float, end_s: float, *,
           workdir: Path | None = None) -> list[dict]:
    """Import ``rec`` into a fresh VictoriaMetrics, replay ``groups`` stage by stage with
    ``vmalert -replay`` over ``[start_s, end_s]`` (Unix seconds, whole seconds), and return the
    ``ALERTS`` series as ``/api/v1/export`` gives them (``{"metric", "values", "timestamps"}``,
    timestamps in ms).

    Raises:
        fusebox.tooling.ToolMissing: victoria-metrics or vmalert is not built (``make tools``).
        ReplayError: an engine failed; the message quotes its log.
    """
    vmalert = victoriametrics_tool("vmalert")
    own = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="fusebox-backtest-")) if own else Path(workdir)  # type: ignore[arg-type]
    try:
        with _VictoriaMetrics(wd) as vm:
            vm.import_text(rec.prometheus_text())
            for n, stage in enumerate(stages(groups)):
                rules_file = wd / f"stage-{n}.rules.yml"
                rules_file.write_text(yaml.safe_dump({"groups": stage}, sort_keys=False))
                log = wd / f"vmalert-stage-{n}.log"
                with open(log, "wb") as out:
                    rc = subprocess.run(
                        [str(vmalert), f"-rule={rules_file}", f"-datasource.url={vm.url}",
                         f"-remoteWrite.url={vm.url}", f"-replay.timeFrom={_rfc3339(start_s)}",
                         f"-replay.timeTo={_rfc3339(end_s)}", "-replay.disableProgressBar", "-replay.rulesDelay=0",
                         "-disableAlertgroupLabel",
                         f"-httpListenAddr=127.0.0.1:{free_port()}", "-loggerLevel=ERROR"],
                        stdout=out, stderr=subprocess.STDOUT, timeout=600).returncode
                if rc != 0:
                    raise ReplayError(f"vmalert -replay failed on stage {n} ({rc}): {_tail(log)}")
                vm.flush()
            return vm.export(ALERTS_METRIC, int(start_s * 1000), int(end_s * 1000))
    finally:
        if own:
            shutil.rmtree(wd, ignore_errors=True)


def episodes(series: list[dict], timings: dict[tuple[str, str], RuleTiming], start_s: float,
             end_s: float) -> list[AlertEpisode]:
    """Alert episodes from replayed ``ALERTS`` series (see the module docstring for
    keep_firing_for). An alert with no rule in ``timings`` is skipped. Sorted by first time."""
    by_alert: dict[tuple, dict[float, str]] = {}
    for s in series:
        m = dict(s["metric"])
        m.pop("__name__", None)
        state = m.pop(_STATE, "")
        key = tuple(sorted(m.items()))
        for t in s["timestamps"]:
            states = by_alert.setdefault(key, {})
            ts = t / 1000.0
            if states.get(ts) != "firing":
                states[ts] = state
    out = []
    for key, states in by_alert.items():
        labels = dict(key)
        name, sev = labels.get("alertname", ""), labels.get("severity", "")
        tm = timings.get((name, sev))
        if tm is None or tm.interval_s <= 0:
            continue
        last_eval = start_s + ((end_s - start_s) // tm.interval_s) * tm.interval_s
        cur: AlertEpisode | None = None
        eps = 1e-6
        for ts in sorted(states):
            st = states[ts]
            if cur is not None and ts - cur.last_seen > tm.interval_s + eps:
                if cur.firing_at is not None and ts < cur.last_seen + tm.interval_s + tm.keep_firing_for_s - eps:
                    cur.last_seen = ts  # kept firing across the gap: the same episode
                    continue
                out.append(_close(cur, tm, last_eval))
                cur = None
            if cur is None:
                cur = AlertEpisode(name, sev, labels, ts if st == "pending" else None, None, None, ts)
            if st == "firing" and cur.firing_at is None:
                cur.firing_at = ts
            cur.last_seen = ts
        if cur is not None:
            out.append(_close(cur, tm, last_eval))
    out.sort(key=lambda e: (e.pending_at if e.pending_at is not None else (e.firing_at or 0), e.alertname, e.severity,
                            sorted(e.labels.items())))
    return out


def _close(ep: AlertEpisode, tm: RuleTiming, last_eval: float) -> AlertEpisode:
    if ep.firing_at is not None:
        at = ep.last_seen + tm.interval_s + tm.keep_firing_for_s
        ep.resolved_at = at if at <= last_eval + 1e-6 else None
    return ep

