"""Stand-in engines for the demo's SGLang Model Gateway (and the adapter tests and bench).

A stand-in stands where a GPU engine would: it answers what the gateway probes when a worker is
added and on its health checks (sglang-router 0.3.2 calls ``GET /health``, ``/model_info`` and
``/server_info``; vllm-router 0.1.17 ``GET /health``) with 200 and a small JSON body, and records
every (method, path) it is asked for in ``seen``. It serves no inference. Given a ``hold`` event,
it answers a POST only once the event is set (60 s at most), counting the POSTs it holds in
``holding``: a running request, for the tests of the gateway's concurrency bound. With
``fail_posts=True`` it answers every POST with 500 (a failing engine, for the gateway's breaker).
Given ``metrics`` (a callable returning Prometheus text), ``GET /metrics`` answers what it returns
at that moment: an engine's own /metrics (a vLLM dump whose numbers a test controls).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["StandInEngine"]


class StandInEngine:
    """An engine on ``host`` (``port``, else a free one) in a background thread; ``url``; ``stop()``."""

    def __init__(self, host: str = "127.0.0.1", hold: threading.Event | None = None, fail_posts: bool = False,
                 metrics: Callable[[], str] | None = None, port: int = 0):
        self.seen: list[tuple[str, str]] = []
        self.holding = 0  # POSTs waiting on `hold` now
        lock = threading.Lock()
        eng = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, obj, code: int = 200):
                eng.seen.append((self.command, self.path))
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if metrics is not None and self.path.split("?")[0] == "/metrics":
                    eng.seen.append((self.command, self.path))
                    text = metrics().encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
                    return
                if self.path.startswith("/v1/models"):
                    return self._send({"object": "list", "data": [{"id": "stand-in", "object": "model"}]})
                self._send({"model_path": "stand-in", "is_generation": True})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if hold is not None:
                    with lock:
                        eng.holding += 1
                    try:
                        hold.wait(60)
                    finally:
                        with lock:
                            eng.holding -= 1
                self._send({"error": "stand-in set to fail"} if fail_posts else {}, 500 if fail_posts else 200)

        self.server = ThreadingHTTPServer((host, port), H)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="stand-in-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)
