"""Dashboard query cost: panels on recording rules vs the same panels on raw series.

    python bench/bench_dashboards.py [--gpus 256] [--engines 64] [--hours 1] [--step 30] [--repeat 3]

1. Synthetic history for N GPUs and M engines (fusebox's raw metric names, conventions.PROM;
   scrape every 10 s) is written as OpenMetrics and backfilled into a real Prometheus with
   `promtool tsdb create-blocks-from openmetrics`.
2. The recorded series are made by that Prometheus itself: each record of the generated
   rules file (in file order, so records that read records see them) is evaluated with
   query_range over the whole history, and the result backfilled the same way. So the recorded
   series hold exactly what the rules compute.
3. Every panel query of every generated dashboard (template variables at "All") runs as
   query_range over the history at the given step, twice: as written (recording rules) and
   with every recording-rule name replaced by its defining expression, recursively (raw).
   Medians of --repeat runs; the printed ratio is raw time / rules time.

Needs `prometheus` and `promtool` on PATH (make tools). Bounded: a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fusebox import conventions as C  # noqa: E402
from fusebox.generator.outputs import RULE_FILE, render_all  # noqa: E402
from fusebox.generator.render_dashboards import dashboards  # noqa: E402
from fusebox.spec import load_spec  # noqa: E402
from fusebox.tooling import free_port  # noqa: E402

MIB = 1_048_576
SCRAPE_S = 10
BUCKETS = ("0.05", "0.1", "0.25", "0.5", "0.75", "0.85", "1.0", "1.28", "1.5", "2.0", "2.5", "5.0", "10.0", "+Inf")


# ------------------------------------------------------------------------ synthetic data
def _labels(d: dict) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in d.items()) + "}"


def write_history(path: Path, gpus: int, engines: int, start: int, end: int) -> int:
    """Raw series as OpenMetrics (one family at a time, each series' samples in time order)."""
    rng = random.Random(42)
    ts = list(range(start, end + 1, SCRAPE_S))
    P = C.PROM
    gpu_labels = []
    for g in range(gpus):
        host = g // 8
        gpu_labels.append({"cluster": f"c{host // 16}", "host_name": f"node-{host:03d}", "hw_id": f"GPU-{g:04x}",
                           "hw_gpu_index": str(g % 8), "job": "otelcol", "instance": f"node-{host:03d}:8889"})
    eng_labels = []
    for e in range(engines):
        g = gpu_labels[e * gpus // engines]
        eng_labels.append({"cluster": g["cluster"], "host_name": g["host_name"], "hw_id": g["hw_id"], "engine": f"vllm-{e}",
                           "model": ("llava-1.5-7b", "qwen2-vl-7b", "idefics2-8b")[e % 3], "job": "otelcol",
                           "instance": g["instance"]})
    n = 0
    with open(path, "w") as f:
        def family(name: str, series):
            nonlocal n
            f.write(f"# TYPE {name} unknown\n")
            for labels, values in series:
                lab = _labels(labels)
                for t, v in zip(ts, values, strict=False):
                    f.write(f"{name}{lab} {v} {t}\n")
                    n += 1

        total = 80_000 * MIB
        phase = [rng.random() * 6.28 for _ in range(gpus)]
        used = [[int(total * (0.6 + 0.15 * math.sin(phase[i] + k / 90))) for k in range(len(ts))] for i in range(gpus)]
        family(P["gpu_memory_usage"], zip(gpu_labels, used, strict=False))
        family(P["gpu_memory_limit"], ((l, [total] * len(ts)) for l in gpu_labels))
        family(P["gpu_memory_ratio"], ((l, [u / total for u in us]) for l, us in zip(gpu_labels, used, strict=False)))
        family(P["gpu_memory_reserved"], ((l, [600 * MIB] * len(ts)) for l in gpu_labels))
        for key in ("gpu_memory_bandwidth_utilization", "gpu_pcie_utilization"):
            family(P[key], ((l, [round(0.5 + 0.4 * math.sin(phase[i] + k / 40), 4) for k in range(len(ts))])
                            for i, l in enumerate(gpu_labels)))
        family(P["gpu_power"], ((l, [round(300 + 100 * math.sin(phase[i] + k / 60), 1) for k in range(len(ts))])
                                for i, l in enumerate(gpu_labels)))
        limit = 40_000_000_000
        family(P["kv_cache_usage"], ((l, [int(limit * (0.4 + 0.3 * math.sin(e + k / 30))) for k in range(len(ts))])
                                     for e, l in enumerate(eng_labels)))
        family(P["kv_cache_limit"], ((l, [limit] * len(ts)) for l in eng_labels))
        # Alignment histogram: ~20 observations/s per engine, lognormal around 0.6 s.
        h = P["alignment_duration"]
        counts = []
        for _engine in range(len(eng_labels)):
            cum = [0] * len(BUCKETS)
            total_s = 0.0
            rows = []
            for _t in range(len(ts)):
                for _ in range(20 * SCRAPE_S // 10):
                    x = rng.lognormvariate(math.log(0.6), 0.45)
                    total_s += x * 10
                    for b, le in enumerate(BUCKETS):
                        if x <= float(le):
                            cum[b] += 10
                rows.append((list(cum), round(total_s, 3)))
            counts.append(rows)
        f.write(f"# TYPE {h} histogram\n")
        for e, l in enumerate(eng_labels):
            for b, le in enumerate(BUCKETS):
                lab = _labels(dict(l, le=le))
                for t, (cum, _) in zip(ts, counts[e], strict=False):
                    f.write(f"{h}_bucket{lab} {cum[b]} {t}\n")
                    n += 1
            lab = _labels(l)
            for t, (cum, _s) in zip(ts, counts[e], strict=False):
                f.write(f"{h}_count{lab} {cum[-1]} {t}\n")
            for t, (_cum, s) in zip(ts, counts[e], strict=False):
                f.write(f"{h}_sum{lab} {s} {t}\n")
            n += 2 * len(ts)
        host_model = [dict(cluster=l["cluster"], host_name=l["host_name"], model_name=l["model"], engine=l["engine"])
                      for l in eng_labels]
        for name, per_s in ((C.VLLM_GENERATION_TOKENS, 900), (C.VLLM_PREFIX_CACHE_QUERIES, 2000), (C.VLLM_PREFIX_CACHE_HITS, 700)):
            base = name[: -len("_total")]
            f.write(f"# TYPE {base} counter\n")
            for l in host_model:
                lab = _labels(l)
                for k, t in enumerate(ts):
                    f.write(f"{name}{lab} {per_s * SCRAPE_S * k} {t}\n")
                    n += 1
        f.write(f"# TYPE {C.FUSE_LEVEL_METRIC} gauge\n")
        for l in eng_labels[:4]:
            lab = _labels({k: l[k] for k in ("cluster", "host_name", "engine")})
            for t in ts:
                f.write(f"{C.FUSE_LEVEL_METRIC}{lab} 0 {t}\n")
                n += 1
        f.write("# EOF\n")
    return n


# ------------------------------------------------------------------------- Prometheus
def _get(url: str, timeout: float = 300) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return json.loads(r.read())


class Prom:
    def __init__(self, data: Path, tmp: Path, config: str = "global: {scrape_interval: 15s}\n", extra_args: tuple[str, ...] = (),
                 port: int | None = None):
        """Prometheus on a loopback port over ``data``; ``config`` is the prometheus.yml text (written
        to ``tmp``), ``extra_args`` more flags, ``port`` a fixed port (a restart keeps its address)."""
        self.port = port or free_port()
        cfg = tmp / "prometheus.yml"
        cfg.write_text(config)
        self.log = open(tmp / "prometheus.log", "ab")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=30d",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", "--query.max-samples=200000000",
             "--query.timeout=10m", *extra_args], stdout=self.log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            try:
                urllib.request.urlopen(self.base + "/-/ready", timeout=1)
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise SystemExit(f"prometheus exited: see {tmp / 'prometheus.log'}") from None
                time.sleep(0.2)
        raise SystemExit("prometheus not ready")

    def range(self, expr: str, start: float, end: float, step: float, stats: bool = False):
        """(result, wall seconds[, eval seconds, samples touched]) of one query_range."""
        params = {"query": expr, "start": start, "end": end, "step": step}
        if stats:
            params["stats"] = "all"
        t0 = time.perf_counter()
        body = _get(f"{self.base}/api/v1/query_range?{urllib.parse.urlencode(params)}")
        dt = time.perf_counter() - t0
        if body.get("status") != "success":
            raise SystemExit(f"query failed: {expr}: {body}")
        if not stats:
            return body["data"]["result"], dt
        st = body["data"].get("stats", {})
        timings, samples = st.get("timings", {}), st.get("samples", {})
        ev = timings.get("evalTotalTime", 0.0) + timings.get("queryPreparationTime", 0.0)
        return body["data"]["result"], dt, ev, samples.get("totalQueryableSamples", 0)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def backfill(om: Path, data: Path) -> None:
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(om), str(data)], check=True)


# ------------------------------------------------------------------------ expansion
def load_records(rule_text: str) -> dict[str, str]:
    """record name -> raw expression (records reading records expanded, label-only records joined)."""
    groups = yaml.safe_load(rule_text)["groups"]
    exprs: dict[str, list[tuple[str, dict]]] = {}
    for g in groups:
        for r in g["rules"]:
            if "record" in r:
                exprs.setdefault(r["record"], []).append((r["expr"], r.get("labels", {})))
    out: dict[str, str] = {}
    for name, variants in exprs.items():
        parts = []
        for expr, labels in variants:
            e = f"({expr})"
            for k, v in labels.items():
                e = f'label_replace({e}, "{k}", "{v}", "", "")'
            parts.append(e)
        out[name] = parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"
    return out


def expand(expr: str, records: dict[str, str]) -> str:
    """Replace every recording-rule selector by its definition (matchers must be all-match)."""
    names = sorted(records, key=len, reverse=True)
    pattern = re.compile("(" + "|".join(re.escape(n) for n in names) + r")(\{[^}]*\})?(?![a-zA-Z0-9_:])")
    for _ in range(10):
        def sub(m):
            matchers = [x.strip() for x in (m.group(2) or "").strip("{}").split(",") if x.strip()]
            body = records[m.group(1)]
            # Template variables at "All": =~".*" matches anything and is dropped. The one other
            # matcher the rules use is on `le`, which the bucket-rate record passes through
            # unchanged: it moves onto the raw bucket selector, as a hand-written query would.
            narrow = [x for x in matchers if not x.endswith('=~".*"')]
            if narrow:
                assert all(x.startswith("le") for x in narrow), narrow
                body = re.sub(r"(_bucket)(\[)", lambda mm: mm.group(1) + "{" + ",".join(narrow) + "}" + mm.group(2), body)
            return f"({body})"
        new = pattern.sub(sub, expr)
        if new == expr:
            return new
        expr = new
    return expr


def panel_queries(spec) -> list[tuple[str, str]]:
    out = []
    for name, d in dashboards(spec).items():
        for p in d["panels"]:
            for t in p["targets"]:
                out.append((f"{name}/{p['title']}/{t['refId']}", re.sub(r"\$(\w+)", ".*", t["expr"])))
    return out


# ------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=256)
    ap.add_argument("--engines", type=int, default=64)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--step", type=float, default=30.0, help="query_range step, seconds (Grafana at ~120 points/h)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the temporary TSDB")
    args = ap.parse_args(argv)
    for tool in ("prometheus", "promtool"):
        if not shutil.which(tool):
            print(f"{tool} not found: run `make tools`", file=sys.stderr)
            return 2

    spec = load_spec(ROOT / "fusebox.yaml", display_path="fusebox.yaml")
    rule_text = render_all(spec)[RULE_FILE]
    records = load_records(rule_text)
    tmp = Path(tempfile.mkdtemp(prefix="fusebox-bench-"))
    data = tmp / "tsdb"
    end = (int(time.time()) // 3600) * 3600 - 3 * 3600  # whole hours, clear of the head block
    start = end - int(args.hours * 3600)
    t0 = time.perf_counter()
    n = write_history(tmp / "raw.om", args.gpus, args.engines, start, end)
    t1 = time.perf_counter()
    backfill(tmp / "raw.om", data)
    t2 = time.perf_counter()
    print(f"history: {args.gpus} GPUs, {args.engines} engines, {args.hours:g} h at {SCRAPE_S}s: {n:,} raw samples "
          f"(written {t1 - t0:.1f}s, backfilled {t2 - t1:.1f}s)")

    # Recorded series, evaluated by Prometheus itself in rule-file order.
    prom = Prom(data, tmp)
    rec_om = tmp / "records.om"
    rec_start = start + 600  # the 5m/1m windows have data from here on
    rec_samples = 0
    try:
        with open(rec_om, "w") as f:
            for name in records:
                # Records read earlier records, already backfilled? No: expand them to raw instead.
                result, _ = prom.range(expand(name, records), rec_start, end, SCRAPE_S)
                f.write(f"# TYPE {name} unknown\n")
                for s in result:
                    labels = {k: v for k, v in s["metric"].items() if k != "__name__"}
                    lab = _labels(labels)
                    for t, v in s["values"]:
                        if v in ("NaN", "+Inf", "-Inf"):
                            continue
                        f.write(f"{name}{lab} {v} {int(float(t))}\n")
                        rec_samples += 1
            f.write("# EOF\n")
    finally:
        prom.stop()
    backfill(rec_om, data)
    t3 = time.perf_counter()
    print(f"recorded series: {len(records)} records, {rec_samples:,} samples (evaluated + backfilled {t3 - t2:.1f}s)")

    prom = Prom(data, tmp)
    queries = panel_queries(spec)
    q_start, q_end = rec_start, end
    rows = []
    try:
        for _label, expr in queries:  # warm-up: touch every block once
            prom.range(expr, q_start, q_end, args.step)
        for label, expr in queries:
            raw = expand(expr, records)
            runs = {"rules": [], "raw": []}
            for i in range(args.repeat):
                # Alternate which variant goes first, so neither always pays for a cold cache.
                order = (("rules", expr), ("raw", raw)) if i % 2 == 0 else (("raw", raw), ("rules", expr))
                for kind, q in order:
                    runs[kind].append(prom.range(q, q_start, q_end, args.step, stats=True))
            med = {k: (statistics.median(r[1] for r in v), statistics.median(r[2] for r in v), v[0][3], len(v[0][0]))
                   for k, v in runs.items()}
            rows.append((label, med["rules"], med["raw"], raw != expr))
    finally:
        prom.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")

    print(f"\npanel queries: {len(rows)} over {(q_end - q_start) / 3600:.2f} h at step {args.step:g}s, median of {args.repeat}")
    print("wall = HTTP round trip incl. JSON of the result (the same size both ways); eval = Prometheus' own"
          " evaluation time (stats=all: queryPreparation + evalTotal); samples = totalQueryableSamples")
    print(f"{'panel / query':58s} {'wall ms rules/raw':>18s} {'eval ms rules/raw':>18s} {'eval x':>7s}"
          f" {'samples rules/raw':>20s} {'series':>8s}")
    for label, r, w, rec in rows:
        mark = "" if rec else "  (no record)"
        print(f"{label[:58]:58s} {r[0] * 1e3:8.1f}/{w[0] * 1e3:<9.1f} {r[1] * 1e3:8.1f}/{w[1] * 1e3:<9.1f}"
              f" {w[1] / max(r[1], 1e-9):7.1f} {r[2]:>9,d}/{w[2]:<10,d} {r[3]:>3d}/{w[3]:<4d}{mark}")

    def total(sel, i):
        return sum(x[1][i] for x in sel), sum(x[2][i] for x in sel)

    on_rec = [x for x in rows if x[3]]
    print()
    for what, sel in ((f"all {len(rows)} panel queries", rows), (f"the {len(on_rec)} queries that read records", on_rec)):
        (wr, ww), (er, ew), (sr, sw) = total(sel, 0), total(sel, 1), total(sel, 2)
        print(f"{what}: wall {wr * 1e3:.0f} vs {ww * 1e3:.0f} ms ({ww / wr:.1f}x), eval {er * 1e3:.0f} vs {ew * 1e3:.0f} ms"
              f" ({ew / er:.1f}x), samples {sr:,} vs {sw:,} ({sw / max(sr, 1):.1f}x) cheaper through recording rules"
              " (target >= 10x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
