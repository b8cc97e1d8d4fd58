"""`fusebox generate` and `fusebox check`."""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="generate rules, tests, runbooks, Alertmanager/Collector config, dashboards")
    g.add_argument("--spec", default="fusebox.yaml", help="spec file (default: fusebox.yaml)")
    g.add_argument("--out", default=".", help="output directory (default: .)")
    g.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when files under --out differ from what the spec generates")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser(
        "check", help="run promtool/amtool on generated output; find rule selectors that match no series",
        description="With --spec (the default): promtool check/test rules, amtool check-config and route tests on the "
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


def _load(spec_path: str):
    from fusebox.spec.errors import SpecError
    from fusebox.spec import load_spec

    try:
        return load_spec(spec_path)
    except FileNotFoundError:
        print(f"{spec_path}:1:1: spec file not found -- pass --spec PATH or run from the directory holding fusebox.yaml",
              file=sys.stderr)
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        print(f"{spec_path}:1:1: cannot read the spec ({type(e).__name__}) -- pass --spec with a readable YAML file",
              file=sys.stderr)
    except SpecError as e:
        for p in e.problems:
            print(str(p), file=sys.stderr)
    return None


def cmd_generate(args: argparse.Namespace) -> int:
    from .outputs import render_all
    from .writer import WriteError, drift, write_outputs

    # A one-shot batch: the spec, the rules and the YAML node trees are millions of small objects
    # that live until the end, and none of them is cyclic garbage; the cyclic collector would scan
    # them again and again as they grow (a 1,000-signal spec rendered 1.2x slower with it on).
    gc.disable()
    spec = _load(args.spec)
    if spec is None:
        return 2
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"{out}:1:1: --out names a file -- pass a directory (it is created when missing)", file=sys.stderr)
        return 2
    outputs = render_all(spec)
    if args.check:
        problems = drift(outputs, out)
        for p in problems:
            print(f"drift: {p}", file=sys.stderr)
        if problems:
            print(f"generated files differ from {args.spec}: run `make generate` and commit the result", file=sys.stderr)
            return 1
        print(f"generated files match {args.spec} ({len(outputs)} files)")
        return 0
    try:
        changed = write_outputs(outputs, out)
    except WriteError as e:  # nothing under --out changed
        print(str(e), file=sys.stderr)
        return 2
    print(f"fusebox: {len(outputs)} files from {args.spec} into {out}/ ({len(changed)} changed)")
    for rel in changed:
        print(f"  {rel}")
    return 0


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

    spec = _load(args.spec)
    if spec is None:
        return 2
    return toolcheck.run_checks(spec, Path(args.out), promtools=args.promtool, captures=args.against,
                                allow_dead=args.allow_dead)
