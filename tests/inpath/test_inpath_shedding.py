"""What the spec's ``inpath:`` decides about the in-path shedding outputs (generator/shedding.py):
the ``fusebox-inpath`` rule group, the in-path shedding board and the runbook lines exist only
where a gateway shedder is named; the overload record only where that gateway is smg 1.13 (the
series sglang-router 0.3.2 does not write: tests/fixtures/generator/sglang-router-0.3.2_*); the
window follows the scrape interval. Values here come from the spec text each test writes."""

from __future__ import annotations

import re

import yaml
from _support import SPEC, yaml_data, yaml_text

from fusebox.generator import shedding
from fusebox.generator.outputs import RULE_FILE, render_all
from fusebox.generator.render_dashboards import dashboards
from fusebox.spec.model import parse_spec

RAW = yaml_data(SPEC.read_text())
REFUSED = "cluster:fusebox_gateway_refused_requests:rate1m"
OVERLOAD = "stage:fusebox_gateway_overload_shed_requests:rate1m"
BREAKERS = "cluster:fusebox_gateway_breakers_open:sum"


def _spec(shedders: dict | None = None, scrape: str | None = None):
    text = SPEC.read_text()
    if scrape is not None:  # the spec's deriv windows must hold 4 scrapes too
        text = text.replace("    window: 1m\n", "    window: 2m\n")
    data = yaml.safe_load(text)
    if shedders is not None:
        data["inpath"]["shedders"] = shedders
    if scrape is not None:
        data["global"]["scrape_interval"] = scrape
    return parse_spec(yaml_text(data, sort_keys=False), "fusebox.yaml")


def _outputs(spec):
    out = render_all(spec)
    groups = {g["name"]: g for g in yaml.safe_load(out[RULE_FILE])["groups"]}
    return out, groups


def test_the_shipped_spec_names_smg_and_sglang_router():
    kinds = {v["kind"] for v in RAW["inpath"]["shedders"].values()}
    assert kinds == {"smg", "sglang_router", "vllm"}


def test_the_shipped_group_board_and_runbook():
    out, groups = _outputs(_spec())
    group = groups[shedding.GROUP]
    assert group["interval"] == RAW["global"]["slow_evaluation_interval"] == "30s"
    assert [r["record"] for r in group["rules"]] == [REFUSED, OVERLOAD, "worker:fusebox_gateway_breaker_open:max", BREAKERS]
    assert all("alert" not in r for r in group["rules"])
    titles = [p["title"] for p in dashboards(_spec())[shedding.DASHBOARD]["panels"]]
    assert titles == ["GPUMemoryUtilizationHigh: gpu memory utilization", "Fuse level per scope", "Gateway refusals per second",
                      "Overload sheds per second by stage", "Circuit breakers open by worker"]
    # the runbook of the signal the gateways shed on names the three cluster records; another's none
    shed_on = out["runbooks/GPUMemoryUtilizationHigh.md"]
    assert all(f"  {r}\n" in shed_on for r in (REFUSED, OVERLOAD, BREAKERS))
    assert REFUSED not in out["runbooks/KVCacheGrowthRateHigh.md"]


def test_no_gateway_no_group_board_or_runbook_lines():
    spec = _spec({"engine": RAW["inpath"]["shedders"]["engine"]})  # a vLLM queue bound only
    out, groups = _outputs(spec)
    assert shedding.GROUP not in groups
    assert shedding.DASHBOARD not in dashboards(spec)
    assert "fusebox_gateway_" not in out["runbooks/GPUMemoryUtilizationHigh.md"]
    assert "dashboards/fusebox-in-path-shedding.json" not in out


def test_sglang_router_alone_has_no_overload_record_or_panel():
    spec = _spec({"gateway_0_3": RAW["inpath"]["shedders"]["gateway_0_3"]})
    out, groups = _outputs(spec)
    assert [r["record"] for r in groups[shedding.GROUP]["rules"]] == [
        REFUSED, "worker:fusebox_gateway_breaker_open:max", BREAKERS]
    titles = [p["title"] for p in dashboards(spec)[shedding.DASHBOARD]["panels"]]
    assert "Overload sheds per second by stage" not in titles
    assert OVERLOAD not in out["runbooks/GPUMemoryUtilizationHigh.md"]


def test_the_window_is_four_scrapes_when_that_is_over_a_minute():
    # scrape every 30 s: 4 x 30 s = 2m, so the refusals are counted over 120 s
    spec = _spec(scrape="30s")
    _, groups = _outputs(spec)
    rules = {r["record"]: r["expr"] for r in groups[shedding.GROUP]["rules"]}
    refused = rules["cluster:fusebox_gateway_refused_requests:rate2m"]
    assert "offset 2m" in refused and refused.endswith("/ 120")
    assert "[2m]" in rules["stage:fusebox_gateway_overload_shed_requests:rate2m"]
    # the after_shedding gate reads the same window
    assert shedding.window_s(spec) == 120


def test_every_board_query_reads_a_record_of_the_group_or_the_fuse_level():
    spec = _spec()
    _, groups = _outputs(spec)
    recorded = {r["record"] for g in groups.values() for r in g["rules"] if "record" in r}
    for p in dashboards(spec)[shedding.DASHBOARD]["panels"]:
        for t in p["targets"]:
            names = set(re.findall(r"([a-z_]+:[a-z_]+:[a-z0-9_]+|fusebox_fuse_level)\{", t["expr"]))
            assert names and names <= recorded | {"fusebox_fuse_level"}, (p["title"], t["expr"])
