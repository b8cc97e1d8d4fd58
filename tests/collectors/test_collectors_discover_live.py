"""``fusebox collect kv --discover`` as a process, against a real kube-apiserver (tests/_kube_support.py,
no node and no kubelet: pods are created and deleted with the kubernetes client, their phase and
IP set through the status subresource, as a kubelet would), a fake kubelet's pod-resources socket
(tests/_kubelet.py) and stand-in engines serving the corpus /metrics dumps on loopback addresses
of their own (the pod IPs). Expected bytes worked out by hand from the dumps and the geometry."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from _kube_support import ControlPlane, wait_until
from _kubelet import FakeKubelet, answer
from prometheus_client.parser import text_string_to_metric_families

from fusebox.tooling import free_port

pytestmark = pytest.mark.process

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "collectors"
# TinyLlama-1.1B: 22 layers, 4 KV heads, head 64, bfloat16 = 22528 B/token; the dump's cache_config_info:
# 6971 blocks x 16 tokens; kv_cache_usage_perc 0
TINY_POOL = 6971 * 16 * (2 * 22 * 4 * 64 * 2)  # 2,512,683,008 B
# opt-125m: 12 layers, 12 KV heads, head 64, float16 = 36864 B/token; the SGLang dump: max_total_num_tokens
# 430839, token_usage 0.25; one MIG device
SGL_POOL = 430839 * (2 * 12 * 12 * 64 * 2)
ENGINES = """\
namespaces: [inference]
selector: {app.kubernetes.io/name: engine}
port: http
path: /metrics
models:
  TinyLlama/TinyLlama-1.1B-Chat-v1.0: {layers: 22, kv_heads: 4, head_dim: 64, dtype_bytes: 2}
  facebook/opt-125m: {layers: 12, kv_heads: 12, head_dim: 64, dtype_bytes: 2}
"""
INTERVAL_S = 1.0


class Engine:
    """A stand-in engine: GET /metrics answers a dump, on ``ip`` (the pod IP) and a free port."""

    def __init__(self, ip: str, text: str):
        body = text.encode()

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.ip = ip
        self.server = http.server.ThreadingHTTPServer((ip, 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _pod(name, node, port, labels=None):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "inference",
                         "labels": labels if labels is not None else {"app.kubernetes.io/name": "engine"}},
            "spec": {"nodeName": node, "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0",
                                                       "ports": [{"name": "http", "containerPort": port}]}]}}


def _kv(port):
    """{(metric, engine, hw_id): value} of the collector's /metrics, and the incomplete counts."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("fusebox_kv_cache_") or s.name.startswith("fusebox_collector_"):
                out[(s.name, s.labels.get("engine"), s.labels.get("hw_id") or s.labels.get("reason"))] = s.value
    return out


def test_kv_discover_follows_engine_pods_as_they_come_and_go(tmp_path):
    cp = ControlPlane(tmp_path / "kube").start()
    from kubernetes import client, config

    core = client.CoreV1Api(config.new_client_from_config(config_file=str(cp.kubeconfig)))
    engines = {"tiny": Engine("127.0.0.21", (FIX / "hardware-aware-router_vllm-v1_tinyllama-1.1b_idle_2025-11.txt").read_text()),
               "sgl": Engine("127.0.0.22", (FIX / "datadog_sglang_metrics_fixture_v0.5.10.post1.txt").read_text()),
               "odd": Engine("127.0.0.23", (FIX / "datadog_vllm_metrics_fixture_opt-125m.txt").read_text()
                             .replace("facebook/opt-125m", "org/unlisted-7b"))}
    sock = str(tmp_path / "kubelet.sock")
    kubelet = FakeKubelet(sock, answer({
        ("inference", "tiny"): [("nvidia.com/gpu", ["GPU-aaaa", "GPU-bbbb"])],
        ("inference", "sgl"): [("nvidia.com/mig-1g.10gb", ["MIG-1111"])],
        ("inference", "odd"): [("nvidia.com/gpu", ["GPU-cccc"])]}))
    (tmp_path / "engines.yaml").write_text(ENGINES)
    mport = free_port()
    proc = None
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="inference")))
        # no controller manager here to make the namespace's default service account pods need
        core.create_namespaced_service_account("inference", client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name="default")))

        def run_pod(name, node="node-a", labels=None):
            e = engines[name] if name in engines else engines["tiny"]
            core.create_namespaced_pod("inference", _pod(name, node, e.port, labels))
            core.patch_namespaced_pod_status(name, "inference", {"status": {
                "phase": "Running", "podIP": e.ip, "podIPs": [{"ip": e.ip}]}})

        run_pod("tiny")
        run_pod("odd")
        run_pod("elsewhere", node="node-b")  # another node's engine: not this collector's
        run_pod("not-an-engine", labels={"app.kubernetes.io/name": "web"})
        core.create_namespaced_pod("inference", _pod("pending", "node-a", 8000))  # no IP yet
        log = (tmp_path / "collector.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "fusebox.cli", "collect", "kv", "--discover", str(tmp_path / "engines.yaml"),
             "--node-name", "node-a", "--kubeconfig", str(cp.kubeconfig), "--pod-resources-socket", sock,
             "--no-otlp", "--metrics-port", str(mport), "--interval", str(INTERVAL_S)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

        def alive():
            assert proc.poll() is None, (tmp_path / "collector.log").read_text()

        def why():
            return (tmp_path / "collector.log").read_text()[-3000:]

        got = wait_until(lambda: (k := _kv(mport)) and ("fusebox_kv_cache_limit_bytes", "inference/tiny", "GPU-aaaa") in k
                         and k, 60, "the first pod's KV bytes", alive=alive, why=why)
        # tp 2 over the two GPUs the kubelet names: half the pool on each, usage 0 (an idle engine)
        assert got[("fusebox_kv_cache_limit_bytes", "inference/tiny", "GPU-aaaa")] == TINY_POOL / 2
        assert got[("fusebox_kv_cache_limit_bytes", "inference/tiny", "GPU-bbbb")] == TINY_POOL / 2
        assert got[("fusebox_kv_cache_usage_bytes", "inference/tiny", "GPU-aaaa")] == 0
        assert {e for (_n, e, _h) in got if _n.startswith("fusebox_kv_cache_")} == {"inference/tiny"}
        # another node's pod and a pod outside the selector are not this collector's, in no series
        assert not {e for (_n, e, _h) in got} & {"inference/elsewhere", "inference/not-an-engine"}
        # the unknown model counted and no bytes for it; the pod without an IP counted
        assert got[("fusebox_collector_kv_incomplete_total", "inference/odd", "unknown_model")] >= 1
        assert got[("fusebox_collector_discovery_skipped_total", "inference/pending", "no_pod_ip")] >= 1

        # a new engine pod: its bytes within one round of its IP being set
        run_pod("sgl")
        t0 = time.monotonic()
        got = wait_until(lambda: (k := _kv(mport)) and ("fusebox_kv_cache_limit_bytes", "inference/sgl", "MIG-1111") in k
                         and k, 10, "the new pod's KV bytes", step=0.1, alive=alive, why=why)
        appeared = time.monotonic() - t0
        assert got[("fusebox_kv_cache_limit_bytes", "inference/sgl", "MIG-1111")] == SGL_POOL
        assert got[("fusebox_kv_cache_usage_bytes", "inference/sgl", "MIG-1111")] == 0.25 * SGL_POOL
        assert appeared <= 2 * INTERVAL_S + 1, f"the new pod took {appeared:.1f} s (rounds every {INTERVAL_S:g} s)"

        # deleted (graceful: with no kubelet the object stays, terminating): its series leave at once
        core.delete_namespaced_pod("tiny", "inference")
        t0 = time.monotonic()
        wait_until(lambda: (k := _kv(mport)) is not None and not any(e == "inference/tiny" for (_n, e, _h) in k),
                   10, "the deleted pod's series to leave", step=0.1, alive=alive, why=why)
        gone = time.monotonic() - t0
        assert gone <= 2 * INTERVAL_S + 1, f"the deleted pod's series stayed {gone:.1f} s"
        k = _kv(mport)
        assert ("fusebox_kv_cache_limit_bytes", "inference/sgl", "MIG-1111") in k
        print(f"new pod's KV bytes after {appeared:.2f} s, deleted pod's gone after {gone:.2f} s "
              f"(rounds every {INTERVAL_S:g} s)")
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        kubelet.stop()
        for e in engines.values():
            e.close()
        cp.close()
