"""A recorded window of raw series: read from an OpenMetrics file or a Prometheus-compatible URL.

Two text forms are read, told apart by OpenMetrics' mandatory ``# EOF`` line:

* OpenMetrics (``promtool tsdb dump-openmetrics``; ``promtool tsdb dump --format=openmetrics`` where a
  promtool has that format): ``name{labels} value timestamp``
  with the timestamp in Unix **seconds** (a float), the file ending in ``# EOF``;
* Prometheus' text format as ``/federate`` answers it (one or more answers concatenated, e.g. a
  recording made by fetching ``/federate`` every scrape interval), or as ``promtool tsdb dump``
  writes it (``{__name__="name", ...} value timestamp``): the timestamp in Unix **milliseconds**
  (an integer), no ``# EOF``.

Every sample needs a timestamp (a recording without one says nothing about *when*).
``# HELP``/``# TYPE``/``# UNIT`` and other comments are skipped; an OpenMetrics exemplar
(`` # {...} ...`` after the value) is dropped. A sample repeated with the same timestamp (two
federate answers overlapping) is kept once.

From a URL, the raw series are read with an instant query of a range selector,
``/api/v1/query?query=NAME[RANGE]&time=END``: Prometheus and VictoriaMetrics both answer it with
the stored samples themselves (not resampled), for every metric name the rules read
(:func:`read_url`).
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["RecordingError", "Recording", "read_openmetrics", "read_url", "metric_names_in", "MAX_FILE_BYTES"]

# Larger files are refused (the backtest holds the samples in memory, then in VictoriaMetrics).
MAX_FILE_BYTES = 512 * 1024 * 1024
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})?(\{{.*\}})?\s+(\S+)(?:\s+(\S+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
# Unix seconds between 1973 and 5138: an OpenMetrics timestamp outside is not seconds.
_SECONDS = (1e8, 1e11)


class RecordingError(ValueError):
    """The recording cannot be used; ``str()`` is ``where: what -- how to fix``."""


@dataclass
class Recording:
    """Samples by series. ``series``: ``(name, sorted label pairs)`` -> ``{timestamp_ms: value}``;
    ``source``: the file or URL, for messages."""

    source: str
    series: dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, float]] = field(default_factory=dict)

    def add(self, name: str, labels: dict[str, str], ts_ms: int, value: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.series.setdefault(key, {})[ts_ms] = value

    @property
    def samples(self) -> int:
        return sum(len(v) for v in self.series.values())

    def span_ms(self) -> tuple[int, int]:
        """(first, last) sample timestamp, Unix milliseconds. Raises RecordingError when empty."""
        stamps = [t for v in self.series.values() for t in v]
        if not stamps:
            raise RecordingError(f"{self.source}: no samples -- record a window with data (promtool tsdb dump "
                                 "--format=openmetrics, or /federate fetched every scrape interval)")
        return min(stamps), max(stamps)

    def names(self) -> set[str]:
        return {name for name, _ in self.series}

    def prometheus_text(self) -> str:
        """Prometheus' text format with millisecond timestamps, what VictoriaMetrics'
        ``/api/v1/import/prometheus`` takes."""
        out = []
        for (name, labels), samples in sorted(self.series.items()):
            inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            head = f"{name}{{{inner}}}" if inner else name
            out += [f"{head} {_number(v)} {t}" for t, v in sorted(samples.items())]
        return "\n".join(out) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _value(text: str) -> float:
    low = text.lower()
    if low in ("nan", "+inf", "inf", "-inf"):
        return float(low)
    return float(text)


def _labels(text: str, where: str) -> dict[str, str]:
    inner = text[1:-1].strip()
    out: dict[str, str] = {}
    pos = 0
    while pos < len(inner):
        m = _LABEL.match(inner, pos)
        if not m:
            raise RecordingError(f"{where}: cannot read the labels {text[:120]!r} -- expected name=\"value\" pairs "
                                 "separated by commas")
        out[m.group(1)] = re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group(0)], m.group(2))
        pos = m.end()
    return out


def read_openmetrics(path: str | Path) -> Recording:
    """Read a recording file (OpenMetrics with ``# EOF`` and timestamps in seconds, or Prometheus
    text / concatenated ``/federate`` answers with timestamps in milliseconds).

    Raises:
        RecordingError: the file is missing, not UTF-8, over :data:`MAX_FILE_BYTES`, a line is
            neither a comment nor a sample, a sample has no timestamp or a value/timestamp that is
            not a number, an OpenMetrics timestamp is not Unix seconds, or there is no sample at all.
    """
    from fusebox.spec.errors import unreadable

    p = Path(path)
    fix = "pass --openmetrics with a recording file (promtool tsdb dump-openmetrics; docs/backtest.md)"
    try:
        size = p.stat().st_size
        if p.is_dir():
            raise IsADirectoryError(path)
    except OSError as e:
        raise RecordingError(unreadable(path, e, fix)) from None
    if size > MAX_FILE_BYTES:
        raise RecordingError(f"{path}: {size} bytes, over the {MAX_FILE_BYTES} this reads -- dump a shorter window "
                             "(promtool tsdb dump --min-time/--max-time) or only the rules' metrics (--match)")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:  # e.g. no read permission
        raise RecordingError(unreadable(path, e, fix)) from None
    except UnicodeDecodeError as e:
        raise RecordingError(f"{path}: not UTF-8 text (byte {e.start}) -- pass an OpenMetrics or Prometheus text "
                             "file, not a TSDB block or a compressed file") from None
    lines = text.splitlines()
    openmetrics = any(line.strip() == "# EOF" for line in lines)
    rec = Recording(str(path))
    for n, line in enumerate(lines, 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        where = f"{path}:{n}"
        if openmetrics and " # " in s:  # an exemplar after the value
            s = s.split(" # ", 1)[0].rstrip()
        m = _SAMPLE.match(s)
        if not m:
            raise RecordingError(f"{where}: not a sample line ({s[:120]!r}) -- expected 'name{{labels}} value "
                                 "timestamp' (OpenMetrics or Prometheus text format)")
        name, labels, value, stamp = m.groups()
        lab = _labels(labels, where) if labels else {}
        if not name:  # `promtool tsdb dump`'s own form: {__name__="x", ...} value ms
            name = lab.pop("__name__", "")
            if not re.fullmatch(_NAME, name):
                raise RecordingError(f"{where}: a sample without a metric name -- expected 'name{{labels}} value "
                                     "timestamp' or '{__name__=\"name\", ...} value timestamp'")
        if stamp is None:
            raise RecordingError(f"{where}: sample {name} has no timestamp -- a recording needs one per sample "
                                 "(promtool tsdb dump and /federate write them)")
        try:
            v = _value(value)
        except ValueError:
            raise RecordingError(f"{where}: value {value!r} of {name} is not a number") from None
        try:
            t = float(stamp)
        except ValueError:
            raise RecordingError(f"{where}: timestamp {stamp!r} of {name} is not a number") from None
        if openmetrics:
            if not _SECONDS[0] <= t <= _SECONDS[1]:
                raise RecordingError(f"{where}: timestamp {stamp} is not Unix seconds -- an OpenMetrics file "
                                     "(ending in '# EOF') gives seconds; drop '# EOF' if these are milliseconds")
            ts_ms = round(t * 1000)
        else:
            if not _SECONDS[0] * 1000 <= t <= _SECONDS[1] * 1000:
                raise RecordingError(f"{where}: timestamp {stamp} is not Unix milliseconds -- Prometheus text "
                                     "(/federate) gives milliseconds; end an OpenMetrics file (seconds) with '# EOF'")
            ts_ms = int(t)
        rec.add(name, lab, ts_ms, v)
    rec.span_ms()  # no sample at all: an error
    return rec


def metric_names_in(rule_groups: Iterable[dict]) -> set[str]:
    """Every name-like token of the rules' expressions that is not a recording rule's own name:
    a superset of the raw metric names the rules read (function names and label names are in it
    too; intersected with a recording's names it gives the metrics the rules read from it)."""
    tokens: set[str] = set()
    records = set()
    for g in rule_groups:
        for r in g.get("rules", []):
            tokens |= set(re.findall(_NAME, re.sub(r'"(?:[^"\\]|\\.)*"', "", str(r.get("expr", "")))))
            if "record" in r:
                records.add(r["record"])
    return tokens - records


def _get_json(url: str, timeout_s: float) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (the user's own URL)
            body = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        detail = e.read()[:300].decode("utf-8", "replace")
        raise RecordingError(f"{url}: HTTP {e.code} {detail} -- check the URL and the time range") from None
    except (urllib.error.URLError, OSError) as e:
        raise RecordingError(f"{url}: cannot connect ({getattr(e, 'reason', e)}) -- pass the base URL of a "
                             "Prometheus or VictoriaMetrics (http://host:9090)") from None
    except ValueError:
        raise RecordingError(f"{url}: the answer is not JSON -- pass the base URL of a Prometheus or "
                             "VictoriaMetrics, not of a UI or a proxy page") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        raise RecordingError(f"{url}: the query failed ({str(body)[:300]})")
    return body


def read_url(base: str, start_s: float, end_s: float, wanted: set[str], *, timeout_s: float = 60.0) -> Recording:
    """The raw samples of ``wanted`` metric names in ``(start_s, end_s]`` from a Prometheus or
    VictoriaMetrics at ``base``: ``/api/v1/label/__name__/values`` for the names present in the
    window, then one ``/api/v1/query`` of ``{__name__="NAME"}[RANGE]`` at ``end_s`` per name the
    rules read.

    Raises:
        RecordingError: start not before end, the server unreachable or answering an error, or
            none of ``wanted`` has a sample in the window.
    """
    if not end_s > start_s:
        raise RecordingError(f"--start {start_s:g} is not before --end {end_s:g} -- the window is empty")
    base = base.rstrip("/")
    q = urllib.parse.urlencode({"start": f"{start_s:.3f}", "end": f"{end_s:.3f}"})
    present = set(_get_json(f"{base}/api/v1/label/__name__/values?{q}", timeout_s).get("data") or [])
    names = sorted(present & wanted)
    rec = Recording(base)
    window = math.ceil(end_s - start_s) + 1  # a range selector is open on the left (Prometheus 3): one more second
    for name in names:
        q = urllib.parse.urlencode({"query": f'{{__name__="{name}"}}[{window}s]', "time": f"{end_s:.3f}"})
        for s in _get_json(f"{base}/api/v1/query?{q}", timeout_s)["data"].get("result", []):
            labels = dict(s.get("metric", {}))
            labels.pop("__name__", None)
            for t, v in s.get("values", []):
                if start_s <= float(t) <= end_s:
                    rec.add(name, labels, round(float(t) * 1000), _value(str(v)))
    if not rec.series:
        raise RecordingError(f"{base}: no sample between {start_s:g} and {end_s:g} of any metric the rules read "
                             f"({len(present)} other metric names there) -- check the time range and that this server "
                             "scrapes the GPUs and engines the spec's sources name")
    return rec
