"""The demo stack: generate from a demo spec, then start every process on free loopback ports.

Order: reference gateway, the SGLang Model Gateway (``sglang-router``) in front of one stand-in
engine per scenario GPU (unless ``gateway="reference"``), fuse service, Alertmanager,
OpenTelemetry Collector, the rule engine (:mod:`.rule_engines`: Prometheus, or VictoriaMetrics with
vmalert; each process waited for on its readiness URL), then the scenario player. The fuse
acts on the SGLang gateway (levels 1 and 3: the worker of the GPU or engine out of rotation)
and on the reference gateway (every level; level 2, text-only, has no SGLang equivalent).
Ports are picked free at start; the generated Alertmanager config gets the fuse service's port
through the demo spec's ``webhook_url``, the Collector through its ``FUSEBOX_*`` environment
variables, the rule engine through the config written here.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fusebox.spec.adapter_kinds import ADAPTER_LEVELS
from fusebox.tooling import OTELCOL_VERSION, ToolMissing, free_port, jaeger_tool, otelcol_tool, tools_dir

from .rule_engines import Engine, StartContext, engine_class, make_engine, prometheus_config
from .spec import FAST, Timing, demo_spec_text
from .supervisor import Child, ChildDied, Supervisor

if TYPE_CHECKING:
    from fusebox.spec import Spec

__all__ = ["Ports", "StackOptions", "Stack", "ToolMissing", "find_tools", "jaeger_config", "prometheus_config"]

PORT_NAMES = ("prometheus", "alertmanager", "otlp_grpc", "otlp_http", "otel_prometheus", "otel_health",
              "otel_telemetry", "gateway", "fuse", "sglang", "sglang_metrics", "jaeger_otlp", "jaeger_query",
              "jaeger_query_grpc")


@dataclass(frozen=True)
class Ports:
    prometheus: int
    alertmanager: int
    otlp_grpc: int
    otlp_http: int
    otel_prometheus: int
    otel_health: int
    otel_telemetry: int
    gateway: int
    fuse: int
    sglang: int
    sglang_metrics: int
    jaeger_otlp: int
    jaeger_query: int
    jaeger_query_grpc: int
    # one per VictoriaMetrics + vmalert pair (the victoriametrics engine's replicas)
    victoriametrics: tuple[int, ...] = field(default=())
    vmalert: tuple[int, ...] = field(default=())

    @classmethod
    def pick(cls, replicas: int = 1) -> Ports:
        """Distinct free loopback ports: one per :data:`PORT_NAMES`, and ``replicas`` each for
        VictoriaMetrics and vmalert."""
        ports: list[int] = []
        while len(ports) < len(PORT_NAMES) + 2 * replicas:
            p = free_port()
            if p not in ports:
                ports.append(p)
        n = len(PORT_NAMES)
        return cls(**dict(zip(PORT_NAMES, ports[:n], strict=False)), victoriametrics=tuple(ports[n:n + replicas]),
                   vmalert=tuple(ports[n + replicas:]))


def find_tools(engine: str = "prometheus") -> dict[str, str]:
    """Paths of the rule engine's programs (:mod:`.rule_engines`), Alertmanager and the Collector
    built by tools/build-otelcol.sh; ``jaeger`` too where tools/build-jaeger.sh built it (optional).

    Raises:
        ToolMissing: naming each missing binary and ``make tools``.
        ValueError: an unknown engine.
    """
    eng_found, eng_missing = engine_class(engine).find_tools()
    found: dict[str, str | None] = {
        "alertmanager": os.environ.get("FUSEBOX_ALERTMANAGER") or shutil.which("prometheus-alertmanager")
        or shutil.which("alertmanager"),
    }
    try:
        found["otelcol"] = str(otelcol_tool())
    except ToolMissing:
        found["otelcol"] = None
    where = {"alertmanager": "prometheus-alertmanager (>= 0.25)",
             "otelcol": f"the OpenTelemetry Collector ({tools_dir()}/otelcol-{OTELCOL_VERSION}/otelcol-fusebox)"}
    missing = eng_missing + [where[k] for k, v in found.items() if not v]
    if missing:
        raise ToolMissing("missing " + ", ".join(missing)
                          + ": run `make tools` (tools/bootstrap.sh installs and builds them)")
    tools = {**eng_found, **{k: str(v) for k, v in found.items()}}
    try:  # optional: without it the demo runs as before, with no traces
        tools["jaeger"] = str(jaeger_tool())
    except ToolMissing:
        pass
    return tools


@dataclass
class StackOptions:
    """What one demo run starts.

    Attributes:
        workdir: generated files, logs, state and storage go here (wiped at start).
        spec: the user's spec (read only; the demo writes its own variant into ``workdir``).
        scenario: scenario file, or None for the packaged ``breach``.
        speed: scenario seconds per wall second. KV growth is bytes per *scenario* second, so
            the rate Prometheus sees is multiplied by it: keep it <= 1.25 with the breach
            scenario (its pressure phase grows at 11 MB/s, under the shipped spec's critical).
        timing: demo durations, or None to keep the spec's own intervals.
        hold_s: the fuse service's release hold time.
        gateway: ``sglang`` (the SGLang Model Gateway in the loop as well) or ``reference``.
        engine: the rule engine, ``prometheus`` or ``victoriametrics`` (:mod:`.rule_engines`).
        replicas: victoriametrics only: independent VictoriaMetrics + vmalert pairs, each
            scraping the same targets and notifying the same Alertmanager (HA when > 1).
    """

    workdir: Path
    spec: Path = Path("fusebox.yaml")
    scenario: str | None = None
    speed: float = 1.25
    timing: Timing | None = FAST
    hold_s: float = 10.0
    grafana_url: str | None = None
    gateway: str = "sglang"  # "sglang": the real SGLang Model Gateway too; "reference": the reference gateway alone
    engine: str = "prometheus"
    replicas: int = 1


def _fusebox() -> list[str]:
    return [sys.executable, "-m", "fusebox.cli"]


class Stack:
    def __init__(self, opts: StackOptions, *, say: Callable[[str], None] = lambda _m: None):
        self.opts = opts
        self.say = say
        self.workdir = Path(opts.workdir).resolve()
        self.ports = Ports.pick(opts.replicas)
        self.rule_engine: Engine = make_engine(opts.engine, self.ports, opts.replicas)  # ValueError: bad engine/replicas
        self.sup = Supervisor(self.workdir / "logs", say=say)
        self.tools: dict[str, str] = {}
        self.spec_path = self.workdir / "fusebox.demo.yaml"
        self.token_path = self.workdir / "fuse.token"
        self.gateway_log = self.workdir / "gateway.jsonl"
        self.out = self.workdir / "generated"
        self.scenario_child: Child | None = None
        self.scenario_runs = 0
        self.spec: Spec | None = None  # set by prepare()
        self.engines: list = []  # stand-in engines (StandInEngine), one per scenario GPU
        self.worker_names: dict[str, str] = {}  # stand-in URL -> what it stands for

    # -- URLs -------------------------------------------------------------------------
    @property
    def urls(self) -> dict[str, str]:
        p = self.ports
        u = {**self.rule_engine.ui_urls, "alertmanager": f"http://127.0.0.1:{p.alertmanager}",
             "fuse": f"http://127.0.0.1:{p.fuse}", "gateway": f"http://127.0.0.1:{p.gateway}",
             "otlp": f"http://127.0.0.1:{p.otlp_http}"}
        if self.opts.gateway == "sglang":
            u["sglang"] = f"http://127.0.0.1:{p.sglang}"
        if self.opts.grafana_url:
            u["grafana"] = self.opts.grafana_url
        if self.traces:
            u["jaeger"] = f"http://127.0.0.1:{p.jaeger_query}"
        return u

    @property
    def traces(self) -> bool:
        """Whether this run shows traces: Jaeger built, the spec's ``otelcol.traces`` set, Prometheus
        the rule engine (the one that stores exemplars). Known after :meth:`prepare`."""
        return bool(self.tools.get("jaeger")) and self.spec is not None and self.spec.otelcol.traces is not None \
            and self.opts.engine == "prometheus"

    def _sglang_adapters(self) -> dict:
        """Stand-in engines (one per scenario GPU) and the spec's ``fuse.adapters`` mapping each
        GPU (``hw_id``) and each engine (``engine``, on its first GPU) to its worker."""
        from fusebox.collectors.scenario import load_scenario

        from .standin import StandInEngine

        sc = load_scenario(self.opts.scenario)
        by_gpu = {}
        for g in sc.gpus:
            e = StandInEngine()
            self.engines.append(e)
            by_gpu[g.uuid] = e.url
            self.worker_names[e.url] = f"GPU {g.index} ({g.role})" if getattr(g, "role", None) else f"GPU {g.index}"
        targets = [{"match": {"hw_id": uuid}, "worker_url": url} for uuid, url in by_gpu.items()]
        for eng in sc.engines:
            if eng.gpus:
                url = by_gpu[sc.gpu(eng.gpus[0]).uuid]
                targets.append({"match": {"engine": eng.id}, "worker_url": url})
                self.worker_names[url] += f" {eng.id}"
        levels = {a.level: n for n, a in _actions(self.opts.spec).items()}
        actions = [levels[lv] for lv in ADAPTER_LEVELS["sglang_gateway"] if lv in levels]
        return {"sglang": {"kind": "sglang_gateway", "url": self.urls["sglang"], "actions": actions, "timeout": "5s",
                           "targets": targets}}

    # -- preparation ------------------------------------------------------------------
    def prepare(self) -> None:
        """Wipe ``workdir``, write the token, the demo spec and the rule engine's config, generate.

        Raises:
            ToolMissing, ValueError (bad spec), RuntimeError (generate failed, with its output).
        """
        from fusebox.spec import load_spec

        self.tools = find_tools(self.opts.engine)
        self.rule_engine.tools = self.tools
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)
        self.token_path.write_text(secrets.token_hex(16) + "\n")
        self.token_path.chmod(0o600)
        base = Path(self.opts.spec).read_text(encoding="utf-8")
        adapters = None
        if self.opts.gateway == "sglang":
            try:
                import sglang_router  # noqa: F401
            except ImportError:
                raise ToolMissing("the SGLang Model Gateway (sglang-router, in the test extra) is not installed: "
                                  "`make venv`, or run with --gateway reference") from None
            adapters = self._sglang_adapters()
        self.spec_path.write_text(demo_spec_text(
            base, webhook_url=f"{self.urls['fuse']}/alertmanager", credentials_file=str(self.token_path),
            timing=self.opts.timing, source=str(self.opts.spec), adapters=adapters))
        r = subprocess.run([*_fusebox(), "generate", "--spec", str(self.spec_path), "--out", str(self.out)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"fusebox generate failed on {self.spec_path}:\n{r.stdout}{r.stderr}")
        self.spec = load_spec(self.spec_path)
        from fusebox.generator.outputs import ALERTMANAGER_FILE, RULE_FILE

        self.rules_file = self.out / RULE_FILE
        self.am_file = self.out / ALERTMANAGER_FILE
        self.otel_file = self.out / "otel" / "otelcol.yaml"
        self.rule_engine.prepare(self.workdir, self.spec, self.rules_file)

    # -- processes --------------------------------------------------------------------
    def start(self, *, deadline_s: float = 60.0) -> None:
        """Start the services and wait until each is ready (raises ChildDied / TimeoutError)."""
        p, w, t = self.ports, self.workdir, self.tools
        gw = self.sup.start("gateway", [*_fusebox(), "fuse", "gateway", "--listen", f"127.0.0.1:{p.gateway}",
                                        "--log", str(self.gateway_log)])
        self._ready(gw, f"{self.urls['gateway']}/healthz", deadline_s)
        if self.opts.gateway == "sglang":
            sg = self.sup.start("sglang-gateway", [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                                                   "--port", str(p.sglang), "--prometheus-host", "127.0.0.1",
                                                   "--prometheus-port", str(p.sglang_metrics), "--log-level", "warn",
                                                   "--worker-urls", *[e.url for e in self.engines]])
            self._ready(sg, f"{self.urls['sglang']}/readiness", deadline_s)  # 200 once its workers are healthy
        fuse = self.sup.start("fuse", [*_fusebox(), "fuse", "serve", "--spec", str(self.spec_path),
                                       "--listen", f"127.0.0.1:{p.fuse}", "--state-dir", str(w / "fuse"),
                                       "--token-file", str(self.token_path), "--gateway-url", self.urls["gateway"],
                                       "--hold", f"{self.opts.hold_s:g}"])
        self._ready(fuse, f"{self.urls['fuse']}/healthz", deadline_s)
        am = self.sup.start("alertmanager", [t["alertmanager"], f"--config.file={self.am_file}",
                                             f"--storage.path={w / 'alertmanager'}",
                                             f"--web.listen-address=127.0.0.1:{p.alertmanager}",
                                             "--cluster.listen-address=", "--log.level=warn"])
        env = dict(os.environ, FUSEBOX_OTLP_GRPC_ENDPOINT=f"127.0.0.1:{p.otlp_grpc}",
                   FUSEBOX_OTLP_HTTP_ENDPOINT=f"127.0.0.1:{p.otlp_http}",
                   FUSEBOX_OTELCOL_PROMETHEUS_ENDPOINT=f"127.0.0.1:{p.otel_prometheus}",
                   FUSEBOX_OTELCOL_HEALTH_ENDPOINT=f"127.0.0.1:{p.otel_health}",
                   FUSEBOX_OTELCOL_TELEMETRY_HOST="127.0.0.1", FUSEBOX_OTELCOL_TELEMETRY_PORT=str(p.otel_telemetry))
        if self.traces:
            env["FUSEBOX_TRACES_ENDPOINT"] = f"127.0.0.1:{p.jaeger_otlp}"
            self._start_jaeger(deadline_s)
        col = self.sup.start("otelcol", [t["otelcol"], f"--config={self.otel_file}"], env=env)
        self.rule_engine.start(StartContext(self.sup, lambda child, url: self._ready(child, url, deadline_s), w))
        self._ready(am, f"{self.urls['alertmanager']}/-/ready", deadline_s)
        self._ready(col, f"http://127.0.0.1:{p.otel_health}/", deadline_s)

    def _start_jaeger(self, deadline_s: float) -> None:
        """Jaeger v2 in memory on the demo's loopback ports (:func:`jaeger_config`)."""
        import yaml

        p = self.ports
        cfg = self.workdir / "jaeger.yaml"
        cfg.write_text(yaml.safe_dump(jaeger_config(otlp_grpc=p.jaeger_otlp, query=p.jaeger_query,
                                                    query_grpc=p.jaeger_query_grpc)))
        jaeger = self.sup.start("jaeger", [self.tools["jaeger"], f"--config={cfg}"])
        self._ready(jaeger, f"{self.urls['jaeger']}/api/services", deadline_s)

    def stop_replica(self, index: int) -> None:
        """Stop the rule engine's replica ``index`` for good (a node lost mid-run), saying which
        processes; the rest of the stack keeps running. ValueError when there is none such."""
        gone = self.rule_engine.stop_replica(self.sup, index)
        self.say("demo: stopping replica " + str(index + 1) + ": "
                 + ", ".join(f"{c.name} (pid {c.pid})" for c in gone))

    def start_scenario(self, on_line: Callable[[float, str], None] | None = None) -> Child:
        """Start (or restart) the scenario player; it exits 0 at the scenario's end."""
        if self.scenario_child is not None:
            self.sup.children.remove(self.scenario_child)
        self.scenario_runs += 1
        args = [*_fusebox(), "collect", "scenario"] + ([self.opts.scenario] if self.opts.scenario else []) + [
            "--speed", f"{self.opts.speed:g}", "--spec", str(self.spec_path), "--otlp-endpoint", self.urls["otlp"]] \
            + (["--traces"] if self.traces else [])
        self.scenario_child = self.sup.start(f"scenario-{self.scenario_runs}" if self.scenario_runs > 1 else "scenario",
                                             args, may_exit=True, on_line=on_line)
        return self.scenario_child

    def _ready(self, child: Child, url: str, deadline_s: float) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if child.proc.poll() is not None:
                raise ChildDied(child)
            try:
                with urllib.request.urlopen(url, timeout=1):  # noqa: S310 -- loopback
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"{child.name} (pid {child.pid}) not ready at {url} after {deadline_s:g}s; "
                           f"its log: {child.log_path}")

    def stop(self) -> None:
        self.sup.stop_all()
        for e in self.engines:
            e.stop()
        self.engines.clear()


def jaeger_config(*, otlp_grpc: int, query: int, query_grpc: int) -> dict:
    """Jaeger v2's all-in-one config (its cmd/jaeger/internal/all-in-one.yaml) cut to what the demo
    uses: OTLP gRPC in, memory storage, the query service (UI and ``/api``); every listener on
    127.0.0.1 at the given ports, no others (its own metrics and its queries' traces off)."""
    loop = "127.0.0.1:{}".format
    return {
        "service": {"extensions": ["jaeger_storage", "jaeger_query"],
                    "pipelines": {"traces": {"receivers": ["otlp"], "processors": ["batch"],
                                             "exporters": ["jaeger_storage_exporter"]}},
                    "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}}},
        "extensions": {
            "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": 100_000}}}},
            "jaeger_query": {"storage": {"traces": "memstore"}, "enable_tracing": False,
                             "http": {"endpoint": loop(query)}, "grpc": {"endpoint": loop(query_grpc)}},
        },
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": loop(otlp_grpc)}}}},
        "processors": {"batch": {"timeout": "200ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
    }


def _actions(spec_path: Path) -> dict:
    from fusebox.spec import load_spec

    return load_spec(spec_path).actions


def http_text(url: str, timeout: float = 2.0) -> str:
    """GET ``url`` and decode its body as UTF-8 (a /metrics page)."""
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 -- loopback
        return r.read().decode("utf-8", "replace")


def http_json(url: str, timeout: float = 2.0, token: str | None = None):
    """GET ``url`` and decode its JSON; ``token``: sent as ``Authorization: Bearer``."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 -- loopback
        return json.loads(r.read())
