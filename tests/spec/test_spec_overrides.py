"""`overrides:` in bad input: each problem is reported at the override's own line (the key that is
wrong), not at the signal's tier it changes; and the README's override example loads as printed."""

from __future__ import annotations

import re

import pytest
from _support import ROOT, SPEC

from fusebox.spec import SpecError, parse_spec

BASE = SPEC.read_text(encoding="utf-8")
assert "overrides: []" in BASE


def _problems(overrides: str) -> tuple[str, list]:
    text = BASE.replace("overrides: []", overrides, 1)
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "fusebox.yaml")
    return text, ei.value.problems


def _line(text: str, needle: str) -> int:
    """The line of the override's ``needle`` (searched after 'overrides:' so a tier's equal line is not taken)."""
    start = text.index("\noverrides:\n")
    return text.count("\n", 0, start + text[start:].index(needle)) + 1


@pytest.mark.parametrize("overrides, needle, words", [
    # the shipped tiers of GPUMemoryUtilizationHigh are warning 72.0% and critical 78.3% (fusebox.yaml)
    ("overrides:\n  - alert: GPUMemoryUtilizationHigh\n    tier: critical\n    threshold: 70%\n",
     "threshold: 70%", "warning threshold (72.0%) is not below critical (70%)"),
    ("overrides:\n  - alert: GPUMemoryUtilizationHigh\n    tier: warning\n    threshold: 80%\n",
     "threshold: 80%", "warning threshold (80%) is not below critical (78.3%)"),
    ("overrides:\n  - alert: GPUMemoryUtilizationHigh\n    tier: critical\n    threshold: 80 MB/s\n",
     "threshold: 80 MB/s", "wrong unit"),
    ("overrides:\n  - alert: GPUMemoryUtilizationHigh\n    source: nope\n",
     "source: nope", "source 'nope' is not listed under sources"),
    # a tier-specific source would be ignored: the signal reads one source
    ("overrides:\n  - alert: GPUMemoryUtilizationHigh\n    tier: critical\n    source: dcgm\n",
     "source: dcgm", "applies to the whole signal"),
    # GPUMemoryBandwidthSaturated has a critical tier only: the override would change nothing
    ("overrides:\n  - alert: GPUMemoryBandwidthSaturated\n    tier: warning\n    threshold: 80%\n",
     "tier: warning", "has no warning tier"),
], ids=["critical-below-warning", "warning-above-critical", "wrong-unit", "unknown-source", "tier-source", "missing-tier"])
def test_an_override_problem_is_reported_at_the_override(overrides, needle, words):
    text, problems = _problems(overrides)
    hit = [p for p in problems if words in p.what]
    assert hit, [str(p) for p in problems]
    assert hit[0].line == _line(text, needle), (str(hit[0]), needle)
    assert hit[0].fix


def test_an_override_without_tier_setting_a_threshold_says_to_add_tier():
    text, problems = _problems("overrides:\n  - alert: GPUMemoryUtilizationHigh\n    threshold: 80%\n")
    (p,) = problems
    assert p.line == _line(text, "threshold: 80%")
    assert "warning threshold (80%) is not below critical (80%)" in p.what and "no 'tier'" in p.what
    assert "tier: critical" in p.fix


def _yaml_blocks(doc: str, first: str) -> list[str]:
    """The YAML code blocks of ``doc`` that start with ``first`` (README's may be indented in a list)."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    blocks = re.findall(r"^( *)```yaml\n(.*?)^ *```", text, re.S | re.M)
    return [re.sub(rf"^{indent}", "", b, flags=re.M) for indent, b in blocks if b.lstrip().startswith(first)]


@pytest.mark.parametrize("doc", ["README.md", "docs/spec.md"])
def test_the_docs_override_examples_load_into_the_starter_spec(doc):
    examples = _yaml_blocks(doc, "overrides:")
    assert examples, f"{doc} shows an overrides example"
    for block in examples:
        s = parse_spec(BASE.replace("overrides: []", block.rstrip("\n"), 1), "fusebox.yaml")
        assert s.raw["overrides"], block


def test_the_readme_override_example_changes_the_critical_tier():
    (block,) = [b for b in _yaml_blocks("README.md", "overrides:") if "threshold:" in b]
    s = parse_spec(BASE.replace("overrides: []", block.rstrip("\n"), 1), "fusebox.yaml")
    tiers = {t.name: t for t in s.signal("gpu_memory_utilization").tiers}
    assert tiers["critical"].threshold == pytest.approx(0.80)  # README: threshold: 80%
    assert tiers["critical"].for_s == 60 and tiers["critical"].severity == "page"  # for: 1m, severity: page
    assert tiers["warning"].threshold == pytest.approx(0.72)  # untouched: fusebox.yaml's 72.0%
