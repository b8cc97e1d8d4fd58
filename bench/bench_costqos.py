"""Benchmark of the COST-QoS controller: its cost per reconcile at 100 and 1,000 policies. Prints
figures; asserts nothing.

Set-up, on loopback: a real API server (etcd + kube-apiserver, tests/_kube_support.py) with the
CRD; a real Prometheus (Debian's) holding 1,000 workloads' histories (tests/_costqos_support.py's
126 one-minute samples of replicas, p95 latency and error ratio each, one series per workload:
378,000 samples, backfilled by ``promtool tsdb create-blocks-from openmetrics``); N policies, each
reading its own workload (``deployment="w<i>"``), created before the run.

Two measurements per N, one after the other:

1. **In process, one policy at a time** (the controller's own code, without kopf's loop), per
   reconcile: the round (``Controller.reconcile``: three range queries over 6 h at a 60 s step,
   the points, frontier and choice) in wall and CPU seconds of this process; the frontier and
   choice alone (``policy.decide`` on the fetched series, CPU); the status write (a JSON merge
   patch of the status subresource, what kopf sends after a handler, through the kubernetes
   client; wall, and this process' CPU for it).
2. **The controller as it runs** (``fusebox costqos run --interval I``, kopf's timers, the status
   written by kopf), over a window that starts once each policy has had its first two rounds
   (create, and the timer's first: kopf starts a timer when its object appears): CPU seconds of
   the controller's process per reconcile (from /proc; rounds counted by its own
   ``fusebox_costqos_reconcile_duration_seconds_count``), the mean round wall time from the same
   histogram (the timers of policies created together fire together, so it includes their turn
   for a query, ``--max-queries``), and the rounds done against the ones the interval asks for.
   The machine's CPU over the window is printed beside it: "CPU SATURATED" when under one core
   was idle (the figures then measure the machine as much as the controller).

Ratios at the end: 1,000 vs 100 per reconcile (1.0x is linear scaling of the total).

    .venv/bin/python bench/bench_costqos.py [--policies 100 1000] [--window 60] [--interval 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _costqos_support import QOS, interleaved  # noqa: E402
from _kube_support import ControlPlane, Proc, wait_until  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from fusebox.costqos.controller import Controller, ControllerMetrics  # noqa: E402
from fusebox.costqos.policy import decide, parse_policy  # noqa: E402
from fusebox.tooling import free_port  # noqa: E402

NS = "bench"
NAMES = ("kube_deployment_spec_replicas", "workload_request_p95_latency_seconds", "workload_request_error_ratio")
STEP_S = 60


def _history(n: int, start: int) -> str:
    rows = interleaved(start)
    out = []
    for name, col in zip(NAMES, (1, 2, 3), strict=True):
        out.append(f"# TYPE {name} gauge")
        for w in range(n):
            lab = f'namespace="{NS}",deployment="w{w}"'
            out += [f"{name}{{{lab}}} {r[col]!r} {int(r[0])}" for r in rows]
    return "\n".join(out) + "\n# EOF\n"


def _policy(i: int, budget: str) -> dict:
    sel = f'{{namespace="{NS}",deployment="w{i}"}}'
    return {"apiVersion": "fusebox.dev/v1alpha1", "kind": "CostQoSScalingPolicy", "metadata": {"name": f"p{i}", "namespace": NS},
            "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"w{i}"}, "costBudget": budget,
                     "qosConstraints": dict(QOS), "replicas": {"min": 1, "max": 8}, "pricePerReplicaHour": "0.21",
                     "lookback": "6h", "metrics": {"replicas": f"max({NAMES[0]}{sel})", "p95LatencySeconds": f"{NAMES[1]}{sel}",
                                                   "errorRatio": f"{NAMES[2]}{sel}"}}}


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the machine since boot, from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(f[:8]) - f[3] - f[4]) / hz, sum(f[:8]) / hz


def proc_cpu(pid: int) -> float:
    """utime + stime of ``pid`` and its reaped children, seconds."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")


def _in_process(cp: ControlPlane, prom_url: str, n: int) -> dict[str, float]:
    """Per reconcile, one policy at a time: round wall/CPU, frontier CPU, status write wall/CPU."""
    from kubernetes import client, config

    api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(cp.kubeconfig)))
    ctl = Controller(prom_url, STEP_S, ControllerMetrics(CollectorRegistry()))
    now = time.time()
    rounds, frontier, writes = [], [], []

    async def all_rounds() -> list[dict]:
        out = []
        for i in range(n):
            doc = _policy(i, "1.00")
            w0, c0 = time.perf_counter(), time.process_time()
            r = await ctl.reconcile(NS, f"p{i}", 1, doc["spec"], {}, now=now)
            rounds.append((time.perf_counter() - w0, time.process_time() - c0))
            out.append(r.status)
        await ctl.close()
        return out

    statuses = asyncio.run(all_rounds())
    # the frontier and choice alone, on the series the rounds read (fetched once more, not timed)
    http = httpx.Client(timeout=30)
    for i in range(min(n, 100)):
        p = parse_policy(NS, f"p{i}", 1, _policy(i, "1.00")["spec"])
        series = []
        for q in (p.replicas_query, p.latency_query, p.error_query):
            body = http.post(prom_url + "/api/v1/query_range", data={"query": q, "start": now - p.lookback_s, "end": now,
                                                                     "step": STEP_S}).json()
            series.append([(float(t), float(v)) for t, v in body["data"]["result"][0]["values"]])
        c0 = time.process_time()
        for _ in range(10):
            decide(p, *series, None, "2026-12-05T00:00:00Z")
        frontier.append((time.process_time() - c0) / 10)
    http.close()
    for i, st in enumerate(statuses):
        w0, c0 = time.perf_counter(), time.process_time()
        api.patch_namespaced_custom_object_status("fusebox.dev", "v1alpha1", NS, "costqosscalingpolicies", f"p{i}",
                                                  {"status": st})
        writes.append((time.perf_counter() - w0, time.process_time() - c0))
    return {"round_wall_ms": statistics.mean(w for w, _ in rounds) * 1e3, "round_cpu_ms": statistics.mean(c for _, c in rounds) * 1e3,
            "frontier_cpu_ms": statistics.mean(frontier) * 1e3,
            "write_wall_ms": statistics.mean(w for w, _ in writes) * 1e3, "write_cpu_ms": statistics.mean(c for _, c in writes) * 1e3}


def _scrape(url: str) -> tuple[float, float]:
    """(count, sum) of the controller's reconcile histogram."""
    count = total = 0.0
    for fam in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for s in fam.samples:
            if s.name == "fusebox_costqos_reconcile_duration_seconds_count":
                count = s.value
            elif s.name == "fusebox_costqos_reconcile_duration_seconds_sum":
                total = s.value
    return count, total


def _controller(cp: ControlPlane, prom_url: str, n: int, root: Path, interval: float, window: float) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    ctl = Proc(f"controller-{n}", [sys.executable, "-m", "fusebox.cli", "costqos", "run", "--prometheus", prom_url,
                                   "--listen", f"127.0.0.1:{port}", "--namespace", NS, "--kubeconfig", str(cp.kubeconfig),
                                   "--interval", f"{interval:g}", "--step", str(STEP_S), "--log-level", "WARNING"],
               root / f"controller-{n}.log", env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        t0 = time.monotonic()
        # a new policy gets two rounds at once: its create handler's and its timer's first (kopf's
        # timers start when the object appears); the window starts after both
        wait_until(lambda: _scrape_ok(url) and _scrape(url)[0] >= 2 * n, 900, f"the first {2 * n} rounds", step=1.0,
                   alive=ctl.check, why=ctl.tail)
        first_s = time.monotonic() - t0
        c0, (n0, s0), (mb0, mt0), w0 = proc_cpu(ctl.proc.pid), _scrape(url), machine_cpu(), time.monotonic()
        time.sleep(window)
        c1, (n1, s1), (mb1, mt1), w1 = proc_cpu(ctl.proc.pid), _scrape(url), machine_cpu(), time.monotonic()
    finally:
        ctl.stop()
    rounds = n1 - n0
    wall = w1 - w0
    return {"first_s": first_s, "rounds": rounds, "expected": n * wall / interval, "cpu_ms": (c1 - c0) / max(rounds, 1) * 1e3,
            "cpu_share": (c1 - c0) / wall, "round_wall_ms": (s1 - s0) / max(rounds, 1) * 1e3,
            "idle_cores": (os.cpu_count() or 1) - (mb1 - mb0) / wall, "machine_busy": (mb1 - mb0) / (mt1 - mt0)}


def _scrape_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--policies", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--window", type=float, default=60.0, help="seconds the running controller is measured over")
    ap.add_argument("--interval", type=float, default=30.0, help="the controller's --interval, seconds")
    args = ap.parse_args()
    top = max(args.policies)
    import yaml

    root = Path(tempfile.mkdtemp(prefix="bench-costqos-"))
    print(f"bench_costqos: policies {args.policies}; cpus {os.cpu_count()}; load {os.getloadavg()[0]:.2f}; {root}")
    cp = ControlPlane(root / "cp").start()
    prom = None
    try:
        cp.apply(yaml.safe_load((ROOT / "fusebox" / "data" / "costqos-crd.yaml").read_text()))
        wait_until(lambda: _established(cp), 60, "the CRD Established")
        cp.client.resources.invalidate_cache()
        cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        start = int(time.time()) - 128 * 60
        (root / "history.om").write_text(_history(top, start))
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(root / "history.om"), str(root / "tsdb")],
                       check=True, capture_output=True, timeout=600)
        (root / "prometheus.yml").write_text("global: {}\n")
        pport = free_port()
        prom = Proc("prometheus", ["prometheus", f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'tsdb'}",
                                   f"--web.listen-address=127.0.0.1:{pport}", "--storage.tsdb.retention.time=100y",
                                   "--log.level=warn"], root / "prometheus.log")
        prom_url = f"http://127.0.0.1:{pport}"
        wait_until(lambda: _scrape_ok(prom_url + "/-/ready"), 120, "Prometheus ready", alive=prom.check)
        made = 0
        results: dict[int, tuple[dict[str, float], dict[str, float]]] = {}
        for n in sorted(args.policies):
            with ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda i: cp.apply(_policy(i, "1.00")), range(made, n)))
            made = max(made, n)
            inproc = _in_process(cp, prom_url, n)
            running = _controller(cp, prom_url, n, root, args.interval, args.window)
            results[n] = (inproc, running)
            _print(n, inproc, running, args.interval)
        if len(results) > 1:
            lo, hi = min(results), max(results)
            print(f"\n{hi} vs {lo} policies, per reconcile (1.0x: the total grows linearly):")
            for key, label in (("round_wall_ms", "round wall (in process)"), ("round_cpu_ms", "round CPU (in process)"),
                               ("frontier_cpu_ms", "frontier + choice CPU"), ("write_wall_ms", "status write wall"),
                               ("write_cpu_ms", "status write CPU (client)")):
                print(f"  {label:28s} {results[hi][0][key] / results[lo][0][key]:5.2f}x")
            for key, label in (("cpu_ms", "controller CPU (running)"), ("round_wall_ms", "round wall (running)")):
                print(f"  {label:28s} {results[hi][1][key] / results[lo][1][key]:5.2f}x")
    finally:
        if prom is not None:
            prom.stop()
        cp.close()
    return 0


def _established(cp: ControlPlane) -> bool:
    crd = cp.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "costqosscalingpolicies.fusebox.dev") or {}
    return any(c["type"] == "Established" and c["status"] == "True" for c in (crd.get("status") or {}).get("conditions") or [])


def _print(n: int, a: dict[str, float], b: dict[str, float], interval: float) -> None:
    sat = "  CPU SATURATED (under one core idle: the figures measure the machine too)" if b["idle_cores"] < 1.0 else ""
    print(f"\n{n} policies")
    print(f"  in process, per reconcile: round {a['round_wall_ms']:.1f} ms wall / {a['round_cpu_ms']:.2f} ms CPU "
          f"(3 range queries + frontier); frontier + choice {a['frontier_cpu_ms']:.3f} ms CPU; "
          f"status write {a['write_wall_ms']:.1f} ms wall / {a['write_cpu_ms']:.2f} ms client CPU")
    print(f"  running (kopf, --interval {interval:g}): first two rounds of all {b['first_s']:.1f} s; "
          f"{b['rounds']:.0f} rounds in the window vs {b['expected']:.0f} asked ({b['rounds'] / max(b['expected'], 1):.2f}x); "
          f"{b['cpu_ms']:.2f} ms CPU per reconcile (status write included); round wall {b['round_wall_ms']:.1f} ms; "
          f"controller {b['cpu_share'] * 100:.0f} % of a core; machine busy {b['machine_busy'] * 100:.0f} %, "
          f"{b['idle_cores']:.2f} cores idle{sat}")


if __name__ == "__main__":
    sys.exit(main())
