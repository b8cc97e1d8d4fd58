"""Run the real Prometheus tools on generated output (``fusebox check``).

``promtool check rules``, ``promtool test rules`` (under every promtool found: Debian's 2.42
on PATH and the pinned Prometheus 3 build), ``amtool check-config`` and the routing tests
(``amtool config routes test``). Failures are reported against the spec entry that produced
them (``fusebox.yaml:LINE:COL: ...``). A missing or too-old tool is a one-line message that
says how to install it.

``unmatched_selectors`` reads rule files and /metrics captures and lists every raw selector
that matches no series: promtool passes rules that can never fire (vLLM's own published
rules read ``vllm:num_preemptions`` without ``_total`` and ``le="120"`` where vLLM writes
``le="120.0"``).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from fusebox.spec import Spec
from fusebox.spec.kinds import records
from fusebox.spec.promql import vector_selectors
from fusebox.tooling import ToolMissing, tools_dir

from .outputs import ALERTMANAGER_FILE, ROUTE_TEST_FILE, RULE_FILE, RULE_TEST_FILE

MIN_PROMTOOL = (2, 42)  # keep_firing_for
MIN_AMTOOL = (0, 25)
INSTALL_HINT = {
    "promtool": "install Prometheus >= 2.42 (Debian/Ubuntu: apt-get install prometheus) or run `make tools`",
    "amtool": "install Alertmanager >= 0.25 (Debian/Ubuntu: apt-get install prometheus-alertmanager) or run `make tools`",
}
PINNED_PROMTOOL3 = "promtool-v0.316.0/promtool"


@dataclass
class ToolResult:
    name: str
    ok: bool
    output: str


@functools.lru_cache(maxsize=None)
def _version(binary: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return ()
    m = re.search(r"version (\d+)\.(\d+)", out.stdout + out.stderr)
    return tuple(int(x) for x in m.groups()) if m else ()


def find_tool(name: str, minimum: tuple[int, int]) -> str:
    """Path of ``name`` on PATH, checked against ``minimum``.

    Raises:
        ToolMissing: absent, or older than ``minimum``.
    """
    path = shutil.which(name)
    if not path:
        raise ToolMissing(f"{name} not found on PATH -- {INSTALL_HINT[name]}")
    v = _version(path)
    if v and v[:2] < minimum:
        raise ToolMissing(f"{name} {'.'.join(map(str, v))} is too old (need >= {'.'.join(map(str, minimum))}) -- {INSTALL_HINT[name]}")
    return path


def promtools(explicit: list[str] | None = None) -> list[str]:
    """promtool binaries to test with: ``explicit``, else PATH's and the pinned 3.x build."""
    if explicit:
        return explicit
    found = [find_tool("promtool", MIN_PROMTOOL)]
    pinned = tools_dir() / PINNED_PROMTOOL3
    if pinned.exists():
        found.append(str(pinned))
    return found


def _run(cmd: list[str], cwd: Path | None = None) -> ToolResult:
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600)
    v = _version(cmd[0])
    tool = Path(cmd[0]).name + (f" {'.'.join(map(str, v))}" if v else "")
    return ToolResult(" ".join([tool] + cmd[1:]), p.returncode == 0, (p.stdout + p.stderr).strip())


def _attribute(output: str, spec: Spec) -> list[str]:
    """Map alert names and record names in tool output back to spec positions."""

    from fusebox.spec.positions import load

    text = Path(spec.file).read_text(encoding="utf-8") if Path(spec.file).exists() else ""
    pos = load(text, spec.file)[1] if text else None
    lines = []
    for sig in spec.signals:
        names = [sig.alert] + list(records(sig).values())
        if any(n in output for n in names):
            line, col = pos.at(sig.path, key=True) if pos else (1, 1)
            where = f"{spec.file}:{line}:{col}"
            lines.append(f"{where}: signal {sig.name} ({sig.alert}) is named in the failure above")
    return lines


def check_rules_and_tests(out_dir: Path, binaries: list[str]) -> list[ToolResult]:
    results = []
    for b in binaries:
        results.append(_run([b, "check", "rules", str(out_dir / RULE_FILE)]))
        # run from rules/ so the test file's relative rule_files path resolves
        results.append(_run([b, "test", "rules", Path(RULE_TEST_FILE).name], cwd=out_dir / Path(RULE_TEST_FILE).parent))
    return results


def check_alertmanager(out_dir: Path, amtool: str) -> list[ToolResult]:
    cfg = out_dir / ALERTMANAGER_FILE
    results = [_run([amtool, "check-config", str(cfg)])]
    tests = yaml.safe_load((out_dir / ROUTE_TEST_FILE).read_text(encoding="utf-8"))["tests"]
    for t in tests:
        labels = [f"{k}={v}" for k, v in t["labels"].items()]
        r = _run([amtool, "config", "routes", "test", f"--config.file={cfg}",
                  f"--verify.receivers={','.join(t['receivers'])}", *labels])
        results.append(r)
    return results


def check_routing(config: Path, spec: Spec, amtool: str) -> list[ToolResult]:
    """amtool on any config that holds fusebox's routing: the standalone one, or one that
    ``fusebox alertmanager merge`` wrote. ``check-config``; each of this spec's own alerts reaches
    exactly the receivers of the standalone config (the fuse tiers the fuse receiver and the
    people, the rest the people); each foreign alert (another team's critical, Watchdog, our labels
    without the marker or with another spec's) reaches whatever the config says, never the fuse."""
    from .render_alertmanager import foreign_cases, fusebox_cases

    results = [_run([amtool, "check-config", str(config)])]
    for case in fusebox_cases(spec):
        labels = [f"{k}={v}" for k, v in case["labels"].items()]
        results.append(_run([amtool, "config", "routes", "test", f"--config.file={config}",
                             f"--verify.receivers={','.join(case['receivers'])}", *labels]))
    for case in foreign_cases(spec):
        r = _run([amtool, "config", "routes", "test", f"--config.file={config}",
                  *(f"{k}={v}" for k, v in case["labels"].items())])
        got = r.output.splitlines()[0].split(",") if r.ok and r.output else []
        ok = r.ok and spec.receiver not in got
        results.append(ToolResult(f"{r.name} (never {spec.receiver}: {case['name']})", ok, r.output))
    return results


def run_checks(spec: Spec, out_dir: Path, promtools: list[str] | None = None,
               captures: list[str] | None = None, stream=sys.stdout) -> int:
    """Run every check; print one line per check and details for failures. Exit code 0/1,
    or 3 when a tool is missing."""
    try:
        binaries = globals()["promtools"](promtools)
        amtool = find_tool("amtool", MIN_AMTOOL)
    except ToolMissing as e:
        print(f"fusebox check: {e}", file=sys.stderr)
        return 3
    missing = [p for p in (RULE_FILE, RULE_TEST_FILE, ALERTMANAGER_FILE, ROUTE_TEST_FILE) if not (out_dir / p).exists()]
    if missing:
        print(f"fusebox check: {', '.join(missing)} not found under {out_dir}/ -- run `fusebox generate --out {out_dir}` first",
              file=sys.stderr)
        return 2
    results = check_rules_and_tests(out_dir, binaries) + check_alertmanager(out_dir, amtool)
    failed = 0
    for r in results:
        print(f"{'ok  ' if r.ok else 'FAIL'} {r.name}", file=stream)
        if not r.ok:
            failed += 1
            print("     " + r.output.replace("\n", "\n     "), file=stream)
            for line in _attribute(r.output, spec):
                print(f"     {line}", file=stream)
            if "test rules" in r.name:
                print("     (if you edited the spec, run `fusebox generate` first: the tests check the generated rules)",
                      file=stream)
    if captures:
        rules = yaml.safe_load((out_dir / RULE_FILE).read_text(encoding="utf-8"))
        unmatched = unmatched_selectors(rules, [Path(c) for c in captures])
        for u in unmatched:
            print(f"NONE {u.rule}: selector {u.selector} matches no series in the captures", file=stream)
        print(f"{len(unmatched)} selector(s) match no series in {len(captures)} capture(s)", file=stream)
        if any(u.selector.startswith(("hw_", "fusebox_")) for u in unmatched):
            print("     hint: fusebox_* and hw_* series come from the fusebox collectors through the Collector, never from an "
                  "engine's own /metrics; capture `fusebox collect ... --once` output (or the Collector's /metrics) too",
                  file=stream)
    print(f"{len(results) - failed} passed, {failed} failed", file=stream)
    return 1 if failed else 0


# --------------------------------------------------------------------------- --against
@dataclass(frozen=True)
class Unmatched:
    rule: str
    selector: str


def rule_groups(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Groups of a Prometheus rule file or a PrometheusRule object."""
    if doc.get("kind") == "PrometheusRule":
        return doc["spec"]["groups"]
    return doc.get("groups", [])


def _matches(sel: Any, name: str, labels: dict[str, str]) -> bool:
    import promql_parser

    if sel.name and sel.name != name:
        return False
    for m in sel.matchers.matchers:
        value = labels.get(m.name, "") if m.name != "__name__" else name
        op = m.op
        if op == promql_parser.MatchOp.Equal and value != m.value:
            return False
        if op == promql_parser.MatchOp.NotEqual and value == m.value:
            return False
        if op == promql_parser.MatchOp.Re and not re.fullmatch(m.value, value):
            return False
        if op == promql_parser.MatchOp.NotRe and re.fullmatch(m.value, value):
            return False
    return True


def load_capture_series(paths: Iterable[Path]) -> list[tuple[str, dict[str, str]]]:
    """Every sample (name, labels) in /metrics captures, parsed by prometheus-client."""
    from prometheus_client.parser import text_string_to_metric_families

    series = []
    for p in paths:
        text = p.read_text(encoding="utf-8", errors="replace")
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                series.append((s.name, dict(s.labels)))
    return series


# Series Prometheus makes itself: never in a target's /metrics.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
             "scrape_series_added", "ALERTS", "ALERTS_FOR_STATE"}


def unmatched_selectors(doc: dict[str, Any], captures: list[Path]) -> list[Unmatched]:
    """Selectors of raw metrics (not produced by a recording rule in ``doc``, nor made by
    Prometheus itself such as ``up``) matching no series in ``captures``."""
    series = load_capture_series(captures)
    groups = rule_groups(doc)
    recorded = {r["record"] for g in groups for r in g.get("rules", []) if "record" in r}
    out: list[Unmatched] = []
    seen = set()
    for g in groups:
        for r in g.get("rules", []):
            name = r.get("alert") or r.get("record")
            for sel in vector_selectors(str(r["expr"])):
                if sel.name in recorded or not sel.name or sel.name in SYNTHETIC:
                    continue
                text = str(sel)
                if (name, text) in seen:
                    continue
                seen.add((name, text))
                if not any(_matches(sel, n, lab) for n, lab in series):
                    out.append(Unmatched(name, text))
    return out
