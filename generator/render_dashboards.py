"""Grafana dashboards from the spec: an overview and one drill-down per area.

Pure renderer: ``render_dashboards(spec) -> {relative_path: json_text}``; no I/O.

Panels are built with grafanalib 0.7.1 and passed through :func:`adapt`, a thin adapter that
fixes what grafanalib writes for Grafana 5 but current Grafana (>= 11) misreads
(docs/pitfalls.md P8):

* ``schemaVersion`` 12 -> :data:`SCHEMA_VERSION`;
* data sources as bare strings -> ``{"type": "prometheus", "uid": "${datasource}"}`` on every
  panel, target, template and annotation (a string that does not resolve renders nothing);
* the first threshold step's value ``"null"`` (a string) -> the number :data:`BASE_STEP_VALUE`;
* threshold lines shown (``thresholdsStyle.mode = "line"``) on every panel drawn against the
  spec's tiers;
* what Grafana's own dashboard JSON schema (grafana-foundation-sdk ``dashboard.jsonschema.json``,
  pinned in tests/fixtures/dashboards/grafana-schema/SOURCE.md) rejects: ``null`` in typed fields,
  ``timepicker.time_options``, panel ``editable``, an empty ``current`` on the data source variable,
  bare panel links (see :func:`_schema_fixes`).

Every query reads the recording rules named by :func:`fusebox.signal_kinds.records` and
:func:`fusebox.signal_kinds.dashboard_records` (never raw histograms; the overview's fuse state and
firing alerts, a handful of series, read ``fusebox_fuse_level`` and ``ALERTS``); thresholds are the spec's tiers in base units, so a panel's line is
the alert's threshold by construction. Units follow the signal's unit (ratio ->
``percentunit``, bytes -> ``decbytes``, bytes/s -> ``Bps``, seconds -> ``s``; SI, because the
spec's MB are SI). Every panel links to the runbook of the alert it shows
(``spec.runbook_url(alert)``); UIDs are derived from the spec name and the dashboard name.
The template variables are those some panel filters by (:func:`used_variables`), each listing the
values of a record the deployment feeds (:func:`variable_queries`, traced by :mod:`.tracing`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePath
from typing import Any

import orjson

from fusebox import conventions as C
from fusebox.signal_kinds import KINDS, records
from fusebox.signal_kinds.base import UNITS, VARIABLES, DashboardDef, PanelDef, Query, sel, signal_legend, signal_panel, signal_sel, tier_text

from . import render_slo, shedding, tracing
from .producers import fed_spec
from .render_rules import render_rules

__all__ = [
    "SCHEMA_VERSION",
    "DATASOURCE",
    "UNITS",
    "VARIABLES",
    "dashboards",
    "render_dashboards",
    "adapt",
    "panel_queries",
    "dashboard_uid",
]

# What Grafana 12 writes (the corpus' SGLang and vLLM production-stack dashboards carry 41);
# Grafana migrates older versions up on load, never down.
SCHEMA_VERSION = 41
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
OUT_DIR = "dashboards"

_TIER_COLORS = {"warning": "orange", "critical": "red"}
_FUSE_COLORS = ("green", "yellow", "orange", "red", "purple")
_TOPK = 5  # series per overview panel: the ones nearest their fuse


def _overview(spec) -> DashboardDef:
    alerts = [s.alert for s in spec.signals]
    alert_re = "|".join(alerts + [C.ABSENT_ALERT])
    levels = {a.level: a.name for a in spec.actions.values()}
    mapping_opts = {"0": {"text": "closed", "color": _FUSE_COLORS[0], "index": 0}}
    for lvl in sorted(levels):
        mapping_opts[str(lvl)] = {"text": f"L{lvl} {levels[lvl]}", "color": _FUSE_COLORS[min(lvl, len(_FUSE_COLORS) - 1)],
                                  "index": lvl}
    scope = ", ".join(C.SCOPE_LABELS)
    panels = [
        PanelDef(
            title="Fuse state per scope",
            description=("Current fuse level from the fuse service (" + C.FUSE_LEVEL_METRIC + "): 0 closed, "
                         + ", ".join(f"{l} {n}" for l, n in sorted(levels.items())) + "."),
            queries=(Query(f"max by ({scope}) ({sel(C.FUSE_LEVEL_METRIC, 'host')})",
                           "{{cluster}} {{host_name}} {{hw_id}} {{engine}}"),),
            unit="none", alerts=tuple(a for s in spec.signals for a in [s.alert] if any(t.fuse for t in s.tiers)),
            kind="stat", mappings=({"type": "value", "options": mapping_opts},),
            steps=tuple([(_FUSE_COLORS[0], None)] + [(_FUSE_COLORS[min(l, len(_FUSE_COLORS) - 1)], float(l)) for l in sorted(levels)]),
            width=12, no_value="no fuse tripped (or the fuse service is not scraped)",
        ),
        PanelDef(
            title="Firing fusebox alerts",
            description="Alerts firing now, by alert and severity (Prometheus ALERTS series).",
            queries=(Query(f'count by (alertname, severity) ({C.ALERTS_METRIC}{{alertstate="firing", alertname=~"{alert_re}"}})',
                           "{{alertname}} ({{severity}})"),),
            unit="none", alerts=tuple(alerts), kind="stat",
            steps=(("green", None), ("red", 1.0)), width=12, no_value="none firing",
        ),
    ]
    for sig in spec.signals:
        rec = records(sig)["value"]
        panels.append(signal_panel(
            sig, f"{sig.alert}: {sig.name.replace('_', ' ')}",
            f"{sig.description} Top {_TOPK} series nearest the fuse; lines at {tier_text(sig)}.",
            f"topk({_TOPK}, {signal_sel(sig, rec)})", signal_legend(sig),
            width=12 if not sig.secondary else 8,
        ))
    # Markers only: the schema's AnnotationQuery has no field for Prometheus' step, title, text
    # or tag options (additionalProperties false), so Grafana's defaults apply (60 s step).
    annotations = (
        {
            "datasource": dict(DATASOURCE), "enable": True, "hide": False, "iconColor": "red",
            "name": "fusebox alerts firing",
            "expr": f'{C.ALERTS_METRIC}{{alertstate="firing", alertname=~"{alert_re}"}}',
        },
        {
            "datasource": dict(DATASOURCE), "enable": True, "hide": False, "iconColor": "purple",
            "name": "fuse engaged",
            "expr": f"{C.FUSE_LEVEL_METRIC} > 0",
        },
    )
    return DashboardDef(C.OVERVIEW_DASHBOARD, f"fusebox / {spec.name} / overview",
                        "Which fuse is near, where, and why: every signal against its tiers, the fuse state, alert annotations.",
                        tuple(panels), annotations)


# ------------------------------------------------------------------ grafanalib + adapter
dashboard_uid = C.dashboard_uid  # re-exported: the UID rule lives with the other names


# Which variables narrow each variable's values (cluster, then namespace or host).
_PARENTS = {"cluster": (), "namespace": ("cluster",), "pod": ("cluster", "namespace"), "instance": ("cluster",)}
# The scope whose kinds' records (Kind.variable_source) list each variable's values first.
_SCOPE = {"cluster": "gpu", "instance": "gpu", "gpu": "gpu", "engine": "engine", "model": "engine"}
# Raw metrics tried last, where no signal's record lists a scope's values.
_FALLBACK = {"gpu": C.PROM["gpu_memory_limit"], "engine": C.PROM["kv_cache_usage"]}


def parents_of(var: str) -> tuple[str, ...]:
    """The variables whose values narrow ``var``'s (its query matches their labels)."""
    return _PARENTS.get(var, ("cluster", "instance"))


def used_variables(defs: list[DashboardDef]) -> list[str]:
    """The template variables (:data:`VARIABLES`, in that order) some panel query filters by, and
    the ones that narrow those (:func:`parents_of`). A variable no panel filters by is left out:
    the namespace and pod variables, unless a signal keeps namespace and pod (its ``by``)."""
    used = {v for d in defs for p in d.panels for q in p.queries for v in VARIABLES if f"${v}" in q.expr}
    for v in list(used):
        used.update(parents_of(v))
    return [v for v in VARIABLES if v in used]


def variable_candidates(spec, var: str) -> list[str]:
    """The records (or raw metrics) ``var`` may list its values from, best first: the variable
    records (:meth:`Kind.variable_record`) of the kinds that prefer its scope, of signals at that level (lowest
    preference first, the spec's last signal first among equals), then every other signal's, then
    a raw metric of the scope. Namespace and pod: the records of the signals that keep both."""
    if var in ("namespace", "pod"):
        return [KINDS[s.kind].variable_record(s) for s in spec.signals if {"namespace", "pod"} <= set(s.by)]
    scope = _SCOPE[var]

    def rank(item: tuple[int, Any]) -> tuple[int, int]:
        i, s = item
        vs = KINDS[s.kind].variable_source
        # a kind's scope holds for its signals of that level (a quantile by peer service lists no engine)
        return (vs[1] if vs is not None and vs[0] == scope and s.level == scope else 100, -i)

    ranked = sorted(enumerate(spec.signals), key=rank)
    out = list(dict.fromkeys(KINDS[s.kind].variable_record(s) for _, s in ranked))
    return out + [_FALLBACK[scope]] if _FALLBACK[scope] not in out else out


def _variable_query(var: str, metric: str) -> str:
    label = VARIABLES[var][0]
    parents = [f'{VARIABLES[p][0]}=~"${p}"' for p in parents_of(var)]
    return f"label_values({metric}{{{', '.join(parents)}}}, {label})" if parents else f"label_values({metric}, {label})"


def variable_queries(spec, defs: list[DashboardDef], tracer: tracing.Tracer) -> dict[str, str]:
    """``{variable: its label_values query}`` for the variables the panels use: each lists the
    values of the first candidate (:func:`variable_candidates`) that the deployment feeds and whose
    series carry its label (:func:`.tracing.variable_trace`); where none does, the first (``fusebox
    generate`` then says the variable lists nothing, and why)."""
    out = {}
    for var in used_variables(defs):
        cands = variable_candidates(spec, var)
        queries = [_variable_query(var, c) for c in cands]
        out[var] = next((q for q in queries if tracing.variable_trace(tracer, q).fed), queries[0] if queries else "")
    return out


def _templates(queries: dict[str, str]) -> list:
    from grafanalib.core import Template

    out = [Template(name="datasource", label="Data source", query="prometheus", type="datasource")]
    for var, query in queries.items():
        out.append(Template(name=var, label=VARIABLES[var][1], query=query,
                            dataSource=dict(DATASOURCE), includeAll=True, multi=True, allValue=".*", default="$__all",
                            refresh=2))
    return out


def _grafanalib_dashboard(spec, d: DashboardDef, templates: list):
    from grafanalib.core import Annotations, Dashboard, GridPos, Stat, Target, Templating, Threshold, TimeSeries

    panels = []
    x = y = 0
    row_h = 8
    for i, p in enumerate(d.panels, start=1):
        if x + p.width > 24:
            x, y = 0, y + row_h
        steps = _steps(p)
        thresholds = [Threshold(color, idx, float(value) if value is not None else 0.0)
                      for idx, (color, value) in enumerate(steps)]
        targets = [Target(expr=q.expr, legendFormat=q.legend, refId=chr(ord("A") + j), datasource=dict(DATASOURCE))
                   for j, q in enumerate(p.queries)]
        links = [{"title": f"Runbook: {a}", "url": spec.runbook_url(a), "targetBlank": True} for a in p.alerts]
        common = dict(title=p.title, description=p.description, dataSource=dict(DATASOURCE), targets=targets,
                      gridPos=GridPos(h=row_h, w=p.width, x=x, y=y), id=i, links=links, thresholds=thresholds)
        if p.kind == "stat":
            panel = Stat(format=p.unit, mappings=list(p.mappings), reduceCalc="lastNotNull", graphMode="none",
                         colorMode="background", textMode="value_and_name",
                         noValue=p.no_value, **common)
        else:
            panel = TimeSeries(unit=p.unit, thresholdsStyleMode="line" if p.tiers else "off",
                               legendDisplayMode="table", legendPlacement="right", legendCalcs=["lastNotNull", "max"],
                               tooltipMode="multi", tooltipSort="desc", spanNulls=False, **common)
        panels.append(panel)
        x += p.width
    return Dashboard(
        title=d.title, uid=dashboard_uid(spec.name, d.name), description=d.description, tags=["fusebox", spec.name],
        panels=panels, templating=Templating(list=templates), annotations=Annotations(list=list(d.annotations)),
        editable=False, refresh="30s", timezone="utc", graphTooltip=1,
        links=[{"asDropdown": True, "includeVars": True, "keepTime": True, "tags": ["fusebox", spec.name],
                "targetBlank": False, "title": "fusebox dashboards", "type": "dashboards"}],
    )


def _steps(p: PanelDef) -> tuple:
    """Threshold steps (color, value): base step first (value None), then the spec's tiers."""
    if p.steps is not None:
        return p.steps
    if p.lower_bound and p.tiers:  # fires below: the most severe tier's colour at the bottom, green above the last line
        up = sorted(p.tiers, key=lambda t: t.threshold)
        colors = [_TIER_COLORS.get(t.name, "red") for t in up] + ["green"]
        return tuple([(colors[0], None)] + [(colors[i + 1], t.threshold) for i, t in enumerate(up)])
    out = [("green", None)]
    for t in p.tiers:  # warning before critical (spec order)
        out.append((_TIER_COLORS.get(t.name, "red"), t.threshold))
    return tuple(out)


def adapt(obj: dict, *, header: str) -> dict:
    """Fix grafanalib 0.7.1's JSON for current Grafana (see the module docstring).

    Args:
        obj: ``Dashboard.to_json_data()`` serialised and re-read as plain JSON.
        header: the "Code generated ..." line, put first in the dashboard's description.
    Returns:
        The same dict, modified.
    """
    _drop_nulls(obj)  # first: the fixes below then see absent fields, never None
    obj["schemaVersion"] = SCHEMA_VERSION
    obj["description"] = f"{header} {obj.get('description', '')}".strip()
    for key in ("rows", "style", "hideControls", "sharedCrosshair", "gnetId", "id", "__inputs"):
        obj.pop(key, None)
    obj["annotations"]["list"] = [_builtin_annotation()] + obj["annotations"]["list"]
    for t in obj["templating"]["list"]:
        if t.get("type") == "datasource":
            # No `datasource` (the schema's DataSourceRef is an object, never null) and no
            # `current`: VariableOption requires text and value, so grafanalib's `{}` is rejected;
            # without it Grafana selects the default data source of the queried type (fusebox's
            # provisioning makes its Prometheus the default).
            t.pop("datasource", None)
            t.pop("current", None)
        else:
            t["datasource"] = dict(DATASOURCE)
            t["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
            # `query` stays the string grafanalib writes: the schema's VariableModel has no
            # `definition`, and its object form of `query` needs object values, so Grafana's own
            # `{"query": "...", "refId": "..."}` is rejected. Grafana's Prometheus variable support
            # reads a string query (the form jsonnet-built dashboards use).
        for k in ("auto", "auto_count", "auto_min", "useTags", "tagsQuery", "tagValuesQuery"):
            t.pop(k, None)
    for p in obj["panels"]:
        p["datasource"] = dict(DATASOURCE)
        for k in ("height", "span", "minSpan", "error", "isNew", "repeat", "repeatDirection", "maxPerRow", "cacheTimeout"):
            p.pop(k, None)
        for t in p.get("targets", []):
            t["datasource"] = dict(DATASOURCE)
            for k in ("target", "metric", "step", "query", "intervalFactor"):
                t.pop(k, None)
            t["range"], t["instant"] = True, False
        defaults = p["fieldConfig"]["defaults"]
        steps = defaults.get("thresholds", {}).get("steps", [])
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": s["color"], "value": BASE_STEP_VALUE if i == 0 else s["value"]} for i, s in enumerate(steps)],
        }
        if p.get("type") == "timeseries" and defaults.get("unit") == "percentunit":
            defaults["custom"]["axisSoftMin"], defaults["custom"]["axisSoftMax"] = 0, 1
        if p.get("type") == "stat":
            defaults.pop("custom", None)
            p["options"]["reduceOptions"]["fields"] = ""
    _schema_fixes(obj)
    return obj


# The base threshold step's value. The schema's Threshold requires `value` as a number, so it
# cannot be null (what Grafana itself writes for -Infinity; docs/pitfalls.md P8 asked for null
# before the schema was checked). Grafana sets the first step to -Infinity whenever it loads a
# panel (fixThresholds / validateFieldConfig in grafana-data), so this number is never used; 0 is
# the floor of every value fusebox draws except KV growth, which may be negative and still takes
# the base colour.
BASE_STEP_VALUE = 0
# Panel links are typed as DashboardLink in the schema, which requires these keys.
_LINK_DEFAULTS = {"type": "link", "icon": "doc", "tooltip": "", "tags": [], "asDropdown": False,
                  "targetBlank": True, "includeVars": False, "keepTime": False}


def _drop_nulls(node) -> None:
    """Remove every ``None`` value from dicts, recursively.

    grafanalib writes ``null`` for each unset field (panel ``interval``, ``timeFrom``, ``timeShift``,
    ``fieldConfig.defaults.decimals``/``min``/``max``/``color``, ``timepicker.nowDelay``, variable
    ``regex``/``allValue``/``datasource``); the schema types them (string, number, object) and
    allows ``null`` only for ``Dashboard.id``, which :func:`adapt` drops. Grafana reads an absent
    field as its default, the same as ``null``.
    """
    if isinstance(node, dict):
        for k in [k for k, v in node.items() if v is None]:
            del node[k]
        for v in node.values():
            _drop_nulls(v)
    elif isinstance(node, list):
        for v in node:
            _drop_nulls(v)


def _schema_fixes(obj: dict) -> None:
    """Make the dashboard valid against Grafana's dashboard JSON schema (classic model, v41).

    Each change names the schema rule that requires it; none changes what Grafana shows, except
    the annotations' Prometheus options (see below). The data source variable, the template
    queries and the base threshold step are fixed in :func:`adapt` itself.
    """
    # TimePickerConfig has additionalProperties false and no `time_options` (the old quick-range
    # list, not part of Grafana's current model; `quick_ranges` replaced it).
    obj.get("timepicker", {}).pop("time_options", None)
    # DashboardLink requires icon and tooltip.
    obj["links"] = [{"icon": "external link", "tooltip": "", **link} for link in obj.get("links", [])]
    for p in obj["panels"]:
        # Panel has no `editable` (the dashboard's `editable` governs); grafanalib writes true.
        p.pop("editable", None)
        # Panel links are DashboardLink in the schema: type, icon, tooltip, tags, asDropdown,
        # targetBlank, includeVars, keepTime are required. A runbook is an external link.
        p["links"] = [{**_LINK_DEFAULTS, **link} for link in p.get("links", [])]


def _builtin_annotation() -> dict:
    return {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}


def _defs(spec) -> list[DashboardDef]:
    """The overview, then each kind's drill-down in the kinds' order, then the in-path shedding
    board where the spec names a gateway shedder (:func:`.shedding.dashboard`), then the SLO
    board where the spec has ``slos:`` (:func:`.render_slo.dashboard`)."""
    out = [_overview(spec)]
    for kind in KINDS.values():
        d = kind.dashboard(spec, [s for s in spec.signals if s.kind == kind.name])
        if d is not None:
            out.append(d)
    board = shedding.dashboard(spec)
    if board is not None:
        out.append(board)
    slos = render_slo.dashboard(spec)
    if slos is not None:
        out.append(slos)
    return out


def _to_json_data(obj):
    # grafanalib's DashboardEncoder.default, for orjson: its objects serialise themselves.
    return obj.to_json_data()


def dashboards(spec, header: str | None = None, groups: list[dict] | None = None) -> dict[str, dict]:
    """Every dashboard as a JSON-ready dict, keyed by its name (``overview``, ``gpu-memory``, ...).

    ``groups``: the spec's rule groups (:func:`.render_rules.render_rules`; rendered here when not
    given), which the variables' sources are traced through. Signals with every tier disabled that
    nothing feeds are left out (:func:`.producers.fed_spec`)."""
    header = header or C.GENERATED_HEADER.format(spec=PurePath(spec.file).name)
    spec = fed_spec(spec)
    if groups is None:
        groups = render_rules(spec).groups
    defs = _defs(spec)
    templates = _templates(variable_queries(spec, defs, tracing.Tracer(spec, groups)))
    out: dict[str, dict] = {}
    for d in defs:
        raw = orjson.loads(orjson.dumps(_grafanalib_dashboard(spec, d, templates), default=_to_json_data))
        out[d.name] = adapt(raw, header=header)
    return out


def dashboard_text(d: dict) -> str:
    """A dashboard's file text: JSON, keys sorted, 2-space indent, UTF-8, newline at the end."""
    return orjson.dumps(d, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n"


def dashboard_texts(spec, header: str | None = None, groups: list[dict] | None = None) -> dict[str, str]:
    """Every dashboard's file text (:func:`dashboard_text`), keyed by its name."""
    return {name: dashboard_text(d) for name, d in dashboards(spec, header, groups).items()}


def render_dashboards(spec, header: str | None = None, boards: dict[str, str] | None = None) -> dict[str, str]:
    """``{"dashboards/fusebox-<name>.json": json_text}``. Deterministic (sorted keys)."""
    if boards is None:
        boards = dashboard_texts(spec, header)
    return {f"{OUT_DIR}/fusebox-{name}.json": text for name, text in boards.items()}


def outputs(spec, header: str, boards: dict[str, str] | None = None) -> dict[str, str]:
    """The writer's entry point (generator/outputs.py)."""
    return render_dashboards(spec, header, boards)


def panel_queries(dashboard: dict) -> Iterable[tuple[str, str, str]]:
    """Yield ``(panel_title, refId, expr)`` for every query of a rendered dashboard."""
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t["refId"], t["expr"]
