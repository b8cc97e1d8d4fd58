"""Helpers for the dashboards / Collector tests: the real tools, on free loopback ports.

Tools missing: pytest.skip locally, pytest.fail under CI (env CI=true), with how to get them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import _support

from fusebox.tooling import ToolMissing, free_port, jaeger_tool, otelcol_tool, tools_dir  # noqa: F401  (re-exported to the tests)

ROOT = Path(__file__).resolve().parents[1]


def missing(what: str, how: str):
    """Fail (under CI) or skip (elsewhere): _support.missing, the one rule for a missing tool."""
    _support.missing(f"{what} not found: {how}")


def _pinned(find: Callable[[], Path]) -> Path:
    """``find()``, a fusebox.tooling finder's path, or fail (under CI) / skip with its ToolMissing message."""
    try:
        return find()
    except ToolMissing as e:
        _support.missing(str(e))
        raise


def otelcol_binary() -> Path:
    """The Collector built by tools/build-otelcol.sh (or $FUSEBOX_OTELCOL): ``fusebox.tooling.otelcol_tool``."""
    return _pinned(otelcol_tool)


def jaeger_binary() -> Path:
    """Jaeger v2's ``jaeger`` built by tools/build-jaeger.sh (``fusebox.tooling.jaeger_tool``)."""
    return _pinned(jaeger_tool)


def prometheus_binary() -> str:
    p = shutil.which("prometheus")
    if not p:
        missing("prometheus", "run `make tools` (installs Prometheus >= 2.42)")
    return p


def promtool_binary() -> str:
    p = shutil.which("promtool")
    if not p:
        missing("promtool", "run `make tools` (installs Prometheus >= 2.42)")
    return p


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        return r.read()


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 60.0, log: Path | None = None) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited with {proc.returncode}:\n{log.read_text()[-4000:] if log else ''}")
        try:
            http_get(url, timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not up after {timeout}s:\n{log.read_text()[-4000:] if log else ''}")


@contextlib.contextmanager
def process(args: list[str], log: Path, env: dict | None = None):
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def prometheus(tmp: Path, config: dict, *, storage: Path | None = None, extra_args: tuple = ()):
    """A real Prometheus on a free loopback port; yields its base URL."""
    import yaml

    port = free_port()
    cfg = tmp / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(config))
    storage = storage or tmp / "tsdb"
    args = [prometheus_binary(), f"--config.file={cfg}", f"--storage.tsdb.path={storage}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *extra_args]
    with process(args, tmp / "prometheus.log") as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/-/ready", proc, log=tmp / "prometheus.log")
        yield url


@contextlib.contextmanager
def jaeger(tmp: Path):
    """A real Jaeger v2 (all-in-one, in-memory storage) from tools/jaeger/loopback.yaml on free
    loopback ports; yields its endpoints as ``host:port`` strings: ``otlp_grpc``, ``otlp_http``
    (POST /v1/traces), ``query_grpc``, and ``query`` as a base URL (``/api/traces/{trace id}``).
    Up once the query API answers and both OTLP receivers accept connections."""
    ports = {k: free_port() for k in ("otlp_grpc", "otlp_http", "query", "query_grpc")}
    env = dict(os.environ, FUSEBOX_JAEGER_OTLP_GRPC_ENDPOINT=f"127.0.0.1:{ports['otlp_grpc']}",
               FUSEBOX_JAEGER_OTLP_HTTP_ENDPOINT=f"127.0.0.1:{ports['otlp_http']}",
               FUSEBOX_JAEGER_QUERY_HTTP_ENDPOINT=f"127.0.0.1:{ports['query']}",
               FUSEBOX_JAEGER_QUERY_GRPC_ENDPOINT=f"127.0.0.1:{ports['query_grpc']}")
    log = tmp / "jaeger.log"
    args = [str(jaeger_binary()), "--config", str(ROOT / "tools/jaeger/loopback.yaml")]
    with process(args, log, env=env) as proc:
        base = f"http://127.0.0.1:{ports['query']}"
        wait_http(base + "/api/services", proc, log=log)
        for name in ("otlp_grpc", "otlp_http"):  # the receivers start after the query extension
            wait_port(ports[name], proc, log)
        yield {"query": base, **{k: f"127.0.0.1:{v}" for k, v in ports.items() if k != "query"}}


def wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    """Until 127.0.0.1:``port`` accepts a TCP connection; AssertionError (with ``log``'s tail) when
    ``proc`` exits first or ``timeout`` s pass."""
    import socket

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"127.0.0.1:{port} not accepting after {timeout}s:\n{log.read_text()[-4000:]}")


def evaluated_since(base: str, since: float, max_interval_s: float) -> list[str]:
    """The rule groups of the Prometheus at ``base`` that evaluate every ``max_interval_s`` s or
    faster and have not evaluated since ``since`` (Unix seconds): empty once each has."""
    body = json.loads(http_get(f"{base}/api/v1/rules"))
    assert body["status"] == "success", body
    fast = [g for g in body["data"]["groups"] if g["interval"] <= max_interval_s]
    assert fast, f"no rule group evaluates every {max_interval_s:g} s or faster"
    late = []
    for g in fast:
        if _rfc3339(g["lastEvaluation"]) <= since:
            late.append(g["name"])
    return late


def _rfc3339(stamp: str) -> float:
    """Prometheus' RFC 3339 time (nanoseconds, Z) as Unix seconds."""
    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", stamp).replace("Z", "+00:00")).timestamp()


def wait_scrapes(base: str, since: float, n: int = 2, bound: float = 60.0) -> None:
    """Wait until each active target of the Prometheus at ``base`` has been scraped ``n`` times after
    ``since`` (Unix seconds): its last scrape over n - 1 scrape intervals after ``since``.
    AssertionError past ``bound`` s, naming each target's last scrape."""
    units = {"ms": 0.001, "s": 1, "m": 60}
    end, seen = time.monotonic() + bound, []
    while time.monotonic() < end:
        targets = json.loads(http_get(f"{base}/api/v1/targets"))["data"]["activeTargets"]
        seen = [(t["scrapeUrl"], t["lastScrape"]) for t in targets]
        intervals = [sum(float(v) * units[u] for v, u in re.findall(r"([\d.]+)(ms|s|m)", t["scrapeInterval"]))
                     for t in targets]
        if targets and all(_rfc3339(t["lastScrape"]) > since + (n - 1) * i for t, i in zip(targets, intervals, strict=True)):
            return
        time.sleep(0.1)
    raise AssertionError(f"not scraped {n} times within {bound:g} s after {since:.3f}: {seen}")


def query(base: str, expr: str, at: float | None = None) -> list[dict]:
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    body = json.loads(http_get(f"{base}/api/v1/query?{urllib.parse.urlencode(params)}"))
    assert body["status"] == "success", body
    return body["data"]["result"]


def query_range(base: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    body = json.loads(http_get(f"{base}/api/v1/query_range?{urllib.parse.urlencode(params)}", timeout=120))
    assert body["status"] == "success", body
    return body["data"]["result"]


def collector_setup(tmp: Path, options=None, **extra_env: str) -> tuple[Path, Path, dict, dict, Path]:
    """The generated Collector config (with ``options``, an OtelcolOptions) on free loopback
    ports: (binary, config, ports, env, log); ``extra_env`` is added to the environment."""
    from fusebox.generator.render_otelcol import render_otelcol
    from fusebox.spec import load_spec

    binary = otelcol_binary()
    spec = load_spec(ROOT / "fusebox.yaml", display_path="fusebox.yaml")
    (text,) = (render_otelcol(spec, options) if options is not None else render_otelcol(spec)).values()
    cfg = tmp / "otelcol.yaml"
    cfg.write_text(text)
    ports = {k: free_port() for k in ("grpc", "http", "prom", "health", "tele")}
    env = dict(os.environ, FUSEBOX_OTLP_GRPC_ENDPOINT=f"127.0.0.1:{ports['grpc']}",
               FUSEBOX_OTLP_HTTP_ENDPOINT=f"127.0.0.1:{ports['http']}",
               FUSEBOX_OTELCOL_PROMETHEUS_ENDPOINT=f"127.0.0.1:{ports['prom']}",
               FUSEBOX_OTELCOL_HEALTH_ENDPOINT=f"127.0.0.1:{ports['health']}",
               FUSEBOX_OTELCOL_TELEMETRY_PORT=str(ports["tele"]), **extra_env)
    return binary, cfg, ports, env, tmp / "otelcol.log"


def serve_text(body):
    """A loopback HTTP server answering every GET with ``body`` (bytes, or a callable returning
    them at each request) as Prometheus text; call ``.shutdown()`` when done. Its port is
    ``server.server_address[1]``."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body() if callable(body) else body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
