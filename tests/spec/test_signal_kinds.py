"""The signal kinds' registry and the hooks the generator asks them through (fusebox/signal_kinds/).

One module per kind, each listed in the registry; what differed per kind in the generator
(`fusebox budget`'s time left, the GPU-power backend, the warning for unpublished inputs) is the
kind's answer. Expected values are worked out here from the shipped spec's figures.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fusebox.signal_kinds import KINDS, kind_of
from fusebox.signal_kinds.base import Kind
from fusebox.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_spec(ROOT / "fusebox.yaml")
KIND_MODULES = sorted(p.stem for p in (ROOT / "fusebox" / "signal_kinds").glob("*.py") if p.stem not in ("__init__", "base", "registry"))

# The shipped budget: kv_pool 52 GiB at 90 % full, the card 81559 MiB.
KV_POOL = 52 * 2**30
GPU = 81559 * 2**20


def test_every_kind_module_is_registered_once_under_its_own_name():
    assert sorted(KINDS) == KIND_MODULES == ["connection_idle", "deriv", "gauge", "gpu_memory", "quantile", "rate", "time_to_full"]
    assert all(isinstance(k, Kind) and k.name == name for name, k in KINDS.items())


def test_every_kind_is_named_in_the_schemas_kind_description_and_docs_spec():
    """`fusebox schema` shows editors the field's description: connection_idle was left out of it."""
    from fusebox.spec.schema import RawSignal

    described = RawSignal.model_fields["kind"].description or ""
    table = next(line for line in (ROOT / "docs" / "spec.md").read_text().splitlines() if line.startswith("| `kind` |"))
    for name in KINDS:
        assert f"{name} (" in described, name
        assert f"`{name}`" in table, name


def _sig(kind: str):
    return next(s for s in SPEC.signals if s.kind == kind)


def test_time_to_full_has_its_threshold_left():
    s = _sig("time_to_full")
    t = s.tiers[0]
    assert kind_of(s).time_left(s, t, SPEC.budget, None) == (t.threshold, f"the tier's threshold ({t.threshold_text})")


def test_a_byte_growth_fills_the_kv_pools_free_tenth():
    s = next(s for s in SPEC.signals if s.kind == "deriv" and s.unit == "bytes_per_second")
    crit = next(t for t in s.tiers if t.name == "critical")
    assert crit.threshold == 14.7e6
    left, why = kind_of(s).time_left(s, crit, SPEC.budget, None)
    assert left == pytest.approx(KV_POOL * 0.1 / 14.7e6)  # 379.8 s
    assert why == "KV pool 55.83 GB at 90% full: 5.58 GB free / 14.7 MB/s"
    assert kind_of(s).grows_pool_bytes(s)


def test_gpu_memory_fills_at_the_growth_given_or_not_at_all():
    s = _sig("gpu_memory")
    crit = next(t for t in s.tiers if t.name == "critical")
    left, why = kind_of(s).time_left(s, crit, SPEC.budget, 14.7e6)
    assert left == pytest.approx(GPU * (1 - crit.threshold) / 14.7e6)
    assert why.startswith("GPU 85.52 GB from ") and why.endswith(" / 14.7 MB/s")
    assert kind_of(s).time_left(s, crit, SPEC.budget, None) == (None, "n/a: no growth to fill the GPU at (set budget.gpu_growth)")


def test_latencies_and_other_kinds_exhaust_nothing():
    q = _sig("quantile")
    assert kind_of(q).time_left(q, q.tiers[0], SPEC.budget, 1.0) == (None, f"n/a: a latency ({q.unit}) exhausts no resource")
    for kind in ("gauge", "rate"):
        s = _sig(kind)
        left, why = kind_of(s).time_left(s, s.tiers[0], SPEC.budget, 1.0)
        assert left is None and why == f"n/a: a {kind} in {s.unit.replace('_', ' ')} has no pool that fills at a known rate"
    # connection_idle is a quantile underneath, but an idle time is no request's latency
    idle = replace(q, kind="connection_idle", unit="seconds")
    assert KINDS["connection_idle"].time_left(idle, q.tiers[0], SPEC.budget, 1.0) == (
        None, "n/a: a connection_idle in seconds has no pool that fills at a known rate")


def test_only_gpu_memory_reads_the_gpus_own_series():
    assert [n for n, k in KINDS.items() if k.reads_gpu_series] == ["gpu_memory"]


def test_gpu_memory_warns_of_its_uncorrected_value_only_when_its_own_metrics_are_all_there():
    s = _sig("gpu_memory")
    k = kind_of(s)
    own = k.raw_metrics(s)
    assert k.unread_inputs_warning(s, own[:1]) is None  # its own metric missing: the general warning
    text = k.unread_inputs_warning(s, ["fusebox_kv_cache_free_bytes"])
    assert text is not None and "fusebox_kv_cache_free_bytes" in text and "reads device memory alone" in text
    assert all(KINDS[n].unread_inputs_warning(_sig(n), ["x"]) is None for n in ("gauge", "deriv", "quantile", "rate", "time_to_full"))
