"""Ordinary signals (issue 10, part 3): `unit: count`, any `level`, annotations from `by`, selectors
per source backend and `global.source`, the queue-depth worked example of docs/spec.md,
`fusebox init` and `fusebox schema`."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from _cli import run_cli
from _support import FIXTURES, ROOT, SPEC, promtools, trimmed_spec, unscaled, yaml_data, yaml_text

from fusebox.generator.deadselectors import dead_selectors, load_captures, load_rules
from fusebox.generator.outputs import render_all
from fusebox.generator.writer import write_outputs
from fusebox.spec import parse_spec
from fusebox.spec.errors import SpecError
from fusebox.spec.units import humanize, parse_quantity

DOC = ROOT / "docs/spec.md"
DCGM_CAPTURE = FIXTURES / "generator/datadog_dcgm_metrics_fixture_t4_mixed.txt"


def example_block() -> str:
    """The worked example's YAML block of docs/spec.md (the one that starts with queue_depth:)."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    found = [b for b in blocks if b.startswith("queue_depth:")]
    assert len(found) == 1, "docs/spec.md holds one worked example block"
    return found[0]


def example_spec_text(**global_) -> str:
    """The shipped spec with the docs' queue_depth signal added, and ``global_`` keys set."""
    data = yaml_data(SPEC.read_text())
    data["signals"].update(yaml.safe_load(example_block()))
    data["global"].update(global_)
    return yaml_text(data, sort_keys=False)


def _spec(text: str):
    return parse_spec(text, "fusebox.yaml")


def _edit(**changes) -> str:
    data = yaml.safe_load(example_spec_text())
    sig = data["signals"]["queue_depth"]
    for k, v in changes.items():
        if v is None:
            sig.pop(k, None)
        else:
            sig[k] = v
    return yaml_text(data, sort_keys=False)


# ------------------------------------------------------------------------------ unit: count
@pytest.mark.parametrize("text, value", [(50, 50.0), ("50", 50.0), (" 2.5 ", 2.5), ("1e3", 1000.0), (7.0, 7.0)])
def test_count_thresholds_are_plain_numbers(text, value):
    assert parse_quantity(text, "count") == value


@pytest.mark.parametrize("text", ["50%", "50 requests", "fifty", "-3", "nan", "inf"])
def test_count_thresholds_refuse_units_and_junk(text):
    with pytest.raises(ValueError):
        parse_quantity(text, "count")


def test_count_reads_as_a_plain_number():
    assert humanize(50.0, "count") == "50"
    assert humanize(2.5, "count") == "2.5"


def test_a_count_threshold_with_a_unit_says_how_to_write_it():
    data = yaml.safe_load(example_spec_text())
    data["signals"]["queue_depth"]["tiers"]["critical"]["threshold"] = "50 requests"
    with pytest.raises(SpecError) as e:
        _spec(yaml_text(data, sort_keys=False))
    msg = str(e.value)
    assert "threshold" in msg and "plain number" in msg and "e.g. 50" in msg


# ------------------------------------------------------------------------------- any level
def test_a_level_outside_by_is_refused_with_the_fix():
    with pytest.raises(SpecError) as e:
        _spec(_edit(by=["namespace", "model_name"]))
    assert "level 'pod' is not one of the signal's 'by' labels" in str(e.value)
    assert "by: [namespace, model_name, pod]" in str(e.value)


def test_a_custom_level_needs_by():
    with pytest.raises(SpecError) as e:
        _spec(_edit(by=None))
    assert "level 'pod'" in str(e.value)
    # docs/spec.md: cluster is not put in `by` (the rules add it); the hint says so too
    assert "by: [namespace, pod]" in str(e.value) and "cluster" not in str(e.value).split(" -- ", 1)[1]


def test_a_fuse_on_a_pod_signal_without_a_scope_label_is_refused():
    data = yaml.safe_load(example_spec_text())
    data["signals"]["queue_depth"]["tiers"]["critical"]["fuse"] = "freeze_admissions"
    with pytest.raises(SpecError) as e:
        _spec(yaml_text(data, sort_keys=False))
    assert "no fuse scope label" in str(e.value)
    # with the engine label in by, the fuse can be scoped
    data["signals"]["queue_depth"]["by"].append("engine")
    assert _spec(yaml_text(data, sort_keys=False)).signal("queue_depth").tiers[1].fuse == "freeze_admissions"


@pytest.mark.parametrize("level", ["model_name", "namespace"])
def test_other_levels_generate_everything(tmp_path, level):
    spec = _spec(_edit(level=level))
    outputs = render_all(spec)
    rules = yaml.safe_load(outputs["rules/fusebox.rules.yml"])
    records = [r.get("record") for g in rules["groups"] for r in g["rules"]]
    assert f"{level}:fusebox_queue_depth:count" in records


def test_the_fuse_and_the_demo_read_a_pod_level_spec():
    from fusebox.collectors.scenario import load_scenario
    from fusebox.demo.check import expectations
    from fusebox.demo.spec import demo_spec_text
    from fusebox.fuse.rules import FuseRules

    text = example_spec_text()
    spec = _spec(text)
    FuseRules.from_spec(spec)
    demo = _spec(demo_spec_text(text, webhook_url="http://127.0.0.1:1/alertmanager", credentials_file="/tmp/t"))
    assert demo.signal("queue_depth").level == "pod"
    scenario = load_scenario(ROOT / "collectors/scenarios/breach.yaml")
    # the scenario does not model a vLLM queue: the three fuse expectations stay what they were
    assert {x.signal for x in expectations(demo, scenario)} == {
        "gpu_memory_utilization", "alignment_latency_p95", "kv_cache_growth_rate"}


# ------------------------------------------------------------------------ the worked example
@pytest.fixture(scope="module")
def example_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("queue-depth")
    spec = _spec(example_spec_text(selectors={"vllm": {"namespace": "inference"}}))
    write_outputs(render_all(spec), out)
    return out


def _group(doc, name):
    return next(g for g in doc["groups"] if g["name"] == name)


def test_the_example_records_and_alerts(example_out):
    doc = yaml_data((example_out / "rules/fusebox.rules.yml").read_text())
    # the record, for the panels, at the slow interval; the alerts (direction above) filter the
    # series first and take the max per pod (docs/rule-engines.md, "Rule cost")
    panels = _group(doc, "fusebox-queue_depth-panels")
    assert panels["interval"] == "30s"
    assert panels["rules"] == [{"record": "pod:fusebox_queue_depth:count",
                                "expr": 'max by (namespace, pod, model_name) (vllm:num_requests_waiting{namespace="inference"})'}]
    alerts = _group(doc, "fusebox-queue_depth")["rules"]
    assert [(" ".join(a["expr"].split()), a["for"], a["labels"]["severity"]) for a in alerts] == [
        ('max by (namespace, pod, model_name) (vllm:num_requests_waiting{namespace="inference"} >= 20)', "2m", "warning"),
        ('max by (namespace, pod, model_name) (vllm:num_requests_waiting{namespace="inference"} >= 50)', "1m", "critical")]
    assert alerts[1]["annotations"]["summary"] == "VLLMQueueDepthHigh: queue_depth >= 50 on pod {{ $labels.pod }} (critical)"
    assert alerts[1]["annotations"]["description"] == (
        "queue_depth on pod {{ $labels.pod }} (namespace {{ $labels.namespace }}, model_name {{ $labels.model_name }}) "
        "has been >= 50 for 1m.")
    absent = [r for r in _group(doc, "fusebox-absent")["rules"] if r["labels"]["metric"] == "vllm:num_requests_waiting"]
    assert absent[0]["expr"] == 'absent(vllm:num_requests_waiting{namespace="inference"})'
    # the other backends keep global.selector (empty in the shipped spec)
    assert "fusebox_kv_cache_usage_bytes[1m]" in _group(doc, "fusebox-kv_cache_growth_rate")["rules"][0]["expr"]


def test_the_example_tests_use_vllm_labels_and_real_text(example_out):
    doc = yaml_data((example_out / "rules/fusebox.rules.test.yml").read_text())
    groups = [g for g in doc["tests"] if any("vllm:num_requests_waiting" in s["series"] for s in g["input_series"])
              and any(t["alertname"] == "VLLMQueueDepthHigh" for t in g["alert_rule_test"])]
    assert len(groups) == 4  # each tier, just above and just below
    series = groups[0]["input_series"][0]["series"]
    assert 'model_name="llava-hf/llava-1.5-7b-hf"' in series and 'namespace="inference"' in series and "pod=" in series
    assert "model=" not in series
    # whole requests around each threshold: 21 / 19 and 51 / 49
    values = sorted(float(g["input_series"][0]["values"].split("x")[0]) for g in groups)
    assert values == [19.0, 21.0, 49.0, 51.0]
    fired = [a for g in groups for t in g["alert_rule_test"] for a in t["exp_alerts"]]
    assert fired
    for a in fired:
        assert a["exp_labels"]["pod"] == "vllm-llava-7b-6d9f7c8b5-x2l9q"
        assert set(a["exp_labels"]) == {"namespace", "pod", "model_name", "severity", "signal", "fusebox"}
    crit = next(a for a in fired if a["exp_labels"]["severity"] == "critical")
    assert crit["exp_annotations"]["summary"] == "VLLMQueueDepthHigh: queue_depth >= 50 on pod vllm-llava-7b-6d9f7c8b5-x2l9q (critical)"
    assert crit["exp_annotations"]["description"] == (
        "queue_depth on pod vllm-llava-7b-6d9f7c8b5-x2l9q (namespace inference, model_name llava-hf/llava-1.5-7b-hf) "
        "has been >= 50 for 1m.")


def test_no_generated_annotation_names_an_empty_label(example_out):
    doc = yaml_data((example_out / "rules/fusebox.rules.test.yml").read_text())
    for g in doc["tests"]:
        for t in g["alert_rule_test"]:
            for a in t["exp_alerts"]:
                for text in a["exp_annotations"].values():
                    assert "{{" not in text
                    assert not re.search(r"\(\s*\)|  |on  | \(\)|\b(pod|namespace|model_name|GPU|engine|host) [(,]", text), text


@pytest.fixture(scope="module")
def example_alone(tmp_path_factory):
    """The worked example beside GPU memory alone (_support.trimmed_spec): its cases under the
    tools in seconds (the shipped signals' cases run in conftest's shipped_check)."""
    out = tmp_path_factory.mktemp("queue-depth-alone")
    spec = _spec(trimmed_spec(example_spec_text(selectors={"vllm": {"namespace": "inference"}}), "queue_depth"))
    write_outputs(render_all(spec), out)
    return out


@pytest.mark.tools
@pytest.mark.parametrize("which", [0, 1], ids=["promtool-2.42", "promtool-3"])
def test_the_example_passes_promtool(example_alone, which):
    pt = promtools()[which]
    assert "VLLMQueueDepthHigh" in (example_alone / "rules/fusebox.rules.test.yml").read_text()
    r = subprocess.run([pt, "check", "rules", "fusebox.rules.yml"], cwd=example_alone / "rules", capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([pt, "test", "rules", "fusebox.rules.test.yml"], cwd=example_alone / "rules", capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


def test_the_example_is_drawn_on_the_dashboards(example_out):
    # filtered by the namespace and pod variables (the mixins' convention; issue 21), the labels it keeps
    sel = 'pod:fusebox_queue_depth:count{namespace=~"$namespace", pod=~"$pod"}'
    for name, expr in (("overview", f"topk(5, {sel})"), ("secondary", sel)):
        d = json.loads((example_out / f"dashboards/fusebox-{name}.json").read_text())
        panel = next(p for p in d["panels"] if p["title"] == "VLLMQueueDepthHigh: queue depth")
        assert panel["fieldConfig"]["defaults"]["unit"] == "short"
        assert [(t["expr"], t["legendFormat"]) for t in panel["targets"]] == [(expr, "{{namespace}} {{pod}} {{model_name}}")]
        steps = [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]
        assert steps[1:] == [20, 50]
    rb = (example_out / "runbooks/VLLMQueueDepthHigh.md").read_text()
    assert "| critical | 50 (`pod:fusebox_queue_depth:count >= 50`) | 1m |" in rb


def test_a_pod_level_signal_with_cluster_in_by_is_filtered_by_cluster():
    spec = _spec(_edit(by=["cluster", "namespace", "pod", "model_name"]))
    d = json.loads(render_all(spec)["dashboards/fusebox-overview.json"])
    panel = next(p for p in d["panels"] if p["title"] == "VLLMQueueDepthHigh: queue depth")
    assert panel["targets"][0]["expr"] == ('topk(5, pod:fusebox_queue_depth:count{cluster=~"$cluster", '
                                           'namespace=~"$namespace", pod=~"$pod"})')
    assert panel["targets"][0]["legendFormat"] == "{{namespace}} {{pod}} {{model_name}}"
    # the namespace and pod variables list the values of that signal's record, narrowed by cluster
    tpl = {v["name"]: v["query"] for v in d["templating"]["list"]}
    assert tpl["namespace"] == 'label_values(pod:fusebox_queue_depth:count{cluster=~"$cluster"}, namespace)'
    assert tpl["pod"] == ('label_values(pod:fusebox_queue_depth:count{cluster=~"$cluster", '
                                   'namespace=~"$namespace"}, pod)')


# -------------------------------------------------------------- selectors per source backend
def _rules(spec):
    return yaml.safe_load(render_all(spec)["rules/fusebox.rules.yml"])


def unmatched_selectors(rules, captures, tmp=None):
    """The dead selectors `fusebox check --rules ... --against ...` reports for these rule groups."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "rules.yml"
        path.write_text(yaml.safe_dump(rules, sort_keys=False))
        return dead_selectors(load_rules(path), load_captures(captures)).dead


def test_global_source_switches_every_signal_with_a_dcgm_source():
    spec = _spec(SPEC.read_text().replace("  source: fusebox\n", "  source: dcgm\n", 1))
    got = {s.name: s.source.backend for s in spec.signals}
    assert got == {"gpu_memory_utilization": "dcgm", "memory_bandwidth_saturation": "dcgm", "alignment_latency_p95": "fusebox",
                   "kv_cache_growth_rate": "fusebox", "kv_cache_growth_oom": "fusebox", "pcie_link_utilization": "fusebox",
                   "kv_cache_time_to_full": "fusebox", "gpu_memory_time_to_full": "dcgm",
                   "preemption_rate": "vllm",  # no dcgm source: its first listed
                   "pcie_root_complex_utilization": "fusebox",
                   "connection_idle_p95": "fusebox", "connection_cold_start_share": "fusebox"}


def test_a_signals_own_source_and_an_override_win_over_global_source():
    data = yaml_data(SPEC.read_text())
    data["global"]["source"] = "dcgm"
    data["signals"]["memory_bandwidth_saturation"]["source"] = "fusebox"
    data["overrides"] = [{"alert": "GPUMemoryUtilizationHigh", "source": "fusebox"}]
    spec = _spec(yaml_text(data, sort_keys=False))
    assert spec.signal("memory_bandwidth_saturation").source.backend == "fusebox"
    assert spec.signal("gpu_memory_utilization").source.backend == "fusebox"


@pytest.mark.parametrize("key, value, needle", [
    ("source", "dcmg", "no signal lists a source 'dcmg'"),
    ("selectors", {"dcmg": {"namespace": "x"}}, "no source backend is called 'dcmg'"),
    ("selectors", {"dcgm": {"0bad": "x"}}, "invalid label name '0bad'"),
])
def test_bad_global_source_and_selectors_are_spec_errors(key, value, needle):
    data = yaml_data(SPEC.read_text())
    data["global"][key] = value
    with pytest.raises(SpecError) as e:
        _spec(yaml_text(data, sort_keys=False))
    assert needle in str(e.value)
    assert re.search(r"fusebox\.yaml:\d+:\d+: ", str(e.value))


def _dcgm_spec(keep: tuple[str, ...] | None = None, **global_):
    """The shipped spec on dcgm-exporter's series (``global_`` keys set); with ``keep``, only GPU
    memory and those signals (_support.trimmed_spec)."""
    data = yaml_data(SPEC.read_text())
    data["global"].update({"source": "dcgm", **global_})
    text = yaml_text(data, sort_keys=False)
    return _spec(text if keep is None else trimmed_spec(text, *keep))


def test_a_global_selector_kept_off_dcgm_series_lets_the_rules_select_a_real_capture():
    """dcgm-exporter's series live elsewhere than the engines: with global.selector alone they
    would get namespace="inference" and match nothing; selectors.dcgm gives them their own."""
    forced = _dcgm_spec(selector={"namespace": "inference"})
    dead = {u.selector for u in unmatched_selectors(_rules(forced), [DCGM_CAPTURE])}
    # the DCP field carries the workload's namespace in the capture (ray-llm), so the forced matcher
    # is judged and dead; FB_FREE carries none, and a label no sample has is left unjudged (scrape-time labels)
    assert 'DCGM_FI_PROF_DRAM_ACTIVE{namespace="inference"}' in dead

    fixed = _dcgm_spec(selector={"namespace": "inference"}, selectors={"dcgm": {}})
    rules = _rules(fixed)
    dead = {u.selector.split("{")[0] for u in unmatched_selectors(rules, [DCGM_CAPTURE])}
    # every dcgm field the switched rules read is in the real T4/A10G capture
    read = set(re.findall(r"\bDCGM_FI_\w+", yaml.safe_dump(rules)))
    assert read >= {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_PROF_DRAM_ACTIVE"}
    assert not read & dead
    # the fusebox backend keeps global.selector
    assert 'fusebox_gpu_pcie_utilization_ratio{namespace="inference"}' in yaml.safe_dump(rules, width=1000)
    # the DCP field carries the pod's namespace in the capture: a dcgm matcher on it selects it
    ns = _dcgm_spec(selectors={"dcgm": {"namespace": "ray-llm"}})
    dead = {u.selector for u in unmatched_selectors(_rules(ns), [DCGM_CAPTURE])}
    assert 'DCGM_FI_PROF_DRAM_ACTIVE{namespace="ray-llm"}' not in dead


@pytest.mark.tools
@pytest.mark.parametrize("which", [0, 1], ids=["promtool-2.42", "promtool-3"])
def test_switched_rules_with_per_backend_selectors_pass_their_generated_tests(tmp_path, which):
    # the signals dcgm switches (GPU memory, its time to full, memory bandwidth) alone: the tools' run in seconds
    spec = _dcgm_spec(("gpu_memory_time_to_full", "memory_bandwidth_saturation"), selector={"namespace": "inference"},
                      selectors={"dcgm": {"namespace": "gpu-operator"}})
    write_outputs(render_all(spec), tmp_path)
    text = (tmp_path / "rules/fusebox.rules.test.yml").read_text()
    assert 'DCGM_FI_DEV_FB_FREE{' in text and 'namespace="gpu-operator"' in text
    r = subprocess.run([promtools()[which], "test", "rules", "fusebox.rules.test.yml"], cwd=tmp_path / "rules",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


# --------------------------------------------------------------------- fusebox init / schema
def _run(args, cwd):
    return run_cli(*args, cwd=cwd)


def test_the_starter_spec_is_the_shipped_spec():
    assert (ROOT / "fusebox/data/fusebox.yaml").read_bytes() == SPEC.read_bytes()
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["fusebox"]
    assert "data/*" in data


def test_init_then_generate_in_an_empty_folder(tmp_path):
    r = _run(["init"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "fusebox.yaml").read_bytes() == SPEC.read_bytes()
    r = _run(["generate"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "rules/fusebox.rules.yml").is_file() and (tmp_path / "dashboards/fusebox-overview.json").is_file()


def test_init_never_overwrites(tmp_path):
    (tmp_path / "fusebox.yaml").write_text("mine\n")
    r = _run(["init", str(tmp_path)], ROOT)
    assert r.returncode == 2
    assert f"{tmp_path / 'fusebox.yaml'}:1:1: a spec is already there -- " in r.stderr
    assert (tmp_path / "fusebox.yaml").read_text() == "mine\n"


def test_init_makes_the_folder(tmp_path):
    r = _run(["init", "monitoring/spec"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "monitoring/spec/fusebox.yaml").is_file()


@pytest.fixture(scope="module")
def schema():
    r = _run(["schema"], ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_schema_is_draft_07_with_descriptions(schema):
    import jsonschema

    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    sig = schema["definitions"]["RawSignal"]["properties"]
    assert "count" in sig["unit"]["enum"]
    assert "pod" in sig["level"]["description"]
    assert "per source backend" in schema["definitions"]["RawGlobal"]["properties"]["selectors"]["description"]


def test_the_schema_accepts_the_shipped_spec_the_starter_and_the_example(schema):
    import jsonschema

    v = jsonschema.Draft7Validator(schema)
    for text in (SPEC.read_text(), (ROOT / "fusebox/data/fusebox.yaml").read_text(),
                 example_spec_text(selectors={"vllm": {"namespace": "inference"}}, source="dcgm")):
        assert [e.message for e in v.iter_errors(yaml.safe_load(text))] == []


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d["global"].update(selectorz={}), "'selectorz' was unexpected"),
    (lambda d: d["signals"]["queue_depth"].update(unit="requests"), "'requests' is not one of"),
    (lambda d: d["global"].pop("runbook_base_url"), "'runbook_base_url' is a required property"),
    (lambda d: d["signals"]["queue_depth"]["tiers"]["warning"].update(threshold=[20]), "is not valid under any of the given schemas"),
])
def test_the_schema_rejects_a_wrong_spec(schema, edit, needle):
    import jsonschema

    data = yaml.safe_load(example_spec_text())
    edit(data)
    messages = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(data)]
    assert any(needle in m for m in messages), messages


def test_the_demo_reads_its_own_collectors_whatever_source_and_selectors_the_spec_sets():
    from fusebox.demo.spec import demo_spec_text

    data = yaml.safe_load(example_spec_text())
    data["global"].update(source="dcgm", selector={"cluster": "prod-a"}, selectors={"dcgm": {"namespace": "gpu-operator"}})
    data["signals"]["memory_bandwidth_saturation"]["source"] = "dcgm"
    demo = _spec(demo_spec_text(yaml_text(data, sort_keys=False), webhook_url="http://127.0.0.1:1/alertmanager",
                                credentials_file="/tmp/t"))
    # neither has a fusebox source: the example's queue depth, the engines' preemption counter
    assert {s.name for s in demo.signals if s.source.backend != "fusebox"} == {"queue_depth", "preemption_rate"}
    assert demo.selector == {} and demo.selectors == {}


def test_a_signal_without_sources_says_so():
    with pytest.raises(SpecError) as e:
        _spec(_edit(sources={}))
    assert "a signal needs at least one source" in str(e.value)


def test_init_into_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    r = _run(["init", "f"], tmp_path)
    assert r.returncode == 2
    assert "f:1:1: not a folder -- " in r.stderr


def _without_by(*names, empty=False, alone=False):
    """The shipped spec with the ``by`` of the signals ``names`` removed (or ``empty``); ``alone``:
    only GPU memory and those signals (_support.trimmed_spec)."""
    data = unscaled(yaml_data(SPEC.read_text()), *names)  # a signal without `model` scales nothing
    for n in names:
        if empty:
            data["signals"][n]["by"] = []
        else:
            data["signals"][n].pop("by")
    text = yaml_text(data, sort_keys=False)
    return _spec(trimmed_spec(text, *names) if alone else text)


def test_a_quantile_summed_by_nothing_names_no_label():
    spec = _without_by("alignment_latency_p95", empty=True)
    rules = _rules(spec)
    alert = next(r for r in _group(rules, "fusebox-alignment_latency_p95")["rules"] if r.get("alert"))
    assert alert["annotations"]["summary"] == "AlignmentLatencyP95High: alignment_latency_p95 >= 0.85s (warning)"
    assert alert["annotations"]["description"] == "alignment_latency_p95 has been >= 0.85s for 1m."


TTFT_SAID = ("Measured: time to first token (stand-in: queueing + prefill + encoder, where the engine publishes no "
             "encoder timing), compared with thresholds meant for the hand-off.")


def test_the_alignment_alert_keeps_and_says_what_was_measured():
    """The collector's `source` (handoff | encoder | ttft) survives the records into the alert, the
    generated tests drive a ttft series and expect it said; the fuse's scope still ignores it."""
    from fusebox.fuse.rules import scope_of

    out = render_all(_spec(SPEC.read_text()))
    group = _group(yaml.safe_load(out["rules/fusebox.rules.yml"]), "fusebox-alignment_latency_p95")
    for r in group["rules"]:
        if r.get("record"):
            assert "sum by (cluster, host_name, engine, model, source)" in r["expr"], r
    tests = yaml.safe_load(out["rules/fusebox.rules.test.yml"])
    fired = [a for g in tests["tests"] for t in g["alert_rule_test"] if t["alertname"] == "AlignmentLatencyP95High"
             for a in t["exp_alerts"]]
    assert fired and all(a["exp_labels"]["source"] == "ttft" for a in fired)
    crit = next(a for a in fired if a["exp_labels"]["severity"] == "critical")
    assert crit["exp_annotations"]["summary"] == (
        "AlignmentLatencyP95High: alignment_latency_p95 >= 1.28s on engine engine-0 (critical) [measured: time to first token]")
    assert crit["exp_annotations"]["description"].endswith("(no vision encoder). " + TTFT_SAID)
    assert scope_of(crit["exp_labels"]) == scope_of({k: v for k, v in crit["exp_labels"].items() if k != "source"})
    runbook = out["runbooks/AlignmentLatencyP95High.md"]
    assert "## What was measured" in runbook
    for value in ("handoff", "encoder", "ttft"):
        assert f"| `{value}` |" in runbook


def test_an_alert_without_source_says_nothing_of_it():
    """The scenario player's hand-off times carry no `source`: the annotation reads as before."""
    from fusebox.generator.render_tests import _expand

    alert = next(r for r in _group(_rules(_spec(SPEC.read_text())), "fusebox-alignment_latency_p95")["rules"]
                 if r.get("alert"))
    labels = {"engine": "e0", "model": "m", "host_name": "h"}
    assert _expand(alert["annotations"]["summary"], labels) == (
        "AlignmentLatencyP95High: alignment_latency_p95 >= 0.85s on engine e0 (warning)")
    assert _expand(alert["annotations"]["description"], labels) == "alignment_latency_p95 on engine e0 (m) on h has been >= 0.85s for 1m."
    assert _expand(alert["annotations"]["description"], {**labels, "source": "ttft"}).endswith("for 1m. " + TTFT_SAID)


@pytest.mark.tools
def test_a_deriv_without_by_keeps_the_gauges_labels_and_says_so(tmp_path):
    spec = _without_by("kv_cache_growth_rate", "kv_cache_growth_oom", alone=True)  # the tools' run in seconds
    write_outputs(render_all(spec), tmp_path)
    doc = yaml.safe_load((tmp_path / "rules/fusebox.rules.test.yml").read_text())
    fired = [a for g in doc["tests"] for t in g["alert_rule_test"] if t["alertname"] == "KVCacheGrowthRateHigh"
             for a in t["exp_alerts"]]
    assert fired[0]["exp_annotations"]["description"].startswith(
        "kv_cache_growth_rate on engine engine-0 (llava-1.5-7b) on gpu-node-1 has been >= 9.2 MB/s")
    assert fired[0]["exp_labels"]["job"] == "fusebox-kv"  # deriv alone keeps the sender's labels
    for pt in promtools():
        r = subprocess.run([pt, "test", "rules", "fusebox.rules.test.yml"], cwd=tmp_path / "rules", capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr


def test_an_advice_naming_a_label_its_alert_drops_is_reported_at_the_advice():
    # Found by tests/generator/test_generator_fuzz.py: ConnectionColdStartsHigh's advice names
    # {{ $labels.host_name }}; a `by` without host_name made `fusebox generate` end in a traceback.
    text = SPEC.read_text()
    start = text.index("  connection_cold_start_share:")
    by = text.index("    by: [cluster, host_name, service_peer_name]", start)
    text = text[:by] + "    by: [cluster, service_peer_name]" + text[by + len("    by: [cluster, host_name, service_peer_name]"):]
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "fusebox.yaml")
    (p,) = ei.value.problems
    lines = text.splitlines()
    advice_line = next(i for i in range(text[:start].count("\n"), len(lines)) if lines[i].strip() == "advice: >-") + 1
    assert (p.line, p.what) == (advice_line, "advice names label 'host_name', which the alert lacks (it keeps cluster, "
                                             "service_peer_name: the signal's by)")
    assert p.fix == "add host_name to the signal's by, or leave it out of the advice"
