"""A GPU the collector lost holds the fuse it had: FuseboxGPUDown requests the fuse of the GPU-level
signals it silences, so the memory alert resolving (its series stop with the GPU) releases nothing
while the GPU is down. Driven with the labels of the generated alerting rules, over real HTTP, and
counted at the reference gateway."""

from __future__ import annotations

import time

import pytest
from _fuse_support import SPEC, LiveService, alert, iso, payload, wait_for
from _support import yaml_data

from fusebox import conventions as C
from fusebox.demo.gateway import ReferenceGateway, read_log
from fusebox.fuse import fingerprint
from fusebox.fuse.rules import FuseRules, Refusal, Target
from fusebox.spec import load_spec

# The scope of one GPU as the generated rules label both alerts: the records and the GPU-down
# expression drop every target label of the scraper (conventions.TARGET_LABELS: instance, job, namespace, ...).
GPU = {"cluster": "prod-a", "host_name": "gpu-node-1", "hw_id": "GPU-5ca1ab1e-0000-4000-8000-000000000001"}
T0 = time.time() - 600


def _raw_spec() -> dict:
    return yaml_data(SPEC.read_text())


def _gpu_level_fuses() -> set[str]:
    """Worked out from fusebox.yaml itself: the fuse of every tier of a GPU-level signal (level
    defaults to gpu in the spec's schema)."""
    return {t["fuse"] for s in _raw_spec()["signals"].values() if s.get("level", "gpu") == "gpu"
            for t in s["tiers"].values() if t.get("fuse") and t.get("enabled", True) is not False}


def _gpu_down_rules(generated) -> list[dict]:
    doc = yaml_data((generated / "rules" / "fusebox.rules.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == C.GPU_DOWN_ALERT]


def test_the_gpu_down_alert_requests_the_fuse_of_the_gpu_level_signals(generated):
    assert _gpu_level_fuses() == {"freeze_admissions"}  # GPU memory and memory bandwidth, level 1
    rules = _gpu_down_rules(generated)
    levels = {name: a["level"] for name, a in _raw_spec()["fuse"]["actions"].items()}
    assert {(r["labels"]["fuse_action"], r["labels"]["fuse_level"]) for r in rules} == {
        (a, str(levels[a])) for a in _gpu_level_fuses()}
    assert all(r["expr"] == "max without (instance, job, namespace, pod, container, endpoint, service) (fusebox_gpu_up) == 0"
               for r in rules)


def test_the_fuse_trusts_the_gpu_down_alert_with_those_actions_only():
    rules = FuseRules.from_spec(load_spec(SPEC))
    labels = {"alertname": C.GPU_DOWN_ALERT, "severity": "warning", **GPU}
    assert rules.verdict({**labels, "fuse_action": "freeze_admissions", "fuse_level": "1"}) == Target(
        "freeze_admissions", 1)
    other = rules.verdict({**labels, "fuse_action": "kv_cache_eviction", "fuse_level": "3"})
    assert isinstance(other, Refusal) and other.result == "untrusted"


def _gpu_down(generated, status: str, starts: float) -> dict:
    """A FuseboxGPUDown alert as Alertmanager sends it: the rule's labels on the lost GPU's series."""
    (rule,) = _gpu_down_rules(generated)
    labels = {"alertname": C.GPU_DOWN_ALERT, **rule["labels"], **GPU, "hw_gpu_index": "0",
              "hw_name": "NVIDIA H100 80GB HBM3"}
    return {"status": status, "labels": labels, "annotations": {}, "startsAt": iso(starts),
            "endsAt": iso(starts + 600) if status == "resolved" else "0001-01-01T00:00:00Z",
            "fingerprint": fingerprint(labels)}


@pytest.mark.parametrize("hold_s", [0.5])
def test_a_lost_gpu_holds_its_fuse_and_releases_it_only_once_the_gpu_is_back(tmp_path, generated, hold_s):
    gw = ReferenceGateway("127.0.0.1", 0, tmp_path / "gw.jsonl").start()
    log = tmp_path / "gw.jsonl"
    try:
        with LiveService(tmp_path / "s.sqlite", gw.url, hold_s=hold_s) as svc:
            memory = alert("GPUMemoryUtilizationHigh", starts=T0, **GPU)
            assert svc.post(payload(memory)).status_code == 200
            wait_for(lambda: read_log(log), what="the trip")
            # the GPU falls off the bus: FuseboxGPUDown fires, then the memory alert resolves
            # (its series stopped with the GPU)
            assert svc.post(payload(_gpu_down(generated, "firing", T0 + 60))).status_code == 200
            resolved = alert("GPUMemoryUtilizationHigh", "resolved", starts=T0, **GPU)
            assert svc.post(payload(resolved)).status_code == 200
            time.sleep(hold_s * 4)  # well past the hold time: a release would have been sent by now
            assert [(r["state"], r["level"]) for r in read_log(log)] == [("trip", 1)]
            key = '{cluster="prod-a",host_name="gpu-node-1",hw_id="GPU-5ca1ab1e-0000-4000-8000-000000000001"}'
            assert svc.state()["levels"] == {key: 1}
            # the GPU is back: the GPU-down alert resolves, the level is released after the hold
            assert svc.post(payload(_gpu_down(generated, "resolved", T0 + 60))).status_code == 200
            wait_for(lambda: len(read_log(log)) == 2, what="the release")
            time.sleep(hold_s)
    finally:
        gw.stop()
    assert [(r["state"], r["level"], r["action"]) for r in read_log(log)] == [
        ("trip", 1, "freeze_admissions"), ("release", 1, "freeze_admissions")]
