"""`fusebox costqos run` at start, as a new user meets it: no credentials, an API server that is
down, a busy --listen port, a Prometheus URL that is not one, a Prometheus that does not answer.
Each is one line on stderr and an exit code, before kopf starts, never a page of tracebacks (kopf
on its own retries a missing login every 60 s forever, and ends an unreachable API server after
~50 s in ~210 lines of "Task exception was never retrieved")."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fusebox.cli import main
from fusebox.costqos import cli as costqos_cli
from fusebox.tooling import free_port

ROOT = Path(__file__).resolve().parents[2]
NO_CREDENTIALS = "-- pass --kubeconfig FILE, set KUBECONFIG, or run it in a pod with a ServiceAccount"


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: not-a-real-token}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return path


def _run(args: list[str], env: dict[str, str], timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "costqos", "run", *args], env=env, capture_output=True,
                       text=True, timeout=timeout, cwd=ROOT)
    return r, time.monotonic() - t0


def _clean_env(home: Path) -> dict[str, str]:
    """Our environment without a kubeconfig or a pod's ServiceAccount: $HOME has no .kube/."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    env["HOME"] = str(home)
    return env


@pytest.mark.process
def test_no_credentials_is_one_line_and_exit_2_before_serving(tmp_path):
    port = free_port()
    r, took = _run(["--prometheus", "http://127.0.0.1:9", "--listen", f"127.0.0.1:{port}"], _clean_env(tmp_path))
    lines = r.stderr.splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("fusebox costqos run: no Kubernetes credentials") and lines[0].endswith(NO_CREDENTIALS), r.stderr
    assert took < 20  # kopf alone: a retry every 60 s, forever
    with socket.socket() as s:  # it never served: the port is free
        s.bind(("127.0.0.1", port))


@pytest.mark.process
def test_an_api_server_that_is_down_is_a_bounded_quiet_retry_then_one_summary_line_and_exit_1(tmp_path):
    """--api-wait 5: attempts at 0, 1 and 3 s (the next would come at 7 s, past 5); one warning
    line per retried attempt, then the summary naming the server, the attempts and the last error."""
    api_port, prom_port = free_port(), free_port()  # nothing listens on either
    server = f"https://127.0.0.1:{api_port}"
    kc = _kubeconfig(tmp_path / "kubeconfig", server)
    r, took = _run(["--prometheus", f"http://127.0.0.1:{prom_port}", "--listen", f"127.0.0.1:{free_port()}",
                    "--kubeconfig", str(kc), "--api-wait", "5"], _clean_env(tmp_path))
    lines = r.stderr.splitlines()
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "Task exception" not in r.stderr, r.stderr
    attempts = [ln for ln in lines if f"API server {server}: attempt " in ln]
    assert [re.search(r"attempt (\d+): .*Connection refused; next in (\d+) s$", ln).groups() for ln in attempts] == [("1", "1"), ("2", "2")], r.stderr
    assert lines[-1].startswith(f"fusebox costqos run: the API server {server} did not answer in 3 attempt(s) over 3 s: "), r.stderr
    assert "Connection refused" in lines[-1] and lines[-1].endswith("(--api-wait S to wait longer)"), r.stderr
    # the one line for Prometheus not answering the first query (item 4), then the API's
    prom = [ln for ln in lines if "the first query failed" in ln]
    assert len(prom) == 1 and f"Prometheus http://127.0.0.1:{prom_port}: the first query failed: PrometheusUnreachable" in prom[0]
    assert len(lines) == 4, r.stderr
    assert 3 <= took < 20


@pytest.mark.process
def test_a_busy_listen_port_is_one_line_and_exit_2_before_anything_starts(tmp_path, capsys):
    kc = _kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{free_port()}")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc = main(["costqos", "run", "--prometheus", "http://127.0.0.1:9", "--listen", f"127.0.0.1:{port}", "--kubeconfig", str(kc)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == f"fusebox costqos run: --listen 127.0.0.1:{port}: the address is in use -- choose another port\n"


@pytest.mark.parametrize("url", ["notaurl", "ftp://x", "http://", "prometheus:9090"])
def test_a_prometheus_url_that_is_not_http_is_refused_at_argument_parsing(capsys, url):
    with pytest.raises(SystemExit) as e:
        main(["costqos", "run", "--prometheus", url, "--listen", "127.0.0.1:9"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument --prometheus: {url!r} is not an http(s) URL -- e.g. http://prometheus:9090" in err


@pytest.mark.parametrize("url", ["http://prometheus-operated.monitoring.svc:9090", "https://[::1]:9090/prom"])
def test_an_http_prometheus_url_is_accepted(url):
    assert costqos_cli._http_url(url) == url


def test_the_docs_command_line_lists_every_flag_of_help():
    top = argparse.ArgumentParser()
    costqos_cli.register(top.add_subparsers())
    costqos = top._subparsers._group_actions[0].choices["costqos"]  # type: ignore[union-attr]
    run = costqos._subparsers._group_actions[0].choices["run"]
    flags = {o for a in run._actions for o in a.option_strings if o.startswith("--") and o != "--help"}
    assert {"--query-timeout", "--log-level", "--api-wait", "--prometheus", "--listen"} <= flags
    doc = (ROOT / "docs" / "costqos.md").read_text()
    block = doc[doc.index("```\nfusebox costqos run"):]
    block = block[:block.index("```", 4)]
    assert sorted(f for f in flags if f not in block) == []
