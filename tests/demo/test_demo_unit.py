"""The demo's parts that need no external tool: the demo spec, the floor, the checker, the
process supervisor (real processes, real process groups)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from _cli import run_cli
from _demo_support import alive
from _fuse_support import wait_for

from fusebox.demo.watch import Event
from fusebox.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
GPU0 = "GPU-5ca1ab1e-0000-4000-8000-000000000000"
ENGINE = "llava-decoder-0"


@pytest.fixture(scope="module")
def demo_spec(tmp_path_factory):
    from fusebox.demo import FAST, demo_spec_text
    from fusebox.spec import load_spec

    p = tmp_path_factory.mktemp("spec") / "demo.yaml"
    p.write_text(demo_spec_text((ROOT / "fusebox.yaml").read_text(), webhook_url="http://127.0.0.1:5/alertmanager",
                                credentials_file="/tmp/x.token", timing=FAST))
    return load_spec(p)


@pytest.fixture(scope="module")
def shipped():
    from fusebox.spec import load_spec

    return load_spec(ROOT / "fusebox.yaml")


def test_the_demo_spec_shortens_intervals_and_fors_but_keeps_thresholds_and_windows(demo_spec, shipped):
    assert demo_spec.scrape_interval_s == 1 and demo_spec.evaluation_interval_s == 1
    # the watcher's values (a quantile's in its panels group) at the demo's pace, not the shipped 30 s
    assert shipped.slow_evaluation_interval_s == 30 and demo_spec.slow_evaluation_interval_s == 1
    assert demo_spec.group_wait_critical_s == 1 and demo_spec.group_interval_s == 5
    assert demo_spec.webhook_url == "http://127.0.0.1:5/alertmanager" and demo_spec.credentials_file == "/tmp/x.token"
    for name, warn_t, crit_t, window in (("gpu_memory_utilization", 0.72, 0.783, None),
                                         ("alignment_latency_p95", 0.85, 1.28, 300),
                                         ("kv_cache_growth_rate", 9.2e6, 14.7e6, 60)):
        s = demo_spec.signal(name)
        tiers = {t.name: t for t in s.tiers}
        assert tiers["warning"].threshold == pytest.approx(warn_t) and tiers["critical"].threshold == pytest.approx(crit_t)
        assert tiers["warning"].for_s == 20 and tiers["critical"].for_s == 10
        assert tiers["critical"].keep_firing_for_s == 10
        if window:
            assert s.window_s == window == shipped.signal(name).window_s
    # tiers already shorter than the cap keep their own `for` (PCIe 3 s, OOM-imminent 0 s)
    assert demo_spec.signal("pcie_link_utilization").tiers[0].for_s == 3
    assert demo_spec.signal("kv_cache_growth_oom").tiers[0].for_s == 0


def test_the_floor_is_scrape_plus_evaluation_plus_for_plus_group_wait(demo_spec, shipped):
    from fusebox.demo import floor_s

    assert floor_s(demo_spec, "kv_cache_growth_rate") == 1 + 1 + 10 + 1
    assert floor_s(shipped, "gpu_memory_utilization") == 5 + 5 + 30 + 5
    # a `for` under the evaluation interval waits one whole evaluation: 15 s at 30 s counts 30 s
    from _support import spec_text_at_30s

    from fusebox.spec import parse_spec

    at_30s = parse_spec(spec_text_at_30s(), "fusebox.yaml")
    assert at_30s.signal("kv_cache_time_to_full").tiers[-1].for_s == 15
    assert floor_s(at_30s, "kv_cache_time_to_full") == 30 + 30 + 30 + 5


def _events():
    """A run that went right: warnings, criticals, the six gateway calls, phases."""
    ev = [Event(0, "phase", "baseline"), Event(100, "phase", "breach"), Event(200, "phase", "recovery")]
    for i, alert in enumerate(("GPUMemoryUtilizationHigh", "AlignmentLatencyP95High", "KVCacheGrowthRateHigh")):
        ent = GPU0 if i == 0 else ENGINE
        ev.append(Event(50 + i, "alert", "firing", {"alertname": alert, "severity": "warning", "entity": ent}))
        ev.append(Event(110 + i, "alert", "firing", {"alertname": alert, "severity": "critical", "entity": ent}))
    for lvl, action, scope in ((1, "freeze_admissions", {"hw_id": GPU0}), (2, "text_only_fallback", {"engine": ENGINE}),
                               (3, "kv_cache_eviction", {"engine": ENGINE})):
        ev.append(Event(112 + lvl, "fuse", "trip", {"level": lvl, "action": action, "scope": scope}))
        ev.append(Event(230 + lvl, "fuse", "release", {"level": lvl, "action": action, "scope": scope}))
    return sorted(ev, key=lambda e: e.at)


@pytest.fixture(scope="module")
def scenario():
    from fusebox.collectors.scenario import load_scenario

    return load_scenario()


def test_a_run_with_every_expected_event_passes(shipped, scenario):
    from fusebox.demo import verify

    assert verify(_events(), shipped, scenario) == []


@pytest.mark.parametrize("mutate, says", [
    (lambda ev: [e for e in ev if not (e.kind == "fuse" and e.what == "release" and e.detail["level"] == 2)],
     "level 2 (text_only_fallback) released 0 times"),
    (lambda ev: ev + [Event(300, "fuse", "trip", {"level": 3, "action": "kv_cache_eviction", "scope": {"engine": ENGINE}})],
     "level 3 (kv_cache_eviction) tripped 2 times"),
    (lambda ev: ev + [Event(120, "fuse", "trip", {"level": 1, "action": "freeze_admissions", "scope": {"hw_id": "GPU-other"}})],
     "level 1 (freeze_admissions) tripped 2 times"),
    (lambda ev: [Event(e.at if e.detail.get("severity") != "warning" or e.detail["alertname"] != "KVCacheGrowthRateHigh"
                       else 130, e.kind, e.what, e.detail) for e in ev],
     "KVCacheGrowthRateHigh: critical fired"),
    (lambda ev: [e for e in ev if e.what != "recovery"], "never reached its recovery phase"),
    (lambda ev: ev + [Event(240, "fuse", "trip", {"level": 2, "action": "freeze_admissions", "scope": {}})],
     "unexpected gateway call"),
    (lambda ev: [Event(e.at, e.kind, e.what, dict(e.detail, scope={"engine": "other"}))
                 if e.kind == "fuse" and e.detail["level"] == 3 else e for e in ev],
     "level 3 trip on engine='other'"),
])
def test_a_run_missing_or_adding_an_event_fails_and_says_what(shipped, scenario, mutate, says):
    from fusebox.demo import verify

    problems = verify(mutate(_events()), shipped, scenario)
    assert any(says in p for p in problems), problems


@pytest.mark.process
def test_a_child_that_dies_early_is_named_with_its_status_and_log(tmp_path):
    from fusebox.demo.supervisor import ChildDied, Supervisor

    sup = Supervisor(tmp_path)
    try:
        sup.start("flaky", [sys.executable, "-c", "import sys; print('cannot bind 127.0.0.1:1'); sys.exit(3)"])
        with pytest.raises(ChildDied) as e:  # check() raises once the child has exited: wait on that, not a second
            wait_for(sup.check, 60, 0.02, "Supervisor.check to see the child's exit")
        msg = str(e.value)
        assert "flaky (pid" in msg and "status 3" in msg and str(tmp_path / "flaky.log") in msg
        assert "cannot bind 127.0.0.1:1" in msg
    finally:
        sup.stop_all()


@pytest.mark.process
def test_stop_all_ends_each_child_and_its_grandchildren_by_process_group(tmp_path):
    from fusebox.demo.supervisor import Supervisor

    sup = Supervisor(tmp_path)
    pidfile = tmp_path / "grandchild.pid"
    # a child that ignores SIGTERM and leaves a grandchild behind in its group
    child = sup.start("stubborn", ["sh", "-c", f"trap '' TERM; sleep 300 & echo $! > {pidfile}; wait"])
    deadline = time.monotonic() + 5
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(pidfile.read_text())
    assert os.getpgid(grandchild) == child.pid
    t0 = time.monotonic()
    sup.stop_all()
    assert child.proc.returncode is not None
    assert time.monotonic() - t0 < 15
    assert sup.children == []
    # the grandchild is dead: gone, or a zombie waiting for whoever reaps orphans here
    deadline = time.monotonic() + 5
    while alive(grandchild):
        assert time.monotonic() < deadline, f"grandchild {grandchild} survived"
        time.sleep(0.05)


def test_demo_without_tools_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("FUSEBOX_TOOLS", str(tmp_path / "none"))
    monkeypatch.delenv("FUSEBOX_OTELCOL", raising=False)
    r = run_cli("demo", "--once", "--spec", str(ROOT / "fusebox.yaml"), "--workdir", str(tmp_path / "w"))
    assert r.returncode == 2
    assert r.stdout == ""  # bad input: the error on stderr, as every other fusebox command's
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("fusebox demo: missing prometheus") and "make tools" in last
    assert not (tmp_path / "w").exists()


# --- the live view's fuse table and alerts table (fusebox.demo.view) ------------------------------
GPU_KEY = f'{{cluster="demo",host_name="demo-node-0",hw_id="{GPU0}"}}'
ENGINE_KEY = '{cluster="demo",host_name="demo-node-0",engine="llava-decoder-0"}'


def _call(at, state, level, action, **scope):
    return {"at": at, "state": state, "level": level, "action": action, "scope": scope, "decision_id": "d"}


def test_fuse_rows_attach_gateway_calls_to_their_scope_and_show_a_short_scope():
    """/state levels as the fuse service keys them (fuse.rules.scope_key) and the gateway log's
    records: each call belongs to the row of its scope; the scope reads as its most specific
    label, the GPU UUID shortened (GPU-5ca1ab1e…0000), host and cluster beside it."""
    from fusebox.demo.view import fuse_rows

    calls = [_call(1108.9, "trip", 3, "kv_cache_eviction", cluster="demo", host_name="demo-node-0", engine=ENGINE),
             _call(1120.4, "trip", 2, "text_only_fallback", cluster="demo", host_name="demo-node-0", engine=ENGINE),
             _call(1120.5, "trip", 1, "freeze_admissions", cluster="demo", host_name="demo-node-0", hw_id=GPU0)]
    rows = fuse_rows({ENGINE_KEY: 3, GPU_KEY: 1}, calls, t0=1000.0)
    assert rows == [
        ("engine llava-decoder-0", "demo-node-0, demo", 3,
         "trip L3 kv_cache_eviction @108.9s, trip L2 text_only_fallback @120.4s"),
        ("hw_id GPU-5ca1ab1e…0000", "demo-node-0, demo", 1, "trip L1 freeze_admissions @120.5s"),
    ]
    # released: /state no longer lists the GPU scope; its row stays, level 0, with both calls
    calls.append(_call(1191.4, "release", 1, "freeze_admissions", cluster="demo", host_name="demo-node-0", hw_id=GPU0))
    rows = fuse_rows({ENGINE_KEY: 3}, calls, t0=1000.0)
    assert rows[1] == ("hw_id GPU-5ca1ab1e…0000", "demo-node-0, demo", 0,
                       "trip L1 freeze_admissions @120.5s, release L1 freeze_admissions @191.4s")


def test_absent_alerts_pending_before_the_first_data_are_one_waiting_row():
    from fusebox.demo.view import alert_rows

    alerts = {("FuseboxSignalAbsent", "warning", ""): ("pending", 95.0),
              ("KVCacheGrowthRateHigh", "warning", ENGINE): ("pending", 98.0)}
    assert alert_rows(alerts, False, 100.0) == [
        ("KVCacheGrowthRateHigh", "warning", ENGINE, "pending", "2s"),
        ("FuseboxSignalAbsent", "", "", "waiting for first data", "")]
    # once data has arrived, an absent alert is news: listed as it is
    assert alert_rows(alerts, True, 100.0)[0] == ("FuseboxSignalAbsent", "warning", "", "pending", "5s")


def test_the_header_labels_scenario_and_wall_time_and_gives_the_fuse_urls():
    import io

    from rich.console import Console

    from fusebox.demo.view import DemoView

    class W:  # the Watcher's fields the view reads
        phase, scenario_t0, errors, signals, values = "breach", time.time() - 100, {}, [], {}
        alerts, fuses, gateway_calls = {}, {}, []
        last_notification = {"http://127.0.0.1:9093": time.time() - 3}
        spec = load_spec(str(ROOT / "fusebox.yaml"))

        def have_data(self):
            return False

    out = io.StringIO()
    view = DemoView(Console(file=out, width=160, force_terminal=False), live=False)
    view.scenario_name, view.scenario_len, view.speed = "breach", 300, 1.25
    view.urls, view._watcher = {"prometheus": "http://p", "fuse": "http://127.0.0.1:9"}, W()
    view.console.print(view._render())
    text = out.getvalue()
    assert "t= 125s/300s scenario time (x1.25; 100s wall)" in text
    assert "http://127.0.0.1:9/  (status page; JSON: http://127.0.0.1:9/state; token in the work directory's fuse.token)" in text
    assert "events (wall seconds since scenario start)" in text
    # the heartbeat's feed (fusebox.yaml leaves fuse.self_monitoring.heartbeat_interval at its 1m default)
    assert "last notification from Alertmanager http://127.0.0.1:9093: 3 s ago (heartbeat every 1m)" in text


def test_the_feed_line_names_each_alertmanager_or_says_none_has_notified():
    from fusebox.demo.view import feed_line

    assert feed_line({}, 100.0, "1m") == "no notification from Alertmanager yet (heartbeat every 1m)"
    assert feed_line({"http://b:9093": 90.0, "http://a:9093": 40.0}, 100.0, "1m") == (
        "last notification from Alertmanager http://a:9093: 60 s ago; "
        "last notification from Alertmanager http://b:9093: 10 s ago (heartbeat every 1m)")


def test_fuse_state_events_shorten_the_gpu_uuid(monkeypatch, shipped, tmp_path):
    from fusebox.demo import watch

    w = watch.Watcher({"fuse": "http://f"}, shipped, tmp_path / "gw.jsonl", fuse_token="tok-1")
    asked = []
    monkeypatch.setattr(watch, "http_json", lambda url, token=None: asked.append((url, token)) or {"levels": {GPU_KEY: 1}})
    metrics = ('# TYPE fusebox_fuse_last_notification_timestamp_seconds gauge\n'
               'fusebox_fuse_last_notification_timestamp_seconds{alertmanager="http://127.0.0.1:9093"} 1.7e+09\n')
    monkeypatch.setattr(watch, "http_text", lambda url: asked.append((url, None)) or metrics)
    (ev,) = w._poll_fuse()
    assert asked == [("http://f/state", "tok-1"), ("http://f/metrics", None)]  # /state needs a reader token
    assert w.last_notification == {"http://127.0.0.1:9093": 1.7e9}
    assert ev.text == 'fuse /state {cluster="demo",host_name="demo-node-0",hw_id="GPU-5ca1ab1e…0000"}: level 0 -> 1'
    assert ev.detail["scope"] == GPU_KEY


# --- the rule engines (fusebox.demo.rule_engines) --------------------------------------------------------
@pytest.mark.process
def test_victoriametrics_scrapes_exactly_what_prometheus_scrapes(shipped, tmp_path):
    """-promscrape.config gets the demo Prometheus' global scrape_interval and scrape_configs and
    nothing else (VictoriaMetrics' strict parsing refuses rule_files and alerting)."""
    import yaml

    from fusebox.demo.rule_engines import make_engine, prometheus_config
    from fusebox.demo.stack import Ports

    ports = Ports.pick()
    eng = make_engine("victoriametrics", ports)
    eng.prepare(tmp_path, shipped, tmp_path / "rules.yml")
    got = yaml.safe_load((tmp_path / "promscrape.yml").read_text())
    prom = prometheus_config(shipped, tmp_path / "rules.yml", ports)
    assert set(got) == {"global", "scrape_configs"} and got["scrape_configs"] == prom["scrape_configs"]
    assert got["global"] == {"scrape_interval": prom["global"]["scrape_interval"]}


@pytest.mark.process
def test_vmalert_and_its_node_agree_on_the_delay_and_vmalert_adds_no_label(demo_spec, tmp_path):
    from fusebox.demo.rule_engines import make_engine
    from fusebox.demo.stack import Ports

    ports = Ports.pick(replicas=2)
    assert len({*ports.victoriametrics, *ports.vmalert, ports.alertmanager, ports.prometheus}) == 6
    eng = make_engine("victoriametrics", ports, replicas=2, tools={"victoria-metrics": "vm", "vmalert": "va"})
    eng.prepare(tmp_path, demo_spec, tmp_path / "rules.yml")
    for i in (0, 1):
        node = dict(a.split("=", 1) for a in eng.node_args(i, tmp_path)[1:])
        va = dict(a.split("=", 1) if "=" in a else (a, "") for a in eng.vmalert_args(i)[1:])
        # vmalert's -rule.evalDelay help: "should be equal to -search.latencyOffset"
        assert node["-search.latencyOffset"] == va["-rule.evalDelay"] == "2s"
        own = f"http://127.0.0.1:{ports.victoriametrics[i]}"
        assert va["-datasource.url"] == va["-remoteWrite.url"] == va["-remoteRead.url"] == own
        assert va["-notifier.url"] == f"http://127.0.0.1:{ports.alertmanager}"
        assert va["-evaluationInterval"] == "1s" and va["-rule"] == str(tmp_path / "rules.yml")
        # both replicas' alerts must carry the same labels for Alertmanager to merge them
        assert "-external.label" not in va and "-disableAlertgroupLabel" in va
        assert node["-storageDataPath"].endswith(f"victoriametrics-{i + 1}")


@pytest.mark.process
def test_engines_refuse_what_they_cannot_run():
    from fusebox.demo.rule_engines import make_engine
    from fusebox.demo.stack import Ports

    with pytest.raises(ValueError, match="unknown engine 'thanos'"):
        make_engine("thanos", Ports.pick())
    with pytest.raises(ValueError, match="victoriametrics engine only"):
        make_engine("prometheus", Ports.pick(replicas=2), replicas=2)
    with pytest.raises(ValueError, match="run with replicas >= 2"):
        make_engine("victoriametrics", Ports.pick()).stop_replica(None, 0)


def test_the_watcher_reads_active_alerts_and_fails_over_to_the_next_replica(monkeypatch, shipped, tmp_path):
    """Alerts come from the rule engine's /api/v1/alerts (Prometheus' and vmalert's shape); vmalert
    also lists resolved ("inactive") alerts, which are not active; a replica that does not answer
    is skipped for the next."""
    from fusebox.demo import watch

    class Engine:
        query_urls = ["http://dead:1", "http://vm2:2"]
        alerts_urls = ["http://dead:3", "http://va2:4"]

    def fake(url, token=None):
        if "dead" in url:
            raise ConnectionRefusedError(111, "Connection refused")
        if "/api/v1/alerts" in url:
            return {"status": "success", "data": {"alerts": [
                {"state": "firing", "labels": {"alertname": "KVCacheGrowthRateHigh", "severity": "critical", "engine": ENGINE}},
                {"state": "inactive", "labels": {"alertname": "GPUMemoryUtilizationHigh", "severity": "warning", "hw_id": GPU0}}]}}
        return {"status": "success", "data": {"resultType": "vector", "result": []}}

    monkeypatch.setattr(watch, "http_json", fake)
    w = watch.Watcher({}, shipped, tmp_path / "gw.jsonl", engine=Engine())
    ev = w._poll_engine()
    assert [(e.what, e.detail["alertname"], e.detail["entity"]) for e in ev] == [
        ("firing", "KVCacheGrowthRateHigh", ENGINE)]
    Engine.query_urls, Engine.alerts_urls = [], []
    with pytest.raises(OSError, match="no rule engine replica left"):
        w._poll_engine()


def test_the_watcher_merges_the_replicas_alerts_as_alertmanager_does(monkeypatch, shipped, tmp_path):
    """HA replicas evaluate their own node's data, so one can fire an evaluation before the other;
    Alertmanager (so the fuse) acts on the first notification, and the watcher must see the alert
    firing from that moment, whichever replica the queries read first."""
    from fusebox.demo import watch

    class Engine:
        query_urls = ["http://vm1:1", "http://vm2:2"]
        alerts_urls = ["http://va1:3", "http://va2:4"]

    firing = {"KVCacheGrowthRateHigh": "va2"}  # replica 2 is an evaluation ahead

    def fake(url, token=None):
        if "/api/v1/alerts" in url:
            state = "firing" if firing.get("KVCacheGrowthRateHigh", "-") in url or "both" in firing else "pending"
            return {"status": "success", "data": {"alerts": [
                {"state": state, "labels": {"alertname": "KVCacheGrowthRateHigh", "severity": "critical", "engine": ENGINE}}]}}
        return {"status": "success", "data": {"resultType": "vector", "result": []}}

    monkeypatch.setattr(watch, "http_json", fake)
    w = watch.Watcher({}, shipped, tmp_path / "gw.jsonl", engine=Engine())
    assert [(e.what, e.detail["alertname"]) for e in w._poll_engine()] == [("firing", "KVCacheGrowthRateHigh")]
    firing["both"] = "1"
    assert w._poll_engine() == []  # replica 1 catching up changes nothing
    firing.clear()
    assert [e.what for e in w._poll_engine()] == ["pending"]


def test_demo_refuses_replicas_without_victoriametrics(tmp_path):
    r = run_cli("demo", "--once", "--replicas", "2", "--spec", str(ROOT / "fusebox.yaml"), "--workdir", str(tmp_path / "w"))
    assert r.returncode == 2 and "--replicas must be 1..3, and above 1 only with --engine victoriametrics" in r.stderr


def test_a_thanos_spec_demos_on_the_engine_neutral_rules(tmp_path):
    """The demo's Prometheus and vmalert both refuse Thanos' partial_response_strategy: the demo
    spec of a `rule_engine: thanos` spec renders rules without it."""
    from fusebox.demo import FAST, demo_spec_text
    from fusebox.generator.outputs import RULE_FILE, render_all
    from fusebox.spec import load_spec

    text = (ROOT / "fusebox.yaml").read_text()
    assert "rule_engine: prometheus" in text
    thanos = text.replace("rule_engine: prometheus", "rule_engine: thanos", 1)
    assert "partial_response_strategy" in render_all(load_spec_text(tmp_path / "t.yaml", thanos))[RULE_FILE]
    p = tmp_path / "demo.yaml"
    p.write_text(demo_spec_text(thanos, webhook_url="http://127.0.0.1:5/alertmanager", credentials_file="/tmp/x.token", timing=FAST))
    spec = load_spec(p)
    assert spec.rule_engine == "prometheus"
    assert "partial_response_strategy" not in render_all(spec)[RULE_FILE]


def load_spec_text(path, text):
    from fusebox.spec import load_spec

    path.write_text(text)
    return load_spec(path)


def test_demo_refuses_a_speed_out_of_range_on_stderr(tmp_path):
    r = run_cli("demo", "--once", "--speed", "0", "--spec", str(ROOT / "fusebox.yaml"), "--workdir", str(tmp_path / "w"))
    assert (r.returncode, r.stdout) == (2, "")
    assert "--speed 0 is out of range: it must be in (0, 10]" in r.stderr
    assert not (tmp_path / "w").exists()


# --- traces: the breach's slowest hand-off, its exemplar and its trace in Jaeger ---------------------
def _trace_event(**over) -> Event:
    # what the watcher records from Prometheus' exemplar and Jaeger's trace (fusebox.demo.traces.SlowTrace)
    detail = {"le": "2", "value": 2.0, "trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331",
              "span": "mm.handoff", "duration_s": 2.0, "spans": 1, "url": "http://127.0.0.1:1/trace/0af7..."}
    return Event(200, "trace", "found", {**detail, **over})


def test_the_breach_scenarios_slowest_hand_off_is_2_s_in_the_2_s_bucket(shipped, scenario):
    from fusebox.demo.check import slowest_handoff

    # breach phase: p95 2.0 s at ten hand-offs a second, spread over [0, 2.0/0.95]: the slowest is
    # 2.0/0.95 x 9.5/10 = 2.0 s, in (1.5, 2.0] of the shipped alignment buckets
    assert slowest_handoff(shipped, scenario) == (2.0, 2.0)


def test_with_traces_the_run_needs_the_slowest_hand_offs_trace(shipped, scenario):
    from fusebox.demo import verify

    assert verify(_events() + [_trace_event()], shipped, scenario, traces=True) == []
    assert verify(_events() + [_trace_event(le="2.0")], shipped, scenario, traces=True) == []  # either spelling
    assert verify(_events(), shipped, scenario) == []  # without Jaeger, none is asked for
    (missing,) = verify(_events(), shipped, scenario, traces=True)
    assert "no exemplar on the slowest alignment bucket led to a trace in Jaeger" in missing


@pytest.mark.parametrize("over, says", [
    ({"le": "1", "value": 1.0}, "exemplar is 1 s on le=1, expected the scenario's slowest hand-off, 2 s on le=2"),
    ({"span": "POST /v1/chat/completions"}, "span POST /v1/chat/completions of 2 s, expected mm.handoff of 2 s"),
    ({"duration_s": 0.001}, "span mm.handoff of 0.001 s, expected mm.handoff of 2 s"),
])
def test_a_trace_that_is_not_the_slowest_hand_offs_fails_and_says_why(shipped, scenario, over, says):
    from fusebox.demo import verify

    problems = verify(_events() + [_trace_event(**over)], shipped, scenario, traces=True)
    assert any(says in p for p in problems), problems


def test_the_demos_jaeger_listens_only_on_the_ports_it_is_given():
    from fusebox.demo.stack import jaeger_config

    cfg = jaeger_config(otlp_grpc=1, query=2, query_grpc=3)
    text = str(cfg)
    assert sorted(int(p) for p in __import__("re").findall(r"'127\.0\.0\.1:(\d+)'", text)) == [1, 2, 3]
    assert "0.0.0.0" not in text and "localhost" not in text
    assert cfg["extensions"]["jaeger_storage"]["backends"]["memstore"] == {"memory": {"max_traces": 100_000}}
    assert cfg["service"]["telemetry"]["metrics"] == {"level": "none"}  # no 8888
