"""The tests' layout (tests/README.md): every test module sits in an area folder the README lists,
and its file name is unique across the folders (they are imported by that name)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _areas() -> set[str]:
    return set(re.findall(r"^\| `([a-z0-9]+)/` \|", (TESTS / "README.md").read_text(), re.M))


def test_no_test_module_sits_outside_an_area_folder():
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_every_folder_with_tests_is_an_area_the_readme_lists():
    folders = {p.parent.name for p in TESTS.glob("*/test_*.py")}
    assert folders == _areas() and len(folders) == 11


def test_test_module_names_are_unique_across_the_folders():
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "fixtures" not in p.parts)
    assert [n for n, c in names.items() if c > 1] == []
