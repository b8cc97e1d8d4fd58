"""Kind ``vllm_router``: the vLLM router (``vllm-router``), a worker removed from and added back to
its own worker list (runtime: ``fuse/adapters/vllm_router.py``)."""

from __future__ import annotations

from ._gateway import GatewayKind

__all__ = ["KIND", "VllmRouterKind"]


class VllmRouterKind(GatewayKind):
    name = "vllm_router"


KIND = VllmRouterKind()
