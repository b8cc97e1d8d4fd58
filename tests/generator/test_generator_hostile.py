"""Hostile specs and hostile output folders: exit 2, a ``PATH:LINE:COL: what -- fix`` message,
no traceback, and every file under --out exactly as it was (issue 9). Also: the outputs do not
depend on how --spec was spelled."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _support import ROOT, SPEC

from fusebox.cli import main
from fusebox.spec import SpecError, parse_spec
from fusebox.spec.units import parse_duration

BASE = SPEC.read_text(encoding="utf-8")


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def _snapshot(out: Path) -> dict[str, bytes | None]:
    """Every path under ``out``: file bytes, or None for a directory."""
    return {str(p.relative_to(out)): (None if p.is_dir() else p.read_bytes()) for p in sorted(out.rglob("*"))}


def _generate(spec: Path | str, out: Path | str, *extra: str) -> tuple[int, str, str]:
    """Run ``fusebox generate`` in-process; (exit code, stdout, stderr)."""
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        try:
            rc = main(["generate", "--spec", str(spec), "--out", str(out), *extra])
        except SystemExit as x:  # argparse
            rc = x.code
        except BaseException:  # a traceback is what we test against: show it as the CLI would
            import traceback

            traceback.print_exc(file=e)
            rc = "raised"
    return rc, o.getvalue(), e.getvalue()


@pytest.fixture
def old_out(tmp_path):
    """An output folder holding hand-made content that a failed run must leave as it was."""
    out = tmp_path / "out"
    (out / "rules").mkdir(parents=True)
    (out / "rules" / "fusebox.rules.yml").write_text("# hand-made, must survive\n")
    (out / "notes.txt").write_text("mine\n")
    return out


def _assert_refused(tmp_path, old_out, text: str | bytes, needle: str | None, words: str, *, line: int | None = None):
    spec = tmp_path / "bad.yaml"
    (spec.write_bytes if isinstance(text, bytes) else spec.write_text)(text)
    before = _snapshot(old_out)
    rc, _, err = _generate(spec, old_out)
    assert "Traceback" not in err, err
    assert rc == 2, err
    if line is None and needle is not None:
        line = _line_of(text if isinstance(text, str) else text.decode("utf-8", "replace"), needle)
    prefix = f"{spec}:{line}:" if line is not None else f"{spec}:"
    hit = [m for m in err.splitlines() if m.startswith(prefix) and words in m]
    assert hit, err
    assert " -- " in hit[0] and hit[0].split(" -- ", 1)[1].strip()
    assert _snapshot(old_out) == before
    return hit[0]


# --------------------------------------------------------------------------- YAML itself
BOMB = "apiVersion: fusebox/v1\nlol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10))


def test_alias_bomb_is_refused_within_a_memory_limit(tmp_path, old_out):
    """A few hundred bytes that expand to 9^10 nodes; a child process with a 2 GiB address-space
    limit, so a regression fails this test instead of taking the machine down."""
    assert len(BOMB) < 1000
    spec = tmp_path / "bomb.yaml"
    spec.write_text(BOMB)
    before = _snapshot(old_out)

    def limit():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "generate", "--spec", str(spec), "--out", str(old_out)],
                       capture_output=True, text=True, cwd=ROOT, preexec_fn=limit, timeout=120)
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"{spec}:" in r.stderr and "alias" in r.stderr and " -- " in r.stderr
    assert _snapshot(old_out) == before


def test_recursive_alias_is_refused(tmp_path, old_out):
    text = BASE.replace("overrides: []", "overrides: &a [*a]")
    msg = _assert_refused(tmp_path, old_out, text, "overrides: &a [*a]", "recursive")
    assert "alias" in msg


def test_aliases_of_small_values_still_work():
    text = BASE.replace("  for: 1m\n  keep_firing_for: 1m", "  for: &d 1m\n  keep_firing_for: *d")
    assert parse_spec(text, "ok.yaml").signal("gpu_memory_utilization").tiers[0].keep_firing_for_s == 60


def test_spec_over_the_size_cap_is_refused_before_parsing(tmp_path, old_out):
    text = BASE + ("#" + "x" * 1023 + "\n") * (8 * 1024 + 100)  # valid YAML (comments), just over 8 MiB
    msg = _assert_refused(tmp_path, old_out, text, None, "MiB", line=1)
    assert "8 MiB" in msg


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b", "\x7f"])
def test_control_characters_are_refused_at_their_place(tmp_path, old_out, char):
    text = BASE.replace("  name: multimodal-inference", f"  name: multimodal{char}-inference")
    msg = _assert_refused(tmp_path, old_out, text, "  name: multimodal", "character")
    assert f":{len('  name: multimodal') + 1}: " in msg  # the column of the character itself
    assert f"#x{ord(char):04x}" in msg


# ------------------------------------------------------------------------ values
@pytest.mark.parametrize("old,new", [
    ("threshold: 78.3%", "threshold: yes"),
    ("threshold: 72.0%", "threshold: false"),
    ("      level: 2\n", "      level: true\n"),
    ("quantile: 0.95", "quantile: on"),
])
def test_yaml_booleans_are_not_numbers(tmp_path, old_out, old, new):
    assert old in BASE
    text = BASE.replace(old, new, 1)
    msg = _assert_refused(tmp_path, old_out, text, new.strip(), "boolean")
    assert "quote" in msg


def test_negative_rate_threshold_is_refused(tmp_path, old_out):
    text = BASE.replace("threshold: 9.2 MB/s", "threshold: -9.2 MB/s")
    assert text != BASE
    msg = _assert_refused(tmp_path, old_out, text, "threshold: -9.2 MB/s", "negative")
    assert "-9.2 MB/s" in msg


@pytest.mark.parametrize("value", ["nan MB/s", "inf MB/s", "1e400 MB/s"])
def test_non_finite_thresholds_are_refused(value):
    text = BASE.replace("threshold: 9.2 MB/s", f"threshold: {value}")
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "bad.yaml")
    assert any("finite" in str(p) or "outside 0..1" in str(p) for p in ei.value.problems), ei.value.problems


@pytest.mark.parametrize("value", [".nan", "'1e400'", "'inf%'"])
def test_non_finite_ratio_thresholds_are_refused_without_a_bad_suggestion(value):
    text = BASE.replace("threshold: 78.3%", f"threshold: {value}", 1)
    assert text != BASE
    with pytest.raises(SpecError) as ei:
        parse_spec(text, "bad.yaml")
    msgs = [str(p) for p in ei.value.problems]
    assert any("not a finite number" in m for m in msgs), msgs
    assert not any("nan%" in m or "1e400%" in m or "inf%'" in m.split("--")[1] for m in msgs), msgs


@pytest.mark.parametrize("value", ["0 MB/s", "-0 MB/s", "0.0 MB/s"])
def test_a_zero_threshold_on_an_upper_bound_is_refused(tmp_path, old_out, value):
    # ">= 0" holds for every sample: the alert would fire for every engine, always.
    text = BASE.replace("threshold: 14.7 MB/s", f"threshold: {value}", 1)
    assert text != BASE
    _assert_refused(tmp_path, old_out, text, f"threshold: {value}", "fires whenever the signal exists")


@pytest.mark.parametrize("old,new", [
    ("    for: 30s\n        fuse: freeze_admissions", "    for: 999999999999999h\n        fuse: freeze_admissions"),
    ("  keep_firing_for: 1m", "  keep_firing_for: 300y"),
    ("  repeat_interval: 4h", "  repeat_interval: 106752d"),
])
def test_durations_prometheus_cannot_hold_are_refused(tmp_path, old_out, old, new):
    assert old in BASE
    text = BASE.replace(old, new, 1)
    msg = _assert_refused(tmp_path, old_out, text, new.split("\n")[0].strip(), "out of range")
    assert "292" in msg


def test_duration_bound_is_prometheus_int64_nanoseconds():
    # 2^63 - 1 ns = 106751d 23h 47m 16s 854.775807ms: the largest model.Duration
    assert parse_duration("106751d23h47m16s854ms") == pytest.approx(9223372036.854)
    assert parse_duration("292y") == 292 * 365 * 86400
    for bad in ("106751d23h47m16s855ms", "293y", "9223372036855s"):
        with pytest.raises(ValueError, match="out of range"):
            parse_duration(bad)


def test_an_evaluation_interval_longer_than_a_generated_for_makes_no_negative_test_time(tmp_path):
    """The fuzz test found it: evaluation_interval 61s ended generate in a traceback, since the
    FuseboxGPUDown case (for: 1m) was quiet at 60 - 61 = -1s, a time vmalert-tool's twin could not
    parse (a test step over 60 s is still clamped to 0s). The tests now step at the 5s scrape
    interval (Spec.test_interval_s): quiet at 60 - 5 = 55s, firing at 60 + 5 = 1m5s."""
    import yaml

    text = BASE.replace("  evaluation_interval: 5s", "  evaluation_interval: 61s")
    spec = tmp_path / "fusebox.yaml"
    spec.write_text(text, encoding="utf-8")
    rc, out, err = _generate(spec, tmp_path / "out")
    assert rc == 0 and "Traceback" not in err, err
    tests = yaml.safe_load((tmp_path / "out" / "rules" / "fusebox.rules.test.yml").read_text())["tests"]
    times = [c["eval_time"] for g in tests for c in g.get("alert_rule_test", []) + g.get("promql_expr_test", [])]
    assert not [t for t in times if str(t).startswith("-")]
    (down,) = [g for g in tests if any(c.get("alertname") == "FuseboxGPUDown" for c in g.get("alert_rule_test", []))]
    assert [c["eval_time"] for c in down["alert_rule_test"]] == ["55s", "1m5s"] and down["interval"] == "5s"


def test_zero_evaluation_interval_is_refused(tmp_path, old_out):
    text = BASE.replace("  evaluation_interval: 5s", "  evaluation_interval: 0s")
    _assert_refused(tmp_path, old_out, text, "evaluation_interval: 0s", "positive")


@pytest.mark.parametrize("old,new", [("        metric: fusebox_gpu_pcie_utilization_ratio",
                                      "        metric: fusebox_gpu_pcie_utilization_ratio\n        scale: 0"),
                                     ("        metric: fusebox_gpu_pcie_utilization_ratio",
                                      "        metric: fusebox_gpu_pcie_utilization_ratio\n        scale: .inf")])
def test_scale_must_be_a_finite_non_zero_number(tmp_path, old_out, old, new):
    assert old in BASE
    text = BASE.replace(old, new, 1)
    _assert_refused(tmp_path, old_out, text, new.split("\n")[1].strip(), "scale")


# -------------------------------------------------------------------- the output folder
def _fill_with_old(spec_out: Path) -> None:
    """Every generated file gets content the next run must replace."""
    for p in spec_out.rglob("*"):
        if p.is_file() and p.name != ".fusebox-generated":
            p.write_text("old\n")


def test_unwritable_output_path_leaves_every_file_as_it_was(tmp_path):
    """A directory stands where the last generated file must go: every other file would change,
    yet after the failure each is byte-identical to before (this holds as root too)."""
    out = tmp_path / "out"
    assert _generate(SPEC, out)[0] == 0
    _fill_with_old(out)
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != ".fusebox-generated")
    assert len(files) >= 20
    blocker = files[-1]  # written last: every other file would be in place before it fails
    blocker.unlink()
    blocker.mkdir()
    (blocker / "keep").write_text("a folder of mine\n")
    before = _snapshot(out)
    rc, _, err = _generate(SPEC, out)
    assert "Traceback" not in err, err
    assert rc == 2, err
    rel = blocker.relative_to(out)
    line = next(m for m in err.splitlines() if str(rel) in m)
    assert line.startswith(f"{out / rel}:1:1: ") and " -- " in line
    assert _snapshot(out) == before  # no temp folder left either


def test_a_file_where_a_folder_must_go(tmp_path):
    out = tmp_path / "out"
    assert _generate(SPEC, out)[0] == 0
    _fill_with_old(out)
    for p in (out / "runbooks").iterdir():
        p.unlink()
    (out / "runbooks").rmdir()
    (out / "runbooks").write_text("not a folder\n")
    before = _snapshot(out)
    rc, _, err = _generate(SPEC, out)
    assert "Traceback" not in err and rc == 2, err
    assert f"{out / 'runbooks'}" in err and " -- " in err
    assert _snapshot(out) == before


def test_failure_while_moving_into_place_rolls_back(tmp_path, monkeypatch):
    """The 15th move fails (as a full disk or a read-only folder would): the 14 files already moved
    are put back as they were, and the new ones removed."""
    from fusebox.generator import writer

    out = tmp_path / "out"
    assert _generate(SPEC, out)[0] == 0
    _fill_with_old(out)
    (out / "runbooks" / "GPUMemoryUtilizationHigh.md").unlink()  # a file the run creates anew
    before = _snapshot(out)
    real = os.replace
    calls = {"n": 0}

    def flaky(src, dst):
        d = Path(dst)
        if d.is_relative_to(out) and not any(part.startswith(".fusebox-") for part in d.relative_to(out).parts):
            calls["n"] += 1
            if calls["n"] == 15:
                raise OSError(28, "No space left on device", str(dst))
        return real(src, dst)

    monkeypatch.setattr(writer.os, "replace", flaky)
    rc, _, err = _generate(SPEC, out)
    assert calls["n"] >= 15
    assert "Traceback" not in err and rc == 2, err
    assert "No space left on device" in err
    monkeypatch.setattr(writer.os, "replace", real)
    assert _snapshot(out) == before


# ---------------------------------------------------------------- how --spec is spelled
def test_outputs_do_not_depend_on_how_the_spec_path_is_spelled(tmp_path, monkeypatch):
    home = tmp_path / "repo"
    home.mkdir()
    (home / "fusebox.yaml").write_text(BASE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outs = {}
    for how, cwd, spec in [("absolute", elsewhere, home / "fusebox.yaml"), ("relative", home, "fusebox.yaml"),
                           ("dotted", home, "./fusebox.yaml"), ("from elsewhere", elsewhere, "../repo/fusebox.yaml")]:
        monkeypatch.chdir(cwd)
        out = tmp_path / f"out-{len(outs)}"
        rc, _, err = _generate(spec, out)
        assert rc == 0, err
        outs[how] = _snapshot(out)
    first = outs["absolute"]
    assert len(first) > 20
    for how, snap in outs.items():
        assert snap == first, how
    header = "Code generated by fusebox from fusebox.yaml. DO NOT EDIT."
    assert header in first["rules/fusebox.rules.yml"].decode().splitlines()[0]
    # --check against the other spelling reports no drift
    monkeypatch.chdir(home)
    rc, _, err = _generate("fusebox.yaml", tmp_path / "out-0", "--check")
    assert rc == 0, err


def test_an_unknown_level_is_a_spec_error_not_a_dashboard_crash(tmp_path, old_out):
    # Found by the property test: "level: 0engine" passed the spec and crashed the dashboards.
    text = BASE.replace("    level: engine\n", "    level: 0engine\n", 1)
    assert text != BASE
    _assert_refused(tmp_path, old_out, text, "level: 0engine", "level")
