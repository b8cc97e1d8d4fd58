"""The spec-built factory: one adapter per ``fuse.adapters`` entry (:func:`build_adapters`)."""

from __future__ import annotations

from dataclasses import replace

from fusebox.spec import adapter_kinds

from .haproxy import HaproxyRuntime
from .http import HttpAction
from .sglang_gateway import SglangGateway
from .vllm_router import VllmRouter

__all__ = ["RUNTIME_CLASSES", "build_adapters", "runtime_class"]

# kind (fusebox.spec.adapter_kinds.ADAPTER_KINDS, by the kinds' own names) -> the class that calls
# it, built with the kind's normalised spec (fusebox.spec.adapters.Adapter). Every registered kind
# has one (tests/spec/test_adapter_kinds.py).
RUNTIME_CLASSES: dict[str, type] = {
    adapter_kinds.sglang_gateway.KIND.name: SglangGateway,
    adapter_kinds.vllm_router.KIND.name: VllmRouter,
    adapter_kinds.haproxy.KIND.name: HaproxyRuntime,
    adapter_kinds.http.KIND.name: HttpAction,
}


def runtime_class(kind: str) -> type:
    """The runtime adapter class of adapter kind ``kind``; LookupError naming the kind when it has
    none (a kind registered in ``fusebox/spec/adapter_kinds`` without a class in :data:`RUNTIME_CLASSES`)."""
    try:
        return RUNTIME_CLASSES[kind]
    except KeyError:
        raise LookupError(f"adapter kind {kind!r} has no runtime class: add it to RUNTIME_CLASSES in "
                          "fuse/adapters/factory.py") from None


def build_adapters(specs, prometheus_url: str | None = None) -> list:
    """One adapter per ``spec.adapters`` entry, in order; those that keep holds have ``attach(store)``
    (:class:`fusebox.fuse.service.FuseService` calls it). ``prometheus_url``: where a ``discover``
    without its own ``prometheus`` reads (``--prometheus-url``). Raises OSError (a headers file),
    ValueError (a ``discover`` with no Prometheus URL at all), LookupError (a kind without a runtime
    class: :func:`runtime_class`); a ``credentials_file`` that cannot be read raises OSError or
    ValueError naming ``fuse.adapters.<name>.credentials_file``."""
    out: list = []
    for a in specs:
        if a.discover is not None and not a.discover.prometheus:
            if not prometheus_url:
                raise ValueError(f"fuse.adapters.{a.name}.discover names no prometheus and the fuse has no "
                                 "--prometheus-url -- give --prometheus-url (kubernetes.fuse.prometheus_url in the "
                                 "generated Deployment) or discover.prometheus")
            a = replace(a, discover=replace(a.discover, prometheus=prometheus_url.rstrip("/")))
        try:
            out.append(runtime_class(a.kind)(a))
        except (OSError, ValueError) as e:
            if a.credentials_file is None:
                raise
            raise type(e)(f"fuse.adapters.{a.name}.credentials_file: {e} -- put the gateway's control-plane key "
                          "there (smg --control-plane-api-keys, role admin; the fuse sends it as Authorization: "
                          "Bearer): on Kubernetes create the Secret kubernetes.fuse.gateway_secret names") from None
    return out
