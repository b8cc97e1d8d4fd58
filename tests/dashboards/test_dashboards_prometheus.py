"""Every panel query returns data from a real Prometheus running the generated rules on a breach.

The breach is served live by a small exporter in the test (the boundary: the GPUs, engines and
fuse service of a real deployment), scraped every second by Prometheus 2.42 with the rules file
`fusebox generate` writes (rules/fusebox.rules.yml). Values, worked out by hand:

* GPU of docs/pitfalls.md P6: used 62800 MiB of 80000 MiB -> device ratio 0.785;
* a second GPU filling 100 MiB/s from 40000 MiB of 80000 MiB -> about 400 - t seconds to full (a
  GPU whose memory does not move has no time to full at all);
* PCIe at 0.97 (>= 95 %, for 3s) -> GPUPCIeLinkSaturated fires within two evaluations;
* alignments at 10/s: 10 % at 0.3 s, 10 % at 0.9 s, 80 % at 1.4 s -> share over 0.85 s = 0.9,
  share over 1.28 s = 0.8, P95 inside the (1.28, 1.5] bucket;
* KV bytes growing 20 MB/s from 2 GB in a pool of 8 GB -> pool usage between 0.25 and 0.5 in
  the test's first 100 s;
* one 300 W GPU on the host, a vLLM engine generating 500 tokens/s -> 0.6 J per token once the
  5m rate window is full; in the test's first minute the 5m rate still divides about k seconds
  of tokens by 300 s, so the record reads 0.6 x 300 / k: at least 0.6, at most 180 (the record
  needs two scrapes of the counter, 1 s apart: k >= 1; its group runs every 30 s, so its value may
  be from its first evaluation);
  exact values are in tests/promtool/dashboard_records.test.yml;
* vLLM prefix cache: 400 hits of 1000 queried tokens per second -> 0.4; SGLang's gauge 0.35;
* the fuse service at level 2 on one engine scope;
* first tokens from vLLM at 10/s, a twentieth of them slower than 1 s (0.5 s, and 2 s): the TTFT
  SLO's error ratio 0.05 on every window, 5x its 1 % budget; the alignment SLO's 0.8 (the share over
  1.28 s above), 80x; the budget left over 30 days, from the few minutes there are, 1 - 5 = -4 and
  1 - 80 = -79;
* the gateway refusing 5 requests/s (its rejected series born at the first scrape, so in the
  test's first minute the record reads the refusals so far over 60 s: above 0, at most 5/s),
  shedding 2/s at the selection stage (the stage alone above 0), one of two workers' breakers open
  (1 open).
"""

from __future__ import annotations

import contextlib
import http.server
import re
import threading
import time

import pytest
import yaml
from _dashboards_support import ROOT, evaluated_since, prometheus, query, query_range, serve_text

from fusebox import conventions as C
from fusebox.generator import shedding
from fusebox.generator.outputs import RULE_FILE, render_all
from fusebox.generator.render_dashboards import dashboards
from fusebox.signal_kinds import dashboard_records
from fusebox.spec import load_spec

pytestmark = pytest.mark.tools

MIB = 1_048_576
BUCKETS = ("0.05", "0.1", "0.25", "0.5", "0.75", "0.85", "1.0", "1.28", "1.5", "2.0", "2.5", "5.0", "10.0", "+Inf")
HOST = 'cluster="lab-a", host_name="gpu-node-1"'
GPU = HOST + ', hw_id="GPU-8f1c2a5e"'
FILLING = HOST + ', hw_id="GPU-4d2e9b71"'
# the model the shipped spec's scaling workload scales (scaling.workloads[].model: its load records read it)
ENGINE = HOST + ', hw_id="GPU-8f1c2a5e", engine="vllm-0", model="llava-hf/llava-1.5-7b-hf"'


def exposition(t: float) -> str:
    """The breach at ``t`` seconds after the start, in the text format."""
    P = C.PROM
    # Counts move in whole steps whose shares are exact, so any two scrapes give the breach's share: the
    # SLO groups run every 30 s, and the value read can be their first, from two scrapes 5 s apart. With
    # a floor of (10 t + 20) / 20 slow first tokens, a CI run read a TTFT error ratio of 0.0667 (4 of 60)
    # where 0.05 was due.
    n = 10 * (int(t) + 1)  # alignments so far, ten a second: a tenth fast, a tenth mid, the rest slow
    obs = {0.3: n // 10, 0.9: n // 10}
    obs[1.4] = n - obs[0.3] - obs[0.9]
    lines = [
        f"{P['gpu_memory_usage']}{{{GPU}}} {62_800 * MIB}",
        f"{P['gpu_memory_limit']}{{{GPU}}} {80_000 * MIB}",
        f"{P['gpu_memory_usage']}{{{FILLING}}} {int((40_000 + 100 * t) * MIB)}",
        f"{P['gpu_memory_limit']}{{{FILLING}}} {80_000 * MIB}",
        f"{P['gpu_memory_ratio']}{{{GPU}}} {62_800 / 80_000}",
        f"{P['gpu_memory_ratio']}{{{FILLING}}} {int((40_000 + 100 * t) * MIB) / (80_000 * MIB)!r}",
        f"{P['gpu_memory_reserved']}{{{GPU}}} {600 * MIB}",
        f"{P['gpu_memory_bandwidth_utilization']}{{{GPU}}} 0.5",
        f"{P['gpu_pcie_utilization']}{{{GPU}}} 0.97",
        f"{P['gpu_power']}{{{GPU}}} 300",
        f"{P['gpu_up']}{{{GPU}}} 1",
        f"{P['kv_cache_usage']}{{{ENGINE}}} {2_000_000_000 + int(20_000_000 * t)}",
        f"{P['kv_cache_limit']}{{{ENGINE}}} 8000000000",
        f'{C.VLLM_GENERATION_TOKENS}{{{HOST}, model_name="llava-hf/llava-1.5-7b-hf"}} {int(500 * t)}',
        f'{C.VLLM_PREFIX_CACHE_QUERIES}{{{HOST}, model_name="llava-hf/llava-1.5-7b-hf"}} {int(1000 * t)}',
        f'{C.VLLM_PREFIX_CACHE_HITS}{{{HOST}, model_name="llava-hf/llava-1.5-7b-hf"}} {int(400 * t)}',
        f'{C.SGLANG_CACHE_HIT_RATE}{{{HOST}, model_name="qwen2-vl"}} 0.35',
        f'{C.FUSE_LEVEL_METRIC}{{cluster="lab-a", host_name="gpu-node-1", instance="", hw_id="", engine="vllm-0"}} 2',
        # the in-path gateway (smg 1.13's series): refusing 5 requests/s, shedding 2/s at selection,
        # one of its two workers' breakers open
        f'{C.GATEWAY_ADMISSIONS}{{cluster="lab-a", result="allowed"}} {int(20 * t)}',
        f'{C.GATEWAY_ADMISSIONS}{{cluster="lab-a", result="rejected"}} {int(5 * t)}',
        *(f'{C.GATEWAY_OVERLOAD_SHED}{{cluster="lab-a", stage="{stage}"}} {int(2 * t) if stage == "selection" else 0}'
          for stage in ("selection", "dispatch", "pd_admission")),
        f'{C.GATEWAY_BREAKER_STATE}{{cluster="lab-a", worker="http://10.0.0.5:30001"}} 1',
        f'{C.GATEWAY_BREAKER_STATE}{{cluster="lab-a", worker="http://10.0.0.6:30001"}} 0',
        # the multimodal stages' row (docs/metrics.md section 8): vLLM's multimodal cache counters,
        # SGLang's encoder forward histogram (its disaggregated encoder server), on engine pods
        f'vllm:mm_cache_queries_total{{{HOST}, namespace="inference", pod="vllm-0", model_name="llava-hf/llava-1.5-7b-hf"}} {int(100 * t)}',
        f'vllm:mm_cache_hits_total{{{HOST}, namespace="inference", pod="vllm-0", model_name="llava-hf/llava-1.5-7b-hf"}} {int(60 * t)}',
        *(f'sglang:encoder_model_forward_seconds_bucket{{{HOST}, namespace="inference", pod="sglang-0", '
          f'model_name="qwen2-vl", le="{le}"}} {int(10 * t) if le != "0.05" else int(5 * t)}' for le in ("0.05", "0.1", "+Inf")),
        f'sglang:encoder_model_forward_seconds_count{{{HOST}, namespace="inference", pod="sglang-0", model_name="qwen2-vl"}} {int(10 * t)}',
        # vLLM's preemption counter (the preemption signal), 2 a second
        f'vllm:num_preemptions_total{{{HOST}, namespace="inference", pod="vllm-0", model_name="llava-hf/llava-1.5-7b-hf"}} {int(2 * t)}',
        # a PCIe link several GPUs share (the GPU collector from sysfs), and the connections collector
        f'{P["pcie_upstream_utilization"]}{{{HOST}, pcie_root_complex="pci0000:17", pcie_port="0000:17:00.0", numa_node="0"}} 0.96',
    ]
    ttft = 20 * (int(t / 2) + 1)  # first tokens so far, ten a second, one in twenty slow
    for le, below in (("0.5", ttft - ttft // 20), ("1.0", ttft - ttft // 20), ("2.5", ttft), ("+Inf", ttft)):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{{HOST}, namespace="inference", pod="vllm-0", '
                     f'model_name="llava-hf/llava-1.5-7b-hf", le="{le}"}} {below}')
    lines.append(f'vllm:time_to_first_token_seconds_count{{{HOST}, namespace="inference", pod="vllm-0", '
                 f'model_name="llava-hf/llava-1.5-7b-hf"}} {ttft}')
    c = P["connection_idle_before_use"]
    uses = int(10 * t) + 10  # a tenth of the uses after 60 s idle, the rest within 5 s
    for le in ("1", "5", "15", "30", "45", "60", "120", "300", "600", "+Inf"):
        lines.append(f'{c}_bucket{{{HOST}, service_peer_name="engines", le="{le}"}} '
                     f'{uses - uses // 10 if float(le) < 120 else uses}')
    lines.append(f'{c}_count{{{HOST}, service_peer_name="engines"}} {uses}')
    lines.append(f'{c}_sum{{{HOST}, service_peer_name="engines"}} {uses * 3}')
    h = P["alignment_duration"]
    for le in BUCKETS:
        bound = float(le)
        lines.append(f'{h}_bucket{{{ENGINE}, le="{le}"}} {sum(c for v, c in obs.items() if v <= bound)}')
    lines.append(f"{h}_count{{{ENGINE}}} {n}")
    lines.append(f"{h}_sum{{{ENGINE}}} {sum(v * c for v, c in obs.items()):.3f}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def breach_exporter():
    start = time.time()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = exposition(time.time() - start).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def substitute(expr: str) -> str:
    return re.sub(r"\$(\w+)", ".*", expr)


def test_every_panel_query_returns_data_on_a_replayed_breach(tmp_path):
    spec = load_spec(ROOT / "fusebox.yaml", display_path="fusebox.yaml")
    rules = tmp_path / "fusebox.rules.yml"
    rules.write_text(render_all(spec)[RULE_FILE])
    boards = dashboards(spec)
    with breach_exporter() as target:
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
               "rule_files": [str(rules)],
               "scrape_configs": [{"job_name": "breach", "honor_labels": True, "static_configs": [{"targets": [target]}]}]}
        with prometheus(tmp_path, cfg) as base:
            # the slow groups (global.slow_evaluation_interval, 30s) each run first at their own
            # offset within the interval: wait until each has written what the panels read (the
            # quantile panels' records, the static GPU total, every dashboard record; energy per
            # token needs two scrapes of the token counter before its group runs)
            wanted = ['ALERTS{alertstate="firing", alertname="GPUPCIeLinkSaturated"}',
                      "engine:fusebox_alignment_latency_p95_over_threshold:ratio_rate5m",
                      "engine:fusebox_alignment_latency_p95:rate5m", "gpu:fusebox_gpu_memory_total:bytes",
                      *dashboard_records().values(),
                      # the panels' own records, in slow groups of their own (each runs first at its
                      # offset within 30 s: without waiting for them a panel could read nothing yet)
                      *(r["record"] for g in yaml.safe_load(rules.read_text())["groups"]
                        if g["name"].endswith("-panels") for r in g["rules"] if "record" in r),
                      # the SLO groups' error ratios and budgets (slow groups, each at its own offset)
                      *(r["record"] for g in yaml.safe_load(rules.read_text())["groups"]
                        if g["name"].startswith("fusebox-slo-") for r in g["rules"] if "record" in r)]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                wanted = [w for w in wanted if not query(base, w)]
                if not wanted:
                    break
                time.sleep(1)
            assert not wanted, f"still empty after 120 s: {wanted}"
            # one more evaluation of each 5 s group, seen on /api/v1/rules (the slow ones wrote above)
            seen, late = time.time(), ["?"]
            deadline = time.monotonic() + 60
            while late and time.monotonic() < deadline:
                time.sleep(0.2)
                late = evaluated_since(base, seen, 5)
            assert not late, f"groups not evaluated again within 60 s: {late}"
            end = time.time()
            empty = []
            n = 0
            for name, d in boards.items():
                if name == shedding.DASHBOARD:
                    continue  # its group runs at its own offset: read below, once it has run
                for p in d["panels"]:
                    for t in p["targets"]:
                        n += 1
                        if not query_range(base, substitute(t["expr"]), end - 60, end, 5):
                            empty.append(f"{name} / {p['title']} / {t['refId']}: {t['expr']}")
            assert not empty, "panel queries without data:\n" + "\n".join(empty)
            assert n >= 25
            # The values the panels draw are the breach's, worked out by hand above.
            over = {r["metric"]["le"]: float(r["value"][1]) for r in
                    query(base, "engine:fusebox_alignment_latency_p95_over_threshold:ratio_rate5m")}
            assert over == {"0.85": pytest.approx(0.9, abs=0.02), "1.28": pytest.approx(0.8, abs=0.02)}
            p95 = float(query(base, "engine:fusebox_alignment_latency_p95:rate5m")[0]["value"][1])
            assert 1.28 < p95 <= 1.5
            device = float(query(base, 'gpu:fusebox_gpu_memory_device_utilization:ratio{hw_id="GPU-8f1c2a5e"}')[0]["value"][1])
            assert device == pytest.approx(0.785)
            growth = float(query(base, "engine:fusebox_kv_cache_usage_bytes:deriv1m")[0]["value"][1])
            assert growth == pytest.approx(20e6, rel=0.1)
            d = dashboard_records()
            one = lambda rec: float(query(base, rec)[0]["value"][1])  # noqa: E731
            assert 0.25 < one(d["kv_ratio"]) < 0.5
            assert 0.6 <= one(d["energy_per_token"]) <= 180
            assert one(d["prefix_hit_vllm"]) == pytest.approx(0.4, rel=0.02)
            assert one(d["prefix_hit_sglang"]) == pytest.approx(0.35)
            assert one(d["gpu_used"] + '{hw_id="GPU-8f1c2a5e"}') == 62_800 * MIB
            # 40000 MiB free at the start, 100 MiB/s: 400 - t seconds, t under two minutes here
            assert 280 < one('gpu:fusebox_gpu_memory_time_to_full:seconds_deriv1m{hw_id="GPU-4d2e9b71"}') < 400
            assert query(base, 'gpu:fusebox_gpu_memory_time_to_full:seconds_deriv1m{hw_id="GPU-8f1c2a5e"}') == []
            # the SLO board's records: the error ratio of every window is the breach's share of bad events
            # (the budget left moves by the ratio's tolerance over the 1 % budget)
            for name, bad, tol in (("alignment_latency", 0.8, 0.02), ("time_to_first_token", 0.05, 0.01)):
                for w in ("5m", "30m", "1h", "2h", "6h", "1d", "3d"):
                    assert one(f"slo:fusebox_{name}_errors:ratio_rate{w}") == pytest.approx(bad, abs=tol), (name, w)
                budget_left = one(f"slo:fusebox_{name}_error_budget:remaining_ratio")
                assert budget_left == pytest.approx(1 - bad / 0.01, abs=tol / 0.01 + 0.5), name
            # the in-path shedding board, once the fusebox-inpath group has run
            shed = shedding.records(spec)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(query(base, r) for r in shed.values()):
                time.sleep(1)
            end = time.time()
            empty = [f"{p['title']} / {t['refId']}: {t['expr']}" for p in boards[shedding.DASHBOARD]["panels"]
                     for t in p["targets"] if not query_range(base, substitute(t["expr"]), end - 60, end, 5)]
            assert not empty, "in-path shedding panel queries without data:\n" + "\n".join(empty)
            assert 0 < one(shed["refused"]) <= 5
            stages = {r["metric"]["stage"]: float(r["value"][1]) for r in query(base, shed["overload_shed"])}
            assert stages["selection"] > 0 and (stages["dispatch"], stages["pd_admission"]) == (0, 0), stages
            assert one(shed["breakers_open"]) == 1


def _fuse_jobs() -> dict[str, dict]:
    """The fuse service's scrape job in each Prometheus config the project writes."""
    import yaml

    from fusebox.demo.stack import Ports, prometheus_config

    compose = yaml.safe_load((ROOT / "deploy" / "compose" / "prometheus.yml").read_text())
    spec = load_spec(ROOT / "fusebox.yaml", display_path="fusebox.yaml")
    demo = prometheus_config(spec, "rules.yml", Ports.pick())
    pick = lambda cfg: next(j for j in cfg["scrape_configs"] if "fuse" in j["job_name"])  # noqa: E731
    return {"deploy/compose/prometheus.yml": pick(compose), "fusebox demo": pick(demo)}


@pytest.mark.parametrize("config", ["deploy/compose/prometheus.yml", "fusebox demo"])
def test_fuse_state_panel_groups_by_the_fuse_scope_not_the_fuse_service(tmp_path, config):
    """The fuse service exports fusebox_fuse_level with the scope's labels, `instance` among them
    (prometheus-client, every SCOPE_LABEL, "" where the scope lacks it, as fuse/metrics.py does).
    Scraped as the project's configs scrape it, the overview's fuse-state query must return one
    series per scope with exactly the scope's labels: without honor_labels, `instance` would be
    the fuse service's address and the scope's own one `exported_instance`."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()
    level = Gauge(C.FUSE_LEVEL_METRIC, "fuse level", list(C.SCOPE_LABELS), registry=registry)
    engine_scope = {"cluster": "demo", "host_name": "demo-node-0", "engine": "llava-decoder-0"}
    instance_scope = {"cluster": "lab", "host_name": "n1", "instance": "n1/fusebox-gpu-collector", "hw_id": "GPU-1"}
    level.labels(**{k: engine_scope.get(k, "") for k in C.SCOPE_LABELS}).set(3)
    level.labels(**{k: instance_scope.get(k, "") for k in C.SCOPE_LABELS}).set(1)
    body = generate_latest(registry)

    server = serve_text(body)
    job = dict(_fuse_jobs()[config], static_configs=[{"targets": [f"127.0.0.1:{server.server_address[1]}"]}])
    spec = load_spec(ROOT / "fusebox.yaml", display_path="fusebox.yaml")
    (expr,) = [t["expr"] for p in dashboards(spec)["overview"]["panels"]
               for t in p.get("targets", []) if t["expr"].startswith("max by") and C.FUSE_LEVEL_METRIC in t["expr"]]
    try:
        with prometheus(tmp_path, {"global": {"scrape_interval": "1s"}, "scrape_configs": [job]}) as base:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(query(base, C.FUSE_LEVEL_METRIC)) < 2:
                time.sleep(0.5)
            got = [(r["metric"], float(r["value"][1])) for r in query(base, substitute(expr))]
    finally:
        server.shutdown()
        server.server_close()
    assert sorted(got, key=lambda x: x[1]) == [(instance_scope, 1.0), (engine_scope, 3.0)]
