"""What Kubernetes accepts as an object name, a label, a resource quantity, a port and an image
reference (k8s.io/apimachinery's validation, distribution/reference's grammar), and the object
name fusebox gives the spec's PrometheusRule and AlertmanagerConfig. ``err`` is the spec's
``err(path, what, fix, *, key=False)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["DNS_LABEL", "DNS_SUBDOMAIN", "IMAGE_TAG", "K8S_LABEL_NAME", "LABEL_FIX", "QUANTITY", "Err", "check_labels", "check_port",
           "image_repository_problem", "object_name"]

Err = Callable[..., None]  # (path, what, fix, *, key=False)

# Kubernetes object names and label keys/values (k8s.io/apimachinery validation).
DNS_LABEL = re.compile(r"^(?=.{1,63}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}\Z)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
K8S_LABEL_NAME = re.compile(r"^(?=.{1,63}\Z)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
# resource.Quantity: a decimal with an optional binary (Ki..Ei), decimal (m, k, M..E) or exponent suffix.
QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?\Z")
# An image reference's repository, [registry/]path (the grammar of distribution/reference, which
# Docker and containerd parse with): the registry is a host name (any case) with an optional port;
# the path is components of lower-case letters and digits, joined by '.', '_', '__' or dashes. The
# first component is the registry only when it holds '.' or ':' or is 'localhost' (Docker's own
# rule for the default registry); else it is the path's first component, lower case like the rest.
IMAGE_REGISTRY = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*(:[0-9]+)?\Z")
IMAGE_PATH = re.compile(r"^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*\Z")
IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
_OBJECT_PREFIX = "fusebox-"


def object_name(spec_name: str) -> str:
    """The Kubernetes object name of the PrometheusRule and the AlertmanagerConfig made from
    ``metadata.name``: ``fusebox-`` and the name in lower case, each run of characters other
    than ``a-z0-9`` as one ``-``, no ``-`` at either end, at most 63 characters in all (an RFC
    1123 label, which every object kind accepts): ``"Multimodal Inference"`` ->
    ``"fusebox-multimodal-inference"``. The name itself stays the ``cluster`` and ``fusebox``
    label value of the rules, where any text is fine. ``"fusebox-"`` alone when nothing is left
    (``normalise_kubernetes`` refuses such a name)."""
    slug = re.sub(r"[^a-z0-9]+", "-", spec_name.lower()).strip("-")
    return (_OBJECT_PREFIX + slug[:63 - len(_OBJECT_PREFIX)]).rstrip("-") + ("" if slug else "-")


LABEL_FIX = "use [prefix/]name: a name of at most 63 letters, digits, '-', '_', '.' (alphanumeric at both ends)"
VALUE_FIX = "use at most 63 letters, digits, '-', '_', '.' (alphanumeric at both ends), or ''"


def check_labels(labels: dict[str, str], path: tuple, err: Err) -> None:
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if not K8S_LABEL_NAME.match(name) or (prefix and not DNS_SUBDOMAIN.match(prefix)):
            err(path + (key,), f"{key!r} is not a Kubernetes label key", LABEL_FIX, key=True)
        if value and not K8S_LABEL_NAME.match(value):
            err(path + (key,), f"{value!r} is not a Kubernetes label value", VALUE_FIX)


def check_port(port: int, path: tuple, err: Err) -> None:
    if not 1 <= port <= 65535:
        err(path, f"port {port} is out of range", "use a port from 1 to 65535")


def image_repository_problem(repo: str) -> str | None:
    """What is wrong with ``repo`` as an image reference's repository (``[registry/]path``, see
    :data:`IMAGE_PATH`), or None: a capital letter in the path ("Acme/fusebox": Docker would take
    ``Acme`` for a registry host), an empty component, a character a repository cannot hold."""
    first, slash, rest = repo.partition("/")
    registry = first if slash and (any(c in first for c in ".:") or first == "localhost") else None
    path = rest if registry is not None else repo
    if registry is not None and not IMAGE_REGISTRY.match(registry):
        return f"{registry!r} is not a registry host[:port]"
    if IMAGE_PATH.match(path):
        return None
    if IMAGE_PATH.match(path.lower()):
        upper = [c for c in path.split("/") if c != c.lower()]
        return (f"capital letters in {', '.join(map(repr, upper))}; an image repository's path is lower case"
                + (" (a registry host goes first and holds a '.' or ':', e.g. ghcr.io)" if registry is None and "/" in path else ""))
    return "its path must be components of a-z, 0-9 joined by '.', '_' or '-', separated by '/'"
