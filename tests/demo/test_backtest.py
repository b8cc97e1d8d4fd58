"""``fusebox backtest`` on the real engines (VictoriaMetrics single node + ``vmalert -replay``) and the
fuse's own breaker.

The recordings here are written by the tests with sample times chosen by hand, so when each alert
must go pending, fire and resolve, and when the fuse must trip and release, is worked out from
the spec's numbers (threshold, ``for``, ``keep_firing_for``, evaluation interval, Alertmanager's
``group_wait``/``group_interval``, the hold) -- not from what the command prints.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from _support import ROOT, SPEC, need, yaml_data, yaml_text

from fusebox.cli import main
from fusebox.tooling import free_port, victoriametrics_tool

pytestmark = [pytest.mark.tools]

INCIDENT = ROOT / "examples" / "incidents" / "breach.om"
GIB = 2**30
T0 = 1_700_000_100  # when GPU memory crosses the critical threshold (a multiple of 60 s: on every evaluation grid)
LABELS = 'cluster="c1",host_name="node-1",hw_id="GPU-1",instance="node-1:9410",job="fusebox-gpu"'
SCOPE = {"cluster": "c1", "host_name": "node-1", "hw_id": "GPU-1"}


def _gpu_signal(spec):
    (sig,) = [s for s in spec.signals if s.kind == "gpu_memory"]
    return sig


def _tier(sig, name):
    (t,) = [t for t in sig.tiers if t.name == name]
    return t


def _write_breach(path: Path, spec, *, above_s: int = 90, before_s: int = 120, after_s: int = 240, step: int = 5,
                  dip: tuple[int, int] = (0, 0)) -> None:
    """One GPU: memory at (critical threshold - 10 points) until T0, 1 point above the critical
    threshold from T0 for ``above_s`` (but down again from T0 + dip[0] to T0 + dip[1]), then back
    down; a sample every ``step`` s (OpenMetrics, seconds)."""
    thr = _tier(_gpu_signal(spec), "critical").threshold
    total = 80 * GIB
    lines = ["# TYPE hw_gpu_memory_usage_bytes gauge"]
    for t in range(T0 - before_s, T0 + after_s + 1, step):
        frac = thr + 0.01 if T0 <= t < T0 + above_s and not T0 + dip[0] <= t < T0 + dip[1] else thr - 0.10
        lines.append(f"hw_gpu_memory_usage_bytes{{{LABELS}}} {math.ceil(total * frac)} {t}")
    lines.append("# TYPE hw_gpu_memory_limit_bytes gauge")
    lines += [f"hw_gpu_memory_limit_bytes{{{LABELS}}} {total} {t}" for t in range(T0 - before_s, T0 + after_s + 1, step)]
    # the collector's ratio of the same round: usage / limit (what the GPU-memory rules read)
    lines.append("# TYPE hw_gpu_memory_utilization_ratio gauge")
    lines += [f"hw_gpu_memory_utilization_ratio{{{LABELS}}} {int(line.split()[1]) / total!r} {line.split()[2]}"
              for line in lines if line.startswith("hw_gpu_memory_usage_bytes")]
    path.write_text("\n".join(lines) + "\n# EOF\n")


def _run(capsys, *args) -> tuple[int, str, str]:
    rc = main(["backtest", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _json(capsys, *args) -> dict:
    rc, out, err = _run(capsys, *args, "--json")
    assert rc == 0, err
    return json.loads(out)


def _one(alerts, name, severity):
    (a,) = [a for a in alerts if a["alertname"] == name and a["severity"] == severity]
    return a


@pytest.fixture(scope="module", autouse=True)
def _engines_built():
    victoriametrics_tool("victoria-metrics"), victoriametrics_tool("vmalert")  # ToolMissing fails the module, never skips


@pytest.fixture(scope="module")
def breach(tmp_path_factory, spec):
    path = tmp_path_factory.mktemp("bt") / "breach.om"
    _write_breach(path, spec)
    return path


def test_the_critical_alert_fires_within_one_evaluation_of_t0_plus_for_and_its_fuse_level_trips(capsys, spec, breach):
    sig = _gpu_signal(spec)
    crit, warn = _tier(sig, "critical"), _tier(sig, "warning")
    step = spec.evaluation_interval_s
    hold = 10.0
    doc = _json(capsys, "--openmetrics", breach, "--spec", SPEC, "--hold", hold)
    a = _one(doc["alerts"], sig.alert, crit.severity)
    assert a["labels"]["hw_id"] == "GPU-1"
    assert T0 <= a["pending_at"] <= T0 + step
    assert T0 + crit.for_s <= a["firing_at"] <= T0 + crit.for_s + step
    # memory back under both thresholds at T0 + 90: the first evaluation without the alert, then keep_firing_for
    assert T0 + 90 + crit.keep_firing_for_s <= a["resolved_at"] <= T0 + 90 + crit.keep_firing_for_s + step
    w = _one(doc["alerts"], sig.alert, warn.severity)
    assert T0 + warn.for_s <= w["firing_at"] <= T0 + warn.for_s + step  # above 72 % too, with its own for
    # the fuse: the level of the critical tier's action, tripped group_wait_critical after it fired,
    # released after the resolved alert's notification (the next group_interval tick) and the hold
    level = spec.actions[crit.fuse].level
    trips = [f for f in doc["fuse"] if f["action"] == "trip"]
    releases = [f for f in doc["fuse"] if f["action"] == "release"]
    assert [(f["level"], f["fuse_action"], f["scope"]) for f in trips] == [(level, crit.fuse, SCOPE)]
    first_send = a["firing_at"] + spec.group_wait_critical_s
    assert trips[0]["at"] == first_send
    resolved_sent = first_send + math.ceil((a["resolved_at"] - first_send) / spec.group_interval_s) * spec.group_interval_s
    assert [(f["level"], f["at"]) for f in releases] == [(level, resolved_sent + hold)]


def test_the_table_names_the_alert_and_the_tripped_level(capsys, spec, breach):
    rc, out, _ = _run(capsys, "--openmetrics", breach, "--spec", SPEC)
    assert rc == 0
    crit = _tier(_gpu_signal(spec), "critical")
    assert "GPUMemoryUtilizationHigh" in out and "trip" in out and crit.fuse[:10] in out


def test_compare_a_longer_for_moves_firing_at_by_exactly_that(capsys, spec, breach, tmp_path):
    sig = _gpu_signal(spec)
    crit = _tier(sig, "critical")
    longer = 30.0
    raw = yaml_data(SPEC.read_text())
    raw["signals"][sig.name]["tiers"]["critical"]["for"] = f"{int(crit.for_s + longer)}s"
    other = tmp_path / "longer-for.yaml"
    other.write_text(yaml_text(raw, sort_keys=False))
    doc = _json(capsys, "--openmetrics", breach, "--spec", SPEC, "--compare", other)
    moved = {m["event"]: m for m in doc["moves"]["alerts"] if m["alertname"] == sig.alert and m["severity"] == crit.severity}
    assert moved["firing_at"]["delta_s"] == longer
    assert moved["pending_at"]["delta_s"] == 0
    assert moved["resolved_at"]["delta_s"] == 0  # it still fires at T0 + 60 < T0 + 90
    trip = [m for m in doc["moves"]["fuse"] if m["action"] == "trip"]
    assert [(m["level"], m["delta_s"]) for m in trip] == [(spec.actions[crit.fuse].level, longer)]
    before = _one(doc["alerts"], sig.alert, crit.severity)["firing_at"]
    after = _one(doc["compare"]["alerts"], sig.alert, crit.severity)["firing_at"]
    assert after - before == longer


@pytest.mark.parametrize("content,says", [
    ('{"data": [1, 2, 3]}\n', "not a sample line"),
    ("hw_gpu_memory_usage_bytes{hw_id=\"GPU-1\"} 12\n# EOF\n", "has no timestamp"),
    ("hw_gpu_memory_usage_bytes{hw_id=\"GPU-1\"} 12 1700000000000\n# EOF\n", "not Unix seconds"),
    ("hw_gpu_memory_usage_bytes{hw_id=GPU-1} 12 1700000000\n# EOF\n", "cannot read the labels"),
    ("hw_gpu_memory_usage_bytes{hw_id=\"GPU-1\"} twelve 1700000000\n# EOF\n", "is not a number"),
    ("# TYPE x gauge\n# EOF\n", "no samples"),
])
def test_a_file_that_is_not_a_recording_is_refused_with_its_line(capsys, tmp_path, content, says):
    bad = tmp_path / "bad.om"
    bad.write_text(content)
    rc, out, err = _run(capsys, "--openmetrics", bad, "--spec", SPEC, "--json")
    assert rc == 2 and out == ""
    assert str(bad) in err and says in err


def test_a_binary_file_is_refused(capsys, tmp_path):
    bad = tmp_path / "block.bin"
    bad.write_bytes(b"\x00\xff\xfe" * 100)
    rc, out, err = _run(capsys, "--openmetrics", bad, "--spec", SPEC)
    assert rc == 2 and out == "" and "not UTF-8" in err


def test_a_recording_of_metrics_no_rule_reads_is_refused(capsys, tmp_path):
    other = tmp_path / "other.om"
    other.write_text("".join(f"node_cpu_seconds_total{{cpu=\"0\"}} {i} {1_700_000_000 + 5 * i}\n" for i in range(30)) + "# EOF\n")
    rc, out, err = _run(capsys, "--openmetrics", other, "--spec", SPEC)
    assert rc == 2 and out == "" and "none of its metrics" in err and "node_cpu_seconds_total" in err


def test_a_window_shorter_than_one_evaluation_is_refused(capsys, tmp_path):
    short = tmp_path / "short.om"
    short.write_text(f"hw_gpu_memory_usage_bytes{{{LABELS}}} 1 {T0}\nhw_gpu_memory_limit_bytes{{{LABELS}}} 2 {T0}\n# EOF\n")
    rc, out, err = _run(capsys, "--openmetrics", short, "--spec", SPEC)
    assert rc == 2 and out == "" and "less than one evaluation interval" in err


def test_a_window_that_straddles_an_evaluation_boundary_but_is_shorter_than_one_is_refused(capsys, spec, tmp_path):
    """Three samples 5 s apart around a boundary of the slowest group's grid (30 s): 5 s of window
    after rounding up to the grid, still less than one evaluation of that group."""
    step = spec.slow_evaluation_interval_s
    b = (T0 // int(step) + 1) * int(step)
    short = tmp_path / "straddle.om"
    short.write_text("".join(f"hw_gpu_memory_usage_bytes{{{LABELS}}} 1 {t}\nhw_gpu_memory_limit_bytes{{{LABELS}}} 2 {t}\n"
                             for t in (b - 5, b, b + 5)) + "# EOF\n")
    rc, out, err = _run(capsys, "--openmetrics", short, "--spec", SPEC)
    assert rc == 2 and out == "" and "spans 5 s" in err and f"({step:g} s)" in err


def test_a_folder_given_as_the_recording_is_refused_without_a_traceback(capsys, tmp_path):
    rc, out, err = _run(capsys, "--openmetrics", tmp_path, "--spec", SPEC)
    assert rc == 2 and out == "" and str(tmp_path) in err and "Traceback" not in err


def test_without_spec_it_reads_fusebox_yaml_of_the_current_folder_as_generate_does(capsys, spec, breach, tmp_path,
                                                                                  monkeypatch):
    """A folder whose fusebox.yaml holds the GPU critical for 100 s (the breach is over it 90 s):
    the critical never fires there, so the backtest read that file and not the shipped spec."""
    sig = _gpu_signal(spec)
    raw = yaml_data(SPEC.read_text())
    raw["signals"][sig.name]["tiers"]["critical"]["for"] = "100s"
    (tmp_path / "fusebox.yaml").write_text(yaml_text(raw, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    doc = _json(capsys, "--openmetrics", breach)
    assert doc["spec"] == "fusebox.yaml"
    crit = _tier(sig, "critical")
    assert [a for a in doc["alerts"] if a["alertname"] == sig.alert and a["severity"] == crit.severity
            and a["firing_at"] is not None] == []


def test_federate_text_with_millisecond_stamps_gives_the_same_events(capsys, spec, breach, tmp_path):
    """/federate answers (Prometheus text, milliseconds, no # EOF), concatenated with a repeated
    sample, backtest exactly as the OpenMetrics form of the same samples."""
    lines = [line for line in breach.read_text().splitlines() if line and not line.startswith("#")]
    fed = tmp_path / "federate.txt"
    body = []
    for line in lines:
        head, value, ts = line.rsplit(" ", 2)
        body.append(f"{head} {value} {int(ts) * 1000}")
    fed.write_text("# TYPE hw_gpu_memory_usage_bytes untyped\n" + "\n".join(body + body[:3]) + "\n")
    a = _json(capsys, "--openmetrics", breach, "--spec", SPEC)
    b = _json(capsys, "--openmetrics", fed, "--spec", SPEC)
    assert (a["alerts"], a["fuse"]) == (b["alerts"], b["fuse"])


def _expected_firing(path: Path, hw_suffix: str, thr: float, for_s: float, step: float) -> float:
    """When the critical GPU-memory alert must fire on the GPU whose hw_id ends in ``hw_suffix``
    (no KV pool on it, so the rule's value is usage / limit), from the file's own samples: the
    first evaluation (a multiple of ``step`` from the first sample on) whose latest samples are at
    or over ``thr`` and stay so at every evaluation for ``for_s``, plus ``for_s``."""
    usage: dict[float, float] = {}
    limit: dict[float, float] = {}
    for line in path.read_text().splitlines():
        if line.startswith(("hw_gpu_memory_usage_bytes{", "hw_gpu_memory_limit_bytes{")) and \
                f'hw_id="GPU-5ca1ab1e-0000-4000-8000-00000000000{hw_suffix}"' in line:
            _, value, ts = line.rsplit(" ", 2)
            (usage if line.startswith("hw_gpu_memory_usage_bytes") else limit)[float(ts)] = float(value)
    stamps = sorted(usage)
    first = math.ceil(stamps[0] / step) * step

    def over(t: float) -> bool:
        last = max(s for s in stamps if s <= t)
        return usage[last] / limit[last] >= thr

    evals = [first + i * step for i in range(int((stamps[-1] - first) // step) + 1)]
    for i, t in enumerate(evals):
        held = [u for u in evals[i:] if u <= t + for_s]
        if t + for_s <= evals[-1] and all(over(u) for u in held):
            return t + for_s
    raise AssertionError("the recording never holds the critical threshold for `for`")


def test_the_shipped_incident_fires_each_critical_and_trips_each_level_once(capsys, spec):
    """The demo's breach recorded from the real stack (examples/incidents/README.md): the GPU
    critical fires when its samples say it must, and every level a critical tier requests trips
    once, group_wait_critical after its alert fired, and is released once, after it resolved."""
    sig = _gpu_signal(spec)
    crit = _tier(sig, "critical")
    step = spec.evaluation_interval_s
    doc = _json(capsys, "--openmetrics", INCIDENT, "--spec", SPEC, "--hold", 10)
    gpu = [a for a in doc["alerts"] if a["alertname"] == sig.alert and a["severity"] == crit.severity]
    assert [a["labels"]["hw_id"][-1] for a in gpu] == ["0"]  # the vision encoder's GPU; the decoder's KV pool is headroom
    want = _expected_firing(INCIDENT, "0", crit.threshold, crit.for_s, step)
    assert want <= gpu[0]["firing_at"] <= want + step
    tiers: dict[int, list] = {}  # level -> the (alert, tier) pairs requesting it
    for s in spec.signals:
        for t in s.tiers:
            if t.fuse:
                tiers.setdefault(spec.actions[t.fuse].level, []).append((s.alert, t))
    trips = [f for f in doc["fuse"] if f["action"] == "trip"]
    releases = [f for f in doc["fuse"] if f["action"] == "release"]
    tripped = {f["level"]: f for f in trips}
    assert sorted(f["level"] for f in trips) == sorted(tiers) == sorted(f["level"] for f in releases)
    for level, pairs in tiers.items():
        fired = [(a, tier) for alert, tier in pairs for a in doc["alerts"]
                 if a["alertname"] == alert and a["severity"] == tier.severity and a["firing_at"] is not None]
        a, tier = min(fired, key=lambda x: x[0]["firing_at"])  # the first of them to fire trips it
        assert tripped[level]["at"] == a["firing_at"] + spec.group_wait_critical_s
        assert tripped[level]["fuse_action"] == tier.fuse and a["alertname"] in tripped[level]["alerts"]
        (rel,) = [f for f in releases if f["level"] == level]
        assert rel["at"] >= max(x["resolved_at"] for x, _ in fired) + 10


@contextlib.contextmanager
def _serving(proc: subprocess.Popen, url: str, ready: str):
    """``url`` once ``proc`` answers 200 on ``ready`` (30 s at most); ``proc`` stopped after."""
    try:
        for _ in range(300):
            try:
                if urllib.request.urlopen(f"{url}{ready}", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def prometheus_with_breach(tmp_path_factory, breach):
    """A real Prometheus serving the breach recording: its blocks built by
    `promtool tsdb create-blocks-from openmetrics`, retention long enough to keep them."""
    promtool, prometheus = need("promtool"), need("prometheus")
    d = tmp_path_factory.mktemp("prom")
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(breach), str(d / "data")], check=True,
                   capture_output=True)
    (d / "prometheus.yml").write_text("global: {}\n")
    port = free_port()
    proc = subprocess.Popen([prometheus, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with _serving(proc, f"http://127.0.0.1:{port}", "/-/ready") as url:
        yield url


def test_a_prometheus_url_and_window_gives_what_the_file_gives(capsys, breach, prometheus_with_breach):
    a = _json(capsys, "--openmetrics", breach, "--spec", SPEC)
    b = _json(capsys, "--url", prometheus_with_breach, "--start", T0 - 120, "--end", T0 + 240, "--spec", SPEC)
    assert (a["start"], a["end"]) == (b["start"], b["end"])
    assert (a["alerts"], a["fuse"]) == (b["alerts"], b["fuse"])


def test_a_url_window_without_the_rules_metrics_is_refused(capsys, prometheus_with_breach):
    rc, out, err = _run(capsys, "--url", prometheus_with_breach, "--start", T0 + 86400, "--end", T0 + 86400 + 600,
                        "--spec", SPEC)
    assert rc == 2 and out == "" and "no sample between" in err


def test_an_empty_url_window_is_refused(capsys, prometheus_with_breach):
    rc, out, err = _run(capsys, "--url", prometheus_with_breach, "--start", T0, "--end", T0, "--spec", SPEC)
    assert rc == 2 and out == "" and "the window is empty" in err


def test_alerts_carry_the_labels_prometheus_gives_them(capsys, spec, breach):
    """The rule's labels and the expression's, nothing an engine adds of its own (vmalert's
    ``alertgroup``): the fingerprint the fuse keys on is the one a Prometheus would send."""
    sig = _gpu_signal(spec)
    crit = _tier(sig, "critical")
    doc = _json(capsys, "--openmetrics", breach, "--spec", SPEC)
    a = _one(doc["alerts"], sig.alert, crit.severity)
    rule_labels = {"alertname": sig.alert, "severity": crit.severity, "fuse_action": crit.fuse,
                   "fuse_level": str(spec.actions[crit.fuse].level), "signal": sig.name, "fusebox": spec.name}
    assert a["labels"] == {**rule_labels, **SCOPE}


def test_an_alert_that_stops_matching_for_less_than_keep_firing_for_keeps_firing(capsys, spec, tmp_path):
    """Memory under the threshold for two evaluations (T0 + 90, T0 + 95), back over at T0 + 100:
    within keep_firing_for, so Prometheus never resolves it (vmalert's replay alone would resolve
    it and fire it again after `for`): one episode, one trip, resolved keep_firing_for after the
    last drop (T0 + 150)."""
    sig = _gpu_signal(spec)
    crit = _tier(sig, "critical")
    step = spec.evaluation_interval_s
    assert crit.keep_firing_for_s > 2 * step  # the dip must fit inside it
    rec = tmp_path / "dip.om"
    _write_breach(rec, spec, above_s=150, dip=(90, 100), after_s=300)
    doc = _json(capsys, "--openmetrics", rec, "--spec", SPEC)
    eps = [a for a in doc["alerts"] if a["alertname"] == sig.alert and a["severity"] == crit.severity]
    assert len(eps) == 1
    assert T0 + crit.for_s <= eps[0]["firing_at"] <= T0 + crit.for_s + step
    assert T0 + 150 + crit.keep_firing_for_s <= eps[0]["resolved_at"] <= T0 + 150 + crit.keep_firing_for_s + step
    assert [f["level"] for f in doc["fuse"] if f["action"] == "trip"] == [spec.actions[crit.fuse].level]


@pytest.fixture(scope="module")
def victoriametrics_with_breach(tmp_path_factory, breach):
    """A real VictoriaMetrics single node holding the breach recording (imported as Prometheus
    text with millisecond timestamps, then flushed to be searchable)."""
    from fusebox.backtest.recording import read_openmetrics

    d = tmp_path_factory.mktemp("vm")
    port = free_port()
    proc = subprocess.Popen([str(victoriametrics_tool("victoria-metrics")), f"-storageDataPath={d}",
                             f"-httpListenAddr=127.0.0.1:{port}", "-retentionPeriod=100y"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with _serving(proc, f"http://127.0.0.1:{port}", "/health") as url:
        body = read_openmetrics(breach).prometheus_text().encode()
        urllib.request.urlopen(urllib.request.Request(f"{url}/api/v1/import/prometheus", data=body), timeout=30).read()
        urllib.request.urlopen(f"{url}/internal/force_flush", timeout=30).read()
        yield url


def test_a_victoriametrics_url_and_window_gives_what_the_file_gives(capsys, breach, victoriametrics_with_breach):
    a = _json(capsys, "--openmetrics", breach, "--spec", SPEC)
    b = _json(capsys, "--url", victoriametrics_with_breach, "--start", "2023-11-14T22:13:00Z",
              "--end", T0 + 240, "--spec", SPEC)
    assert b["start"] == T0 - 120  # 2023-11-14T22:13:00Z
    assert (a["start"], a["end"], a["alerts"], a["fuse"]) == (b["start"], b["end"], b["alerts"], b["fuse"])


def test_compare_shows_an_alert_a_longer_for_never_fires(capsys, spec, breach, tmp_path):
    """Over the threshold for 90 s: with `for` 100 s the critical never fires, so its firing and
    resolution and the trip are in the first run only."""
    sig = _gpu_signal(spec)
    raw = yaml_data(SPEC.read_text())
    raw["signals"][sig.name]["tiers"]["critical"]["for"] = "100s"
    other = tmp_path / "too-long.yaml"
    other.write_text(yaml_text(raw, sort_keys=False))
    doc = _json(capsys, "--openmetrics", breach, "--spec", SPEC, "--compare", other)
    crit = _tier(sig, "critical")
    gone = {m["event"] for m in doc["moves"]["alerts"]
            if m["alertname"] == sig.alert and m["severity"] == crit.severity and m["after"] is None}
    assert gone == {"firing_at", "resolved_at"}
    assert [(m["action"], m["after"], m["delta_s"]) for m in doc["moves"]["fuse"]] == [("trip", None, None), ("release", None, None)]
    rc, out, _ = _run(capsys, "--openmetrics", breach, "--spec", SPEC, "--compare", other)
    assert rc == 0 and "no longer" in out
