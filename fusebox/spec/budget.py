"""The spec's ``budget:`` section: the sizes ``fusebox budget`` needs to turn a threshold into the
time a resource has left (docs/budget.md).

Defaults come from the demo's geometry (collectors/scenarios/breach.yaml), which is the llava-1.5-7b
language decoder of the test corpus on an H100 80GB:

* ``kv_pool: 52 GiB``: the engine's KV pool. llava-1.5-7b (its config.json: 32 layers, 32 KV heads,
  head dim 128, float16) holds 2 x 32 x 32 x 128 x 2 = 524,288 bytes per token; vLLM takes
  ``gpu_memory_utilization`` 0.9 of the card's 81,559 MiB (76.5 GB) and gives what the weights
  (about 13.5 GB at fp16) and activations leave to the pool: about 52 GiB, 106,000 tokens.
* ``kv_fill: 90%``: how full the pool is when a KV growth tier fires. vLLM's scheduler admits
  requests while blocks are free, so a loaded pool runs close to full; 90 % leaves the pool one
  tenth free, the share vLLM's own default (0.9) leaves of the card.
* ``gpu_memory: 81559 MiB``: the card (an H100 80GB as NVML and the corpus capture report it).
* ``gpu_growth``: the growth that takes a GPU from its memory tier's threshold to full. Default:
  the lowest critical threshold of the spec's byte-growth (``deriv``, bytes per second) signals,
  the seed's 14.7 MB/s, i.e. the slowest growth the spec already calls critical.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from . import units

Err = Callable[..., None]
DEFAULT_KV_POOL = "52 GiB"
DEFAULT_KV_FILL = "90%"
DEFAULT_GPU_MEMORY = "81559 MiB"
Scalar = Annotated[str | int | float, BeforeValidator(units.reject_bool)]


class RawBudget(BaseModel):
    """``budget``: the pool and card sizes the reaction budget reads (docs/budget.md)."""

    model_config = ConfigDict(extra="forbid")

    kv_pool: Scalar = DEFAULT_KV_POOL
    kv_fill: Scalar = DEFAULT_KV_FILL
    gpu_memory: Scalar = DEFAULT_GPU_MEMORY
    gpu_growth: Scalar | None = None


@dataclass(frozen=True)
class Budget:
    """``budget``, normalised: bytes, a ratio 0-1, bytes per second (None: the default growth)."""

    kv_pool_bytes: float = 55_834_574_848.0  # 52 GiB
    kv_fill: float = 0.9
    gpu_memory_bytes: float = 85_520_809_984.0  # 81559 MiB
    gpu_growth_bps: float | None = None


def normalise_budget(raw: RawBudget, err: Err) -> Budget:
    """Parse each size in its unit; a size or growth must be positive and the fill below 100 %."""
    out: dict[str, Any] = {}
    for key, unit, example in (("kv_pool", "bytes", "'52 GiB'"), ("kv_fill", "ratio", "'90%'"),
                               ("gpu_memory", "bytes", "'81559 MiB'"), ("gpu_growth", "bytes_per_second", "'14.7 MB/s'")):
        value = getattr(raw, key)
        if value is None:
            out[key] = None
            continue
        try:
            out[key] = units.parse_quantity(value, unit)
        except ValueError as e:
            err(("budget", key), getattr(e, "what", str(e)), f"write it in {unit.replace('_', ' ')}, e.g. {example}")
            out[key] = None
            continue
        if out[key] <= 0 or (unit == "ratio" and out[key] >= 1):
            err(("budget", key), f"budget.{key} {value!r} is out of range",
                "a fill between 0% and 100% (exclusive)" if unit == "ratio" else f"a positive amount, e.g. {example}")
    d = Budget()
    return Budget(kv_pool_bytes=out["kv_pool"] or d.kv_pool_bytes, kv_fill=out["kv_fill"] or d.kv_fill,
                  gpu_memory_bytes=out["gpu_memory"] or d.gpu_memory_bytes, gpu_growth_bps=out["gpu_growth"])
