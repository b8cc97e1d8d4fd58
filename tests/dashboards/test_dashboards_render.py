"""The generated dashboards: valid PromQL, the spec's thresholds, units, links, current Grafana JSON.

Expected thresholds are the figures written in fusebox.yaml, converted by hand here (not by the
renderer or the spec loader): 72.0% -> 0.72, 78.3% -> 0.783, 0.85 s, 1.28 s, 9.2 MB/s ->
9,200,000 B/s, 14.7 MB/s -> 14,700,000 B/s (SI), 92% -> 0.92, 8.7 GB/min -> 145,000,000 B/s,
95% -> 0.95.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import promql_parser
import pytest

from fusebox import conventions as C
from fusebox.generator.render_dashboards import dashboards, render_dashboards
from fusebox.signal_kinds import dashboard_records, records
from fusebox.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK_BASE = "https://github.com/your-org/monitoring/blob/main/runbooks"

# alert -> (Grafana unit, [threshold step values after the base step]) worked out from fusebox.yaml.
# The SLO board's burn-rate lines (fusebox.yaml slos, 99 % over 30d): the SRE workbook's factors,
# 14.4 (1h) and 6 (6h) paging (critical, red), 3 (1d) and 1 (3d) ticketing (warning, orange), ascending.
_BURN = {"page windows": ("red", [6.0, 14.4]), "ticket windows": ("orange", [1.0, 3.0])}
SLO_LINES = {"AlignmentLatencyErrorBudgetBurn": _BURN, "TimeToFirstTokenErrorBudgetBurn": _BURN}
EXPECTED = {
    "GPUMemoryUtilizationHigh": ("percentunit", [0.72, 0.783]),
    "AlignmentLatencyP95High": ("s", [0.85, 1.28]),
    "KVCacheGrowthRateHigh": ("Bps", [9_200_000.0, 14_700_000.0]),
    "GPUMemoryBandwidthSaturated": ("percentunit", [0.92]),
    "KVCacheGrowthOOMImminent": ("Bps", [145_000_000.0]),
    "GPUPCIeLinkSaturated": ("percentunit", [0.95]),
    "PCIeRootComplexLinkSaturated": ("percentunit", [0.95]),
    # lower bounds (direction: below): lines ascending, critical first; red below it, green above the warning
    "KVCacheTimeToFullLow": ("s", [60.0, 300.0]),
    "GPUMemoryTimeToFullLow": ("s", [45.0, 300.0]),
    "EnginePreemptionsHigh": ("short", [0.1, 1.0]),  # preemptions per second (fusebox.yaml)
    # the seed's keep-alive and cold-start lines (fusebox.yaml connection signals)
    "ConnectionIdleP95High": ("s", [45.0]),
    "ConnectionColdStartsHigh": ("s", [30.0]),
}
LOWER_BOUNDS = {"KVCacheTimeToFullLow", "GPUMemoryTimeToFullLow"}


@pytest.fixture(scope="module")
def boards(spec):
    return dashboards(spec)


def _panels(boards):
    for name, d in boards.items():
        for p in d["panels"]:
            yield name, p


def substitute(expr: str) -> str:
    """Template variables as Grafana expands "All" (allValue .*)."""
    return re.sub(r"\$(\w+)", ".*", expr)


def test_the_overview_and_seven_drill_downs_are_rendered(boards):
    # in-path-shedding: the shipped spec's inpath names gateway shedders (smg, sglang_router);
    # connections: its connection_idle signals (idle time and cold starts); and, no drill-down, the
    # SLO board (slo): the shipped spec's slos
    assert sorted(boards) == ["alignment-latency", "connections", "gpu-memory", "in-path-shedding", "kv-cache", "overview",
                              "secondary", "slo", "time-to-full"]


def test_every_panel_query_parses_as_promql(boards):
    n = 0
    for _name, p in _panels(boards):
        for t in p["targets"]:
            promql_parser.parse(substitute(t["expr"]))
            n += 1
    assert n >= 25


def test_panels_read_recording_rules_not_raw_histograms(boards, spec):
    # bucket_rate is an intermediate record the quantiles are computed from; no panel needs it.
    recs = {r for s in spec.signals for role, r in records(s).items() if role != "bucket_rate"}
    used = set()
    for _, p in _panels(boards):
        for t in p["targets"]:
            assert "_bucket" not in t["expr"], (p["title"], t["expr"])
            assert "histogram_quantile" not in t["expr"]
            used |= {r for r in recs if re.search(re.escape(r) + r"\{", t["expr"])}
    assert used == recs, f"recording rules no panel shows: {sorted(recs - used)}"


def test_panels_read_only_recording_rules_apart_from_fuse_state_and_alerts(boards, spec):
    """Issue 4: every panel reads a record of the generated rules file; the overview's fuse state
    and firing-alert panels (a few series each) are the only raw reads."""
    import yaml

    from fusebox.generator.outputs import RULE_FILE, render_all
    from fusebox.spec.promql import vector_selectors

    groups = yaml.safe_load(render_all(spec)[RULE_FILE])["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    dash = dashboard_records()
    assert set(dash.values()) <= recorded
    raw = set()
    used = set()
    for name, p in _panels(boards):
        for t in p["targets"]:
            for sel in vector_selectors(substitute(t["expr"])):
                (used if sel.name in recorded else raw).add((name, p["title"], sel.name))
    assert {r[2] for r in raw} == {C.FUSE_LEVEL_METRIC, C.ALERTS_METRIC}, sorted(raw)
    assert {r[:2] for r in raw} == {("overview", "Fuse state per scope"), ("overview", "Firing fusebox alerts"),
                                    ("in-path-shedding", "Fuse level per scope")}
    # every dashboard record is shown, except the operands the ratios are computed from
    shown = {u[2] for u in used}
    assert set(dash.values()) - shown == {dash["kv_limit"], dash["host_power"], dash["host_tokens"]}
    panel = {p["title"]: [t["expr"] for t in p["targets"]] for _, p in _panels(boards)}
    assert panel["KV pool usage per engine"] == [
        'engine:fusebox_kv_cache_usage:ratio{cluster=~"$cluster", host_name=~"$instance", engine=~"$engine", model=~"$model"}']
    assert panel["Energy per generated token"] == [
        'host:fusebox_energy_per_generated_token:joules_rate5m{cluster=~"$cluster", host_name=~"$instance"}']
    assert [e.split("{")[0] for e in panel["Prefix-cache hit rate"]] == [
        "model:fusebox_vllm_prefix_cache_hit:ratio_rate5m", "model:fusebox_sglang_prefix_cache_hit:ratio"]


def test_dashboard_record_panels_keep_their_units(boards):
    units = {p["title"]: p["fieldConfig"]["defaults"]["unit"] for _, p in _panels(boards)}
    assert units["KV-cache bytes per engine"] == "decbytes"
    assert units["KV pool usage per engine"] == "percentunit"
    assert units["Device memory used and total"] == "decbytes"
    assert units["Driver-reserved memory"] == "decbytes"
    assert units["Energy per generated token"] == "joule"
    assert units["Prefix-cache hit rate"] == "percentunit"


def test_every_threshold_drawn_equals_the_spec_figure(boards):
    seen = set()
    for _, p in _panels(boards):
        urls = [l["url"] for l in p["links"]]
        if p["type"] != "timeseries" or p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "line":
            continue
        (alert,) = [u.rsplit("/", 1)[1][:-3] for u in urls]
        if alert in SLO_LINES:  # the SLO board's burn-rate panels: the factors of each tier's window pairs
            colour, values = SLO_LINES[alert][p["title"].rsplit(" burn rate, ", 1)[1]]
            steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
            assert steps == [{"color": "green", "value": 0}] + [{"color": colour, "value": v} for v in values], p["title"]
            assert p["fieldConfig"]["defaults"]["unit"] == "none", p["title"]
            seen.add(alert)
            continue
        unit, values = EXPECTED[alert]
        steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
        # Base step: a number (Grafana's schema requires one; Grafana reads the first step as -Infinity).
        assert steps[0] == {"color": "red" if alert in LOWER_BOUNDS else "green", "value": 0}, p["title"]
        if alert in LOWER_BOUNDS:
            assert [s["color"] for s in steps] == ["red", "orange", "green"], p["title"]
        assert [s["value"] for s in steps[1:]] == pytest.approx(values, rel=1e-12), p["title"]
        assert p["fieldConfig"]["defaults"]["unit"] == unit, p["title"]
        seen.add(alert)
    assert seen == set(EXPECTED) | set(SLO_LINES)


def test_overview_draws_every_signal_against_its_lines(boards):
    titles = [p["title"] for p in boards["overview"]["panels"]]
    for alert in EXPECTED:
        assert any(t.startswith(alert + ":") for t in titles), alert


def test_units_match_values(boards):
    for _, p in _panels(boards):
        unit = p["fieldConfig"]["defaults"]["unit"]
        exprs = " ".join(t["expr"] for t in p["targets"])
        if " burn rate, " in p["title"]:  # an SLO's error ratios over its budget (0.01): multiples, not a share
            assert unit == "none" and all(t["expr"].endswith(":ratio_rate" + t["legendFormat"].split()[0] + '{cluster=~"$cluster"} / 0.01')
                                          for t in p["targets"]), p["title"]
        elif ":ratio" in exprs or "over_threshold" in exprs:
            assert unit == "percentunit", p["title"]
        if "_bytes{" in exprs and "/" not in exprs:
            assert unit == "decbytes", p["title"]
        if ":deriv" in exprs:
            assert unit == "Bps", p["title"]
        if ":seconds_deriv" in exprs:  # time to full
            assert unit == "s", p["title"]
        if "count_rate" in exprs:
            assert unit == "ops", p["title"]


def test_every_panel_links_to_the_runbook_of_its_alert(boards, spec):
    alerts = {s.alert for s in spec.signals} | {slo.alert for slo in spec.slos}
    for _, p in _panels(boards):
        assert p["links"], p["title"]
        for link in p["links"]:
            alert = link["url"].rsplit("/", 1)[1][: -len(".md")]
            assert alert in alerts
            assert link["url"] == f"{RUNBOOK_BASE}/{alert}.md"
        named = p["title"].split(":", 1)[0]
        if named in alerts:  # a panel titled after an alert links to that alert's runbook
            assert p["links"][0]["url"] == f"{RUNBOOK_BASE}/{named}.md", p["title"]


def test_grafanalib_faults_are_fixed_for_current_grafana(boards):
    ds = {"type": "prometheus", "uid": "${datasource}"}
    for _name, d in boards.items():
        assert d["schemaVersion"] == 41, "schemaVersion 12 is grafanalib's; Grafana 12 writes 41 (corpus: SGLang, vLLM production-stack)"
        text = json.dumps(d)
        assert '"null"' not in text, "first threshold step must be a number, not the string \"null\""
        assert '": null' not in text, "no null value anywhere: the schema types every field the adapter keeps"
        for p in d["panels"]:
            assert p["datasource"] == ds
            for t in p["targets"]:
                assert t["datasource"] == ds
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                assert v["datasource"] == ds
        for a in d["annotations"]["list"][1:]:
            assert a["datasource"] == ds


def test_template_variables_cover_datasource_cluster_instance_gpu_model(boards):
    names = [v["name"] for v in boards["overview"]["templating"]["list"]]
    assert names[0] == "datasource"
    assert {"cluster", "instance", "gpu", "model", "engine"} <= set(names)
    # namespace and pod (the Kubernetes mixins' convention, issue 21) only where a panel filters by
    # them: no signal of the shipped spec keeps namespace and pod, so none would (issue 33)
    assert "namespace" not in names and "pod" not in names
    used = {v for d in boards.values() for p in d["panels"] for t in p["targets"] for v in names if f"${v}" in t["expr"]}
    assert used == set(names[1:]) == {"cluster", "instance", "gpu", "engine", "model"}
    ds = boards["overview"]["templating"]["list"][0]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"


def test_overview_shows_fuse_state_and_firing_alerts(boards, spec):
    ov = boards["overview"]
    exprs = [t["expr"] for p in ov["panels"] for t in p["targets"]]
    assert any(C.FUSE_LEVEL_METRIC in e for e in exprs)
    assert any('ALERTS{alertstate="firing"' in e for e in exprs)
    fuse = next(p for p in ov["panels"] if C.FUSE_LEVEL_METRIC in p["targets"][0]["expr"])
    texts = {k: v["text"] for m in fuse["fieldConfig"]["defaults"]["mappings"] for k, v in m["options"].items()}
    # Levels from fusebox.yaml's fuse.actions (1 freeze, 2 text-only, 3 KV eviction).
    assert texts == {"0": "closed", "1": "L1 freeze_admissions", "2": "L2 text_only_fallback", "3": "L3 kv_cache_eviction"}
    names = [a["name"] for a in ov["annotations"]["list"]]
    assert "fusebox alerts firing" in names


def test_latency_drill_down_shows_p50_p95_p99_and_share_over_each_threshold(boards):
    panels = boards["alignment-latency"]["panels"]
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    for rec in ("engine:fusebox_alignment_duration_seconds:p50_rate5m", "engine:fusebox_alignment_latency_p95:rate5m",
                "engine:fusebox_alignment_duration_seconds:p99_rate5m",
                "engine:fusebox_alignment_latency_p95_over_threshold:ratio_rate5m"):
        assert any(e.startswith(rec + "{") for e in exprs), rec
    # what was measured (handoff | encoder | ttft) ends every legend: one engine's TTFT stand-in
    # and its hand-off times are two lines, told apart
    # (the stage row below the quantiles breaks the signal down by stage and cache instead)
    stage_row = {"Multimodal stages: P95 per stage", "Encoder / embedding caches: hit ratio"}
    legends = [t["legendFormat"] for p in panels if p["title"] not in stage_row for t in p["targets"]]
    assert legends and all(lg.endswith(" {{source}}") for lg in legends), legends
    assert stage_row <= {p["title"] for p in panels}
    assert panels[0]["title"] == "AlignmentLatencyP95High: P50 / P95 / P99 per engine and source"


def test_uids_are_stable_and_derived_from_names(spec, boards):
    again = dashboards(spec)
    assert {n: d["uid"] for n, d in boards.items()} == {n: d["uid"] for n, d in again.items()}
    assert boards["overview"]["uid"] == "fusebox-multimodal-inference-overview"
    assert all(len(d["uid"]) <= 40 for d in boards.values())
    assert len({d["uid"] for d in boards.values()}) == len(boards)


def test_output_is_deterministic_with_a_generated_header(spec):
    a, b = render_dashboards(spec), render_dashboards(spec)
    assert a == b
    for path, text in a.items():
        assert path.startswith("dashboards/") and path.endswith(".json")
        d = json.loads(text)
        assert d["description"].startswith("Code generated by fusebox from fusebox.yaml. DO NOT EDIT.")
        assert list(d) == sorted(d)


def test_a_changed_threshold_moves_the_line(spec):
    text = (ROOT / "fusebox.yaml").read_text().replace("threshold: 78.3%", "threshold: 80%")
    changed = dashboards(parse_spec(text, "fusebox.yaml"))
    p = next(p for p in changed["overview"]["panels"] if p["title"].startswith("GPUMemoryUtilizationHigh"))
    assert [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [0, 0.72, 0.8]
