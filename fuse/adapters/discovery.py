"""GPU or engine scope -> the gateway's workers there, from trusted sources only.

A GPU-level alert's scope is ``{cluster, host_name, hw_id}``, an engine-level one's
``{cluster, host_name, engine, model}`` with ``engine="<namespace>/<pod>"`` (the rules and the
collectors name engines by their pod on Kubernetes); a gateway knows workers by URL. The join
(``fuse.adapters.<name>.discover`` in the spec, :class:`fusebox.spec.adapters.Discover`):

1. the pods of the scope: an engine scope names its pod; for a GPU scope, every series of the
   attribution metric in Prometheus (dcgm-exporter with Kubernetes pod mapping publishes
   ``DCGM_FI_DEV_FB_USED{UUID, pod, namespace, container}``), GPU id from its ``gpu`` label (the
   scope's ``hw_id``; on a MIG instance ``<gpu>/<GPU_I_ID>``, as the rules build it), pod from its
   ``pod``/``namespace`` labels;
2. each pod's IP: kube-state-metrics' ``kube_pod_info{namespace, pod, pod_ip}``, less the pods
   that ended (``kube_pod_status_phase`` Succeeded or Failed: their IP is free for another pod);
3. the gateway's OWN worker list: a worker is the scope's when its URL's host is one of those IPs.

Labels renamed by the scrape: a ServiceMonitor without ``honorLabels`` (the GPU Operator's
dcgm-exporter default; kube-state-metrics scraped that way) sets ``namespace``/``pod`` to the
exporter's own pod and renames the exporter's to ``exported_namespace``/``exported_pod``. Where
a job's series (per ``cluster`` and ``job``) carry the ``exported_`` labels, those are read and
the plain ones never; elsewhere the plain ones (the scrape honored them):
:func:`pod_label`. An attribution label configured without ``exported_`` is read as named.

Ambiguity is refused, never guessed: a pod with two IPs in ``kube_pod_info`` (two series that
disagree) or an IP that two pods hold (``hostNetwork`` pods share their node's IP) raises a
permanent :class:`ResolveError` naming it, and nothing is sent (:func:`resolve_ips`).

The queries are fixed strings from the spec (``GET /api/v1/query``); no label value of the alert
is ever put into a query, a URL or a call: the scope's ``hw_id``, ``engine`` (and ``cluster`` when
the series carry one) are only compared with the values Prometheus returned, and only worker URLs
the gateway itself listed are ever taken out. Both tables are cached for ``ttl_s`` seconds
(bounded: the spec allows 1 s to 10 min). A failure is never a silent success:
:class:`ResolveError` says why (Prometheus unreachable: retryable; no pod on the GPU, no IP, an
ambiguous IP, no worker at the pods: permanent).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from fusebox.spec.adapters import Discover

from .protocol import ActionError
from .transport import deadline_client

__all__ = ["GpuWorkers", "ResolveError", "POD_INFO_METRIC", "FINISHED_QUERY", "PodIps", "pod_table", "pod_label", "resolve_ips",
           "engine_pod", "Attribution", "attribution_table"]

POD_INFO_METRIC = "kube_pod_info"  # kube-state-metrics: {namespace, pod, pod_ip, node, ...}, value 1
# Pods that ended (a Job's, kept in the API server with the IP they had): their IP may be another
# pod's by now, so they hold none. kube-state-metrics: kube_pod_status_phase{namespace, pod, phase}.
FINISHED_QUERY = 'kube_pod_status_phase{phase=~"Succeeded|Failed"} == 1'
# dcgm-exporter on a MIG instance: the parent GPU's UUID plus the instance's id in this label. The
# rules' hw_id is then ``UUID/GPU_I_ID`` (fusebox.signal_kinds.base.dcgm_labels); the join keys alike.
MIG_INSTANCE_LABEL = "GPU_I_ID"
EXPORTED = "exported_"  # what Prometheus prefixes to an exporter's label that a target label overrides

Pod = tuple[str, str, str]  # (cluster or "", namespace, pod)


class ResolveError(ActionError):
    """The scope could not be resolved to workers; ``permanent`` when asking again cannot help."""

    def __init__(self, message: str, summary: str, permanent: bool):
        super().__init__(message, summary=summary)
        self.permanent = permanent


def _group(m: dict) -> tuple[str, str]:
    return m.get("cluster", ""), m.get("job", "")


def _renamed(series: Iterable[dict], labels: Iterable[str]) -> set[tuple[str, str]]:
    """The (cluster, job) groups whose series carry any ``exported_<label>`` of ``labels``."""
    want = [EXPORTED + lb for lb in labels]
    return {_group(m) for s in series if any((m := s.get("metric", {})).get(w) for w in want)}


def pod_label(m: dict, label: str, renamed: set[tuple[str, str]]) -> str | None:
    """The value of ``label`` on the series labels ``m``: ``label`` as configured (``pod``,
    ``exported_pod``); for ``exported_X``, ``X`` itself where the series' (cluster, job) carries
    no ``exported_`` label (``renamed``: the scrape honored the exporter's labels there). None when
    absent or empty."""
    if label.startswith(EXPORTED) and _group(m) not in renamed:
        label = label[len(EXPORTED):]
    return m.get(label) or None


@dataclass(frozen=True)
class PodIps:
    """kube_pod_info as two tables: ``ips`` (cluster, namespace, pod) -> every IP a series gave it;
    ``pods`` (cluster, IP) -> every (namespace, pod) a series gave it; ``no_ip``: pods listed with
    an empty ``pod_ip`` (not started yet)."""

    ips: dict[Pod, set[str]] = field(default_factory=dict)
    pods: dict[tuple[str, str], set[tuple[str, str]]] = field(default_factory=dict)
    no_ip: set[Pod] = field(default_factory=set)


def _ip(text: str) -> str:
    """An IP in one spelling (``fd00::1`` for ``FD00:0::1``); other text as given."""
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        return text


def _pods(series: list[dict]) -> list[tuple[dict, Pod]]:
    """Each series with its pod ``(cluster, namespace, pod)``, ``exported_*`` read where the job
    carries them; series naming no pod left out."""
    renamed = _renamed(series, ("namespace", "pod"))
    out = []
    for s in series:
        m = s.get("metric", {})
        ns, pod = pod_label(m, EXPORTED + "namespace", renamed), pod_label(m, EXPORTED + "pod", renamed)
        if ns and pod:
            out.append((m, (m.get("cluster", ""), ns, pod)))
    return out


def pod_table(series: Iterable[dict], finished: Iterable[dict] = ()) -> PodIps:
    """Build :class:`PodIps` from ``kube_pod_info`` series (``[{"metric": {...}}]`` as Prometheus'
    query API returns them), ``exported_namespace``/``exported_pod`` read where the job carries
    them (:func:`pod_label`): every mapping kept, none overwritten, so a conflict stays visible.
    ``finished``: the series of :data:`FINISHED_QUERY`; those pods hold no IP (a Job's pod that
    ended keeps the IP it had in the API server while the network gave it to another pod)."""
    ended = {key for _m, key in _pods(list(finished))}
    out = PodIps()
    for m, key in _pods(list(series)):
        if key in ended:
            continue
        ns, pod = key[1], key[2]
        ip = m.get("pod_ip")
        if not ip:
            out.no_ip.add(key)
            continue
        ip = _ip(ip)
        out.ips.setdefault(key, set()).add(ip)
        out.pods.setdefault((key[0], ip), set()).add((ns, pod))
    return out


def _same(a: str, b: str) -> bool:
    """Cluster values agree: equal, or one is unknown (a series without a ``cluster`` label: one
    Prometheus per cluster)."""
    return not a or not b or a == b


def resolve_ips(table: PodIps, pods: Iterable[Pod], cluster: str | None, what: str) -> set[str]:
    """The IPs of ``pods`` (each ``(cluster or "", namespace, pod)``) in the scope's ``cluster``
    (None: any); ``what`` names the scope in messages. Raises a permanent :class:`ResolveError`
    when a pod has no IP, or two (``kube_pod_info`` disagrees with itself), or when an IP is held
    by two pods: nothing is to be sent then."""
    c = cluster or ""
    found: set[str] = set()
    missing = []
    for pc, ns, pod in pods:
        ips = {ip for (kc, kns, kpod), v in table.ips.items() if (kns, kpod) == (ns, pod) and _same(kc, pc)
               and _same(kc, c) for ip in v}
        if len(ips) > 1:
            raise ResolveError(f"pod {ns}/{pod} has {len(ips)} IPs in {POD_INFO_METRIC} ({', '.join(sorted(ips))}): "
                               "ambiguous, refused, nothing sent", f"pod of the {what} has {len(ips)} IPs: ambiguous, refused",
                               True)
        if not ips:
            missing.append((ns, pod))
        found |= ips
    if not found:
        started = any((ns, pod) == (kns, kpod) for ns, pod in missing for (_c, kns, kpod) in table.no_ip)
        raise ResolveError(f"no {POD_INFO_METRIC}{{pod_ip}} for the {len(missing)} pod(s) of the {what}"
                           f"{' (listed without an IP: not started yet)' if started else ''}: refused, nothing sent",
                           f"pods of the {what} have no known IP: refused", True)
    for ip in sorted(found):
        holders = {p for (kc, kip), v in table.pods.items() if kip == ip and _same(kc, c) for p in v}
        if len(holders) > 1:
            names = ", ".join(f"{ns}/{pod}" for ns, pod in sorted(holders)[:5])
            raise ResolveError(f"IP {ip} is held by {len(holders)} pods in {POD_INFO_METRIC} ({names}; hostNetwork?): "
                               "its workers cannot be told apart: ambiguous, refused, nothing sent",
                               f"IP of the {what} is shared by {len(holders)} pods: ambiguous, refused", True)
    return found


def engine_pod(engine: object) -> tuple[str, str] | None:
    """``(namespace, pod)`` of an engine id ``"<namespace>/<pod>"``; None for any other id."""
    if not isinstance(engine, str) or engine.count("/") != 1:
        return None
    ns, pod = engine.split("/")
    return (ns, pod) if ns and pod else None


@dataclass(frozen=True)
class Attribution:
    """The attribution metric as a table: ``pods`` GPU id -> its pods; ``gpus`` every GPU id seen
    (a pod or not); ``series`` how many series it had; ``labelled`` how many carried a pod."""

    pods: dict[str, set[Pod]] = field(default_factory=dict)
    gpus: set[str] = field(default_factory=set)
    series: int = 0
    labelled: int = 0


def attribution_table(series: Iterable[dict], spec: Discover) -> Attribution:
    """Build :class:`Attribution` from the attribution metric's series with ``spec``'s labels
    (:func:`pod_label`: ``exported_*`` where the job carries them)."""
    series = list(series)
    names = [lb[len(EXPORTED):] for lb in (spec.namespace, spec.pod) if lb.startswith(EXPORTED)]
    renamed = _renamed(series, names)
    out = Attribution(series=len(series))
    labelled = 0
    for s in series:
        m = s.get("metric", {})
        gpu = m.get(spec.gpu)
        if not gpu:
            continue
        if m.get(MIG_INSTANCE_LABEL):  # a MIG instance: its own hw_id, as the rules build it
            gpu = f"{gpu}/{m[MIG_INSTANCE_LABEL]}"
        out.gpus.add(gpu)
        ns, pod = pod_label(m, spec.namespace, renamed), pod_label(m, spec.pod, renamed)
        if ns and pod:
            labelled += 1
            out.pods.setdefault(gpu, set()).add((m.get("cluster", ""), ns, pod))
    return Attribution(out.pods, out.gpus, out.series, labelled)


class GpuWorkers:
    """Resolve a GPU or engine scope to worker URLs (see the module's doc).

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
        self._attribution = Attribution()
        self._ips = PodIps()
        self.queries = 0  # Prometheus queries made (the cache's effect, for tests)

    def _query(self, expr: str) -> list[dict]:
        url = f"{self.spec.prometheus}/api/v1/query"
        try:
            r = self._client.get(url, params={"query": expr})
            self.queries += 1
            body = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as e:
            raise ResolveError(f"{url}: {type(e).__name__}: {e}", f"attribution: Prometheus {type(e).__name__}",
                               False) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ResolveError(f"{url} ({expr}): HTTP {r.status_code} {r.text[:200]}",
                               f"attribution: Prometheus HTTP {r.status_code}", False)
        return list(body.get("data", {}).get("result", []))

    def _tables(self) -> tuple[Attribution, PodIps]:
        with self._lock:
            if self._at is None or self.clock() - self._at > self.spec.ttl_s:
                attribution = attribution_table(self._query(self.spec.metric), self.spec)
                ips = pod_table(self._query(POD_INFO_METRIC), self._query(FINISHED_QUERY))
                self._attribution, self._ips, self._at = attribution, ips, self.clock()
            return self._attribution, self._ips

    def _gpu_pods(self, gpu: str, attribution: Attribution, cluster: str | None) -> set[Pod]:
        s = self.spec
        labels = f"{s.metric}{{{s.namespace}, {s.pod}}}"
        if not attribution.series:
            raise ResolveError(f"Prometheus has no {s.metric} series (is dcgm-exporter scraped?): refused, nothing sent",
                               f"no {s.metric} series: refused", True)
        if not attribution.labelled:
            plain = [lb[len(EXPORTED):] for lb in (s.namespace, s.pod) if lb.startswith(EXPORTED)]
            raise ResolveError(
                f"none of the {attribution.series} {s.metric} series carries {s.namespace} and {s.pod}"
                f"{' (nor ' + ' and '.join(plain) + ')' if plain else ''}: dcgm-exporter's Kubernetes pod mapping is off, "
                "or the scrape drops or renames those labels (fuse.adapters.*.discover.attribution): refused, nothing sent",
                "no GPU has pod labels (attribution labels missing): refused", True)
        if gpu not in attribution.gpus:
            raise ResolveError(f"GPU not among the {s.metric} series ({s.gpu} label): refused, nothing sent",
                               f"GPU not in {s.metric}: refused", True)
        pods = {p for p in attribution.pods.get(gpu, set()) if _same(p[0], cluster or "")}
        if not pods:
            raise ResolveError(f"no pod on this GPU in {labels}: refused, nothing sent",
                               "GPU not attributed to any pod: refused", True)
        return pods

    def pod_ips(self, scope: dict) -> set[str]:
        """The IPs of the scope's pods: those of ``engine`` (``<namespace>/<pod>``) when it names
        one, else those on its GPU (``hw_id``); raises :class:`ResolveError`."""
        engine, gpu = scope.get("engine"), scope.get("hw_id")
        cluster = scope.get("cluster") if isinstance(scope.get("cluster"), str) else None
        named = engine_pod(engine)
        if named is None and not (isinstance(gpu, str) and gpu):
            if isinstance(engine, str) and engine:
                raise ResolveError("the scope's engine is no <namespace>/<pod> and it names no GPU (hw_id): "
                                   "nothing to discover, refused", "engine id is no namespace/pod: refused", True)
            raise ResolveError("the scope names no GPU (hw_id) and no engine pod (engine=<namespace>/<pod>): "
                               "nothing to discover", "scope names no GPU or engine pod: refused", True)
        attribution, ips = self._tables()
        if named is not None:
            return resolve_ips(ips, [("", *named)], cluster, "engine")
        assert isinstance(gpu, str)
        return resolve_ips(ips, self._gpu_pods(gpu, attribution, cluster), cluster, "GPU")

    def workers(self, scope: dict, listed: Iterable[str]) -> list[str]:
        """The worker URLs of ``listed`` (the gateway's own list) whose host is an IP of the
        scope's pods, sorted; raises :class:`ResolveError` when there is none."""
        ips = self.pod_ips(scope)
        what = "engine" if engine_pod(scope.get("engine")) else "GPU"
        out = sorted({u.rstrip("/") for u in listed if _ip(urlsplit(u).hostname or "") in ips})
        if not out:
            raise ResolveError(f"the gateway lists no worker at the {len(ips)} pod IP(s) of this {what}: refused, nothing sent",
                               f"no gateway worker on the {what}: refused", True)
        return out
