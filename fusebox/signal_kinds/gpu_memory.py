"""Kind ``gpu_memory``: GPU device-memory utilization, corrected for engines' KV-cache pools.

Sources: the fusebox GPU collector (NVML v2: its ``hw.gpu.memory.utilization`` gauge, the ratio
(total - free) / total it computed from one memory call, and ``hw.gpu.memory.limit`` in bytes for
the KV correction) or dcgm-exporter (MiB). The value is the device-basis ratio
(total - free) / total minus the free part of the KV pools engines pre-allocated on that GPU, so
vLLM's 90 % reservation does not read as pressure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fusebox import conventions as C
from fusebox.spec.units import format_number, humanize

from .base import (
    DCGM_RESERVED_MIB,
    DCGM_TOTAL_MIB,
    GPU_LIMIT_BYTES,
    SENDER,
    TARGET,
    DashboardDef,
    Err,
    InputSeries,
    Kind,
    PanelDef,
    Query,
    Rule,
    ScenarioModel,
    Synth,
    dashboard_records,
    dcgm_labels,
    gigabytes,
    label_str,
    segments,
    sel,
    selector,
    signal_panel,
    tier_text,
)

if TYPE_CHECKING:
    from fusebox.spec.budget import Budget
    from fusebox.spec.normalised import Signal, Spec, Tier
    from fusebox.spec.schema import RawSource

BACKENDS = ("fusebox", "dcgm")


class GpuMemory(Kind):
    name = "gpu_memory"
    variable_source = ("gpu", 0)
    reads_gpu_series = True
    judges_source_unit = False  # its sources are its own (NVML, DCGM): check_source judges them

    def time_left(self, sig: Signal, tier: Tier, budget: Budget, growth_bps: float | None) -> tuple[float | None, str]:
        """The GPU's memory above the threshold (``budget.gpu_memory``) filling at ``growth_bps``."""
        if not growth_bps:
            return None, "n/a: no growth to fill the GPU at (set budget.gpu_growth)"
        head = budget.gpu_memory_bytes * (1 - tier.threshold)
        return head / growth_bps, (f"GPU {gigabytes(budget.gpu_memory_bytes)} from {humanize(tier.threshold, 'ratio')} to full: "
                                   f"{gigabytes(head)} / {humanize(growth_bps, 'bytes_per_second')}")

    def unread_inputs_warning(self, sig: Signal, metrics: list[str]) -> str | None:
        """Where only the KV-pool correction's metrics go unpublished, the rules do not stay empty:
        they read device memory alone, and an engine that preallocates its KV pool holds its GPU
        over the line for good."""
        if set(metrics) & set(self.raw_metrics(sig)):
            return None
        top = max(sig.tiers, key=lambda t: t.threshold)
        line = f"its {top.name} tier ({top.threshold_text}{', fuse ' + top.fuse if top.fuse else ''})"
        return (f"signal {sig.name!r} subtracts the free part of the engines' KV pools ({', '.join(metrics)}), which "
                "nothing k8s/ deploys produces and no exporter the spec names publishes: without them it reads device "
                "memory alone, and a GPU whose engine preallocates its pool (vLLM's gpu_memory_utilization, default "
                "0.9; SGLang's mem_fraction_static) reads about 90% from the engine's start, over "
                f"{line}, for good -- run the KV collector (kubernetes.collectors.run: {{kv: []}} with kubernetes.engines: "
                "the engine pods' selector, port and models, each with its config.json or geometry; it discovers the engine "
                "pods on its node and their GPUs), or `fusebox collect kv` beside each engine, and scrape it; or select only "
                "GPUs without such an engine (global.selectors)")

    # -- spec --------------------------------------------------------------------------
    def check_source(self, backend: str, src: RawSource, spath: tuple, err: Err) -> None:
        if backend not in BACKENDS:
            err(spath, f"gpu_memory signals know the backends 'fusebox' and 'dcgm', not {backend!r}",
                "use fusebox or dcgm, or kind: gauge with your own expr")

    # -- rules -------------------------------------------------------------------------
    def records(self, sig: Signal) -> dict[str, str]:
        """``value`` (effective ratio), ``device`` (device-basis ratio, no KV correction),
        ``total`` (bytes per GPU, label hw_id), ``kv_free`` (free KV-pool bytes per GPU)."""
        lvl = sig.level
        return {
            "value": C.record_name(lvl, f"fusebox_{sig.name}", "ratio"),
            "device": C.record_name(lvl, "fusebox_gpu_memory_device_utilization", "ratio"),
            "total": C.record_name(lvl, "fusebox_gpu_memory_total", "bytes"),
            "kv_free": C.record_name(lvl, "fusebox_kv_cache_free", "bytes"),
        }

    def diagnosis(self, sig: Signal, spec: Spec) -> list[tuple[str, str]]:
        """The effective and device-basis ratios per GPU and, where the KV collectors publish pool
        bytes (:attr:`Spec.fusebox_collectors`), the KV pools' free bytes per GPU."""
        names = self.records(sig)
        out = [("Effective utilization per GPU (the KV pools' free part taken out)", names["value"]),
               ("Device-memory utilization per GPU, without the KV-pool correction", names["device"])]
        if spec.fusebox_collectors:
            out.append(("Free bytes of the KV pools on each GPU", names["kv_free"]))
        return out

    def kept_labels(self, sig: Signal) -> tuple[str, ...] | None:
        return None  # one series per GPU with its source's labels (hw_id, host_name, ...), whatever by says

    def raw_metrics(self, sig: Signal) -> list[str]:
        # The KV metrics only refine the signal (without them it falls back to device memory),
        # so their absence does not blind it: no absent alert on their account.
        if sig.source.backend == "dcgm":
            return [C.DCGM["fb_used"], C.DCGM["fb_free"], C.DCGM["fb_reserved"]]
        # The ratio is the signal; the total (slow group) is what turns the KV pools' free bytes into
        # a share of the GPU: without it an engine's pre-allocation reads as pressure.
        return [C.PROM["gpu_memory_ratio"], C.PROM["gpu_memory_limit"]]

    def rules(self, sig: Signal, spec: Spec) -> list[Rule]:
        names = self.records(sig)
        if sig.source.backend == "dcgm":
            # dcgm-exporter speaks MiB, and USED + FREE is not the total (docs/pitfalls.md P7):
            # total = USED + FREE + RESERVED; used = total - FREE.
            u, f, r = (selector(C.DCGM[k], spec, backend="dcgm") for k in ("fb_used", "fb_free", "fb_reserved"))
            device = dcgm_labels(f"1 - {f} / ({u} + {f} + {r})")
        else:
            # The collector's own (total - free) / total (NVML v2), so driver-reserved memory counts as
            # used (docs/pitfalls.md P6): one series per GPU read, where usage / limit joined two.
            device = selector(C.PROM["gpu_memory_ratio"], spec)
        # hw_id is unique cluster-wide: drop the sender's identity (every target label: instance,
        # job and the operator's namespace, pod, container, endpoint, service), so one GPU is
        # one series -- one alert, one fuse scope {cluster, host_name, hw_id} -- whether its
        # exporter restarted (the Collector keeps the old process's series for a while; a
        # rescheduled dcgm-exporter has a new address) or two exporters report it; and the KV
        # join on hw_id below meets one total per GPU (the total: :meth:`slow_rules`).
        device = f"max without ({TARGET}) ({device})"
        # One value per pool (engine share on a GPU) whoever reported it, then summed per GPU, so a
        # rescheduled KV collector's lingering series are not counted twice.
        kv_free = (f"sum by (hw_id) (max without ({SENDER}, {C.LABEL['host']}) ("
                   f"clamp_min({selector(C.PROM['kv_cache_limit'], spec)}"
                   f" - {selector(C.PROM['kv_cache_usage'], spec)}, 0)))")
        if not spec.fusebox_collectors:
            # No KV collector publishes pool bytes (vLLM and SGLang export none: docs/metrics.md
            # sections 1-2), so there is no correction to make and no fusebox_kv_cache_* to read.
            return [
                {"record": names["device"], "expr": device},
                {"record": names["value"], "expr": names["device"]},
            ]
        return [
            {"record": names["device"], "expr": device},
            # Free bytes of the KV pools engines pre-allocated on each GPU (vLLM takes ~90%).
            {"record": names["kv_free"], "expr": kv_free},
            # Effective utilization: device memory minus the KV pool's free part where a pool is
            # known on the GPU; device memory alone elsewhere (`or` keeps the unmatched GPUs, and a
            # GPU whose total the slow group has not recorded yet: device memory is the higher reading).
            # `or on (hw_id)` hashes one label instead of every one, with the same result: the left
            # side holds every device series of each hw_id it holds (the right side of the join has
            # one series per hw_id), so matching on hw_id alone drops the same right-side series.
            {"record": names["value"], "expr": (
                f"{names['device']}\n"
                f"  - on (hw_id) group_left ()\n"
                f"    ({names['kv_free']} / on (hw_id) {names['total']})\n"
                f"or on (hw_id)\n{names['device']}")},
        ]

    def slow_rules(self, sig: Signal, spec: Spec) -> list[Rule]:
        """The total memory per GPU (bytes, label hw_id): it does not change while the GPU is
        there, so it is recorded at the slow interval. The dashboards read it too."""
        return [{"record": self.records(sig)["total"], "expr": self._total(sig, spec)}]

    @staticmethod
    def _total(sig: Signal, spec: Spec) -> str:
        if sig.source.backend == "dcgm":
            u, f, r = (selector(C.DCGM[k], spec, backend="dcgm") for k in ("fb_used", "fb_free", "fb_reserved"))
            total_bytes = dcgm_labels(f"({u} + {f} + {r}) * {C.MIB}")
        else:
            total_bytes = selector(C.PROM["gpu_memory_limit"], spec)
        # The join key alone: two series of one GPU (say under an old and a new host_name after a
        # collector pod moved) must not make the one-to-one join in the value record fail for every GPU.
        return f"max by (hw_id) ({total_bytes})"

    def dashboard_records(self, sigs: list[Signal], spec: Spec) -> list[Rule]:
        """Device memory used and driver-reserved per GPU, whichever backend the first signal reads."""
        d = dashboard_records()
        if sigs[0].source.backend == "dcgm":
            # MiB; used = total - FREE = USED + RESERVED (docs/pitfalls.md P6, P7), like the signal's rules.
            u, r = selector(C.DCGM["fb_used"], spec, backend="dcgm"), selector(C.DCGM["fb_reserved"], spec, backend="dcgm")
            used = dcgm_labels(f"({u} + {r}) * {C.MIB}")
            reserved = dcgm_labels(f"{r} * {C.MIB}")
        else:
            used, reserved = selector(C.PROM["gpu_memory_usage"], spec), selector(C.PROM["gpu_memory_reserved"], spec)
        # Per GPU, so no cheaper than the raw gauge; recorded so the panels read the same name
        # whichever backend the GPU-memory signal uses.
        return [{"record": d["gpu_used"], "expr": used}, {"record": d["gpu_reserved"], "expr": reserved}]

    def reports_lost_gpus(self, sig: Signal) -> bool:
        # The fusebox GPU collector reports lost GPUs as fusebox_gpu_up 0 (dcgm-exporter does not).
        return bool(sig.source.backend == "fusebox")

    def scenario_series(self, sig: Signal, scenario: ScenarioModel, times: list[float]) -> dict[str, list[float]]:
        """The effective (KV-corrected) device-memory ratio of every GPU of the scenario, whatever
        the signal's backend: the scenario's GPU collector and the rules agree on it."""
        return {g: [scenario.effective_memory_ratio(g, t) for t in times] for g in scenario.gpu_ids}

    # -- generated tests -----------------------------------------------------------------
    def exact(self, synth: Synth, v: float) -> float:
        if synth.sig.source.backend == "dcgm":
            free = round((1 - v) * DCGM_TOTAL_MIB)
            return 1 - free / DCGM_TOTAL_MIB
        # the collector's ratio of whole bytes, as the test series write it (format_number: 12 digits)
        return float(format_number(round(v * GPU_LIMIT_BYTES) / GPU_LIMIT_BYTES))

    def _dcgm_labels(self, synth: Synth) -> dict[str, str]:
        return {"UUID": synth.labels["hw_id"], "gpu": "0", "Hostname": "gpu-node-1",
                "host_name": "gpu-node-1", "modelName": "NVIDIA H100 80GB HBM3", **synth.spec.selector_for(synth.sig.source.backend)}

    def series(self, synth: Synth, phases: list[tuple[int, float]]) -> list[InputSeries]:
        if synth.sig.source.backend == "dcgm":
            lab = self._dcgm_labels(synth)
            free = [(n, round((1 - v) * DCGM_TOTAL_MIB), 0) for n, v in phases]
            used = [(n, DCGM_TOTAL_MIB - f - DCGM_RESERVED_MIB, 0) for n, f, _ in free]
            return [
                {"series": C.DCGM["fb_used"] + label_str(lab), "values": segments(used)},
                {"series": C.DCGM["fb_free"] + label_str(lab), "values": segments(free)},
                {"series": C.DCGM["fb_reserved"] + label_str(lab),
                 "values": segments([(n, DCGM_RESERVED_MIB, 0) for n, _ in phases])},
            ]
        usage = [(n, round(v * GPU_LIMIT_BYTES), 0) for n, v in phases]
        ratio = [(n, self.exact(synth, v), 0) for n, v in phases]
        # what the collector exports for one GPU: the ratio the rules read, and usage and total beside it
        return [
            {"series": C.PROM["gpu_memory_ratio"] + label_str(synth.labels), "values": segments(ratio)},
            {"series": C.PROM["gpu_memory_usage"] + label_str(synth.labels), "values": segments(usage)},
            {"series": C.PROM["gpu_memory_limit"] + label_str(synth.labels),
             "values": segments([(n, GPU_LIMIT_BYTES, 0) for n, _ in phases])},
        ]

    def result_labels(self, synth: Synth) -> dict[str, str]:
        if synth.sig.source.backend == "dcgm":
            kept = {k: v for k, v in self._dcgm_labels(synth).items() if k not in C.TARGET_LABELS}
            return {**kept, "hw_id": synth.labels["hw_id"]}
        # GPU-level records drop every target label of the scraper (see rules)
        return {k: v for k, v in synth.labels.items() if k not in C.TARGET_LABELS}

    # -- panels --------------------------------------------------------------------------
    def dashboard(self, spec: Spec, sigs: list[Signal]) -> DashboardDef | None:
        if not sigs:
            return None
        panels: list[PanelDef] = []
        for sig in sigs:
            r = self.records(sig)
            legend = "{{host_name}} {{hw_id}} mig={{hw_gpu_mig}}"
            panels.append(signal_panel(sig, "Effective utilization per GPU and MIG instance",
                                       f"{sig.description} Lines at {tier_text(sig)}.",
                                       sel(r["value"], "gpu"), legend))
            panels.append(signal_panel(sig, "Device-basis utilization (no KV-pool correction)",
                                       "(total - free) / total as NVML (the collector's ratio) or DCGM report it; "
                                       "engines that pre-allocate the KV pool sit high here "
                                       "while the effective basis stays low.", sel(r["device"], "gpu"), legend))
        alert = sigs[0].alert
        d = dashboard_records()
        panels += [
            PanelDef("Device memory used and total", "Device memory used (total - free, bytes) per GPU / MIG instance, and the total the rules divide by.",
                     (Query(sel(d["gpu_used"], "gpu"), "used {{host_name}} {{hw_id}}"),
                      Query(sel(r["total"], "hw_id"), "total {{hw_id}}")),
                     "decbytes", (alert,)),
            PanelDef("Driver-reserved memory", "Memory NVML v2 reports as reserved; part of 'used' for NVML v1 (docs/pitfalls.md P6).",
                     (Query(sel(d["gpu_reserved"], "gpu"), "{{host_name}} {{hw_id}}"),), "decbytes", (alert,)),
        ]
        if spec.fusebox_collectors:  # the KV collector's pool bytes (no correction without them)
            panels.append(PanelDef("KV pool free bytes per GPU",
                                   "Free part of the engines' pre-allocated KV pools: the headroom the effective basis subtracts.",
                                   (Query(sel(r["kv_free"], "hw_id"), "{{hw_id}}"),), "decbytes", (alert,)))
        return DashboardDef("gpu-memory", f"fusebox / {spec.name} / GPU memory",
                            "GPU memory per GPU and MIG instance, effective vs device basis.", tuple(panels))


KIND = GpuMemory()
