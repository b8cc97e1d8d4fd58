"""Cost of the collectors: CPU seconds and peak RSS per 1,000 collection rounds.

Workload per round: 8 GPUs replayed through the NVML-shaped backend (H100 figures from the
test corpus), placed in a real server's PCIe tree (collectors/scenarios/sysfs-a300-8: four behind
each of two root ports, so every round also sums their throughput per shared link) + 4 vLLM engines whose /metrics (a real 45 KB vLLM V1 dump) is parsed with
prometheus-client's parser, then one OTLP export encoded to protobuf (sent to a null sink)
and one Prometheus text rendering.

Baseline: a plain prometheus-client exporter of the same values (Gauges set, then
``generate_latest`` once per round), as a hand-written exporter would do it.

The connections collector (``fusebox collect conns``) runs as its own variant: 1,000 real TCP
connections on loopback (2,000 sockets in the namespace: both ends), a tenth of them used
between rounds (not timed), each round one inet_diag dump, the idle histogram, the readings, one
OTLP export and one text rendering. Its share of a core is printed at a 1 s interval and at its
default 5 s (``--interval``).

Each variant runs in its own process so peak RSS is its own. Usage:

    python bench/bench_collectors.py [--rounds 1000]

Targets (issue 3): under 1 % of one core at a 1 s interval (= under 10 ms CPU per round)
and under 80 MiB RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "collectors"
H100 = FIX / "nvidia_gpu_exporter_capture_linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
VLLM = FIX / "hardware-aware-router_vllm-v1_qwen1.5-0.5b-chat_idle_2025-11.txt"
N_GPUS, N_ENGINES = 8, 4
# the eight accelerators of the tree, four behind each root port (collectors/scenarios/sysfs-a300-8/README.md)
SYSFS = ROOT / "collectors" / "scenarios" / "sysfs-a300-8"
BUS_IDS = ("1b", "1c", "1d", "1e", "3d", "3f", "40", "41")
N_CONNS = 1000


def _gpu_states():
    from dataclasses import replace

    from fusebox.collectors.replay import load_replay

    base = load_replay(H100)[0][0]
    return [replace(base, uuid=f"GPU-bench-{i}", index=i, tx_kbps=1000.0 * i, rx_kbps=2000.0 * i,
                    pci_bus_id=f"00000000:{BUS_IDS[i].upper()}:00.0") for i in range(N_GPUS)]


def _collectors():
    from fusebox.collectors.gpu import GpuCollector
    from fusebox.collectors.kvcache import KvCollector, KvGeometry
    from fusebox.collectors.replay import SyntheticNvml

    states = _gpu_states()
    gpu = GpuCollector(SyntheticNvml(lambda: states), sysfs=str(SYSFS)).open()
    text = VLLM.read_text()
    kvs = [KvCollector([f"engine-{i}"], KvGeometry(24, 16, 64, 2), gpus=[f"GPU-bench-{i}"], engine_id=f"e{i}",
                       fetch=lambda _e, _t: text) for i in range(N_ENGINES)]
    return gpu, kvs


class _NullOtlp:
    """Encodes each batch to OTLP protobuf (the real serialization cost) and drops it."""

    def __init__(self):
        from opentelemetry.sdk.metrics import Counter, Histogram, ObservableCounter, ObservableGauge, ObservableUpDownCounter, UpDownCounter
        from opentelemetry.sdk.metrics.export import AggregationTemporality

        self._preferred_temporality = {k: AggregationTemporality.CUMULATIVE for k in (
            Counter, UpDownCounter, Histogram, ObservableCounter, ObservableUpDownCounter, ObservableGauge)}
        self._preferred_aggregation = {}
        self.bytes = 0

    def export(self, data, timeout_millis: float = 10_000, **kw):
        from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
        from opentelemetry.sdk.metrics.export import MetricExportResult

        self.bytes += len(encode_metrics(data).SerializeToString())
        return MetricExportResult.SUCCESS

    def shutdown(self, *a, **k):
        pass


def run_fusebox(rounds: int) -> dict:
    from fusebox.collectors.cli import GPU_KEYS, KV_KEYS
    from fusebox.collectors.export import Pipeline

    gpu, kvs = _collectors()
    sink = _NullOtlp()
    pipe = Pipeline("gpu", GPU_KEYS + KV_KEYS, host="bench", exporter=sink)
    t0, w0 = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        readings = gpu.collect()
        for kv in kvs:
            readings.extend(kv.collect())
        pipe.set_readings(readings)
        pipe.export_round()
        text = pipe.prometheus_text()
    pipe.bounded.flush(30)
    cpu = time.process_time() - t0
    wall = time.perf_counter() - w0
    pipe.shutdown()
    return {"cpu_s": cpu, "wall_s": wall, "series": len(readings), "text_bytes": len(text), "otlp_bytes": sink.bytes // rounds,
            "pcie_links": sum(1 for r in readings if r.key == "pcie_upstream_utilization"), **_topology_walk()}


def _topology_walk(repeat: int = 100) -> dict:
    """The sysfs walk the GPU collector makes once at start, for the 8 GPUs: CPU ms per walk."""
    from fusebox.collectors.pcie import PcieTopology

    gpus = {f"GPU-bench-{i}": f"00000000:{b.upper()}:00.0" for i, b in enumerate(BUS_IDS)}
    t0 = time.process_time()
    for _ in range(repeat):
        topo = PcieTopology.read(gpus, SYSFS)
    return {"walk_ms": (time.process_time() - t0) / repeat * 1000, "walk_gpus": sum(map(len, topo.gpus_below.values()))}


def run_conns(rounds: int) -> dict:
    import socket

    from fusebox.collectors.cli import CONN_KEYS
    from fusebox.collectors.conns import ConnCollector
    from fusebox.collectors.export import Pipeline
    from fusebox.spec.connections import Connections, Peer

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * N_CONNS + 64)), hard))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(N_CONNS)
    port = srv.getsockname()[1]
    pairs = []
    for _ in range(N_CONNS):
        c = socket.create_connection(("127.0.0.1", port))
        pairs.append((c, srv.accept()[0]))
    col = ConnCollector(Connections(peers=(Peer("vllm", frozenset({port})),), max_connections=N_CONNS))
    sink = _NullOtlp()
    pipe = Pipeline("conns", CONN_KEYS, histograms={"connection_idle_before_use": [1, 5, 15, 30, 45, 60, 120, 300, 600]},
                    host="bench", exporter=sink)
    step = N_CONNS // 10
    cpu = 0.0
    w0 = time.perf_counter()
    for r in range(rounds):
        for c, s in pairs[(r * step) % N_CONNS:(r * step) % N_CONNS + step]:  # a tenth used (not timed)
            c.send(b"x")
            s.recv(1)
        t0 = time.process_time()
        col.poll()
        col.record(pipe.histograms["connection_idle_before_use"])
        readings = col.readings()
        pipe.set_readings(readings)
        pipe.set_conns(*col.self_counts())
        pipe.export_round()
        text = pipe.prometheus_text()
        cpu += time.process_time() - t0
    pipe.bounded.flush(30)
    wall = time.perf_counter() - w0
    pipe.shutdown()
    assert len(col.followed) == N_CONNS and sum(col.uses.values()) > 0
    return {"cpu_s": cpu, "wall_s": wall, "series": len(readings), "text_bytes": len(text),
            "otlp_bytes": sink.bytes // rounds, "followed": len(col.followed)}


def run_baseline(rounds: int) -> dict:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    gpu, kvs = _collectors()
    values = gpu.collect()
    for kv in kvs:
        values.extend(kv.collect())
    reg = CollectorRegistry()
    gauges = {}
    for r in values:
        if r.key not in gauges:
            labels = sorted({k.replace(".", "_") for x in values if x.key == r.key for k in x.attrs})
            gauges[r.key] = (Gauge(f"bench_{r.key}", r.key, labels, registry=reg), labels)
    t0, w0 = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        for r in values:
            g, labels = gauges[r.key]
            a = {k.replace(".", "_"): v for k, v in r.attrs.items()}
            g.labels(*[a.get(lab, "") for lab in labels]).set(r.value)
        text = generate_latest(reg)
    return {"cpu_s": time.process_time() - t0, "wall_s": time.perf_counter() - w0, "series": len(values),
            "text_bytes": len(text), "otlp_bytes": 0}


def child(variant: str, rounds: int) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    res = {"fusebox": run_fusebox, "conns": run_conns, "baseline": run_baseline}[variant](rounds)
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    res["rss_before_mib"] = before / 1024
    print(json.dumps(res))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--variant", choices=("fusebox", "conns", "baseline"))
    args = ap.parse_args()
    if args.variant:
        child(args.variant, args.rounds)
        return 0
    out = {}
    for v in ("baseline", "fusebox", "conns"):
        p = subprocess.run([sys.executable, __file__, "--variant", v, "--rounds", str(args.rounds)],
                           capture_output=True, text=True, check=True)
        out[v] = json.loads(p.stdout.strip().splitlines()[-1])
    b, f = out["baseline"], out["fusebox"]
    per_round_ms = f["cpu_s"] / args.rounds * 1000
    print(f"collectors benchmark: {args.rounds} rounds, {N_GPUS} GPUs (replay) + {N_ENGINES} vLLM engines "
          f"({f['series']} series; OTLP {f['otlp_bytes']} B/round, text {f['text_bytes']} B)")
    print(f"{'':24s}{'CPU s/1000 rounds':>20s}{'peak RSS MiB':>14s}")
    print(f"{'prometheus-client only':24s}{b['cpu_s'] * 1000 / args.rounds:>20.3f}{b['peak_rss_mib']:>14.1f}")
    print(f"{'fusebox collectors':24s}{f['cpu_s'] * 1000 / args.rounds:>20.3f}{f['peak_rss_mib']:>14.1f}")
    print(f"ratio fusebox / baseline: CPU {f['cpu_s'] / b['cpu_s']:.1f}x, peak RSS {f['peak_rss_mib'] / b['peak_rss_mib']:.2f}x")
    print(f"PCIe topology: {f['walk_gpus']} GPUs walked up to their root ports in {f['walk_ms']:.2f} ms CPU (once, at "
          f"start); {f['pcie_links']} shared-link series summed every round (in the rounds above)")
    print(f"at a 1 s interval: {per_round_ms / 10:.2f} % of one core (target < 1 %); "
          f"peak RSS {f['peak_rss_mib']:.1f} MiB (target < 80 MiB)")
    c = out["conns"]
    c_ms = c["cpu_s"] / args.rounds * 1000
    print(f"connections collector: {c['followed']} connections followed on loopback ({2 * c['followed']} sockets in the "
          f"namespace; the kernel's port filter returns the {c['followed']} client ends), "
          f"a tenth used per round ({c['series']} series; OTLP {c['otlp_bytes']} B/round, text {c['text_bytes']} B)")
    print(f"{'':24s}{'CPU s/1000 rounds':>20s}{'peak RSS MiB':>14s}{'% core at 1 s':>15s}{'at 5 s':>8s}")
    print(f"{'fusebox collectors':24s}{per_round_ms:>20.3f}{f['peak_rss_mib']:>14.1f}{per_round_ms / 10:>15.2f}{per_round_ms / 50:>8.2f}")
    print(f"{'collect conns':24s}{c_ms:>20.3f}{c['peak_rss_mib']:>14.1f}{c_ms / 10:>15.2f}{c_ms / 50:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
