"""Helpers shared by tests/test_fuse_*.py: payload builders, free ports, a live service in a thread."""

from __future__ import annotations

import os
import shutil
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

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
    """The first of ``names`` on PATH; skip (or fail under CI=true) when none is."""
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    msg = f"{' or '.join(names)} not found: run `make tools` (tools/bootstrap.sh)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg)
    pytest.skip(msg)


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
    from fusebox.spec import load_spec

    return FuseService(FuseRules.from_spec(load_spec(SPEC)), Store(tmp_path / "fuse.sqlite"), [DryRun()],
                       hold_s=60, dry_run=True)
