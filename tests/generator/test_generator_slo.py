"""The generated SLO burn-rate cases (rules/fusebox.slo.test.yml) under promtool 2 and 3, and that
they fail when a window or a factor of the rules is wrong (docs/slo.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from _support import ROOT, promtools

pytestmark = pytest.mark.process

RULES = ROOT / "rules"


def _run(promtool: str, cwd: Path, test: str = "fusebox.slo.test.yml") -> subprocess.CompletedProcess:
    return subprocess.run([promtool, "test", "rules", test], cwd=cwd, capture_output=True, text=True, timeout=1200)


@pytest.mark.parametrize("which", [0, 1], ids=["promtool-2", "promtool-3"])
def test_shipped_slo_cases_pass(which):
    r = _run(promtools()[which], RULES)
    assert r.returncode == 0, r.stdout + r.stderr


def _fast_page_only(tmp: Path, rules_text: str) -> Path:
    """The fast-page case of the first SLO alone, against ``rules_text``."""
    test = yaml.safe_load((RULES / "fusebox.slo.test.yml").read_text())
    test["tests"] = test["tests"][:1]
    (tmp / "fusebox.slo.rules.yml").write_text(rules_text)
    (tmp / "t.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    return tmp


@pytest.mark.parametrize("mutation, why", [
    (("ratio_rate1h > 0.144", "ratio_rate1h > 0.06"), "factor 6 instead of 14.4: pages at 4m, one evaluation before 9m fails"),
    (("[1h]", "[2h]"), "a 2h long window: 18m to detect, so not yet at 9m"),
    (("ratio_rate5m > 0.144", "ratio_rate5m > 1"), "short window never over: never pages"),
])
def test_a_wrong_window_or_factor_fails_the_fast_page_case(tmp_path, mutation, why):
    text = (RULES / "fusebox.slo.rules.yml").read_text()
    assert mutation[0] in text
    ok = _run(promtools()[0], _fast_page_only(tmp_path, text), "t.yml")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _run(promtools()[0], _fast_page_only(tmp_path, text.replace(mutation[0], mutation[1])), "t.yml")
    assert bad.returncode != 0, why
    assert "AlignmentLatencyErrorBudgetBurn" in bad.stdout + bad.stderr
