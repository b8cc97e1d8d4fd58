"""The demo's --once machinery on the real stack: Prometheus 2.42, Alertmanager 0.25, the built
OpenTelemetry Collector, the scenario collector, the fuse service, the reference gateway and the
real SGLang Model Gateway. What must happen, and why: tests/_demo_support.py. One run takes
about 4 minutes.
"""

from __future__ import annotations

import pytest
from _demo_support import (
    assert_every_process_gone,
    assert_gateway_log_holds_each_level_tripped_once_then_released_once,
    assert_sglang_worker_list_lost_each_fused_worker_and_got_it_back,
    assert_trips_follow_their_critical_and_releases_follow_recovery,
    assert_warning_fired_before_critical,
    run_demo,
)

pytestmark = [pytest.mark.tools, pytest.mark.otelcol]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return run_demo(tmp_path_factory, "demo")


def test_the_sglang_gateways_own_worker_list_loses_each_fused_worker_and_gets_it_back(result):
    assert_sglang_worker_list_lost_each_fused_worker_and_got_it_back(result)


def test_the_run_finishes_without_a_process_dying_and_in_under_five_minutes(result):
    assert result.error is None, result.error
    assert result.wall_s < 300, result.wall_s


@pytest.mark.parametrize("level", [1, 2, 3])
def test_each_signal_warns_before_its_critical_fires(result, level):
    assert_warning_fired_before_critical(result, level)


def test_the_gateway_log_holds_each_level_tripped_once_then_released_once_and_nothing_else(result):
    assert_gateway_log_holds_each_level_tripped_once_then_released_once(result)


def test_fuses_trip_after_their_critical_fires_and_release_after_recovery_begins(result):
    assert_trips_follow_their_critical_and_releases_follow_recovery(result)


def test_the_demos_own_verdict_agrees(result):
    assert result.ok and result.problems == [], result.problems


def test_every_process_the_demo_started_is_gone(result):
    assert_every_process_gone(result, at_least=6)
