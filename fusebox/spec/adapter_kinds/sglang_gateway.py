"""Kind ``sglang_gateway``: the SGLang Model Gateway (``sglang-router``, smg), a worker taken out of
rotation and put back through its ``/workers`` API (runtime: ``fuse/adapters/sglang_gateway.py``)."""

from __future__ import annotations

from ._gateway import GatewayKind

__all__ = ["KIND", "SglangGatewayKind"]


class SglangGatewayKind(GatewayKind):
    name = "sglang_gateway"


KIND = SglangGatewayKind()
