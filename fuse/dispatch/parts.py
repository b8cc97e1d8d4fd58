"""What the dispatcher and the reconciler read of the service they are parts of."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from ..adapters.protocol import Adapter
from ..metrics import Metrics
from ..store import Store
from .applied import AppliedLevels

__all__ = ["ServiceParts"]


class ServiceParts:
    """The attributes :class:`fusebox.fuse.service.FuseService` sets in its ``__init__`` that
    :class:`~fusebox.fuse.dispatch.dispatcher.Dispatcher` and
    :class:`~fusebox.fuse.dispatch.reconcile.Reconciler` share: the store, the adapters by name,
    their labels (metrics, audit), the series, the applied levels, the clock (Unix seconds) and
    each adapter's wake-up event."""

    store: Store
    adapters: dict[str, Adapter]
    labels: dict[str, str]
    metrics: Metrics
    applied: AppliedLevels
    clock: Callable[[], float]
    _wakes: Mapping[str, threading.Event]
