"""Session fixtures shared by the test modules; helpers live in _support.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from _support import SPEC

# the `unit` marker and its guard: the rule and the hooks live in _unit_rule.py
from _unit_rule import pytest_collection_modifyitems, pytest_configure, pytest_runtest_call, pytest_runtest_setup  # noqa: F401  (pytest finds hooks by name here)

from fusebox.tooling import PORTS_ENV, port_slice

# Under pytest-xdist (`make test`), each worker and the processes it starts draw free ports from
# their own slice, so two workers cannot pick the same port before either binds it.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    os.environ.setdefault(PORTS_ENV, port_slice(int(os.environ["PYTEST_XDIST_WORKER"][2:]),
                                                int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


# Tests live in one folder per area (tests/fuse/, tests/spec/, ...; tests/README.md). A few import a
# helper from a test module of another area by its file name (unique across the folders), so every
# area folder is importable, as tests/ itself is for the shared helpers (_support.py, ...).
for _area in sorted(p for p in Path(__file__).resolve().parent.iterdir() if p.is_dir() and any(p.glob("test_*.py"))):
    if str(_area) not in sys.path:
        sys.path.append(str(_area))


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
