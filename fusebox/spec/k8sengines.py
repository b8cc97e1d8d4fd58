"""The spec's ``kubernetes.engines``: the engine pods the generated PodMonitor scrapes and the
collectors discover, and each served model's KV geometry (a config.json read when the spec loads,
or the geometry written out). Its raw shape, its checks and the normalised :class:`Engines`;
:mod:`.deploy` holds the rest of the ``kubernetes:`` block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from .k8snames import K8S_LABEL_NAME, Err, check_labels
from .kvgeometry import DTYPE_BYTES, ConfigError, KvGeometry, kv_geometry, load_model_config

__all__ = ["Engines", "RawEngineModel", "RawEngines", "normalise_engines"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class RawEngineModel(_Strict):
    # Either the model's config.json (a path relative to the spec's folder) or its geometry.
    config: StrictStr | None = Field(None, description="The model's Hugging Face config.json, relative to the spec's folder "
                                     "(or layers, kv_heads, head_dim and dtype instead).")
    layers: StrictInt | None = Field(None, description="Attention layers that cache KV (num_hidden_layers).")
    kv_heads: StrictInt | None = Field(None, description="KV heads (num_key_value_heads; the attention heads without GQA).")
    head_dim: StrictInt | None = Field(None, description="Head dimension (head_dim, or hidden_size / num_attention_heads).")
    dtype: StrictStr | None = Field(None, description="The model's dtype: float32, float16, bfloat16, fp8, int8 (or an alias).")
    kv_dtype: StrictStr | None = Field(None, description="The engine's KV-cache dtype when it is not the model's (e.g. fp8).")


class RawEngines(_Strict):
    # The engine pods' labels (matchLabels of the generated PodMonitor), e.g. {app.kubernetes.io/name: vllm}.
    selector: dict[StrictStr, StrictStr]
    port: StrictStr = "http"  # the name of the engine container's port serving /metrics
    path: StrictStr = "/metrics"
    namespaces: list[StrictStr] = []  # where the engine pods run; empty: every namespace
    models: dict[StrictStr, RawEngineModel] = Field(
        {}, description="Served model name (the engines' model_name label) -> its KV geometry ({config: path} or "
        "{layers, kv_heads, head_dim, dtype}), for the KV collector that discovers the engine pods.")


@dataclass(frozen=True)
class Engines:
    """``kubernetes.engines``: the engine pods the generated PodMonitor scrapes and the collectors
    discover (labels, port name, path, namespaces; none: every namespace), and ``models``: served
    model name -> :class:`~.kvgeometry.KvGeometry` (resolved when the spec loads: a ``config:``
    file is read then; ``dtype_bytes`` after any ``kv_dtype``)."""

    selector: dict[str, str]
    port: str = "http"
    path: str = "/metrics"
    namespaces: tuple[str, ...] = ()
    models: dict[str, KvGeometry] = field(default_factory=dict)


def normalise_engines(e: RawEngines, p: tuple, err: Err, base_dir: Path) -> Engines:
    """Check ``kubernetes.engines`` (at ``p``); ``base_dir``: the folder ``models.*.config`` paths are
    relative to. Each problem is recorded through ``err(path, what, fix, key=False)``."""
    if not e.selector:
        err(p + ("selector",), "the engines' selector is empty: the PodMonitor would scrape every pod",
            "give the engine pods' labels, e.g. {app.kubernetes.io/name: vllm}")
    check_labels(e.selector, p + ("selector",), err)
    if not K8S_LABEL_NAME.match(e.port) or len(e.port) > 15:
        err(p + ("port",), f"{e.port!r} is not a container port name", "name the engine container's port, e.g. http")
    if not e.path.startswith("/"):
        err(p + ("path",), f"{e.path!r} is not a path", "e.g. /metrics")
    for i, ns in enumerate(e.namespaces):
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", ns):
            err(p + ("namespaces", i), f"{ns!r} is not a namespace name", "e.g. inference")
    models = {}
    for name, m in e.models.items():
        geo = _model_geometry(name, m, p + ("models", name), err, base_dir)
        if geo is not None:
            models[name] = geo
    return Engines(selector=dict(e.selector), port=e.port, path=e.path, namespaces=tuple(e.namespaces), models=models)


_GEOMETRY_KEYS = ("layers", "kv_heads", "head_dim", "dtype")
_DTYPES_FIX = "use one of " + ", ".join(sorted(DTYPE_BYTES))


def _model_geometry(name: str, m: RawEngineModel, p: tuple, err: Err, base_dir: Path) -> KvGeometry | None:
    """The KV geometry of one ``kubernetes.engines.models`` entry: its ``config:`` (a config.json
    read now, relative to ``base_dir``) or its ``layers``, ``kv_heads``, ``head_dim``, ``dtype``;
    ``kv_dtype`` overrides the dtype. None after reporting a problem at the entry's line."""
    if not name.strip():
        err(p, "a model name is empty", "key each model by the name the engines serve it under (their model_name label)",
            key=True)
    given = [k for k in _GEOMETRY_KEYS if getattr(m, k) is not None]
    if m.kv_dtype is not None and m.kv_dtype.lower() not in DTYPE_BYTES and m.kv_dtype.lower() != "auto":
        err(p + ("kv_dtype",), f"unknown KV-cache dtype {m.kv_dtype!r}", _DTYPES_FIX)
        return None
    kv_dtype = m.kv_dtype if m.kv_dtype is not None and m.kv_dtype.lower() != "auto" else None
    if m.config is not None:
        if given:
            err(p + (given[0],), f"model {name!r} gives both config and {', '.join(given)}",
                "give the config.json or the geometry (layers, kv_heads, head_dim, dtype), not both")
            return None
        return _config_geometry(name, m.config, kv_dtype, p, err, base_dir)
    return _given_geometry(name, m, kv_dtype, p, err)


def _config_geometry(name: str, config: str, kv_dtype: str | None, p: tuple, err: Err, base_dir: Path) -> KvGeometry | None:
    """The geometry of the config.json at ``config`` (relative to ``base_dir``), or None after reporting."""
    path = Path(config) if Path(config).is_absolute() else base_dir / config
    try:
        return kv_geometry(load_model_config(path), kv_dtype, source=config)
    except ConfigError as e:
        err(p + ("config",), f"model {name!r}: {str(e).split(' -- ')[0].replace(str(path), config)}",
            "give the path (relative to this spec) of the config.json the engines serve, with its attention geometry "
            "and dtype, or the geometry itself: {layers, kv_heads, head_dim, dtype}; add kv_dtype where the config "
            "names no dtype")
        return None


def _given_geometry(name: str, m: RawEngineModel, kv_dtype: str | None, p: tuple, err: Err) -> KvGeometry | None:
    """The geometry the entry writes out (``kv_dtype`` over its ``dtype``), or None after reporting."""
    missing = [k for k in _GEOMETRY_KEYS if getattr(m, k) is None and not (k == "dtype" and kv_dtype)]
    if missing:
        err(p, f"model {name!r} has no config and no {', '.join(missing)}",
            "give config: <path to its config.json>, or the geometry: {layers, kv_heads, head_dim, dtype}", key=True)
        return None
    bad = False
    for k in ("layers", "kv_heads", "head_dim"):
        if getattr(m, k) < 1:
            err(p + (k,), f"{k} must be at least 1, got {getattr(m, k)}", "copy it from the model's config.json")
            bad = True
    dtype = kv_dtype or m.dtype or ""
    if dtype.lower() not in DTYPE_BYTES:
        err(p + ("dtype",), f"unknown dtype {m.dtype!r}", _DTYPES_FIX)
        bad = True
    if bad:
        return None
    assert m.layers is not None and m.kv_heads is not None and m.head_dim is not None
    return KvGeometry(m.layers, m.kv_heads, m.head_dim, DTYPE_BYTES[dtype.lower()], "spec")
