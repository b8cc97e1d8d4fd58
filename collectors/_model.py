"""The one record every collector returns: a value for an OTel instrument key, with attributes.

Collectors never talk to the OpenTelemetry SDK themselves; they return :class:`Reading`
lists, and :mod:`fusebox.collectors.export` turns them into observations. That keeps each
collector a plain function of its world (NVML module, /metrics text, clock), testable
without an SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Reading:
    """One observation.

    Attributes:
        key: a key of :data:`fusebox.conventions.OTEL` (e.g. ``"gpu_memory_usage"``).
        value: the value in the instrument's base unit (bytes, ratio 0-1, watts, seconds).
        attrs: OTel attributes (``hw.id``, ``hw.gpu.index``, ``engine``, ``model`` ...).
    """

    key: str
    value: float
    attrs: Mapping[str, str] = field(default_factory=dict)

    def attr_items(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.attrs.items()))
