"""No credential of an adapter URL (``user:password@``, ``?token=``) reaches the start-up line, the
log or the audit, and a request body a gateway echoes in its error (a worker's ``api_key``) is not
recorded (issue 22). The fuse runs as ``fusebox fuse serve``; the gateways are HTTP servers on
loopback that answer errors echoing what they were sent, as some do."""

from __future__ import annotations

import json
import secrets
import sqlite3
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from _fuse_support import SPEC, TOKEN, alert, free_port, payload, wait_for
from _support import finish, yaml_data, yaml_text

from fusebox.fuse.logsafe import redact_url, redact_urls
from fusebox.fuse.store import store_label

SPASS, GPASS, QTOKEN = ("Sp-" + secrets.token_hex(8), "Gp-" + secrets.token_hex(8), "Qt-" + secrets.token_hex(8))
API_KEY = "sk-worker-" + secrets.token_hex(12)
WORKER = "http://127.0.0.1:1"  # never called: the gateway stand-in only lists it


class EchoGateway(ThreadingHTTPServer):
    """An SGLang-gateway-like ``/workers`` API (``sglang=True``: lists one worker with an
    ``api_key``, DELETE takes it out) that answers every POST 400 with the body it was sent and the
    request line (query included) in the text."""

    def __init__(self, sglang: bool):
        self.workers = [{"id": "w1", "url": WORKER, "api_key": API_KEY, "priority": 5}] if sglang else []
        self.requests: list[tuple[str, str]] = []
        gw = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body: bytes):
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                gw.requests.append(("GET", self.path))
                self._send(200, json.dumps({"workers": gw.workers}).encode())

            def do_DELETE(self):
                gw.requests.append(("DELETE", self.path))
                gw.workers = []
                self._send(200, b"{}")

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                gw.requests.append(("POST", self.path))
                self._send(400, b"invalid request " + self.path.encode() + b": " + body)

        super().__init__(("127.0.0.1", 0), H)
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture
def gateways():
    gws = EchoGateway(sglang=True), EchoGateway(sglang=False)
    yield gws
    for g in gws:
        g.shutdown()
        g.server_close()


def test_no_url_credential_nor_echoed_body_reaches_the_start_up_line_the_log_or_the_audit(tmp_path, gateways):
    sglang, plain = gateways
    data = yaml_data(SPEC.read_text(encoding="utf-8"))
    data["fuse"]["adapters"] = {"sglang": {
        "kind": "sglang_gateway", "url": f"http://admin:{SPASS}@127.0.0.1:{sglang.port}",
        "actions": ["kv_cache_eviction"], "timeout": "2s", "max_attempts": 1,
        "targets": [{"match": {"engine": "engine-0"}, "worker_url": WORKER}]}}
    spec = tmp_path / "fusebox.yaml"
    spec.write_text(yaml_text(data, sort_keys=False), encoding="utf-8")
    (tmp_path / "token").write_text(TOKEN + "\n")
    port, db = free_port(), tmp_path / "s.sqlite"
    url = f"http://127.0.0.1:{port}"
    p = subprocess.Popen(
        [sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(spec), "--listen", f"127.0.0.1:{port}",
         "--state", str(db), "--token-file", str(tmp_path / "token"), "--hold", "0.2", "--tick", "0.05",
         "--gateway-url", f"http://fuse:{GPASS}@127.0.0.1:{plain.port}",
         "--vllm-url", f"engine-0=http://127.0.0.1:{plain.port}/?token={QTOKEN}", "--vllm-max-attempts", "1",
         "--retry-backoff", "0.05", "--log-level", "info"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    hook = {"Authorization": f"Bearer {TOKEN}"}
    try:
        wait_for(lambda: _up(url), 30, 0.1, "fuse serve")
        fire = alert("KVCacheGrowthRateHigh", cluster="a", engine="engine-0")
        assert httpx.post(url + "/alertmanager", json=payload(fire), headers=hook, timeout=10).status_code == 200
        wait_for(lambda: ("DELETE", "/workers/w1") in sglang.requests, 15, 0.05, "the worker taken out")
        gone = alert("KVCacheGrowthRateHigh", "resolved", cluster="a", engine="engine-0")
        assert httpx.post(url + "/alertmanager", json=payload(gone), headers=hook, timeout=10).status_code == 200
        # the release puts the worker back with its recorded settings; the gateway echoes them in a 400
        wait_for(lambda: _failed(db, "sglang"), 60, 0.05, "the failed put-back audited")
        wait_for(lambda: len(_failed(db, "")) >= 3, 15, 0.05, "the gateway's and vLLM's failures audited")
    finally:
        p.terminate()
        _, _, err = finish(p)
    assert ("POST", "/workers") in sglang.requests  # the body with the api_key was sent, and echoed
    with sqlite3.connect(db) as c:
        recorded = json.dumps([c.execute("SELECT * FROM audit").fetchall(), c.execute("SELECT * FROM outbox").fetchall()])
    assert "HTTP 400 invalid request" in recorded  # the answer's text is kept...
    assert f"127.0.0.1:{sglang.port}" in err and f"127.0.0.1:{plain.port}" in err  # ...and the URLs shown
    for secret in (SPASS, GPASS, QTOKEN, API_KEY):  # ...without any credential
        assert secret not in err, (secret, err[-3000:])
        assert secret not in recorded, (secret, recorded[-3000:])


def _failed(db, adapter: str) -> list:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
            return c.execute("SELECT reason FROM audit WHERE kind = 'failed' AND source LIKE ?",
                             (f"%{adapter}%",)).fetchall()
    except sqlite3.Error:
        return []


def _up(url):
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("url,shown", [
    ("http://u:p@h:9/m?x=1", "http://h:9/m?x=1"),
    ("https://TOKEN@[::1]:8443/metrics", "https://[::1]:8443/metrics"),
    ("http://h/p?token=abc&a=b&api-key=k#f", "http://h/p?token=***&a=b&api-key=***#f"),
    ("postgresql://fusebox:pw@db:5432/fb?sslmode=require&password=x",
     "postgresql://fusebox@db:5432/fb?sslmode=require&password=***"),
    ("http://h/metrics", "http://h/metrics"),
])
def test_redact_url_leaves_passwords_tokens_and_secret_parameters_out(url, shown):
    assert redact_url(url) == shown
    assert store_label(url) == shown  # the store's label is the same function
    assert redact_urls(f"POST {url}: HTTP 400.") == f"POST {shown}: HTTP 400."


def test_a_libpq_key_value_string_hides_its_password():
    assert store_label("host=db user=x password='s e c' dbname=f") == "host=db user=x password=*** dbname=f"
