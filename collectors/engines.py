"""The engines file of engine discovery: which pods are engines, where their /metrics is, and the
KV geometry of each model they serve.

``fusebox generate`` writes it from the spec's ``kubernetes.engines`` into the ConfigMap
``fusebox-engines`` (key ``engines.yaml``); the collectors' DaemonSet mounts it and runs
``fusebox collect kv|latency --discover /etc/fusebox/engines/engines.yaml``. Shape::

    namespaces: [inference]            # [] = every namespace
    selector: {app.kubernetes.io/name: vllm}   # equality label selector of the engine pods
    port: http                         # container port name (looked up in the pod spec) or number
    path: /metrics
    models:                            # served model name (the engine's model_name label) -> geometry
      llava-hf/llava-1.5-7b-hf: {layers: 32, kv_heads: 32, head_dim: 128, dtype_bytes: 2}

Geometry is resolved at generate time (whole numbers, ``dtype_bytes`` after any KV-dtype
override), so the collector never reads a config.json. The file is checked like every YAML
document fusebox reads: a pydantic model with ``extra="forbid"``, each error at its line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .kvcache import KvGeometry

REFERENCE = "the engines.yaml that `fusebox generate` writes from kubernetes.engines"
# a Kubernetes label key or value: at most 253 + 63 characters, checked by the API server; here
# only that they are non-empty strings (the API server refuses a malformed selector, counted then)
_Positive = Annotated[int, Field(ge=1)]


class EnginesConfigError(ValueError):
    """The engines file is unreadable or invalid; ``str()`` is one ``file:line:col: what -- fix``
    line per problem."""


class RawModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    layers: _Positive
    kv_heads: _Positive
    head_dim: _Positive
    dtype_bytes: _Positive


class RawEngines(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    namespaces: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    selector: dict[str, str] = Field(default_factory=dict)
    port: Annotated[str, Field(min_length=1)] | int  # a number's range: checked after, in the file's terms
    path: Annotated[str, Field(pattern=r"^/")] = "/metrics"
    models: dict[str, RawModel] = Field(default_factory=dict)


@dataclass(frozen=True)
class EnginesConfig:
    """What the discovering collectors need: ``namespaces`` (empty: all), the equality label
    ``selector``, the /metrics ``port`` (a container port name, or a number) and ``path``, and
    ``models``: served model name -> :class:`KvGeometry` (bytes per token from its fields)."""

    namespaces: tuple[str, ...]
    selector: dict[str, str]
    port: str | int
    path: str
    models: dict[str, KvGeometry]
    file: str = ""

    @property
    def label_selector(self) -> str:
        """The selector as the API's ``labelSelector`` string (``k=v,k2=v2``)."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))


def load_engines_config(path: str | Path) -> EnginesConfig:
    """Read and validate the engines file at ``path``.

    Raises:
        EnginesConfigError: unreadable file, YAML errors, or a shape error (unknown key, a
            geometry field that is not a whole number >= 1, a missing ``port``), each as
            ``file:line:col: what -- how to fix``.
    """
    from fusebox.spec.errors import Problem, SpecError, unreadable
    from fusebox.spec.positions import load, read_text
    from fusebox.spec.validation import pydantic_problem

    p = Path(path)
    try:
        text = read_text(p, str(p))
    except (OSError, UnicodeDecodeError) as e:
        raise EnginesConfigError(unreadable(p, e, "pass --discover FILE, the engines.yaml of the fusebox-engines "
                                                  "ConfigMap (`fusebox generate` writes it from kubernetes.engines)")) from None
    except SpecError as e:
        raise EnginesConfigError(str(e)) from None
    if not re.sub(r"(?m)^\s*(#.*|---\s*|\.\.\.\s*)?$", "", text).strip():
        raise EnginesConfigError(f"{p}:1:1: the engines file is empty -- regenerate it with `fusebox generate` "
                                 f"(the ConfigMap fusebox-engines, key engines.yaml) from kubernetes.engines")
    try:
        raw, pos = load(text, str(p))
    except SpecError as e:
        raise EnginesConfigError(str(e)) from None
    if not isinstance(raw, dict):
        raise EnginesConfigError(f"{p}:1:1: the engines file is a mapping (namespaces, selector, port, path, models) "
                                 f"-- regenerate it with `fusebox generate`")
    try:
        model = RawEngines.model_validate(raw)
    except ValidationError as invalid:
        shape: dict[tuple[int, int], Problem] = {}
        for detail in invalid.errors():
            pr = pydantic_problem(detail, pos, RawEngines, document="the engines file", reference=REFERENCE)
            shape.setdefault((pr.line, pr.col), pr)
        raise EnginesConfigError("\n".join(str(pr) for pr in shape.values())) from None
    # what kubernetes.engines refuses in the spec, refused here in the same terms
    if isinstance(model.port, int) and not 1 <= model.port <= 65535:
        raise EnginesConfigError(str(pos.problem(("port",), f"port {model.port} is out of range",
                                                 "use a container port number from 1 to 65535, or the port's name")))
    if not model.selector:
        raise EnginesConfigError(str(pos.problem(("selector",), "the engines' selector is empty: discovery would "
                                                 "scrape every pod of the namespaces", f"name the engine pods' labels, "
                                                 f"as in {REFERENCE}")))
    models = {name: KvGeometry(m.layers, m.kv_heads, m.head_dim, m.dtype_bytes, f"{p}: models.{name}")
              for name, m in model.models.items()}
    return EnginesConfig(tuple(model.namespaces), dict(model.selector), model.port, model.path, models, str(p))
