"""Shared test helpers (import as `from _support import ...`). Tests that need an external tool fail under CI (CI=true) when it is
missing, so a green run always means the tool really ran; locally they skip with the reason."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fusebox.tooling import tools_dir

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SPEC = ROOT / "fusebox.yaml"


def spec_text_at_30s() -> str:
    """The shipped spec at kube-prometheus-stack's 30 s scrape and evaluation intervals, each 1m
    deriv window raised to 2m (4 scrapes, as the spec's comment under global: requires); the
    tiers keep their `for` (KVCacheTimeToFullLow critical 15s: under the interval)."""
    out = SPEC.read_text().replace("  scrape_interval: 5s\n", "  scrape_interval: 30s\n", 1)
    out = out.replace("  evaluation_interval: 5s\n", "  evaluation_interval: 30s\n", 1).replace("    window: 1m\n", "    window: 2m\n")
    assert out.count("scrape_interval: 30s") == 1 and "evaluation_interval: 30s" in out and "window: 1m\n" not in out
    return out


def without_signals(data: dict, *names: str) -> dict:
    """``data`` (a spec as YAML loads it) less the signals ``names``, and less what scales on them
    (:func:`unscaled`) and the SLOs on their histograms (the spec would name unknown signals otherwise)."""
    for n in names:
        data["signals"].pop(n, None)
    slos = data.get("slos") or {}
    for k in [k for k, v in slos.items() if v.get("signal") in names]:
        del slos[k]
    return unscaled(data, *names)


def unscaled(data: dict, *names: str) -> dict:
    """``data`` (a spec as YAML loads it) with no ``scaling`` workload driven by the signals
    ``names``: each workload's ``signals`` lose them, a workload left with none goes, and a
    ``scaling`` left without workloads goes."""
    scaling = data.get("scaling")
    if scaling:
        for w in scaling.get("workloads", []):
            w["signals"] = [n for n in w["signals"] if n not in names]
        scaling["workloads"] = [w for w in scaling.get("workloads", []) if w["signals"]]
        if not scaling["workloads"]:
            del data["scaling"]
    return data


def trimmed_spec(text: str, *keep: str) -> str:
    """The spec ``text`` with only the signals named in ``keep`` and GPU memory (the shipped in-path
    shedders read it), everything else as it is: for tests of what `fusebox check` and the rule tools
    do with a spec rather than of the shipped spec's cases, whose test file the tools then run in a
    few seconds instead of minutes (about a fifth of its cases; no ``slos``, whose days-long burn-rate
    cases take minutes: tests/generator/test_generator_slo.py runs them). Comments go and lines move:
    read positions from this text, not from the shipped file."""
    import yaml

    data = yaml.safe_load(text)
    unknown = set(keep) - set(data["signals"])
    assert not unknown, f"no such signal in the spec: {sorted(unknown)}"
    without_signals(data, *(k for k in data["signals"] if k not in {"gpu_memory_utilization", *keep}))
    data.pop("slos", None)
    return yaml.safe_dump(data, sort_keys=False)


def trimmed_outputs(folder: Path, *keep: str, text: str | None = None) -> Path:
    """``folder``/fusebox.yaml, :func:`trimmed_spec` of ``text`` (default: the shipped spec) with
    ``keep``, and the outputs `fusebox generate` writes from it beside it; returns the spec file."""
    from fusebox.generator.outputs import render_all
    from fusebox.generator.writer import write_outputs
    from fusebox.spec import parse_spec

    trimmed = trimmed_spec(SPEC.read_text() if text is None else text, *keep)
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "fusebox.yaml"
    spec.write_text(trimmed)
    write_outputs(render_all(parse_spec(trimmed, str(spec))), folder)
    return spec


def need(path_or_name: str, how: str = "run `make tools`") -> str:
    """Return the tool's path, or fail (under CI) / skip (elsewhere) saying how to get it."""
    p = Path(path_or_name)
    found = str(p) if p.is_absolute() and p.exists() else shutil.which(path_or_name)
    if found:
        return found
    missing(f"{path_or_name} is missing: {how}")


def prometheus_and_alertmanager() -> tuple[str, str]:
    """Debian's ``prometheus`` and Alertmanager (``prometheus-alertmanager``, else ``alertmanager``
    on PATH), each through :func:`need`."""
    return (need("prometheus", "install Debian's prometheus package (`make tools`)"),
            need(shutil.which("prometheus-alertmanager") or "alertmanager",
                 "install Debian's prometheus-alertmanager package (`make tools`)"))


def missing(msg: str):
    """Fail (under CI) or skip (elsewhere) with ``msg``, which says what is missing and how to get it."""
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def promtools() -> list[str]:
    """Debian's promtool 2.42 and the pinned Prometheus 3 promtool built by tools/bootstrap.sh."""
    return [need("promtool"), need(str(tools_dir() / "promtool-v0.316.0" / "promtool"), "run `make tools` (builds it with Go)")]




def finish(proc: subprocess.Popen, bound: float = 60.0) -> tuple[int, str, str]:
    """``(exit status, stdout, stderr)`` of ``proc`` once it exits (the output of the streams that
    are pipes, else empty), waiting on the exit itself, at most ``bound`` s: a generous bound for a
    loaded machine. Past it the process is killed and AssertionError says what it had written."""
    try:
        out, err = proc.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"{proc.args!r} had not exited after {bound:g} s; it wrote to stderr: "
                             f"{_text(err)[-3000:]!r}, to stdout: {_text(out)[-1000:]!r}") from None
    return proc.returncode, _text(out), _text(err)


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""
