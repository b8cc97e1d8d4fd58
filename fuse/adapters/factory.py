"""The spec-built factory: one adapter per ``fuse.adapters`` entry (:func:`build_adapters`)."""

from __future__ import annotations

from dataclasses import replace

from .haproxy import HaproxyRuntime
from .http import HttpAction
from .sglang_gateway import SglangGateway
from .vllm_router import VllmRouter

__all__ = ["build_adapters"]


def build_adapters(specs, prometheus_url: str | None = None) -> list:
    """One adapter per ``spec.adapters`` entry, in order; those that keep holds have ``attach(store)``
    (:class:`fusebox.fuse.service.FuseService` calls it). ``prometheus_url``: where a ``discover``
    without its own ``prometheus`` reads (``--prometheus-url``). Raises OSError (a headers file),
    ValueError (a ``discover`` with no Prometheus URL at all); a ``credentials_file`` that cannot
    be read raises OSError or ValueError naming ``fuse.adapters.<name>.credentials_file``."""
    kinds = {"sglang_gateway": SglangGateway, "vllm_router": VllmRouter, "haproxy": HaproxyRuntime}
    out: list = []
    for a in specs:
        if a.discover is not None and not a.discover.prometheus:
            if not prometheus_url:
                raise ValueError(f"fuse.adapters.{a.name}.discover names no prometheus and the fuse has no "
                                 "--prometheus-url -- give --prometheus-url (kubernetes.fuse.prometheus_url in the "
                                 "generated Deployment) or discover.prometheus")
            a = replace(a, discover=replace(a.discover, prometheus=prometheus_url.rstrip("/")))
        try:
            out.append(HttpAction(a) if a.kind == "http" else kinds[a.kind](a))
        except (OSError, ValueError) as e:
            if a.credentials_file is None:
                raise
            raise type(e)(f"fuse.adapters.{a.name}.credentials_file: {e} -- put the gateway's control-plane key "
                          "there (smg --control-plane-api-keys, role admin; the fuse sends it as Authorization: "
                          "Bearer): on Kubernetes create the Secret kubernetes.fuse.gateway_secret names") from None
    return out
