"""Run the real Prometheus tools on generated output (``fusebox check``).

``promtool check rules``, ``promtool test rules`` (under every promtool found: Debian's 2.42
on PATH and the pinned Prometheus 3 build), VictoriaMetrics' ``vmalert -dryRun`` and
``vmalert-tool unittest`` on the vmalert test file (the pinned build; required when
``global.rule_engine`` is ``victoriametrics``, run whenever it is installed), Thanos' ``thanos
tools rules-check`` on the rules as written (the pinned build; required when the engine is
``thanos``, run whenever it is installed), ``amtool check-config`` and the routing tests (``amtool config routes test``). The rule tools read a copy
of the rules without Thanos' ``partial_response_strategy``, which they refuse. Failures are reported against the spec entry that produced
them (``fusebox.yaml:LINE:COL: ...``). A missing or too-old tool is a one-line message that
says how to install it.

With captures (``--against``), the generated rules' selectors that match no captured series
fail the check too (:mod:`fusebox.generator.deadselectors`, which also serves
``fusebox check --rules`` on any rule file).
"""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml

from fusebox import conventions as C
from fusebox.signal_kinds import records
from fusebox.spec import Spec
from fusebox.tooling import ToolMissing, thanos_tool, tools_dir, victoriametrics_tool

from . import deadselectors
from .outputs import ALERTMANAGER_FILE, ROUTE_TEST_FILE, RULE_FILE, RULE_TEST_FILE, SLO_TEST_FILE, SLO_VMALERT_TEST_FILE, VMALERT_RULE_TEST_FILE
from .rule_engines import promtool_text

# The generated files the checks read (vmalert-tool's test only for the VictoriaMetrics engine).
CHECKED_FILES = (RULE_FILE, RULE_TEST_FILE, VMALERT_RULE_TEST_FILE, ALERTMANAGER_FILE, ROUTE_TEST_FILE)
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


@functools.cache
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
    return ToolResult(" ".join([_label(cmd[0])] + cmd[1:]), p.returncode == 0, (p.stdout + p.stderr).strip())


def _label(binary: str) -> str:
    """``promtool 3.16``: the binary's name and, where it prints one, its major.minor version."""
    v = _version(binary)
    return Path(binary).name + (f" {'.'.join(map(str, v))}" if v else "")


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


@contextlib.contextmanager
def rules_for_tools(out_dir: Path) -> Iterator[Path]:
    """The folder of the rule file and its tests as promtool and vmalert read them: ``out_dir``'s
    ``rules/`` itself, or, when the rules carry Thanos' ``partial_response_strategy`` (which both
    refuse as an unknown field), a temporary copy without it, removed on exit."""
    src = out_dir / Path(RULE_FILE).parent
    stripped = promtool_text((out_dir / RULE_FILE).read_text(encoding="utf-8"))
    if stripped is None:
        yield src
        return
    with tempfile.TemporaryDirectory(prefix="fusebox-rules-") as tmp:
        dst = Path(tmp) / src.name
        shutil.copytree(src, dst)
        (dst / Path(RULE_FILE).name).write_text(stripped, encoding="utf-8")
        yield dst


def check_rules_and_tests(out_dir: Path, binaries: list[str]) -> list[ToolResult]:
    results = []
    with rules_for_tools(out_dir) as rules:
        for b in binaries:
            results.append(_run([b, "check", "rules", str(rules / Path(RULE_FILE).name)]))
            # run from rules/ so the test file's relative rule_files path resolves
            results.append(_run([b, "test", "rules", Path(RULE_TEST_FILE).name], cwd=rules))
            if (rules / Path(SLO_TEST_FILE).name).exists():  # the SLOs' burn-rate cases (generator/render_slo.py)
                results.append(_run([b, "test", "rules", Path(SLO_TEST_FILE).name], cwd=rules))
    return results


def vmalert_tools() -> tuple[str, str]:
    """The pinned ``vmalert`` and ``vmalert-tool`` (:func:`fusebox.tooling.victoriametrics_tool`).

    Raises:
        ToolMissing: either is not built; the message says to run ``make tools``.
    """
    return str(victoriametrics_tool("vmalert")), str(victoriametrics_tool("vmalert-tool"))


def check_vmalert(out_dir: Path, vmalert: str, vmalert_tool: str) -> list[ToolResult]:
    """``vmalert -dryRun -rule=RULES`` (vmalert parses the rules and their templates) and
    ``vmalert-tool unittest --files=VMALERT-TESTS`` (the generated tests, on its own in-process
    VictoriaMetrics)."""
    with rules_for_tools(out_dir) as rules:
        results = [_run([vmalert, "-dryRun", f"-rule={rules / Path(RULE_FILE).name}"]),
                   # run from rules/ (the tool's scratch storage goes to the temporary folder)
                   _run([vmalert_tool, "unittest", f"--files={Path(VMALERT_RULE_TEST_FILE).name}"], cwd=rules)]
        if (rules / Path(SLO_VMALERT_TEST_FILE).name).exists():  # the SLOs' burn-rate cases (generator/render_slo.py)
            results.append(_run([vmalert_tool, "unittest", f"--files={Path(SLO_VMALERT_TEST_FILE).name}"], cwd=rules))
        return results


def check_thanos(out_dir: Path, thanos: str) -> list[ToolResult]:
    """``thanos tools rules-check --rules=RULES``: Thanos Ruler's own parse of the rule file as
    written (``partial_response_strategy`` must be ``abort`` or ``warn``; Prometheus' rule checks
    beside it)."""
    return [_run([thanos, "tools", "rules-check", f"--rules={out_dir / RULE_FILE}"])]


def check_alertmanager(out_dir: Path, amtool: str) -> list[ToolResult]:
    cfg = out_dir / ALERTMANAGER_FILE
    results = [_config_loads(cfg, amtool)]
    if not results[0].ok:
        return results
    tests = yaml.safe_load((out_dir / ROUTE_TEST_FILE).read_text(encoding="utf-8"))["tests"]
    for t in tests:
        labels = [f"{k}={v}" for k, v in t["labels"].items()]
        r = _run([amtool, "config", "routes", "test", f"--config.file={cfg}",
                  f"--verify.receivers={','.join(t['receivers'])}", *labels])
        results.append(r)
    return results


def people_receiver_notifies(config: Path, spec: Spec) -> ToolResult:
    """Whether the config's receiver named like ``fuse.human_receiver`` has at least one non-empty
    ``*_configs`` list (a receiver without one notifies nobody: fusebox's alerts would be lost)."""
    name = spec.human_receiver["name"]
    check = f"people's receiver {name!r} has configs (fuse.human_receiver)"
    try:
        doc = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        return ToolResult(check, False, f"cannot read {config}: {e}")
    receivers = doc.get("receivers") if isinstance(doc, dict) else None
    found = [r for r in receivers or [] if isinstance(r, dict) and r.get("name") == name]
    if not found:
        return ToolResult(check, False, f"{config} has no receiver named {name!r}")
    if not any(k.endswith("_configs") and v for k, v in found[0].items()):
        return ToolResult(check, False, f"receiver {name!r} of {config} has no *_configs: fusebox's alerts notify "
                                        "nobody -- set fuse.human_receiver.name to a receiver with configs, or give "
                                        "it configs, and merge again")
    return ToolResult(check, True, "")


def operator_prefix(doc: object, spec: Spec) -> str | None:
    """``<namespace>/<AlertmanagerConfig>/`` when ``doc`` (an Alertmanager config as data) is one the
    Prometheus Operator rendered with fusebox's AlertmanagerConfig in it (its fuse receiver named
    ``<namespace>/<object>/<fuse.receiver>``), else None."""
    receivers = doc.get("receivers") if isinstance(doc, dict) else None
    for r in receivers or []:
        name = r.get("name") if isinstance(r, dict) else None
        if isinstance(name, str) and name.count("/") == 2 and name.endswith("/" + spec.receiver):
            return name[: -len(spec.receiver)]
    return None


def _notifying(doc: dict) -> set[str]:
    """Names of the config's receivers with at least one non-empty ``*_configs``."""
    return {r["name"] for r in doc.get("receivers") or [] if isinstance(r, dict)
            and any(k.endswith("_configs") and v for k, v in r.items())}


def _operator_route(doc: dict, prefix: str) -> str:
    """The top-level route the operator made of fusebox's AlertmanagerConfig, as text for a failure."""
    for r in (doc.get("route") or {}).get("routes") or []:
        if isinstance(r, dict) and str(r.get("receiver", "")).startswith(prefix):
            return f"route.routes[] receiver={r['receiver']} matchers={r.get('matchers')}"
    return f"no route of route.routes leads to a receiver of AlertmanagerConfig {prefix.rstrip('/')}"


def _config_loads(config: Path, amtool: str) -> ToolResult:
    """``amtool check-config``; when it fails, its output ends with one line saying that the route
    tests were not run (each would fail on the same error)."""
    r = _run([amtool, "check-config", str(config)])
    if r.ok:
        return r
    return ToolResult(r.name, False, r.output + "\nroute tests not run: amtool cannot load this config -- "
                      "fix the error above, then run fusebox alertmanager test again")


def check_operator_routing(config: Path, doc: dict, prefix: str, spec: Spec, amtool: str) -> list[ToolResult]:
    """amtool on an Alertmanager config the Prometheus Operator rendered (the generated Secret's
    ``alertmanager.yaml``): routes prefixed with the operator's ``namespace`` matcher, receivers
    named ``<namespace>/<AlertmanagerConfig>/<name>``, and, after fusebox's route (``continue:
    true``, forced), the main config's routes, which may reach more receivers.

    Each of this spec's alerts, with the labels the PrometheusRule gives it (``namespace:
    <kubernetes.namespace>``), is run through ``amtool config routes test``: an alert that
    requests a fuse must reach the fuse receiver and a human one (a receiver other than the fuse's
    with at least one ``*_configs``: the AlertmanagerConfig's people, or any of the main config's);
    every other one (warnings, the absent alert, the self-monitoring alerts) a human one and never
    the fuse; the heartbeat the fuse and no human. Each foreign alert never the fuse. A failure
    names the alert, the receivers it reached and the operator's route."""
    from .render_alertmanager import foreign_cases, fusebox_cases

    fuse = prefix + spec.receiver
    humans = _notifying(doc) - {fuse}
    ns = spec.kubernetes.namespace
    where = _operator_route(doc, prefix)
    results = [_config_loads(config, amtool)]
    if not results[0].ok:
        return results

    def route(labels: dict[str, str]) -> tuple[ToolResult, list[str]]:
        r = _run([amtool, "config", "routes", "test", f"--config.file={config}",
                  *(f"{k}={v}" for k, v in labels.items())])
        return r, (r.output.splitlines()[0].split(",") if r.ok and r.output else [])

    for case in fusebox_cases(spec):
        labels = {**case["labels"], "namespace": case["labels"].get("namespace", ns)}
        r, got = route(labels)
        wants_fuse = spec.receiver in case["receivers"]
        heartbeat = labels.get("alertname") == C.HEARTBEAT_ALERT
        people = [g for g in got if g in humans]
        problems = []
        if wants_fuse and fuse not in got:
            problems.append(f"it does not reach the fuse receiver {fuse!r}")
        if not wants_fuse and fuse in got:
            problems.append(f"it reaches the fuse receiver {fuse!r}")
        if heartbeat and people:
            problems.append(f"it reaches people ({', '.join(people)}) every heartbeat interval")
        if not heartbeat and not people:
            others = [g for g in got if g != fuse]
            problems.append("it reaches no human receiver (" + (f"{', '.join(others)}: no *_configs, nobody is told"
                                                                 if others else "no receiver but the fuse's") + ")")
        alert = " ".join(f"{k}={v}" for k, v in labels.items())
        out = r.output if not r.ok else (f"alert {alert}\n reached: {', '.join(got) or '-'}\n " + "; ".join(problems)
                                          + f"\n fusebox's route: {where}")
        results.append(ToolResult(f"{case['name']} (operator-rendered: {prefix.rstrip('/')})", r.ok and not problems,
                                  out))
    for case in foreign_cases(spec):
        labels = {**case["labels"], "namespace": case["labels"].get("namespace", ns)}
        r, got = route(labels)
        ok = r.ok and fuse not in got
        results.append(ToolResult(f"{case['name']} (never {fuse})", ok,
                                  r.output if not r.ok else f"alert {labels}\n reached: {', '.join(got)}"))
    return results


def check_routing(config: Path, spec: Spec, amtool: str) -> list[ToolResult]:
    """amtool on any config that holds fusebox's routing: the standalone one, one that
    ``fusebox alertmanager merge`` wrote, or one the Prometheus Operator rendered from
    ``k8s/alertmanagerconfig.yml`` (:func:`check_operator_routing`). ``check-config``; the people's receiver has configs
    (:func:`people_receiver_notifies`); each of this spec's own alerts reaches
    exactly the receivers of the standalone config (the fuse tiers the fuse receiver and the
    people, the rest the people); each foreign alert (another team's critical, Watchdog, our labels
    without the marker or with another spec's) reaches whatever the config says, never the fuse."""
    from .render_alertmanager import foreign_cases, fusebox_cases

    try:
        doc = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        doc = None  # amtool check-config says what is wrong with it
    prefix = operator_prefix(doc, spec)
    if prefix is not None and isinstance(doc, dict):
        return check_operator_routing(config, doc, prefix, spec, amtool)
    loads = _config_loads(config, amtool)
    if not loads.ok:
        return [loads]
    results = [loads, people_receiver_notifies(config, spec)]
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


T = TypeVar("T")


def _engine_tool(spec: Spec, engine: str, what: str, find: Callable[[], T], stream) -> T | None:
    """``find()``, or None (saying the checks are skipped) when the tool is not built.

    Raises:
        ToolMissing: the tool is missing and ``global.rule_engine`` is ``engine``: its own checks
            are not optional then.
    """
    try:
        return find()
    except ToolMissing as e:
        if spec.rule_engine == engine:
            raise ToolMissing(f"global.rule_engine is {engine}: {e}") from e
        print(f"skip {what} checks: {e}", file=stream)
        return None


def _report(r: ToolResult, spec: Spec, stream) -> int:
    """Print one check's line (and its output, attributed to the spec, when it failed); 1 if it failed."""
    print(f"{'ok  ' if r.ok else 'FAIL'} {r.name}", file=stream, flush=True)
    if r.ok:
        return 0
    print("     " + r.output.replace("\n", "\n     "), file=stream)
    for line in _attribute(r.output, spec):
        print(f"     {line}", file=stream)
    if "test rules" in r.name or "unittest" in r.name:
        print("     (if you edited the spec, run `fusebox generate` first: the tests check the generated rules)",
              file=stream)
    return 1


def run_checks(spec: Spec, out_dir: Path, promtools: list[str] | None = None,
               captures: list[str] | None = None, allow_dead: Iterable[str] = (), stream=sys.stdout,
               prior: tuple[int, int] = (0, 0)) -> int:
    """Run every check; print one line per check and details for failures.

    With ``captures``, every selector of the generated rules that matches no captured series
    (less those ``allow_dead`` excuses) is a failure too. ``prior``: (passed, failed) checks the
    caller ran and printed before these (``fusebox check``'s own), added to the last line's counts.

    Returns:
        0 all passed; 1 a check failed or a selector is dead; 2 missing generated files, an
        unreadable capture or a bad ``allow_dead``; 3 a tool is missing.
    """
    try:
        binaries = globals()["promtools"](promtools)
        amtool = find_tool("amtool", MIN_AMTOOL)
    except ToolMissing as e:
        print(f"fusebox check: {e}", file=sys.stderr)
        return 3
    try:
        vm = _engine_tool(spec, "victoriametrics", "vmalert", vmalert_tools, stream)
        thanos = _engine_tool(spec, "thanos", "Thanos", lambda: str(thanos_tool()), stream)
    except ToolMissing as e:
        print(f"fusebox check: {e}", file=sys.stderr)
        return 3
    missing = [p for p in (RULE_FILE, RULE_TEST_FILE, ALERTMANAGER_FILE, ROUTE_TEST_FILE)
               + ((VMALERT_RULE_TEST_FILE,) if vm else ()) if not (out_dir / p).exists()]
    if missing:
        print(f"fusebox check: {', '.join(missing)} not found under {out_dir}/ -- run `fusebox generate --out {out_dir}` first",
              file=sys.stderr)
        return 2
    caps = None
    if captures:
        try:
            caps = deadselectors.load_captures(captures)
            for a in allow_dead:
                deadselectors.parse_selector(a)
        except deadselectors.InputError as e:
            print(str(e), file=sys.stderr)
            return 2
        except ValueError as e:
            print(f"fusebox check: --allow-dead {e} -- pass a selector as the rule writes it", file=sys.stderr)
            return 2
    # each tool family reports as it ends; a line on stderr says what runs before the slow ones
    steps: list[tuple[str, Callable[[], list[ToolResult]]]] = [
        (f"{', '.join(_label(b) for b in binaries)}: check rules, test rules (the generated cases: a minute or "
         "more each)", lambda: check_rules_and_tests(out_dir, binaries))]
    if vm:
        steps.append(("vmalert -dryRun, vmalert-tool unittest (a minute or more)", lambda: check_vmalert(out_dir, *vm)))
    if thanos:
        steps.append(("thanos tools rules-check", lambda: check_thanos(out_dir, thanos)))
    steps.append(("amtool check-config, route tests", lambda: check_alertmanager(out_dir, amtool)))
    results: list[ToolResult] = []
    failed = 0
    for what, run in steps:
        print(f"fusebox check: running {what}", file=sys.stderr, flush=True)
        for r in run():
            results.append(r)
            failed += _report(r, spec, stream)
    if caps is not None:
        rules = deadselectors.load_rules(out_dir / RULE_FILE)
        rep = deadselectors.dead_selectors(rules, caps, allow_dead)
        deadselectors.report(rep, len(rules), len(caps.files), stream)
        failed += bool(rep.dead)
        if any(d.selector.startswith(("hw_", "fusebox_")) for d in rep.dead):
            print("     hint: fusebox_* and hw_* series come from the fusebox collectors through the Collector, never from an "
                  "engine's own /metrics; capture `fusebox collect ... --once` output (or the Collector's /metrics) too",
                  file=stream)
    print(f"{len(results) + (caps is not None) - failed + prior[0]} passed, {failed + prior[1]} failed", file=stream)
    return 1 if failed else 0
