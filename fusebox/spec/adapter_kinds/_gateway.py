"""The gateway kinds' shared shape (sglang_gateway, vllm_router): an inference gateway with its own
control API, whose workers the fuse takes out of rotation (levels 1 and 3; no text-only path, so
level 2 is refused at load). Each target names a worker by ``worker_url``; GPU and engine scopes
may instead be discovered (``discover``), and the gateway's control-plane key may be sent
(``credentials_file``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from fusebox import conventions as C

from .base import AdapterKind, Err, http_url

if TYPE_CHECKING:
    from fusebox.spec.adapters import Adapter, RawAdapter, RawTarget
    from fusebox.spec.normalised import Spec

__all__ = ["GatewayKind"]


class GatewayKind(AdapterKind):
    """A gateway whose workers are taken out of rotation: level 3 applied as that (the engine's KV
    drains as its requests finish)."""

    levels: ClassVar[tuple[int, ...]] = (1, 3)
    discovers = True
    credentials = True

    def check_adapter(self, a: RawAdapter, name: str, path: tuple, err: Err) -> None:
        """``url``: the gateway's, http or https."""
        if not (a.url and http_url(a.url)):
            err(path + (("url",) if a.url else ()), f"adapter {name!r} needs the gateway's url", "e.g. url: http://127.0.0.1:30000")

    def check_target(self, t: RawTarget, path: tuple, err: Err) -> None:
        """Each target names its worker: ``worker_url``, http or https."""
        if not (t.worker_url and http_url(t.worker_url)):
            err(path, "this target needs a worker_url (http or https)", "e.g. worker_url: http://10.0.0.5:30001")

    def warnings(self, a: Adapter, spec: Spec, prometheus_example: str) -> list[str]:
        """A ``discover`` without ``prometheus`` while the generated fuse Deployment passes no
        ``--prometheus-url``, a ``credentials_file`` while ``kubernetes.fuse.gateway_secret`` is
        unset: either way the generated Deployment exits 2 at start."""
        out = []
        kf = spec.kubernetes.fuse
        # the Deployment's --prometheus-url: kubernetes.fuse.prometheus_url, or given in its args
        deployment_has_prometheus = bool(kf.prometheus_url) or any(x.split("=", 1)[0] == "--prometheus-url" for x in kf.args)
        if a.discover is not None and not a.discover.prometheus and kf.enabled and not deployment_has_prometheus:
            out.append(f"fuse.adapters.{a.name}.discover names no prometheus and kubernetes.fuse.prometheus_url is not "
                       "set: the generated fuse Deployment cannot start with it -- set kubernetes.fuse.prometheus_url "
                       f"({prometheus_example})")
        if a.credentials_file and kf.enabled and kf.gateway_secret is None:
            out.append(f"fuse.adapters.{a.name}.credentials_file is set and kubernetes.fuse.gateway_secret is not: the "
                       "generated fuse Deployment mounts no key there and cannot start with it -- set "
                       f"kubernetes.fuse.gateway_secret: {{name: fusebox-gateway-key, key: key}} and credentials_file: "
                       f"{C.K8S['gateway_key_dir']}/key")
        return out
