"""Fleet-scale cost of the generated rules on Prometheus and on vmalert + VictoriaMetrics, and of the
dashboards through recording rules vs raw series.

    python bench/bench_scale.py                      # 10,000 GPUs (1,250 nodes x 8), 2,500 engines, 1 h
    python bench/bench_scale.py --quick              # 512 GPUs, 128 engines, 15 min: a smoke run
    python bench/bench_scale.py [--gpus N] [--engines M] [--hours H] [--eval-seconds S] [--baseline-seconds B] [--repeat R]
    python bench/bench_scale.py --cost --gpus N --engines M [--before REV] [--same-signals] [--phase-seconds S] [--vm]

``--cost`` measures the rules' cost rather than queueing, on one Prometheus only (no
VictoriaMetrics, no dashboards): the fleet scraped at the spec's scrape interval, 7 minutes of
history backfilled at that step so every rate window has turned over before anything is measured;
the rules of ``--before`` (default: where this branch left main, or 5130cd6 on main itself; ``git show REV:rules/...``,
renamed ``before/...``, ``before:RECORD``, ``BeforeALERT`` so nothing collides) and today's, each
alone and then both side by side. It prints per group the evaluation wall time, the PromQL time of
its rules run one query at a time while only its side's rules run (query stats: evalTotalTime, least of 3: CPU without waiting),
both per evaluation and per second, and prometheus_rule_group_iterations_missed_total; the ratios
after/before; and per phase Prometheus' process CPU and the machine's idle cores, with SATURATED
where under one core was idle (then wall times include queueing). With ``--vm``, after Prometheus
has stopped, VictoriaMetrics (single node) scrapes the same fleet with the same history imported
and one vmalert runs each side's rules alone: per group vmalert's evaluation time, per side the
CPU of vmalert + VictoriaMetrics over VictoriaMetrics' scrape-only CPU, and their ratio. With
``--same-signals`` today's rules are rendered from ``fusebox.yaml`` without the signals that
``--before``'s spec lacks (the time-to-full signals, against 5130cd6): the same signals on both sides.

1. A synthetic fleet (fusebox's raw metric names, conventions.PROM; the labels of
   bench_dashboards.py) is a closed-form function of time, so the history and the live feed are one
   series. An exporter in this process serves its current values; Prometheus and VictoriaMetrics
   (single node, its own promscrape) scrape it every 10 s from the start (honor_labels; the spec
   scrapes every 5 s: windows here hold half the samples, as in bench_dashboards.py), and the
   history up to that moment is loaded into both: a TSDB block made by
   `promtool tsdb create-blocks-from openmetrics`, and VictoriaMetrics' /api/v1/import (JSON lines,
   timestamps in ms: https://docs.victoriametrics.com/victoriametrics/#how-to-import-data-in-json-line-format).
2. The dashboards' recording rules over the history are made by Prometheus itself:
   `promtool tsdb create-blocks-from rules` on a rules file where every record is expanded to raw
   series (bench_dashboards.expand), so records that read records need no ordering.
3. Live rule evaluation, one engine at a time, the other one frozen: Prometheus loads the
   generated rules file (render_all, read at run time) while VictoriaMetrics is held with SIGSTOP
   (its data stays; it misses the scrapes of that phase, a gap of 25 s + --baseline-seconds +
   --eval-seconds, under 2 min by default, which the 5m rate windows of the vmalert phase bridge:
   it is resumed with SIGCONT and scrapes again for over 25 s before anything is measured), and,
   after --baseline-seconds of scraping only and a 15 s warm-up, /api/v1/rules is polled
   every second for each group's evaluationTime at each new lastEvaluation; then Prometheus is
   held with SIGSTOP (its rules unloaded first; it resumes for the dashboard queries, which read
   the history only) and vmalert evaluates the same file against VictoriaMetrics (remote write
   back into it), its /api/v1/rules polled the same way (vmalert's groups have no evaluationTime:
   a group's time there is the span from its lastEvaluation to the end of its last rule, each rule
   a query over HTTP to VictoriaMetrics run one after another, concurrency 1). Median and max of
   the evaluations seen, as a share of the group's interval; target: under 10 %.
   The exporter renders its body once per 10 s scrape tick, shared by both scrapers; one render's
   time is printed at the start, and each render's at the end (0.18-0.20 s for the 20 MB body at
   10,000 GPUs on a 2-core machine, timing exposition(fleet(10000, 2500), t) alone).
   Wall time vs CPU, to tell cost from waiting for a core: neither engine reports CPU per group,
   so each phase prints, over its measured window, the engine's CPU (process_cpu_seconds_total
   from its /metrics: Prometheus; vmalert + VictoriaMetrics, which runs vmalert's queries) beside
   the groups' evaluation wall time added up (Prometheus' prometheus_rule_group_duration_seconds_sum,
   vmalert's vmalert_iteration_duration_seconds_sum, deltas), the CPU of this process (exporter
   and polls), the whole machine's busy CPU (/proc/stat, where there is one) and the load average
   at the phase's start and end. The engine's CPU includes its scraping and the polls, so it is an
   upper bound on the rules' cost; its CPU over --baseline-seconds while it only scrapes (before
   its rules, or vmalert, start) is subtracted for an estimate of the rules' own CPU. Wall time far
   above the CPU means waiting, not cost.
4. Series the recording rules produce vs raw series, counted on each engine while its rules run.
5. Every dashboard panel query over the history (1 h by default) on records vs raw, as
   bench_dashboards.py does it: samples (stats=all totalQueryableSamples), Prometheus' evaluation
   time and wall time, medians of --repeat; target: at least 10x less wall time through records.

Needs `prometheus`/`promtool` on PATH and VictoriaMetrics + vmalert (make tools). Every phase prints
its time; the full run is sized for 2 cores (about 20 min, most of it loading the history).
"""

from __future__ import annotations

import argparse
import datetime
import http.server
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_dashboards as bd  # noqa: E402

from fusebox import conventions as C  # noqa: E402
from fusebox.generator.outputs import RULE_FILE, render_all  # noqa: E402
from fusebox.spec import load_spec  # noqa: E402
from fusebox.tooling import ToolMissing, free_port, victoriametrics_tool  # noqa: E402

SCRAPE_S = 10
TARGET_SHARE = 0.10  # issue 13: every group under 10 % of its interval
PER_RULE_SHARE = 0.05  # --cost lists the rules of groups at this share of their interval or more
TARGET_SPEEDUP = 10.0  # issue 13: dashboards at least 10x faster in wall time through records
ORIGIN = 1_700_000_000  # counters count from here (unix s), so history and live feed agree
MIB = 1_048_576
BLOCK_S = 7200  # promtool's block window for backfill (--max-block-duration default, 2h)
GPU_MEM = 80_000 * MIB
KV_LIMIT = 40_000_000_000
# Alignment latency: lognormal, median 0.4 s, sigma 0.3 (P95 0.65 s: under the spec's 0.85 s, so the
# fleet is quiet, as most of a real fleet is at any moment); ~20 observations/s per engine.
LAT_MU, LAT_SIGMA, LAT_PER_S = math.log(0.4), 0.3, 20.0


# ------------------------------------------------------------------------ the synthetic fleet
@dataclass
class Family:
    """One metric name: its series' label sets and value(series index, unix s) -> sample value."""
    name: str
    labels: list[dict[str, str]]
    value: Callable[[int, float], float]
    prefixes: list[str] = field(default_factory=list)  # "name{labels} " per series, made once

    def __post_init__(self) -> None:
        self.prefixes = [f"{self.name}{bd._labels(lab)} " for lab in self.labels]


def _lognorm_cdf(x: float) -> float:
    return 1.0 if math.isinf(x) else 0.5 * (1 + math.erf((math.log(x) - LAT_MU) / (LAT_SIGMA * math.sqrt(2))))


def _gpu_used(phase: float, t: float) -> int:
    return int(GPU_MEM * (0.55 + 0.1 * math.sin(phase + t / 900)))


def fleet(gpus: int, engines: int) -> list[Family]:
    """The raw series of ``gpus`` GPUs (8 a node) and ``engines`` engines, as bench_dashboards.py
    labels them, plus fusebox_gpu_up (the health group reads it). Series count:
    8 * gpus + 21 * engines + 4 (14 buckets + _count + _sum, 2 KV gauges, 3 vLLM counters)."""
    if gpus < 1 or engines < 1 or engines > gpus:
        raise SystemExit(f"--gpus {gpus} --engines {engines}: need 1 <= engines <= gpus")
    rng = random.Random(42)
    P = C.PROM
    g_lab = []
    for g in range(gpus):
        host = g // 8
        g_lab.append({"cluster": f"c{host // 16}", "host_name": f"node-{host:04d}", "hw_id": f"GPU-{g:05x}",
                      "hw_gpu_index": str(g % 8), "job": "otelcol", "instance": f"node-{host:04d}:8889"})
    e_lab = []
    for e in range(engines):
        g = g_lab[e * gpus // engines]
        e_lab.append({"cluster": g["cluster"], "host_name": g["host_name"], "hw_id": g["hw_id"], "engine": f"vllm-{e}",
                      "model": ("llava-1.5-7b", "qwen2-vl-7b", "idefics2-8b")[e % 3], "job": "otelcol", "instance": g["instance"]})
    phase = [rng.random() * 6.283 for _ in range(gpus)]
    speed = [0.8 + 0.4 * rng.random() for _ in range(engines)]  # per-engine traffic factor
    fams = [
        Family(P["gpu_memory_usage"], g_lab, lambda i, t: _gpu_used(phase[i], t)),
        Family(P["gpu_memory_limit"], g_lab, lambda i, t: GPU_MEM),
        Family(P["gpu_memory_ratio"], g_lab, lambda i, t: _gpu_used(phase[i], t) / GPU_MEM),  # the collector's usage / limit
        Family(P["gpu_memory_reserved"], g_lab, lambda i, t: 600 * MIB),
        Family(P["gpu_memory_bandwidth_utilization"], g_lab, lambda i, t: round(0.5 + 0.4 * math.sin(phase[i] + t / 400), 4)),
        Family(P["gpu_pcie_utilization"], g_lab, lambda i, t: round(0.5 + 0.4 * math.cos(phase[i] + t / 400), 4)),
        Family(P["gpu_power"], g_lab, lambda i, t: round(300 + 100 * math.sin(phase[i] + t / 600), 1)),
        Family(P["gpu_up"], g_lab, lambda i, t: 1),
        Family(P["kv_cache_usage"], e_lab, lambda e, t: int(KV_LIMIT * (0.4 + 0.05 * math.sin(e + t / 3600)))),
        Family(P["kv_cache_limit"], e_lab, lambda e, t: KV_LIMIT),
    ]
    h = P["alignment_duration"]
    for le in bd.BUCKETS:
        share = _lognorm_cdf(float(le))
        fams.append(Family(f"{h}_bucket", [dict(lab, le=le) for lab in e_lab],
                           lambda e, t, s=share: math.floor(LAT_PER_S * speed[e] * (t - ORIGIN) * s)))
    mean = math.exp(LAT_MU + LAT_SIGMA ** 2 / 2)
    fams.append(Family(f"{h}_count", e_lab, lambda e, t: math.floor(LAT_PER_S * speed[e] * (t - ORIGIN))))
    fams.append(Family(f"{h}_sum", e_lab, lambda e, t: round(LAT_PER_S * speed[e] * (t - ORIGIN) * mean, 3)))
    host_model = [{"cluster": lab["cluster"], "host_name": lab["host_name"], "model_name": lab["model"], "engine": lab["engine"],
                   "job": "vllm", "instance": lab["instance"]} for lab in e_lab]
    for name, per_s in ((C.VLLM_GENERATION_TOKENS, 900), (C.VLLM_PREFIX_CACHE_QUERIES, 2000), (C.VLLM_PREFIX_CACHE_HITS, 700)):
        fams.append(Family(name, host_model, lambda e, t, r=per_s: math.floor(r * speed[e] * (t - ORIGIN))))
    fuse = [dict({k: lab[k] for k in ("cluster", "host_name", "engine")}, job="fusebox-fuse", instance="fuse:9464") for lab in e_lab[:4]]
    fams.append(Family(C.FUSE_LEVEL_METRIC, fuse, lambda i, t: 0))
    return fams


def series_count(fams: list[Family]) -> int:
    return sum(len(f.labels) for f in fams)


def write_history(fams: list[Family], ts: list[int], om: Path, jsonl: Path) -> tuple[int, list[Path]]:
    """The samples at ``ts`` (unix s) as VictoriaMetrics JSON lines (timestamps in ms) into
    ``jsonl``, and as OpenMetrics for promtool: one file per 2 h block window (``om`` with the
    window's start as a suffix), because `promtool tsdb create-blocks-from openmetrics` reads its
    whole input once per window it spans. Returns (samples of each, the OpenMetrics files)."""
    windows: dict[int, list[int]] = {}
    for t in ts:
        windows.setdefault(t // BLOCK_S * BLOCK_S, []).append(t)
    files = {w: open(om.with_name(f"{om.name}.{w}"), "w") for w in windows}
    stamps = ",".join(str(t * 1000) for t in ts)
    n = 0
    try:
        with open(jsonl, "w") as j:
            for fam in fams:
                for f in files.values():
                    f.write(f"# TYPE {fam.name} unknown\n")
                for i, (lab, prefix) in enumerate(zip(fam.labels, fam.prefixes, strict=False)):
                    vals = [fam.value(i, t) for t in ts]
                    k = 0
                    for w, wts in windows.items():
                        files[w].write("".join(f"{prefix}{v} {t}\n" for v, t in zip(vals[k:k + len(wts)], wts, strict=False)))
                        k += len(wts)
                    metric = json.dumps(dict(lab, __name__=fam.name), separators=(",", ":"))
                    j.write(f'{{"metric":{metric},"values":[{",".join(map(str, vals))}],"timestamps":[{stamps}]}}\n')
                    n += len(ts)
    finally:
        for f in files.values():
            f.write("# EOF\n")
            f.close()
    return n, [Path(f.name) for f in files.values()]


def exposition(fams: list[Family], t: float) -> bytes:
    """Every series' value at ``t`` in the Prometheus text format, without timestamps."""
    return "".join(f"{p}{fam.value(i, t)}\n" for fam in fams for i, p in enumerate(fam.prefixes)).encode()


class Exporter:
    """The fleet's current values on a loopback port (one body per 10 s step, shared by the scrapers)."""

    def __init__(self, fams: list[Family], step: float = SCRAPE_S):
        self.fams, self.lock, self.cache, self.step = fams, threading.Lock(), (0.0, b""), step
        self.render_s: list[float] = []  # wall time of each render, seconds
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = outer.body()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def body(self) -> bytes:
        step = time.time() // self.step * self.step
        with self.lock:
            if self.cache[0] != step:
                t0 = time.perf_counter()
                self.cache = (step, exposition(self.fams, time.time()))
                self.render_s.append(time.perf_counter() - t0)
            return self.cache[1]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def scrape_config(port: int, interval: float = SCRAPE_S) -> str:
    return (f"global: {{scrape_interval: {interval:g}s}}\n"
            f"scrape_configs:\n- job_name: fleet\n  honor_labels: true\n  scrape_timeout: {interval:g}s\n"
            f"  static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")


# ------------------------------------------------------------------------------- engines
def _wait(url: str, proc: subprocess.Popen, log: Path, what: str) -> None:
    for _ in range(600):
        try:
            urllib.request.urlopen(url, timeout=2)  # noqa: S310 - loopback only
            return
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"{what} exited: see {log}") from None
            time.sleep(0.2)
    raise SystemExit(f"{what} not ready: see {log}")


class Proc:
    """A binary on a loopback port, logging to tmp/<what>.log."""

    def __init__(self, what: str, args: list[str], ready: str, tmp: Path, port: int):
        self.port, self.log_path = port, tmp / f"{what}.log"
        self.base = f"http://127.0.0.1:{port}"
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        _wait(self.base + ready, self.proc, self.log_path, what)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def victoriametrics(tmp: Path, scrape_port: int, interval: float = SCRAPE_S) -> Proc:
    cfg = tmp / "vm-scrape.yml"
    cfg.write_text(scrape_config(scrape_port, interval))
    port = free_port()
    return Proc("victoria-metrics", [
        str(victoriametrics_tool("victoria-metrics")), f"-storageDataPath={tmp / 'vm'}", f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=30d", f"-promscrape.config={cfg}", "-promscrape.maxScrapeSize=512MB", "-loggerLevel=WARN",
        "-search.maxUniqueTimeseries=10000000", "-search.maxSamplesPerQuery=10000000000"], "/health", tmp, port)


def vmalert(tmp: Path, rules: Path, vm: Proc) -> Proc:
    port = free_port()
    return Proc("vmalert", [
        str(victoriametrics_tool("vmalert")), f"-rule={rules}", f"-datasource.url={vm.base}", f"-remoteWrite.url={vm.base}",
        "-notifier.blackhole", f"-httpListenAddr=127.0.0.1:{port}", "-loggerLevel=WARN"], "/health", tmp, port)


def vm_import(vm: Proc, jsonl: Path, chunk: int = 32 * MIB) -> None:
    """POST the JSON lines to /api/v1/import in chunks of whole lines, then drop the rollup cache
    (docs: reset it after importing historical data)."""
    with open(jsonl, "rb") as f:
        while True:
            buf = f.read(chunk)
            if not buf:
                break
            buf += f.readline()
            req = urllib.request.Request(vm.base + "/api/v1/import", data=buf, method="POST")
            urllib.request.urlopen(req, timeout=600).read()  # noqa: S310 - loopback only
    urllib.request.urlopen(vm.base + "/internal/force_flush", timeout=600).read()  # noqa: S310
    urllib.request.urlopen(vm.base + "/internal/resetRollupResultCache", timeout=60).read()  # noqa: S310


def instant(base: str, expr: str) -> list:
    body = bd._get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    if body.get("status") != "success":
        raise SystemExit(f"query failed on {base}: {expr}: {body}")
    return body["data"]["result"]


def count_by_name(base: str, names: list[str]) -> dict[str, int]:
    """Series per metric name among ``names`` at the engine's now (an instant count)."""
    res = instant(base, f'count by (__name__) ({{__name__=~"{"|".join(names)}"}})')
    return {r["metric"]["__name__"]: int(float(r["value"][1])) for r in res}


# ------------------------------------------------------------------------------ rule groups
def rule_groups(rule_text: str) -> list[tuple[str, float]]:
    """(name, interval s) of every group of a rules file, in file order."""
    out = []
    for g in yaml.safe_load(rule_text)["groups"]:
        iv = str(g.get("interval", "1m"))
        scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
        unit = next(u for u in ("ms", "s", "m", "h") if iv.endswith(u))
        out.append((g["name"], float(iv[: -len(unit)]) * scale[unit]))
    return out


def record_levels(rule_text: str) -> list[list[dict]]:
    """The recording rules of a rules file (as written, labels included) by dependency level:
    level 0 reads raw series only, level n reads records of lower levels."""
    rules = [{k: r[k] for k in ("record", "expr", "labels") if k in r}
             for g in yaml.safe_load(rule_text)["groups"] for r in g["rules"] if "record" in r]
    names = {r["record"] for r in rules}
    deps = {n: set() for n in names}
    for r in rules:
        deps[r["record"]] |= {m for m in names if m != r["record"] and re.search(re.escape(m) + r"(?![a-zA-Z0-9_:])", r["expr"])}
    level: dict[str, int] = {}
    while len(level) < len(names):
        ready = {n: 1 + max((level[d] for d in deps[n]), default=-1) for n in names - level.keys() if deps[n] <= level.keys()}
        if not ready:
            raise SystemExit(f"recording rules read each other in a cycle: {sorted(names - level.keys())}")
        level.update(ready)
    return [[r for r in rules if level[r["record"]] == i] for i in range(max(level.values(), default=-1) + 1)]


def _unix(rfc3339: str) -> float:
    """'2026-12-02T01:12:10.440891333Z' -> unix seconds (fractions to the microsecond)."""
    main, _, frac = rfc3339.rstrip("Z").partition(".")
    return datetime.datetime.fromisoformat(main).replace(tzinfo=datetime.UTC).timestamp() + float(f"0.{frac or 0}"[:8])


def group_eval_seconds(group: dict) -> float | None:
    """A group's last evaluation time in seconds from /api/v1/rules: Prometheus' evaluationTime.
    vmalert's groups have none (app/vmalert/rule/web.go, ApiGroup), and its rules run one after
    another (concurrency 1), each with its own start (lastEvaluation) and evaluationTime: there it is
    the span from the group's lastEvaluation to the end of its last rule, or None while that
    evaluation is under way (a rule's lastEvaluation is still before the group's)."""
    if "evaluationTime" in group:
        return float(group["evaluationTime"])
    start = _unix(group["lastEvaluation"])
    ends = []
    for r in group.get("rules", []):
        t = _unix(r.get("lastEvaluation") or "0001-01-01T00:00:00Z")
        if t < start:
            return None
        ends.append(t + float(r.get("evaluationTime", 0.0)))
    return max(ends, default=start) - start


def poll_groups(base: str, seconds: float, warmup: float) -> dict[str, list[float]]:
    """Each group's evaluation times (s) at every new lastEvaluation seen over ``seconds``, after
    ``warmup`` seconds (the first evaluations fill caches)."""
    seen: dict[str, set[str]] = {}
    out: dict[str, list[float]] = {}
    t_end = time.time() + warmup + seconds
    t_start = time.time() + warmup
    while time.time() < t_end:
        for g in bd._get(base + "/api/v1/rules", timeout=30)["data"]["groups"]:
            last = g.get("lastEvaluation", "")
            if time.time() < t_start or not last or last.startswith("0001-"):
                continue
            took = group_eval_seconds(g)
            if took is not None and last not in seen.setdefault(g["name"], set()):
                seen[g["name"]].add(last)
                out.setdefault(g["name"], []).append(took)
        time.sleep(1.0)
    return out


def metric_sums(base: str, names: tuple[str, ...]) -> dict[str, float]:
    """Each of ``names`` summed over its label sets in ``base``/metrics (Prometheus text format)."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:  # noqa: S310 - loopback only
        return sum_metrics(r.read().decode(), names)


def sum_metrics(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Each of ``names`` summed over its label sets in a text exposition (0.0 where absent)."""
    out = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1] if "}" not in line else line.rsplit("}", 1)[1].split()[0])
    return out


def machine_cpu() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot from /proc/stat (USER_HZ 100), or
    None where there is none. Busy is everything but idle and iowait."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    total = sum(f[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return (total - f[3] - f[4]) / hz, total / hz


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass
class Usage:
    """What one engine's measured window cost: wall seconds, the engine's CPU seconds, the groups'
    evaluation wall seconds added up, this process's CPU seconds, the machine's busy CPU seconds
    (None without /proc/stat), load averages at the start and end."""
    wall: float
    engine_cpu: float
    group_wall: float
    self_cpu: float
    machine_busy: float | None
    load: tuple[tuple[float, ...], tuple[float, ...]]


def measure(bases: list[str], group_metric: str, poll_base: str | None, seconds: float) -> tuple[dict[str, list[float]], Usage]:
    """poll_groups over ``seconds`` with the CPU around it: process_cpu_seconds_total of every
    process at ``bases`` and ``group_metric`` (a group-duration summary's _sum) added up over them.
    ``poll_base`` None: no rules to poll, only the CPU over ``seconds`` (the scrape-only baseline)."""
    names = ("process_cpu_seconds_total", group_metric)

    def snap() -> tuple[float, float, float, float, tuple[float, float] | None, tuple[float, ...]]:
        sums = [metric_sums(b, names) for b in bases]
        return (time.perf_counter(), sum(s[names[0]] for s in sums), sum(s[names[1]] for s in sums), _self_cpu(),
                machine_cpu(), os.getloadavg())

    a = snap()
    if poll_base is None:
        times: dict[str, list[float]] = {}
        time.sleep(seconds)
    else:
        times = poll_groups(poll_base, seconds, warmup=0)
    b = snap()
    busy = None if a[4] is None or b[4] is None else b[4][0] - a[4][0]
    return times, Usage(b[0] - a[0], b[1] - a[1], b[2] - a[2], b[3] - a[3], busy, (a[5], b[5]))


def _hold(procs: list, sig: signal.Signals) -> None:
    """SIGSTOP or SIGCONT each of ``procs`` (Proc or bd.Prom) that is still running."""
    for p in procs:
        if p.proc.poll() is None:
            os.kill(p.proc.pid, sig)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def rule_errors(base: str) -> list[str]:
    return [f"{g['name']}/{r.get('name')}: {r['lastError']}" for g in bd._get(base + "/api/v1/rules")["data"]["groups"]
            for r in g.get("rules", []) if r.get("lastError")]


# ----------------------------------------------------------------- --cost: rule cost, not queueing
MISSED = "prometheus_rule_group_iterations_missed_total"
BEFORE_FALLBACK = "5130cd6"  # main where the rule-cost branch started (issue 23)


def branch_point() -> str:
    """The commit this branch left main at (``git merge-base HEAD main``); :data:`BEFORE_FALLBACK`
    without one, or on main itself (there the merge base is HEAD: today's rules against themselves)."""
    r = subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], capture_output=True, text=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    base = r.stdout.strip() if r.returncode == 0 else ""
    return base[:12] if base and base != head else BEFORE_FALLBACK


def rules_at(rev: str) -> str:
    """``rules/fusebox.rules.yml`` as committed at ``rev`` (git show). Raises SystemExit without it."""
    r = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{RULE_FILE}"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"git show {rev}:{RULE_FILE} failed (a clone without that history?): {r.stderr.strip()}")
    return r.stdout


def _ms(s: float) -> str:
    """Seconds as milliseconds in 8 columns; ``-`` when the group was not evaluated in the window."""
    return f"{'-':>8}" if math.isnan(s) else f"{s * 1e3:8.1f}"


def _pct(s: float, interval: float) -> str:
    """A share of ``interval`` in 7 columns; ``-`` when the group was not evaluated in the window
    (a phase shorter than its interval)."""
    return f"{'-':>7}" if math.isnan(s) else f"{s / interval * 100:6.2f}%"


def same_signals_spec(rev: str, tmp: Path):
    """Today's ``fusebox.yaml`` without the signals the spec of ``rev`` does not have (written to
    ``tmp`` and loaded): the after side of ``--same-signals``, so both sides watch the same
    signals and the ratio is the cost of the same work. Raises SystemExit without ``rev``'s spec."""
    r = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:fusebox.yaml"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"git show {rev}:fusebox.yaml failed (a clone without that history?): {r.stderr.strip()}")
    then = set(yaml.safe_load(r.stdout)["signals"])
    data = yaml.safe_load((ROOT / "fusebox.yaml").read_text())
    dropped = [n for n in data["signals"] if n not in then]
    data["signals"] = {n: v for n, v in data["signals"].items() if n in then}
    path = tmp / "fusebox.same-signals.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(path, display_path="fusebox.yaml"), dropped


def side_by_side(before: str, after: str) -> tuple[list[dict], list[dict]]:
    """The groups of two rule files, renamed so both can run in one Prometheus: ``before/NAME`` and
    ``after/NAME`` groups; the before file's records ``before:NAME`` (and every reference to them)
    and its alerts ``BeforeNAME``, so no series of one is written by the other."""
    b = yaml.safe_load(before)["groups"]
    names = sorted({r["record"] for g in b for r in g["rules"] if "record" in r}, key=len, reverse=True)
    ref = re.compile(r"(?<![a-zA-Z0-9_:])(" + "|".join(map(re.escape, names)) + r")(?![a-zA-Z0-9_:])")
    for g in b:
        g["name"] = "before/" + g["name"]
        for r in g["rules"]:
            r["expr"] = ref.sub(lambda m: "before:" + m[1], r["expr"])
            if "record" in r:
                r["record"] = "before:" + r["record"]
            if "alert" in r:
                r["alert"] = "Before" + r["alert"]
    a = yaml.safe_load(after)["groups"]
    for g in a:
        g["name"] = "after/" + g["name"]
    return b, a


def _interval_s(g: dict) -> float:
    return dict(rule_groups(yaml.safe_dump({"groups": [g]})))[g["name"]]


def promql_seconds(base: str, groups: list[dict], tries: int = 3,
                   per_rule: dict[str, list[tuple[str, float]]] | None = None) -> dict[str, float]:
    """Each group's PromQL time for one evaluation: its rules' expressions run one at a time as
    instant queries with stats=all, the least of ``tries`` of Prometheus' own evalTotalTime (plus
    queryPreparationTime) per rule, added up. One query at a time on an engine with an idle core:
    this is the rules' CPU, without the waiting that a group's wall time includes. ``per_rule``,
    when given, gets each group's (record or alert name, seconds) in rule order."""
    out = {}
    for g in groups:
        total = 0.0
        for r in g["rules"]:
            best = math.inf
            for _ in range(tries):
                body = bd._get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': r['expr'], 'stats': 'all'})}", timeout=120)
                t = body.get("data", {}).get("stats", {}).get("timings", {})
                best = min(best, t.get("evalTotalTime", 0.0) + t.get("queryPreparationTime", 0.0))
            total += best
            if per_rule is not None:
                per_rule.setdefault(g["name"], []).append((r.get("record") or r.get("alert", "?"), best))
        out[g["name"]] = total
    return out


def _missed(base: str) -> dict[str, float]:
    """prometheus_rule_group_iterations_missed_total per group name (the file part dropped)."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:  # noqa: S310 - loopback only
        text = resp.read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(rf'^{MISSED}{{rule_group="[^";]*;([^"]*)"}} (\S+)$', text, re.M):
        out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


def _load_rules(prom: bd.Prom, tmp: Path, config: str, groups: list[dict]) -> None:
    rules = tmp / "cost-rules.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    (tmp / "prometheus.yml").write_text(config + (f"rule_files: ['{rules}']\n" if groups else ""))
    urllib.request.urlopen(urllib.request.Request(prom.base + "/-/reload", method="POST"), timeout=120).read()  # noqa: S310


def _saturation(u: Usage) -> tuple[float | None, str]:
    """(idle cores over the window, "" or "SATURATED": under one idle core, the engine queues)."""
    if u.machine_busy is None:
        return None, ""
    idle = (os.cpu_count() or 1) - u.machine_busy / u.wall
    return idle, "" if idle >= 1.0 else "SATURATED"


def _vm_tools() -> bool:
    """Whether VictoriaMetrics and vmalert are built (make tools); says which is missing if not."""
    try:
        for tool in ("victoria-metrics", "vmalert"):
            victoriametrics_tool(tool)
    except ToolMissing as e:
        print(e, file=sys.stderr)
        return False
    return True


def cost_main(args: argparse.Namespace) -> int:
    """Rule cost of today's rules beside those of ``--before`` (default: the branch point) on one
    Prometheus, scraping at the spec's interval, after the rate windows have turned over."""
    if args.vm and not _vm_tools():
        return 2
    spec = load_spec(ROOT / "fusebox.yaml", display_path="fusebox.yaml")
    scrape = spec.scrape_interval_s
    before_rev = args.before or branch_point()
    tmp = Path(tempfile.mkdtemp(prefix="fusebox-bench-cost-"))
    dropped: list[str] = []
    if args.same_signals:
        spec, dropped = same_signals_spec(before_rev, tmp)
    before, after = side_by_side(rules_at(before_rev), render_all(spec)[RULE_FILE])
    fams = fleet(args.gpus, args.engines)
    window = 300 + 120  # the longest rule window (5m) and 2 minutes: every window full of samples
    clock = [time.perf_counter()] * 2
    print(f"cost: {args.gpus:,} GPUs, {args.engines:,} engines: {series_count(fams):,} raw series scraped every {scrape:g}s"
          f" (the spec's); before = rules of {before_rev} ({len(before)} groups), after = today's ({len(after)} groups"
          f"{'; same signals as ' + before_rev + ', left out: ' + (', '.join(dropped) or 'none') if args.same_signals else ''});"
          f" cpus {os.cpu_count()}; load {_load()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    exporter = Exporter(fams, step=scrape)
    config = scrape_config(exporter.port, scrape)
    prom = None
    try:
        end = int(time.time() // scrape * scrape)
        ts = [end - window + i * int(scrape) for i in range(int(window // scrape) + 1)]
        _, om_files = write_history(fams, ts, tmp / "raw.om", tmp / "raw.jsonl")
        (tmp / "raw.jsonl").unlink()
        data = tmp / "prom"
        data.mkdir()
        for om in om_files:
            bd.backfill(om, tmp / "blocks")
            om.unlink()
        _move_blocks(tmp / "blocks", data)
        _phase(f"history: {window // 60} min at {scrape:g}s steps, backfilled", clock)
        prom = bd.Prom(data, tmp, config, ("--web.enable-lifecycle",))
        # the gap between the history's end and the first scrapes must leave every deriv[1m] window
        time.sleep(max(0.0, end + 70 - time.time()))
        _, base_use = measure([prom.base], "prometheus_rule_group_duration_seconds_sum", None, args.phase_seconds)
        phases = {}
        promql: dict[str, float] = {}
        per_rule: dict[str, list[tuple[str, float]]] = {}
        errors: list[str] = []
        for side, groups in (("before", before), ("after", after), ("both", before + after)):
            _load_rules(prom, tmp, config, groups)
            time.sleep(args.warmup_seconds)
            missed0 = _missed(prom.base)
            times, use = measure([prom.base], "prometheus_rule_group_duration_seconds_sum", prom.base, args.phase_seconds)
            missed = {k: v - missed0.get(k, 0.0) for k, v in _missed(prom.base).items()}
            phases[side] = (times, use, missed)
            if side != "both":  # each side's queries while only its own rules run (their records exist)
                promql.update(promql_seconds(prom.base, groups, per_rule=per_rule))
                errors += rule_errors(prom.base)
            _phase(f"{side}: rules evaluated live" + ("" if side == "both" else ", then its PromQL time per group"), clock)
        _load_rules(prom, tmp, config, [])
        prom.stop()
        prom = None
        # Prometheus' figures first: a failure in the VictoriaMetrics phase must not lose them
        report_cost(before, after, base_use, phases, promql, errors, per_rule)
        if args.vm:
            report_vm_cost(before, after, *vm_cost(tmp, exporter.port, fams, scrape, window, before, after, args, clock))
    finally:
        exporter.stop()
        if prom is not None:
            prom.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def vm_cost(tmp: Path, port: int, fams: list[Family], scrape: float, window: int, before: list[dict], after: list[dict],
            args: argparse.Namespace, clock: list[float]) -> tuple[Usage, dict[str, tuple[dict[str, list[float]], Usage]], list[str]]:
    """The same two rule files on vmalert + VictoriaMetrics (single node), after Prometheus is gone:
    VictoriaMetrics scrapes the fleet at ``scrape`` with ``window`` seconds of history imported up to
    its first scrape, then vmalert runs each side's groups alone (one vmalert, concurrency 1: its
    rules one after another, each a query over HTTP). Returns the scrape-only usage of
    VictoriaMetrics, per side (group times, usage of vmalert + VictoriaMetrics) and rule errors."""
    vm = victoriametrics(tmp, port, scrape)
    procs: list[Proc] = [vm]
    try:
        end = int(time.time() // scrape * scrape)
        ts = [end - window + i * int(scrape) for i in range(int(window // scrape) + 1)]
        _, om_files = write_history(fams, ts, tmp / "vm.om", tmp / "vm.jsonl")
        for om in om_files:
            om.unlink()
        vm_import(vm, tmp / "vm.jsonl")
        (tmp / "vm.jsonl").unlink()
        _phase(f"VictoriaMetrics: {window // 60} min of history imported", clock)
        time.sleep(max(0.0, end + 70 - time.time()))  # as for Prometheus: every deriv[1m] window on live scrapes
        metric = "vmalert_iteration_duration_seconds_sum"
        _, base_use = measure([vm.base], metric, None, args.phase_seconds)
        sides: dict[str, tuple[dict[str, list[float]], Usage]] = {}
        errors: list[str] = []
        for side, groups in (("before", before), ("after", after)):
            rules = tmp / f"vm-{side}.yml"
            rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
            vma = vmalert(tmp, rules, vm)
            procs.append(vma)
            time.sleep(args.warmup_seconds)
            sides[side] = measure([vma.base, vm.base], metric, vma.base, args.phase_seconds)
            errors += rule_errors(vma.base)
            vma.stop()
            procs.remove(vma)
            _phase(f"vmalert: {side} rules evaluated live", clock)
    finally:
        for p in procs:
            p.stop()
    return base_use, sides, errors


def report_vm_cost(before: list[dict], after: list[dict], base_use: Usage,
                   sides: dict[str, tuple[dict[str, list[float]], Usage]], errors: list[str]) -> None:
    """Per group vmalert's evaluation time (median, share of its interval; each side alone), and the
    CPU of vmalert + VictoriaMetrics per side with VictoriaMetrics' scrape-only CPU subtracted."""
    print("\nvmalert + VictoriaMetrics, each side's rules alone; a group's time: from its lastEvaluation to the end of its"
          " last rule (median of the evaluations seen, share of its interval)")
    for g in before + after:
        side, iv = g["name"].split("/", 1)[0], _interval_s(g)
        t = sides.get(side, ({}, None))[0].get(g["name"], [])
        wall = statistics.median(t) if t else math.nan
        print(f"{g['name']:52s} {iv:7g}s {_ms(wall)} ms {_pct(wall, iv)}  {'over 10 %' if wall / iv >= TARGET_SHARE else ''}")
    base_rate = base_use.engine_cpu / base_use.wall
    rule_cpu = {}
    for side, u in [("scraping only", base_use)] + [(k, v[1]) for k, v in sides.items()]:
        rate = u.engine_cpu / u.wall
        rules = rate - base_rate if side != "scraping only" else 0.0
        rule_cpu[side] = rules
        idle, sat = _saturation(u)
        print(f"  {side:14s} {u.wall:5.0f}s window: vmalert + VictoriaMetrics {rate * 100:5.1f} % of a core, rules {rules * 100:5.1f} %;"
              f" machine idle {'n/a' if idle is None else f'{idle:.2f} cores'}; load {' '.join(f'{x:.2f}' for x in u.load[1])} {sat}")
    if rule_cpu.get("before", 0) > 0:
        print(f"vmalert rule CPU after/before (vmalert + VictoriaMetrics process CPU): {rule_cpu['after'] / rule_cpu['before']:.2f}x")
    for e in errors[:5]:
        print(f"  vmalert rule error: {e[:200]}")


def report_cost(before: list[dict], after: list[dict], base_use: Usage, phases: dict, promql: dict[str, float],
                errors: list[str], per_rule: dict[str, list[tuple[str, float]]] | None = None) -> int:
    """Print the side-by-side table and the ratios; return 0."""
    both_times, both_use, missed = phases["both"]
    print("\nrule groups, both files in one Prometheus; wall: the group's evaluation time (median of the evaluations seen,"
          " share of its interval); PromQL: its rules one query at a time (query stats, least of 3, while only its own"
          " side's rules ran), per evaluation and per second (per evaluation / interval); missed:"
          " prometheus_rule_group_iterations_missed_total over the window")
    print(f"{'group':52s} {'interval':>8s} {'wall ms':>8s} {'wall %':>7s} {'PromQL ms':>9s} {'PromQL %':>8s} {'ms/s':>7s} {'missed':>6s}")
    per_side: dict[str, list[float]] = {}
    for g in before + after:
        iv, name = _interval_s(g), g["name"]
        t = both_times.get(name, [])
        wall = statistics.median(t) if t else math.nan
        q = promql.get(name, math.nan)
        m = missed.get(name, 0.0)
        side = name.split("/", 1)[0]
        acc = per_side.setdefault(side, [0.0, 0.0, 0.0])
        acc[0] += q / iv
        acc[1] += (wall / iv) if t else 0.0
        acc[2] += m
        flag = "MISSED" if m else ("over 10 %" if max(wall, q) / iv >= TARGET_SHARE else "")
        print(f"{name:52s} {iv:7g}s {_ms(wall)} {_pct(wall, iv)} {q * 1e3:9.1f} {q / iv * 100:7.2f}% {q / iv * 1e3:7.1f}"
              f" {m:6.0f}  {flag}")
    big = [g for g in before + after if promql.get(g["name"], 0.0) / _interval_s(g) >= PER_RULE_SHARE]
    if per_rule and big:
        print(f"\nPromQL per rule of the groups at {PER_RULE_SHARE:.0%} of their interval or more (ms per evaluation, share):")
        for g in big:
            iv = _interval_s(g)
            print(f"  {g['name']}: " + "; ".join(f"{name} {t * 1e3:.1f} ({t / iv:.1%})" for name, t in per_rule.get(g["name"], [])))
    b, a = per_side.get("before", [math.nan] * 3), per_side.get("after", [math.nan] * 3)
    print(f"\nPromQL seconds per second of rules (query stats): before {b[0]:.3f}, after {a[0]:.3f}: after/before {a[0] / b[0]:.2f}x")
    print(f"group wall seconds per second (both loaded): before {b[1]:.3f}, after {a[1]:.3f}: after/before {a[1] / b[1]:.2f}x")
    print(f"iterations missed in the window: before {b[2]:.0f}, after {a[2]:.0f}")
    print("\nProcess CPU of Prometheus per phase (process_cpu_seconds_total), scraping included; rules' CPU = phase - scraping only:")
    base_rate = base_use.engine_cpu / base_use.wall
    rule_cpu = {}
    for side, u in [("scraping only", base_use)] + [(k, v[1]) for k, v in phases.items()]:
        rate = u.engine_cpu / u.wall
        idle, sat = _saturation(u)
        rules = rate - base_rate if side != "scraping only" else 0.0
        rule_cpu[side] = rules
        print(f"  {side:14s} {u.wall:5.0f}s window: Prometheus {rate * 100:5.1f} % of a core, rules {rules * 100:5.1f} %;"
              f" groups' wall added up {u.group_wall / u.wall * 100:5.1f} % of a core; machine idle"
              f" {'n/a' if idle is None else f'{idle:.2f} cores'}; load {' '.join(f'{x:.2f}' for x in u.load[1])} {sat}")
    if rule_cpu.get("before", 0) > 0:
        print(f"rule CPU after/before (process CPU, phases one after another): {rule_cpu['after'] / rule_cpu['before']:.2f}x")
    for e in errors[:5]:
        print(f"  rule error: {e[:200]}")
    sat_any = any(_saturation(u)[1] for u in [base_use] + [v[1] for v in phases.values()])
    print("SATURATED: under one idle core in a phase: wall times include queueing" if sat_any else
          "every phase had at least one idle core")
    return 0


# ------------------------------------------------------------------------------------ main
def _phase(name: str, t0: list[float]) -> None:
    now = time.perf_counter()
    print(f"[{now - t0[1]:7.1f}s] {name}: {now - t0[0]:.1f}s", flush=True)
    t0[0] = now


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=10_000, help="GPUs of the synthetic fleet (8 per node)")
    ap.add_argument("--engines", type=int, default=2_500, help="vLLM engines of the synthetic fleet")
    ap.add_argument("--hours", type=float, default=1.0, help="history the dashboards read (plus 10 min for the 5m windows)")
    ap.add_argument("--eval-seconds", type=float, default=60.0, help="live rule evaluation measured per engine")
    ap.add_argument("--baseline-seconds", type=float, default=30.0,
                    help="each engine's CPU measured while it only scrapes, before its rules start")
    ap.add_argument("--step", type=float, default=30.0, help="dashboard query_range step, seconds")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each panel query (the raw ones take tens of seconds at 10,000 GPUs)")
    ap.add_argument("--quick", action="store_true", help="512 GPUs, 128 engines, 15 min of history, 30 s of evaluations")
    ap.add_argument("--keep", action="store_true", help="keep the temporary data")
    ap.add_argument("--cost", action="store_true", help="rule cost only: the rules of --before and today's side by side in one "
                    "Prometheus (no VictoriaMetrics, no dashboards)")
    ap.add_argument("--before", help="with --cost: the revision whose rules are the 'before' (default: where this branch left main; "
                    "on main itself, 5130cd6, the rules before the cost cuts)")
    ap.add_argument("--same-signals", action="store_true", help="with --cost: today's rules rendered from fusebox.yaml without "
                    "the signals --before's spec lacks, so both sides watch the same signals")
    ap.add_argument("--phase-seconds", type=float, default=40.0, help="with --cost: each measured phase")
    ap.add_argument("--warmup-seconds", type=float, default=15.0, help="with --cost: after each rule load, before measuring")
    ap.add_argument("--vm", action="store_true", help="with --cost: then the same two rule files on vmalert + VictoriaMetrics, "
                    "each side alone, after Prometheus has stopped")
    args = ap.parse_args(argv)
    if args.cost:
        return cost_main(args)
    if args.quick:
        args.gpus, args.engines, args.hours, args.eval_seconds = 512, 128, 0.25, 30.0
    for tool in ("prometheus", "promtool"):
        if not shutil.which(tool):
            print(f"{tool} not found: run `make tools`", file=sys.stderr)
            return 2
    if not _vm_tools():
        return 2

    spec = load_spec(ROOT / "fusebox.yaml", display_path="fusebox.yaml")
    rule_text = render_all(spec)[RULE_FILE]
    groups = rule_groups(rule_text)
    records = bd.load_records(rule_text)
    fams = fleet(args.gpus, args.engines)
    raw_names = sorted({f.name for f in fams})
    t_render = time.perf_counter()
    body_size = len(exposition(fams, time.time()))
    t_render = time.perf_counter() - t_render
    tmp = Path(tempfile.mkdtemp(prefix="fusebox-bench-scale-"))
    (tmp / "rules.yml").write_text(rule_text)
    clock = [time.perf_counter()] * 2
    print(f"fleet: {args.gpus:,} GPUs ({-(-args.gpus // 8):,} nodes x 8), {args.engines:,} engines: {series_count(fams):,} raw series;"
          f" {len(groups)} rule groups, {len(records)} records; cpus {os.cpu_count()}; load {os.getloadavg()[0]:.2f}"
          f" {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    print(f"exporter: one render of the exposition {t_render:.3f}s ({body_size / MIB:.1f} MiB), once per {SCRAPE_S}s scrape tick,"
          " shared by both scrapers", flush=True)

    exporter = Exporter(fams)
    t_live = int(time.time()) // SCRAPE_S * SCRAPE_S  # scraping starts now; the history ends just before
    vm = victoriametrics(tmp, exporter.port)
    data = tmp / "prom"
    prom_args = ("--web.enable-lifecycle",)
    prom = bd.Prom(data, tmp, scrape_config(exporter.port), prom_args)
    procs: list = [vm, prom]
    vma = None
    try:
        end = t_live - SCRAPE_S
        q_start = end - int(args.hours * 3600)
        ts = list(range(q_start - 600, end + 1, SCRAPE_S))
        n, om_files = write_history(fams, ts, tmp / "raw.om", tmp / "raw.jsonl")
        _phase(f"history written ({n:,} samples per engine, {len(ts)} steps)", clock)
        vm_import(vm, tmp / "raw.jsonl")
        _phase("history imported into VictoriaMetrics", clock)
        for om in om_files:
            bd.backfill(om, tmp / "blocks")
            om.unlink()
        (tmp / "raw.jsonl").unlink()
        _phase("history block made (promtool)", clock)
        prom.stop()
        _move_blocks(tmp / "blocks", data)
        prom = procs[1] = bd.Prom(data, tmp, scrape_config(exporter.port), prom_args, port=prom.port)
        # The dashboards' records over the history, by Prometheus, level by level (records that read
        # records after the blocks of those they read are loaded), at the dashboards' query step.
        for level, rules in enumerate(record_levels(rule_text)):
            rec_rules = tmp / f"records-{level}.yml"
            rec_rules.write_text(yaml.safe_dump({"groups": [{"name": f"records-{level}", "interval": f"{args.step:g}s", "rules": rules}]},
                                                sort_keys=False))
            with open(tmp / "promtool-rules.log", "ab") as log:
                subprocess.run(["promtool", "tsdb", "create-blocks-from", "rules", "-q", f"--start={q_start}", f"--end={end}",
                                f"--url={prom.base}", f"--output-dir={tmp / 'recblocks'}", str(rec_rules)],
                               check=True, stdout=log, stderr=subprocess.STDOUT)
            prom.stop()
            _move_blocks(tmp / "recblocks", data)
            prom = procs[1] = bd.Prom(data, tmp, scrape_config(exporter.port), prom_args, port=prom.port)
        prom.stop()
        _phase("records over the history (promtool create-blocks-from rules, level by level)", clock)

        # Live rule evaluation: Prometheus first with VictoriaMetrics frozen, then vmalert with
        # Prometheus frozen; the running engine scrapes throughout.
        print(f"Prometheus phase: load average {_load()} before VictoriaMetrics is held", flush=True)
        _hold([vm], signal.SIGSTOP)
        prom = procs[1] = bd.Prom(data, tmp, scrape_config(exporter.port), prom_args, port=prom.port)
        prom_metric = "prometheus_rule_group_duration_seconds_sum"
        time.sleep(SCRAPE_S)  # scraping only: the engine's CPU without rules
        _, prom_base_use = measure([prom.base], prom_metric, None, args.baseline_seconds)
        (tmp / "prometheus.yml").write_text(scrape_config(exporter.port) + f"rule_files: ['{tmp / 'rules.yml'}']\n")
        urllib.request.urlopen(urllib.request.Request(prom.base + "/-/reload", method="POST"), timeout=60).read()  # noqa: S310
        time.sleep(15)  # warm-up: the first evaluations fill caches
        prom_times, prom_use = measure([prom.base], prom_metric, prom.base, args.eval_seconds)
        prom_errors = rule_errors(prom.base)
        counts = {"Prometheus": (count_by_name(prom.base, raw_names), count_by_name(prom.base, list(records)))}
        (tmp / "prometheus.yml").write_text(scrape_config(exporter.port))
        urllib.request.urlopen(urllib.request.Request(prom.base + "/-/reload", method="POST"), timeout=60).read()  # noqa: S310
        _hold([prom], signal.SIGSTOP)
        _hold([vm], signal.SIGCONT)
        _phase("Prometheus evaluating the rules live", clock)
        print(f"vmalert phase: load average {_load()} with Prometheus held", flush=True)
        vm_metric = "vmalert_iteration_duration_seconds_sum"
        time.sleep(SCRAPE_S)  # VictoriaMetrics scraping again, no vmalert yet: its CPU without rules
        _, vm_base_use = measure([vm.base], vm_metric, None, args.baseline_seconds)
        vma = vmalert(tmp, tmp / "rules.yml", vm)
        procs.append(vma)
        time.sleep(15)
        vm_times, vm_use = measure([vma.base, vm.base], vm_metric, vma.base, args.eval_seconds)
        vm_errors = rule_errors(vma.base)
        counts["VictoriaMetrics"] = (count_by_name(vm.base, raw_names), count_by_name(vm.base, list(records)))
        vma.stop()
        procs.remove(vma)
        vm.stop()
        procs.remove(vm)
        exporter.stop()
        _hold([prom], signal.SIGCONT)
        _phase("vmalert + VictoriaMetrics evaluating the rules live", clock)

        rows = dashboard_rows(prom, spec, records, q_start, end, args.step, args.repeat)
        _phase("dashboard queries", clock)
    finally:
        _hold(procs, signal.SIGCONT)
        for p in procs:
            p.stop()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    ok = report_groups(groups, prom_times, vm_times, prom_errors, vm_errors)
    report_usage({"Prometheus": (prom_base_use, prom_use), "vmalert + VictoriaMetrics": (vm_base_use, vm_use)}, exporter.render_s)
    report_counts(counts, list(records))
    ok &= report_dashboards(rows, args.hours, args.step, args.repeat)
    print(f"\ntotal {time.perf_counter() - clock[1]:.0f}s; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
          f" on {os.cpu_count()} cpus; peak RSS: this Python {_rss(resource.RUSAGE_SELF)}, its largest child"
          f" {_rss(resource.RUSAGE_CHILDREN)}; targets {'met' if ok else 'MISSED (see above)'}")
    return 0


def _rss(who: int) -> str:
    return f"{resource.getrusage(who).ru_maxrss / 1024:.0f} MiB"  # ru_maxrss is in KiB on Linux


def _move_blocks(src: Path, dst: Path) -> None:
    for b in src.iterdir():
        if b.is_dir():
            shutil.move(str(b), str(dst / b.name))
    shutil.rmtree(src, ignore_errors=True)


def dashboard_rows(prom: bd.Prom, spec, records: dict[str, str], start: int, end: int, step: float, repeat: int) -> list:
    """bench_dashboards' comparison: (label, rules (wall, eval, samples, series), raw (...), reads a record)."""
    queries = bd.panel_queries(spec)
    for _, expr in queries:  # warm-up: touch every block once
        prom.range(expr, start, end, step)
    rows = []
    for label, expr in queries:
        raw = bd.expand(expr, records)
        runs: dict[str, list] = {"rules": [], "raw": []}
        for i in range(repeat):
            order = (("rules", expr), ("raw", raw)) if i % 2 == 0 else (("raw", raw), ("rules", expr))
            for kind, q in order:
                runs[kind].append(prom.range(q, start, end, step, stats=True))
        med = {k: (statistics.median(r[1] for r in v), statistics.median(r[2] for r in v), v[0][3], len(v[0][0])) for k, v in runs.items()}
        rows.append((label, med["rules"], med["raw"], raw != expr))
    return rows


def _share(times: list[float], interval: float) -> tuple[float, float]:
    return (statistics.median(times) / interval, max(times) / interval) if times else (math.nan, math.nan)


def report_groups(groups, prom_times, vm_times, prom_errors, vm_errors) -> bool:
    print("\nrule evaluation: share of the group's interval, median / max of the evaluations seen (n); target < 10 %")
    print(f"{'group':40s} {'interval':>8s} {'Prometheus %':>20s} {'vmalert %':>20s}  flag")
    ok = True
    for name, iv in groups:
        p, v = prom_times.get(name, []), vm_times.get(name, [])
        (pm, px), (vmm, vx) = _share(p, iv), _share(v, iv)
        good = bool(p and v) and px < TARGET_SHARE and vx < TARGET_SHARE
        ok &= good
        print(f"{name:40s} {iv:7g}s {pm * 100:7.2f} / {px * 100:6.2f} ({len(p):2d}) {vmm * 100:7.2f} / {vx * 100:6.2f} ({len(v):2d})"
              f"  {'ok' if good else 'MISSED'}")
    for what, times in (("Prometheus", prom_times), ("vmalert", vm_times)):
        total = sum(statistics.median(v) / iv for (name, iv) in groups if (v := times.get(name)))
        print(f"  {what}: the groups' median evaluation times add up to {total * 100:.0f} % of an interval"
              " (an engine runs its groups concurrently, so each group's time includes waiting for a core)")
    for what, errs in (("Prometheus", prom_errors), ("vmalert", vm_errors)):
        for e in errs[:5]:
            print(f"  {what} rule error: {e[:200]}")
    return ok


def report_usage(uses: dict[str, tuple[Usage, Usage]], renders: list[float]) -> None:
    print("\nCPU vs wall over each engine's measured window (the other engine held with SIGSTOP); no engine reports CPU per group")
    for eng, (base, u) in uses.items():
        idle, busy_rate = base.engine_cpu / base.wall, u.engine_cpu / u.wall
        print(f"  {eng}: scraping only {idle * 100:.0f} % of a core ({base.wall:.0f}s); with the rules {busy_rate * 100:.0f} %:"
              f" the rules' CPU about {(busy_rate - idle) * u.wall:.2f}s over the {u.wall:.0f}s window"
              f" ({(busy_rate - idle) * 100:.0f} % of a core; scrapes land unevenly in short windows, so this is rough)")
        busy = "n/a" if u.machine_busy is None else (f"{u.machine_busy:.1f}s (other processes"
                                                     f" {max(u.machine_busy - u.engine_cpu - u.self_cpu, 0.0):.1f}s)")
        print(f"  {eng}: {u.wall:.0f}s window; engine CPU {u.engine_cpu:.2f}s ({u.engine_cpu / u.wall * 100:.0f} % of a core,"
              f" scraping and polls included); groups' evaluation wall time added up {u.group_wall:.2f}s"
              f" (wall/CPU {u.group_wall / max(u.engine_cpu, 1e-9):.1f}); this process (exporter, polls) {u.self_cpu:.2f}s;"
              f" machine busy {busy} of {u.wall * (os.cpu_count() or 1):.0f} core-s;"
              f" load average {' '.join(f'{x:.2f}' for x in u.load[0])} -> {' '.join(f'{x:.2f}' for x in u.load[1])}")
    if renders:
        print(f"  exporter: {len(renders)} renders, median {statistics.median(renders):.3f}s, max {max(renders):.3f}s")


def report_counts(counts: dict[str, tuple[dict[str, int], dict[str, int]]], records: list[str]) -> None:
    print("\nseries: raw series the rules read vs series the recording rules produce (instant counts while each engine's rules ran)")
    for eng, (raw, rec) in counts.items():
        r, w = sum(raw.values()), sum(rec.values())
        print(f"  {eng:16s} raw {r:>9,d}  records {w:>9,d}  (records/raw {w / max(r, 1):.2f})")
    engines = list(counts)
    print(f"  {'record':66s} " + " ".join(f"{e:>16s}" for e in engines))
    for name in records:
        print(f"  {name:66s} " + " ".join(f"{counts[e][1].get(name, 0):>16,d}" for e in engines))


def report_dashboards(rows, hours: float, step: float, repeat: int) -> bool:
    print(f"\ndashboard panel queries: {len(rows)} over {hours:g} h at step {step:g}s, median of {repeat}; raw/records ratios")
    print(f"{'panel / query':58s} {'wall ms rec/raw':>17s} {'x':>6s} {'eval ms rec/raw':>17s} {'x':>6s} {'samples rec/raw':>22s} {'x':>6s}")
    for label, r, w, rec in rows:
        print(f"{label[:58]:58s} {r[0] * 1e3:7.0f}/{w[0] * 1e3:<9.0f} {w[0] / max(r[0], 1e-9):6.1f} {r[1] * 1e3:7.0f}/{w[1] * 1e3:<9.0f}"
              f" {w[1] / max(r[1], 1e-9):6.1f} {r[2]:>10,d}/{w[2]:<11,d} {w[2] / max(r[2], 1):6.1f}{'' if rec else '  (no record)'}")
    ok = True
    on_rec = [x for x in rows if x[3]]
    for what, sel in ((f"all {len(rows)} panel queries", rows), (f"the {len(on_rec)} that read records", on_rec)):
        tot = [(sum(x[1][i] for x in sel), sum(x[2][i] for x in sel)) for i in range(3)]
        (wr, ww), (er, ew), (sr, sw) = tot
        speed = ww / max(wr, 1e-9)
        print(f"{what}: wall {wr:.2f} vs {ww:.2f} s ({speed:.1f}x), eval {er:.2f} vs {ew:.2f} s ({ew / max(er, 1e-9):.1f}x),"
              f" samples {sr:,} vs {sw:,} ({sw / max(sr, 1):.1f}x) raw/records; wall target >= {TARGET_SPEEDUP:g}x:"
              f" {'ok' if speed >= TARGET_SPEEDUP else 'MISSED'}")
        if what.startswith("the"):
            ok &= speed >= TARGET_SPEEDUP
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
