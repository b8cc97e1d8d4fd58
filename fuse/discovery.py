"""GPU scope -> the gateway's workers on that GPU, from trusted sources only.

A GPU-level alert's scope is ``{cluster, host_name, hw_id}``; a gateway knows workers by URL. The
join (``fuse.adapters.<name>.discover`` in the spec, :class:`fusebox.spec.adapters.Discover`):

1. the pods on each GPU: every series of the attribution metric in Prometheus (dcgm-exporter with
   Kubernetes pod mapping publishes ``DCGM_FI_DEV_FB_USED{UUID, pod, namespace, container}``), GPU
   id from its ``gpu`` label (the scope's ``hw_id``; on a MIG instance ``<gpu>/<GPU_I_ID>``, as the
   rules build it), pod from its ``pod``/``namespace`` labels;
2. each pod's IP: kube-state-metrics' ``kube_pod_info{namespace, pod, pod_ip}``;
3. the gateway's OWN worker list: a worker is on the GPU when its URL's host is one of those IPs.

The queries are fixed strings from the spec (``GET /api/v1/query``); no label value of the alert
is ever put into a query, a URL or a call: the scope's ``hw_id`` (and ``cluster`` when the series
carry one) is only compared with the values Prometheus returned, and only worker URLs the gateway
itself listed are ever taken out. Both tables are cached for ``ttl_s`` seconds (bounded: the spec
allows 1 s to 10 min). A failure is never a silent success: :class:`ResolveError` says why
(Prometheus unreachable: retryable; no pod on the GPU, no worker at its pods: permanent).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

import httpx

from fusebox.spec.adapters import Discover

from .actions import ActionError, deadline_client

__all__ = ["GpuWorkers", "ResolveError", "POD_INFO_METRIC"]

POD_INFO_METRIC = "kube_pod_info"  # kube-state-metrics: {namespace, pod, pod_ip, node, ...}, value 1
# dcgm-exporter on a MIG instance: the parent GPU's UUID plus the instance's id in this label. The
# rules' hw_id is then ``UUID/GPU_I_ID`` (fusebox.spec.kinds.base.dcgm_labels); the join keys alike.
MIG_INSTANCE_LABEL = "GPU_I_ID"


class ResolveError(ActionError):
    """The scope could not be resolved to workers; ``permanent`` when asking again cannot help."""

    def __init__(self, message: str, summary: str, permanent: bool):
        super().__init__(message, summary=summary)
        self.permanent = permanent


class GpuWorkers:
    """Resolve a GPU scope to worker URLs (see the module's doc).

    Args:
        spec: the adapter's ``discover``.
        timeout_s: per Prometheus query, seconds.
        clock: monotonic seconds (the cache's age).
    """

    def __init__(self, spec: Discover, timeout_s: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.spec = spec
        self.clock = clock
        self._client = deadline_client(timeout_s)  # inside the adapter call's deadline (call_deadline)
        self._lock = threading.Lock()
        self._at: float | None = None
        self._pods: dict[str, set[tuple[str, str, str]]] = {}  # gpu id -> {(cluster, namespace, pod)}
        self._ips: dict[tuple[str, str, str], str] = {}  # (cluster, namespace, pod) -> pod IP
        self.queries = 0  # Prometheus queries made (the cache's effect, for tests)

    def _query(self, expr: str) -> list[dict]:
        url = f"{self.spec.prometheus}/api/v1/query"
        try:
            r = self._client.get(url, params={"query": expr})
            self.queries += 1
            body = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as e:
            raise ResolveError(f"{url}: {type(e).__name__}: {e}", f"GPU attribution: Prometheus {type(e).__name__}",
                               False) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ResolveError(f"{url} ({expr}): HTTP {r.status_code} {r.text[:200]}",
                               f"GPU attribution: Prometheus HTTP {r.status_code}", False)
        return list(body.get("data", {}).get("result", []))

    def _refresh(self) -> None:
        s = self.spec
        pods: dict[str, set[tuple[str, str, str]]] = {}
        for series in self._query(s.metric):
            m = series.get("metric", {})
            gpu, ns, pod = m.get(s.gpu), m.get(s.namespace), m.get(s.pod)
            if gpu and m.get(MIG_INSTANCE_LABEL):  # a MIG instance: its own hw_id, as the rules build it
                gpu = f"{gpu}/{m[MIG_INSTANCE_LABEL]}"
            if gpu and ns and pod:
                pods.setdefault(gpu, set()).add((m.get("cluster", ""), ns, pod))
        ips: dict[tuple[str, str, str], str] = {}
        for series in self._query(POD_INFO_METRIC):
            m = series.get("metric", {})
            if m.get("namespace") and m.get("pod") and m.get("pod_ip"):
                ips[(m.get("cluster", ""), m["namespace"], m["pod"])] = m["pod_ip"]
        self._pods, self._ips, self._at = pods, ips, self.clock()

    def pod_ips(self, scope: dict) -> set[str]:
        """The IPs of the pods on the scope's GPU (``hw_id``); raises :class:`ResolveError`."""
        gpu = scope.get("hw_id")
        if not isinstance(gpu, str) or not gpu:
            raise ResolveError("the scope names no GPU (hw_id): nothing to discover", "scope names no GPU: refused", True)
        with self._lock:
            if self._at is None or self.clock() - self._at > self.spec.ttl_s:
                self._refresh()
            pods, ips = self._pods.get(gpu, set()), self._ips
        cluster = scope.get("cluster")
        # a series without a cluster label (one Prometheus per cluster) matches any cluster
        pods = {p for p in pods if not p[0] or not cluster or p[0] == cluster}
        if not pods:
            raise ResolveError(f"no pod on this GPU in {self.spec.metric}{{{self.spec.pod}, {self.spec.namespace}}}: "
                               "refused, nothing sent", "GPU not attributed to any pod: refused", True)
        found = {ips[p] for p in pods if p in ips}
        if not found:
            # cluster-less kube_pod_info against cluster-labelled attribution (or the reverse)
            found = {ip for (c, ns, pod), ip in ips.items() for (_, ns2, pod2) in pods if (ns, pod) == (ns2, pod2)}
        if not found:
            raise ResolveError(f"no {POD_INFO_METRIC}{{pod_ip}} for the {len(pods)} pod(s) on this GPU: refused, nothing sent",
                               "pods on the GPU have no known IP: refused", True)
        return found

    def workers(self, scope: dict, listed: Iterable[str]) -> list[str]:
        """The worker URLs of ``listed`` (the gateway's own list) whose host is a pod IP on the
        scope's GPU, sorted; raises :class:`ResolveError` when there is none."""
        ips = self.pod_ips(scope)
        out = sorted({u.rstrip("/") for u in listed if (urlsplit(u).hostname or "") in ips})
        if not out:
            raise ResolveError(f"the gateway lists no worker at the {len(ips)} pod IP(s) on this GPU: refused, nothing sent",
                               "no gateway worker on the GPU: refused", True)
        return out
