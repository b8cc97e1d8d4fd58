"""pydantic's validation errors as :class:`~fusebox.spec.errors.Problem`: file, line, column, what
is wrong and how to fix it. One style for every YAML document fusebox reads (the spec, scenarios):
a raw pydantic model with ``extra="forbid"`` checks the shape, this module places each error at
the line the user wrote, and a normaliser then checks the meaning.
"""

from __future__ import annotations

import difflib
from types import UnionType
from typing import Annotated, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from .errors import Problem
from .positions import Positions

__all__ = ["pydantic_problem", "keys_at"]


def keys_at(root: type[BaseModel], loc: tuple) -> list[str]:
    """The keys a mapping at pydantic's ``loc`` under ``root`` may hold (field names, aliases as
    written), or none where ``loc`` is not a model (a free-form mapping)."""
    hint: object = root
    for step in loc:
        while get_origin(hint) in (Union, UnionType, Annotated):  # Optional[X], Annotated[X, ...]
            hint = next((a for a in get_args(hint) if a is not type(None)), None)
        if isinstance(hint, type) and issubclass(hint, BaseModel):
            f = next((f for n, f in hint.model_fields.items() if step in (n, f.alias)), None)
            if f is None:
                return []
            hint = f.annotation
        elif get_origin(hint) in (dict, list, tuple):
            hint = get_args(hint)[-1] if get_args(hint) else None
        else:
            return []
    while get_origin(hint) in (Union, UnionType, Annotated):
        hint = next((a for a in get_args(hint) if a is not type(None)), None)
    if not (isinstance(hint, type) and issubclass(hint, BaseModel)):
        return []
    return [f.alias or n for n, f in hint.model_fields.items()]


def pydantic_problem(err: ErrorDetails, pos: Positions, root: type[BaseModel], *, aliases: dict[str, str] | None = None,
                     document: str = "the spec", reference: str = "the shipped fusebox.yaml") -> Problem:
    """One pydantic error of validating ``root`` as a Problem at the place ``pos`` maps it to.

    Args:
        err: one of ``ValidationError.errors()``.
        pos: the positions of the YAML document that was validated.
        root: the model validated (for the keys an unknown one is compared with).
        aliases: field name -> the key as written, where they differ (``for_`` -> ``for``).
        document: what the top level is called in messages ("the spec", "the scenario").
        reference: the file a user compares the shape with.
    """
    aliases = aliases or {}
    raw_loc = err["loc"]
    if err["type"] == "extra_forbidden":  # the last element is the user's own (wrong) key: keep it
        loc = tuple(aliases.get(x, x) if isinstance(x, str) else x for x in raw_loc[:-1]) + (raw_loc[-1],)
    else:
        loc = tuple(aliases.get(x, x) if isinstance(x, str) else x for x in raw_loc)
    # pydantic adds the union member's type name to the path; drop such entries.
    loc = tuple(x for x in loc if not (isinstance(x, str) and (x in ("str", "int", "float", "bool") or "[" in x)))
    kind = err["type"]
    name = ".".join(str(x) for x in loc)
    if kind == "extra_forbidden":
        near = difflib.get_close_matches(str(loc[-1]), keys_at(root, raw_loc[:-1]), n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        return pos.problem(loc, f"unknown key {loc[-1]!r} in {'.'.join(map(str, loc[:-1])) or document}",
                           f"{hint}remove it or check its spelling against {reference}", key=True)
    if kind == "missing":
        return pos.problem(loc[:-1], f"missing required key {loc[-1]!r} in {'.'.join(map(str, loc[:-1])) or document}",
                           f"add '{loc[-1]}:' here")
    if kind in ("literal_error", "enum"):
        return pos.problem(loc, f"{name}: {err['msg'].lower()}", "use one of the values listed")
    if kind == "value_error" and " -- " in err["msg"]:  # our own checks (units.reject_bool) say how to fix it
        what, fix = err["msg"].removeprefix("Value error, ").split(" -- ", 1)
        return pos.problem(loc, f"{name}: {what}", fix)
    return pos.problem(loc, f"{name}: {err['msg']}", f"see {reference} for the expected shape")
