"""The SGLang Model Gateway (``sglang-router``) as a ``fuse.adapters`` kind, ``sglang_gateway``.

Trip = take the target's worker out of rotation (``GET /workers`` to find its id and record its
settings, then ``DELETE /workers/{id}``); release = ``POST /workers`` with the URL and the recorded
settings (priority, cost, model_id, worker_type...). Idempotent: a worker already out (or already
in) is left as it is. ``observe``: ``GET /workers``. smg 1.13 lists a removed worker with
``"status": "draining"`` for about five seconds before it drops it: such a worker is out of
rotation (a release meanwhile is answered 409 and retried). A gateway started with
``--control-plane-api-keys`` (smg 1.13) needs ``credentials_file`` (:class:`~.base.Rotation`).
"""

from __future__ import annotations

from urllib.parse import quote

from .base import Rotation

__all__ = ["SglangGateway", "WORKER_SETTINGS"]

# The fields of a worker in SGLang's GET /workers that POST /workers takes back (its WorkerConfigRequest).
WORKER_SETTINGS = ("model_id", "priority", "cost", "worker_type", "bootstrap_port", "labels", "api_key",
                   "disable_health_check", "tokenizer_path", "reasoning_parser", "tool_parser", "chat_template")


class SglangGateway(Rotation):
    """The SGLang Model Gateway's ``/workers`` API (sglang-router 0.3)."""

    kind = "sglang_gateway"

    def workers(self) -> list[dict]:
        """The gateway's own worker list (``GET /workers``: ``{"workers": [{"id", "url", ...}]}``),
        without those smg 1.13 is draining (``"status": "draining"``: removed, out of rotation)."""
        r = self._req("GET", "/workers")
        self._check(r)
        return [w for w in r.json().get("workers", []) if w.get("status") != "draining"]

    def worker_urls(self) -> list[str]:
        return [str(w.get("url", "")).rstrip("/") for w in self.workers() if w.get("url")]
    def listed(self) -> set[str]:
        return {str(w.get("url", "")).rstrip("/") for w in self.workers()}

    def take_out(self, worker: str) -> None:
        for w in self.workers():
            if w.get("url", "").rstrip("/") == worker:
                self.holds.record(worker, {k: w[k] for k in WORKER_SETTINGS if k in w and w[k] is not None})
                r = self._req("DELETE", f"/workers/{quote(str(w['id']), safe='')}")
                self._check(r, ok=(404,))  # 404: removed meanwhile
        # not listed: already out of rotation (idempotent)

    def put_back(self, worker: str) -> None:
        if any(w.get("url", "").rstrip("/") == worker for w in self.workers()):
            return  # already in rotation
        settings = self.holds.settings(worker)
        r = self._req("POST", "/workers", json={**settings, "url": worker})
        self._check(r)
