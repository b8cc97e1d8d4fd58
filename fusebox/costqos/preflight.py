"""What ``fusebox costqos run`` checks before it starts kopf: credentials, the API server, Prometheus.

Each check returns a sentence (or raises :class:`PreflightError` with one) in place of kopf's own
behaviour, which is to retry a missing login every 60 s forever and to end an unreachable API
server in pages of tracebacks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from .prom import MetricsError, query_range

__all__ = ["PreflightError", "kube_client", "wait_for_api", "prometheus_first_query"]

log = logging.getLogger("fusebox.costqos")


class PreflightError(Exception):
    """A check that failed: ``str(e)`` is one line saying what and how to fix it."""


def kube_client(kubeconfig: str | None) -> tuple[Any, str]:
    """An ``ApiClient`` logged in as kopf will log in (the pod's ServiceAccount first, then
    ``kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``) and the API server's URL.
    PreflightError when there are no credentials at all. Reads files only: no request is sent."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)
    except ConfigException:
        try:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        except (ConfigException, OSError) as e:
            raise PreflightError(
                f"no Kubernetes credentials: not in a pod with a ServiceAccount and no kubeconfig ({e}) -- pass "
                "--kubeconfig FILE, set KUBECONFIG, or run it in a pod with a ServiceAccount") from None
    cfg.retries = 0  # one request per attempt: the attempts are ours (wait_for_api)
    return client.ApiClient(cfg), cfg.host


def wait_for_api(api: Any, host: str, wait_s: float, timeout_s: float = 5.0,
                 sleep: Callable[[float], None] = time.sleep) -> int:
    """GET ``/version`` until the API server answers (any HTTP status counts: it is up) or
    ``wait_s`` seconds have passed; one log line per failed attempt, waits of 1, 2, 4, 8 then 15 s
    between them. The number of attempts it took; PreflightError naming ``host``, the attempts,
    the seconds and the last error when it gives up."""
    from kubernetes.client import VersionApi
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    t0, attempt, pause = time.monotonic(), 0, 1.0
    while True:
        attempt += 1
        try:
            VersionApi(api).get_code(_request_timeout=timeout_s)
            return attempt
        except ApiException:
            return attempt  # 401, 403: it answered; kopf reports the credentials' own trouble
        except (HTTPError, OSError) as e:
            last = _reason(e)
        spent = time.monotonic() - t0
        if spent + pause > wait_s:
            raise PreflightError(f"the API server {host} did not answer in {attempt} attempt(s) over {spent:.0f} s: "
                                 f"{last} -- check that it is up and that the kubeconfig names it "
                                 "(--api-wait S to wait longer)")
        log.warning("API server %s: attempt %d: %s; next in %g s", host, attempt, last, pause)
        sleep(pause)
        pause = min(pause * 2, 15.0)


def _reason(e: BaseException) -> str:
    """urllib3's innermost reason, with its type (``NewConnectionError: HTTPSConnection(host=...,
    port=...): Failed to establish a new connection: [Errno 111] Connection refused``)."""
    while getattr(e, "reason", None) is not None and isinstance(e.reason, BaseException):  # type: ignore[attr-defined]
        e = e.reason  # type: ignore[attr-defined]
    return f"{type(e).__name__}: {e}"


async def prometheus_first_query(url: str, step_s: float, timeout_s: float) -> str | None:
    """One range query (``vector(1)`` over the last step) to ``url``: None when it answers, else
    the error as one sentence. Not fatal: the policies carry MetricsAvailable False meanwhile."""
    async with httpx.AsyncClient(timeout=timeout_s) as c:
        end = time.time()
        try:
            await query_range(c, url, "vector(1)", end - step_s, end, step_s)
        except MetricsError as e:
            return str(e)
    return None
