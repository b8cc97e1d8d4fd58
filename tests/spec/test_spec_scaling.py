"""The spec's ``scaling:`` section (fusebox/spec/scaling.py): the shipped workload as normalised, and
every problem reported at its line with how to fix it.

Expected values come from the shipped spec's YAML: KV growth's warning (its safe level) 9.2 MB/s and
its critical 14.7 MB/s, the alignment P95's warning 0.85 s, the seed's COST-QoS figures (0.42 USD/h,
200 ms, 0.5 %)."""

from __future__ import annotations

import copy

import pytest
import yaml
from _support import SPEC, yaml_text

from fusebox.spec import SpecError, parse_spec

TEXT = SPEC.read_text()
RAW = yaml.safe_load(TEXT)


def _edited(edit) -> str:
    data = yaml.safe_load(TEXT)
    edit(data)
    return yaml_text(data, sort_keys=False)


def _problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    return [str(p) for p in e.value.problems]


def _line_of(text: str, needle: str, nth: int = 1) -> int:
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    return hits[nth - 1]


def test_the_shipped_workload_is_normalised_in_base_units():
    s = parse_spec(TEXT, "fusebox.yaml").scaling
    assert s is not None and s.keda and s.prometheus_address == "http://prometheus-operated.monitoring.svc:9090"
    assert (s.polling_interval_s, s.cooldown_period_s, s.sync_period_s) == (15.0, 300.0, 15.0)
    assert (s.scale_up_stabilization_s, s.scale_down_stabilization_s) == (0.0, 300.0)
    assert s.tolerance == 0.1  # the HPA controller's default (--horizontal-pod-autoscaler-tolerance)
    (w,) = s.workloads
    assert (w.name, w.target_kind, w.target_name, w.namespace) == ("llava-7b", "Deployment", "vllm-llava", "inference")
    assert (w.model, w.min_replicas, w.max_replicas, w.price_per_replica_hour, w.pod_start_s) == (
        "llava-hf/llava-1.5-7b-hf", 1, 8, 0.21, 90.0)
    # set point = each signal's safe level: its warning threshold, in base units (B/s, s)
    assert [(d.name, d.set_point, d.set_point_key) for d in w.signals] == [
        ("kv_cache_growth_rate", 9_200_000.0, "signals.kv_cache_growth_rate.tiers.warning.threshold"),
        ("alignment_latency_p95", 0.85, "signals.alignment_latency_p95.tiers.warning.threshold")]
    assert w.cost_qos is not None
    assert (w.cost_qos.cost_budget, w.cost_qos.p95_latency_s, w.cost_qos.error_ratio) == (0.42, 0.2, 0.005)


def test_without_a_scaling_section_there_is_none():
    assert parse_spec(_edited(lambda d: d.pop("scaling")), "fusebox.yaml").scaling is None


def test_an_override_that_disables_the_warning_alert_keeps_the_safe_level():
    """`enabled: false` turns off the warning's alert, not the level the spec wrote: the scaler keeps it."""
    text = _edited(lambda d: d.update(overrides=[{"alert": "KVCacheGrowthRateHigh", "tier": "warning", "enabled": False}]))
    spec = parse_spec(text, "fusebox.yaml")
    assert [t.name for t in spec.signal("kv_cache_growth_rate").tiers] == ["critical"]
    assert spec.scaling is not None and spec.scaling.workloads[0].signals[0].set_point == 9_200_000.0


def _workload(**fields):
    def edit(d):
        d["scaling"]["workloads"][0].update(fields)
    return edit


# name: (edit, needle on the reported line (or (needle, nth)), words of the message, words of the fix)
BAD = {
    "unknown signal": (_workload(signals=["kv_cache_growth_rate", "kv_growth"]), "- kv_growth",
                       "unknown signal 'kv_growth'", "use one of: gpu_memory_utilization"),
    "a below-direction signal": (_workload(signals=["kv_cache_time_to_full"]), "- kv_cache_time_to_full",
                                 "alerts below its threshold", "grows with load"),
    "GPU memory (no model label)": (_workload(signals=["gpu_memory_utilization"]), "- gpu_memory_utilization",
                                    "keeps no 'model' label", "vLLM preallocates about 90 %"),
    "no safe level": (_workload(signals=["kv_cache_growth_oom"]), "- kv_cache_growth_oom",
                      "has no warning tier: no safe level", "add a warning tier"),
    "min over max": (_workload(replicas={"min": 4, "max": 2}), "max: 2", "replicas.max 2 is under replicas.min 4", "max >= min"),
    "a name Kubernetes refuses": (_workload(name="Llava_7B"), "name: Llava_7B", "is not a DNS-1123 label", "lower-case"),
    "pod_start zero": (_workload(pod_start="0s"), "pod_start: 0s", "pod_start must be a positive duration", "image pull"),
    "budget under min replicas": (_workload(replicas={"min": 3, "max": 8}), "cost_budget: 0.42",
                                  "cost_budget 0.42 USD/h does not pay for replicas.min 3 x 0.21 USD/h = 0.63 USD/h",
                                  "raise the budget"),
    "cost_qos without a price": (lambda d: d["scaling"]["workloads"][0].pop("price_per_replica_hour"), "cost_qos:",
                                 "cost_qos needs price_per_replica_hour", "e.g. 0.21"),
    "latency in the wrong unit": (lambda d: d["scaling"]["workloads"][0]["cost_qos"].update(p95_latency="200 MB"),
                                  "p95_latency: 200 MB", "p95_latency:", "200ms"),
    "KEDA and HPA both": (lambda d: d["scaling"]["hpa"].update(enabled=True), "enabled: true",
                          "scaling.keda and scaling.hpa are both enabled", "enable one"),
    "a duplicate workload": (lambda d: d["scaling"]["workloads"].append(dict(d["scaling"]["workloads"][0])), ("name: llava-7b", 2),
                             "workload 'llava-7b' is named twice", "its own name"),
    "an HPA tolerance of 100%": (lambda d: d["scaling"]["hpa"].update(tolerance="100%"), "tolerance: 100%",
                                 "tolerance '100%' is out of range", "[0%, 100%)"),
    "an HPA tolerance in no unit": (lambda d: d["scaling"]["hpa"].update(tolerance="fast"), "tolerance: fast",
                                    "tolerance:", "--horizontal-pod-autoscaler-tolerance"),
    "an unknown key": (_workload(replica={"min": 1}), "replica:", "unknown key 'replica'", "replicas"),
    # KEDA at 0 replicas: the load comes from the workload's own engines, so none is left to activate it
    "KEDA from zero replicas": (_workload(replicas={"min": 0, "max": 8}), "min: 0",
                                "replicas.min 0 is under 1: at 0 replicas no engine of the workload exports its driving signals",
                                "use min: 1"),
    "an HPA at zero replicas": (lambda d: (d["scaling"]["keda"].update(enabled=False), d["scaling"]["hpa"].update(enabled=True),
                                           d["scaling"]["workloads"][0]["replicas"].update(min=0)), "min: 0",
                                "replicas.min 0 is under 1: an autoscaling/v2 HPA keeps at least 1 replica", "use min: 1"),
    "a price as a percentage": (_workload(price_per_replica_hour="72%"), "price_per_replica_hour: 72%",
                                "price_per_replica_hour '72%' is not a plain number", "a price in USD per hour, e.g. 0.21"),
    "two workloads on one target": (lambda d: d["scaling"]["workloads"].append({**copy.deepcopy(d["scaling"]["workloads"][0]), "name": "llava-7b-b"}),
                                    ("target:", 2),
                                    "workload 'llava-7b-b' targets Deployment inference/vllm-llava, as workload 'llava-7b' does: "
                                    "their two autoscalers would fight", "scale one target from one workload"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_a_bad_scaling_section_is_refused_at_its_line_with_a_fix(case):
    edit, needle, what, fix = BAD[case]
    text = _edited(edit)
    problems = _problems(text)
    needle, nth = needle if isinstance(needle, tuple) else (needle, 1)
    scaling_at = _line_of(text, "scaling:")
    line = [i for i, t in enumerate(text.splitlines(), 1) if i > scaling_at and needle in t][nth - 1]
    hit = [p for p in problems if what in p]
    assert hit, problems
    assert hit[0].startswith(f"fusebox.yaml:{line}:"), (hit[0], line)
    assert " -- " in hit[0] and fix in hit[0].split(" -- ", 1)[1], hit[0]


def test_every_problem_of_a_workload_is_reported_at_once():
    text = _edited(_workload(name="Bad_Name", replicas={"min": 5, "max": 1}, signals=["nope"]))
    problems = _problems(text)
    assert sum(("DNS-1123" in p) + ("replicas.max 1" in p) + ("unknown signal 'nope'" in p) for p in problems) == 3
