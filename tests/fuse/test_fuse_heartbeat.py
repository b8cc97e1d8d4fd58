"""The heartbeat (FuseboxHeartbeat): it reaches the fuse, is recorded per Alertmanager, trips nothing.

The labels come from the generated rule (render_rules), the routing from the generated
Alertmanager config, and the Alertmanager is Debian's, started here on loopback with its own
externalURL: the fuse's gauge must carry exactly that URL.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from _fuse_support import LiveService, alert, payload, wait_for
from _support import SPEC
from prometheus_client.parser import text_string_to_metric_families
from test_fuse_alertmanager import _People, _rfc3339, alertmanager  # noqa: F401  (the fixture)

from fusebox.demo.gateway import ReferenceGateway, read_log
from fusebox.fuse.rules import FuseRules
from fusebox.generator.render_rules import render_rules
from fusebox.spec import load_spec, parse_spec

LAST = "fusebox_fuse_last_notification_timestamp_seconds"  # docs/self-monitoring.md


def _rule_labels(spec, name):
    rules = [r for g in render_rules(spec).groups for r in g["rules"] if r.get("alert") == name]
    assert len(rules) == 1
    return {"alertname": name, **rules[0]["labels"]}


def _samples(text, name):
    return [(s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name]


def test_the_generated_heartbeat_is_always_firing_and_asks_for_no_fuse():
    spec = load_spec(SPEC)
    rule = next(r for g in render_rules(spec).groups for r in g["rules"] if r.get("alert") == "FuseboxHeartbeat")
    assert rule["expr"] == "vector(1)" and "for" not in rule
    assert rule["labels"] == {"fusebox": "multimodal-inference", "severity": "none"}


@pytest.mark.parametrize("extra", [
    {},
    {"fuse_action": "freeze_admissions", "fuse_level": "1", "hw_id": "GPU-5f3c", "cluster": "prod-a"},
    {"fuse_action": "kv_cache_eviction", "severity": "critical", "engine": "vllm-0"},
], ids=["as generated", "forged fuse_action with a scope", "forged action and severity"])
def test_the_heartbeat_never_trips_whatever_labels_it_carries(extra):
    rules = FuseRules.from_spec(load_spec(SPEC))
    labels = {**_rule_labels(load_spec(SPEC), "FuseboxHeartbeat"), **extra}
    assert rules.verdict(labels) is None


def test_a_heartbeat_sets_the_gauge_per_alertmanager_and_writes_no_audit_row(tmp_path):
    spec = load_spec(SPEC)
    hb = _rule_labels(spec, "FuseboxHeartbeat")
    forged = {**hb, "fuse_action": "freeze_admissions", "hw_id": "GPU-5f3c"}
    with LiveService(tmp_path / "s.sqlite", dry_run=True) as svc:
        for url, labels in (("http://am-0:9093", hb), ("http://am-1:9093", forged), ("http://am-0:9093", hb)):
            body = payload({**alert("FuseboxHeartbeat"), "labels": labels})
            body["externalURL"] = url
            t0 = time.time()
            r = svc.post(body)
            assert r.status_code == 200 and r.json()["decisions"] == [], r.text
            assert r.json()["alerts"] == {"heartbeat": 1}
        text = httpx.get(svc.url + "/metrics").text
        last = dict((lb["alertmanager"], v) for lb, v in _samples(text, LAST))
        assert set(last) == {"http://am-0:9093", "http://am-1:9093"}
        assert t0 - 5 < last["http://am-0:9093"] <= time.time()
        assert ({"result": "heartbeat"}, 3.0) in _samples(text, "fusebox_fuse_alerts_total")
        assert svc.state()["levels"] == {}
        assert svc.service.store.audit_log(50) == []


def test_a_real_alertmanager_sends_the_heartbeat_to_the_fuse_only_and_health_alerts_to_the_people(tmp_path, alertmanager):  # noqa: F811
    """Generated routing (shipped spec; heartbeat every second): the heartbeat reaches the fuse again and
    again, recorded under that Alertmanager's externalURL, tripping nothing; FuseboxFuseDown reaches the
    people only."""
    from fusebox.generator.render_alertmanager import render_alertmanager
    from fusebox.generator.yamlout import dump_yaml

    people = _People()
    text = SPEC.read_text()
    for old, new in (("group_wait: 30s", "group_wait: 100ms"), ("group_interval: 1m", "group_interval: 500ms"),
                     ("  allow_fleet_wide_alerts: false\n",
                      "  allow_fleet_wide_alerts: false\n  self_monitoring: {heartbeat_interval: 1s, heartbeat_silent_after: 5s}\n"),
                     ("  human_receiver:\n    name: oncall\n",
                      f"  human_receiver:\n    name: oncall\n    webhook_configs: [{{url: '{people.url}'}}]\n")):
        assert old in text
        text = text.replace(old, new, 1)
    spec = parse_spec(text.replace("webhook_url: http://127.0.0.1:9095/alertmanager", "webhook_url: URL", 1)
                      .replace("credentials_file: /etc/alertmanager/fusebox-fuse.token", "credentials_file: TOKEN_FILE", 1),
                      "fusebox.yaml")
    config = dump_yaml(render_alertmanager(spec)).replace("URL", "{url}/alertmanager").replace("TOKEN_FILE", "{token_file}")
    external = "http://alertmanager-heartbeat.example:9093"
    labels = [_rule_labels(spec, "FuseboxHeartbeat"),
              {"alertname": "FuseboxFuseDown", "fusebox": spec.name, "severity": "critical", "job": "fusebox-fuse",
               "instance": "fuse-1:9095"}]
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    try:
        with LiveService(tmp_path / "s.sqlite", gw.url, hold_s=0.5) as svc:
            am = alertmanager(svc.url, config, (f"--web.external-url={external}",))
            start = datetime.now(UTC) - timedelta(seconds=5)
            body = [{"labels": lb, "startsAt": _rfc3339(start)} for lb in labels]
            assert httpx.post(am + "/api/v2/alerts", json=body, timeout=5).status_code == 200

            def heartbeats():
                s = _samples(httpx.get(svc.url + "/metrics").text, "fusebox_fuse_alerts_total")
                return next((v for lb, v in s if lb == {"result": "heartbeat"}), 0.0)

            wait_for(lambda: heartbeats() >= 1, 15, 0.1, "the first heartbeat")
            first = dict((lb["alertmanager"], v)
                         for lb, v in _samples(httpx.get(svc.url + "/metrics").text, LAST))
            assert list(first) == [external]
            wait_for(lambda: heartbeats() >= 2, 15, 0.1, "a repeated heartbeat (repeat_interval 1s)")
            later = dict((lb["alertmanager"], v) for lb, v in _samples(httpx.get(svc.url + "/metrics").text, LAST))
            assert later[external] > first[external]
            wait_for(lambda: people.got, 15, 0.1, "the people told")
            time.sleep(1.0)
            assert svc.state()["levels"] == {}
            assert svc.service.store.audit_log(50) == []
    finally:
        gw.stop()
        people.close()
    assert read_log(tmp_path / "gw.jsonl") == []
    assert people.got == {("FuseboxFuseDown", spec.name)}  # never the heartbeat


def test_past_sixteen_alertmanagers_further_senders_share_one_series(tmp_path):
    with LiveService(tmp_path / "s.sqlite", dry_run=True) as svc:
        hb = _rule_labels(load_spec(SPEC), "FuseboxHeartbeat")
        for i in range(20):
            body = payload({**alert("FuseboxHeartbeat"), "labels": hb})
            body["externalURL"] = f"http://am-{i}:9093"
            assert svc.post(body).status_code == 200
        senders = {lb["alertmanager"] for lb, _ in _samples(httpx.get(svc.url + "/metrics").text, LAST)}
    assert senders == {f"http://am-{i}:9093" for i in range(16)} | {"other"}
