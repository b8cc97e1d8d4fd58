"""The real gateways on loopback for the adapter tests and the bench: the SGLang Model Gateway
(``python -m sglang_router.launch_router``, sglang-router 0.3.2; ``python -m smg.launch_router``,
smg 1.13, its new name) and the vLLM router (``vllm-router``), each in front of stand-in engines
(:class:`fusebox.demo.standin.StandInEngine`). Each starts by module, never by the ``smg`` console
script, which both packages install.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from _fuse_support import free_port, wait_for
from _support import need

from fusebox.demo.standin import StandInEngine

__all__ = ["StandInEngine", "Gateway", "sglang_gateway", "sglang_workers", "vllm_router", "vllm_workers"]

# The gateways' Python modules: the sglang-router 0.3.2 launcher, and smg 1.13's.
SGLANG_ROUTER, SMG = "sglang_router", "smg"


class Gateway:
    """A gateway process; ``url``; ``stop()`` ends it (and only it)."""

    def __init__(self, argv: list[str], url: str, ready_path: str, log: Path):
        self.url = url
        self.metrics_url = ""  # its Prometheus /metrics, where the caller knows it
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(lambda: self._up(ready_path), 60, step=0.1, what=f"{argv[0]} on {url}")
        except AssertionError:
            self.stop()
            raise AssertionError(f"gateway did not start: {log.read_text(errors='replace')[-2000:]}") from None

    def _up(self, path: str) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"gateway exited {self.proc.returncode}: {self.log.read_text(errors='replace')[-2000:]}")
        try:
            return httpx.get(self.url + path, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._out.close()


def sglang_gateway(workers: list[str], log: Path, extra: list[str] | tuple[str, ...] = (),
                   package: str = SGLANG_ROUTER, key: str | None = None) -> Gateway:
    """The SGLang Model Gateway on a free loopback port with ``workers`` and ``extra`` flags (e.g. a
    generated inpath/*.flags file's); ``package`` is ``sglang_router`` (0.3.2) or ``smg`` (1.13),
    started as ``python -m <package>.launch_router``. ``key``: smg's control plane closed, this the
    one admin key (``--control-plane-api-keys``). Ready when all workers are healthy."""
    need(sys.executable)
    try:
        __import__(package)
    except ImportError:
        need(package, "install the test extra (requirements/test.lock)")
    port, metrics = free_port(), free_port()
    argv = [sys.executable, "-m", f"{package}.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics), "--log-level", "warn",
            *extra, *(["--control-plane-api-keys", f"fusebox-fuse:fusebox fuse:admin:{key}"] if key else []),
            "--worker-urls", *workers]
    gw = Gateway(argv, f"http://127.0.0.1:{port}", "/readiness", log)
    gw.metrics_url = f"http://127.0.0.1:{metrics}/metrics"
    wait_for(lambda: len(sglang_workers(gw.url, key)) == len(workers), 30, what="the gateway's workers")
    return gw


def sglang_workers(url: str, key: str | None = None) -> dict[str, dict]:
    """The SGLang gateway's own worker list (GET /workers): url -> worker; ``key``: its control-plane key."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.get(url + "/workers", headers=headers, timeout=5)
    r.raise_for_status()
    return {w["url"]: w for w in r.json()["workers"]}


def vllm_router(workers: list[str], log: Path) -> Gateway:
    """The vLLM router on a free loopback port with ``workers``."""
    exe = need(str(Path(sys.executable).parent / "vllm-router"), "install the test extra (requirements/test.lock)")
    port, metrics = free_port(), free_port()
    argv = [exe, "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics), "--log-level", "warning", "--worker-urls", *workers]
    return Gateway(argv, f"http://127.0.0.1:{port}", "/list_workers", log)


def vllm_workers(url: str) -> list[str]:
    """The vLLM router's own worker list (GET /list_workers)."""
    return list(httpx.get(url + "/list_workers", timeout=5).json()["urls"])

