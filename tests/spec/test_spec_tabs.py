"""A TAB in a YAML file's indentation is named as such, at its line and column: PyYAML's own words
("found character '\\t' that cannot start any token"; the C parser's without the character) do not
say that a tab is the cause."""

from __future__ import annotations

import pytest
from _support import SPEC

from fusebox.cli import main
from fusebox.spec import SpecError, parse_spec
from fusebox.spec.positions import load

BASE = SPEC.read_text(encoding="utf-8")


@pytest.mark.parametrize("old, new, col", [
    ("\n  scrape_interval: 5s", "\n\tscrape_interval: 5s", 1),           # a tab for a two-space indent
    ("\n  scrape_interval: 5s", "\n  \tscrape_interval: 5s", 3),         # spaces, then a tab
    ("\n        threshold: 72.0%", "\n\t\tthreshold: 72.0%", 1),         # two tabs, deep in a signal
])
def test_a_tab_in_the_indentation_is_named_at_its_place(old, new, col):
    assert old in BASE
    text = BASE.replace(old, new, 1)
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "fusebox.yaml")
    (p,) = ei.value.problems
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith(new.lstrip("\n")))
    assert (p.path, p.line, p.col) == ("fusebox.yaml", line, col)
    assert "tabs are not allowed in YAML indentation" in p.what
    assert "spaces" in p.fix


def test_a_tab_between_tokens_is_named_too():
    # PyYAML's pure-Python parser refuses a tab after "- "; so does libyaml's
    with pytest.raises(SpecError) as ei:
        load("items:\n  - a\n  -\tb\n", "s.yaml")
    (p,) = ei.value.problems
    assert (p.line, p.col) == (3, 4) and "a tab" in p.what and p.fix == "replace the tab with a space"


def test_a_syntax_error_without_a_tab_keeps_its_own_words():
    with pytest.raises(SpecError) as ei:
        load("a: [1, 2\n", "s.yaml")
    assert "tab" not in str(ei.value) and "YAML syntax error" in str(ei.value)


def test_generate_reports_the_tab_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "fusebox.yaml"
    bad.write_text(BASE.replace("\n  scrape_interval: 5s", "\n\tscrape_interval: 5s", 1))
    out = tmp_path / "out"
    assert main(["generate", "--spec", str(bad), "--out", str(out)]) == 2
    line = bad.read_text().splitlines().index("\tscrape_interval: 5s") + 1
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:{line}:1: a tab in the indentation: tabs are not allowed in YAML indentation -- ")
    assert not out.exists()
