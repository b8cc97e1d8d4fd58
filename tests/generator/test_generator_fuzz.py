"""Property: no spec breaks the generator (issue 9). Mutations of the shipped fusebox.yaml (keys
deleted, values swapped for other YAML scalars and types, junk keys, other numbers, units and
durations, stray characters) either generate (exit 0) or are refused (exit 2) with
``PATH:LINE:COL: what -- fix`` lines; never a traceback."""

from __future__ import annotations

import contextlib
import copy
import io
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml
from _support import SPEC, yaml_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusebox.cli import main

BASE = yaml_data(SPEC.read_text(encoding="utf-8"))

VALUES = [None, True, False, "yes", "off", 0, 1, -1, 0.5, -0.001, 1e400, -1e400, math.nan, 10**30, "", " ", "junk",
          [], {}, [1, "a"], {"k": "v"}, "0s", "0", "1ms", "5m", "292y", "293y", "999999999999999h", "1h30m", "30 seconds",
          "-9.2 MB/s", "9.2 MB/s", "14.7 MiB/s", "8.7 GB/min", "0%", "100%", "78.3%", "101%", "1.28s", "0.85", "inf s",
          "nan%", "1e-320", "2024-01-01", "x" * 300, "sum(rate(x[5m])) by", "a\u00e9\u4e2d", "\x00", "{{ $labels.x }}",
          "GPUMemoryUtilizationHigh", "warning", "critical", "gauge", "deriv", "quantile", "gpu_memory", "bytes"]
NUMBER_TEXT = re.compile(r"\d+(\.\d+)?")


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, path + (i,))
    return out


def _parent(doc: Any, path: tuple) -> Any:
    for p in path[:-1]:
        doc = doc[p]
    return doc


def _mutate(doc: Any, op: str, pick: int, value: Any, number: float) -> Any:
    value = copy.deepcopy(value)  # VALUES' lists and dicts are shared: one appended into itself made a cycle
    paths = [p for p in _paths(doc) if p]
    if not paths:
        return value
    path = paths[pick % len(paths)]
    parent, last = _parent(doc, path), path[-1]
    if op == "delete":
        del parent[last]
    elif op == "replace":
        parent[last] = value
    elif op == "junk key":
        target = parent[last] if isinstance(parent[last], dict) else parent
        if isinstance(target, dict):
            target[f"junk_{pick % 7}"] = value
        else:
            target.append(value)
    elif op == "renumber":  # keep the unit, change the number: "78.3%" -> "-0.5%"
        old = parent[last]
        if isinstance(old, str) and NUMBER_TEXT.search(old):
            parent[last] = NUMBER_TEXT.sub(format(number, "g"), old, count=1)
        elif isinstance(old, (int, float)) and not isinstance(old, bool):
            parent[last] = number
    return doc


@st.composite
def specs(draw) -> str:
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["delete", "replace", "junk key", "renumber"]))
        doc = _mutate(doc, op, draw(st.integers(0, 10**6)), draw(st.sampled_from(VALUES)),
                      draw(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**20, 10**20))))
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    if draw(st.booleans()):  # a stray character somewhere in the text
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.characters(codec="utf-8")) + text[at:]
    return text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(text=specs())
def test_no_spec_breaks_the_generator(text):
    with tempfile.TemporaryDirectory() as d:
        spec, out = Path(d) / "fusebox.yaml", Path(d) / "out"
        spec.write_text(text, encoding="utf-8", errors="surrogatepass")
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                rc = main(["generate", "--spec", str(spec), "--out", str(out)])
            except SystemExit as e:  # argparse only
                rc = e.code
        stderr = err.getvalue()
        assert "Traceback" not in stderr, stderr
        assert rc in (0, 2), (rc, stderr)
        if rc == 2:
            lines = [line for line in stderr.splitlines() if line]
            assert lines and all(re.match(rf"{re.escape(str(spec))}:\d+:\d+: .+ -- .+", line) for line in lines), stderr
            assert not out.exists()  # nothing written
