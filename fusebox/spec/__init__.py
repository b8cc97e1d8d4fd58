"""The fusebox spec (``apiVersion: fusebox/v1``): the ground floor every other part stands on.

* :mod:`.errors`: :class:`Problem` (``file:line:col: what -- fix``) and :class:`SpecError`;
* :mod:`.positions`: YAML loading with a line/column table;
* :mod:`.units`: what people write ("78.3%", "14.7 MB/s", "1.28s", "5m") -> base units, and back;
* :mod:`.model`: the schema, its validation and the frozen, normalised :class:`Spec`;
* :mod:`.deploy`: the ``kubernetes:``, ``grafana:`` and ``otelcol:`` blocks (where the outputs run);
* :mod:`.k8sengines`: ``kubernetes.engines`` (the engine pods and their models' KV geometry);
* :mod:`.k8snames`: what Kubernetes accepts as a name, label, quantity, port and image reference.

It stands on :mod:`fusebox.conventions` (names) and :mod:`fusebox.promsim` alone: the generator, the collectors, the fuse service and the
demo all read the spec through this package (see docs/architecture.md).
"""

from .errors import Problem, SpecError
from .model import API_VERSION, FuseAction, Kubernetes, Runbook, Signal, Source, Spec, Tier, load_spec, parse_spec

__all__ = ["Problem", "SpecError", "Signal", "Source", "Spec", "Tier", "FuseAction", "Runbook", "Kubernetes", "load_spec", "parse_spec",
           "API_VERSION"]
