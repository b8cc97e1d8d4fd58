"""Adapter kinds: one module each (sglang_gateway, vllm_router, haproxy, http), registered here.

An adapter kind is what ``fuse.adapters.<name>.kind`` names: a gateway or API the fuse acts on.
Its module holds the fuse levels it can apply, the checks of its fields and its ``fusebox
generate`` warnings (:class:`~.base.AdapterKind`); its runtime class lives in ``fuse/adapters/``,
found by name (``fuse/adapters/factory.py``). The order of :data:`ADAPTER_KINDS` is the order
the spec's ``kind`` values are listed in its errors, and the order the kind-only fields are
checked in. To add a kind: write a module with an :class:`~.base.AdapterKind` subclass and its
``KIND`` instance, and list it below (docs/architecture.md, "Where to add an adapter kind").
"""

from __future__ import annotations

from . import haproxy, http, sglang_gateway, vllm_router
from .base import AdapterKind, Err, http_url

__all__ = ["ADAPTER_KINDS", "ADAPTER_LEVELS", "AdapterKind", "CREDENTIAL_KINDS", "DISCOVER_KINDS", "Err", "adapter_kind",
           "http_url"]

ADAPTER_KINDS: dict[str, AdapterKind] = {k.name: k for k in (sglang_gateway.KIND, vllm_router.KIND, haproxy.KIND, http.KIND)}

# kind -> the fuse levels it can apply (1 freeze admissions, 2 text-only fallback, 3 KV-cache eviction)
ADAPTER_LEVELS: dict[str, tuple[int, ...]] = {name: k.levels for name, k in ADAPTER_KINDS.items()}
# Kinds whose targets can be discovered (the gateway's own worker list is joined with the pods).
DISCOVER_KINDS: tuple[str, ...] = tuple(name for name, k in ADAPTER_KINDS.items() if k.discovers)
# Kinds that send a control-plane credential from ``credentials_file`` (the gateways' own APIs).
CREDENTIAL_KINDS: tuple[str, ...] = tuple(name for name, k in ADAPTER_KINDS.items() if k.credentials)


def adapter_kind(name: str) -> AdapterKind:
    """The :class:`AdapterKind` named ``name`` (the spec's ``kind``); KeyError for an unknown one."""
    return ADAPTER_KINDS[name]
