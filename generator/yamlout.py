"""The one YAML writer of the generator: data -> YAML text, through libyaml's emitter.

Block style, keys in insertion order (or sorted on request), multi-line strings as literal
blocks (``|``, so PromQL and JSON read as they were written), 120 columns, UTF-8 kept as is.

PyYAML's representer walks the data in Python with alias tracking and a type lookup per value;
a spec of 1,000 signals writes about 30 MB of YAML, so this builds the node tree directly (the
same nodes the SafeRepresenter makes for these types) and hands it to libyaml's serializer and
emitter (``CSafeDumper``; the pure-Python ``SafeDumper`` where PyYAML was built without libyaml).
"""

from __future__ import annotations

import math
from typing import Any

import yaml

__all__ = ["dump_yaml"]

_BASE = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_BASE):  # type: ignore[misc,valid-type]  # CSafeDumper or SafeDumper, chosen at import
    """libyaml's dumper with the implicit-tag check of scalars memoised.

    The serializer asks the resolver twice per scalar whether its text would read back as another
    type (to decide on quotes); the answer depends on the text alone (SafeDumper's resolvers are
    fixed and none is path-based), and a spec's outputs repeat the same label names and values
    hundreds of thousands of times.
    """

    _seen: dict[tuple[str, bool, bool], str] = {}

    def resolve(self, kind, value, implicit):  # noqa: ANN001 -- PyYAML's signature
        if kind is not yaml.ScalarNode:
            return super().resolve(kind, value, implicit)
        key = (value, implicit[0], implicit[1])
        tag = self._seen.get(key)
        if tag is None:
            tag = super().resolve(kind, value, implicit)
            if len(self._seen) < 200_000:
                self._seen[key] = tag
        return tag


_DUMPER = _Dumper
_TAG = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _BOOL, _NULL, _MAP, _SEQ = (_TAG + t for t in ("str", "int", "float", "bool", "null", "map", "seq"))


def _float(x: float) -> str:
    # As SafeRepresenter.represent_float writes it.
    if x != x:
        return ".nan"
    if x == math.inf:
        return ".inf"
    if x == -math.inf:
        return "-.inf"
    text = repr(x).lower()
    if "." not in text and "e" in text:
        text = text.replace("e", ".0e", 1)
    return text


def _node(data: Any, sort_keys: bool) -> yaml.Node:
    t = type(data)
    if t is str:
        return yaml.ScalarNode(_STR, data, style="|" if "\n" in data else None)
    if t is dict:
        items = sorted(data.items()) if sort_keys else data.items()
        return yaml.MappingNode(_MAP, [(_node(k, sort_keys), _node(v, sort_keys)) for k, v in items], flow_style=False)
    if t is list or t is tuple:
        return yaml.SequenceNode(_SEQ, [_node(v, sort_keys) for v in data], flow_style=False)
    if t is bool:
        return yaml.ScalarNode(_BOOL, "true" if data else "false")
    if t is int:
        return yaml.ScalarNode(_INT, str(data))
    if t is float:
        return yaml.ScalarNode(_FLOAT, _float(data))
    if data is None:
        return yaml.ScalarNode(_NULL, "null")
    if isinstance(data, str):  # str subclasses (enums)
        return _node(str(data), sort_keys)
    if isinstance(data, dict):
        return _node(dict(data), sort_keys)
    raise TypeError(f"cannot write {t.__name__} as YAML: {data!r}")


def dump_yaml(data: Any, *, sort_keys: bool = False) -> str:
    """YAML text for ``data`` (dicts, lists, tuples, str, int, float, bool, None).

    Raises:
        TypeError: a value of another type.
    """
    return yaml.serialize(_node(data, sort_keys), Dumper=_DUMPER, width=120, allow_unicode=True)
