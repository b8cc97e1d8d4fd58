"""free_port's range: the default below the kernel's ephemeral range, and the per-worker slices."""

from __future__ import annotations

import pytest

from fusebox import tooling


def test_default_range_is_the_12000_ports_below_the_ephemeral_range(monkeypatch):
    monkeypatch.delenv(tooling.PORTS_ENV, raising=False)
    monkeypatch.setattr(tooling, "_EPHEMERAL", (32768, 60999))
    assert tooling._port_range() == (20768, 32767)


def test_worker_slices_split_the_default_range_without_overlap(monkeypatch):
    monkeypatch.setattr(tooling, "_EPHEMERAL", (32768, 60999))
    slices = [tooling.port_slice(i, 4) for i in range(4)]
    # 12,000 ports in four slices of 3,000: worked out from 32768 - 12000 = 20768
    assert slices == ["20768-23767", "23768-26767", "26768-29767", "29768-32767"]


def test_env_narrows_the_range(monkeypatch):
    monkeypatch.setenv(tooling.PORTS_ENV, "23768-26767")
    assert tooling._port_range() == (23768, 26767)


@pytest.mark.parametrize("text", ["23768", "a-b", "30000-20000", "80-90", "60000-70000"])
def test_malformed_env_is_refused_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv(tooling.PORTS_ENV, text)
    with pytest.raises(ValueError, match=r"\$FUSEBOX_PORTS"):
        tooling._port_range()
