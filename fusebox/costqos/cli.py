"""``fusebox costqos run``: wires arguments to the COST-QoS controller.

Exit codes: 0 stopped (SIGTERM, SIGINT), 1 the API server did not answer within ``--api-wait``
seconds at start, 2 bad arguments, no Kubernetes credentials, or ``--listen`` not bindable.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import re
import sys
from urllib.parse import urlsplit

__all__ = ["register"]


def _host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) as urllib reads the authority of a URL."""
    try:
        where = urlsplit(f"//{text}")
        port = where.port
    except ValueError:
        port = None
    if port is None or not port:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT -- e.g. 0.0.0.0:8080")
    return where.hostname or "0.0.0.0", port


def _http_url(text: str) -> str:
    """An ``http://`` or ``https://`` URL with a host."""
    try:
        u = urlsplit(text)
        ok = u.scheme in ("http", "https") and bool(u.hostname)
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL -- e.g. http://prometheus:9090")
    return text


def _positive(text: str) -> float:
    """A number of seconds > 0."""
    if not re.fullmatch(r"\d+(\.\d*)?|\.\d+", text) or float(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds -- e.g. 30")
    return float(text)


def _count(text: str) -> int:
    """A whole number >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1 -- e.g. 8")
    return int(text)


def register(subparsers) -> None:
    p = subparsers.add_parser("costqos", help="the COST-QoS controller (CostQoSScalingPolicy)",
                              description="The seed's COST-QoS controller: reads each CostQoSScalingPolicy's metrics "
                                          "from Prometheus, writes the (cost, p95 latency, error rate) frontier and the "
                                          "replica count chosen on it to the policy's status, and publishes the count as "
                                          "fusebox_costqos_desired_replicas for KEDA or an HPA (docs/costqos.md).")
    sub = p.add_subparsers(dest="costqos_command", required=True, metavar="ACTION")
    r = sub.add_parser("run", help="run the controller (kopf, standalone: one replica)",
                       description="Reconcile every CostQoSScalingPolicy on create, on spec change and every --interval "
                                   "seconds; serve /metrics on --listen.")
    r.add_argument("--prometheus", required=True, type=_http_url, metavar="URL", help="Prometheus' base URL (its /api/v1/query_range is read)")
    r.add_argument("--listen", required=True, type=_host_port, metavar="HOST:PORT", help="where /metrics is served")
    where = r.add_mutually_exclusive_group()
    where.add_argument("--namespace", action="append", default=None, metavar="NS",
                       help="watch policies in this namespace (repeat for several); default: --all-namespaces")
    where.add_argument("--all-namespaces", action="store_true", help="watch policies in every namespace (the default)")
    r.add_argument("--kubeconfig", default=None, metavar="FILE", help="kubeconfig (default: in-cluster, then $KUBECONFIG)")
    r.add_argument("--interval", type=_positive, default=30.0, metavar="S", help="seconds between two rounds of a policy (default 30)")
    r.add_argument("--step", type=_positive, default=60.0, metavar="S", help="the range queries' step, seconds (default 60)")
    r.add_argument("--query-timeout", type=_positive, default=30.0, metavar="S", help="one query's deadline, seconds (default 30)")
    r.add_argument("--max-queries", type=_count, default=8, metavar="N",
                   help="range queries in flight at once over all policies (default 8); the others wait their turn")
    r.add_argument("--api-wait", type=_positive, default=60.0, metavar="S",
                   help="seconds to keep trying an API server that does not answer at start, then exit 1 (default 60)")
    r.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    r.set_defaults(func=cmd_run)


def _say(message: str) -> None:
    print(f"fusebox costqos run: {message}", file=sys.stderr)


def _serve(host: str, port: int, registry) -> tuple:
    """/metrics on ``host:port``; PreflightError when the address cannot be bound."""
    from prometheus_client import start_http_server

    from .preflight import PreflightError

    try:
        return start_http_server(port, host, registry=registry)
    except OSError as e:
        fix = ("the address is in use -- choose another port" if e.errno == errno.EADDRINUSE
               else f"{e.strerror or e} -- choose another address or port")
        raise PreflightError(f"--listen {host}:{port}: {fix}") from None


def cmd_run(args) -> int:
    if args.kubeconfig:
        if not os.path.isfile(args.kubeconfig):
            _say(f"--kubeconfig {args.kubeconfig}: no such file -- name an existing kubeconfig")
            return 2
        # kopf logs in through the kubernetes client, which reads $KUBECONFIG once, when it is
        # first imported (kopf imports it): set before either
        os.environ["KUBECONFIG"] = args.kubeconfig
    import kopf
    from prometheus_client import CollectorRegistry

    from .controller import Controller, ControllerMetrics, operator_registry
    from .preflight import PreflightError, kube_client, prometheus_first_query, wait_for_api

    logging.basicConfig(level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.log_level != "DEBUG":  # kopf says "Timer ... succeeded" per policy and round at INFO: 33 lines/s at 1,000 policies
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    registry = CollectorRegistry()
    try:
        api, api_host = kube_client(os.environ.get("KUBECONFIG"))
        host, port = args.listen
        server, thread = _serve(host, port, registry)
    except PreflightError as e:
        _say(str(e))
        return 2
    try:
        why = asyncio.run(prometheus_first_query(args.prometheus, args.step, min(args.query_timeout, 5.0)))
        if why is not None:
            logging.getLogger("fusebox.costqos").warning(
                "Prometheus %s: the first query failed: %s; policies show MetricsAvailable False until it answers",
                args.prometheus, why)
        try:
            wait_for_api(api, api_host, args.api_wait)
        except PreflightError as e:
            _say(str(e))
            return 1
        finally:
            api.close()
        ctl = Controller(args.prometheus, args.step, ControllerMetrics(registry), timeout_s=args.query_timeout,
                         max_queries=args.max_queries)
        kopf.run(registry=operator_registry(ctl, args.interval), standalone=True,
                 clusterwide=not args.namespace, namespaces=args.namespace or ())
    finally:
        server.shutdown()
        thread.join(5)
    return 0
