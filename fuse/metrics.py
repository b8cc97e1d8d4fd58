"""The fuse's Prometheus series, in one registry per service (``GET /metrics``).

:class:`Metrics` holds every ``fusebox_fuse_*`` series (names: :data:`fusebox.conventions.FUSE_METRICS`);
:class:`LevelSeries` keeps ``fusebox_fuse_level`` to at most ``max_level_series`` scopes, the most
severe first, touching only the scopes a change touched.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fusebox import conventions as C

__all__ = ["Metrics", "LevelSeries", "CONNECTION_CLOSE_REASONS"]


# Why the server closes or refuses a connection itself (fusebox.fuse.http.server.GuardedH11Protocol.on_close).
CONNECTION_CLOSE_REASONS = ("header_timeout", "request_timeout", "evicted", "over_capacity", "head_too_large")


class Metrics:
    """Every series of one service, in :attr:`registry`."""

    def __init__(self):
        M = C.FUSE_METRICS
        self.registry = CollectorRegistry()
        r = self.registry
        self.level = Gauge(M["level"], "Highest fuse level tripped per scope (0: none).", list(C.SCOPE_LABELS), registry=r)
        self.transitions = Counter(M["transitions"].removesuffix("_total"), "Fuse level changes.",
                                   ["action", "state", "source"], registry=r)
        self.notifications = Counter(M["notifications"].removesuffix("_total"), "Webhook notifications by outcome.",
                                     ["outcome"], registry=r)
        self.alerts = Counter(M["alerts"].removesuffix("_total"), "Alerts in notifications by result.", ["result"], registry=r)
        self.truncated = Counter(M["truncated_alerts"].removesuffix("_total"),
                                 "Alerts Alertmanager left out of notifications (truncatedAlerts, webhook max_alerts).",
                                 registry=r)
        self.failures = Counter(M["action_failures"].removesuffix("_total"),
                                "Failed action attempts (retried or given up).", ["adapter"], registry=r)
        self.given_up = Counter(M["actions_given_up"].removesuffix("_total"),
                                "Actions audited as failed and not retried (reason: permanent, retries_exhausted).",
                                ["adapter", "reason"], registry=r)
        self.dispatcher_errors = Counter(M["dispatcher_errors"].removesuffix("_total"),
                                         "Dispatcher iterations that raised (logged; the loop goes on).",
                                         ["adapter"], registry=r)
        self.credential_refusals = Counter(M["credential_refusals"].removesuffix("_total"),
                                           "Gateway calls answered 401/403: the control-plane credential refused "
                                           "(or none configured); retried, never applied.", ["adapter"], registry=r)
        self.stale = Counter(M["stale_results"].removesuffix("_total"),
                             "Call results not recorded: the claim had passed to another replica meanwhile.",
                             ["adapter"], registry=r)
        self.oldest_pending = Gauge(M["oldest_pending_age"],
                                    "Seconds since the request that decided the oldest pending action (0: none).",
                                    registry=r)
        self.pending = Gauge(M["actions_pending"], "Actions decided but not yet applied.", registry=r)
        buckets = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
        self.latency = Histogram(M["decision_latency"], "Seconds from the request that decided to the action applied.",
                                 ["adapter"], buckets=buckets, registry=r)
        self.calls = Counter(M["adapter_calls"].removesuffix("_total"), "Adapter calls (one apply) by outcome (ok, error).",
                             ["adapter", "outcome"], registry=r)
        self.call_duration = Histogram(M["adapter_call_duration"], "Seconds one adapter call (apply) took.",
                                       ["adapter"], buckets=buckets, registry=r)
        self.request = Histogram(M["request_latency"], "Seconds spent handling a webhook notification.",
                                 buckets=buckets, registry=r)
        self.dry_run = Gauge(M["dry_run"], "1 when the service calls nothing (--dry-run), else 0.", registry=r)
        self.last_notification = Gauge(M["last_notification"],
                                       "Unix time of the last notification from each Alertmanager (its externalURL).",
                                       [C.ALERTMANAGER_LABEL], registry=r)
        self.scopes = Gauge(M["scopes"], "Scopes held, by their highest tripped level (0: none).", ["level"], registry=r)
        self.reconciliations = Counter(M["reconciliations"].removesuffix("_total"),
                                       "Trips queued again because the target's own state differed (reconciler).",
                                       ["adapter"], registry=r)
        self.auth_failures = Counter(M["auth_failures"].removesuffix("_total"),
                                     "Requests refused 401: no token, or not one of the route's role.", ["role"],
                                     registry=r)
        self.auth_limited = Counter(M["auth_rate_limited"].removesuffix("_total"),
                                    "Requests refused 429: their client failed to authenticate too often.", ["role"],
                                    registry=r)
        for role in ("webhook", "override", "read"):  # at 0 from the start
            self.auth_failures.labels(role), self.auth_limited.labels(role)
        self.connections_closed = Counter(M["connections_closed"].removesuffix("_total"),
                                          "Connections the server closed or refused itself, by reason.", ["reason"],
                                          registry=r)
        for reason in CONNECTION_CLOSE_REASONS:
            self.connections_closed.labels(reason)
        self.level_dropped = Gauge(M["level_series_dropped"],
                                   "Scopes held without a fusebox_fuse_level series (over the cap; the least severe).",
                                   registry=r)
        self.token_file_valid = Gauge(M["token_file_valid"],
                                      "1 while a token file is in force as written, 0 while refused (malformed or "
                                      "unreadable: a people or read file's tokens dropped, the webhook's last good "
                                      "token kept).", ["file"], registry=r)
        self.token_file_refused = Counter(M["token_file_refused"].removesuffix("_total"),
                                          "Reads of a token file (on change, on SIGHUP) that refused it.", ["file"],
                                          registry=r)
        self.audit_dropped = Counter(M["audit_refused_dropped"].removesuffix("_total"),
                                     "Refused alerts not audited: over fuse.audit.refused_per_minute (rate) or the "
                                     "audit holding fuse.audit.refused_max_rows of them (full).", ["reason"],
                                     registry=r)
        for reason in ("rate", "full"):
            self.audit_dropped.labels(reason)
        self.unapplied = Gauge(M["unapplied_levels"],
                               "Tripped levels that no adapter applied (yet): refused, given up, pending or no adapter.",
                               registry=r)

    def token_file(self, file: str, valid: bool, refused: bool) -> None:
        """A token file's state (:meth:`fusebox.fuse.tokens.TokenFiles.observe`'s callback)."""
        self.token_file_valid.labels(file).set(1 if valid else 0)
        c = self.token_file_refused.labels(file)  # at 0 from the start
        if refused:
            c.inc()

    def zero(self, adapters: Sequence[str]) -> None:
        """Every series labelled by adapter at 0 from start, so the first failure or give-up is an
        increase Prometheus sees (``increase()`` of a series that first appears at 1 is 0)."""
        for a in adapters:
            self.failures.labels(a)
            self.credential_refusals.labels(a)
            self.dispatcher_errors.labels(a)
            self.stale.labels(a)
            for reason in ("permanent", "retries_exhausted"):
                self.given_up.labels(a, reason)
            for outcome in ("ok", "error"):
                self.calls.labels(a, outcome)


class LevelSeries:
    """``fusebox_fuse_level`` for at most ``cap`` scopes, the most severe first, updated one scope at a
    time (:meth:`set`): a change touches only the series of the scopes it changed (and, when the
    cap is reached, swaps one shown scope for a more severe hidden one). ``fusebox_fuse_scopes``
    counts every scope by level; ``fusebox_fuse_level_series_dropped`` those without a series."""

    def __init__(self, metrics: Metrics, cap: int, levels):
        self.m, self.cap = metrics, cap
        self.level: dict[str, int] = {}  # every scope -> its highest tripped level
        self.labels: dict[str, tuple] = {}  # every scope -> its gauge label values
        self.shown: dict[int, dict[str, None]] = {}  # level -> scopes with a series
        self.hidden: dict[int, dict[str, None]] = {}  # level -> scopes without one
        self.counts: dict[int, int] = {lvl: 0 for lvl in (0, *levels)}
        for lvl in self.counts:
            self.m.scopes.labels(str(lvl)).set(0)
        self.m.level_dropped.set(0)

    def set(self, key: str, labels: dict | None, level: int) -> None:
        """Scope ``key`` now has ``level`` (labels None: it is gone)."""
        old = self.level.pop(key, None)
        shown = False
        if old is not None:
            shown = key in self.shown.get(old, {})
            (self.shown if shown else self.hidden)[old].pop(key, None)
            self._count(old, -1)
        if labels is None:
            if shown:
                self.m.level.remove(*self.labels[key])
            self.labels.pop(key, None)
        else:
            self.labels[key] = tuple(labels.get(k, "") for k in C.SCOPE_LABELS)
            self.level[key] = level
            self._count(level, 1)
            if shown or self._n(self.shown) < self.cap:
                self.shown.setdefault(level, {})[key] = None
                self.m.level.labels(*self.labels[key]).set(level)
            else:
                self.hidden.setdefault(level, {})[key] = None
        self._balance()
        self.m.level_dropped.set(self._n(self.hidden))

    def _count(self, level: int, d: int) -> None:
        self.counts[level] = self.counts.get(level, 0) + d
        self.m.scopes.labels(str(level)).set(self.counts[level])

    @staticmethod
    def _n(by: dict) -> int:
        return sum(len(v) for v in by.values())

    def _balance(self) -> None:
        while True:
            top = max((lvl for lvl, ks in self.hidden.items() if ks), default=None)
            if top is None:
                return
            if self._n(self.shown) >= self.cap:
                low = min((lvl for lvl, ks in self.shown.items() if ks), default=None)
                if low is None or low >= top:
                    return
                out = next(iter(self.shown[low]))
                del self.shown[low][out]
                self.m.level.remove(*self.labels[out])
                self.hidden.setdefault(low, {})[out] = None
            key = next(iter(self.hidden[top]))
            del self.hidden[top][key]
            self.shown.setdefault(top, {})[key] = None
            self.m.level.labels(*self.labels[key]).set(top)
