"""What a source's raw metric measures, and whether a signal kind can turn it into the signal's unit.

A metric's unit comes from :data:`KNOWN` (the engines' and dcgm-exporter's metrics whose names do
not say it: vLLM's ``*_perc`` gauges are fractions 0-1, dcgm-exporter's ``FB_*`` are MiB, its
utilizations percent 0-100), else from the Prometheus naming convention's suffix (``_bytes``,
``_seconds``, ``_ratio``, ``_bytes_per_second``, ``_total`` for a counter of things). A metric
whose unit neither tells is not judged.

Units are grouped by dimension: a fraction (``ratio``, ``percent``), a size (``bytes``,
``mebibytes``), a time (``seconds``, ``milliseconds``), a byte rate (``bytes_per_second``), a
number of things (``count``, ``tokens``, ``requests``). A source's ``scale`` converts within a
dimension (MiB to bytes, percent to ratio), never across: a fraction of a KV pool times a
constant is not bytes, because each engine's pool differs.

What each kind gives (:func:`check`):

* ``gauge``: the metric's own dimension;
* ``deriv`` (a gauge's slope) and ``rate`` (a counter's): a size gives a byte rate
  (``bytes_per_second``); a count gives a count per second (accepted for ``unit: count``); a
  fraction or a time gives nothing a signal unit names;
* ``quantile``: the histogram's dimension (a time for ``unit: seconds``);
* ``gpu_memory``: not judged here (its rules are fixed per backend);
* ``time_to_full``: headroom over growth, (capacity - used) / deriv(used), is a time whatever the
  pool's unit: a size (bytes, MiB), a count (tokens) or a fraction 0-1 gives seconds, and
  :func:`check_pool` asks that the pool's ``capacity`` (or ``free``) metric is in the unit of the
  ``metric`` in use, and that a fraction has neither (its capacity is 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusebox import conventions as C

if TYPE_CHECKING:  # the kinds import this module
    from fusebox.signal_kinds.base import Kind

# unit -> (dimension, words for people)
UNITS: dict[str, tuple[str, str]] = {
    "ratio": ("fraction", "a fraction 0-1"),
    "percent": ("fraction", "a percentage 0-100"),
    "bytes": ("size", "a size in bytes"),
    "mebibytes": ("size", "a size in MiB"),
    "seconds": ("time", "a time in seconds"),
    "milliseconds": ("time", "a time in milliseconds"),
    "bytes_per_second": ("rate", "a byte rate (bytes per second)"),
    "count": ("count", "a number of things"),
    "tokens": ("count", "a number of tokens"),
    "requests": ("count", "a number of requests"),
    "watts": ("power", "a power in watts"),
    "millijoules": ("energy", "an energy in mJ"),
}
# A signal's unit (fusebox.spec.units.UNITS) -> its dimension.
SIGNAL_DIMENSION = {"ratio": "fraction", "seconds": "time", "bytes": "size", "bytes_per_second": "rate", "count": "count"}

# Metrics whose name does not say their unit (docs/metrics.md has the sources). A histogram is
# listed by its family name (without _bucket).
KNOWN: dict[str, str] = {
    # vLLM: "_perc" gauges are fractions 0-1 despite the name
    "vllm:kv_cache_usage_perc": "ratio",
    "vllm:gpu_cache_usage_perc": "ratio",
    "vllm:cpu_cache_usage_perc": "ratio",
    "vllm:num_requests_running": "requests",
    "vllm:num_requests_waiting": "requests",
    "vllm:prompt_tokens_total": "tokens",
    "vllm:generation_tokens_total": "tokens",
    "vllm:prefix_cache_queries_total": "tokens",
    "vllm:prefix_cache_hits_total": "tokens",
    "vllm:num_preemptions_total": "count",
    "vllm:mm_cache_queries_total": "count",  # multimodal items
    "vllm:mm_cache_hits_total": "count",
    # SGLang (either prefix: sglang: and sglang_)
    "sglang:token_usage": "ratio",
    "sglang:cache_hit_rate": "ratio",
    "sglang:swa_token_usage": "ratio",
    "sglang:num_used_tokens": "tokens",
    "sglang:max_total_num_tokens": "tokens",
    "sglang:kv_used_tokens": "tokens",
    "sglang:kv_available_tokens": "tokens",
    "sglang:kv_evictable_tokens": "tokens",
    "sglang:num_running_reqs": "requests",
    "sglang:num_queue_reqs": "requests",
    "sglang:gen_throughput": "count",  # tokens per second: not a byte rate
    "sglang:num_retracted_requests_total": "requests",  # counter (docs/metrics.md section 7)
    "sglang:num_retracted_reqs": "requests",  # gauge: the last batch's retractions
    # dcgm-exporter: FB in MiB, DEV utilizations in percent, DCP (PROF) ratios 0-1
    C.DCGM["fb_used"]: "mebibytes",
    C.DCGM["fb_free"]: "mebibytes",
    C.DCGM["fb_reserved"]: "mebibytes",
    "DCGM_FI_DEV_FB_TOTAL": "mebibytes",
    "DCGM_FI_DEV_FB_USED_PERCENT": "ratio",
    "DCGM_FI_DEV_GPU_UTIL": "percent",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "percent",
    "DCGM_FI_DEV_ENC_UTIL": "percent",
    "DCGM_FI_DEV_DEC_UTIL": "percent",
    C.DCGM["dram_active"]: "ratio",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "ratio",
    "DCGM_FI_PROF_SM_ACTIVE": "ratio",
    "DCGM_FI_PROF_SM_OCCUPANCY": "ratio",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "ratio",
    C.DCGM["pcie_tx"]: "bytes_per_second",
    C.DCGM["pcie_rx"]: "bytes_per_second",
    "DCGM_FI_DEV_POWER_USAGE": "watts",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "millijoules",
}
_SUFFIXES = (("_bytes_per_second", "bytes_per_second"), ("_bytes", "bytes"), ("_seconds", "seconds"),
             ("_ratio", "ratio"), ("_percent", "percent"), ("_watts", "watts"))


def metric_unit(metric: str) -> str | None:
    """The unit (a key of :data:`UNITS`) of a raw metric or histogram family, or None when
    neither :data:`KNOWN` nor its name's suffix says it."""
    for p in C.SGLANG_PREFIXES:  # SGLang writes either prefix
        if metric.startswith(p):
            metric = "sglang:" + metric[len(p):]
    if metric in KNOWN:
        return KNOWN[metric]
    for suffix, unit in _SUFFIXES:
        if metric.endswith(suffix) and unit in UNITS:
            return unit
    return None


# A unit that is not its dimension's base unit -> the scale to base units.
TO_BASE = {"percent": 0.01, "mebibytes": 1048576.0, "milliseconds": 0.001}


def check(kind: Kind, metric: str, signal_unit: str, scale: float = 1.0) -> tuple[str, str] | None:
    """``(what, fix)`` when a signal of ``kind`` in ``signal_unit`` cannot be made of ``metric`` read
    with ``scale``, else None: another dimension (a fraction read as bytes per second: the kind's
    :meth:`~fusebox.signal_kinds.base.Kind.source_dimension`), or a non-base unit (percent, MiB, ms)
    read with no scale where the kind compares the value as read (``needs_base_unit``: a gauge).

    Only a metric whose unit is known is judged, and only for a kind that ``judges_source_unit``
    (a GPU-memory signal's sources are its own)."""
    unit = metric_unit(metric)
    if not kind.judges_source_unit or unit is None or signal_unit not in SIGNAL_DIMENSION:
        return None
    got = kind.source_dimension(UNITS[unit][0])
    want = SIGNAL_DIMENSION[signal_unit]
    if got == want:
        if kind.needs_base_unit and unit in TO_BASE and scale == 1.0:
            return (f"{metric} is {UNITS[unit][1]}, read with no scale: the {signal_unit} thresholds compare "
                    f"against {unit}", f"add 'scale: {TO_BASE[unit]:g}' to convert it to {signal_unit}")
        return None
    word = UNITS[unit][1]
    what = (f"{metric} is {word}; {kind.made_of(metric)} cannot give a value in {signal_unit.replace('_', ' ')}"
            + (" (a scale does not help: it converts within a unit's kind, and each engine's pool differs)"
               if UNITS[unit][0] != want and kind.scale_cannot_help else ""))
    if signal_unit == "bytes_per_second" and UNITS[unit][0] == "fraction":
        fix = ("read KV bytes: the fusebox KV collector's fusebox_kv_cache_usage_bytes (usage fraction x the "
               "engine's pool bytes, docs/metrics.md), or give the signal a unit its source can give")
    else:
        fix = f"read a metric in {signal_unit.replace('_', ' ')} (or one a scale converts to it), or change the signal's unit"
    return what, fix


def check_pool(metric: str, capacity: str | None, free: str | None) -> tuple[str, str, str] | None:
    """``(field, what, fix)`` when a ``time_to_full`` source's pool metrics cannot be read with
    ``metric`` (the amount in use), else None. ``field`` is the source key at fault
    (``capacity``, ``free`` or ``metric``).

    * at most one of ``capacity`` (the pool's size) and ``free`` (its free part);
    * a fraction 0-1 (vLLM's ``kv_cache_usage_perc``, SGLang's ``token_usage``) takes neither: its
      capacity is 1;
    * a size or count takes one of them, in the same unit as ``metric`` (bytes with bytes, MiB
      with MiB, tokens with tokens): the division cancels the unit only then.

    Metrics of unknown unit are not compared (as :func:`check`)."""
    if capacity is not None and free is not None:
        return ("free", "give the pool as 'capacity' (its size) or as 'free' (its free part), not both",
                "remove one of them")
    used = metric_unit(metric)
    other, field = (capacity, "capacity") if capacity is not None else (free, "free")
    if used is not None and UNITS[used][0] == "fraction":
        if other is not None:
            return (field, f"{metric} is {UNITS[used][1]} of the pool: its capacity is 1, so '{field}' means nothing",
                    f"remove '{field}' (the headroom is 1 - {metric})")
        return None
    if other is None:
        return ("metric", f"{metric} is {UNITS[used][1] if used else 'an amount in use'}: time to full needs the pool's size",
                "add 'capacity: METRIC' (the pool's size, e.g. fusebox_kv_cache_limit_bytes) or 'free: METRIC' "
                "(its free part, e.g. DCGM_FI_DEV_FB_FREE), in the unit of 'metric'")
    unit = metric_unit(other)
    if used is not None and unit is not None and unit != used:
        return (field, f"{other} is {UNITS[unit][1]} but {metric} is {UNITS[used][1]}: their difference over the "
                       "growth is no time",
                f"read a '{field}' metric in the unit of {metric} ({used})")
    return None
