"""fusebox collectors: GPU memory (NVML), KV cache (vLLM, SGLang, TGI), alignment latency.

Public surface; the machinery lives in the submodules (gpu, kvcache, fetch, latency, replay,
scenario, export). See docs/collectors.md.
"""

import importlib

# name -> submodule; imported on first use so `fusebox <other command>` stays fast
_EXPORTS = {
    "Reading": "_model",
    "GpuCollector": "gpu", "NoGpuError": "gpu",
    "KvCollector": "kvcache", "KvGeometry": "kvcache", "kv_geometry": "kvcache", "load_model_config": "kvcache",
    "Fetcher": "fetch", "FetchLimits": "fetch", "Credentials": "fetch",
    "EngineHistogramFallback": "latency", "alignment_timer": "latency", "install": "latency",
    "record_alignment": "latency", "spec_buckets": "latency",
    "DeviceState": "replay", "SyntheticNvml": "replay", "load_replay": "replay",
    "Crossing": "scenario", "Phase": "scenario", "Scenario": "scenario", "ScenarioRunner": "scenario",
    "load_scenario": "scenario",
}  # fmt: skip

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
