"""The options ``fusebox collect`` commands share, and their argument types: export and rounds
(:func:`common_options`), the engine /metrics fetch limits (:func:`fetch_options`) and engine
discovery on Kubernetes (:func:`discover_options`, checked by :func:`check_discover`).
Argument types raise :class:`argparse.ArgumentTypeError` (argparse's exit 2)."""

from __future__ import annotations

import argparse
import os

from fusebox.conventions import ENV

from .fetch import parse_size
from .podresources import DEFAULT_SOCKET

EXPORT_HELP = "OTLP receiver (default http://127.0.0.1:4318 for http, :4317 for grpc)"


def common_options(p: argparse.ArgumentParser, *, once: bool = True) -> None:
    if once:
        p.add_argument("--once", action="store_true", help="collect one round, print it in Prometheus text format, exit")
    p.add_argument("--interval", type=float, default=5.0, metavar="S", help="seconds between rounds (default 5)")
    p.add_argument("--otlp-endpoint", metavar="URL", default=None, help=EXPORT_HELP)
    p.add_argument("--otlp-protocol", choices=("http", "grpc"), default="http", help="http/protobuf (default) or grpc")
    p.add_argument("--no-otlp", action="store_true", help="do not push OTLP (use with --metrics-port)")
    p.add_argument("--metrics-port", type=int, metavar="N", default=None, help="also serve /metrics on 127.0.0.1:N")
    p.add_argument("--metrics-addr", default=os.environ.get(ENV["metrics_addr"]) or "127.0.0.1",
                   help=f"address for --metrics-port (default: ${ENV['metrics_addr']} when set, in a cluster the pod IP; "
                        "else 127.0.0.1)")
    p.add_argument("--cluster", metavar="NAME", default=os.environ.get(ENV["cluster"]) or None,
                   help=f"resource attribute `cluster` (label after export; default: ${ENV['cluster']} when set)")
    p.add_argument("--host-name", metavar="NAME", default=os.environ.get(ENV["host_name"]) or None,
                   help=f"resource attribute host.name (default: ${ENV['host_name']} when set, in a cluster the node "
                        "name; else the hostname)")
    p.add_argument("--instance-id", metavar="ID", default=None,
                   help="resource attribute service.instance.id, the `instance` label after export (default: "
                        "OTEL_RESOURCE_ATTRIBUTES' service.instance.id, else HOST/SERVICE[/ENGINE], stable across restarts)")
    p.add_argument("--rounds", type=int, default=0, help=argparse.SUPPRESS)  # bounded runs for tests


def size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return v


def fetch_options(p: argparse.ArgumentParser) -> None:
    """Limits and credentials of the engine /metrics fetches (collectors/fetch.py)."""
    p.add_argument("--timeout", type=positive_seconds, default=2.0, metavar="S",
                   help="deadline of one endpoint's whole scrape (connect, headers, body), seconds (default 2)")
    p.add_argument("--max-body-bytes", type=size, default="16MiB", metavar="SIZE",
                   help="refuse an answer over SIZE bytes on the wire, e.g. 16MiB, 50MB (default 16MiB)")
    p.add_argument("--max-decompressed-bytes", type=size, default="16MiB", metavar="SIZE",
                   help="refuse an answer whose text (after gzip) is over SIZE (default 16MiB)")
    p.add_argument("--max-series", type=count, default=50_000, metavar="N",
                   help="sample lines of an answer used at most; the rest are dropped and counted (default 50000)")
    p.add_argument("--max-label-chars", type=count, default=4096, metavar="N",
                   help="drop (and count) a sample whose label set is over N characters (default 4096)")
    p.add_argument("--max-models", type=count, default=8, metavar="N",
                   help="model_name values of an answer used at most; the other models' samples are dropped "
                        "and counted (default 8; an engine serves one)")
    p.add_argument("--credentials-file", metavar="PATH", default=None,
                   help="file holding a bearer token or user:password, read at every scrape (chmod 600); "
                        "preferred to user:password@ in the URL, which is sent but never shown")


def count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= 1, e.g. 1000")
    return int(text)


def discover_options(p: argparse.ArgumentParser) -> None:
    """Engine discovery on Kubernetes (collectors/discover.py)."""
    p.add_argument("--discover", metavar="FILE", default=None,
                   help="find the engine pods on this node through the Kubernetes API, as FILE says (engines.yaml of "
                        "the fusebox-engines ConfigMap `fusebox generate` writes); excludes --endpoint, "
                        "--model-config, --gpu and --engine-id")
    p.add_argument("--node-name", metavar="NODE", default=None,
                   help="this node's name (the DaemonSet's spec.nodeName from the downward API); needs --discover")
    p.add_argument("--pod-resources-socket", metavar="PATH", default=DEFAULT_SOCKET,
                   help=f"the kubelet's pod-resources socket, which GPUs each pod holds (default {DEFAULT_SOCKET}; "
                        "collect kv only: alignment latency carries no hw_id)")
    p.add_argument("--kubeconfig", metavar="PATH", default=None,
                   help="kubeconfig for the Kubernetes API (default: the in-cluster service account, else "
                        "~/.kube/config)")
    p.add_argument("--max-engines", type=count, default=None, metavar="N",
                   help="engine pods scraped on this node at most; the rest are counted and skipped (default 64)")


HAND_NAMED = {"endpoint": "--endpoint", "model_config": "--model-config", "gpu": "--gpu", "engine_id": "--engine-id"}


def check_discover(p: argparse.ArgumentParser, args, needed: tuple[str, ...]) -> None:
    """--discover excludes the per-engine flags; without it, ``needed`` are required (argparse
    error, exit 2)."""
    if args.discover:
        given = [flag for dest, flag in HAND_NAMED.items() if getattr(args, dest, None)]
        if given:
            p.error(f"--discover finds the engines itself: drop {', '.join(given)}")
        if not args.node_name:
            p.error("--discover needs --node-name NODE (in a DaemonSet: env NODE_NAME from fieldRef spec.nodeName)")
    else:
        if args.node_name or args.max_engines:
            p.error("--node-name and --max-engines go with --discover FILE")
        lacking = [HAND_NAMED[d] for d in needed if not getattr(args, d, None)]
        if lacking:
            p.error(f"the following arguments are required: {', '.join(lacking)} (or --discover FILE --node-name NODE)")
