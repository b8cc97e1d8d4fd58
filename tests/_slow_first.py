"""Parallel runs (`make test`, pytest-xdist): the minutes-long tests first on every worker."""

from __future__ import annotations

import os

import pytest

# The tests that take minutes (measured: `pytest --durations`; most run promtool 2 and 3 and vmalert-tool on a
# whole generated test file, or set up a whole stack), started first on every parallel worker: pytest-xdist's
# worksteal scheduler gives each worker one contiguous block of the collection and lets idle ones steal the
# tail of another's, so a minutes-long test left at a block's end would run alone after all the rest.
SLOW_FIRST = (
    "tests/generator/test_generator_rule_engines.py::test_split_groups_pass_promtool_and_vmalert_tool",
    "tests/generator/test_generator_promtool.py::test_fusebox_check",
    "tests/inpath/test_inpath.py::test_fusebox_check_fails_a_shedder_after_its_fuse",
    "tests/generator/test_generator_budget.py::test_fusebox_check_fails_when_the_budget_does",
    "tests/generator/test_generator_rule_engines.py::test_fusebox_check_runs_vmalert_and_vmalert_tool",
    "tests/generator/test_generator_rule_engines.py::test_generated_vmalert_tests",
    "tests/generator/test_generator_rule_engines.py::test_thanos_rules_are_checked_on_a_copy_without_the_key",
    "tests/generator/test_generator_rule_engines.py::test_vmalert_tests_fail_without_the_lag",
    "tests/spec/test_spec_time_to_full.py::test_dcgm_time_to_full_cases_pass_vmalert_tool",
    "tests/generator/test_generator_promtool.py::test_selector_and_extra_labels_reach_rules_and_generated_tests",
    "tests/generator/test_generator_promtool.py::test_lower_bound_and_custom_expression_signals",
)


def _blocks(total: int, workers: int) -> list[int]:
    """The sizes of worksteal's first blocks: each worker in turn gets len(pending) // workers left."""
    sizes, left = [], total
    for remaining in range(workers, 0, -1):
        sizes.append(left // remaining)
        left -= sizes[-1]
    return sizes


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):  # after the unit marker's hook (_unit_rule)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2:
        return
    slow = [it for it in items if it.nodeid.startswith(SLOW_FIRST)]
    rest = [it for it in items if not it.nodeid.startswith(SLOW_FIRST)]
    heads: list[list] = [[] for _ in range(workers)]
    for i, it in enumerate(slow):
        heads[i % workers].append(it)
    ordered = []
    for head, size in zip(heads, _blocks(len(items), workers), strict=True):
        fill = max(0, size - len(head))
        ordered += head + rest[:fill]
        rest = rest[fill:]
    items[:] = ordered + rest
