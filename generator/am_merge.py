"""Merge fusebox's Alertmanager fragment into an existing Alertmanager config (pure: text in, data out).

``fusebox alertmanager merge --base alertmanager.yml`` reads the config your Alertmanager loads,
and returns it with:

* the fusebox route (``render_fragment(spec)["routes"]``) first under ``route.routes``, so that
  fusebox's alerts are routed before any route of the base can take them (the fusebox route has no
  ``continue``: its alerts end there, the base's routes never see them);
* the fuse receiver appended to ``receivers``; ``fuse.human_receiver`` appended too, unless it is a
  bare name (``{name: oncall}``) that the base already defines: then the base's receiver is used
  as it is (that is how fusebox's alerts reach your real pager). A bare name the base lacks would
  be a receiver without configs: fusebox's alerts, which end at the fusebox route, would notify
  nobody. That is refused (at ``fuse.human_receiver`` in the spec) unless ``allow_silent_people``;
* fusebox's inhibit rule appended to ``inhibit_rules``.

Everything else of the base is kept, in its order (its comments are not: the result is written
anew; keep the base as the file you edit and merge again after each change).

Refused, as ``BASE:LINE:COL: what -- how to fix`` problems: a file that is not YAML or not an
Alertmanager config (no ``route`` mapping with a ``receiver``, no ``receivers`` list), a base that
already has a route on the fusebox marker label (a merged file merged again), and a receiver of
the base named like one fusebox adds.
"""

from __future__ import annotations

import re
from typing import Any

from fusebox import conventions as C
from fusebox.spec.errors import Problem, SpecError
from fusebox.spec.positions import load

__all__ = ["MergeError", "merge_alertmanager"]

# The label name of an Alertmanager matcher string: `fusebox="x"`, `fusebox = x`, `"fusebox"=~"x"`.
_MATCHER_NAME = re.compile(r'\s*"?([^"=!~\s]+)"?\s*(?:=~|!~|!=|=)')


class MergeError(SpecError):
    """The base cannot be merged into; ``problems`` say where and why (nothing was written)."""


def _matcher_labels(route: dict[str, Any]) -> set[str]:
    names: set[str] = set()
    for key in ("match", "match_re"):  # the deprecated forms: {label: value}
        if isinstance(route.get(key), dict):
            names.update(str(k) for k in route[key])
    for m in route.get("matchers") or []:
        found = _MATCHER_NAME.match(str(m))
        if found:
            names.add(found.group(1))
    return names


def _fusebox_routes(route: dict[str, Any], path: tuple) -> list[tuple]:
    """Paths of the routes in the tree under ``route`` that match on the marker label."""
    out = []
    for i, child in enumerate(route.get("routes") or []):
        if isinstance(child, dict):
            p = path + ("routes", i)
            if C.LABEL["marker"] in _matcher_labels(child):
                out.append(p)
            out.extend(_fusebox_routes(child, p))
    return out


def merge_alertmanager(base_text: str, base_file: str, fragment: dict[str, Any], *,
                       human_receiver_at: tuple[str, int, int] = ("fusebox.yaml", 1, 1),
                       allow_silent_people: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The base config with the fragment merged in (see the module docstring).

    Args:
        base_text: the base Alertmanager config, as text.
        base_file: how to name the base in problems.
        fragment: ``render_fragment(spec)``: ``{routes: [route], receivers: [...], inhibit_rules: [...]}``.
        human_receiver_at: (file, line, column) of ``fuse.human_receiver`` in the spec, for the
            problem of a people's receiver that would notify nobody.
        allow_silent_people: add a bare-named people's receiver the base lacks (no configs: it
            notifies nobody) with a note instead of refusing it.

    Returns:
        (merged config as data, notes for the user: e.g. which receiver of the base is reused).

    Raises:
        MergeError: the base is not YAML, not an Alertmanager config, already holds a fusebox
            route, or names a receiver as fusebox does; or ``fuse.human_receiver`` is a bare name
            the base lacks (unless ``allow_silent_people``).
    """
    if not base_text.strip():
        raise MergeError([Problem(base_file, 1, 1, "the base is empty",
                                  "pass the Alertmanager config your Alertmanager loads (its --config.file)")])
    try:
        data, pos = load(base_text, base_file)
    except SpecError as e:
        raise MergeError(e.problems) from None
    not_config = "pass the Alertmanager config your Alertmanager loads (its --config.file)"
    if not isinstance(data, dict):
        raise MergeError([pos.problem((), "not an Alertmanager config (a YAML mapping is expected)", not_config)])
    if isinstance(data.get("alertmanager"), dict) and "route" not in data:
        raise MergeError([pos.problem(("alertmanager",), "this looks like Helm values (alertmanager: ...), not an "
                                   "Alertmanager config", "pass the config itself: e.g. save the values' "
                                   "alertmanager.config to a file, merge it, and put the result back", key=True)])
    route = data.get("route")
    if not isinstance(route, dict) or not isinstance(route.get("receiver"), str):
        raise MergeError([pos.problem(("route",), "not an Alertmanager config: no `route:` mapping with a `receiver`",
                                   not_config, key="route" in data)])
    receivers = data.get("receivers")
    if not isinstance(receivers, list) or not all(isinstance(r, dict) and isinstance(r.get("name"), str) for r in receivers):
        raise MergeError([pos.problem(("receivers",), "not an Alertmanager config: `receivers:` is not a list of "
                                   "receivers with a name", not_config, key="receivers" in data)])
    routes = route.get("routes")
    if routes is not None and not isinstance(routes, list):
        raise MergeError([pos.problem(("route", "routes"), "route.routes is not a list", not_config)])
    inhibit = data.get("inhibit_rules")
    if inhibit is not None and not isinstance(inhibit, list):
        raise MergeError([pos.problem(("inhibit_rules",), "inhibit_rules is not a list", not_config)])

    problems = [
        pos.problem(p, f"the base already routes on the {C.LABEL['marker']!r} label (a fusebox route)",
                 "merge into the config without fusebox's route (the file you edit), not into a merged result")
        for p in _fusebox_routes(route, ("route",))
    ]
    notes: list[str] = []
    by_name = {r["name"]: i for i, r in enumerate(receivers)}
    added = []
    for rc in fragment["receivers"]:
        name = rc["name"]
        if name not in by_name:
            added.append(rc)
            if set(rc) == {"name"} and allow_silent_people:
                notes.append(f"receiver {name!r} (fuse.human_receiver) has no configs: fusebox's alerts reach it and "
                             "notify nobody; name one of the base's receivers in fuse.human_receiver")
            elif set(rc) == {"name"}:
                ours = ", ".join(repr(r["name"]) for r in receivers)
                problems.append(Problem(*human_receiver_at,
                                        f"fuse.human_receiver {name!r} is not a receiver of {base_file} and has no "
                                        "configs: fusebox's alerts end at the fusebox route and would notify nobody",
                                        f"set fuse.human_receiver.name to one of your receivers: {ours}, or give it "
                                        "configs (or pass --allow-silent-people to merge anyway)"))
        elif set(rc) == {"name"}:  # a bare name (fuse.human_receiver): a reference to the base's receiver
            notes.append(f"receiver {name!r} (fuse.human_receiver) is the base's: fusebox's alerts reach it")
        else:
            problems.append(pos.problem(("receivers", by_name[name], "name"),
                                     f"the base already has a receiver named {name!r}, which fusebox adds",
                                     "rename one of them (fuse.receiver / fuse.human_receiver.name in the spec), or "
                                     "give fuse.human_receiver only a name to use the base's receiver"))
    if problems:
        raise MergeError(problems)

    merged = dict(data)
    merged["route"] = {**route, "routes": list(fragment["routes"]) + list(routes or [])}
    merged["receivers"] = list(receivers) + added
    if fragment["inhibit_rules"]:
        merged["inhibit_rules"] = list(inhibit or []) + list(fragment["inhibit_rules"])
    return merged, notes
