"""Alertmanager routing: only fusebox's own alerts that request a fuse reach the fuse receiver.

Checked three ways, as the routing is rendered: the standalone config (amtool's routing tests,
foreign alerts included), the fragment merged into kube-prometheus-stack's default config and into
a config with a pager (``fusebox alertmanager merge``, then amtool on the result), and the
Prometheus Operator AlertmanagerConfig (its shape, by the field names of the operator's CRD).
Expectations come from the spec's YAML read here with PyYAML, from the fixtures, and from amtool
run on the unmerged base, not from the renderer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from _cli import Result, run_cli
from _support import FIXTURES, ROOT, SPEC, need

from fusebox.generator.render_rules import render_rules
from fusebox.spec import SpecError, parse_spec

AM_FIXTURES = FIXTURES / "alertmanager"
KPS = AM_FIXTURES / "kube-prometheus-stack.yml"
WITH_PAGER = AM_FIXTURES / "with-pager.yml"
RAW = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
NAME = RAW["metadata"]["name"]  # the marker's value
FUSE = RAW["fuse"]["receiver"]
HUMAN = RAW["fuse"]["human_receiver"]["name"]
# Alerts of the shipped spec whose tier names a fuse, and those that do not, from the YAML itself.
TIERS = [(s["alert"], tier, t.get("fuse")) for s in RAW["signals"].values() for tier, t in s["tiers"].items()]
FUSE_ALERTS = {(a, tier) for a, tier, f in TIERS if f}


def _amtool_route(amtool: str, cfg: Path, labels: dict[str, str]) -> list[str]:
    """Receivers amtool resolves for ``labels`` (in route order)."""
    r = subprocess.run([amtool, "config", "routes", "test", f"--config.file={cfg}",
                        *(f"{k}={v}" for k, v in labels.items())], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip().split(",")


def _merge(*args: str, cwd: Path = ROOT) -> Result:
    return run_cli("alertmanager", "merge", *args, cwd=cwd)


# ------------------------------------------------------------------------ labels on the alerts
def test_every_generated_alert_carries_the_marker_and_fuse_tiers_their_action(spec):
    alerts = [r for g in render_rules(spec).groups for r in g["rules"] if "alert" in r]
    names = {r["alert"] for r in alerts}
    assert {"FuseboxSignalAbsent", "FuseboxGPUDown"} <= names
    for r in alerts:
        assert r["labels"]["fusebox"] == NAME, r["alert"]
    asking = {(r["alert"], r["labels"]["severity"]) for r in alerts if "fuse_action" in r["labels"]}
    # the shipped spec's fuse tiers are its critical tiers that name a fuse (GPUPCIeLinkSaturated names none),
    # and the GPU-down warning, which holds the fuse of the GPU-level signals it silences (freeze_admissions)
    assert asking == {(a, "critical") for a, tier in FUSE_ALERTS} | {("FuseboxGPUDown", "warning")}
    assert {r["labels"]["fuse_action"] for r in alerts if r["alert"] == "FuseboxGPUDown"} == {"freeze_admissions"}
    assert ("GPUPCIeLinkSaturated", "critical") not in asking


def test_global_labels_may_not_set_the_marker():
    text = SPEC.read_text().replace("  labels: {}\n", "  labels: {fusebox: mine}\n", 1)
    with pytest.raises(SpecError) as e:
        parse_spec(text, "fusebox.yaml")
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if "labels: {fusebox: mine}" in ln)
    assert any(p.line == line and "global.labels" in p.fix for p in e.value.problems), str(e.value)


# ------------------------------------------------------------------------- standalone config
def test_standalone_routing_tests_hold_and_foreign_alerts_never_reach_the_fuse(generated):
    amtool = need("amtool")
    cfg = generated / "alertmanager/alertmanager.yml"
    r = subprocess.run([amtool, "check-config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = yaml.safe_load(cfg.read_text())
    assert doc["route"]["receiver"] == HUMAN  # what is not fusebox's ends at the people's receiver
    hook = next(rc for rc in doc["receivers"] if rc["name"] == FUSE)["webhook_configs"][0]
    assert hook["url"] == RAW["fuse"]["webhook_url"]
    assert hook["http_config"]["authorization"] == {"type": "Bearer", "credentials_file": RAW["fuse"]["credentials_file"]}
    inhibit = doc["inhibit_rules"][0]
    assert f'fusebox="{NAME}"' in inhibit["source_matchers"] and f'fusebox="{NAME}"' in inhibit["target_matchers"]
    assert "fusebox" in inhibit["equal"]

    tests = yaml.safe_load((generated / "alertmanager/route-tests.yml").read_text())["tests"]
    for t in tests:
        assert _amtool_route(amtool, cfg, t["labels"]) == t["receivers"], t["name"]
    by_labels = {tuple(sorted(t["labels"].items())): t["receivers"] for t in tests}
    # the file holds foreign alerts, and none of them reaches the fuse
    foreign = [t for t in tests if t["labels"].get("fusebox") != NAME]
    assert {"KubePodCrashLooping", "Watchdog"} <= {t["labels"]["alertname"] for t in foreign}
    assert any("fuse_action" in t["labels"] and "fusebox" not in t["labels"] for t in foreign)
    assert any(t["labels"].get("fusebox") not in (None, NAME) for t in foreign)
    assert all(FUSE not in t["receivers"] for t in foreign)
    assert by_labels[(("alertname", "KubePodCrashLooping"), ("namespace", "inference"), ("severity", "critical"))] == [HUMAN]
    # fusebox's own: fuse tiers reach the fuse and the people, the rest the people only
    ours = [t for t in tests if t["labels"].get("fusebox") == NAME]
    for alert, tier, fuse in TIERS:
        sev = RAW["signals"][next(k for k, s in RAW["signals"].items() if s["alert"] == alert)]["tiers"][tier].get("severity", tier)
        case = next(t for t in ours if t["labels"]["alertname"] == alert and t["labels"]["severity"] == sev)
        assert case["receivers"] == ([FUSE, HUMAN] if fuse else [HUMAN]), case["name"]
    assert next(t for t in ours if t["labels"]["alertname"] == "FuseboxSignalAbsent")["receivers"] == [HUMAN]
    assert next(t for t in ours if t["labels"]["alertname"] == "FuseboxGPUDown")["receivers"] == [FUSE, HUMAN]
    # the heartbeat reaches the fuse alone (a forged fuse_action changes nothing); fusebox's own
    # health alerts reach the people alone
    heartbeat = {"alertname": "FuseboxHeartbeat", "fusebox": NAME, "severity": "none"}
    assert _amtool_route(amtool, cfg, heartbeat) == [FUSE]
    assert _amtool_route(amtool, cfg, {**heartbeat, "fuse_action": "freeze_admissions", "hw_id": "GPU-0"}) == [FUSE]
    for alert in ("FuseboxFuseDown", "FuseboxFuseHeartbeatMissing", "FuseboxFuseNotificationsFailing",
                  "FuseboxCollectorGPUErrors"):
        assert _amtool_route(amtool, cfg, {"alertname": alert, "fusebox": NAME, "severity": "critical"}) == [HUMAN], alert
    assert {"FuseboxHeartbeat", "FuseboxFuseDown", "FuseboxFuseActionsStuck"} <= {t["labels"]["alertname"] for t in ours}
    hb_route = next(r for r in doc["route"]["routes"][0]["routes"] if r["matchers"] == ['alertname="FuseboxHeartbeat"'])
    assert hb_route["receiver"] == FUSE and "continue" not in hb_route
    assert hb_route["repeat_interval"] == hb_route["group_interval"] == "1m"
    # a critical that is not ours, given fusebox's exact labels but no marker, does not reach the fuse
    assert _amtool_route(amtool, cfg, {"alertname": "GPUMemoryUtilizationHigh", "severity": "critical",
                                       "fuse_action": "freeze_admissions"}) == [HUMAN]


# ------------------------------------------------------------------------------------ merging
def test_merged_into_kube_prometheus_stack_routes_ours_to_the_fuse_and_leaves_the_rest_to_the_base(tmp_path, generated):
    amtool = need("amtool")
    out = tmp_path / "merged.yml"
    # the shipped spec's people receiver is a bare name the chart's config lacks: allowed only explicitly
    r = _merge("--base", str(KPS), "--spec", str(SPEC), "--out", str(out), "--allow-silent-people")
    assert r.returncode == 0, r.stderr
    assert "notify nobody" in r.stderr
    c = subprocess.run([amtool, "check-config", str(out)], capture_output=True, text=True, timeout=60)
    assert c.returncode == 0, c.stdout + c.stderr
    merged, base = yaml.safe_load(out.read_text()), yaml.safe_load(KPS.read_text())
    # the base is kept: its root, its routes after ours, its receivers and inhibit rules before ours
    assert {k: v for k, v in merged["route"].items() if k != "routes"} == {k: v for k, v in base["route"].items() if k != "routes"}
    assert merged["route"]["routes"][1:] == base["route"]["routes"]
    assert merged["route"]["routes"][0]["matchers"] == [f'fusebox="{NAME}"']
    assert merged["receivers"][:len(base["receivers"])] == base["receivers"]
    assert merged["inhibit_rules"][:len(base["inhibit_rules"])] == base["inhibit_rules"]
    assert merged["templates"] == base["templates"] and merged["global"] == base["global"]

    tests = yaml.safe_load((generated / "alertmanager/route-tests.yml").read_text())["tests"]
    for t in tests:
        if t["labels"].get("fusebox") == NAME:  # ours: as in the standalone config
            assert _amtool_route(amtool, out, t["labels"]) == t["receivers"], t["name"]
        else:  # not ours: wherever the base sends it, never the fuse
            got = _amtool_route(amtool, out, t["labels"])
            assert got == _amtool_route(amtool, KPS, t["labels"]) and FUSE not in got, t["name"]
    assert _amtool_route(amtool, out, {"alertname": "KubePodCrashLooping", "severity": "critical", "namespace": "x"}) == ["null"]
    assert _amtool_route(amtool, out, {"alertname": "Watchdog", "severity": "none"}) == ["null"]


def test_merge_refuses_a_people_receiver_that_would_notify_nobody(tmp_path):
    out = tmp_path / "merged.yml"
    r = _merge("--base", str(KPS), "--spec", str(SPEC), "--out", str(out))
    assert r.returncode == 2 and not out.exists(), r.stderr
    line = _line_of(SPEC, "human_receiver:")  # the key's line and column in the spec
    col = SPEC.read_text().splitlines()[line - 1].index("human_receiver") + 1
    assert f"{SPEC}:{line}:{col}: fuse.human_receiver {HUMAN!r} is not a receiver of {KPS}" in r.stderr, r.stderr
    assert "set fuse.human_receiver.name to one of your receivers: 'null', or give it configs" in r.stderr


def test_merge_refuses_out_equal_to_the_base(tmp_path):
    base = tmp_path / "am.yml"
    base.write_text(WITH_PAGER.read_text())
    r = _merge("--base", str(base), "--spec", str(SPEC), "--out", str(tmp_path / "." / "am.yml"))
    assert r.returncode == 2 and "--out is the base config itself" in r.stderr, r.stderr
    assert base.read_text() == WITH_PAGER.read_text()


def test_merged_into_a_config_with_a_pager_uses_its_receiver_and_keeps_its_team_route(tmp_path):
    amtool = need("amtool")
    out = tmp_path / "merged.yml"
    r = _merge("--base", str(WITH_PAGER), "--spec", str(SPEC), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert f"receiver {HUMAN!r} (fuse.human_receiver) is the base's" in r.stderr
    merged = yaml.safe_load(out.read_text())
    assert [rc["name"] for rc in merged["receivers"]] == ["oncall", "team-pager", FUSE]  # the base's oncall, once
    assert merged["receivers"][0] == yaml.safe_load(WITH_PAGER.read_text())["receivers"][0]
    assert subprocess.run([amtool, "check-config", str(out)], capture_output=True, timeout=60).returncode == 0
    # the base's severity-only team route takes every other critical; ours go to the fuse and the pager
    assert _amtool_route(amtool, out, {"alertname": "KubePodCrashLooping", "severity": "critical"}) == ["team-pager"]
    assert _amtool_route(amtool, out, {"alertname": "KVCacheGrowthRateHigh", "severity": "critical", "fusebox": NAME,
                                       "fuse_action": "kv_cache_eviction"}) == [FUSE, "oncall"]
    assert _amtool_route(amtool, out, {"alertname": "KVCacheGrowthRateHigh", "severity": "warning", "fusebox": NAME}) == ["oncall"]


def test_merge_writes_to_stdout_without_out_and_keeps_the_base_permissions(tmp_path):
    base = tmp_path / "am.yml"
    base.write_text(WITH_PAGER.read_text())
    base.chmod(0o600)
    r = _merge("--base", str(base), "--spec", str(SPEC))
    assert r.returncode == 0 and yaml.safe_load(r.stdout)["route"]["routes"][0]["matchers"] == [f'fusebox="{NAME}"']
    out = tmp_path / "merged.yml"
    assert _merge("--base", str(base), "--spec", str(SPEC), "--out", str(out)).returncode == 0
    assert (out.stat().st_mode & 0o777) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["am.yml", "merged.yml"]  # no temporary file left


def _line_of(path: Path, needle: str, nth: int = 0) -> int:
    return [i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln][nth]


def _refused(tmp_path: Path, base: Path, expect: list[str]) -> str:
    """Merge ``base`` onto an existing --out: exit 2, ``file:line:col`` messages, nothing written."""
    out = tmp_path / "merged.yml"
    out.write_text("previous\n")
    before = sorted(os.listdir(tmp_path))
    r = _merge("--base", str(base), "--spec", str(SPEC), "--out", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and out.read_text() == "previous\n" and sorted(os.listdir(tmp_path)) == before
    for e in expect:
        assert e in r.stderr, r.stderr
    return r.stderr


def test_merge_refuses_a_receiver_named_like_the_fuse_receiver(tmp_path):
    base = tmp_path / "base.yml"
    base.write_text(WITH_PAGER.read_text() + f"  - name: {FUSE}\n")
    line = _line_of(base, f"name: {FUSE}")
    _refused(tmp_path, base, [f"{base}:{line}:11: the base already has a receiver named {FUSE!r}", " -- rename one"])


def test_merge_refuses_a_people_receiver_with_configs_the_base_also_defines(tmp_path):
    spec = tmp_path / "fusebox.yaml"
    spec.write_text(SPEC.read_text().replace("  human_receiver:\n    name: oncall\n",
                                             "  human_receiver:\n    name: oncall\n    webhook_configs: [{url: 'http://127.0.0.1:9/x'}]\n", 1))
    out = tmp_path / "m.yml"
    r = _merge("--base", str(WITH_PAGER), "--spec", str(spec), "--out", str(out))
    assert r.returncode == 2 and not out.exists()
    assert f"{WITH_PAGER}:{_line_of(WITH_PAGER, 'name: oncall')}:11: the base already has a receiver named 'oncall'" in r.stderr


def test_merge_refuses_a_config_that_already_has_the_fusebox_route(tmp_path):
    once = tmp_path / "once.yml"
    assert _merge("--base", str(KPS), "--spec", str(SPEC), "--out", str(once), "--allow-silent-people").returncode == 0
    lines = once.read_text().splitlines()
    # the route item starts on its `- matchers:` line, the one before the marker matcher
    line = next(i for i, ln in enumerate(lines, 1) if ln.strip() == "- matchers:" and NAME in lines[i])
    _refused(tmp_path, once, [f"{once}:{line}:", "already routes on the 'fusebox' label",
                              f"the base already has a receiver named {FUSE!r}"])


@pytest.mark.parametrize("text, where, what", [
    ("route: [oops\n", "2:1", "YAML syntax error"),
    ("- just\n- a list\n", "1:1", "not an Alertmanager config"),
    ("alertmanager:\n  config:\n    route: {receiver: x}\n", "1:1", "looks like Helm values"),
    ("global: {}\nreceivers: [{name: x}]\n", "1:1", "no `route:` mapping with a `receiver`"),
    ("route:\n  receiver: x\nreceivers: {name: x}\n", "3:1", "`receivers:` is not a list"),
    ("", "1:1", "the base is empty"),
], ids=["not-yaml", "a-list", "helm-values", "no-route", "receivers-not-a-list", "empty"])
def test_merge_refuses_a_base_that_is_not_an_alertmanager_config(tmp_path, text, where, what):
    base = tmp_path / "base.yml"
    base.write_text(text)
    _refused(tmp_path, base, [f"{base}:{where}: ", what, " -- "])


def test_merge_of_a_missing_base_or_into_a_missing_folder_writes_nothing(tmp_path):
    r = _merge("--base", str(tmp_path / "nope.yml"), "--spec", str(SPEC), "--out", str(tmp_path / "m.yml"))
    assert r.returncode == 2 and f"fusebox alertmanager merge: {tmp_path / 'nope.yml'}: no such file -- pass --base" in r.stderr
    r = _merge("--base", str(WITH_PAGER), "--spec", str(SPEC), "--out", str(tmp_path / "no" / "m.yml"))
    assert r.returncode == 2 and ":1:1: cannot write the file" in r.stderr
    assert sorted(os.listdir(tmp_path)) == []


# ------------------------------------------------------------------ Prometheus Operator CRD
# Field names of monitoring.coreos.com/v1alpha1 AlertmanagerConfig, from the operator's CRD
# (prometheus-operator v0.85.0, example/prometheus-operator-crd/monitoring.coreos.com_alertmanagerconfigs.yaml: the
# version tests/k8s/test_k8s_manifests.py validates every manifest against, whole schema).
CRD_FIELDS = {
    "spec": {"inhibitRules", "muteTimeIntervals", "receivers", "route"},
    "route": {"activeTimeIntervals", "continue", "groupBy", "groupInterval", "groupWait", "matchers",
              "muteTimeIntervals", "receiver", "repeatInterval", "routes"},
    "matcher": {"matchType", "name", "regex", "value"},
    "receiver": {"discordConfigs", "emailConfigs", "msteamsConfigs", "msteamsv2Configs", "name", "opsgenieConfigs",
                 "pagerdutyConfigs", "pushoverConfigs", "rocketchatConfigs", "slackConfigs", "snsConfigs",
                 "telegramConfigs", "victoropsConfigs", "webexConfigs", "webhookConfigs", "wechatConfigs"},
    "webhook": {"httpConfig", "maxAlerts", "sendResolved", "timeout", "url", "urlSecret"},
    "authorization": {"credentials", "type"},
    "secretKeySelector": {"key", "name", "optional"},
    "inhibitRule": {"equal", "sourceMatch", "targetMatch"},
}
MATCH_TYPES = {"=", "!=", "=~", "!~"}
DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"


def _check_matchers(ms):
    for m in ms:
        assert set(m) <= CRD_FIELDS["matcher"] and m["name"] and m["matchType"] in MATCH_TYPES, m


def test_alertmanagerconfig_in_k8s_has_the_crd_shape_and_takes_its_token_from_a_secret():
    import re

    docs = [d for p in sorted((ROOT / "k8s").glob("*.yml")) for d in yaml.safe_load_all(p.read_text()) if d]
    cr = next(d for d in docs if d.get("kind") == "AlertmanagerConfig")
    assert cr["apiVersion"] == "monitoring.coreos.com/v1alpha1"
    ns = RAW.get("kubernetes", {}).get("namespace", "monitoring")
    assert cr["metadata"]["namespace"] == ns
    spec = cr["spec"]
    assert set(spec) <= CRD_FIELDS["spec"]
    route = spec["route"]
    assert set(route) <= CRD_FIELDS["route"]
    _check_matchers(route["matchers"])
    for key in ("groupWait", "groupInterval", "repeatInterval"):
        assert re.match(DURATION, route[key]), (key, route[key])
    assert route["matchers"] == [{"name": "fusebox", "value": NAME, "matchType": "="}]
    assert route["groupWait"] == RAW["fuse"].get("group_wait", "30s")
    assert not any(m["name"] == "namespace" for m in route["matchers"])  # the operator's to add (docs/alertmanager.md)
    names = {rc["name"] for rc in spec["receivers"]}
    assert route["receiver"] == HUMAN and HUMAN in names  # the operator refuses a route whose receiver is not listed
    # the shipped spec's people's receiver is a bare name: here a receiver without configs
    assert next(rc for rc in spec["receivers"] if rc["name"] == HUMAN) == {"name": HUMAN}
    # children: the heartbeat to the fuse only, the alerts that request a fuse to the fuse (and on),
    # then everything to the people: the standalone config's tree
    heartbeat, asks, people = route["routes"]
    for child in route["routes"]:
        assert set(child) <= CRD_FIELDS["route"]
        _check_matchers(child.get("matchers", []))
    assert heartbeat["receiver"] == asks["receiver"] == FUSE and people == {"receiver": HUMAN}
    assert heartbeat["matchers"] == [{"name": "alertname", "value": "FuseboxHeartbeat", "matchType": "="}]
    assert heartbeat["repeatInterval"] == heartbeat["groupInterval"] == "1m"  # fuse.self_monitoring.heartbeat_interval's default
    assert "continue" not in heartbeat and asks["continue"] is True
    assert asks["groupWait"] == RAW["fuse"]["group_wait_critical"]
    assert asks["matchers"] == [{"name": "fuse_action", "value": ".+", "matchType": "=~"}]
    for rc in spec["receivers"]:
        assert set(rc) <= CRD_FIELDS["receiver"]
        for hook in rc.get("webhookConfigs", []) if rc["name"] == FUSE else []:
            assert set(hook) <= CRD_FIELDS["webhook"]
            assert hook["url"] == f"http://fusebox-fuse.{ns}.svc:9095/alertmanager"
            auth = hook["httpConfig"]["authorization"]
            assert set(auth) <= CRD_FIELDS["authorization"]
            assert auth["credentials"] == {"name": "fusebox-fuse-token", "key": "token"}  # a Secret reference only
    for rule in spec.get("inhibitRules", []):
        assert set(rule) <= CRD_FIELDS["inhibitRule"]
        _check_matchers(rule["sourceMatch"] + rule["targetMatch"])
        assert {"name": "fusebox", "value": NAME, "matchType": "="} in rule["sourceMatch"]
        assert {"name": "fusebox", "value": NAME, "matchType": "="} in rule["targetMatch"]


def test_alertmanagerconfig_takes_namespace_and_labels_from_the_kubernetes_block():
    from fusebox.generator.render_alertmanager import render_alertmanagerconfig

    text = SPEC.read_text()
    block = "kubernetes:\n  namespace: monitoring\n  labels: {}\n"
    assert block in text
    spec = parse_spec(text.replace(block, "kubernetes:\n  namespace: ml-serving\n  labels: {release: kube-prometheus-stack}\n"),
                      "fusebox.yaml")
    cr = render_alertmanagerconfig(spec)
    assert cr["metadata"]["namespace"] == "ml-serving"
    assert cr["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert cr["spec"]["receivers"][0]["webhookConfigs"][0]["url"] == "http://fusebox-fuse.ml-serving.svc:9095/alertmanager"


def _am_test(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fusebox.cli", "alertmanager", "test", "--config", str(config),
                           "--spec", str(SPEC)], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_alertmanager_test_passes_a_merged_config_and_fails_one_that_routes_on_severity(tmp_path):
    need("amtool")
    merged = tmp_path / "merged.yml"
    assert _merge("--base", str(WITH_PAGER), "--spec", str(SPEC), "--out", str(merged)).returncode == 0
    r = _am_test(merged)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout and "KubePodCrashLooping" in r.stdout and "Watchdog" in r.stdout
    # merged into the chart's config with a people's receiver that has no configs: fails on that alone
    silent = tmp_path / "silent.yml"
    assert _merge("--base", str(KPS), "--spec", str(SPEC), "--out", str(silent), "--allow-silent-people").returncode == 0
    r = _am_test(silent)
    assert r.returncode == 1
    failed = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
    assert failed == [f"FAIL people's receiver {HUMAN!r} has configs (fuse.human_receiver)"], r.stdout
    # The old way: a route on severity alone, before ours, sends every critical to the fuse.
    doc = yaml.safe_load(merged.read_text())
    doc["route"]["routes"].insert(0, {"matchers": ['severity="critical"'], "receiver": FUSE, "continue": True})
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = _am_test(bad)
    assert r.returncode == 1
    failed = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
    assert any("alertname=KubePodCrashLooping" in ln for ln in failed), r.stdout
    assert not any("alertname=Watchdog" in ln for ln in failed)  # severity=none: not caught by that route


def test_alertmanager_test_stops_at_a_config_that_does_not_load(tmp_path):
    # no route: amtool check-config refuses it, and every route test would fail the same way --
    # one failure that says so, not one per alert
    need("amtool")
    noroute = tmp_path / "noroute.yml"
    noroute.write_text("receivers:\n- name: people\n")
    r = _am_test(noroute)
    assert r.returncode == 1
    failed = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
    assert len(failed) == 1 and "check-config" in failed[0], r.stdout
    assert r.stdout.count("no routes provided") == 1 and "route tests not run" in r.stdout, r.stdout
    assert r.stdout.splitlines()[-1] == "0 passed, 1 failed"


# ------------------------------------------------- the people on the Prometheus Operator path
OPERATOR_RENDERED = AM_FIXTURES / "operator-rendered.yml"  # captured from the real operator by tests/e2e/test_k8s_cluster.py
OP_PREFIX = "monitoring/fusebox-multimodal-inference/"  # <namespace>/<AlertmanagerConfig>/ as the operator names receivers
PEOPLE_SECRET = "fusebox-human-receiver"
EVERY_KIND = {  # fuse.human_receiver in Alertmanager's own format, one config of each kind fusebox converts
    "name": "oncall",
    "pagerduty_configs": [{"routing_key": "PD-ROUTING-KEY-inline", "severity": "critical", "details": {"team": "ml"}}],
    "slack_configs": [{"api_url_file": "/etc/am/slack", "channel": "#ml-oncall", "send_resolved": True}],
    "webhook_configs": [{"url": "http://pager.internal/hook", "http_config": {"authorization": {"credentials": "HOOK-TOKEN"}}},
                        {"url_file": "/etc/am/hook-url"}],
    "email_configs": [{"to": "ml@example.com", "from": "am@example.com", "smarthost": "smtp.example.com:587",
                       "auth_username": "am", "auth_password": "SMTP-PASSWORD", "headers": {"X-Team": "ml"}}],
    "opsgenie_configs": [{"api_key_file": "/etc/am/og", "priority": "P1"}],
    "msteams_configs": [{"webhook_url": "https://teams.example/hook"}],
}


def _with_people(human: dict) -> str:
    data = yaml.safe_load(SPEC.read_text())
    data["fuse"]["human_receiver"] = human
    return yaml.safe_dump(data, sort_keys=False)


def test_the_people_in_the_alertmanagerconfig_take_every_secret_from_the_secret():
    from fusebox.generator.render_alertmanager import operator_warnings, render_alertmanagerconfig
    from fusebox.generator.yamlout import dump_yaml

    spec = parse_spec(_with_people(EVERY_KIND), "fusebox.yaml")
    cr = render_alertmanagerconfig(spec)
    (people,) = [rc for rc in cr["spec"]["receivers"] if rc["name"] == "oncall"]

    def ref(key):
        return {"name": PEOPLE_SECRET, "key": key}

    # the CRD's names (monitoring.coreos.com_alertmanagerconfigs.yaml, v1alpha1 receivers[]), worked out by hand
    assert people == {
        "name": "oncall",
        "pagerdutyConfigs": [{"routingKey": ref("pagerduty-0-routing-key"), "severity": "critical",
                              "details": [{"key": "team", "value": "ml"}]}],
        "slackConfigs": [{"apiURL": ref("slack-0-api-url"), "channel": "#ml-oncall", "sendResolved": True}],
        "webhookConfigs": [{"url": "http://pager.internal/hook",
                            "httpConfig": {"authorization": {"type": "Bearer", "credentials": ref("webhook-0-credentials")}}},
                           {"urlSecret": ref("webhook-1-url")}],
        "emailConfigs": [{"to": "ml@example.com", "from": "am@example.com", "smarthost": "smtp.example.com:587",
                          "authUsername": "am", "authPassword": ref("email-0-auth-password"),
                          "headers": [{"key": "X-Team", "value": "ml"}]}],
        "opsgenieConfigs": [{"apiKey": ref("opsgenie-0-api-key"), "priority": "P1"}],
        "msteamsConfigs": [{"webhookUrl": ref("msteams-0-webhook-url")}],
    }
    text = dump_yaml(cr)
    for secret in ("PD-ROUTING-KEY-inline", "HOOK-TOKEN", "SMTP-PASSWORD", "teams.example", "/etc/am/"):
        assert secret not in text  # never inline in k8s/: the Secret holds it
    assert operator_warnings(spec) == []
    # the route: the people at the top and after the fuse, as in the standalone config
    route = cr["spec"]["route"]
    assert route["receiver"] == "oncall" and route["routes"][-1] == {"receiver": "oncall"}


def _generate(spec_file: Path, out: Path, capsys) -> str:
    """``fusebox generate`` in this process (no program started): its standard error."""
    from fusebox.cli import main

    capsys.readouterr()
    assert main(["generate", "--spec", str(spec_file), "--out", str(out)]) == 0
    return capsys.readouterr().err


def test_what_the_alertmanagerconfig_cannot_hold_is_a_warning_at_its_spec_line(tmp_path, capsys):
    human = {"name": "oncall", "telegram_configs": [{"bot_token": "x", "chat_id": 1}],
             "webhook_configs": [{"url": "http://a/ok"}, {"url": "http://b/proxied", "http_config": {"proxy_url": "http://p:3128"}}]}
    spec_file = tmp_path / "fusebox.yaml"
    spec_file.write_text(_with_people(human))
    lines = spec_file.read_text().splitlines()

    def place(text: str, key: str) -> str:
        n = next(i for i, ln in enumerate(lines) if text in ln)
        return f"{spec_file}:{n + 1}:{lines[n].index(key) + 1}: warning: "

    err = _generate(spec_file, tmp_path / "out", capsys)
    warned = [ln for ln in err.splitlines() if ": warning: fuse.human_receiver" in ln]
    assert len(warned) == 2, err
    assert warned[0].startswith(place("telegram_configs:", "telegram_configs") + "fuse.human_receiver.telegram_configs "
                                "cannot be expressed in k8s/alertmanagerconfig.yml"), warned
    assert warned[1].startswith(place("proxy_url:", "proxy_url") + "fuse.human_receiver.webhook_configs[1]: "
                                "http_config.proxy_url cannot be expressed"), warned
    cr = yaml.safe_load((tmp_path / "out" / "k8s" / "alertmanagerconfig.yml").read_text().split("\n", 1)[1])
    (people,) = [rc for rc in cr["spec"]["receivers"] if rc["name"] == "oncall"]
    assert people == {"name": "oncall", "webhookConfigs": [{"url": "http://a/ok"}]}  # the rest left out, as said
    # the standalone config keeps them all (Alertmanager's own format)
    am = yaml.safe_load((tmp_path / "out" / "alertmanager" / "alertmanager.yml").read_text())
    assert next(rc for rc in am["receivers"] if rc["name"] == "oncall") == human


def test_a_people_receiver_without_configs_is_said_once_on_the_operator_path(tmp_path, capsys):
    err = _generate(SPEC, tmp_path, capsys)
    line = next(i + 1 for i, ln in enumerate(SPEC.read_text().splitlines()) if ln.strip() == "human_receiver:")
    said = [ln for ln in err.splitlines() if "nobody" in ln and "human_receiver" in ln]
    assert len(said) == 1, err
    assert said[0].startswith(f"{SPEC}:{line}:3: warning: fuse.human_receiver {HUMAN!r} has no configs"), said
    assert "on the Prometheus Operator path fusebox's criticals reach the fuse and nobody else" in said[0]
    assert "fusebox-human-receiver" not in err.replace("Secret 'fusebox-human-receiver', docs", "")  # no Secret to read
    # with configs: no warning, and the Secret's keys are named (the operator refuses the object without them)
    spec_file = tmp_path / "people.yaml"
    spec_file.write_text(_with_people(EVERY_KIND))
    err = _generate(spec_file, tmp_path / "out", capsys)
    assert ": warning: fuse.human_receiver" not in err, err
    assert ("note: k8s/alertmanagerconfig.yml reads fuse.human_receiver's secrets from the Secret 'fusebox-human-receiver' "
            "(keys pagerduty-0-routing-key, slack-0-api-url, webhook-0-credentials, webhook-1-url, email-0-auth-password, "
            "opsgenie-0-api-key, msteams-0-webhook-url) in namespace 'monitoring'") in err, err


def _op_test(config: Path, spec: Path = SPEC) -> tuple[int, list[str], str]:
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "alertmanager", "test", "--config", str(config),
                        "--spec", str(spec)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    return r.returncode, [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")], r.stdout + r.stderr


def test_alertmanager_test_passes_the_config_the_operator_rendered():
    need("amtool")
    doc = yaml.safe_load(OPERATOR_RENDERED.read_text())
    assert any(rc["name"] == OP_PREFIX + FUSE for rc in doc["receivers"])  # the fixture is what it claims
    rc, failed, out = _op_test(OPERATOR_RENDERED)
    assert rc == 0 and not failed, out
    n_fuse = sum(1 for _a, _t, f in TIERS if f)
    assert out.count("trips the fuse and tells the people (operator-rendered") >= n_fuse, out
    assert "FuseboxFuseDown tells the people only, never the fuse (operator-rendered" in out


def test_alertmanager_test_fails_an_operator_config_where_criticals_reach_no_human(tmp_path):
    need("amtool")
    doc = yaml.safe_load(OPERATOR_RENDERED.read_text())
    people = OP_PREFIX + HUMAN
    # the people's receiver without configs (the starter spec's bare name): every alert but the heartbeat fails
    silent = copy_doc(doc)
    for rc in silent["receivers"]:
        if rc["name"] == people:
            for k in [k for k in rc if k.endswith("_configs")]:
                del rc[k]
    (tmp_path / "silent.yml").write_text(yaml.safe_dump(silent, sort_keys=False))
    rc, failed, out = _op_test(tmp_path / "silent.yml")
    assert rc == 1, out
    assert any(ln.startswith("FAIL GPUMemoryUtilizationHigh critical trips the fuse") for ln in failed), out
    assert any(ln.startswith("FAIL FuseboxFuseDown tells the people only") for ln in failed), out
    assert not any("FuseboxHeartbeat" in ln for ln in failed), out
    assert "reaches no human receiver" in out and "alertname=FuseboxFuseDown" in out
    assert f"fusebox's route: route.routes[] receiver={people}" in out  # the route it went through
    # the shape before: fusebox's route to a receiver of nobody with only the fuse under it
    old = copy_doc(doc)
    (top,) = [r for r in old["route"]["routes"] if r["receiver"] == people]
    top["receiver"] = OP_PREFIX + FUSE + "-none"
    top["routes"] = [r for r in top["routes"] if r["receiver"] != people]
    old["receivers"].append({"name": OP_PREFIX + FUSE + "-none"})
    (tmp_path / "old.yml").write_text(yaml.safe_dump(old, sort_keys=False))
    rc, failed, out = _op_test(tmp_path / "old.yml")
    assert rc == 1, out
    assert any(ln.startswith("FAIL KVCacheGrowthRateHigh critical trips the fuse") for ln in failed), out
    assert any(ln.startswith("FAIL FuseboxFuseLevelUnapplied tells the people only") for ln in failed), out
    # and a fuse-requesting critical that no longer reaches the fuse
    nofuse = copy_doc(doc)
    (top,) = [r for r in nofuse["route"]["routes"] if r["receiver"] == people]
    top["routes"] = [r for r in top["routes"] if r["receiver"] != OP_PREFIX + FUSE]
    (tmp_path / "nofuse.yml").write_text(yaml.safe_dump(nofuse, sort_keys=False))
    rc, failed, out = _op_test(tmp_path / "nofuse.yml")
    assert rc == 1 and any("does not reach the fuse receiver" in ln or "trips the fuse" in ln for ln in failed), out
    assert f"it does not reach the fuse receiver {OP_PREFIX + FUSE!r}" in out


def copy_doc(doc: dict) -> dict:
    import copy

    return copy.deepcopy(doc)


# ------------------------------------------------------------------------ an SLO's burn-rate page
def test_an_slo_page_that_requests_a_fuse_reaches_the_fuse_and_the_fuse_trips_it(tmp_path):
    """`slos.<name>.page.fuse` takes the threshold tiers' path: the generated page alert carries
    the marker and `fuse_action`, so amtool routes it to the fuse receiver and the people, the
    ticket to the people alone; and the fuse service, given the alert as the rule labels it, trips
    the action at its level (text_only_fallback, 2, fusebox.yaml) on the alert's scope. Before the
    fuse trusted the SLOs' pairs it refused the alert as one the spec does not generate."""
    from fusebox.fuse.adapters.gateway import DryRun
    from fusebox.fuse.intake.payload import parse_payload
    from fusebox.fuse.rules import FuseRules, Target
    from fusebox.fuse.service import FuseService
    from fusebox.fuse.store import Store
    from fusebox.generator.outputs import render_all

    amtool = need("amtool")
    text = SPEC.read_text()
    old = "    objective: 99%\n    window: 30d\n  time_to_first_token:"
    assert old in text
    spec = parse_spec(text.replace(old, "    objective: 99%\n    window: 30d\n    page: {fuse: text_only_fallback}\n"
                                         "  time_to_first_token:"), "fusebox.yaml")
    assert RAW["fuse"]["actions"]["text_only_fallback"]["level"] == 2
    out = render_all(spec)
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(out["alertmanager/alertmanager.yml"])
    group = next(g for g in yaml.safe_load(out["rules/fusebox.rules.yml"])["groups"] if g["name"] == "fusebox-slo-alignment_latency")
    page, ticket = [r for r in group["rules"] if "alert" in r]
    scope = {"cluster": "lab-a", "host_name": "gpu-node-1", "engine": "vllm-0", "model": "llava"}  # the SLO's by labels
    fired = {"alertname": "AlignmentLatencyErrorBudgetBurn", **scope, **page["labels"]}
    assert (fired["fuse_action"], fired["fuse_level"], fired["severity"]) == ("text_only_fallback", "2", "critical")
    assert _amtool_route(amtool, cfg, fired) == [FUSE, HUMAN]
    assert _amtool_route(amtool, cfg, {"alertname": "AlignmentLatencyErrorBudgetBurn", **scope, **ticket["labels"]}) == [HUMAN]
    # the generated route tests say the same (fusebox check runs them with amtool)
    cases = {t["name"]: t["receivers"] for t in yaml.safe_load(out["alertmanager/route-tests.yml"])["tests"]}
    assert cases["AlignmentLatencyErrorBudgetBurn page trips the fuse (text_only_fallback) and tells the people"] == [FUSE, HUMAN]
    assert FuseRules.from_spec(spec).verdict(fired) == Target("text_only_fallback", 2)
    svc = FuseService(FuseRules.from_spec(spec), Store(tmp_path / "fuse.sqlite"), [DryRun()], hold_s=60, dry_run=True)
    try:
        note = {"version": "4", "status": "firing", "receiver": FUSE, "groupKey": "{}", "truncatedAlerts": 0, "groupLabels": {},
                "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://alertmanager:9093",
                "alerts": [{"status": "firing", "labels": fired, "annotations": {}, "startsAt": "2026-12-05T12:00:00Z",
                            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": "0"}]}
        svc.handle(parse_payload(note, time.time()))
        assert svc.state()["levels"] == {'{cluster="lab-a",host_name="gpu-node-1",engine="vllm-0"}': 2}
    finally:
        svc.store.close()
