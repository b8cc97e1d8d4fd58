"""The whole demo on VictoriaMetrics v1.151.0 instead of Prometheus: the built Collector's output
scraped by VictoriaMetrics single node, vmalert evaluating the generated rules file, the real
Alertmanager, the fuse service, the reference gateway and the real SGLang Model Gateway.

Two stacks, each the breach scenario once (what must happen, and why: tests/_demo_support.py):

* ``single``: one VictoriaMetrics node and its vmalert (``fusebox demo --engine victoriametrics``);
* ``ha``: VictoriaMetrics' documented HA topology, two independent nodes each scraping the same
  targets, one vmalert per node, both notifying the one Alertmanager
  (docs/rule-engines.md#running-on-victoriametrics). Replica 1, the one the demo reads first, loses its node and
  its vmalert as soon as the first fuse trips, so the remaining trips and every release come
  through replica 2 alone; each level must still trip once and release once.

The VictoriaMetrics cluster (vminsert, vmstorage, vmselect) is not run: the Go module proxy
does not serve its tags (docs/rule-engines.md, "Running on VictoriaMetrics" says how to check).
Each run takes about 4.5 minutes (the breach scenario at x1.25 is 4 of them); the two run side
by side, so the module takes about as long.
"""

from __future__ import annotations

import concurrent.futures
import time

import pytest
from _demo_support import (
    EXPECTED,
    assert_every_process_gone,
    assert_gateway_log_holds_each_level_tripped_once_then_released_once,
    assert_sglang_worker_list_lost_each_fused_worker_and_got_it_back,
    assert_trips_follow_their_critical_and_releases_follow_recovery,
    assert_warning_fired_before_critical,
    demo_pids,
    gateway_calls,
    run_demo,
)

pytestmark = [pytest.mark.tools, pytest.mark.otelcol]


class KillReplicaOne:
    """run()'s on_poll hook: once the gateway has received its first trip and both vmalerts hold
    the critical alert behind it firing (each evaluates its own node's data, so one may be an
    evaluation behind), stop replica 1 (its vmalert and its VictoriaMetrics node) for good."""

    def __init__(self):
        self.at = None
        self.firing: dict[int, set] = {}
        self.calls_before: list[dict] = []

    def __call__(self, stack, watcher):
        trips = [c for c in watcher.gateway_calls if c["state"] == "trip"]
        if self.at is not None or not trips:
            return
        from fusebox.demo.stack import http_json

        eng = stack.rule_engine
        for i in range(eng.replicas):
            try:
                alerts = http_json(f"{eng.vmalert_url(i)}/api/v1/alerts")["data"]["alerts"]
            except OSError:
                return  # busy: ask again at the next poll
            self.firing[i] = {(a["labels"]["alertname"], a["labels"].get("severity")) for a in alerts
                              if a["state"] == "firing"}
        want = (EXPECTED[trips[0]["level"]][3], "critical")
        if all(want in self.firing[i] for i in range(eng.replicas)):
            self.calls_before = list(watcher.gateway_calls)
            stack.stop_replica(0)
            self.at = time.time()


def _single(tmp_path_factory):
    res = run_demo(tmp_path_factory, "vm", engine="victoriametrics")
    res.topology = "single"
    return res


def _ha(tmp_path_factory):
    kill = KillReplicaOne()
    res = run_demo(tmp_path_factory, "vm-ha", engine="victoriametrics", replicas=2, on_poll=kill)
    res.topology, res.kill = "ha", kill
    return res


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both topologies' runs, side by side: each stack has its own ports, work folder and
    processes, and most of a run is the scenario's clock, so together they take about as long as
    one (CI time); a failure in either is re-raised here.

    The session's base folder is made here, before the threads: pytest's getbasetemp() is not
    thread-safe, and two threads making it at once fail with FileExistsError (CI, stop 44)."""
    tmp_path_factory.getbasetemp()
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(fn, tmp_path_factory) for name, fn in (("single", _single), ("ha", _ha))}
        return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="module")
def single(runs):
    return runs["single"]


@pytest.fixture(scope="module")
def ha(runs):
    return runs["ha"]


@pytest.fixture(scope="module", params=["single", "ha"])
def run(request):
    """Each topology's run, for the checks both must pass."""
    return request.getfixturevalue(request.param)


def test_the_run_finishes_without_a_process_dying(run):
    assert run.error is None, run.error


def test_the_demos_own_verdict_agrees(run):
    assert run.ok and run.problems == [], run.problems


def test_the_sglang_gateways_own_worker_list_loses_each_fused_worker_and_gets_it_back(run):
    assert_sglang_worker_list_lost_each_fused_worker_and_got_it_back(run)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_each_signal_warns_before_its_critical_fires(run, level):
    assert_warning_fired_before_critical(run, level)


def test_the_gateway_log_holds_each_level_tripped_once_then_released_once_and_nothing_else(run):
    assert_gateway_log_holds_each_level_tripped_once_then_released_once(run)


def test_fuses_trip_after_their_critical_fires_and_release_after_recovery_begins(run):
    assert_trips_follow_their_critical_and_releases_follow_recovery(run)


def test_the_demo_ran_on_victoriametrics_not_prometheus(run):
    names = {p.stem for p in (run.workdir / "logs").glob("*.log")}
    suffixes = [""] if run.topology == "single" else ["-1", "-2"]
    want = {f"{tool}{s}" for tool in ("victoriametrics", "vmalert") for s in suffixes}
    assert want <= names and "prometheus" not in names, names
    assert {f"vmui{s}" for s in suffixes} <= set(run.urls) and "prometheus" not in run.urls, run.urls


def test_ha_replica_one_was_stopped_after_the_first_trip_while_both_vmalerts_held_it(ha):
    kill = ha.kill
    assert kill.at is not None, "replica 1 was never stopped"
    trips = [c for c in kill.calls_before if c["state"] == "trip"]
    assert trips and not [c for c in kill.calls_before if c["state"] == "release"], kill.calls_before
    # both replicas evaluated on their own and held the tripping critical alert firing
    alert = EXPECTED[trips[0]["level"]][3]
    assert (alert, "critical") in kill.firing[0] and (alert, "critical") in kill.firing[1], kill.firing


def test_ha_every_release_came_after_replica_one_was_gone(ha):
    releases = [c for c in gateway_calls(ha) if c["state"] == "release"]
    assert len(releases) == 3 and all(c["at"] > ha.kill.at for c in releases), (ha.kill.at, releases)


def test_every_process_the_demo_started_is_gone(run):
    # HA: the two stopped with replica 1 are named in their own stop line
    assert_every_process_gone(run, at_least=8 if run.topology == "single" else 10)
    if run.topology == "ha":
        assert len(demo_pids(run)) == len(set(demo_pids(run)))
