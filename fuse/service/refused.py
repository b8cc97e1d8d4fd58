"""What the audit keeps of refused and truncated notifications.

:class:`AuditBudget` bounds the audit rows of refused alerts (``fuse.audit`` of the spec);
:func:`truncated_row` and :func:`truncated_view` are the audit row of a notification Alertmanager
truncated and what ``/state`` shows of the newest one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from fusebox import conventions as C

from ..intake.payload import Notification
from ..logsafe import install
from ..rows import AuditRecord, AuditRow, TruncatedLast

log = install(logging.getLogger("fusebox.fuse"))

__all__ = ["AuditBudget", "truncated_row", "truncated_view"]


class AuditBudget:
    """The bound on audit rows of refused alerts (``fuse.audit``): at most ``per_minute`` rows per
    60 s window of this replica, and none once the audit holds ``max_rows`` rows of kind
    ``ignored`` (counted at start and at each window's start: the other replicas' rows too). What
    is left out is counted (``dropped_now`` after each :meth:`take`, for the metric) and summed up
    in one ``ignored`` row per window that dropped any (itself within ``max_rows``).

    Not thread-safe: the service calls it under its lock."""

    WINDOW_S = 60.0

    def __init__(self, per_minute: int, max_rows: int, count: Callable[[], int]):
        self.per_minute, self.max_rows, self._count = per_minute, max_rows, count
        self._start: float | None = None  # the window's start (Unix s); None: none yet
        self._used = 0  # rows audited in the window
        self._held: int | None = None  # rows of kind ignored in the audit (counted, then kept up to date)
        self._dropped = {"rate": 0, "full": 0}  # in the window
        self.dropped_now = {"rate": 0, "full": 0}

    def take(self, refused: list[tuple], now: float) -> tuple[list[tuple], AuditRecord | None]:
        """The refusals of ``refused`` to audit (the first that fit) and the summary row of the
        previous window when it dropped some (None otherwise). Raises StoreError (counting)."""
        summary = None
        self.dropped_now = {"rate": 0, "full": 0}
        if self._start is None or now >= self._start + self.WINDOW_S or now < self._start:
            self._held = self._count()  # first: a prune since may have made room for the summary
            if self._start is not None and any(self._dropped.values()):
                summary = self._summary(now)
            self._start, self._used, self._dropped = now, 0, {"rate": 0, "full": 0}
            if summary is not None:
                self._held += 1
        assert self._held is not None
        room = max(0, min(self.per_minute - self._used, self.max_rows - self._held))
        kept = refused[:room]
        for _ in refused[room:]:
            why = "full" if self._held + len(kept) >= self.max_rows else "rate"
            self._dropped[why] += 1
            self.dropped_now[why] += 1
        if len(refused) > room and not any(v - self.dropped_now[k] for k, v in self._dropped.items()):
            log.warning("refused alerts: %s; the rest are counted (%s), not audited or logged, until %s",
                        f"the audit holds {self.max_rows} rows of them (fuse.audit.refused_max_rows): prune it "
                        "(fusebox fuse audit prune)" if self.dropped_now["full"] else
                        f"{self.per_minute} audited this minute (fuse.audit.refused_per_minute)",
                        C.FUSE_METRICS["audit_refused_dropped"],
                        "a prune" if self.dropped_now["full"] else "the next minute")
        self._used += len(kept)
        self._held += len(kept)
        return kept, summary

    def _summary(self, now: float) -> AuditRecord | None:
        if self._held is not None and self._held >= self.max_rows:
            return None  # full: the metric alone counts
        assert self._start is not None
        n = sum(self._dropped.values())
        return {"at": now, "kind": "ignored", "source": "alert",
                "reason": (f"{n} refused alert(s) not audited from {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self._start))} "
                           f"for {self.WINDOW_S:g} s: {self._dropped['rate']} over fuse.audit.refused_per_minute "
                           f"({self.per_minute}), {self._dropped['full']} with the audit full "
                           f"(fuse.audit.refused_max_rows, {self.max_rows})"),
                "detail": {"result": "not_audited", "dropped": dict(self._dropped), "window_start": self._start,
                           "window_s": self.WINDOW_S}}


def truncated_row(note: Notification, now: float) -> AuditRecord:
    """The audit row of a notification Alertmanager truncated (``truncatedAlerts`` > 0)."""
    cut, sent = note.truncated_alerts, len(note.alerts)
    return {"at": now, "kind": "truncated", "source": "alert",
            "reason": (f"Alertmanager left {cut} alert(s) out of this notification (webhook max_alerts) and sent "
                       f"{sent}: those sent were applied; those left out neither trip nor release until a "
                       "notification carries them"),
            "detail": {"truncated_alerts": cut, "alerts": sent, "group_key": note.group_key[:500],
                       "receiver": note.receiver[:200]}}


def truncated_view(row: AuditRow | AuditRecord) -> TruncatedLast:
    d = row["detail"]
    return {"at": row["at"], "truncated_alerts": d["truncated_alerts"], "alerts": d["alerts"],
            "group_key": d["group_key"]}
