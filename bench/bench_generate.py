"""Benchmark `fusebox generate`: the shipped spec and generated specs of 100 and 1,000 signals.

For each spec size, in a fresh process each:

* ``cli s``: wall time of the whole command, ``python -m fusebox.cli generate --spec S --out D``,
  interpreter start and imports included (what a user waits for); ``peak MiB``: its peak RSS;
* ``load s`` / ``render s`` / ``write s``: the same work in-process, phase by phase (imports apart).

The same runs are made, in the same invocation, on the baseline revision (:data:`BASELINE`, the
main of issue 9, checked out from git into a temporary folder), and the ratio old / new is printed
beside each figure: these machines are shared and noisy, so only a side-by-side ratio means much.
Issue 9's targets: 1,000 signals under 5 s and the shipped spec under 0.5 s, CLI start included;
growth linear in the number of signals.

    python bench/bench_generate.py            # baseline and current
    python bench/bench_generate.py --no-baseline
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "5db6eb6"  # main when issue 9 was filed: 21.9 s for 1,000 signals, 0.7 s for the shipped spec
RECORDED = {"shipped": 0.7, "1000 signals": 21.9}  # the figures for the baseline (s)
TARGET = {"shipped": 0.5, "1000 signals": 5.0}

PHASES = r"""
import json, sys, time, tempfile
from pathlib import Path
t0 = time.perf_counter()
try:
    from fusebox.spec import load_spec
except ImportError:  # the baseline kept the spec in the generator package
    from fusebox.generator.spec import load_spec
from fusebox.generator.outputs import render_all
from fusebox.generator.writer import write_outputs
t1 = time.perf_counter()
spec = load_spec(sys.argv[1])
t2 = time.perf_counter()
out = render_all(spec)
t3 = time.perf_counter()
with tempfile.TemporaryDirectory() as d:
    write_outputs(out, Path(d))
t4 = time.perf_counter()
print(json.dumps({"signals": len(spec.signals), "files": len(out), "bytes": sum(len(v) for v in out.values()),
                  "import_s": t1 - t0, "load_s": t2 - t1, "render_s": t3 - t2, "write_s": t4 - t3}))
"""


# Keys added since the baseline, at their defaults: left out so that both revisions read one spec.
NEW_DEFAULT_KEYS = ("  allow_fleet_wide_alerts: false",)


def shipped_text() -> str:
    """The shipped spec without :data:`NEW_DEFAULT_KEYS` (the same spec to both revisions)."""
    return "".join(line for line in (ROOT / "fusebox.yaml").read_text().splitlines(keepends=True)
                   if line.rstrip("\n") not in NEW_DEFAULT_KEYS)


def make_spec(n: int, path: Path) -> None:
    """A spec of ``n`` signals: the shipped spec's signals repeated, each with its own name and alert."""
    base = yaml.safe_load(shipped_text())
    templates = list(base["signals"].items())
    signals = {}
    for i in range(n):
        name, sig = templates[i % len(templates)]
        sig = json.loads(json.dumps(sig))
        sig["alert"] = f"{sig['alert']}N{i}"
        signals[f"{name}_{i}"] = sig
    base["signals"] = signals
    path.write_text(yaml.safe_dump(base, sort_keys=False))


def _env(pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def cli_run(spec: Path, pythonpath: str | None) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one ``fusebox generate`` in a fresh process."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "fusebox.cli", "generate", "--spec", str(spec), "--out", out],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(pythonpath), cwd=spec.parent)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err = proc.stderr.read().decode() if proc.stderr else ""
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"fusebox generate failed on {spec}:\n{err}")
    return wall, usage.ru_maxrss / 1024


def phase_run(spec: Path, pythonpath: str | None) -> dict:
    r = subprocess.run([sys.executable, "-c", PHASES, str(spec)], capture_output=True, text=True, env=_env(pythonpath),
                       cwd=ROOT, check=True)
    return json.loads(r.stdout)


def baseline_tree(tmp: Path) -> str | None:
    """PYTHONPATH that imports the baseline revision as ``fusebox``, or None without git history."""
    src = tmp / "src"
    src.mkdir()
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pkg = tmp / "pkg"
    shutil.copytree(src / "fusebox", pkg / "fusebox")
    # the baseline's package-dir mapping, as its pyproject.toml states it
    for folder, name in (("generator", "generator"), ("collectors", "collectors"), ("fuse", "fuse")):
        (pkg / "fusebox" / name).symlink_to(src / folder, target_is_directory=True)
    return str(pkg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-baseline", action="store_true", help="measure the current tree only")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        shipped = tmp / "fusebox.yaml"
        shipped.write_text(shipped_text())
        specs = [("shipped", shipped)]
        for n in (100, 1000):
            p = tmp / f"spec{n}.yaml"
            make_spec(n, p)
            specs.append((f"{n} signals", p))
        base_path = None if args.no_baseline else baseline_tree(tmp)
        if not args.no_baseline and base_path is None:
            print(f"(no git history: baseline {BASELINE} not measured; the issue's figures are shown instead)")
        rows = []
        for label, spec in specs:
            # alternate old and new so both see the same machine load
            new_cli = cli_run(spec, None)
            old_cli = cli_run(spec, base_path) if base_path else None
            new = phase_run(spec, None)
            old = phase_run(spec, base_path) if base_path else None
            rows.append((label, new_cli, old_cli, new, old))

    print(f"{'spec':<13} {'signals':>7} {'files':>5} {'MiB out':>7} | {'cli s':>6} {'peak MiB':>8} | {'import':>6} {'load':>6} "
          f"{'render':>6} {'write':>6} | {'baseline cli s':>14} {'speed-up':>8} | {'target':>6}")
    for label, (cli_s, peak), old_cli, r, old in rows:
        base = f"{old_cli[0]:>14.2f} {old_cli[0] / cli_s:>7.1f}x" if old_cli else f"{'-':>14} {'-':>8}"
        tgt = TARGET.get(label)
        met = "" if tgt is None else ("met" if cli_s < tgt else "not met")
        print(f"{label:<13} {r['signals']:>7} {r['files']:>5} {r['bytes'] / 2**20:>7.2f} | {cli_s:>6.2f} {peak:>8.1f} | "
              f"{r['import_s']:>6.2f} {r['load_s']:>6.2f} {r['render_s']:>6.2f} {r['write_s']:>6.2f} | {base} | "
              f"{'' if tgt is None else f'< {tgt:g} s':>6} {met}")
    print()
    for label, (cli_s, _), old_cli, _r, _old in rows:
        if label in RECORDED:
            print(f"{label}: {cli_s:.2f} s now; {RECORDED[label]} s recorded for the baseline when the target was set "
                  f"({RECORDED[label] / cli_s:.1f}x)" + (f"; measured here {old_cli[0]:.2f} s ({old_cli[0] / cli_s:.1f}x)"
                                                             if old_cli else ""))
    first = rows[0]
    for label, (cli_s, peak), _o, r, _old in rows[1:]:
        k = r["signals"] / first[3]["signals"]
        render_per = r["render_s"] / r["signals"]
        print(f"{label}: {k:.0f}x the signals -> {cli_s / first[1][0]:.1f}x the CLI time, {peak / first[1][1]:.1f}x the peak "
              f"memory; render {1000 * render_per:.2f} ms per signal")


if __name__ == "__main__":
    main()
