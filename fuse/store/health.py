"""Whether the store's database answers (:class:`Health`), as the store's own calls see it, and
the clocks the store reads (:func:`local_clock`, :func:`now`)."""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("fusebox.fuse")


def local_clock() -> float:
    """This host's wall clock, Unix seconds."""
    return time.time()


def now() -> float:
    """This host's wall clock, Unix seconds (outage times, ``applied_at`` of a migration)."""
    return time.time()


class Health:
    """Whether the database answers, as the store's own calls see it: one log line when it is lost
    (ERROR, with the error) and one when it is back (WARNING, with how long it was lost and how many
    calls failed meanwhile), nothing in between (not 6,600 lines a minute while PostgreSQL is
    down). Thread-safe.

    Attributes:
        down_since: Unix seconds of the first failure of this outage; None while the store answers.
        error: the first failure's text (no password).
        write_failed: the last write failed and none succeeded since (a full disk fails writes while
            reads still answer; only a successful write clears it: :meth:`Store.probe_write`).
        failures: calls failed in this outage.
    """

    def __init__(self, label: str):
        self.label = label
        self.down_since: float | None = None
        self.error = ""
        self.write_failed = False
        self.failures = 0
        self._lock = threading.Lock()

    def failed(self, e: BaseException, write: bool) -> None:
        """A call (a write when ``write``) failed with ``e``."""
        with self._lock:
            self.failures += 1
            self.write_failed = self.write_failed or write
            if self.down_since is not None:
                return
            self.down_since, self.error = now(), f"{type(e).__name__}: {e}".strip()[:500]
        log.error("store %s lost (%s failed): %s -- webhooks answer 503, /readyz is false, loops back off; "
                  "one line when it is back", self.label, "a write" if write else "a read", self.error)

    def ok(self, write: bool) -> None:
        """A call (a write when ``write``) succeeded. A read does not end an outage a write began."""
        if self.down_since is None or (self.write_failed and not write):
            return
        with self._lock:
            if self.down_since is None or (self.write_failed and not write):
                return
            took, n = now() - self.down_since, self.failures
            self.down_since, self.error, self.write_failed, self.failures = None, "", False, 0
        log.warning("store %s back after %.1fs (%d failed call(s) meanwhile)", self.label, took, n)
