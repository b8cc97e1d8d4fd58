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

Both revisions read one spec: the baseline's own ``fusebox.yaml`` (:data:`BASELINE_SPEC`, pinned
from that revision; today's spec carries keys the baseline refuses, while today's loader reads the
old spec), and the 100 / 1,000 signal specs are built from it. The row ``today's spec`` is today's
shipped spec on the current tree only.

    python bench/bench_generate.py            # baseline and current
    python bench/bench_generate.py --no-baseline
    python bench/bench_generate.py --quick    # one small generated spec (10 signals): a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

# Run first in every measured process: it drops an editable install's import hook, which maps
# ``fusebox.*`` to the tree it was installed from; each side imports the tree on its PYTHONPATH
# (this checkout's, or the baseline's), so a module the baseline lacks (``fusebox.spec``) cannot
# come from today's code and a clone measures its own code.
ISOLATE = r"""
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
"""

CLI = ISOLATE + r"""
import runpy
sys.argv[0] = "fusebox"
runpy.run_module("fusebox.cli", run_name="__main__", alter_sys=True)
"""

PHASES = ISOLATE + r"""
import json, sys, time, tempfile
from pathlib import Path
t0 = time.perf_counter()
try:
    from fusebox.spec import load_spec
except ImportError:  # the baseline kept the spec in the generator package
    from fusebox.generator.spec import load_spec
from fusebox.generator import outputs
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
                  "source": outputs.__file__, "import_s": t1 - t0, "load_s": t2 - t1, "render_s": t3 - t2, "write_s": t4 - t3}))
"""


# The baseline's own fusebox.yaml, `git show 5db6eb6:fusebox.yaml`, kept in the tree so that a
# clone without that history still runs the current side on the same spec.
BASELINE_SPEC = ROOT / "bench" / "fixtures" / "baseline-5db6eb6.yaml"


# Two of its runbook queries named records no rule wrote, which today's loader refuses (a
# record-shaped name no rule records is a spec error); both revisions read them as the record the
# rules do write, which the baseline takes as it took any text.
RECORD = re.compile(r"[a-zA-Z_]\w*:[a-zA-Z_]\w*:\w+")  # level:metric:operations, alone in a query
STALE_RECORDS = {"engine:fusebox_kv_cache_growth_rate:deriv1m": "engine:fusebox_kv_cache_usage_bytes:deriv1m",
                 "engine:fusebox_kv_cache_growth_oom:deriv1m": "engine:fusebox_kv_cache_usage_bytes:deriv1m"}


def shipped_text() -> str:
    """The baseline's shipped spec (:data:`BASELINE_SPEC`), its two stale record names replaced
    (:data:`STALE_RECORDS`): the one spec both revisions accept."""
    text = BASELINE_SPEC.read_text()
    for stale, recorded in STALE_RECORDS.items():
        text = text.replace(f"query: {stale}\n", f"query: {recorded}\n")
    return text


def make_spec(n: int, path: Path) -> None:
    """A spec of ``n`` signals: the baseline spec's signals repeated, each with its own name and alert.

    Each deriv copy gets its own window (60 s + its index): today two deriv signals over one
    gauge and window share one record and one rule group, and hundreds of copies in one group
    would be one chain over the 20 rules a group may hold (``ChainTooLong``); with their own
    windows the copies stay independent signals, on both revisions alike. A copy's runbook keeps
    the diagnosis queries that read raw metrics and drops those that name one of the original's
    records: the copy's records have other names, and today a record-shaped name no rule records
    is a spec error (both revisions read the same copies)."""
    base = yaml.safe_load(shipped_text())
    templates = list(base["signals"].items())
    signals = {}
    for i in range(n):
        name, sig = templates[i % len(templates)]
        sig = json.loads(json.dumps(sig))
        sig["alert"] = f"{sig['alert']}N{i}"
        if sig.get("kind") == "deriv":
            sig["window"] = f"{60 + i}s"
        runbook = sig.get("runbook") or {}
        if runbook.get("diagnosis"):
            runbook["diagnosis"] = [d for d in runbook["diagnosis"] if not RECORD.fullmatch(d.get("query", "").strip())]
        signals[f"{name}_{i}"] = sig
    base["signals"] = signals
    path.write_text(yaml.safe_dump(base, sort_keys=False))


def _env(pythonpath: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath
    return env


def cli_run(spec: Path, pythonpath: str) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one ``fusebox generate`` in a fresh process.

    Its stderr goes to a file, not a pipe: a large spec's warnings would fill a pipe nobody reads
    while the process is waited for, and block it."""
    with tempfile.TemporaryDirectory() as out, tempfile.TemporaryFile() as err_file:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CLI, "generate", "--spec", str(spec), "--out", out],
                                stdout=subprocess.DEVNULL, stderr=err_file, env=_env(pythonpath), cwd=out)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status) != 0:
            err_file.seek(0)
            raise SystemExit(f"fusebox generate failed on {spec}:\n{err_file.read().decode(errors='replace')[-4000:]}")
    return wall, usage.ru_maxrss / 1024


def phase_run(spec: Path, pythonpath: str) -> dict:
    """Import / load / render / write seconds of one in-process run, in a fresh interpreter.

    It runs in an empty folder, not the repository: ``python -c`` puts its working folder first on
    ``sys.path``, and from the repository that would import the checkout's ``fusebox`` folder.
    Raises SystemExit when the run imported the renderer from outside ``pythonpath``.
    """
    with tempfile.TemporaryDirectory() as cwd:
        r = subprocess.run([sys.executable, "-c", PHASES, str(spec)], capture_output=True, text=True, env=_env(pythonpath),
                           cwd=cwd)
    if r.returncode != 0:
        raise SystemExit(f"the in-process run on {spec} ({pythonpath}) failed:\n{r.stderr}")
    out = json.loads(r.stdout)
    if not Path(out["source"]).is_relative_to(pythonpath):
        raise SystemExit(f"the run imported {out['source']}, not the tree under {pythonpath}")
    return out


def package_tree(src: Path, pkg: Path) -> str:
    """PYTHONPATH that imports the source tree ``src`` as ``fusebox`` (built under ``pkg``).

    Both revisions map their folders the same way (pyproject.toml's package-dir): ``fusebox/`` is
    the package and ``generator/``, ``collectors/``, ``fuse/`` its subpackages of those names.
    """
    shutil.copytree(src / "fusebox", pkg / "fusebox", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("generator", "collectors", "fuse"):
        (pkg / "fusebox" / name).symlink_to(src / name, target_is_directory=True)
    return str(pkg)


def baseline_tree(tmp: Path) -> str | None:
    """PYTHONPATH that imports the baseline revision as ``fusebox``, or None without git history."""
    src = tmp / "src"
    src.mkdir()
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    return package_tree(src, tmp / "pkg")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-baseline", action="store_true", help="measure the current tree only")
    ap.add_argument("--quick", action="store_true", help="the shipped spec and 10 signals only (a smoke run)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        shipped = tmp / "fusebox.yaml"
        shipped.write_text(shipped_text())
        specs = [("shipped", shipped)]
        for n in (10,) if args.quick else (100, 1000):
            p = tmp / f"spec{n}.yaml"
            make_spec(n, p)
            specs.append((f"{n} signals", p))
        cur = package_tree(ROOT, tmp / "current")
        base_path = None if args.no_baseline else baseline_tree(tmp)
        if not args.no_baseline and base_path is None:
            print(f"(no git history: baseline {BASELINE} not measured; the issue's figures are shown instead)")
        rows = []
        for label, spec in specs:
            # alternate old and new so both see the same machine load
            new_cli = cli_run(spec, cur)
            old_cli = cli_run(spec, base_path) if base_path else None
            new = phase_run(spec, cur)
            old = phase_run(spec, base_path) if base_path else None
            rows.append((label, new_cli, old_cli, new, old))
        today = ROOT / "fusebox.yaml"
        rows.append(("today's spec", cli_run(today, cur), None, phase_run(today, cur), None))

    print(f"{'spec':<13} {'signals':>7} {'files':>5} {'MiB out':>7} | {'cli s':>6} {'peak MiB':>8} | {'import':>6} {'load':>6} "
          f"{'render':>6} {'write':>6} | {'baseline cli s':>14} {'speed-up':>8} | {'target':>6}")
    for label, (cli_s, peak), old_cli, r, _old in rows:
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
    for label, (cli_s, peak), _o, r, _old in rows[1:-1]:  # the generated specs, beside the shipped one
        k = r["signals"] / first[3]["signals"]
        render_per = r["render_s"] / r["signals"]
        print(f"{label}: {k:.0f}x the signals -> {cli_s / first[1][0]:.1f}x the CLI time, {peak / first[1][1]:.1f}x the peak "
              f"memory; render {1000 * render_per:.2f} ms per signal")


if __name__ == "__main__":
    main()
