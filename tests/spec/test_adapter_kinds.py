"""The adapter kinds' registry (fusebox/spec/adapter_kinds): every registered kind is complete, its
levels are the documented ones, and the fuse has a runtime class for it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from fusebox.fuse.adapters.factory import RUNTIME_CLASSES, runtime_class
from fusebox.spec.adapter_kinds import ADAPTER_KINDS, ADAPTER_LEVELS, CREDENTIAL_KINDS, DISCOVER_KINDS, AdapterKind
from fusebox.spec.adapters import KINDS, RawAdapter, RawTarget, normalise_adapters

ROOT = Path(__file__).resolve().parents[2]
FIELD_CHECKS = ("check_adapter", "check_target", "check_fields")


@pytest.mark.parametrize("name", list(ADAPTER_KINDS))
def test_every_registered_kind_is_complete(name):
    """A kind is its module's KIND, with levels, checks for the fields only it may set, and a runtime class."""
    kind = ADAPTER_KINDS[name]
    assert isinstance(kind, AdapterKind) and kind.name == name
    assert importlib.import_module(f"fusebox.spec.adapter_kinds.{name}").KIND is kind
    assert kind.levels and set(kind.levels) <= {1, 2, 3} and list(kind.levels) == sorted(set(kind.levels))
    assert any(getattr(type(kind), m) is not getattr(AdapterKind, m) for m in FIELD_CHECKS), "it checks nothing of its own"
    if kind.fields:
        assert type(kind).check_fields is not AdapterKind.check_fields, f"{name} owns {kind.fields} but does not check them"
    assert set(kind.fields) <= set(RawAdapter.model_fields)
    assert isinstance(runtime_class(name), type) and callable(getattr(runtime_class(name), "apply", None))


def test_the_kinds_are_the_documented_ones_with_their_levels():
    # docs/fuse.md, "Levels each kind can apply": the gateways take a worker out of rotation (1, 3),
    # haproxy adds level 2 through its map, http does what its templates say
    assert ADAPTER_LEVELS == {"sglang_gateway": (1, 3), "vllm_router": (1, 3), "haproxy": (1, 2, 3), "http": (1, 2, 3)}
    assert KINDS == ("sglang_gateway", "vllm_router", "haproxy", "http")
    assert DISCOVER_KINDS == CREDENTIAL_KINDS == ("sglang_gateway", "vllm_router")
    docs = (ROOT / "docs" / "fuse.md").read_text()
    table = docs[docs.index("**Levels each kind can apply**"):].split("\n\n")[1]
    rows = dict(re.findall(r"^\| `(\w+)` \| ([\d, ]+) \|", table, re.M))
    assert {k: tuple(int(x) for x in v.split(", ")) for k, v in rows.items()} == ADAPTER_LEVELS


def test_each_kind_only_field_belongs_to_one_kind():
    owners = [f for k in ADAPTER_KINDS.values() for f in k.fields]
    assert sorted(owners) == sorted({"socket", "text_only", "hosts", "headers_files", "trip", "release"})


def test_the_fuse_has_a_runtime_class_for_every_kind_and_no_other():
    assert set(RUNTIME_CLASSES) == set(ADAPTER_KINDS)


def test_a_kind_without_a_runtime_class_is_an_error_naming_it():
    with pytest.raises(LookupError, match="adapter kind 'acme' has no runtime class"):
        runtime_class("acme")


def test_a_kind_listed_in_the_registry_is_checked_by_its_own_module(monkeypatch):
    """normalise_adapters holds no kind's name: a kind added to ADAPTER_KINDS gets its levels
    enforced, its own target check called and other kinds' fields refused."""

    class Acme(AdapterKind):
        name = "acme"
        levels = (1,)

        def check_target(self, t, path, err):
            err(path, f"an acme target names a cluster, got {t.server!r}", "server: cluster_a")

    monkeypatch.setitem(ADAPTER_KINDS, "acme", Acme())
    # model_construct: the spec's Literal of kinds was fixed when RawAdapter was defined
    raw = RawAdapter.model_construct(kind="acme", actions=["kv_cache_eviction"], socket="/run/x.sock",
                                     targets=[RawTarget(match={"engine": "engine-0"})])
    problems = []
    (adapter,) = normalise_adapters({"edge": raw}, {"kv_cache_eviction": 3}, lambda value, path: 5.0,
                                    lambda path, what, fix, key=False: problems.append((path, what, fix, key)))
    base = ("fuse", "adapters", "edge")
    assert problems == [
        (base + ("actions", 0), "adapter kind acme cannot apply fuse level 3 (kv_cache_eviction)",
         "it applies level 1: remove 'kv_cache_eviction' here and give it to an adapter that can (e.g. kind: http)", False),
        (base + ("targets", 0), "an acme target names a cluster, got None", "server: cluster_a", False),
        (base + ("socket",), "socket is for kind haproxy only", "remove it from this acme adapter", True),
    ]
    assert (adapter.kind, adapter.timeout_s, adapter.socket) == ("acme", 5.0, "/run/x.sock")
