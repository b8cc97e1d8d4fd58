"""``fusebox fuse serve`` (the Alertmanager webhook -> breaker -> gateway service) and
``fusebox fuse gateway`` (the reference gateway that logs what it is told)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import re
import stat
import sys
from pathlib import Path

from fusebox import conventions as C

from .intake.breaker import DEFAULT_HOLD_S

DEFAULT_LISTEN = "127.0.0.1:9095"


def state_path(args: argparse.Namespace) -> Path:
    """The SQLite file ``serve`` uses: ``--state FILE`` as given, else ``--state-dir``/fuse.sqlite,
    the folder created with mode 0700 when missing (state, outbox and audit log are private).

    Raises:
        OSError: the folder cannot be created, or it is not a folder.
    """
    from .store import STATE_FILE, default_state_dir

    if args.state:
        return Path(args.state)
    folder = Path(args.state_dir) if args.state_dir else default_state_dir()
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"--state-dir {folder}: not a directory -- pass a directory (it is created when missing)")
    if not folder.exists():
        try:
            folder.mkdir(parents=True, mode=0o700)
            os.chmod(folder, 0o700)  # whatever the umask
        except OSError as e:
            raise OSError(f"--state-dir {folder}: cannot create it ({e.strerror or e}) -- pass a writable "
                          "--state-dir DIR") from None
    elif stat.S_IMODE(folder.stat().st_mode) & 0o077:
        logging.getLogger("fusebox.fuse").warning(
            "state directory %s is open to group or others (mode %o): chmod 700 it", folder,
            stat.S_IMODE(folder.stat().st_mode))
    return folder / STATE_FILE


def _hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds, e.g. 300") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number of seconds, e.g. 300")
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return v


def _positive_seconds(text: str) -> float:
    """A connection deadline: 0 would drop every connection whose head comes in two reads (the
    kubelet's /healthz probe among them), so it must be above 0."""
    v = _seconds(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0 (a deadline of 0 closes connections before their head arrives)")
    return v


def _attempts(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= 1, e.g. 5")
    return int(text)


def register(subparsers) -> argparse._SubParsersAction:
    """Add ``fuse`` and its subcommands to ``subparsers``; returns the subcommands' action (the
    top-level CLI adds ``gateway`` to it)."""
    from .store import STATE_FILE

    p = subparsers.add_parser("fuse", help="the fuse service (Alertmanager webhook -> tiered circuit breaker) and its tools: "
                                           "serve, override, audit, a reference gateway",
                              description=__doc__)
    sub = p.add_subparsers(dest="fuse_command", required=True, metavar="SUBCOMMAND")

    s = sub.add_parser("serve", help="receive Alertmanager notifications and trip/release fuses on the gateway")
    s.add_argument("--spec", default="fusebox.yaml", help="the fusebox spec (levels and actions per alert)")
    s.add_argument("--listen", type=_hostport, default=DEFAULT_LISTEN, help=f"HOST:PORT (default {DEFAULT_LISTEN})")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--state-dir", metavar="DIR", default=None,
                       help=f"directory of the SQLite file ({STATE_FILE}: breaker state, outbox, audit log); created "
                            "with mode 0700 when missing (default: $XDG_DATA_HOME/fusebox, else "
                            "~/.local/share/fusebox)")
    where.add_argument("--state", metavar="FILE", default=None,
                       help="an explicit SQLite file instead of --state-dir (its folder is created when missing)")
    where.add_argument("--store", metavar="URL", default=None,
                       help="the store as a URL: sqlite:///path/fuse.sqlite (one replica; the default is "
                            f"--state-dir's {STATE_FILE}) or postgresql://user@host:port/db (any number of "
                            "replicas share it; the password from the URL, PGPASSWORD or ~/.pgpass); default: env "
                            f"{C.FUSE_STORE_ENV} when set and neither --state nor --state-dir is given")
    s.add_argument("--lease", type=_seconds, default=30.0,
                   help="seconds a replica holds a gateway call it claimed; another replica takes it over after "
                        "that (default 30; must exceed --timeout and every spec adapter's timeout)")
    s.add_argument("--webhook-token-file", "--token-file", dest="token_file", required=True, metavar="PATH",
                   help="the token Alertmanager presents on POST /alertmanager (its credentials_file): the whole "
                        "file, surrounding whitespace stripped, one line; it also reads /state, / and "
                        "/openapi.json unless --read-token-file is given")
    s.add_argument("--override-tokens", metavar="PATH",
                   help="people who may POST /override: one 'NAME TOKEN' line each ('#' comments); the audit "
                        "records the NAME. Without it, no one may override")
    s.add_argument("--read-token-file", metavar="PATH",
                   help="a token that may only read /state, / and /openapi.json (whole file, one line)")
    s.add_argument("--gateway-url", help="inference gateway base URL; POST <url>/v1/control/fuse (shorthand for an "
                                           "http adapter; the spec's fuse.adapters lists the others)")
    s.add_argument("--prometheus-url", help="Prometheus base URL for fuse.adapters.*.discover without its own "
                                             "prometheus (GPU scope -> the workers on that GPU)")
    s.add_argument("--gateway-token-file", help="token for the gateway, at least 32 characters (env FUSEBOX_GATEWAY_TOKEN wins)")
    s.add_argument("--dry-run", action="store_true", help="log each decision, call nothing")
    s.add_argument("--hold", type=_seconds, default=DEFAULT_HOLD_S,
                   help=f"seconds without alerts before a release (default {DEFAULT_HOLD_S:g})")
    s.add_argument("--retry-backoff", type=_seconds, default=0.5, help="first retry delay, doubling (default 0.5 s)")
    s.add_argument("--retry-max", type=_seconds, default=30.0, help="longest retry delay (default 30 s)")
    s.add_argument("--timeout", type=_seconds, default=C.FUSE_CALL_TIMEOUT_S,
                   help=f"a gateway or vLLM call's total deadline, connect to last byte (default {C.FUSE_CALL_TIMEOUT_S:g} s)")
    s.add_argument("--tick", type=_seconds, default=1.0, help="how often hold times are checked (default 1 s)")
    s.add_argument("--reconcile", type=_seconds, default=30.0,
                   help="seconds between two comparisons of each tripped level with the gateway's own state "
                        "(its worker list, HAProxy's server state); a trip it does not show is queued again "
                        "(default 30; 0: never)")
    s.add_argument("--max-level-series", type=_attempts, default=1000, metavar="N",
                   help="scopes with a fusebox_fuse_level series of their own, the most severe first (default 1000; "
                        "fusebox_fuse_scopes counts them all)")
    s.add_argument("--vllm-url", action="append", default=[], metavar="[ENGINE=]URL",
                   help="vLLM server to POST /reset_prefix_cache on a KV-eviction trip (repeatable)")
    s.add_argument("--vllm-max-attempts", type=_attempts, default=5, metavar="N",
                   help="best effort: attempts of each vLLM reset before it is audited as failed (default 5)")
    s.add_argument("--max-connections", type=_attempts, default=1000, metavar="N",
                   help="client connections kept at most (fewer when the open-file limit is lower); one more closes "
                        "the oldest idle one (default 1000)")
    s.add_argument("--header-timeout", type=_positive_seconds, default=10.0, metavar="SECONDS",
                   help="a connection that has not sent a request's headers whole within it is closed (default 10 s)")
    s.add_argument("--request-timeout", type=_positive_seconds, default=30.0, metavar="SECONDS",
                   help="a connection that has not sent a whole request, head and body, within it is closed "
                        "(default 30 s; at least --header-timeout)")
    s.add_argument("--write-timeout", type=_positive_seconds, default=10.0, metavar="SECONDS",
                   help="a connection whose client has not taken its answer within it (writes paused) is aborted; "
                        "at most 32 may wait so at once, one more aborts the oldest (default 10 s)")
    s.add_argument("--max-connections-per-client", type=_attempts, default=256, metavar="N",
                   help="connections kept at most per client address; one more closes that address's oldest idle "
                        "one, else only GET /healthz is answered on it (default 256)")
    s.add_argument("--forwarded-allow-ips", default="", metavar="IPS",
                   help="proxies (addresses or networks, comma separated, '*' all) whose X-Forwarded-For names the "
                        "client the failure limiter counts (default: none, the connection's own address)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument("--log-format", default="text", choices=["text", "json"],
                   help="text (default) or json: one JSON object per line (time, level, logger, message, and "
                        "decision_id, scope, action... when present)")
    s.add_argument("--alertmanager-url", metavar="URL", default="",
                   help="Alertmanager as the on-call's browser reaches it, for the status page's links (default: "
                        "the externalURL Alertmanager sends in each notification)")
    s.set_defaults(func=serve)

    from .override import register as register_override

    register_override(sub)

    from .audit import register as register_audit

    register_audit(sub)

    return sub  # fusebox.cli adds `gateway` (fusebox.demo.gateway, the reference gateway) to it


def _err(msg: str) -> int:
    print(f"fusebox fuse: {msg}", file=sys.stderr)
    return 2


def build_service(args, spec=None):
    """The service and its :class:`~fusebox.fuse.tokens.TokenFiles` from parsed ``serve`` arguments
    (no server started); ``spec``: the loaded spec (read from ``args.spec`` when None). Raises
    SpecError, OSError, ValueError."""
    from fusebox.spec import load_spec

    from .adapters.gateway import DryRun, HttpGateway, VllmResetPrefixCache, read_token
    from .adapters.protocol import Adapter
    from .rules import FuseRules
    from .service import FuseService
    from .tokens import TokenFiles

    spec = load_spec(args.spec) if spec is None else spec
    token = TokenFiles(args.token_file, args.override_tokens, args.read_token_file)
    from .adapters import build_adapters

    adapters: list[Adapter]
    if args.dry_run:
        adapters = [DryRun()]
    else:
        if not args.gateway_url and not spec.adapters:
            raise ValueError("--gateway-url is required unless --dry-run or the spec's fuse.adapters lists adapters")
        # the spec's adapters keep their holds and recorded worker settings in the store (the service attaches it)
        try:
            adapters = build_adapters(spec.adapters, getattr(args, "prometheus_url", None))
        except (OSError, ValueError) as e:  # "fuse.adapters.<name>.<key>: ...": said at its line of the spec
            named = re.match(r"fuse\.adapters\.([^.:\s]+)\.(\w+)[: ]", str(e))
            if named is None:
                raise
            raise type(e)(f"{_where(spec, named[1], named[2])}: {e}") from None
        if args.gateway_url:
            adapters.insert(0, HttpGateway(args.gateway_url, read_token(args.gateway_token_file), args.timeout))
        # KV-cache eviction is the spec's highest fuse level (kv_cache_eviction in the shipped spec).
        eviction = max(spec.actions.values(), key=lambda a: a.level).name if spec.actions else ""
        for item in args.vllm_url:
            engine, sep, url = item.partition("=")
            if not sep or "://" in engine:
                engine, url = None, item
            adapters.append(VllmResetPrefixCache(url, engine, action=eviction, timeout_s=args.timeout,
                                                 max_attempts=args.vllm_max_attempts))
    lease = getattr(args, "lease", 30.0)
    # every adapter's timeout bounds one call in total (fuse/adapters/transport.py call_deadline): the lease must
    # exceed the longest, the spec's adapters included, or a replica could take over a call under way
    timeouts = [(args.timeout, f"--timeout {args.timeout:g}")]
    timeouts += [(a.timeout_s, f"fuse.adapters.{a.name}.timeout ({a.timeout_s:g}s) at {_where(spec, a.name)}")
                 for a in spec.adapters if not args.dry_run]
    longest, which = max(timeouts, key=lambda t: t[0])
    if lease <= longest:
        raise ValueError(f"--lease {lease:g} must exceed the longest adapter timeout, {which}: a replica could "
                         f"otherwise take over a call still under way -- raise --lease above {longest:g} or "
                         "lower that timeout")
    store = _open_store(args)
    service = FuseService(FuseRules.from_spec(spec), store, adapters, hold_s=args.hold,
                          backoff_s=max(args.retry_backoff, 0.001), backoff_max_s=max(args.retry_max, 0.001),
                          tick_s=max(args.tick, 0.01), dry_run=args.dry_run, lease_s=lease,
                          max_level_series=args.max_level_series, reconcile_s=args.reconcile,
                          audit_refused_per_minute=spec.audit.refused_per_minute,
                          audit_refused_max_rows=spec.audit.refused_max_rows)
    token.observe(service.metrics.token_file)  # fusebox_fuse_token_file_valid / _refused_total
    return service, token


def _where(spec, adapter: str, key: str = "timeout") -> str:
    """``FILE:LINE`` of ``fuse.adapters.<adapter>.<key>`` in the spec (its adapter's line when the
    key is left to its default; the file alone when it cannot be read again)."""
    from fusebox.spec.positions import load, read_text

    try:
        _, pos = load(read_text(spec.file, spec.file), spec.file)
    except Exception:  # read a moment ago; gone or changed since: the file is still a good pointer
        return spec.file
    line, _ = pos.at(("fuse", "adapters", adapter, key))
    return f"{spec.file}:{line}"


def _open_store(args):
    """The store of ``--store URL``, else the SQLite file of ``--state``/``--state-dir``, else the URL in
    env FUSEBOX_FUSE_STORE, else the default state directory's SQLite file; sets
    ``args.state`` to what the start-up line shows (no password). Raises OSError, ValueError,
    StoreError."""
    from .store import Store, open_store, store_label

    url = getattr(args, "store", None)
    if not url and not args.state and not args.state_dir:
        url = os.environ.get(C.FUSE_STORE_ENV) or None
    if url:
        store = open_store(url)
        args.state = store_label(url)
        return store
    args.state = str(state_path(args))
    return Store(args.state)


def startup_line(args, service) -> str:
    """One line for stderr at start: where it listens, what it calls (URLs without credentials), its
    state file and hold time."""
    from .logsafe import redact_urls

    host, port = args.listen
    where = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    if service.dry_run:
        calls = "DRY RUN: decisions are logged, nothing is called"
    else:
        from .adapters.gateway import HttpGateway, VllmResetPrefixCache

        adapters = list(service.adapters.values())
        gw = [a.url for a in adapters if isinstance(a, HttpGateway)]
        calls = "gateway " + ", ".join(gw) if gw else ""
        spec_adapters = [f"{a.label} ({a.kind})" for a in adapters if getattr(a, "kind", None)]
        if spec_adapters:
            calls += ("; " if calls else "") + "adapters " + ", ".join(spec_adapters)
        vllm = [a.url for a in adapters if isinstance(a, VllmResetPrefixCache)]
        if vllm:
            calls += "; vLLM " + ", ".join(vllm)
    return redact_urls(f"fusebox fuse serve: listening on {where}; {calls}; state {args.state}; "
                       f"hold {service.hold_s:g}s")


def serve(args) -> int:
    from fusebox.spec import load_spec
    from fusebox.spec.errors import SpecError, open_error, unreadable

    from .logs import json_line, setup

    setup(args.log_level, args.log_format)
    import faulthandler

    # a SIGBUS (SQLite's -shm mmap on a volume that cannot back it, fuse/store/sqlite.py SHM_RESERVE_BYTES)
    # or SIGSEGV prints "Fatal Python error: Bus error" and every thread's traceback on stderr
    try:
        faulthandler.enable()
    except (OSError, ValueError, AttributeError):  # stderr without a file descriptor (run in-process, captured)
        pass
    try:
        spec = load_spec(args.spec)
    except (OSError, UnicodeDecodeError) as e:
        return _err(unreadable(args.spec, e, "pass --spec with the fusebox spec the rules were generated from"))
    except SpecError as e:
        return _err(str(e))
    from .adapters.gateway import TOKEN_ENV

    for flag, path in (("--webhook-token-file", args.token_file), ("--override-tokens", args.override_tokens),
                       ("--read-token-file", args.read_token_file), ("--gateway-token-file", args.gateway_token_file)):
        if flag == "--gateway-token-file" and os.environ.get(TOKEN_ENV):  # the env var wins: the file is not read
            continue
        bad = open_error(path) if path else None
        if bad is not None:
            return _err(unreadable(path, bad, f"check the path given to {flag}"))
    try:
        service, tokens = build_service(args, spec)
    except SpecError as e:
        return _err(str(e))
    except (OSError, ValueError) as e:
        return _err(str(e))
    except RuntimeError as e:  # StoreError: the database cannot be reached or migrated
        return _err(f"store: {e} -- check --store and that the database is up")
    import signal

    import uvicorn

    from .http.app import create_app
    from .http.server import server_options
    from .http.status import StatusLinks
    from .tokens import permission_warnings

    log = logging.getLogger("fusebox.fuse")
    for w in permission_warnings([args.token_file, args.override_tokens, args.read_token_file,
                                  args.gateway_token_file, *(a.credentials_file for a in spec.adapters)]):
        log.warning("%s", w)
    # SIGHUP reads the token files again (they are also read again when they change); uvicorn
    # handles only SIGINT and SIGTERM.
    signal.signal(signal.SIGHUP, lambda *_: tokens.reload())
    app = create_app(service, tokens, links=StatusLinks.from_spec(spec, args.alertmanager_url))
    host, port = args.listen
    line = startup_line(args, service)
    print(json_line("info", "fusebox.fuse", line) if args.log_format == "json" else line, file=sys.stderr, flush=True)
    service.start()
    # json: uvicorn's own loggers go to the root handler (one JSON object per line) rather than its own
    from uvicorn.config import LOGGING_CONFIG

    server = _server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                    log_config=None if args.log_format == "json" else LOGGING_CONFIG,
                                    **server_options(args.max_connections, args.header_timeout,
                                                     max_per_client=args.max_connections_per_client,
                                                     request_timeout_s=args.request_timeout,
                                                     write_timeout_s=args.write_timeout,
                                                     forwarded_allow_ips=args.forwarded_allow_ips,
                                                     on_close=lambda why: service.metrics.connections_closed.labels(why).inc())))

    def _graceful(signum, _frame):
        # SIGTERM (a rolling update, a scale-down) or SIGINT: stop taking work at once; the server
        # finishes the requests under way and returns; the finally below releases the claims
        log.info("%s: stopping (claims released, store closed, exit 0)", signal.Signals(signum).name)
        service.stop_taking_work()
        server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _graceful)
    try:
        server.run()
    finally:
        service.stop()
        service.store.close()
    return 0


def _server(config):
    """uvicorn's server without its own signal handling: uvicorn 0.29+ re-raises SIGTERM after it
    shut down, which kills the process (exit 143) before the service stops and the store closes;
    ``serve`` handles SIGTERM and SIGINT itself."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server(config)
