"""`fusebox generate`, `fusebox check` and `fusebox alertmanager`; and `fusebox budget` (the computation in :mod:`.budget`)."""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="write the spec's outputs: rules and their tests, runbooks, dashboards, Alertmanager, "
                                        "Collector and Grafana config, k8s/ manifests, in-path gateway flags")
    g.add_argument("--spec", default="fusebox.yaml", help="spec file (default: fusebox.yaml)")
    g.add_argument("--out", default=".", help="output directory (default: .)")
    g.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when files under --out differ from what the spec generates")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser(
        "check", help="check the generated files (promtool, amtool, vmalert and thanos when built; the reaction budget, "
                      "in-path shedders and scaling order); with --against, rule selectors that match no series",
        description="With --spec (the default): every file `fusebox generate` writes is what the spec generates now (else "
        "run `fusebox generate` first), the reaction budget (docs/budget.md), the in-path shedders against "
        "their fuse (docs/inpath.md) and the scalers against both (docs/scaling.md), then promtool check/test rules "
        "(every promtool found), vmalert -dryRun and vmalert-tool unittest, thanos tools rules-check (each when built by `make tools`; required when "
        "global.rule_engine names its engine), amtool check-config and route tests on the "
        "generated files, failures named against the spec. With --rules FILE... --against CAPTURE...: any Prometheus "
        "rule file or PrometheusRule, no spec; every selector that matches no series in the captures is named with why. "
        "Exit status: 0 all passed, 1 a check failed or a selector is dead, 2 bad input, 3 a tool is missing.")
    c.add_argument("--spec", default="fusebox.yaml", help="spec file (default: fusebox.yaml; not read with --rules)")
    c.add_argument("--out", default=".", help="directory holding the generated files (default: .)")
    c.add_argument("--promtool", action="append", default=None,
                   help="promtool binary to use (repeatable; default: promtool on PATH plus the pinned Prometheus 3 build if present)")
    c.add_argument("--against", nargs="+", metavar="CAPTURE",
                   help="Prometheus text-format /metrics captures: every rule selector matching no series in them fails "
                        "the check (exit 1)")
    c.add_argument("--rules", nargs="+", metavar="FILE",
                   help="check these rule files (Prometheus rule files or PrometheusRule manifests) --against captures "
                        "instead of the generated output; needs no spec")
    c.add_argument("--allow-dead", action="append", default=[], metavar="SELECTOR",
                   help="a selector known to match no series, e.g. 'vllm:num_preemptions' (repeatable): not a failure")
    c.set_defaults(func=cmd_check)

    a = sub.add_parser("alertmanager", help="merge: fusebox's route and receivers into your Alertmanager config; "
                                            "test: amtool route tests on a config holding them")
    asub = a.add_subparsers(dest="alertmanager_command", required=True, metavar="ACTION")
    m = asub.add_parser("merge", help="the base config with fusebox's route first under route.routes, its receivers and "
                                      "inhibit rule added (docs/alertmanager.md)")
    m.add_argument("--base", required=True, help="the Alertmanager config to merge into (the file Alertmanager loads)")
    m.add_argument("--spec", default="fusebox.yaml", help="spec file (default: fusebox.yaml)")
    m.add_argument("--out", help="write the merged config here, atomically, with the base's permissions "
                                 "(default: standard output; not the base itself)")
    m.add_argument("--allow-silent-people", action="store_true",
                   help="merge even when fuse.human_receiver is a bare name the base lacks (a receiver without "
                        "configs: fusebox's alerts then notify nobody)")
    m.set_defaults(func=cmd_alertmanager_merge)
    t = asub.add_parser("test", help="amtool on a config holding fusebox's routing (a merged one, or the one the "
                                     "Prometheus Operator rendered): ours reach the fuse and the people, foreign "
                                     "alerts never the fuse")
    t.add_argument("--config", required=True, help="the Alertmanager config to test (the output of merge, or the "
                                                   "alertmanager.yaml of the operator's generated Secret)")
    t.add_argument("--spec", default="fusebox.yaml", help="spec file (default: fusebox.yaml)")
    t.set_defaults(func=cmd_alertmanager_test)

    _register_budget(sub)


def _load(spec_path: str, command: str):
    """The spec at ``spec_path``, or None after saying on standard error why not: ``fusebox
    COMMAND: PATH: no such file -- ...`` for a file that cannot be read, one ``PATH:LINE:COL`` line
    per problem of a bad spec."""
    from fusebox.spec import load_spec
    from fusebox.spec.errors import SpecError, unreadable

    try:
        return load_spec(spec_path)
    except (OSError, UnicodeDecodeError) as e:
        fix = ("pass --spec PATH, or run from the directory holding fusebox.yaml (`fusebox init` writes a starter one)"
               if isinstance(e, FileNotFoundError) else "pass --spec with a readable YAML file")
        print(f"fusebox {command}: {unreadable(spec_path, e, fix)}", file=sys.stderr)
    except SpecError as e:
        for p in e.problems:
            print(str(p), file=sys.stderr)
    return None


def cmd_generate(args: argparse.Namespace) -> int:
    from .outputs import render_all, spec_warnings
    from .writer import WriteError, drift, write_outputs

    # A one-shot batch: the spec, the rules and the YAML node trees are millions of small objects
    # that live until the end, and none of them is cyclic garbage; the cyclic collector would scan
    # them again and again as they grow (a 1,000-signal spec rendered 1.2x slower with it on).
    gc.disable()
    spec = _load(args.spec, "generate")
    if spec is None:
        return 2
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"{out}:1:1: --out names a file -- pass a directory (it is created when missing)", file=sys.stderr)
        return 2
    outputs = render_all(spec)
    for w in spec_warnings(spec, outputs):
        print(f"fusebox generate: warning: {w}", file=sys.stderr)
    _operator_people(spec)
    if args.check:
        problems = drift(outputs, out)
        for p in problems:
            print(f"drift: {p}", file=sys.stderr)
        if problems:
            print(f"generated files differ from {args.spec}: run `fusebox generate --spec {args.spec} --out {args.out}` "
                  "and commit the result", file=sys.stderr)
            return 1
        print(f"generated files match {args.spec} ({len(outputs)} files)")
        return 0
    try:
        changed = write_outputs(outputs, out)
    except WriteError as e:  # nothing under --out changed
        print(str(e), file=sys.stderr)
        return 2
    removed = [rel for rel in changed if rel not in outputs]  # the spec no longer makes them
    print(f"fusebox: {len(outputs)} files from {args.spec} into {out}/ ({len(changed) - len(removed)} changed"
          + (f", {len(removed)} removed)" if removed else ")"))
    for rel in changed:
        print(f"  {'removed ' if rel in removed else ''}{rel}")
    return 0


def _operator_people(spec) -> None:
    """What k8s/alertmanagerconfig.yml makes of ``fuse.human_receiver``, on standard error: each
    warning at its spec line (``FILE:LINE:COL: warning: what -- fix``), and the keys of the Secret
    its people's receiver reads (the operator refuses the whole AlertmanagerConfig, the fuse's
    route included, while a Secret it names is missing); and the Secret of
    ``kubernetes.fuse.gateway_secret`` with the kubectl command that creates it (the fuse pod
    cannot start without it)."""
    from fusebox import conventions as C
    from fusebox.spec.positions import load, read_text

    from .render_alertmanager import operator_secret_keys, operator_warnings

    found = operator_warnings(spec)
    if found:
        try:
            pos = load(read_text(spec.file, spec.file), spec.file)[1]
        except Exception:  # the spec was read a moment ago; a place is a nicety, the warning is not
            pos = None
        for path, what, fix in found:
            line, col = pos.at(path, key=True) if pos else (1, 1)
            print(f"{spec.file}:{line}:{col}: warning: {what} -- {fix}", file=sys.stderr)
    keys = operator_secret_keys(spec)
    if keys:
        print(f"fusebox generate: note: k8s/alertmanagerconfig.yml reads fuse.human_receiver's secrets from the Secret "
              f"{C.K8S['human_secret']!r} (keys {', '.join(keys)}) in namespace {spec.kubernetes.namespace!r}: create "
              "it before applying k8s/ (the operator refuses the whole AlertmanagerConfig, the fuse's route included, "
              "while it is missing)", file=sys.stderr)
    f = spec.kubernetes.fuse
    if f.enabled and f.gateway_secret:
        name, key = f.gateway_secret
        ns = spec.kubernetes.namespace
        print(f"fusebox generate: note: k8s/fuse.yml mounts kubernetes.fuse.gateway_secret's key from the Secret "
              f"{name!r} (key {key}) in namespace {ns!r}: create it before applying k8s/ (the fuse pod stays "
              f"ContainerCreating while it is missing): kubectl -n {ns} create secret generic {name} "
              f"--from-file={key}=FILE-WITH-THE-GATEWAYS-CONTROL-PLANE-KEY", file=sys.stderr)


def _read_base(path: str) -> str | None:
    from fusebox.spec.errors import unreadable
    from fusebox.spec.positions import MAX_SPEC_BYTES

    try:
        with open(path, "rb") as f:  # bounded: --base /dev/zero must not hang
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as e:
        print("fusebox alertmanager merge: "
              + unreadable(path, e, "pass --base with the Alertmanager config file your Alertmanager loads"), file=sys.stderr)
        return None
    if len(data) > MAX_SPEC_BYTES:
        print(f"{path}:1:1: the base config is over {MAX_SPEC_BYTES >> 20} MiB -- pass the Alertmanager config file",
              file=sys.stderr)
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        head = data[:e.start].decode("utf-8")
        line, col = head.count("\n") + 1, len(head) - (head.rfind("\n") + 1) + 1
        print(f"{path}:{line}:{col}: the base config is not UTF-8 text -- pass the Alertmanager config file (YAML)",
              file=sys.stderr)
        return None


def _spec_place(spec_file: str, path: tuple) -> tuple[str, int, int]:
    """(file, line, column) of ``path`` in the spec (of its nearest written parent: a default is not written)."""
    from fusebox.spec.positions import load, read_text

    line, col = load(read_text(spec_file, spec_file), spec_file)[1].at(path, key=True)
    return spec_file, line, col


def cmd_alertmanager_merge(args: argparse.Namespace) -> int:
    import os
    import stat

    from .am_merge import MergeError, merge_alertmanager
    from .render_alertmanager import render_fragment
    from .writer import WriteError, write_file
    from .yamlout import dump_yaml

    spec = _load(args.spec, "alertmanager merge")
    if spec is None:
        return 2
    if args.out and Path(args.out).resolve() == Path(args.base).resolve():
        print(f"{args.out}:1:1: --out is the base config itself -- write the merged config to another file (the base "
              "stays the file you edit; merge again after each change)", file=sys.stderr)
        return 2
    text = _read_base(args.base)
    if text is None:
        return 2
    try:
        merged, notes = merge_alertmanager(text, args.base, render_fragment(spec),
                                           human_receiver_at=_spec_place(spec.file, ("fuse", "human_receiver")),
                                           allow_silent_people=args.allow_silent_people)
    except MergeError as e:
        for p in e.problems:
            print(str(p), file=sys.stderr)
        return 2
    out = (f"# Merged by `fusebox alertmanager merge` from {Path(args.base).name} and {Path(spec.file).name}: "
           "edit those and merge again.\n" + dump_yaml(merged))
    for n in notes:
        print(f"fusebox alertmanager merge: {n}", file=sys.stderr)
    if not args.out:
        sys.stdout.write(out)
        return 0
    try:
        write_file(Path(args.out), out, mode=stat.S_IMODE(os.stat(args.base).st_mode))
    except WriteError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(f"fusebox alertmanager merge: {args.base} + the fusebox route of {args.spec} -> {args.out}", file=sys.stderr)
    return 0


def cmd_alertmanager_test(args: argparse.Namespace) -> int:
    from . import toolcheck

    spec = _load(args.spec, "alertmanager test")
    if spec is None:
        return 2
    if not Path(args.config).is_file():
        from fusebox.spec.errors import unreadable

        e = IsADirectoryError() if Path(args.config).is_dir() else FileNotFoundError()
        print("fusebox alertmanager test: " + unreadable(args.config, e, "pass --config with an Alertmanager config file"),
              file=sys.stderr)
        return 2
    try:
        amtool = toolcheck.find_tool("amtool", toolcheck.MIN_AMTOOL)
    except toolcheck.ToolMissing as e:
        print(f"fusebox alertmanager test: {e}", file=sys.stderr)
        return 3
    results = toolcheck.check_routing(Path(args.config), spec, amtool)
    failed = [r for r in results if not r.ok]
    for r in results:
        print(f"{'ok  ' if r.ok else 'FAIL'} {r.name}")
        if not r.ok:
            print("     " + r.output.replace("\n", "\n     "))
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def cmd_check(args: argparse.Namespace) -> int:
    if args.allow_dead and not args.against:
        print("fusebox check: --allow-dead needs --against CAPTURE... -- dead selectors are found only against "
              "captures", file=sys.stderr)
        return 2
    if args.rules:
        from . import deadselectors

        if not args.against:
            print("fusebox check: --rules needs --against CAPTURE... -- pass the /metrics dumps to check the rules "
                  "against (curl -s http://HOST:PORT/metrics > FILE)", file=sys.stderr)
            return 2
        return deadselectors.run(args.rules, args.against, args.allow_dead)
    from . import toolcheck

    spec = _load(args.spec, "check")
    if spec is None:
        return 2
    from .budget import run_budget

    fresh = run_fresh_check(spec, Path(args.out), args.spec)  # the tools below test the files as generated now
    if fresh == 2:
        return 2
    own = [fresh,
           run_budget(spec, summary=True),  # every fuse must act before its resource is full (docs/budget.md)
           run_inpath_check(spec),  # every in-path shedder must act before its fuse (docs/inpath.md)
           run_scaling_check(spec)]  # every scaler before its shedders and fuses (docs/scaling.md)
    rc = toolcheck.run_checks(spec, Path(args.out), promtools=args.promtool, captures=args.against,
                              allow_dead=args.allow_dead, prior=(own.count(0), len(own) - own.count(0)))
    return rc or (1 if any(own) else 0)


def run_fresh_check(spec, out: Path, spec_path: str) -> int:
    """``fusebox check``'s first line: every file `fusebox generate` writes for the spec (the rules
    and their tests, the Alertmanager files, and the dashboards, runbooks, ``k8s/`` manifests such as
    ``k8s/scaling.yml``...) holds what the spec generates now, and none it wrote before is left that
    it no longer generates (its manifest). A spec edited without `fusebox generate` after it, or a
    generated file edited by hand, fails it: the tools would pass the old rules, and a stale
    manifest would deploy the old scaler. Prints ``ok`` or ``FAIL`` and each stale file with `fusebox
    generate`; returns 1 when one is, else 0. A file the tools read (``toolcheck.CHECKED_FILES``)
    that is not there at all: one line on standard error naming them and `fusebox generate`,
    nothing on standard output, and 2 (bad input)."""
    from .outputs import render_all
    from .toolcheck import CHECKED_FILES
    from .writer import generated_before

    outputs = render_all(spec)
    missing = [rel for rel in CHECKED_FILES if rel in outputs and not (out / rel).is_file()]
    if missing:
        print(f"fusebox check: {', '.join(missing)} not found under {out}/ -- run `fusebox generate --spec {spec_path} "
              f"--out {out}` first", file=sys.stderr)
        return 2
    stale = {rel: ("differs from what {spec} generates" if (out / rel).is_file() else "is missing: {spec} generates it")
             for rel in outputs if not (out / rel).is_file() or (out / rel).read_bytes() != outputs[rel].encode("utf-8")}
    stale |= {rel: "is no longer generated by {spec}" for rel in generated_before(out) if rel not in outputs and (out / rel).exists()}
    print(f"{'ok  ' if not stale else 'FAIL'} generated files match {spec_path}: {len(outputs) - len(stale)} of "
          f"{len(outputs)} generated files as the spec generates them")
    for rel, why in stale.items():
        print(f"     {out / rel}: {why.format(spec=spec_path)} -- run `fusebox generate --spec {spec_path} "
              f"--out {out}` first (a hand edit there belongs in the spec)")
    return 1 if stale else 0


def run_inpath_check(spec) -> int:
    """``fusebox check``'s in-path line: ``ok``, or ``FAIL`` and each finding of
    :func:`.render_inpath.inpath_warnings` on standard error; 1 when any, else 0."""
    from .render_inpath import inpath_warnings

    found = inpath_warnings(spec)
    n = len(spec.inpath.shedders)
    print(f"{'ok  ' if not found else 'FAIL'} fusebox inpath: {n} shedder(s), {len(found)} acting after the fuse "
          "or with a breaker window shorter than the longest generation")
    for w in found:
        print(f"fusebox check: {w}", file=sys.stderr)
    return 1 if found else 0


def run_scaling_check(spec) -> int:
    """``fusebox check``'s scaling line: ``ok``, or ``FAIL`` and each finding of
    :func:`fusebox.spec.scaling.order_problems` (a set point not strictly before the shedders and
    fuses on its quantity) on standard error; 1 when any, else 0."""
    from fusebox.spec.scaling import order_problems

    found = order_problems(spec)
    n = len(spec.scaling.workloads) if spec.scaling else 0
    print(f"{'ok  ' if not found else 'FAIL'} fusebox scaling: {n} workload(s), {len(found)} set point(s) at or after "
          "a shedder's or a fuse's threshold")
    for w in found:
        print(f"fusebox check: {w}", file=sys.stderr)
    return 1 if found else 0


def _register_budget(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("budget", help="reaction budget: each fuse tier's detection floor against the time its resource has left",
                       description="For every tier that requests a fuse: scrape + evaluation interval + the staleness of records "
                       "read from slower groups + for + rule-engine lag + Alertmanager group_wait + the fuse's decision "
                       "time + the adapter timeout, against the time the "
                       "resource has left at the tier's threshold (docs/budget.md). Exit status: 0 every fuse acts in time, "
                       "1 a fuse would act after its resource is full, 2 bad input.")
    b.add_argument("--spec", default="fusebox.yaml", help="spec file (default: fusebox.yaml)")
    b.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    b.set_defaults(func=cmd_budget)


def cmd_budget(args: argparse.Namespace) -> int:
    from .budget import run_budget

    spec = _load(args.spec, "budget")
    if spec is None:
        return 2
    return run_budget(spec, as_json=args.json)
