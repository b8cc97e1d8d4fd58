"""Engine discovery without a cluster: the engines file, pods -> targets, KV bytes and alignment
latency per discovered pod, and what a pod that goes away takes with it. The engines' /metrics
are the corpus dumps; expected bytes worked out by hand from their cache_config_info / SGLang
token counts and the geometry the engines file gives."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from kubernetes.client import ApiException, V1Container, V1ContainerPort, V1ObjectMeta, V1Pod, V1PodSpec, V1PodStatus
from prometheus_client.parser import text_string_to_metric_families

from fusebox.collectors import cli as collect_cli
from fusebox.collectors.discover import DiscoveredKv, DiscoveredLatency, Discovery, metrics_url
from fusebox.collectors.engines import EnginesConfigError, load_engines_config
from fusebox.collectors.export import Pipeline
from fusebox.collectors.kvcache import KvCollector
from fusebox.collectors.latency import EngineHistogramFallback, record_alignment, spec_buckets
from fusebox.collectors.podresources import PodDevices
from fusebox.collectors.podwatch import PodInfo, PodWatcher, pod_info

ROOT = Path(__file__).resolve().parents[2]
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "collectors"
TINYLLAMA = FIX / "hardware-aware-router_vllm-v1_tinyllama-1.1b_idle_2025-11.txt"
SGLANG = FIX / "datadog_sglang_metrics_fixture_v0.5.10.post1.txt"
VLLM_OPT = FIX / "datadog_vllm_metrics_fixture_opt-125m.txt"
# TinyLlama-1.1B: 22 layers, 4 KV heads, head 2048/32 = 64, bfloat16 -> 2 x 22 x 4 x 64 x 2 = 22528 B/token;
# its dump: cache_config_info num_gpu_blocks 6971 x block_size 16 tokens, kv_cache_usage_perc 0
TINY_BPT = 2 * 22 * 4 * 64 * 2
TINY_POOL = 6971 * 16 * TINY_BPT  # 2,512,683,008 B
# opt-125m: 12 layers, 12 KV heads, head 64, float16 -> 36864 B/token; SGLang dump: max_total_num_tokens 430839,
# token_usage 0.25
OPT_BPT = 2 * 12 * 12 * 64 * 2
ENGINES = """\
namespaces: [inference]
selector: {app.kubernetes.io/name: vllm}
port: http
path: /metrics
models:
  TinyLlama/TinyLlama-1.1B-Chat-v1.0: {layers: 22, kv_heads: 4, head_dim: 64, dtype_bytes: 2}
  facebook/opt-125m: {layers: 12, kv_heads: 12, head_dim: 64, dtype_bytes: 2}
"""


def engines_file(tmp_path, text=ENGINES):
    p = tmp_path / "engines.yaml"
    p.write_text(text)
    return p


# ------------------------------------------------------------------ the engines file
def test_engines_file_gives_selector_port_and_geometry(tmp_path):
    cfg = load_engines_config(engines_file(tmp_path))
    assert cfg.namespaces == ("inference",)
    assert cfg.label_selector == "app.kubernetes.io/name=vllm"
    assert (cfg.port, cfg.path) == ("http", "/metrics")
    assert cfg.models["TinyLlama/TinyLlama-1.1B-Chat-v1.0"].bytes_per_token == TINY_BPT
    assert cfg.models["facebook/opt-125m"].bytes_per_token == OPT_BPT


@pytest.mark.parametrize("text, where, words", [
    (ENGINES.replace("path: /metrics", "paht: /metrics"), ":4:", ("unknown key 'paht'", "did you mean 'path'")),
    (ENGINES.replace("kv_heads: 4,", "kv_heads: 4.5,"), ":6:", ("kv_heads",)),
    (ENGINES.replace("layers: 12,", "layers: 0,"), ":7:", ("layers", "greater than or equal to 1")),
    (ENGINES.replace("port: http\n", ""), ":1:", ("missing required key 'port'",)),
    (ENGINES.replace("{app.kubernetes.io/name: vllm}", "[vllm]"), ":2:", ("selector",)),
    # in the engines file's own terms: an empty file is not "the spec", a port out of range not
    # "not a string"; an empty selector refused as kubernetes.engines refuses it (every pod scraped)
    ("", ":1:1:", ("the engines file is empty", "fusebox generate")),
    ("# nothing but a comment\n", ":1:1:", ("the engines file is empty",)),
    (ENGINES.replace("port: http", "port: 99999"), ":3:7:", ("port 99999 is out of range", "1 to 65535")),
    (ENGINES.replace("port: http", "port: 0"), ":3:7:", ("port 0 is out of range",)),
    (ENGINES.replace("{app.kubernetes.io/name: vllm}", "{}"), ":2:11:", ("selector is empty", "every pod")),
])
def test_a_bad_engines_file_is_refused_at_its_line(tmp_path, text, where, words):
    p = engines_file(tmp_path, text)
    with pytest.raises(EnginesConfigError) as e:
        load_engines_config(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}{where}"), msg
    assert all(w in msg for w in words), msg
    assert " -- " in msg  # says how to fix it
    assert "the spec" not in msg and "constrained-" not in msg, msg


def test_a_missing_engines_file_says_what_to_pass(tmp_path):
    with pytest.raises(EnginesConfigError, match="no such file.*--discover FILE"):
        load_engines_config(tmp_path / "nope.yaml")


# ------------------------------------------------------------------ pods -> targets
def pod(name, ip="10.0.0.1", phase="Running", port=8000, ns="inference", deleting=False, uid=None):
    return PodInfo(ns, name, uid or f"uid-{name}", phase, ip, deleting, {"http": port} if port else {})


class Pods:
    """What Discovery asks of a PodWatcher, set by the test."""

    def __init__(self, *pods):
        self.w = PodWatcher(api=None, node="n1")
        self.w.replace("", pods)
        self.errors = Counter()

    def engines(self):
        return self.w.engines()

    def without_ip(self):
        return self.w.without_ip()


def test_metrics_url_resolves_a_named_port_a_number_and_ipv6():
    assert metrics_url(pod("a", port=8000), "http", "/metrics") == "http://10.0.0.1:8000/metrics"
    assert metrics_url(pod("a", port=8000), 9400, "/m") == "http://10.0.0.1:9400/m"
    assert metrics_url(pod("a", ip="fd00::5"), "http", "/metrics") == "http://[fd00::5]:8000/metrics"
    assert metrics_url(pod("a", port=None), "http", "/metrics") is None


def test_targets_count_pods_without_ip_port_or_room_and_forget_pods_that_left(tmp_path):
    cfg = load_engines_config(engines_file(tmp_path))
    pods = Pods(pod("a"), pod("b", ip="10.0.0.2"), pod("c", ip="10.0.0.3"), pod("noip", ip="", phase="Pending"),
                pod("noport", ip="10.0.0.4", port=None), pod("leaving", ip="10.0.0.5", deleting=True),
                pod("done", ip="10.0.0.6", phase="Succeeded"))
    devs = {("inference", "a"): PodDevices(("GPU-a",)), ("inference", "b"): PodDevices((), ("MIG-b",))}
    disc = Discovery(cfg, pods, devices=lambda: devs, max_engines=2)
    ts = disc.targets()
    assert [(t.engine, t.url, t.hw_ids) for t in ts] == [
        ("inference/a", "http://10.0.0.1:8000/metrics", ("GPU-a",)),
        ("inference/b", "http://10.0.0.2:8000/metrics", ("MIG-b",)),
    ]
    assert dict(disc.skipped) == {("inference/noip", "no_pod_ip"): 1, ("inference/noport", "no_port"): 1,
                                  ("inference/c", "over_cap"): 1}
    # the kubelet stops answering: a pod's devices are the last ones it named
    devs_now = [None]
    disc.devices = lambda: devs_now[0]
    assert [t.hw_ids for t in disc.targets()] == [("GPU-a",), ("MIG-b",)]
    # c and noip go away: their counts go with them
    pods.w.replace("", [pod("a"), pod("b", ip="10.0.0.2"), pod("noport", ip="10.0.0.4", port=None)])
    disc.targets()
    assert dict(disc.skipped) == {("inference/noport", "no_port"): 3}


def test_watcher_keeps_running_pods_with_an_ip_and_applies_events():
    def v1pod(name, phase="Running", ip="10.1.0.1", deleting=False):
        return V1Pod(metadata=V1ObjectMeta(name=name, namespace="ns", uid=f"u-{name}",
                                           deletion_timestamp="2026-01-01T00:00:00Z" if deleting else None),
                     spec=V1PodSpec(containers=[V1Container(name="e", ports=[V1ContainerPort(container_port=8000,
                                                                                             name="http")])]),
                     status=V1PodStatus(phase=phase, pod_ip=ip))

    w = PodWatcher(api=None, node="n1", namespaces=["ns"])
    w.replace("ns", [pod_info(v1pod("a")), pod_info(v1pod("b", phase="Pending", ip=None))])
    assert [p.name for p in w.engines()] == ["a"] and [p.name for p in w.without_ip()] == ["b"]
    assert w.engines()[0].ports == {"http": 8000}
    w.apply("MODIFIED", pod_info(v1pod("b")))
    w.apply("ADDED", pod_info(v1pod("c")))
    assert [p.name for p in w.engines()] == ["a", "b", "c"]
    w.apply("MODIFIED", pod_info(v1pod("a", deleting=True)))  # graceful deletion begun: leaving now
    w.apply("DELETED", pod_info(v1pod("c")))
    assert [p.name for p in w.engines()] == ["b"]


def test_watcher_lists_again_on_410_and_backs_off_on_errors(monkeypatch):
    w = PodWatcher(api=None, node="n1", namespaces=["ns"])
    lists, waits = [], []
    steps = iter([ApiException(status=410, reason="Expired"), ConnectionError("api server down"), "stop"])

    def fake_list(scope):
        lists.append(scope)
        return str(len(lists))

    def fake_watch(scope, rv):
        step = next(steps)
        if step == "stop":
            w._stop.set()
            return rv
        raise step

    monkeypatch.setattr(w, "_list", fake_list)
    monkeypatch.setattr(w, "_watch", fake_watch)
    monkeypatch.setattr(w._stop, "wait", lambda s: waits.append(s) or False)
    w._run("ns")
    assert lists == ["ns", "ns", "ns"]  # at start, after the 410 (at once), after the error (after 1 s)
    assert waits == [1.0]
    assert dict(w.errors) == {"expired": 1, "watch_error": 1}


@pytest.mark.parametrize("error, fix", [
    (ApiException(status=403, reason="Forbidden"), "get, list and watch on pods"),
    (ApiException(status=401, reason="Unauthorized"), "service account token"),
    (ConnectionError("Connection refused"), "reach the Kubernetes API"),
])
def test_a_failing_pod_list_says_how_to_fix_it(monkeypatch, error, fix):
    said = []
    w = PodWatcher(api=None, node="n1", namespaces=["inference"], log=said.append)

    def fake_list(scope):
        raise error

    monkeypatch.setattr(w, "_list", fake_list)
    monkeypatch.setattr(w._stop, "wait", lambda s: True)  # stopped during the backoff: one round
    w._run("inference")
    assert dict(w.errors) == {"list_error": 1}
    (msg,) = said
    assert " -- " in msg and fix in msg.split(" -- ", 1)[1], msg


def test_a_watch_broken_by_stop_is_no_error(monkeypatch):
    # stop() closes the watch's connection under its stream (--once ends so, and SIGTERM): the
    # stream's error then is the shutdown itself, neither counted nor said
    said = []
    w = PodWatcher(api=None, node="n1", namespaces=["ns"], log=said.append)
    monkeypatch.setattr(w, "_list", lambda scope: "1")

    def fake_watch(scope, rv):
        w._stop.set()  # what stop() does while the stream reads
        raise ConnectionError("Response ended prematurely")

    monkeypatch.setattr(w, "_watch", fake_watch)
    w._run("ns")
    assert dict(w.errors) == {} and said == [], (dict(w.errors), said)


# ------------------------------------------------------------------ KV bytes per discovered pod
def _kv(tmp_path, pods, devs, pages):
    cfg = load_engines_config(engines_file(tmp_path))
    disc = Discovery(cfg, pods, devices=lambda: devs)
    return DiscoveredKv(disc, lambda url: KvCollector([url], None, models=cfg.models,
                                                      fetch=lambda ep, _t: pages[ep]))


def _by(readings):
    return {(r.key, r.attrs["engine"], r.attrs.get("hw.id")): r.value for r in readings}


def test_discovered_engines_get_bytes_from_their_model_gpus_from_the_kubelet(tmp_path):
    pages = {"http://10.0.0.1:8000/metrics": TINYLLAMA.read_text(), "http://10.0.0.2:8000/metrics": SGLANG.read_text(),
             "http://10.0.0.3:8000/metrics": VLLM_OPT.read_text().replace("facebook/opt-125m", "org/unlisted-7b")}
    pods = Pods(pod("tiny"), pod("sgl", ip="10.0.0.2"), pod("other", ip="10.0.0.3"))
    devs = {("inference", "tiny"): PodDevices(("GPU-1", "GPU-2")), ("inference", "sgl"): PodDevices((), ("MIG-9",))}
    kv = _kv(tmp_path, pods, devs, pages)
    got = _by(kv.collect())
    assert got == {
        # tp 2: the pool split evenly over the pod's two GPUs
        ("kv_cache_limit", "inference/tiny", "GPU-1"): TINY_POOL / 2, ("kv_cache_usage", "inference/tiny", "GPU-1"): 0,
        ("kv_cache_limit", "inference/tiny", "GPU-2"): TINY_POOL / 2, ("kv_cache_usage", "inference/tiny", "GPU-2"): 0,
        ("kv_cache_limit", "inference/sgl", "MIG-9"): 430839 * OPT_BPT,
        ("kv_cache_usage", "inference/sgl", "MIG-9"): 0.25 * 430839 * OPT_BPT,
    }
    inc = {(a["engine"], a["reason"]): n for a, n in kv.incomplete_readings()}
    assert inc == {("inference/other", "unknown_model"): 1}  # counted, no bytes guessed
    kv.collect()
    assert {(a["engine"], a["reason"]): n for a, n in kv.incomplete_readings()} == {("inference/other", "unknown_model"): 2}
    # the unknown-model pod is deleted, the SGLang one loses its GPU in the kubelet's answer
    pods.w.replace("", [pod("tiny"), pod("sgl", ip="10.0.0.2")])
    del devs[("inference", "sgl")]
    got = _by(kv.collect())
    assert {k[1] for k in got} == {"inference/tiny", "inference/sgl"}
    assert ("kv_cache_limit", "inference/sgl", None) in got  # no hw_id, and said why:
    assert {(a["engine"], a["reason"]) for a, n in kv.incomplete_readings()} == {("inference/sgl", "no_gpu")}


def test_a_deleted_pods_series_leave_the_next_exposition(tmp_path):
    pages = {"http://10.0.0.1:8000/metrics": TINYLLAMA.read_text(),
             "http://10.0.0.3:8000/metrics": VLLM_OPT.read_text().replace("facebook/opt-125m", "org/unlisted-7b")}
    pods = Pods(pod("tiny"), pod("other", ip="10.0.0.3"))
    kv = _kv(tmp_path, pods, {("inference", "tiny"): PodDevices(("GPU-1",))}, pages)
    pipe = Pipeline("kv", ("kv_cache_usage", "kv_cache_limit"), host="h")

    def round_text():
        pipe.set_readings(kv.collect())
        pipe.set_incomplete(kv.incomplete_readings())
        pipe.set_errors(kv.error_readings())
        return {(s.name, s.labels.get("engine")) for f in text_string_to_metric_families(pipe.prometheus_text())
                for s in f.samples}

    first = round_text()
    assert ("fusebox_kv_cache_limit_bytes", "inference/tiny") in first
    assert ("fusebox_collector_kv_incomplete_total", "inference/other") in first
    pods.w.replace("", [pod("other", ip="10.0.0.3")])
    second = round_text()
    assert not any(e == "inference/tiny" for _n, e in second)
    pods.w.replace("", [])
    assert not any(e for _n, e in round_text())


# ------------------------------------------------------------------ point 2: what alignment latency measures
def _ttft_page(counts, name="vllm:time_to_first_token_seconds", model="m"):
    out = f"# TYPE {name} histogram\n"
    for le, c in zip(("0.5", "1.0", "+Inf"), counts, strict=True):
        out += f'{name}_bucket{{le="{le}",model_name="{model}"}} {c}\n'
    return out + f'{name}_count{{model_name="{model}"}} {counts[-1]}\n{name}_sum{{model_name="{model}"}} 1\n'


def _sources(pipe):
    return {(s.labels["engine"], s.labels.get("source")): s.value
            for f in text_string_to_metric_families(pipe.prometheus_text()) for s in f.samples
            if s.name == "fusebox_alignment_duration_seconds_count"}


def test_alignment_says_handoff_encoder_or_ttft_and_reads_encoder_timings_first():
    pipe = Pipeline("latency", (), histogram_buckets=spec_buckets(ROOT / "fusebox.yaml"), host="h")
    record_alignment(0.4, engine="timed", model="m", meter=pipe.meter)
    ttft = iter([_ttft_page((0, 0, 0)), _ttft_page((3, 3, 3))])
    fb = EngineHistogramFallback(pipe.alignment, engine="stock", fetch=lambda _e, _t: next(ttft))
    fb.poll(), fb.poll()
    enc = "vllm:mm_encoder_time_seconds"  # an engine that publishes its encoder stage: read before TTFT
    both = iter([_ttft_page((0, 0, 0)) + _ttft_page((0, 0, 0), name=enc),
                 _ttft_page((9, 9, 9)) + _ttft_page((2, 2, 2), name=enc)])
    fb2 = EngineHistogramFallback(pipe.alignment, engine="enc", fetch=lambda _e, _t: next(both), encoder_metrics=[enc])
    fb2.poll(), fb2.poll()
    assert fb2.source == enc
    assert _sources(pipe) == {("timed", "handoff"): 1, ("stock", "ttft"): 3, ("enc", "encoder"): 2}


def test_discovered_latency_drops_a_deleted_pods_histogram(tmp_path):
    cfg = load_engines_config(engines_file(tmp_path))
    pods = Pods(pod("a"), pod("b", ip="10.0.0.2"))
    pages = {u: iter([_ttft_page((0, 0, 0)), _ttft_page((4, 4, 4)), _ttft_page((4, 4, 4))])
             for u in ("http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics")}
    pipe = Pipeline("latency", (), histogram_buckets=spec_buckets(ROOT / "fusebox.yaml"), host="h")
    lat = DiscoveredLatency(Discovery(cfg, pods),
                            lambda engine, url: EngineHistogramFallback(pipe.alignment, engine=engine, endpoint=url,
                                                                        fetch=lambda ep, _t: next(pages[ep])),
                            pipe.forget_alignment)
    lat.poll(), lat.poll()
    assert _sources(pipe) == {("inference/a", "ttft"): 4, ("inference/b", "ttft"): 4}
    pods.w.replace("", [pod("b", ip="10.0.0.2")])
    lat.poll()
    assert _sources(pipe) == {("inference/b", "ttft"): 4}


# ------------------------------------------------------------------ the command line
@pytest.mark.parametrize("argv, words", [
    (["kv", "--discover", "e.yaml", "--node-name", "n", "--endpoint", "http://x/metrics"], "drop --endpoint"),
    (["kv", "--discover", "e.yaml", "--gpu", "GPU-1", "--node-name", "n"], "drop --gpu"),
    (["kv", "--discover", "e.yaml"], "needs --node-name"),
    (["kv", "--model-config", "c.json"], "required: --endpoint"),
    (["latency", "--discover", "e.yaml", "--node-name", "n", "--engine-id", "x"], "drop --engine-id"),
    (["latency", "--endpoint", "http://x/metrics"], "required: --engine-id"),
])
def test_discover_and_hand_named_engines_exclude_each_other(argv, words, capsys):
    from fusebox.cli import main

    with pytest.raises(SystemExit) as e:
        main(["collect", *argv])
    assert e.value.code == 2
    assert words in capsys.readouterr().err


def test_latency_discover_once_says_what_to_do_without_naming_a_test_flag(tmp_path, capsys):
    from fusebox.cli import main

    argv = ["collect", "latency", "--once", "--discover", str(engines_file(tmp_path)), "--node-name", "n"]
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    what, fix = err.split(" -- ", 1)
    assert "--once" in what and "--discover" in what, err
    assert "--metrics-port" in fix and "--rounds" not in err, err


def test_discover_with_a_bad_engines_file_exits_2_at_its_line(tmp_path, capsys):
    p = engines_file(tmp_path, ENGINES.replace("port: http", "prot: http"))
    from fusebox.cli import main

    assert main(["collect", "kv", "--discover", str(p), "--node-name", "n", "--once"]) == 2
    assert f"{p}:3:1: unknown key 'prot'" in capsys.readouterr().err
    assert collect_cli  # the module wires both commands
