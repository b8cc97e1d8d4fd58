"""Small helpers over promql-parser's AST."""

from __future__ import annotations

from typing import Any


def vector_selectors(expr: str) -> list[Any]:
    """Every VectorSelector in a PromQL expression (matrix selectors included), in order.

    Raises:
        ValueError: the expression does not parse (promql-parser's message).
    """
    import promql_parser

    found: list[Any] = []

    def walk(node: Any) -> None:
        if type(node).__name__ == "VectorSelector":
            found.append(node)
            return
        for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                walk(child)
        for arg in getattr(node, "args", None) or []:
            walk(arg)

    walk(promql_parser.parse(expr))
    return found


def metrics_in_expr(expr: str) -> list[str]:
    """Metric names of the vector selectors in a PromQL expression, sorted, each once."""
    return sorted({sel.name for sel in vector_selectors(expr) if sel.name})
