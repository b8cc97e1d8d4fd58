"""A threshold in another signal's unit is refused saying what it is and what the signal's unit is.

pint holds bits and bytes dimensionless (its default_en.txt: ``bit = []``), so without a check of
their own "78.3 GB" read as the ratio 6.264e11 (78.3e9 bytes x 8 bits) and "78.3%" as 0.098 bytes."""

from __future__ import annotations

import pytest
from _support import SPEC

from fusebox.spec import SpecError, parse_spec
from fusebox.spec.units import QuantityError, parse_quantity

BASE = SPEC.read_text(encoding="utf-8")


@pytest.mark.parametrize("text, unit, is_, not_", [
    ("78.3 GB", "ratio", "bytes (GB)", "not a ratio"),
    ("78.3 MB/s", "ratio", "bytes per second (MB / s)", "not a ratio"),
    ("1.28s", "ratio", "seconds (s)", "not a ratio"),
    ("78.3%", "bytes", "a ratio (%)", "not bytes"),
    ("5 s", "bytes", "seconds (s)", "not bytes"),
    ("14.7 MB/s", "bytes", "bytes per second (MB / s)", "not bytes"),
    ("2 GB", "seconds", "bytes (GB)", "not seconds"),
    ("14.7 MB/s", "seconds", "bytes per second (MB / s)", "not seconds"),
    ("78.3%", "seconds", "a ratio (%)", "not seconds"),
    ("1 s", "bytes_per_second", "seconds (s)", "not bytes per second"),
    ("2 GB", "bytes_per_second", "bytes (GB)", "not bytes per second"),
    ("78.3%", "bytes_per_second", "a ratio (%)", "not bytes per second"),
])
def test_a_quantity_in_another_unit_says_what_it_is(text, unit, is_, not_):
    with pytest.raises(QuantityError) as ei:
        parse_quantity(text, unit)
    assert ei.value.what == f"wrong unit: {text!r} is {is_}, {not_}"


@pytest.mark.parametrize("text, unit", [("50", "bytes"), ("0.5", "bytes_per_second"), ("1.28", "seconds")])
def test_a_quoted_number_without_unit_is_refused(text, unit):
    """"50" on a bytes signal read as 6.25 bytes (50 bits) before."""
    with pytest.raises(QuantityError, match="has no unit"):
        parse_quantity(text, unit)


@pytest.mark.parametrize("text, unit, expected", [
    ("78.3%", "ratio", 0.783), ("2 GB", "bytes", 2e9), ("8 bit", "bytes", 1.0), ("14.7 MB/s", "bytes_per_second", 14.7e6),
    ("8.7 GB/min", "bytes_per_second", 8.7e9 / 60), ("8 Mbit/s", "bytes_per_second", 1e6), ("850ms", "seconds", 0.85),
])
def test_the_right_units_still_convert(text, unit, expected):
    assert parse_quantity(text, unit) == pytest.approx(expected, rel=1e-12)


def test_minutes_written_m_are_named_a_metre():
    with pytest.raises(QuantityError) as ei:
        parse_quantity("3 m", "seconds")
    assert "metre" in ei.value.what and "'3min'" in ei.value.what


def test_gigabytes_on_the_gpu_memory_ratio_is_reported_at_its_line():
    # gpu_memory_utilization is unit: ratio in fusebox.yaml, critical threshold 78.3%
    text = BASE.replace("threshold: 78.3%", "threshold: 78.3 GB", 1)
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "fusebox.yaml")
    (p,) = ei.value.problems
    assert p.line == text.splitlines().index(next(ln for ln in text.splitlines() if "threshold: 78.3 GB" in ln)) + 1
    assert p.what == "wrong unit: '78.3 GB' is bytes (GB), not a ratio"
    assert p.fix == "signal gpu_memory_utilization's unit is ratio: write the threshold as e.g. '78.3%'"
    assert "e+11" not in str(p)


@pytest.mark.parametrize("text", ["78.3 %%", "78.3 % %"])
def test_a_doubled_percent_is_refused_not_read_as_a_share_of_a_share(text):
    """pint reads "78.3 %%" as percent squared, 0.00783: the ratio check passed it."""
    with pytest.raises(QuantityError) as ei:
        parse_quantity(text, "ratio")
    assert ei.value.what == f"{text!r} is in % ** 2, a share of a share, not a percentage"
    assert ei.value.fix == "write the unit once, e.g. '78.3%'"


def test_a_doubled_percent_on_the_pcie_link_is_a_spec_error_at_its_line():
    """Found by a new user's typo: `threshold: 95 %%` on the PCIe link's critical tier generated
    every file, exit 0, the alert firing at 0.95 % (>= 0.0095) instead of 95 %."""
    old = "        threshold: 95%          # seed: PCIe link saturation"
    assert BASE.count(old) == 1
    text = BASE.replace(old, "        threshold: 95 %%          # seed: PCIe link saturation")
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "fusebox.yaml")
    (p,) = ei.value.problems
    assert p.line == BASE.splitlines().index(old) + 1
    assert p.what == "'95 %%' is in % ** 2, a share of a share, not a percentage"
