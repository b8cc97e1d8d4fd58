"""Runbook and panel queries read what the rules record or an exporter publishes (issue 33, point 8).

At 30 s scrape and evaluation intervals the spec's deriv windows become 2m (the spec's comment: a
deriv window of at least 4 scrapes), so every record over such a window is renamed
(``...:deriv1m`` -> ``...:deriv2m``). Queries a person reads (the runbooks' ``promql`` blocks and
tier expressions, every dashboard panel and template variable) must follow: each series they name
is parsed out with promql-parser and must be a record the rendered rules write, or a metric an
exporter publishes -- a name of ``fusebox/conventions.py`` (the collectors, dcgm-exporter, vLLM,
SGLang, the gateway, the fuse, Alertmanager, Prometheus' ``up``/``ALERTS``) or a raw metric one of
the spec's signals lists under ``sources``.

A query the spec writes by hand that names a record nobody records is a spec error at its line,
with the record it meant (fusebox/spec/diagnosis.py).
"""

from __future__ import annotations

import re

import pytest
import yaml
from _support import SPEC, spec_text_at_30s, without_signals, yaml_text

from fusebox import conventions as C
from fusebox.generator import render_dashboards
from fusebox.generator.render_rules import render_rules
from fusebox.generator.render_runbooks import render_runbooks
from fusebox.signal_kinds import kind_of, recorded_names
from fusebox.spec import SpecError, parse_spec
from fusebox.spec.promql import vector_selectors

HIST = ("_bucket", "_count", "_sum")


def dcgm_vllm(text: str) -> str:
    """The issue's cluster: dcgm-exporter for GPU memory, vLLM's own KV fraction, no fusebox collectors."""
    data = yaml.safe_load(text)
    data["global"]["source"] = "dcgm"
    data["global"]["selectors"] = {"vllm": {}}
    data["kubernetes"]["collectors"]["enabled"] = False
    data["signals"]["kv_cache_time_to_full"]["source"] = "vllm"
    without_signals(data, "pcie_link_utilization", "alignment_latency_p95", "kv_cache_growth_rate", "kv_cache_growth_oom",
                    "pcie_root_complex_utilization")
    return yaml_text(data, sort_keys=False)


SPECS = {"shipped": lambda: SPEC.read_text(), "30s": spec_text_at_30s, "dcgm-vllm-30s": lambda: dcgm_vllm(spec_text_at_30s())}


@pytest.fixture(scope="module", params=sorted(SPECS))
def spec(request):
    return parse_spec(SPECS[request.param](), "fusebox.yaml")


def published(spec) -> set[str]:
    """What exporters publish: conventions' names, and every raw metric of every source of the spec."""
    names = {*C.PROM.values(), *C.PROM_SELF.values(), *C.DCGM.values(), *C.FUSE_METRICS.values(),
             C.VLLM_GENERATION_TOKENS, C.VLLM_PREFIX_CACHE_HITS, C.VLLM_PREFIX_CACHE_QUERIES, C.VLLM_PREFIX_CACHE_HITS_OLD,
             C.VLLM_PREFIX_CACHE_QUERIES_OLD, C.VLLM_CACHE_CONFIG, *C.VLLM_KV_USAGE, C.VLLM_REQUESTS_RUNNING,
             *C.sglang_names(C.SGLANG_CACHE_HIT_RATE), *C.sglang_names(C.SGLANG_GENERATION_TOKENS),
             *C.sglang_names(C.SGLANG_REQUESTS_RUNNING), C.GATEWAY_ADMISSIONS, C.GATEWAY_OVERLOAD_SHED,
             C.GATEWAY_BREAKER_STATE, C.AM_NOTIFICATIONS_FAILED, C.ALERTS_METRIC, "up",
             C.VLLM_PREEMPTIONS, C.SGLANG_RETRACTIONS, C.VLLM_REQUESTS_WAITING, C.GATEWAY_PREEMPTIONS}
    names |= {f"{m}{s}" for m in (C.PROM["alignment_duration"], *C.FUSE_METRICS.values()) for s in HIST}
    for sig in spec.signals:
        for src in sig.sources.values():
            metrics = [m for m in (src.metric, src.capacity, src.free) if m]
            metrics += [sel.name for sel in vector_selectors(src.expr) if sel.name] if src.expr else []
            names.update(metrics)
            if sig.kind == "quantile":
                names.update(f"{m}{s}" for m in metrics for s in HIST)
    return names


def series_named(expr: str) -> set[str]:
    """Metric names of every selector in ``expr``, ``{__name__=~"a|b"}`` as a and b."""
    out = set()
    for sel in vector_selectors(expr):
        if sel.name:
            out.add(sel.name)
        for m in sel.matchers.matchers:
            if m.name == "__name__":
                assert re.fullmatch(r"[a-zA-Z0-9_:|]+", m.value), f"a __name__ pattern this test cannot list: {m.value}"
                out.update(m.value.split("|"))
    return out


def runbook_queries(spec) -> list[tuple[str, str]]:
    """(runbook, query): every ```promql block and every tier expression of the rendered runbooks."""
    out = []
    for path, text in render_runbooks(spec, render_rules(spec), "h").items():
        out += [(path, q.strip()) for q in re.findall(r"```promql\n(.*?)```", text, re.S)]
        out += [(path, q) for q in re.findall(r"^\| \w+ \| [^|]* \(`([^`]+)`\) \|", text, re.M)]
    return out


def panel_queries(spec) -> list[tuple[str, str]]:
    """(dashboard/panel, query): every panel target and every template variable's query."""
    out = []
    for name, board in render_dashboards.dashboards(spec).items():
        out += [(f"{name}/{title}", expr) for title, _ref, expr in render_dashboards.panel_queries(board)]
        for v in board["templating"]["list"]:
            if v["type"] == "query":
                inner = re.fullmatch(r"label_values\((.*), \w+\)", v["query"])
                out.append((f"{name}/${v['name']}", inner.group(1) if inner else v["query"]))
    return out


def test_the_records_the_spec_knows_are_those_the_rules_write(spec):
    """fusebox/signal_kinds.recorded_names (what the spec's check of runbook queries reads) is exactly
    what render_rules records, on each spec."""
    rendered = {r["record"] for g in render_rules(spec).groups for r in g["rules"] if "record" in r}
    assert set(recorded_names(spec)) == rendered


def test_every_runbook_and_panel_query_reads_a_record_or_a_published_metric(spec):
    recorded = set(recorded_names(spec))
    ok = recorded | published(spec)
    queries = runbook_queries(spec) + panel_queries(spec)
    assert len([q for q in queries if q[0].startswith("runbooks/")]) >= 2 * len(spec.signals)
    unread = sorted({(where, name) for where, q in queries for name in series_named(q) if name not in ok})
    assert unread == []
    # and the windows are the spec's: no record over a deriv window the spec does not have
    windows = {f"deriv{int(s.window_s // 60)}m" for s in spec.signals if s.kind in ("deriv", "time_to_full")}
    named = {n for _w, q in queries for n in series_named(q)}
    assert {m.group(0) for n in named for m in re.finditer(r"deriv\d+m", n)} <= windows


def test_each_runbook_starts_with_the_record_its_alert_reads(spec):
    books = render_runbooks(spec, render_rules(spec), "h")
    for sig in spec.signals:
        first = re.search(r"```promql\n(.*?)\n", books[f"runbooks/{sig.alert}.md"]).group(1).strip()
        assert first == kind_of(sig).records(sig)["value"]


def _with_query(text: str, signal: str, query: str) -> str:
    data = yaml.safe_load(text)
    data["signals"][signal]["runbook"]["diagnosis"] = [{"title": "mine", "query": query}]
    return yaml_text(data, sort_keys=False)


def _problem(text: str) -> str:
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    return str(e.value)


def _query_line(text: str, query: str) -> int:
    (line,) = [i for i, ln in enumerate(text.splitlines(), 1) if "query:" in ln and query in ln]
    return line


def test_a_hand_written_record_the_rules_do_not_write_is_a_spec_error_with_the_real_name():
    """The shipped runbook's old query, at 30 s: the record is now ...:deriv2m."""
    text = _with_query(spec_text_at_30s(), "kv_cache_growth_rate", "engine:fusebox_kv_cache_usage_bytes:deriv1m")
    msg = _problem(text)
    line = _query_line(text, "engine:fusebox_kv_cache_usage_bytes:deriv1m")
    assert f"fusebox.yaml:{line}:" in msg
    assert "engine:fusebox_kv_cache_usage_bytes:deriv1m is named like a record" in msg
    assert "did you mean engine:fusebox_kv_cache_usage_bytes:deriv2m (write ${kv_cache_growth_rate}" in msg


def test_a_record_named_after_the_signal_points_to_the_signals_value_record():
    """The shipped KVCacheTimeToFullLow runbook named engine:fusebox_kv_cache_growth_rate:deriv1m,
    which no rule writes (a deriv record is named after its gauge)."""
    text = _with_query(SPEC.read_text(), "kv_cache_time_to_full", "engine:fusebox_kv_cache_growth_rate:deriv1m")
    assert "did you mean engine:fusebox_kv_cache_usage_bytes:deriv1m (write ${kv_cache_growth_rate}" in _problem(text)


@pytest.mark.parametrize("query,says", [
    ("${kv_cache_growth}", "${kv_cache_growth} names no signal of the spec -- did you mean ${kv_cache_growth_oom}?"),
    ("${kv_cache_growth_rate.p99}", "signal kv_cache_growth_rate (kind deriv) has no record 'p99' -- use one of: ${kv_cache_growth_rate.value}"),
    ("${dashboard.kv}", "no dashboard record 'kv' -- use one of: ${dashboard.kv_usage}"),
    ("sum(${kv_cache_growth_rate}", "invalid PromQL"),
])
def test_a_bad_reference_is_a_spec_error_at_its_line(query, says):
    text = _with_query(SPEC.read_text(), "kv_cache_growth_rate", query)
    msg = _problem(text)
    assert says in msg
    assert f"fusebox.yaml:{_query_line(text, query)}:" in msg


def test_references_follow_the_window_and_raw_metrics_and_label_replace_are_left_alone():
    q = 'label_replace(max by (engine) (${kv_cache_growth_rate}), "e", "$1", "engine", "(.*)") / ${dashboard.kv_limit} or vllm:num_requests_running'
    for text, window in ((SPEC.read_text(), "1m"), (spec_text_at_30s(), "2m")):
        spec = parse_spec(_with_query(text, "kv_cache_growth_rate", q), "fusebox.yaml")
        (diag,) = spec.signal("kv_cache_growth_rate").runbook.diagnosis
        assert diag == ("mine", f'label_replace(max by (engine) (engine:fusebox_kv_cache_usage_bytes:deriv{window}), "e", "$1", '
                                f'"engine", "(.*)") / engine:fusebox_kv_cache_limit:bytes or vllm:num_requests_running')


def test_descriptions_name_the_window_the_rules_use():
    """`${window}` in a signal's description is its window: 2m at 30 s, where the text said "1 minute"."""
    for text, window in ((SPEC.read_text(), "1m"), (spec_text_at_30s(), "2m")):
        spec = parse_spec(text, "fusebox.yaml")
        for name in ("kv_cache_growth_rate", "kv_cache_time_to_full", "gpu_memory_time_to_full"):
            assert f"deriv over {window}" in spec.signal(name).description
        assert "over 5m." in spec.signal("alignment_latency_p95").description
        assert not [s.name for s in spec.signals if "${" in s.description]
