"""Helpers shared by tests/fuse/test_fuse_*.py: payload builders, free ports, a live service in a thread."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from _support import missing

from fusebox.tooling import free_port  # noqa: F401  (re-exported to the tests)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "fuse"
SPEC = ROOT / "fusebox.yaml"
TOKEN = "s3cret-fuse-token-0123456789abcdef"  # the webhook token (Alertmanager); 32+ characters, as files need
GW_TOKEN = "gateway-bearer-token-0123456789abcdef"  # the gateway's token; 32+ characters, as the fuse requires
# Override tokens, one per person (--override-tokens: "name token" lines).
PEOPLE = {"alice": "alice-override-token-0001-abcdefgh", "bob": "bob-override-token-0002-abcdefghij"}

# The spec's critical tiers (fusebox.yaml): alertname -> (signal, action, level).
CRITICAL = {
    "GPUMemoryUtilizationHigh": ("gpu_memory_utilization", "freeze_admissions", 1),
    "AlignmentLatencyP95High": ("alignment_latency_p95", "text_only_fallback", 2),
    "KVCacheGrowthRateHigh": ("kv_cache_growth_rate", "kv_cache_eviction", 3),
}


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"


def alert(name: str, status: str = "firing", starts: float = 1_700_000_000.0, *, severity: str = "critical",
          fuse_labels: bool = True, **scope) -> dict:
    """One webhook alert as the generated rules label it (critical tiers carry fuse_* labels)."""
    labels = {"alertname": name, "severity": severity, **scope}
    if name in CRITICAL:
        labels["signal"] = CRITICAL[name][0]
        if severity == "critical" and fuse_labels:
            labels["fuse_action"] = CRITICAL[name][1]
            labels["fuse_level"] = str(CRITICAL[name][2])
    from fusebox.fuse import fingerprint

    return {"status": status, "labels": labels, "annotations": {}, "startsAt": iso(starts),
            "endsAt": iso(starts + 60) if status == "resolved" else "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph", "fingerprint": fingerprint(labels)}


def payload(*alerts: dict, truncated: int = 0) -> dict:
    status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
    return {"version": "4", "groupKey": '{}:{alertname="x"}', "truncatedAlerts": truncated, "status": status,
            "receiver": "fusebox-fuse", "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093", "alerts": list(alerts)}


def wait_for(pred, timeout: float = 10.0, step: float = 0.02, what: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def need_tool(*names: str) -> str:
    """The first of ``names`` on PATH; when none is, skip, or fail under CI (_support.missing)."""
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    missing(f"{' or '.join(names)} not found: run `make tools` (tools/bootstrap.sh)")


class LiveService:
    """``fusebox fuse serve`` in this process: FuseService + FastAPI app under uvicorn in a thread."""

    def __init__(self, state_path, gateway_url=None, *, hold_s=0.5, backoff_s=0.02, backoff_max_s=0.2,
                 tick_s=0.02, dry_run=False, adapters=None, clock=None, links=None):
        import uvicorn

        from fusebox.fuse.adapters.gateway import DryRun, HttpGateway
        from fusebox.fuse.http.app import create_app
        from fusebox.fuse.rules import FuseRules
        from fusebox.fuse.service import FuseService
        from fusebox.fuse.store import Store
        from fusebox.fuse.tokens import Tokens
        from fusebox.spec import load_spec

        if adapters is None:
            adapters = [DryRun()] if dry_run else [HttpGateway(gateway_url, GW_TOKEN, timeout_s=1.0)]
        self.service = FuseService(FuseRules.from_spec(load_spec(SPEC)), Store(state_path), adapters,
                                   hold_s=hold_s, backoff_s=backoff_s, backoff_max_s=backoff_max_s,
                                   tick_s=tick_s, dry_run=dry_run, **({"clock": clock} if clock else {}))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(self.service, Tokens(webhook=TOKEN, people=dict(PEOPLE)), links=links)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error",
                                                    access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.service.start()
        self.thread.start()
        wait_for(lambda: self.server.started, 10, what="uvicorn start")
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.service.stop()
        self.service.store.close()

    def post(self, body, path="/alertmanager", token=None) -> httpx.Response:
        """POST ``body``; ``token`` None: the webhook token for /alertmanager, alice's for /override."""
        if token is None:
            token = PEOPLE["alice"] if path == "/override" else TOKEN
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(self.url + path, json=body, headers=headers, timeout=10)

    def state(self) -> dict:
        return httpx.get(self.url + "/state", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()


def dry_run_service(tmp_path: Path):
    """A FuseService on the shipped spec, a fresh SQLite store under ``tmp_path``, dry-run, 60 s hold:
    what the HTTP-level tests drive through FastAPI's TestClient. Close ``.store`` after."""
    from fusebox.fuse.adapters.gateway import DryRun
    from fusebox.fuse.rules import FuseRules
    from fusebox.fuse.service import FuseService
    from fusebox.fuse.store import Store

    return FuseService(FuseRules.from_spec(shipped_spec()), Store(tmp_path / "fuse.sqlite"), [DryRun()],
                       hold_s=60, dry_run=True)


@functools.cache
def shipped_spec():
    """The shipped spec, loaded once per session (a frozen Spec, as conftest's ``spec`` fixture shares it)."""
    from fusebox.spec import load_spec

    return load_spec(SPEC)


def fuse_client(svc, *, raise_server_exceptions: bool = True, **app_kw):
    """A FastAPI TestClient on ``svc``'s app with the tests' tokens (webhook ``TOKEN``, people
    ``PEOPLE``); ``app_kw`` goes to create_app (``max_body=...``). ``raise_server_exceptions=False``
    answers a server error 500, as uvicorn would, instead of raising it into the test."""
    from fastapi.testclient import TestClient

    from fusebox.fuse.http.app import create_app
    from fusebox.fuse.tokens import Tokens

    return TestClient(create_app(svc, Tokens(webhook=TOKEN, people=dict(PEOPLE)), **app_kw),
                      raise_server_exceptions=raise_server_exceptions)


def am_config(group_by: str, group_wait: str, group_interval: str, max_alerts: int | None = None) -> str:
    """An Alertmanager config (YAML text) routing everything to one receiver, the fuse's webhook
    (send_resolved, its bearer token from a file), repeat_interval 1h; ``group_by`` the label list's
    inside (``"alertname, cluster, hw_id"``), ``max_alerts`` the webhook's (None: not set). The text
    keeps ``{url}`` (the fuse's base URL) and ``{token_file}`` for ``str.format``."""
    limit = "" if max_alerts is None else f"        max_alerts: {max_alerts}\n"
    return (f"\nroute:\n  receiver: fusebox-fuse\n  group_by: [{group_by}]\n  group_wait: {group_wait}\n"
            f"  group_interval: {group_interval}\n  repeat_interval: 1h\nreceivers:\n  - name: fusebox-fuse\n"
            f"    webhook_configs:\n      - url: {{url}}/alertmanager\n        send_resolved: true\n{limit}"
            "        http_config:\n          authorization:\n            credentials_file: {token_file}\n")


def generated_am_config(text: str):
    """``(spec, config)``: the spec parsed from ``text`` (the shipped spec's YAML, edited) and the
    Alertmanager config `fusebox generate` renders from it (YAML text), its fuse webhook URL and
    token file left as ``{url}/alertmanager`` and ``{token_file}`` for ``str.format`` (the
    ``alertmanager`` fixture's ``config``)."""
    from fusebox.generator.render_alertmanager import render_alertmanager
    from fusebox.generator.yamlout import dump_yaml
    from fusebox.spec import parse_spec

    spec = parse_spec(text.replace("webhook_url: http://127.0.0.1:9095/alertmanager", "webhook_url: URL", 1)
                      .replace("credentials_file: /etc/alertmanager/fusebox-fuse.token", "credentials_file: TOKEN_FILE", 1),
                      "fusebox.yaml")
    return spec, dump_yaml(render_alertmanager(spec)).replace("URL", "{url}/alertmanager").replace("TOKEN_FILE", "{token_file}")


def serve_dry_run(state: Path, token_file: Path) -> tuple[subprocess.Popen, str]:
    """``fusebox fuse serve --dry-run --hold 3600`` on the shipped spec as a process of its own, its
    store at ``state``, its webhook token read from ``token_file``, on a free loopback port, log
    level warning, output discarded: ``(process, base URL)``. Wait for it with wait_ok(URL + "/healthz", process);
    terminate it after."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(SPEC), "--listen",
                             f"127.0.0.1:{port}", "--state", str(state), "--token-file", str(token_file),
                             "--dry-run", "--hold", "3600", "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def wait_ok(url: str, proc: subprocess.Popen, bound: float = 60.0) -> None:
    """Wait until a GET of ``url`` (a readiness or health path of the server ``proc`` runs) answers
    200, at most ``bound`` s (AssertionError then); AssertionError at once, naming its exit status,
    if ``proc`` exits first."""
    def ok() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited with status {proc.returncode} before {url} answered")
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ok, bound, 0.1, f"{url} to answer 200")
