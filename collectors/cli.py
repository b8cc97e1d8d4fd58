"""``fusebox collect gpu|kv|latency|scenario``: wires arguments to the collectors.

Exit codes: 0 done, 1 a runtime failure, 2 bad input (file, config, arguments) or no GPU.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from fusebox.conventions import ATTR

from .cli_options import check_discover, common_options, discover_options, fetch_options, positive_seconds


def _fetcher(args):
    from .export import log_stderr
    from .fetch import Credentials, Fetcher, FetchLimits

    creds = Credentials(args.credentials_file, log=log_stderr) if args.credentials_file else None
    return Fetcher(FetchLimits(args.max_body_bytes, args.max_decompressed_bytes, args.max_series,
                               args.max_label_chars, args.max_models), creds)


def register(subparsers) -> None:
    p = subparsers.add_parser("collect", help="run a collector (gpu, kv, latency, conns, scenario)",
                              description="Collect GPU, KV-cache or alignment-latency signals and push them as OTLP "
                                          "(and/or serve them on /metrics); scenario plays a scenario file through them.")
    sub = p.add_subparsers(dest="collector", required=True, metavar="COLLECTOR")

    g = sub.add_parser("gpu", help="GPU memory, utilization, PCIe, power via NVML (or --replay a capture)")
    g.add_argument("--replay", metavar="PATH", help="nvidia-smi -q -x XML, --query-gpu CSV or exporter capture")
    g.add_argument("--replay-section", default="load", help="section of an exporter capture (load|idle)")
    g.add_argument("--sysfs", default=None, metavar="DIR",
                   help="sysfs to read the GPUs' PCIe topology from, for the links they share "
                        "(fusebox_gpu_pcie_upstream_utilization_ratio; default /sys, none with --replay)")
    common_options(g)
    g.set_defaults(func=cmd_gpu)

    k = sub.add_parser("kv", help="KV-cache bytes from vLLM/SGLang/TGI /metrics and the model's config.json",
                       description="KV-cache bytes per engine and GPU. Either one engine named by hand (--endpoint, "
                                   "--model-config, --gpu), or every engine pod on this node found through the "
                                   "Kubernetes API (--discover FILE --node-name NODE: GPUs from the kubelet's "
                                   "pod-resources API, geometry per model from FILE).")
    k.add_argument("--endpoint", action="append", default=None, metavar="URL_OR_PATH",
                   help="engine /metrics URL or a file; repeat for API-server processes of the same engine")
    k.add_argument("--model-config", default=None, metavar="PATH", help="the model's config.json")
    k.add_argument("--gpu", action="append", default=[], metavar="UUID", help="GPU/MIG UUID the engine runs on (one per tp rank)")
    k.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: number of --gpu, else 1)")
    k.add_argument("--kv-dtype", default=None, help="KV-cache dtype override, e.g. fp8 (default: engine cache_dtype or model dtype)")
    k.add_argument("--engine-id", default=None, help="the `engine` attribute (default: the model name)")
    k.add_argument("--model", default=None, help="the `model` attribute when the engine does not label it (TGI)")
    k.add_argument("--max-total-tokens", type=float, default=None, help="TGI --max-batch-total-tokens (TGI exposes no capacity)")
    discover_options(k)
    fetch_options(k)
    common_options(k)
    k.set_defaults(func=cmd_kv, check=lambda a: check_discover(k, a, ("endpoint", "model_config")))

    lat = sub.add_parser("latency", help="fallback: alignment latency derived from an engine's own histogram",
                         description="Re-record the increase of an engine's time-to-first-token histogram between "
                         "scrapes on the spec's buckets (an upper bound of the hand-off). With --once: one scrape, "
                         "everything the histogram counted since the engine started, printed in Prometheus text "
                         "format; exit 1 with the reason when the endpoint cannot be read or has no such histogram.")
    lat.add_argument("--endpoint", default=None, metavar="URL_OR_PATH", help="engine /metrics URL or file")
    lat.add_argument("--engine-id", default=None, help="the `engine` attribute")
    lat.add_argument("--model", default=None, help="the `model` attribute (default: the engine's model_name)")
    lat.add_argument("--metric", default=None, help="the one engine histogram to use (default: --encoder-metric, then "
                                                    "vLLM/SGLang time to first token)")
    lat.add_argument("--encoder-metric", action="append", default=[], metavar="NAME",
                     help="an engine's encoder / multimodal-stage histogram, read before time to first token "
                          "(source=\"encoder\"); repeat for several, the first present is used")
    lat.add_argument("--spec", default="fusebox.yaml", help="spec giving the buckets (default fusebox.yaml)")
    discover_options(lat)
    fetch_options(lat)
    common_options(lat)
    lat.set_defaults(func=cmd_latency, check=lambda a: check_discover(lat, a, ("endpoint", "engine_id")))

    c = sub.add_parser("conns", help="idle time and cold starts of gateway-engine connections (kernel TCP_INFO)",
                       description="Follow the long-lived TCP connections the spec's connections.peers select "
                                   "(inet_diag netlink, no eBPF): the longest idle time per peer address, the idle "
                                   "time each use ended (histogram on the spec's buckets) and the cold starts (uses "
                                   "after more than connections.cold_after idle). Run it in the gateway's network "
                                   "namespace (hostNetwork, or a sidecar of the gateway pod).")
    c.add_argument("--spec", default="fusebox.yaml", help="spec giving the peers, caps and buckets (default fusebox.yaml)")
    c.add_argument("--cold-after", type=positive_seconds, default=None, metavar="S",
                   help="a use after more than S seconds idle is a cold start (default: the spec's connections.cold_after)")
    common_options(c)
    c.set_defaults(func=cmd_conns)

    s = sub.add_parser("scenario", help="play a scenario file through the real collectors (demo)")
    s.add_argument("path", nargs="?", default=None, metavar="PATH", help="scenario YAML (default: the packaged 'breach')")
    s.add_argument("--speed", type=float, default=1.0, metavar="X", help="scenario seconds per wall second (default 1)")
    s.add_argument("--once-at", type=float, default=None, metavar="SECONDS",
                   help="print the collection at scenario time SECONDS in Prometheus text format and exit")
    s.add_argument("--timeline", choices=("text", "json"), default=None,
                   help="print the phases and the predicted threshold crossings, then exit")
    s.add_argument("--spec", default="fusebox.yaml", help="spec giving thresholds and buckets (default fusebox.yaml)")
    s.add_argument("--traces", action="store_true",
                   help="record each engine's slowest hand-off of each tick in an mm.handoff span, sent over OTLP "
                        "http/protobuf to the --otlp-endpoint's /v1/traces: its trace id becomes the bucket's exemplar")
    common_options(s, once=False)
    s.set_defaults(func=cmd_scenario)


# ------------------------------------------------------------------------- helpers
def _err(msg: str) -> None:
    print(f"fusebox collect: {msg}", file=sys.stderr, flush=True)


def _pipeline(args, service: str, keys, *, buckets=None, once: bool = False, host=None, cluster=None,
              instance_part: str | None = None, histograms=None):
    """The collector's Pipeline. ``instance_part`` (the engine id of a per-engine collector) is
    appended to the default ``service.instance.id`` so two such collectors on a host differ."""
    import socket

    from fusebox import conventions as C

    from .export import Pipeline, log_stderr, resolve_instance_id

    endpoint = None if (once or args.no_otlp) else (args.otlp_endpoint or _default_endpoint(args))
    host_name = args.host_name or host or socket.gethostname()
    instance_id = resolve_instance_id(args.instance_id, host_name, C.SERVICE.get(service, service), instance_part)
    return Pipeline(service, keys, histogram_buckets=buckets, histograms=histograms, host=host_name, instance_id=instance_id,
                    cluster=args.cluster or cluster, otlp_endpoint=endpoint, otlp_protocol=args.otlp_protocol,
                    log=log_stderr)


def _default_endpoint(args) -> str:
    from .export import DEFAULT_OTLP_GRPC, DEFAULT_OTLP_HTTP

    return DEFAULT_OTLP_GRPC if args.otlp_protocol == "grpc" else DEFAULT_OTLP_HTTP


def _announce(args, what: str) -> None:
    """One start-up line: where the data goes, so a silent collector is never a mystery."""
    from .fetch import redact_url

    sinks = []
    if not args.no_otlp:
        sinks.append(f"OTLP {args.otlp_protocol} to {redact_url(args.otlp_endpoint or _default_endpoint(args))}")
    if args.metrics_port is not None:
        sinks.append(f"/metrics on {args.metrics_addr}:{args.metrics_port}")
    if not sinks:
        _err("warning: --no-otlp without --metrics-port: collected values go nowhere (use --once to print them)")
    print(f"fusebox collect {what}: every {args.interval:g}s -> {', '.join(sinks) or 'nowhere'}",
          file=sys.stderr, flush=True)


def _loop(args, pipe, round_fn) -> int:
    if args.metrics_port is not None:
        pipe.serve_metrics(args.metrics_port, args.metrics_addr)
    n = 0
    try:
        while True:
            t0 = time.monotonic()
            round_fn()
            pipe.export_round()
            n += 1
            if args.rounds and n >= args.rounds:
                break
            time.sleep(max(0.0, args.interval - (time.monotonic() - t0)))
    finally:
        pipe.shutdown()
    return 0


def _spec_unreadable(path: str, what: str, e: Exception) -> None:
    """Say on stderr why the spec at ``path`` gave no ``what`` (``fusebox collect: PATH: no such
    file -- ...``): a file that is not there names the flag that fixes it (``--spec`` defaults to
    fusebox.yaml in the current folder, which the message names)."""
    from fusebox.spec.errors import unreadable

    if isinstance(e, (OSError, UnicodeDecodeError)):
        where = f"; a relative path is looked for in {os.getcwd()}" if not os.path.isabs(path) else ""
        _err(unreadable(path, e, f"pass --spec FILE, your fusebox.yaml: it gives the {what} (the default is "
                                 f"fusebox.yaml in the current folder{where})"))
    else:  # SpecError: one file:line:col line per problem
        _err(f"cannot read the {what} from {path}:\n{e}")


def _spec_buckets(path: str):
    from .latency import spec_buckets

    try:
        return spec_buckets(path)
    except Exception as e:  # SpecError (file:line:col lines), missing file
        _spec_unreadable(path, "latency buckets", e)
        return None


# ------------------------------------------------------------------------- commands
GPU_KEYS = ("gpu_up", "gpu_memory_usage", "gpu_memory_limit", "gpu_memory_ratio", "gpu_memory_reserved",
            "gpu_utilization", "gpu_memory_bandwidth_utilization", "gpu_pcie_utilization", "gpu_io", "gpu_power",
            "pcie_upstream_utilization")  # fmt: skip


def cmd_gpu(args) -> int:
    from .gpu import GpuCollector, NoGpuError

    if args.replay:
        from .replay import ReplayError, SyntheticNvml, load_replay

        try:
            frames = load_replay(args.replay, args.replay_section)
        except ReplayError as e:
            _err(str(e))
            return 2
        nvml: Any = SyntheticNvml.from_frames(frames)  # the NVML-shaped module GpuCollector calls
    else:
        import pynvml

        nvml = pynvml
    col = GpuCollector(nvml, sysfs=args.sysfs or (None if args.replay else "/sys"))
    try:
        col.open()
    except NoGpuError as e:
        _err(f"no NVIDIA GPU available ({e}).\n"
             "  This machine has no usable libnvidia-ml / driver. To run without a GPU, replay a capture:\n"
             "  fusebox collect gpu --replay nvidia-smi-q-x.xml --once   (or play a scenario: fusebox collect scenario)")
        return 2
    pipe = _pipeline(args, "gpu", GPU_KEYS, once=args.once)

    def one_round() -> None:
        pipe.set_readings(col.collect())
        pipe.set_gpu_errors(col.error_readings())
        pipe.set_pcie_skipped(col.pcie_skipped())
        if args.replay:
            nvml.advance()

    if args.once:
        one_round()
        sys.stdout.write(pipe.prometheus_text())
        for d in col.devices:
            if not d.up:
                _err(f"GPU {d.index} ({d.uuid}) is down: {d.last_error}")
        col.close()
        return 0
    _announce(args, "gpu")
    try:
        return _loop(args, pipe, one_round)
    finally:
        col.close()


KV_KEYS = ("kv_cache_usage", "kv_cache_limit")


def _gpu_memory_bytes(uuids: list[str]) -> float | None:
    """The total memory of the smallest of the GPUs ``uuids``, bytes: the GPU collector's
    ``hw.gpu.memory.limit`` of each (NVML, ``pynvml``); None without NVML, without ``uuids`` or
    for a UUID NVML does not list (the KV collector then checks its model config against the
    largest GPU made)."""
    if not uuids:
        return None
    from .gpu import GpuCollector

    try:
        import pynvml

        col = GpuCollector(pynvml).open()
    except Exception:  # noqa: BLE001 -- no driver, no library (NoGpuError, ImportError): the check falls back
        return None
    try:
        totals = {r.attrs[ATTR["gpu_id"]]: r.value for r in col.collect() if r.key == "gpu_memory_limit"}
    finally:
        col.close()
    return min(totals[u] for u in uuids) if all(u in totals for u in uuids) else None


def _discovery(args, *, devices: bool = True):
    """(Discovery, PodWatcher, PodResourcesClient or None) of --discover, or None after saying why
    (an engines file that is invalid, no Kubernetes configuration: exit 2). ``devices``: ask the
    kubelet which GPUs each pod holds (the KV collector; alignment latency has no hw_id)."""
    from .discover import DEFAULT_MAX_ENGINES, Discovery
    from .engines import EnginesConfigError, load_engines_config
    from .export import log_stderr
    from .podresources import PodResourcesClient
    from .podwatch import PodWatcher, core_api

    try:
        cfg = load_engines_config(args.discover)
    except EnginesConfigError as e:
        _err(str(e))
        return None
    try:
        api = core_api(args.kubeconfig)
    except Exception as e:  # noqa: BLE001 -- ConfigException, an unreadable kubeconfig: said, exit 2
        _err(f"no Kubernetes API configuration ({type(e).__name__}: {e}) -- run in a pod with a service account, "
             "or pass --kubeconfig PATH")
        return None
    watcher = PodWatcher(api, args.node_name, cfg.namespaces, cfg.label_selector, log=log_stderr).start()
    podres = PodResourcesClient(args.pod_resources_socket, timeout_s=args.timeout, log=log_stderr) if devices else None
    disc = Discovery(cfg, watcher, devices=podres.devices if podres else None,
                     device_errors=podres.error_readings if podres else None,
                     max_engines=args.max_engines or DEFAULT_MAX_ENGINES, log=log_stderr)
    # the first round sees the pods the API server lists; a slow API server only delays them
    watcher.wait_synced(min(10.0, max(args.interval, 1.0)))
    return disc, watcher, podres


def _cmd_kv_discover(args) -> int:
    from .discover import DiscoveredKv
    from .export import log_stderr
    from .kvcache import KvCollector

    got = _discovery(args)
    if got is None:
        return 2
    disc, watcher, podres = got
    fetch = _fetcher(args)
    models = disc.config.models
    kv = DiscoveredKv(disc, lambda url: KvCollector([url], None, models=models, kv_dtype=args.kv_dtype,
                                                    timeout_s=args.timeout, fetch=fetch, log=log_stderr))
    pipe = _pipeline(args, "kv", KV_KEYS, once=args.once)

    def one_round() -> None:
        pipe.set_readings(kv.collect())
        pipe.set_errors(kv.error_readings())
        pipe.set_refused(kv.refused_readings())
        pipe.set_dropped(kv.dropped_readings())
        pipe.set_incomplete(kv.incomplete_readings())
        pipe.set_discovery(disc.skipped_readings(), disc.error_readings())

    try:
        if args.once:
            one_round()
            sys.stdout.write(f"# fusebox: {len(kv.per_pod)} engine pod(s) discovered on node {args.node_name}\n")
            sys.stdout.write(pipe.prometheus_text())
            if not watcher.wait_synced(0):
                _err("kv: the Kubernetes API did not list the pods (see above): nothing discovered")
                return 1
            return 0 if not any(n for _a, n in kv.error_readings()) else 1
        _announce(args, f"kv (discovering engine pods on node {args.node_name})")
        return _loop(args, pipe, one_round)
    finally:
        watcher.stop()
        if podres is not None:
            podres.close()


def cmd_kv(args) -> int:
    from .export import log_stderr
    from .kvcache import ConfigError, KvCollector, kv_geometry, load_model_config

    args.check(args)
    if args.discover:
        return _cmd_kv_discover(args)

    try:
        cfg = load_model_config(args.model_config)
        geo = kv_geometry(cfg, args.kv_dtype, source=args.model_config)
        col = KvCollector(args.endpoint, geo, gpus=args.gpu, tp=args.tp, engine_id=args.engine_id, model=args.model,
                          max_total_tokens=args.max_total_tokens, kv_dtype=args.kv_dtype,
                          gpu_memory_bytes=_gpu_memory_bytes(args.gpu), timeout_s=args.timeout,
                          fetch=_fetcher(args), log=log_stderr)
    except (ConfigError, ValueError) as e:
        _err(str(e))
        return 2
    pipe = _pipeline(args, "kv", KV_KEYS, once=args.once, instance_part=args.engine_id)

    def one_round() -> None:
        pipe.set_readings(col.collect())
        pipe.set_errors(col.error_readings())
        pipe.set_refused(col.refused_readings())
        pipe.set_dropped(col.dropped_readings())
        pipe.set_incomplete(col.incomplete_readings())

    if args.once:
        one_round()
        sys.stdout.write(f"# fusebox: {geo.bytes_per_token} bytes per token ({geo.layers} attention layers x "
                         f"{geo.kv_heads} KV heads x {geo.head_dim} head dim x {geo.dtype_bytes} B x 2), tp {col.tp}\n")
        for note in sorted(col.notes):
            sys.stdout.write(f"# fusebox: {note}\n")
        sys.stdout.write(pipe.prometheus_text())
        return 0 if not col.errors else 1
    _announce(args, "kv")
    return _loop(args, pipe, one_round)


def _cmd_latency_discover(args, buckets) -> int:
    from .discover import DiscoveredLatency
    from .export import log_stderr
    from .latency import EngineHistogramFallback

    got = _discovery(args, devices=False)
    if got is None:
        return 2
    disc, watcher, _podres = got
    pipe = _pipeline(args, "latency", (), buckets=buckets, once=args.once)
    fetch = _fetcher(args)
    lat = DiscoveredLatency(
        disc, lambda engine, url: EngineHistogramFallback(
            pipe.alignment, engine=engine, model=args.model, metric=args.metric, endpoint=url, timeout_s=args.timeout,
            fetch=fetch, log=log_stderr, encoder_metrics=args.encoder_metric),
        pipe.forget_alignment)
    said: dict[str, str] = {}

    def one_round() -> None:
        lat.poll()
        pipe.set_errors(lat.error_readings())
        pipe.set_refused(lat.refused_readings())
        pipe.set_dropped(lat.dropped_readings())
        pipe.set_discovery(disc.skipped_readings(), disc.error_readings())
        for engine, source in lat.sources.items():
            if said.get(engine) != source:
                said[engine] = source
                print(f"fusebox collect latency: {engine}: alignment latency from {source} "
                      f"(source={_source_of(source, args.encoder_metric)})", file=sys.stderr, flush=True)

    try:
        _announce(args, f"latency (discovering engine pods on node {args.node_name})")
        return _loop(args, pipe, one_round)
    finally:
        watcher.stop()


def _source_of(metric: str, encoder_metrics) -> str:
    from .latency import source_of

    return source_of(metric, encoder_metrics)


CONN_KEYS = ("connection_idle_time", "connection_cold_starts")


def conn_buckets(spec) -> tuple[float, ...]:
    """The idle-before-use histogram's bounds: every bucket of the spec's signals that read it
    (the quantile kind over ``fusebox_connection_idle_before_use_seconds``), merged."""
    from fusebox import conventions as C

    metric = C.PROM["connection_idle_before_use"]
    return tuple(sorted({b for s in spec.signals if s.source.metric == metric for b in s.buckets}))


def cmd_conns(args) -> int:
    from .conns import ConnCollector
    from .export import log_stderr

    try:
        from fusebox.spec import load_spec

        spec = load_spec(args.spec)
    except Exception as e:  # SpecError (file:line:col lines), missing file
        _spec_unreadable(args.spec, "connections to follow", e)
        return 2
    if not spec.connections.peers:
        _err(f"{args.spec}: connections.peers is empty, so there is nothing to follow -- name the engines' port, "
             "e.g. connections: {peers: {vllm: {ports: [8000]}}} (docs/spec.md)")
        return 2
    buckets = conn_buckets(spec)
    if not buckets:
        _err(f"{args.spec}: no signal reads fusebox_connection_idle_before_use_seconds, so the idle histogram has no "
             "buckets -- add the connection signals of the shipped fusebox.yaml (kind quantile, with buckets)")
        return 2
    col = ConnCollector(spec.connections, cold_after_s=args.cold_after, log=log_stderr)
    pipe = _pipeline(args, "conns", CONN_KEYS, once=args.once, histograms={"connection_idle_before_use": buckets})

    def one_round() -> None:
        col.poll()
        col.record(pipe.histograms["connection_idle_before_use"])
        pipe.set_readings(col.readings())
        pipe.set_conns(*col.self_counts())

    if args.once:
        one_round()
        sys.stdout.write(pipe.prometheus_text())
        return 1 if col.errors else 0
    _announce(args, "conns")
    return _loop(args, pipe, one_round)


def cmd_latency(args) -> int:
    from .fetch import redact_url
    from .latency import FALLBACK_SOURCES as LAT_SOURCES
    from .latency import EngineHistogramFallback

    args.check(args)
    if args.discover and args.once:
        _err("latency: --once and --discover exclude each other (--once prints one engine's histogram since it "
             "started) -- drop --once and read /metrics on --metrics-port, a round every --interval seconds")
        return 2
    buckets = _spec_buckets(args.spec)
    if buckets is None:
        return 2
    if args.discover:
        return _cmd_latency_discover(args, buckets)
    pipe = _pipeline(args, "latency", (), buckets=buckets, once=args.once, instance_part=args.engine_id)
    from .export import log_stderr

    fb = EngineHistogramFallback(pipe.alignment, engine=args.engine_id, model=args.model, metric=args.metric,
                                 endpoint=args.endpoint, timeout_s=args.timeout, fetch=_fetcher(args), log=log_stderr,
                                 encoder_metrics=args.encoder_metric)
    said = [False]

    def poll() -> None:
        fb.poll()
        pipe.set_errors(fb.error_readings())
        pipe.set_refused(fb.refused_readings())
        pipe.set_dropped(fb.dropped_readings())

    def one_round() -> None:
        poll()
        if fb.source and not said[0]:
            said[0] = True
            print(f"fusebox collect latency: deriving alignment latency from {fb.source} "
                  f"(engine histogram, source={_source_of(fb.source, args.encoder_metric)}; time to first token is "
                  "an upper bound of the hand-off)", file=sys.stderr, flush=True)

    if args.once:
        # one scrape: everything the engine's histogram counted since it started, on the spec's buckets
        n = fb.poll(since_start=True)
        if fb.problem:
            _err(f"latency: cannot read {redact_url(args.endpoint)}: {fb.problem}")
            return 1
        if not fb.source:
            tried = args.metric or " or ".join(LAT_SOURCES)
            _err(f"latency: no histogram {tried} (its _bucket series) in {redact_url(args.endpoint)} -- "
                 "point --endpoint at the engine's /metrics, or name the histogram with --metric")
            return 1
        sys.stdout.write(f"# fusebox: alignment latency derived from {fb.source}: {n} observation(s) since the engine "
                         "started\n")
        sys.stdout.write(pipe.prometheus_text())
        return 0
    _announce(args, "latency")
    return _loop(args, pipe, one_round)


def cmd_scenario(args) -> int:
    from .scenario import ScenarioError, ScenarioRunner, load_scenario

    try:
        sc = load_scenario(args.path)
    except ScenarioError as e:
        _err(str(e))
        return 2
    if args.timeline:
        from fusebox.spec import SpecError, load_spec  # pydantic and pint: only when a spec is read

        try:
            spec = load_spec(args.spec)
        except (OSError, SpecError) as e:
            _spec_unreadable(args.spec, "thresholds", e)
            return 2
        crossings = sc.predict(spec)
        if args.timeline == "json":
            json.dump({"scenario": sc.name, "duration_s": sc.duration_s, "tick_s": sc.tick_s,
                       "phases": sc.timeline(), "crossings": [c.as_dict() for c in crossings]}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print(f"scenario {sc.name}: {sc.duration_s:.0f} s at speed 1 ({sc.path})")
            for p in sc.phases:
                print(f"  {p.start_s:6.0f}s - {p.end_s:6.0f}s  {p.name:10s} {p.description}")
            print("predicted crossings (Prometheus semantics, samples every scrape interval):")
            for c in crossings:
                print(f"  {c.time_s:6.0f}s  {c.signal:24s} {c.tier:8s} {c.event:8s} {c.entity}  "
                      f"value={c.value:.4g} threshold={c.threshold:.4g} phase={c.phase}")
        return 0
    buckets = _spec_buckets(args.spec)
    if buckets is None:
        return 2
    once = args.once_at is not None
    if once and not 0 <= args.once_at <= sc.duration_s:
        _err(f"--once-at {args.once_at:g} is outside the scenario (0..{sc.duration_s:g} s at speed 1)")
        return 2
    from fusebox.spec import load_spec

    spec = load_spec(args.spec)  # read above: no error left
    conns = conn_buckets(spec)
    pipe = _pipeline(args, "scenario", ScenarioRunner.KEYS, buckets=buckets, once=once, host=sc.host,
                     cluster=sc.cluster or None, histograms={"connection_idle_before_use": conns} if conns else None)
    spans = _span_provider(args, sc.host) if args.traces and not once else None
    if args.traces and not once and spans is None:
        return 2
    runner = ScenarioRunner(sc, pipe, cold_after_s=spec.connections.cold_after_s,
                            tracer=spans.get_tracer("fusebox.scenario") if spans else None)
    if once:
        runner.step(min(args.once_at, sc.duration_s))
        p = sc.phase_at(args.once_at)
        sys.stdout.write(f"# fusebox: scenario {sc.name} t={args.once_at:g}s phase={p.name}\n")
        sys.stdout.write(pipe.prometheus_text())
        return 0
    if args.metrics_port is not None:
        pipe.serve_metrics(args.metrics_port, args.metrics_addr)
    try:
        runner.run(speed=args.speed, say=lambda m: print(m, flush=True))
    finally:
        pipe.shutdown()
        if spans is not None:
            spans.shutdown()  # flushes the last spans
    return 0


def _span_provider(args, host: str | None):
    """``collect scenario --traces``: a TracerProvider (every span sampled) batching spans over OTLP
    http/protobuf to ``--otlp-endpoint`` + ``/v1/traces``; None (after the error) where spans cannot go."""
    if args.no_otlp or args.otlp_protocol != "http":
        _err("--traces sends spans over OTLP http/protobuf: drop --no-otlp and --otlp-protocol grpc")
        return None
    import socket

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    from fusebox import conventions as C

    base = (args.otlp_endpoint or _default_endpoint(args)).rstrip("/")
    resource = Resource.create({"service.name": C.SERVICE["scenario"],
                                "host.name": args.host_name or host or socket.gethostname()})
    provider = TracerProvider(resource=resource, sampler=ALWAYS_ON)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=base + "/v1/traces", timeout=5),
                                                   schedule_delay_millis=500))
    return provider
