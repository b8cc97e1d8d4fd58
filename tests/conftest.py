"""Session fixtures shared by the test modules; helpers live in _support.py."""

from __future__ import annotations

import os

import pytest
from _support import SPEC

from fusebox.tooling import PORTS_ENV, port_slice

# Under pytest-xdist (`make test`), each worker and the processes it starts draw free ports from
# their own slice, so two workers cannot pick the same port before either binds it.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    os.environ.setdefault(PORTS_ENV, port_slice(int(os.environ["PYTEST_XDIST_WORKER"][2:]),
                                                int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# the `unit` marker and its guard: the rule and the hooks live in _unit_rule.py
from _unit_rule import pytest_collection_modifyitems, pytest_configure, pytest_runtest_call, pytest_runtest_setup  # noqa: F401  (pytest finds hooks by name here)

pytest_plugins = ("pytester",)


@pytest.fixture(scope="session")
def spec():
    from fusebox.spec import load_spec

    return load_spec(SPEC, display_path="fusebox.yaml")


@pytest.fixture(scope="session")
def generated(tmp_path_factory, spec):
    """The shipped spec's outputs, generated once into a temporary directory."""
    from fusebox.generator.outputs import render_all
    from fusebox.generator.writer import write_outputs

    out = tmp_path_factory.mktemp("generated")
    write_outputs(render_all(spec), out)
    return out
