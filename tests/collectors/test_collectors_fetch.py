"""Engine /metrics fetches are bounded and keep credentials out of labels and logs (issue 14,
items 8 and 9): a byte cap on the wire, a cap on the decompressed size, one deadline for the
whole scrape, each refusal counted by reason; userinfo stripped from every label and message.

The servers are real HTTP servers on loopback ports; the memory ceilings are measured on a
real ``fusebox collect kv --once`` subprocess (the peak RSS of the wrapper's only child)."""

from __future__ import annotations

import base64
import gzip
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "collectors"
VLLM_OLD = FIX / "datadog_vllm_metrics_fixture_opt-125m_v0-only_2024.txt"
OPT_CONFIG = FIX / "opt-125m_config.json"
# opt-125m: 12 layers x 12 KV heads x head 64 x 2 B x 2 = 36864 B/token; the dump's
# cache_config_info says 7281 blocks of 16 tokens -> 4,294,508,544 B of pool
OPT_POOL = 7281 * 16 * 2 * 12 * 12 * 64 * 2
MIB = 1 << 20
CEILING_KIB = 200 * 1024  # the bound; a bare `fusebox collect kv --once` needs well under half


# ------------------------------------------------------------------------- loopback servers
class _Server:
    """A threaded loopback HTTP/1.0 server whose GET handler is ``behave(handler)``."""

    def __init__(self, behave):
        stop = self.stop = threading.Event()
        seen = self.seen = []

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                seen.append(dict(self.headers))
                try:
                    behave(self, stop)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the collector hung up: what a refusal looks like from here

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/metrics"

    def close(self):
        self.stop.set()
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(behave):
        s = _Server(behave)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


def _headers(h, status=200, **extra):
    h.send_response(status)
    h.send_header("Content-Type", "text/plain; version=0.0.4")
    for k, v in extra.items():
        h.send_header(k.replace("_", "-"), str(v))
    h.end_headers()


def _body(data: bytes, **extra):
    def behave(h, _stop):
        _headers(h, Content_Length=len(data), **extra)
        h.wfile.write(data)

    return behave


_BOMB: list[bytes] = []


def _gzip_bomb() -> bytes:
    """gzip of 512 MiB of zeros (~0.5 MB on the wire), built once per session."""
    if not _BOMB:
        c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        zeros = bytes(MIB)
        _BOMB.append(b"".join([*(c.compress(zeros) for _ in range(512)), c.flush()]))
    return _BOMB[0]


def _trickle(h, stop):
    """200 bytes a second of a valid vLLM dump, then comment lines, until the client leaves."""
    _headers(h)  # HTTP/1.0 without Content-Length: the body ends when the server closes
    data = VLLM_OLD.read_bytes()
    i = 0
    while not stop.is_set():
        piece = data[i:i + 20] if i < len(data) else b"# still here\n"[:20]
        i += 20
        h.wfile.write(piece)
        h.wfile.flush()
        time.sleep(0.1)


def _endless(h, stop):
    """An uncompressed body far over any cap, streamed without Content-Length (1 MiB writes)."""
    _headers(h)
    line = b'vllm:num_requests_running{model_name="facebook/opt-125m"} 0.0\n'
    chunk = line * (MIB // len(line))
    for _ in range(300):  # ~300 MiB, as in the report
        if stop.is_set():
            return
        h.wfile.write(chunk)


# ------------------------------------------------------------------------- running the CLI
_WRAPPER = """
import json, resource, subprocess, sys, time
t0 = time.monotonic()
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": r.returncode, "out": r.stdout, "err": r.stderr, "elapsed_s": time.monotonic() - t0,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def _collect_kv_measured(*args: str, timeout: float = 90) -> dict:
    """``fusebox collect kv --once ARGS`` in a subprocess; its exit code, output, wall time and
    peak RSS (KiB; Linux ru_maxrss of the wrapper's only child)."""
    cmd = [sys.executable, "-c", _WRAPPER, sys.executable, "-m", "fusebox.cli", "collect", "kv", "--once",
           "--model-config", str(OPT_CONFIG), "--host-name", "n1", *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"fusebox collect kv --once {' '.join(args)} still ran after {timeout} s")
    assert p.returncode == 0, err
    return json.loads(out)


def _samples(text: str, name: str) -> dict:
    return {tuple(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.name == name}


def _refused(text: str) -> dict:
    """{(endpoint, reason): count} of fusebox_collector_scrape_refused_total."""
    return {(dict(k)["endpoint"], dict(k)["reason"]): v
            for k, v in _samples(text, "fusebox_collector_scrape_refused_total").items()}


def _errors(text: str) -> dict:
    return {(dict(k)["endpoint"], dict(k)["reason"]): v
            for k, v in _samples(text, "fusebox_collector_scrape_errors_total").items()}


# ------------------------------------------------------------------------- item 8: the done-when
def test_a_gzip_bomb_is_refused_at_the_decompressed_cap_in_bounded_memory(serve):
    bomb = _gzip_bomb()
    assert len(bomb) < 2 * MIB
    s = serve(_body(bomb, Content_Encoding="gzip"))
    r = _collect_kv_measured("--endpoint", s.url, "--timeout", "20")
    assert r["rc"] == 1, r["err"]
    assert r["maxrss_kib"] < CEILING_KIB, f"peak RSS {r['maxrss_kib']} KiB"
    assert _refused(r["out"]) == {(s.url, "decompressed_too_large"): 1}
    assert _errors(r["out"]) == {(s.url, "too_large"): 1}
    assert "--max-decompressed-bytes" in r["err"] and "16 MiB" in r["err"]
    assert "fusebox_kv_cache" not in r["out"]


def test_a_trickling_server_is_cut_off_at_the_deadline_and_its_data_is_not_used(serve):
    s = serve(_trickle)
    r = _collect_kv_measured("--endpoint", s.url, "--timeout", "2", timeout=45)
    assert r["rc"] == 1, r["err"]
    # 2 s deadline; the old per-read timeout never fired at 200 B/s. Generous bound, not a benchmark.
    assert r["elapsed_s"] < 30
    assert _refused(r["out"]) == {(s.url, "deadline"): 1}
    assert _errors(r["out"]) == {(s.url, "timeout"): 1}
    assert "deadline" in r["err"] and "--timeout" in r["err"]
    assert "fusebox_kv_cache" not in r["out"]


def test_a_300_mb_answer_is_refused_at_the_byte_cap_in_bounded_memory(serve):
    s = serve(_endless)
    r = _collect_kv_measured("--endpoint", s.url, "--timeout", "20")
    assert r["rc"] == 1, r["err"]
    assert r["maxrss_kib"] < CEILING_KIB, f"peak RSS {r['maxrss_kib']} KiB"
    assert _refused(r["out"]) == {(s.url, "body_too_large"): 1}
    assert "--max-body-bytes" in r["err"]


# ------------------------------------------------------------------------- item 8: in process
def _kv_once(capsys, *args):
    from fusebox.cli import main

    rc = main(["collect", "kv", "--once", "--model-config", str(OPT_CONFIG), "--host-name", "n1", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_a_content_length_over_the_cap_is_refused_before_the_body_is_read(serve, capsys):
    def liar(h, stop):
        _headers(h, Content_Length=1 << 30)
        h.wfile.write(b"# one GiB follows, slowly\n")
        stop.wait(30)  # never sends the rest: reading it would wait for the deadline

    s = serve(liar)
    t0 = time.monotonic()
    rc, out, err = _kv_once(capsys, "--endpoint", s.url, "--timeout", "20", "--max-body-bytes", "1MiB")
    assert rc == 1 and time.monotonic() - t0 < 15  # refused on the header, long before the 20 s deadline
    assert _refused(out) == {(s.url, "body_too_large"): 1}
    assert "1073741824" in err and "1 MiB" in err


def test_a_gzip_answer_within_the_caps_is_decoded(serve, capsys):
    s = serve(_body(gzip.compress(VLLM_OLD.read_bytes()), Content_Encoding="gzip"))
    rc, out, err = _kv_once(capsys, "--endpoint", s.url)
    assert rc == 0, err
    assert "gzip" in s.seen[0].get("Accept-Encoding", "")
    assert list(_samples(out, "fusebox_kv_cache_limit_bytes").values()) == [OPT_POOL]


def test_the_caps_are_options_and_a_small_cap_refuses_a_normal_dump(serve, capsys):
    s = serve(_body(VLLM_OLD.read_bytes()))  # 12,829 bytes
    rc, out, _ = _kv_once(capsys, "--endpoint", s.url, "--max-body-bytes", "12828")
    assert rc == 1 and _refused(out) == {(s.url, "body_too_large"): 1}
    rc, out, _ = _kv_once(capsys, "--endpoint", s.url, "--max-body-bytes", "12829")
    assert rc == 0 and list(_samples(out, "fusebox_kv_cache_limit_bytes").values()) == [OPT_POOL]
    gz = serve(_body(gzip.compress(VLLM_OLD.read_bytes()), Content_Encoding="gzip"))
    rc, out, _ = _kv_once(capsys, "--endpoint", gz.url, "--max-decompressed-bytes", "12828")
    assert rc == 1 and _refused(out) == {(gz.url, "decompressed_too_large"): 1}


def test_a_file_endpoint_over_the_cap_is_refused_too(tmp_path, capsys):
    big = tmp_path / "metrics.txt"
    big.write_bytes(VLLM_OLD.read_bytes())
    rc, out, _ = _kv_once(capsys, "--endpoint", str(big), "--max-body-bytes", "1000")
    assert rc == 1 and _refused(out) == {(str(big), "body_too_large"): 1}


def test_bad_cap_values_are_refused(capsys):
    from fusebox.cli import main

    for bad in ("0", "-5", "lots", "1.5XB"):
        with pytest.raises(SystemExit) as e:
            main(["collect", "kv", "--once", "--endpoint", "x", "--model-config", str(OPT_CONFIG),
                  "--max-body-bytes", bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "argument --max-body-bytes" in err and "is not a positive size" in err, err


def test_the_latency_fallback_is_bounded_too(serve, capsys):
    from fusebox.cli import main

    s = serve(_trickle)
    t0 = time.monotonic()
    rc = main(["collect", "latency", "--once", "--endpoint", s.url, "--engine-id", "e1", "--timeout", "1",
               "--spec", str(ROOT / "fusebox.yaml")])
    captured = capsys.readouterr()
    assert rc == 1 and time.monotonic() - t0 < 20  # one poll of 1 s (--once is one round), not the endless trickle
    assert "longer than its 1 s deadline" in captured.err, captured.err


# ------------------------------------------------------------------------- item 9: credentials
def test_userinfo_never_reaches_a_label_or_stderr(serve, capsys):
    s = serve(lambda h, _stop: _headers(h, status=503))
    secret_url = s.url.replace("http://", "http://scraper:s3cr3t-pw@")
    rc, out, err = _kv_once(capsys, "--endpoint", secret_url)
    assert rc == 1
    assert "s3cr3t" not in out and "s3cr3t" not in err and "scraper" not in out + err
    assert _errors(out) == {(s.url, "down"): 1}  # the label is the URL without userinfo
    assert s.url in err and "503" in err
    # the URL's userinfo is still sent (as Basic auth), only never shown
    assert s.seen[0]["Authorization"] == "Basic " + base64.b64encode(b"scraper:s3cr3t-pw").decode()


def test_a_credentials_file_is_read_per_scrape_bearer_or_basic(serve, tmp_path):
    from fusebox.collectors.fetch import Credentials, Fetcher
    from fusebox.collectors.kvcache import KvCollector, kv_geometry, load_model_config

    s = serve(_body(VLLM_OLD.read_bytes()))
    cred = tmp_path / "token"
    cred.write_text("tok-123\n")
    cred.chmod(0o600)
    logs = []
    col = KvCollector([s.url], kv_geometry(load_model_config(OPT_CONFIG)),
                      fetch=Fetcher(credentials=Credentials(cred, log=logs.append)))
    col.collect()
    cred.write_text("alice:pa:ss\n")  # rotated between scrapes; the password may hold ':'
    col.collect()
    assert [h["Authorization"] for h in s.seen] == [
        "Bearer tok-123", "Basic " + base64.b64encode(b"alice:pa:ss").decode()]
    assert logs == [] and col.errors == {}


def test_a_credentials_file_readable_by_others_is_warned_about_once(serve, tmp_path, capsys):
    s = serve(_body(VLLM_OLD.read_bytes()))
    cred = tmp_path / "token"
    cred.write_text("tok-123\n")
    cred.chmod(0o644)
    rc, _out, err = _kv_once(capsys, "--endpoint", s.url, "--credentials-file", str(cred))
    assert rc == 0
    assert err.count("readable by group or others") == 1 and str(cred) in err and "chmod 600" in err
    assert "tok-123" not in err
    cred.chmod(0o600)
    rc, _out, err = _kv_once(capsys, "--endpoint", s.url, "--credentials-file", str(cred))
    assert rc == 0 and "readable" not in err


def test_a_missing_credentials_file_is_a_counted_scrape_error(serve, tmp_path, capsys):
    s = serve(_body(VLLM_OLD.read_bytes()))
    rc, out, err = _kv_once(capsys, "--endpoint", s.url, "--credentials-file", str(tmp_path / "absent"))
    assert rc == 1 and _errors(out) == {(s.url, "credentials"): 1}
    assert "absent" in err and s.seen == []  # nothing was sent without the credentials


def test_the_start_up_line_shows_no_otlp_userinfo(capsys):
    import argparse

    from fusebox.collectors.cli import _announce

    args = argparse.Namespace(no_otlp=False, otlp_protocol="http", otlp_endpoint="http://push:t0ken@otel:4318",
                              metrics_port=None, interval=5.0)
    _announce(args, "kv")
    err = capsys.readouterr().err
    assert "OTLP http to http://otel:4318" in err and "t0ken" not in err


def test_redact_url_strips_userinfo_only():
    from fusebox.collectors.fetch import redact_url

    assert redact_url("http://u:p@h:9/m?x=1") == "http://h:9/m?x=1"
    assert redact_url("https://tok@[::1]:8443/metrics") == "https://[::1]:8443/metrics"
    assert redact_url("http://h/metrics") == "http://h/metrics"
    assert redact_url("/var/run/metrics.txt") == "/var/run/metrics.txt"


# ------------------------------------------------------------------------- issue 22: series and label caps
def _dropped(text: str) -> dict:
    """{(endpoint, reason): count} of fusebox_collector_scrape_dropped_total."""
    return {(dict(k)["endpoint"], dict(k)["reason"]): v
            for k, v in _samples(text, "fusebox_collector_scrape_dropped_total").items()}


def test_a_15_mib_label_is_dropped_and_counted_in_bounded_memory_and_the_rest_is_used(serve):
    huge = b'vllm:gpu_cache_usage_perc{model_name="' + b"m" * (15 * MIB) + b'"} 0.5\n'
    s = serve(_body(VLLM_OLD.read_bytes() + huge))
    r = _collect_kv_measured("--endpoint", s.url, "--timeout", "20")
    assert r["rc"] == 0, r["err"]
    assert r["maxrss_kib"] < CEILING_KIB, f"peak RSS {r['maxrss_kib']} KiB"
    assert _dropped(r["out"]) == {(s.url, "label_too_long"): 1}
    assert list(_samples(r["out"], "fusebox_kv_cache_limit_bytes").values()) == [OPT_POOL]  # the rest is used


def test_sample_lines_past_max_series_are_dropped_and_counted(serve, capsys):
    dump = VLLM_OLD.read_bytes()
    samples = sum(1 for line in dump.decode().splitlines() if line.strip() and not line.startswith("#"))
    s = serve(_body(dump))
    rc, out, err = _kv_once(capsys, "--endpoint", s.url)
    assert rc == 0, err
    assert _dropped(out) == {}
    rc, out, _ = _kv_once(capsys, "--endpoint", s.url, "--max-series", "5")
    assert _dropped(out) == {(s.url, "series_limit"): samples - 5}
    rc, out, err = _kv_once(capsys, "--endpoint", s.url, "--max-label-chars", "10")
    long_labels = sum(1 for line in dump.decode().splitlines() if not line.startswith("#") and "{" in line
                      and line.rindex("}") - line.index("{") - 1 > 10)
    assert long_labels > 0 and _dropped(out) == {(s.url, "label_too_long"): long_labels}


def test_a_15_mib_label_in_a_histogram_leaves_the_latency_fallback_working_in_bounded_memory(serve):
    line = b'vllm:e2e_request_latency_seconds_bucket{le="0.5",model_name="' + b"m" * (15 * MIB) + b'"} 3\n'
    s = serve(_body(VLLM_OLD.read_bytes() + line))
    cmd = [sys.executable, "-c", _WRAPPER, sys.executable, "-m", "fusebox.cli", "collect", "latency", "--once",
           "--endpoint", s.url, "--engine-id", "e1", "--timeout", "20", "--spec", str(ROOT / "fusebox.yaml")]
    r = json.loads(subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120).stdout)
    assert r["rc"] == 0, r["err"][-500:]
    assert r["maxrss_kib"] < CEILING_KIB, f"peak RSS {r['maxrss_kib']} KiB"
    assert "mmmm" not in r["err"] and "fusebox_alignment_duration_seconds_count" in r["out"]


# ------------------------------------------------------------------------- distinct model names
def _many_models(n: int) -> str:
    """A vLLM answer whose usage gauge names ``n`` models (one pool, engine core 0)."""
    lines = ['vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="7281"} 1.0']
    lines += [f'vllm:kv_cache_usage_perc{{engine="0",model_name="m{i:04d}"}} 0.5' for i in range(n)]
    return "\n".join(lines) + "\n"


def test_bound_series_keeps_the_first_max_models_model_names_and_counts_the_rest():
    from fusebox.collectors.fetch import FetchLimits, bound_series

    text = ('a{model_name="x",le="1"} 1\na{model_name="y"} 1\nb{engine="0"} 1\na{model_name="x"} 2\n'
            'a{model_name="z"} 1\nc{xmodel_name="w",model_name="y"} 1\na{model_name="v\\"q"} 1\n')
    kept, cut = bound_series(text, FetchLimits(max_models=2))
    # x and y are the first two values; z and v"q are new past the cap; xmodel_name is another label
    assert kept.splitlines() == ['a{model_name="x",le="1"} 1', 'a{model_name="y"} 1', 'b{engine="0"} 1',
                                 'a{model_name="x"} 2', 'c{xmodel_name="w",model_name="y"} 1']
    assert cut == {"model_limit": 2}


def test_an_engine_naming_500_models_gives_the_output_of_max_models_and_is_counted(tmp_path, capsys):
    """On main every model became KV series: 500 models -> 1000 series (usage and limit). With the
    default cap, 8 models -> 16 series, the 492 others' lines counted as model_limit."""
    dump = tmp_path / "metrics.txt"
    dump.write_text(_many_models(500))
    rc, out, err = _kv_once(capsys, "--endpoint", str(dump))
    assert rc == 0, err
    usage = _samples(out, "fusebox_kv_cache_usage_bytes")
    limit = _samples(out, "fusebox_kv_cache_limit_bytes")
    assert sorted(dict(k)["model"] for k in usage) == [f"m{i:04d}" for i in range(8)]
    assert len(limit) == 8 and set(limit.values()) == {OPT_POOL}
    assert _dropped(out) == {(str(dump), "model_limit"): 492}
    assert err.count("more than 8 model_name values") == 1
    rc, out, _ = _kv_once(capsys, "--endpoint", str(dump), "--max-models", "600")
    assert len(_samples(out, "fusebox_kv_cache_usage_bytes")) == 500 and _dropped(out) == {}


def test_the_model_cap_is_said_once_per_endpoint_over_rounds_and_bounds_the_latency_histogram_too(tmp_path):
    from fusebox.collectors.kvcache import KvCollector, kv_geometry, load_model_config
    from fusebox.collectors.latency import EngineHistogramFallback

    dump = tmp_path / "metrics.txt"
    dump.write_text(_many_models(50))
    said: list[str] = []
    kv = KvCollector([str(dump)], kv_geometry(load_model_config(OPT_CONFIG)), log=said.append)
    for _ in range(3):
        assert len({r.attrs["model"] for r in kv.collect()}) == 8
    assert dict(kv.dropped) == {(str(dump), "model_limit"): 3 * 42}
    assert len([m for m in said if "model_name values" in m]) == 1 and said[0].startswith(f"kv: {dump}: ")

    hist = [f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m{i:03d}"}} {c}'
            for i in range(40) for le, c in (("0.1", 1), ("+Inf", 2))]

    class Recorder:
        def __init__(self):
            self.models: set[str] = set()

        def record(self, _value, attrs):
            self.models.add(attrs["model"])

    rec, said = Recorder(), []
    fb = EngineHistogramFallback(rec, engine="e1", endpoint="x", log=said.append,
                                 fetch=lambda _e, _t: "\n".join(hist) + "\n")
    assert fb.poll(since_start=True) == 8 * 2
    assert rec.models == {f"m{i:03d}" for i in range(8)}
    assert dict(fb.dropped) == {("x", "model_limit"): 32 * 2}
    assert len(said) == 1 and said[0].startswith("latency: x: more than 8 model_name values")
