"""The COST-QoS controller: kopf handlers over CostQoSScalingPolicy objects.

Each policy is reconciled when it is created, when its ``spec`` changes, and on a timer
(``--interval``): the three expressions of ``spec.metrics`` are range-queried over
``spec.lookback`` at ``--step``, the points, frontier and choice computed (``frontier.py``,
``policy.py``), the status written through the status subresource (kopf sends ``patch.status``
there), and the choice published on the controller's own /metrics:
``fusebox_costqos_desired_replicas{namespace,policy}`` and ``fusebox_costqos_qos_unmet``. It never
writes replicas: KEDA's Prometheus trigger or an HPA's external metric reads the gauge.

Prometheus unreachable, a query refused, no sample: ``MetricsAvailable`` False with the reason;
frontier, choice and the published gauges keep their last values (a decision is not lost), and the
next timer round tries again. After a restart the gauges start from the status' last choice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fusebox import conventions as C

from .policy import BUDGET_CAPPED_TYPE, Policy, PolicyError, decide, parse_policy, unavailable
from .prom import NO_SAMPLES, MetricsError, query_range

__all__ = ["Controller", "ControllerMetrics", "operator_registry", "operator_settings", "Round"]

log = logging.getLogger("fusebox.costqos")
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ControllerMetrics:
    """The controller's series, in ``registry`` (names: ``conventions.COSTQOS_METRICS``)."""

    def __init__(self, registry: CollectorRegistry):
        m, labels = C.COSTQOS_METRICS, C.COSTQOS_LABELS
        self.desired = Gauge(m["desired_replicas"], "The replica count the COST-QoS controller chose for the policy",
                             labels, registry=registry)
        self.unmet = Gauge(m["qos_unmet"], "1 when no frontier point within the policy's budget meets its QoS "
                           "constraints (the budget-capped point was chosen)", labels, registry=registry)
        self.duration = Histogram(m["reconcile_duration"].removesuffix("_seconds"), "One policy's round: the range "
                                  "queries, the frontier and the choice", unit="seconds", buckets=_DURATION_BUCKETS,
                                  registry=registry)
        self.frontier = Histogram(m["frontier_duration"].removesuffix("_seconds"), "The points, frontier and choice "
                                  "of one policy's round (no I/O)", unit="seconds", buckets=_DURATION_BUCKETS,
                                  registry=registry)
        self.errors = Counter(m["metrics_errors"].removesuffix("_total"), "Rounds whose metrics could not be read, "
                              "by reason", ("reason",), registry=registry)
        self._published: dict[tuple[str, str], int] = {}

    def publish(self, namespace: str, name: str, replicas: int, qos_unmet: bool) -> None:
        self.desired.labels(namespace, name).set(replicas)
        self.unmet.labels(namespace, name).set(1 if qos_unmet else 0)
        self._published[(namespace, name)] = replicas

    def published(self, namespace: str, name: str) -> int | None:
        """The replica count published for the policy, None before its first."""
        return self._published.get((namespace, name))

    def forget(self, namespace: str, name: str) -> None:
        """The policy is gone: its series go too."""
        if self._published.pop((namespace, name), None) is not None:
            self.desired.remove(namespace, name)
            self.unmet.remove(namespace, name)


@dataclass
class Round:
    """What one round did: the status fields to write, the replica count published (None: nothing
    was ever published for it) and the seconds its parts took."""
    status: dict[str, Any]
    published: int | None
    query_s: float = 0.0
    frontier_s: float = 0.0
    reasons: list[str] = field(default_factory=list)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Controller:
    """The reconcile logic, apart from kopf (the bench and the tests call :meth:`reconcile` too).

    ``prometheus_url``: Prometheus' base URL; ``step_s``: the range queries' step, seconds;
    ``timeout_s``: one query's deadline, seconds; ``max_queries``: queries in flight at once, over
    all policies (kopf starts the timers of policies created together together: 1,000 policies
    are 3,000 queries at once, which would queue in the connection pool past their deadline and
    load Prometheus with all of them; they wait their turn here instead, untimed)."""

    def __init__(self, prometheus_url: str, step_s: float, metrics: ControllerMetrics, timeout_s: float = 30.0,
                 max_queries: int = 8):
        self.prometheus_url, self.step_s, self.metrics, self.timeout_s = prometheus_url, step_s, metrics, timeout_s
        self.max_queries = max_queries
        self._http: httpx.AsyncClient | None = None
        self._turns: asyncio.Semaphore | None = None

    def http(self) -> httpx.AsyncClient:
        # created in the running loop (kopf's), on first use
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.timeout_s, limits=httpx.Limits(max_connections=self.max_queries))
        return self._http

    async def _query(self, query: str, start: float, end: float) -> list[tuple[float, float]]:
        if self._turns is None:
            self._turns = asyncio.Semaphore(self.max_queries)
        async with self._turns:
            return await query_range(self.http(), self.prometheus_url, query, start, end, self.step_s)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        self._turns = None

    async def reconcile(self, namespace: str, name: str, generation: int, spec: Mapping[str, Any],
                        status: Mapping[str, Any], now: float | None = None) -> Round:
        """One round for one policy; the status fields to patch. PolicyError for a spec it cannot use."""
        t0 = time.perf_counter()
        try:
            return await self._round(parse_policy(namespace, name, generation, spec), status, now)
        finally:
            self.metrics.duration.observe(time.perf_counter() - t0)

    async def _round(self, p: Policy, status: Mapping[str, Any], now: float | None) -> Round:
        end = time.time() if now is None else now
        start = end - p.lookback_s
        old = status.get("conditions")
        q0 = time.perf_counter()
        try:
            reps, lat, err = await asyncio.gather(*(self._query(q, start, end)
                                                    for q in (p.replicas_query, p.latency_query, p.error_query)))
        except MetricsError as e:
            return self._unavailable(p, status, e.reason, e.message, time.perf_counter() - q0)
        query_s = time.perf_counter() - q0
        f0 = time.perf_counter()
        d = decide(p, reps, lat, err, old, _now())
        frontier_s = time.perf_counter() - f0
        self.metrics.frontier.observe(frontier_s)
        if d is None:
            empty = [q for q, s in ((p.replicas_query, reps), (p.latency_query, lat), (p.error_query, err)) if not s]
            why = (f"no samples in the last {p.lookback_s:g} s from {', '.join(map(repr, empty))}" if empty
                   else "the three series share no timestamp with a replica count >= 1")
            return self._unavailable(p, status, NO_SAMPLES, why, query_s)
        self.metrics.publish(p.namespace, p.name, d.choice.replicas, d.choice.qos_unmet)
        return Round(d.status, d.choice.replicas, query_s, frontier_s)

    def _unavailable(self, p: Policy, status: Mapping[str, Any], reason: str, message: str, query_s: float) -> Round:
        """MetricsAvailable False; the last choice stays published (taken from the status after a restart)."""
        self.metrics.errors.labels(reason).inc()
        log.warning("policy %s/%s: metrics unavailable: %s: %s", p.namespace, p.name, reason, message)
        last = (status.get("choice") or {}).get("replicas")
        if self.metrics.published(p.namespace, p.name) is None and isinstance(last, int):
            capped = any(c.get("type") == BUDGET_CAPPED_TYPE and c.get("status") == "True" for c in status.get("conditions") or ())
            self.metrics.publish(p.namespace, p.name, last, capped)
        return Round(unavailable(p, reason, message, status.get("conditions"), _now()), self.metrics.published(p.namespace, p.name),
                     query_s, 0.0, [reason])


def operator_settings(settings: Any) -> None:
    """kopf's settings for this controller (applied in its startup handler): its progress and
    diff base in annotations under ``costqos.fusebox.dev`` (the CRD's status schema holds only the
    controller's own fields), events posted for warnings and errors only."""
    import kopf

    prefix = "costqos.fusebox.dev"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=prefix, key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300


def operator_registry(ctl: Controller, interval_s: float) -> Any:
    """A kopf ``OperatorRegistry`` with the controller's handlers: create, spec update and a
    timer every ``interval_s`` s reconcile; delete drops the policy's series."""
    import kopf

    group, version, _kind, plural = C.COSTQOS_CRD
    reg = kopf.OperatorRegistry()

    async def _reconcile(namespace: str | None, name: str, meta: Any, spec: Any, status: Any, patch: Any, **_: Any) -> None:
        try:
            r = await ctl.reconcile(namespace or "", name, int(meta.get("generation") or 0), spec, status)
        except PolicyError as e:
            raise kopf.PermanentError(str(e)) from None
        patch.status.update(r.status)

    # a registry of one's own has no login handler: kopf's own, through the kubernetes client (in
    # the cluster: the pod's ServiceAccount; elsewhere $KUBECONFIG)
    @kopf.on.login(registry=reg)
    def _login(**kwargs: Any) -> Any:
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=reg)
    async def _startup(settings: Any, **_: Any) -> None:
        operator_settings(settings)

    @kopf.on.cleanup(registry=reg)
    async def _cleanup(**_: Any) -> None:
        await ctl.close()

    # one round on create, on a spec change and on the timer (the status' own changes start none)
    kopf.on.create(group, version, plural, id="reconcile-create", registry=reg)(_reconcile)
    kopf.on.update(group, version, plural, field="spec", id="reconcile-update", registry=reg)(_reconcile)
    kopf.timer(group, version, plural, interval=interval_s, id="reconcile-timer", registry=reg)(_reconcile)

    @kopf.on.delete(group, version, plural, id="forget", optional=True, registry=reg)
    async def _on_delete(namespace: str | None, name: str, **_: Any) -> None:
        ctl.metrics.forget(namespace or "", name)

    return reg
