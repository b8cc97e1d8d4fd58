"""`fusebox init` (a starter spec) and `fusebox schema` (the spec's JSON Schema)."""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

STARTER = "fusebox.yaml"
# yaml-language-server "supports JSON Schema 7 and below" (its README), so draft-07.
SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"


def register(sub: argparse._SubParsersAction) -> None:
    i = sub.add_parser("init", help="write a commented starter spec (fusebox.yaml) into DIR (default: .)")
    i.add_argument("dir", nargs="?", default=".", help="folder to write fusebox.yaml into (default: .; created when missing)")
    i.set_defaults(func=cmd_init)
    s = sub.add_parser("schema", help="print the spec's JSON Schema (draft-07), for editors (yaml-language-server) and CI")
    s.set_defaults(func=cmd_schema)


def starter_text() -> str:
    """The starter spec shipped in the wheel (``fusebox/data/fusebox.yaml``, a copy of the
    repository's fusebox.yaml that a test keeps identical)."""
    return resources.files("fusebox").joinpath("data", STARTER).read_text(encoding="utf-8")


def cmd_init(args: argparse.Namespace) -> int:
    """Write DIR/fusebox.yaml; never overwrite one (exit 2, nothing written)."""
    folder = Path(args.dir)
    target = folder / STARTER
    if target.exists() or target.is_symlink():
        print(f"{target}:1:1: a spec is already there -- edit it, or pass another folder (fusebox init DIR)", file=sys.stderr)
        return 2
    if folder.exists() and not folder.is_dir():
        print(f"{folder}:1:1: not a folder -- pass a folder to write {STARTER} into", file=sys.stderr)
        return 2
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(target, "x", encoding="utf-8") as f:  # "x": never replace a file made meanwhile
            f.write(starter_text())
    except OSError as e:
        print(f"{target}:1:1: cannot write the starter spec ({e.strerror or type(e).__name__}) -- pass a writable folder",
              file=sys.stderr)
        return 2
    print(f"fusebox: wrote {target}; edit it, then run `fusebox generate --spec {target} --out {folder}`")
    return 0


def spec_schema() -> dict:
    """The spec's JSON Schema (draft-07) from its pydantic models, with their descriptions.

    The shapes only: what the loader checks beyond them (units, tier order, PromQL, ...) it
    reports as ``file:line:col`` errors."""
    from fusebox.spec.model import RawSpec

    schema = RawSpec.model_json_schema(by_alias=True, mode="validation", ref_template="#/definitions/{model}")
    defs = schema.pop("$defs", {})
    return {"$schema": SCHEMA_DIALECT, **schema, "title": "fusebox spec (apiVersion fusebox/v1)", "definitions": defs}


def cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(spec_schema(), indent=2, sort_keys=False))
    return 0
