"""KV-cache collector on the corpus /metrics dumps and model configs; expected bytes worked
out by hand from the config fields (2 x layers x KV heads x head dim x dtype bytes)."""

from __future__ import annotations

import http.server
import json
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusebox.collectors.kvcache import ConfigError, KvCollector, KvGeometry, MalformedMetrics, engines_from_text, kv_geometry, load_model_config

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "collectors"
OPT_BPT = 2 * 12 * 12 * (768 // 12) * 2  # opt-125m: 12 layers, 12 heads (MHA), head 64, float16 = 36864
OPT_POOL = 7281 * 16 * OPT_BPT  # cache_config_info: num_gpu_blocks 7281, block_size 16 -> 4,294,508,544 B
VLLM_NEW = FIX / "datadog_vllm_metrics_fixture_opt-125m.txt"  # carries both KV names
VLLM_OLD = FIX / "datadog_vllm_metrics_fixture_opt-125m_v0-only_2024.txt"


def opt_geometry(**kw):
    return kv_geometry(load_model_config(FIX / "opt-125m_config.json"), **kw)


def readings(col):
    out = {}
    for r in col.collect():
        out[(r.key, r.attrs.get("hw.id"))] = r
    return out


def from_texts(texts, geo=None, **kw):
    texts = list(texts)
    eps = [f"mem://{i}" for i in range(len(texts))]
    return KvCollector(eps, geo or opt_geometry(), fetch=lambda ep, _t: texts[int(ep.split("//")[1])], **kw)


@pytest.mark.parametrize(
    "name, expected",
    [
        # Qwen2.5-VL-7B: top level, 28 layers, 4 KV heads, head 3584/28 = 128, bfloat16
        ("Qwen2.5-VL-7B-Instruct_config.json", 2 * 28 * 4 * 128 * 2),  # 57344
        # Llama-3.2-90B-Vision: text_config, 100 layers minus 20 cross-attention, 8 KV heads, 8192/64 = 128, bf16
        ("Llama-3.2-90B-Vision-Instruct_config.json", 2 * 80 * 8 * 128 * 2),  # 327680
        # llava-v1.5-7b: flat Llama, 32 layers, 32 KV heads, 4096/32 = 128, float16
        ("llava-v1.5-7b_config.json", 2 * 32 * 32 * 128 * 2),  # 524288
        # llava-1.5-7b-hf: text_config without geometry -> LlamaConfig defaults (32, 32, 4096), float16
        ("llava-1.5-7b-hf_config.json", 2 * 32 * 32 * 128 * 2),
        # InternVL2-1B: llm_config (qwen2), 24 layers, 2 KV heads, 896/14 = 64, bfloat16
        ("InternVL2-1B_config.json", 2 * 24 * 2 * 64 * 2),  # 12288
        # LFM2.5-VL-1.6B: `dtype`, hybrid: 6 of 16 layer_types are full_attention, 8 KV heads, 2048/32 = 64
        ("LFM2.5-VL-1.6B_config.json", 2 * 6 * 8 * 64 * 2),  # 12288
        ("opt-125m_config.json", OPT_BPT),
    ],
)
def test_bytes_per_token_of_each_model_config(name, expected):
    assert kv_geometry(load_model_config(FIX / name), source=name).bytes_per_token == expected


# transformers' published config defaults, read from huggingface/transformers
# src/transformers/models/<type>/configuration_<type>.py (layers, heads, KV heads, hidden):
#   llama (LlamaConfig): 32, 32, None -> heads = 32, 4096 -> head 128
#   mistral (MistralConfig): 32, 32, 8, 4096 -> head 128
#   qwen2 (Qwen2Config): 32, 32, 32, 4096 -> head 128
#   qwen2_vl_text (Qwen2VLTextConfig, qwen2_vl/): 80, 64, 8, 8192 -> head 128
#   qwen2_5_vl_text (Qwen2_5_VLTextConfig, qwen2_5_vl/): 80, 64, 8, 8192 -> head 128
DEFAULTS_BPT_BF16 = {
    "llama": 2 * 32 * 32 * 128 * 2,  # 524,288
    "mistral": 2 * 32 * 8 * 128 * 2,  # 131,072
    "qwen2": 2 * 32 * 32 * 128 * 2,  # 524,288 (not Qwen2-72B's 327,680)
    "qwen2_vl_text": 2 * 80 * 8 * 128 * 2,  # 327,680
    "qwen2_5_vl_text": 2 * 80 * 8 * 128 * 2,  # 327,680
}


@pytest.mark.parametrize("model_type, expected", sorted(DEFAULTS_BPT_BF16.items()))
def test_a_sub_config_without_geometry_gets_the_transformers_defaults(model_type, expected):
    # serialised sub-configs drop values equal to their class defaults
    cfg = {"model_type": "wrapper", "text_config": {"model_type": model_type, "torch_dtype": "bfloat16"}}
    assert kv_geometry(cfg).bytes_per_token == expected


def test_every_model_type_defaults_entry_is_tested():
    from fusebox.collectors.kvcache import _MODEL_DEFAULTS

    assert set(_MODEL_DEFAULTS) == set(DEFAULTS_BPT_BF16)


def test_fp8_kv_dtype_halves_bytes_per_token():
    assert opt_geometry(kv_dtype="fp8").bytes_per_token == 2 * 12 * 12 * 64 * 1


def test_a_config_without_geometry_or_dtype_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        kv_geometry({"model_type": "mystery", "torch_dtype": "float16"})
    with pytest.raises(ConfigError, match="--kv-dtype"):
        kv_geometry({"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8})
    bad = tmp_path / "config.json"
    bad.write_text('{"a": 1,\n "b": }')
    with pytest.raises(ConfigError, match=r"config.json:2:\d+: invalid JSON"):
        load_model_config(bad)


def test_opt125m_vllm_dump_kv_bytes():
    col = KvCollector([str(VLLM_OLD)], opt_geometry())
    r = readings(col)
    assert r[("kv_cache_limit", None)].value == OPT_POOL == 4_294_508_544
    assert r[("kv_cache_usage", None)].value == 0.0  # gpu_cache_usage_perc 0.0 in the capture
    assert r[("kv_cache_usage", None)].attrs["model"] == "facebook/opt-125m"


def test_a_dump_with_both_vllm_names_is_one_series_never_their_sum():
    text = VLLM_NEW.read_text()
    assert "vllm:gpu_cache_usage_perc" in text and "vllm:kv_cache_usage_perc" in text
    text = text.replace('vllm:kv_cache_usage_perc{model_name="facebook/opt-125m"} 0.0',
                        'vllm:kv_cache_usage_perc{model_name="facebook/opt-125m"} 0.25')
    text = text.replace('vllm:gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.0',
                        'vllm:gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.25')
    engines = engines_from_text(text)
    assert len(engines) == 1 and engines[0].source_metric == "vllm:kv_cache_usage_perc"
    usage = [r for r in from_texts([text]).collect() if r.key == "kv_cache_usage"]
    assert [u.value for u in usage] == [0.25 * OPT_POOL]


def test_api_server_processes_of_one_engine_take_the_max():
    base = VLLM_OLD.read_text()
    a = base.replace('vllm:gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.0',
                     'vllm:gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.1')
    b = base.replace('vllm:gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.0',
                     'vllm:gpu_cache_usage_perc{model_name="facebook/opt-125m"} 0.3')
    usage = [r.value for r in from_texts([a, b]).collect() if r.key == "kv_cache_usage"]
    assert usage == [pytest.approx(0.3 * OPT_POOL)]


def test_tensor_parallel_splits_the_pool_evenly_over_its_gpus():
    col = KvCollector([str(VLLM_OLD)], opt_geometry(), gpus=["GPU-a", "GPU-b"], tp=2)
    r = readings(col)
    assert r[("kv_cache_limit", "GPU-a")].value == OPT_POOL / 2
    assert r[("kv_cache_limit", "GPU-b")].value == OPT_POOL / 2
    with pytest.raises(ValueError, match="one GPU per tensor-parallel rank"):
        KvCollector([str(VLLM_OLD)], opt_geometry(), gpus=["GPU-a"], tp=2)


def test_vllm_v1_dumps_with_an_engine_label():
    # Qwen1.5-0.5B-Chat: 24 layers, 16 heads (MHA), hidden 1024 -> head 64, bfloat16 (model card values)
    geo = KvGeometry(24, 16, 64, 2)
    col = KvCollector([str(FIX / "hardware-aware-router_vllm-v1_qwen1.5-0.5b-chat_idle_2025-11.txt")], geo)
    r = readings(col)
    assert r[("kv_cache_limit", None)].value == 2452 * 16 * (2 * 24 * 16 * 64 * 2)  # num_gpu_blocks 2452
    assert r[("kv_cache_limit", None)].attrs["engine"] == "Qwen/Qwen1.5-0.5B-Chat"


def test_sglang_under_both_prefixes():
    text = (FIX / "datadog_sglang_metrics_fixture_v0.5.10.post1.txt").read_text()
    # token_usage 0.25, max_total_num_tokens 430839 (the capture's own figures; opt-125m)
    expected_usage, expected_limit = 0.25 * 430839 * OPT_BPT, 430839 * OPT_BPT
    for variant in (text, text.replace("sglang:", "sglang_")):
        r = {x.key: x.value for x in from_texts([variant]).collect()}
        assert r["kv_cache_usage"] == pytest.approx(expected_usage)
        assert r["kv_cache_limit"] == expected_limit


def test_sglang_without_capacity_derives_it_and_says_so():
    # docs sample: token_usage 0.28, num_used_tokens 123859, no max_total_num_tokens; Llama-3.1-8B
    # geometry: 32 layers, 8 KV heads, head 128, bfloat16 -> 131072 B/token
    col = from_texts([(FIX / "sglang_docs_production_metrics_example_llama-3.1-8b.txt").read_text()],
                     KvGeometry(32, 8, 128, 2))
    r = {x.key: x.value for x in col.collect()}
    assert r["kv_cache_usage"] == pytest.approx(123859 * 131072)
    assert r["kv_cache_limit"] == pytest.approx(123859 / 0.28 * 131072)
    assert any("derived" in n for n in col.notes)


def test_tgi_needs_its_capacity_from_the_command_line():
    text = (FIX / "datadog_tgi_metrics_fixture_payload.txt").read_text()
    col = from_texts([text], model="bigscience/bloom-560m")
    keys = {x.key for x in col.collect()}
    assert keys == {"kv_cache_usage"}
    assert col.incomplete[("bigscience/bloom-560m", "no_capacity")] == 1
    col = from_texts([text], max_total_tokens=16000, model="m")
    r = {x.key: x.value for x in col.collect()}
    assert r == {"kv_cache_usage": 0.0, "kv_cache_limit": 16000 * OPT_BPT}  # tgi_batch_current_max_tokens 0


def test_vllm_fp8_cache_dtype_from_cache_config_info():
    text = VLLM_OLD.read_text().replace('cache_dtype="auto"', 'cache_dtype="fp8"')
    r = {x.key: x.value for x in from_texts([text]).collect()}
    assert r["kv_cache_limit"] == 7281 * 16 * (2 * 12 * 12 * 64 * 1)


def test_down_malformed_and_empty_endpoints_are_counted_never_fatal():
    def fetch(ep, _t):
        if ep == "down":
            raise ConnectionRefusedError("refused")
        if ep == "junk":
            return 'vllm:kv_cache_usage_perc{model_name="x" 0.5\n'
        if ep == "empty":
            return "# nothing here\n"
        return VLLM_OLD.read_text()

    col = KvCollector(["down", "junk", "empty", "good"], opt_geometry(), fetch=fetch)
    rs = col.collect()
    assert {r.key for r in rs} == {"kv_cache_usage", "kv_cache_limit"}
    assert col.errors == {("down", "down"): 1, ("junk", "malformed"): 1, ("empty", "no_kv_metric"): 1}


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""
    delay = 0.0

    def do_GET(self):  # noqa: N802
        time.sleep(self.delay)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()


def test_http_endpoint_and_a_slow_one(server):
    _Handler.body = VLLM_OLD.read_bytes()
    _Handler.delay = 0.0
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    col = KvCollector([url], opt_geometry(), timeout_s=2.0)
    assert {r.key: r.value for r in col.collect()}["kv_cache_limit"] == OPT_POOL
    _Handler.delay = 1.0
    slow = KvCollector([url], opt_geometry(), timeout_s=0.2)
    assert slow.collect() == []
    assert slow.errors[(url, "timeout")] == 1


def test_cli_kv_once(capsys):
    from fusebox.cli import main

    rc = main(["collect", "kv", "--endpoint", str(VLLM_NEW), "--model-config", str(FIX / "opt-125m_config.json"),
               "--gpu", "GPU-71d1acc2-662d-2166-bf9f-65272d2fc437", "--once", "--host-name", "n1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert ('fusebox_kv_cache_limit_bytes{engine="facebook/opt-125m",host_name="n1",'
            'hw_id="GPU-71d1acc2-662d-2166-bf9f-65272d2fc437",model="facebook/opt-125m"} 4.294508544e+09') in out


def test_cli_kv_bad_config_exits_2(tmp_path, capsys):
    from fusebox.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "x"}))
    assert main(["collect", "kv", "--endpoint", str(VLLM_OLD), "--model-config", str(cfg), "--once"]) == 2
    assert "num_hidden_layers" in capsys.readouterr().err


# ------------------------------------------------------------------------- fuzz
_LINES = st.sampled_from([
    "# TYPE vllm:kv_cache_usage_perc gauge", 'vllm:kv_cache_usage_perc{model_name="m"} 0.5',
    'vllm:cache_config_info{block_size="16",num_gpu_blocks="10"} 1', 'vllm:cache_config_info{num_gpu_blocks="None"} 1',
    "sglang:token_usage 0.3", "sglang_max_total_num_tokens NaN", "tgi_batch_current_max_tokens +Inf",
    "# HELP x", "# TYPE x histogram", 'x_bucket{le="1.0"} 3', '{', '"', "x{a=\"\\\"} 1", "x 1 2 3", "",
])  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_LINES, st.text(max_size=40)), max_size=12))
def test_fuzz_no_exception_escapes_the_parser_or_the_collector(lines):
    text = "\n".join(lines)
    try:
        engines_from_text(text)
    except MalformedMetrics:
        pass
    col = KvCollector(["fuzz"], KvGeometry(2, 2, 8, 2), fetch=lambda _e, _t: text)
    for r in col.collect():
        assert r.key in ("kv_cache_usage", "kv_cache_limit")


@pytest.mark.parametrize(
    "dump, blocks, geo",
    [
        # llama-2-13b: 40 layers, 40 heads (MHA), hidden 5120 -> head 128, float16; num_gpu_blocks 2657
        ("bsc_patched-vllm-0.6.1_llama-2-13b_gauges_only.txt", 2657, KvGeometry(40, 40, 128, 2)),
        # TinyLlama-1.1B: 22 layers, 4 KV heads, hidden 2048 / 32 heads = 64, bfloat16; num_gpu_blocks 6971
        ("hardware-aware-router_vllm-v1_tinyllama-1.1b_idle_2025-11.txt", 6971, KvGeometry(22, 4, 64, 2)),
        ("datadog_vllm_metrics_fixture_opt-125m.txt", 7281, KvGeometry(12, 12, 64, 2)),
    ],
)
def test_pool_bytes_of_every_vllm_dump(dump, blocks, geo):
    r = {x.key: x.value for x in KvCollector([str(FIX / dump)], geo).collect()}
    assert r["kv_cache_limit"] == blocks * 16 * geo.bytes_per_token  # block_size 16 in every dump
    assert r["kv_cache_usage"] == 0.0  # idle captures


# ------------------------------------------------------------------------- incomplete output is said, and counted
VLLM_V1 = FIX / "hardware-aware-router_vllm-v1_qwen1.5-0.5b-chat_idle_2025-11.txt"
SGLANG_DOC = FIX / "sglang_docs_production_metrics_example_llama-3.1-8b.txt"
INCOMPLETE = "fusebox_collector_kv_incomplete_total"


def _without(tmp_path, src: Path, word: str) -> Path:
    """A real dump with every line naming ``word`` removed."""
    out = tmp_path / src.name
    out.write_text("".join(line for line in src.read_text().splitlines(keepends=True) if word not in line))
    return out


def _kv_once(capsys, *args):
    from fusebox.cli import main

    rc = main(["collect", "kv", "--model-config", str(FIX / "opt-125m_config.json"), "--once", "--host-name", "n1",
               *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_vllm_dump_without_cache_config_info_is_said_once_and_counted(tmp_path, capsys):
    dump = _without(tmp_path, VLLM_V1, "cache_config_info")
    assert "vllm:kv_cache_usage_perc{" in dump.read_text()
    rc, out, err = _kv_once(capsys, "--endpoint", str(dump), "--gpu", "GPU-1")
    assert rc == 0
    assert "fusebox_kv_cache_usage_bytes" not in out and "fusebox_kv_cache_limit_bytes" not in out
    assert f'{INCOMPLETE}{{engine="Qwen/Qwen1.5-0.5B-Chat",host_name="n1",reason="no_capacity"}} 1.0' in out
    assert err.count("no KV pool capacity") == 1
    assert "vllm:cache_config_info with num_gpu_blocks and block_size" in err and " -- " in err


def test_sglang_dump_with_token_usage_only_is_said_and_counted(tmp_path, capsys):
    dump = _without(tmp_path, SGLANG_DOC, "num_used_tokens")
    assert "sglang:token_usage{" in dump.read_text() and "max_total_num_tokens" not in dump.read_text()
    rc, out, err = _kv_once(capsys, "--endpoint", str(dump), "--gpu", "GPU-1")
    assert rc == 0
    assert "fusebox_kv_cache_usage_bytes" not in out
    assert (f'{INCOMPLETE}{{engine="meta-llama/Llama-3.1-8B-Instruct",host_name="n1",reason="no_capacity"}} 1.0'
            in out)
    assert "sglang:max_total_num_tokens" in err


def test_no_gpu_is_said_once_and_counted_every_round(capsys):
    rc, out, err = _kv_once(capsys, "--endpoint", str(VLLM_NEW))
    assert rc == 0
    assert 'fusebox_kv_cache_limit_bytes{engine="facebook/opt-125m",host_name="n1",model="facebook/opt-125m"}' in out
    assert f'{INCOMPLETE}{{engine="facebook/opt-125m",host_name="n1",reason="no_gpu"}} 1.0' in out
    assert "no --gpu given" in err and "--gpu GPU-UUID" in err
    col = KvCollector([str(VLLM_NEW)], opt_geometry(), log=(said := []).append)
    for _ in range(3):
        col.collect()
    assert dict(col.incomplete) == {("facebook/opt-125m", "no_gpu"): 3}
    assert len(said) == 1


def test_complete_output_counts_nothing(capsys):
    rc, out, err = _kv_once(capsys, "--endpoint", str(VLLM_NEW), "--gpu", "GPU-1")
    assert rc == 0 and INCOMPLETE not in out and err == ""


def test_sglang_data_parallel_ranks_are_summed_not_maxed():
    """SGLang under data parallelism (label dp_rank, docs/metrics.md section 2) keeps one KV pool per
    rank; the tensor-parallel ranks of one dp rank repeat its figures. The capture's shape (model_name,
    tp_rank) with two dp ranks of two tp ranks each: rank 0 at 0.25 of 430839 tokens, rank 1 at 0.5
    of 430839 -> 0.75 x 430839 tokens in use of a 2 x 430839 pool (a max would say 0.5 of 430839)."""
    text = (FIX / "datadog_sglang_metrics_fixture_v0.5.10.post1.txt").read_text()
    lines = []
    for ln in text.splitlines():
        if ln.startswith(("sglang:token_usage{", "sglang:max_total_num_tokens{")):
            for dp, usage in (("0", "0.25"), ("1", "0.5")):
                for tp in ("0", "1"):
                    row = ln.replace('tp_rank="0"', f'tp_rank="{tp}",dp_rank="{dp}"')
                    if ln.startswith("sglang:token_usage{"):
                        row = row.rsplit(" ", 1)[0] + " " + usage
                    lines.append(row)
        else:
            lines.append(ln)
    r = {x.key: x.value for x in from_texts(["\n".join(lines) + "\n"]).collect()}
    assert r["kv_cache_usage"] == pytest.approx((0.25 + 0.5) * 430839 * OPT_BPT)
    assert r["kv_cache_limit"] == 2 * 430839 * OPT_BPT


def test_vllm_capacity_from_kv_cache_size_tokens_when_exported():
    """vLLM >= 0.33 adds kv_cache_size_tokens to cache_config_info, the group-aware capacity its
    docs prefer over num_gpu_blocks x block_size (wrong for hybrid models). The V1 capture's
    cache_config_info (num_gpu_blocks 2452, block_size 16) with that label added."""
    text = VLLM_V1.read_text()
    assert 'num_gpu_blocks="2452"' in text
    with_size = text.replace("vllm:cache_config_info{", 'vllm:cache_config_info{kv_cache_size_tokens="30000",')
    r = {x.key: x.value for x in from_texts([with_size]).collect()}
    assert r["kv_cache_limit"] == 30000 * OPT_BPT
    # "None" (not profiled yet) or absent: the blocks, as before
    for t in (text, text.replace("vllm:cache_config_info{", 'vllm:cache_config_info{kv_cache_size_tokens="None",')):
        r = {x.key: x.value for x in from_texts([t]).collect()}
        assert r["kv_cache_limit"] == 2452 * 16 * OPT_BPT


# ------------------------------------------------------------------------- a model config that is not the engine's model
TINYLLAMA = FIX / "hardware-aware-router_vllm-v1_tinyllama-1.1b_idle_2025-11.txt"  # gpu_memory_utilization 0.2
TINYLLAMA_GEO = KvGeometry(22, 4, 64, 2)  # 22 layers, 4 KV heads, head 2048 / 32 = 64, bfloat16: 22528 B/token


def test_a_model_config_of_another_model_is_said_and_counted(capsys):
    """llava-1.5-7b's config (llama defaults: 2 x 32 layers x 32 KV heads x 128 x 2 B = 524288 B/token)
    on a TinyLlama engine (6971 blocks x 16 = 111536 tokens, gpu_memory_utilization 0.2): a pool of
    58.5 GB that vLLM could only hold on a GPU of 58.5 / 0.2 = 292 GB, more than any GPU's 288 GB."""
    rc, out, err = _kv_once(capsys, "--endpoint", str(TINYLLAMA), "--gpu", "GPU-1",
                            "--model-config", str(FIX / "llava-1.5-7b-hf_config.json"))
    assert rc == 0
    engine = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
    assert f'{INCOMPLETE}{{engine="{engine}",host_name="n1",reason="model_config"}} 1.0' in out
    assert err.count("does not match the model the engine serves") == 1, err
    pool = 6971 * 16 * 2 * 32 * 32 * 128 * 2
    assert f"{pool / 1e9:.1f} GB per GPU" in err and f"GPU of {pool / 0.2 / 1e9:.0f} GB or more" in err
    assert "over the largest GPU's 288 GB" in err and " -- pass the config.json" in err


def test_the_engines_own_model_config_counts_no_mismatch():
    col = KvCollector([str(TINYLLAMA)], TINYLLAMA_GEO, gpus=["GPU-1"], gpu_memory_bytes=24e9)
    assert {r.key for r in col.collect()} == {"kv_cache_usage", "kv_cache_limit"}
    assert dict(col.incomplete) == {}  # 111536 x 22528 B = 2.5 GB, / 0.2 = 12.6 GB <= 24 GB


def test_a_model_config_is_checked_against_the_gpus_own_memory_when_known():
    """On a 24 GB GPU (NVML's total), llama-2-13b's 819200 B/token (2 x 40 x 40 x 128 x 2) make the
    TinyLlama pool 91.4 GB: a 24 GB GPU at 0.2 holds 4.8 GB."""
    said: list[str] = []
    col = KvCollector([str(TINYLLAMA)], KvGeometry(40, 40, 128, 2), gpus=["GPU-1"], gpu_memory_bytes=24e9,
                      log=said.append)
    col.collect()
    col.collect()
    assert dict(col.incomplete) == {("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "model_config"): 2}
    assert len(said) == 1 and "over the GPU's 24 GB" in said[0]


def test_the_cli_checks_the_model_config_against_the_gpus_memory_from_nvml(capsys, monkeypatch):
    """NVML stood in by a real capture (an RTX 4090: 24564 MiB, nvidia-smi -q -x): the --gpu's
    total memory, 25.8 GB, is the bound (the llava config's 58.5 GB TinyLlama pool needs 292 GB)."""
    from fusebox.collectors.replay import SyntheticNvml, load_replay

    capture = FIX / "netdata_rtx-4090-driver-535_nvidia-smi-q-x.xml"
    monkeypatch.setitem(sys.modules, "pynvml", SyntheticNvml.from_frames(load_replay(capture)))
    uuid = "GPU-71d1acc2-662d-2166-bf9f-65272d2fc437"  # the capture's <uuid>
    rc, out, err = _kv_once(capsys, "--endpoint", str(TINYLLAMA), "--gpu", uuid,
                            "--model-config", str(FIX / "llava-1.5-7b-hf_config.json"))
    assert rc == 0 and 'reason="model_config"} 1.0' in out
    assert f"over the GPU's {24564 * 2**20 / 1e9:.0f} GB" in err, err
