"""Session fixtures shared by the test modules; helpers live in _support.py."""

from __future__ import annotations

import pytest
from _support import SPEC

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
