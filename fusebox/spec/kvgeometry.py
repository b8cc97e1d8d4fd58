"""Per-token KV-cache geometry of a model, from its Hugging Face ``config.json``: pure, no I/O but
:func:`load_model_config`.

bytes per token = 2 (K and V) x attention layers x KV heads x head dim x element size
(:class:`KvGeometry`, :func:`kv_geometry`). Read by the KV collector
(:mod:`fusebox.collectors.kvcache`, which re-exports these names) and by the spec's
``kubernetes.engines.models`` (:mod:`.deploy`), which resolves each model's geometry when the spec
loads. The rules of derivation are in :func:`kv_geometry`'s doc and in
:mod:`fusebox.collectors.kvcache`'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DTYPE_BYTES", "ConfigError", "KvGeometry", "kv_geometry", "load_model_config", "dtype_bytes"]

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "float16": 2, "fp16": 2, "half": 2, "bfloat16": 2, "bf16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1,
}  # fmt: skip

# transformers' config-class defaults, used when a (sub-)config omits its geometry: a
# serialised sub-config drops every value equal to its class default (llava-hf's
# text_config keeps only model_type and dtype). Read from huggingface/transformers
# src/transformers/models/<dir>/configuration_<dir>.py:
#   llama/configuration_llama.py        LlamaConfig: 32 layers, 32 heads, KV heads None (= heads), hidden 4096
#   mistral/configuration_mistral.py    MistralConfig: 32, 32, 8, 4096
#   qwen2/configuration_qwen2.py        Qwen2Config: 32, 32, 32, 4096
#   qwen2_vl/configuration_qwen2_vl.py  Qwen2VLTextConfig (qwen2_vl_text): 80, 64, 8, 8192
#   qwen2_5_vl/configuration_qwen2_5_vl.py  Qwen2_5_VLTextConfig (qwen2_5_vl_text): 80, 64, 8, 8192
# head_dim is None in all of them (= hidden / heads = 128).
_MODEL_DEFAULTS = {
    "llama": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_size": 4096},
    "mistral": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096},
    "qwen2": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_size": 4096},
    "qwen2_vl_text": {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192},
    "qwen2_5_vl_text": {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                        "hidden_size": 8192},
}


class ConfigError(ValueError):
    """A model config from which bytes per token cannot be derived."""


@dataclass(frozen=True)
class KvGeometry:
    """Per-token KV geometry of a model. ``bytes_per_token`` covers all layers and all KV
    heads of the model (the whole pool, before any tensor-parallel split)."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    source: str = ""

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


def dtype_bytes(name: Any, where: str) -> int:
    key = str(name).lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise ConfigError(f"{where}: unknown dtype {name!r} -- pass --kv-dtype (e.g. bfloat16, fp8)")
    return DTYPE_BYTES[key]


def kv_geometry(config: dict, kv_dtype: str | None = None, source: str = "config.json") -> KvGeometry:
    """Derive the KV geometry of ``config`` (a parsed HF ``config.json``).

    Args:
        config: the parsed JSON object.
        kv_dtype: KV-cache dtype override (``"fp8"``, ``"auto"`` or None = model dtype).
        source: name used in error messages.

    Raises:
        ConfigError: no attention geometry or dtype could be found.
    """
    text = config
    where = source
    for key in ("text_config", "llm_config"):
        if isinstance(config.get(key), dict):
            text, where = config[key], f"{source}:{key}"
            break
    defaults = _MODEL_DEFAULTS.get(str(text.get("model_type", "")), {})

    def get(name: str) -> Any:
        # never fall back to the top level from a sub-config: there it describes the
        # wrapper or the vision tower, not the language model
        return text[name] if name in text else defaults.get(name)

    n_layers = get("num_hidden_layers")
    heads = get("num_attention_heads")
    hidden = get("hidden_size")
    if n_layers is None or heads is None:
        raise ConfigError(f"{where}: no num_hidden_layers / num_attention_heads (model_type {text.get('model_type')!r})")
    kv_heads = get("num_key_value_heads") or heads
    head_dim = get("head_dim") or (hidden // heads if hidden else None)
    if not head_dim:
        raise ConfigError(f"{where}: no head_dim and no hidden_size to derive it")
    layers = int(n_layers)
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        # hybrid models (LFM2: conv + attention; Gemma-style sliding windows still cache)
        layers = sum(1 for t in layer_types if "attention" in str(t))
    cross = text.get("cross_attention_layers")
    if isinstance(cross, list):
        layers -= len(cross)  # Mllama: cross-attention layers hold image-token KV only
    if kv_dtype and kv_dtype.lower() not in ("auto", ""):
        dbytes = dtype_bytes(kv_dtype, "--kv-dtype")
    else:
        dt = text.get("dtype") or text.get("torch_dtype") or config.get("dtype") or config.get("torch_dtype")
        if dt is None:
            raise ConfigError(f"{where}: no dtype / torch_dtype -- pass --kv-dtype")
        dbytes = dtype_bytes(dt, where)
    return KvGeometry(layers, int(kv_heads), int(head_dim), dbytes, where)


def load_model_config(path: str | Path) -> dict:
    """Read a config.json. Raises ConfigError with the path on unreadable or invalid JSON."""
    p = Path(path)
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{p}: cannot read model config ({e.strerror})") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from e


# the name the KV collector used before the move
_dtype_bytes = dtype_bytes
