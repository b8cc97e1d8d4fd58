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

__all__ = ["pydantic_problem", "pydantic_problems", "keys_at"]


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


def _model_names() -> set[str]:
    """The class names of fusebox's pydantic models defined so far (union members in an error's
    loc); other libraries' models are left out, so a user's key that happens to match one stays."""
    names: set[str] = set()
    stack: list[type] = [BaseModel]
    while stack:
        subs: list[type] = stack.pop().__subclasses__()
        for sub in subs:
            if sub.__module__.split(".")[0] in ("fusebox", "collectors", "fuse", "generator"):
                names.add(sub.__name__)
            stack.append(sub)
    return names


def _user_loc(loc: tuple, models: set[str] | None = None) -> tuple:
    """``loc`` as the user wrote the path: pydantic adds a union member's type name (``str``,
    ``function-after[...]``, a model's class name such as ``RawDimension``); drop such entries."""
    models = _model_names() if models is None else models
    return tuple(x for x in loc if not (isinstance(x, str) and (x in ("str", "int", "float", "bool") or "[" in x or x in models)))


# pydantic's "not this type" errors: where a union's other member got further (an error deeper down
# the same path), they only say that the value is not the member it was not meant to be.
_TYPE_ONLY = {"string_type", "int_type", "float_type", "bool_type", "finite_number", "float_parsing", "int_parsing",
              "list_type", "dict_type", "model_type"}


def pydantic_problems(errors: list[ErrorDetails], pos: Positions, root: type[BaseModel], *, aliases: dict[str, str] | None = None,
                      document: str = "the spec", reference: str = "the shipped fusebox.yaml") -> list[Problem]:
    """:func:`pydantic_problem` of each of ``errors`` (``ValidationError.errors()``), less a union
    member's type error where another error lies deeper on the same path, in order, each once.
    The other arguments: as for :func:`pydantic_problem`. ``dimensions: [{nam: x}]`` gives the unknown key and
    the missing one, not also "Input should be a valid string" (the member it was not meant as)."""
    models = _model_names()
    locs = [_user_loc(e["loc"], models) for e in errors]
    keep = [e for e, loc in zip(errors, locs, strict=True)
            if not (e["type"] in _TYPE_ONLY and any(len(o) > len(loc) and o[:len(loc)] == loc for o in locs))]
    out: list[Problem] = []
    merged: set[tuple] = set()
    for e in keep:
        loc = _user_loc(e["loc"], models)
        alike = [o for o in keep if o["type"] in _TYPE_ONLY and _user_loc(o["loc"], models) == loc]
        if e["type"] in _TYPE_ONLY and len(alike) > 1:  # a union's members each said "not me": one line
            if loc in merged:
                continue
            merged.add(loc)
            wanted = " or ".join(dict.fromkeys(_WANTED.get(o["type"], o["type"]) for o in alike))
            at = tuple((aliases or {}).get(x, x) if isinstance(x, str) else x for x in loc)
            pr = pos.problem(at, f"{'.'.join(map(str, at))}: {repr(e.get('input'))[:60]} is not {wanted}",
                             f"see {reference} for the expected shape")
        else:
            pr = pydantic_problem(e, pos, root, aliases=aliases, document=document, reference=reference)
        if pr not in out:
            out.append(pr)
    return out


_WANTED = {"string_type": "a string", "int_type": "an integer", "int_parsing": "an integer", "float_type": "a number",
           "float_parsing": "a number", "finite_number": "a finite number", "bool_type": "true or false",
           "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping"}


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
    loc = _user_loc(loc)
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
