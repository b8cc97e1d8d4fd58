"""The vLLM router (``vllm-router``, a fork of it) as a ``fuse.adapters`` kind, ``vllm_router``.

``POST /remove_worker?url=`` on a trip and ``POST /add_worker?url=`` on release (its API takes the
URL only: there are no settings to keep); ``observe``: ``GET /list_workers``. vllm-router 0.1.17
has no closed control plane (its ``--api-key`` is for the workers): a ``credentials_file`` is sent
all the same (``Authorization: Bearer``), for a proxy in front of it or a fork that checks it.
"""

from __future__ import annotations

from .base import Rotation

__all__ = ["VllmRouter"]


class VllmRouter(Rotation):
    """The vLLM router's ``/add_worker``, ``/remove_worker`` and ``/list_workers`` (vllm-router 0.1)."""

    kind = "vllm_router"

    def workers(self) -> list[str]:
        """The router's own worker URLs (``GET /list_workers``: ``{"urls": [...]}``)."""
        r = self._req("GET", "/list_workers")
        self._check(r)
        return [u.rstrip("/") for u in r.json().get("urls", [])]

    def worker_urls(self) -> list[str]:
        return self.workers()
    def listed(self) -> set[str]:
        return set(self.workers())

    def take_out(self, worker: str) -> None:
        self._check(self._req("POST", "/remove_worker", params={"url": worker}))

    def put_back(self, worker: str) -> None:
        if worker in self.workers():
            return
        r = self._req("POST", "/add_worker", params={"url": worker})
        if r.status_code == 400 and "already exists" in r.text:
            return
        self._check(r)
