"""The collectors where a cluster runs them: defaults from the environment the DaemonSet sets
(node name, pod IP, cluster), and `collect latency --once` on a real capture."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from fusebox.conventions import ENV
from fusebox.tooling import free_port

ROOT = Path(__file__).resolve().parents[2]
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "collectors"
VLLM_V0 = FIX / "datadog_vllm_metrics_fixture_opt-125m_v0-only_2024.txt"
NO_HISTOGRAMS = FIX / "bsc_patched-vllm-0.6.1_llama-2-13b_gauges_only.txt"


def _fusebox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ENV.values()} | (env or {})
    return subprocess.run([sys.executable, "-m", "fusebox.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, env=full)


def test_host_name_and_cluster_default_from_the_environment():
    kv = ("collect", "kv", "--endpoint", str(VLLM_V0), "--model-config", str(FIX / "opt-125m_config.json"),
          "--gpu", "GPU-1", "--once")
    r = _fusebox(*kv, env={ENV["host_name"]: "gpu-node-7", ENV["cluster"]: "prod-a"})
    assert r.returncode == 0, r.stderr
    assert 'fusebox_kv_cache_limit_bytes{cluster="prod-a",engine="facebook/opt-125m",host_name="gpu-node-7",' in r.stdout
    # the flags still win over the environment
    r = _fusebox(*kv, "--host-name", "explicit", env={ENV["host_name"]: "gpu-node-7"})
    assert 'host_name="explicit"' in r.stdout and "gpu-node-7" not in r.stdout


def test_help_names_the_environment_variables():
    r = _fusebox("collect", "kv", "--help")
    flat = " ".join(r.stdout.split())
    for var in ENV.values():
        assert f"${var}" in flat


def test_metrics_are_served_on_the_address_from_the_environment():
    addr = "127.0.0.2"  # a loopback address other than the default 127.0.0.1: the pod IP's stand-in
    port = free_port(addr)
    env = {k: v for k, v in os.environ.items() if k not in ENV.values()} | {ENV["metrics_addr"]: addr}
    p = subprocess.Popen([sys.executable, "-m", "fusebox.cli", "collect", "gpu", "--replay",
                          str(FIX / "netdata_tesla-p100_nvidia-smi-q-x.xml"), "--no-otlp", "--metrics-port", str(port),
                          "--interval", "0.2"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                body = urllib.request.urlopen(f"http://{addr}:{port}/metrics", timeout=2).read().decode()
                break
            except OSError:
                assert p.poll() is None, p.stderr.read().decode() if p.stderr else ""
                assert time.monotonic() < deadline, "no /metrics on the address from the environment"
                time.sleep(0.2)
        assert "hw_gpu_memory_limit_bytes{" in body
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_latency_once_prints_what_the_engine_counted_since_it_started():
    # the capture: one time-to-first-token observation, in vLLM's bucket (0.25, 0.5]; the spec's
    # buckets have 0.25 and 0.5 too, so it lands in le="0.5" and every bucket above
    r = _fusebox("collect", "latency", "--endpoint", str(VLLM_V0), "--engine-id", "llava-decoder-0", "--once",
                 "--host-name", "n1")
    assert r.returncode == 0, r.stderr
    assert "derived from vllm:time_to_first_token_seconds: 1 observation(s)" in r.stdout
    # source="ttft": what the stand-in measures (time to first token, not the hand-off itself)
    series = 'engine="llava-decoder-0",host_name="n1",le="{}",model="facebook/opt-125m",source="ttft"'
    assert f"fusebox_alignment_duration_seconds_bucket{{{series.format('0.25')}}} 0.0" in r.stdout
    assert f"fusebox_alignment_duration_seconds_bucket{{{series.format('0.5')}}} 1.0" in r.stdout
    assert f"fusebox_alignment_duration_seconds_bucket{{{series.format('+Inf')}}} 1.0" in r.stdout


def test_latency_once_without_a_histogram_exits_1_with_the_reason():
    r = _fusebox("collect", "latency", "--endpoint", str(NO_HISTOGRAMS), "--engine-id", "e", "--once")
    assert r.returncode == 1
    assert "no histogram vllm:time_to_first_token_seconds" in r.stderr and "--metric" in r.stderr
    assert "Traceback" not in r.stderr


def test_latency_once_on_an_unreachable_endpoint_exits_1_with_the_reason():
    url = f"http://127.0.0.1:{free_port()}/metrics"
    r = _fusebox("collect", "latency", "--endpoint", url, "--engine-id", "e", "--once", "--timeout", "2")
    assert r.returncode == 1
    assert f"cannot read {url}" in r.stderr and "Traceback" not in r.stderr
