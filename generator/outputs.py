"""Render every output of a spec in memory: {relative path: file text}. No I/O here."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path, PurePath
from typing import Any

import orjson

from fusebox import conventions as C
from fusebox.signal_kinds import kind_of
from fusebox.signal_kinds.base import DCGM
from fusebox.spec import Signal, Spec
from fusebox.spec.adapter_kinds import ADAPTER_KINDS
from fusebox.spec.adapters import Adapter as FuseAdapter
from fusebox.spec.scaling import order_problems
from fusebox.spec.units import format_duration, format_number

from . import render_dashboards, render_grafana_provisioning, render_haproxy, render_inpath, render_otelcol, render_scaling
from .budget import late_scaling_text, scaling_rows
from .producers import unproduced
from .render_alertmanager import render_alertmanager, render_alertmanagerconfig, render_fragment, route_tests
from .render_k8s import DISCOVERING, discovering, kustomization_output, render_prometheusrule, workload_outputs
from .render_rules import Rules, render_rules
from .render_runbooks import render_runbooks
from .render_slo import GROUP_PREFIX as SLO_GROUP_PREFIX
from .render_slo import TEST_INTERVAL_S, slo_test_groups
from .render_tests import render_rule_tests
from .render_vmalert_tests import lag_note, vmalert_tests
from .rule_engines import MAX_GROUPS_PER_TENANT
from .tracing import empty_panel_warnings, trace_dashboards
from .yamlout import dump_yaml

RULE_FILE = "rules/fusebox.rules.yml"
RULE_TEST_FILE = "rules/fusebox.rules.test.yml"
VMALERT_RULE_TEST_FILE = "rules/fusebox.rules.vmalert.test.yml"  # the same cases for vmalert-tool unittest
SLO_TEST_FILE = "rules/fusebox.slo.test.yml"  # the SLOs' burn-rate cases (days of input: their own 1m interval)
SLO_VMALERT_TEST_FILE = "rules/fusebox.slo.vmalert.test.yml"  # the same cases for vmalert-tool unittest
# The SLO groups of RULE_FILE alone, which SLO_TEST_FILE reads: promtool evaluates every group of its
# rule files at each step, and days of one-minute steps over all of RULE_FILE's groups take many minutes.
SLO_RULE_FILE = "rules/fusebox.slo.rules.yml"
ALERTMANAGER_FILE = "alertmanager/alertmanager.yml"
ROUTE_TEST_FILE = "alertmanager/route-tests.yml"
FRAGMENT_FILE = "alertmanager/fragment.yml"
ALERTMANAGERCONFIG_FILE = "k8s/alertmanagerconfig.yml"
PROMETHEUSRULE_FILE = "k8s/prometheusrule.yml"
FRAGMENT_NOTE = ("# Not a config of its own: `fusebox alertmanager merge --base YOUR-alertmanager.yml --out merged.yml`\n"
                 "# puts `routes` first under the base's route.routes and appends `receivers` and `inhibit_rules`.\n")



def header_for(spec: Spec) -> str:
    """The "Code generated ... DO NOT EDIT." line. It names the spec by its base name only, so the
    outputs do not depend on how --spec was spelled (absolute, relative, from another folder) and
    ``--check`` finds no drift for another spelling."""
    return C.GENERATED_HEADER.format(spec=PurePath(spec.file).name)


def _dashboard_files(spec: Spec, header: str, groups: list[dict[str, Any]]) -> dict[str, str]:
    """The dashboards, their provisioning and ConfigMaps, and the Collector config."""
    boards = render_dashboards.dashboard_texts(spec, header, groups)  # once: the files and the ConfigMaps hold the same text
    out = render_dashboards.outputs(spec, header, boards)
    out.update(render_grafana_provisioning.outputs(spec, header, boards))
    out.update(render_otelcol.outputs(spec, header))
    return out


_LINE = re.compile(r"^(?!$)", re.M)


def _indent(text: str, pad: str) -> str:
    """``text`` with ``pad`` before each non-empty line (textwrap.indent's result, in one regex
    pass: the test files are the generator's largest output)."""
    return _LINE.sub(pad, text)


def _cached(cache: dict[tuple[int, ...], str], value: list[dict[str, Any]], pad: str) -> str:
    """``dump_yaml(value)`` indented by ``pad``, written once per list of the same objects (the
    two test files share them). The objects outlive the cache (one render)."""
    key = (len(pad), *map(id, value))
    if key not in cache:
        cache[key] = _indent(dump_yaml(value), pad)
    return cache[key]


def _alert_tests_text(cases: list[dict[str, Any]], cache: dict[tuple[int, ...], str]) -> str:
    """``  alert_rule_test:`` and its cases, indented as a key of a test group. Each case's
    expected alerts (most of the text) come from ``cache``; the cases' other keys are one-line
    scalars, written in one call and cut at each item's ``- ``. Indenting YAML keeps its meaning
    (block structure is relative)."""
    heads = re.split(r"(?m)^(?=- )", dump_yaml([{k: v for k, v in c.items() if k not in ("exp_alerts", "_why")}
                                                 for c in cases]))[1:]
    assert len(heads) == len(cases)
    out = ["  alert_rule_test:\n"]
    for head, c in zip(heads, cases, strict=False):
        exp = c.get("exp_alerts", [])
        out.append(_indent(head, "  ") + ("    exp_alerts: []\n" if not exp else
                                          "    exp_alerts:\n" + _cached(cache, exp, "    ")))
    return "".join(out)


def _test_text(head: str, spec: Spec, tests: list[tuple[str, dict[str, Any]]], cache: dict[tuple[int, ...], str],
               interval_s: float | None = None, rule_file: str = RULE_FILE) -> str:
    """A rule-test file (promtool's format, or vmalert-tool's): ``head``, then each group under a
    comment with its title and the reason of each check (the ``_why`` keys, left out of the YAML).

    The promtool and vmalert-tool files hold the same input series and expected alerts (the same
    objects): ``cache`` keeps their text, written once for both."""
    text = [head, dump_yaml({"rule_files": [Path(rule_file).name],
                             "evaluation_interval": format_duration(interval_s or spec.test_interval_s)}), "tests:\n"]
    for title, group in tests:
        whys = [c["_why"] for c in group.get("alert_rule_test", []) if "_why" in c]
        text.append(f"# {title}\n" + "".join(f"#  - {w}\n" for w in whys))
        parts = []
        for k, v in group.items():
            if k == "input_series" and v:
                parts.append("  input_series:\n" + _cached(cache, v, "  "))
            elif k == "alert_rule_test" and v:
                parts.append(_alert_tests_text(v, cache))
            else:
                parts.append(_indent(dump_yaml({k: v}), "  "))
        text.append("- " + "".join(parts)[2:])
    return "".join(text)


def _rule_files(spec: Spec, header: str, rules: Rules) -> dict[str, str]:
    """Rules, their promtool tests, the PrometheusRule, Alertmanager config and tests, runbooks."""
    h = f"# {header}\n"
    rules_text = dump_yaml({"groups": rules.groups})
    out: dict[str, str] = {RULE_FILE: h + rules_text}

    # Rendered once; the vmalert-tool file is the same cases, transformed (render_vmalert_tests).
    tests = render_rule_tests(spec, rules, Path(RULE_FILE).name)
    vm_tests = vmalert_tests(tests, rules.groups, spec.test_interval_s)
    cache: dict[tuple[int, ...], str] = {}  # input series and expected alerts, written once for both files
    out[RULE_TEST_FILE] = _test_text(h, spec, tests, cache)
    out[VMALERT_RULE_TEST_FILE] = _test_text(h + lag_note(rules.groups, spec.test_interval_s), spec, vm_tests, cache)
    if spec.slos:  # the burn-rate cases: windows of days, evaluated every minute (generator/render_slo.py)
        # the burn-rate rules alone: the budget record reads 30 days of samples at every step
        slo_groups = [{**{k: v for k, v in g.items() if k != "partial_response_strategy"},
                       "rules": [r for r in g["rules"] if "budget" not in r.get("record", "")]}
                      for g in rules.groups if g["name"].startswith(SLO_GROUP_PREFIX)]
        note = (f"# A test fixture, not a file to load: the SLO burn-rate groups of {Path(RULE_FILE).name} alone, what\n"
                f"# {Path(SLO_TEST_FILE).name} tests. Loaded beside {Path(RULE_FILE).name}, every SLO rule would run twice.\n")
        out[SLO_RULE_FILE] = h + note + dump_yaml({"groups": slo_groups})
        slo_tests = slo_test_groups(spec)
        out[SLO_TEST_FILE] = _test_text(h, spec, slo_tests, cache, TEST_INTERVAL_S, SLO_RULE_FILE)
        out[SLO_VMALERT_TEST_FILE] = _test_text(h + lag_note(slo_groups, TEST_INTERVAL_S), spec,
                                                vmalert_tests(slo_tests, slo_groups, TEST_INTERVAL_S), cache,
                                                TEST_INTERVAL_S, SLO_RULE_FILE)

    out[ALERTMANAGER_FILE] = h + dump_yaml(render_alertmanager(spec))
    out[ROUTE_TEST_FILE] = h + dump_yaml({"tests": route_tests(spec)})
    out[FRAGMENT_FILE] = h + FRAGMENT_NOTE + dump_yaml(render_fragment(spec))
    out[ALERTMANAGERCONFIG_FILE] = h + dump_yaml(render_alertmanagerconfig(spec))
    # The same groups under `spec:`, written once: indenting the rule file's text keeps its YAML
    # meaning (block structure is relative; long plain scalars may fold at other columns).
    # Its groups differ from the file's only by the namespace label of some alerts (render_k8s).
    prometheusrule = render_prometheusrule(spec, rules)
    assert list(prometheusrule)[-1] == "spec"
    groups_text = dump_yaml(prometheusrule.pop("spec"))
    out[PROMETHEUSRULE_FILE] = h + dump_yaml(prometheusrule) + "spec:\n" + textwrap.indent(groups_text, "  ")
    out.update(render_runbooks(spec, rules, header))
    return out


def render_all(spec: Spec) -> dict[str, str]:
    """Every generated file for ``spec``: ``{relative path: text}``, sorted by path; raises nothing
    for a validated spec."""
    header = header_for(spec)
    rules = render_rules(spec)
    out = _rule_files(spec, header, rules)
    out.update(_dashboard_files(spec, header, rules.groups))
    out.update(workload_outputs(spec, header))
    out.update(render_haproxy.outputs(spec, header))
    out.update(render_inpath.outputs(spec, header))
    out.update(render_scaling.outputs(spec, header))
    out.update(kustomization_output(spec, header, list(out)))  # last: it lists every k8s/ manifest
    return dict(sorted(out.items()))


def _boards(spec: Spec, groups: list[dict[str, Any]], outputs: dict[str, str] | None) -> dict[str, dict]:
    """The dashboards by name, the overview first, then by name: read back from ``outputs``
    (:func:`render_all`'s) where given, else rendered."""
    if outputs is None:
        boards = render_dashboards.dashboards(spec, groups=groups)
    else:
        prefix, suffix = f"{render_dashboards.OUT_DIR}/fusebox-", ".json"
        boards = {path[len(prefix):-len(suffix)]: orjson.loads(text) for path, text in outputs.items()
                  if path.startswith(prefix) and path.endswith(suffix)}
    return dict(sorted(boards.items(), key=lambda kv: (kv[0] != C.OVERVIEW_DASHBOARD, kv[0])))


def spec_warnings(spec: Spec, outputs: dict[str, str] | None = None) -> list[str]:
    """Things in a valid spec that are likely mistakes: one line each, for standard error.
    ``outputs``: :func:`render_all`'s for this spec, when at hand (its dashboards are not rendered again).

    * ``kubernetes.collectors.enabled: false`` while a signal with an enabled tier still reads a
      GPU metric of the ``fusebox`` backend (the collectors' own): nothing exports it, so that
      signal cannot fire and its ``FuseboxSignalAbsent`` fires for good; and while
      ``kubernetes.collectors.run`` names ``kv`` or ``latency``: one line saying none is deployed.
    * a rule reads a metric that nothing ``k8s/`` deploys produces and no exporter the spec names
      publishes (:func:`.producers.unproduced`; e.g. KV bytes or the alignment histogram while
      ``kubernetes.collectors.run`` lacks their collector), naming the signal or the rule;
    * a dashboard panel that stays empty, or a variable that lists nothing, on what the spec
      deploys and names (:func:`.tracing.trace_dashboards`): its query traced to the metric nothing
      publishes, or to a join on labels one side lacks (energy per token without
      ``kubernetes.engines``), with the fix;
    * ``global.runbook_base_url`` still holds the starter spec's ``your-org`` placeholder: every
      alert's runbook link leads nowhere.
    * a signal aggregated ``by`` namespace that requests a fuse: the operator's default matcher
      strategy lets the AlertmanagerConfig route it from ``kubernetes.namespace`` alone.
    * ``global.rule_engine: mimir`` with more rule groups than Mimir's default
      ``-ruler.max-rule-groups-per-tenant`` (:data:`.rule_engines.MAX_GROUPS_PER_TENANT`): the ruler
      refuses the rest until the tenant's limit is raised.
    * ``kubernetes.collectors.run`` has ``kv`` and ``kubernetes.engines.models`` is empty: the KV
      collector discovers engines whose geometry it does not know (no KV bytes).
    * ``fuse.adapters`` that cannot apply what the tiers request (:func:`adapter_warnings`).
    * an in-path shedder that acts after the fuse, or a gateway breaker window shorter than the
      longest generation (:func:`.render_inpath.inpath_warnings`; ``fusebox check`` fails on them).
    * a ``scaling`` set point at or after a shedder's or a fuse's threshold on the same quantity
      (:func:`fusebox.spec.scaling.order_problems`; ``fusebox check`` fails on them).
    * a ``scaling`` workload whose new replica is Ready only after the KV pool is full
      (:func:`.budget.late_scaling_text`; ``fusebox budget`` and ``fusebox check`` fail on it).
    * an SLO window under 28d (Sloth's shortest standard one): its slow ticket fires on a burn
      below 1x, which would still leave budget at the window's end (docs/slo.md).
    """
    groups = render_rules(spec).groups
    out, reading = _collector_warnings(spec)
    out += _unproduced_warnings(spec, groups, {(f"signal {s.name!r}", s.source.metric) for s in reading})
    out += _namespace_fuse_warnings(spec)
    out += empty_panel_warnings(trace_dashboards(spec, _boards(spec, groups, outputs), groups))
    out += _slo_window_warnings(spec)
    if spec.rule_engine == "mimir" and len(groups) > MAX_GROUPS_PER_TENANT:
        out.append(f"global.rule_engine is mimir and the rules make {len(groups)} groups, over Mimir's default "
                   f"-ruler.max-rule-groups-per-tenant {MAX_GROUPS_PER_TENANT} (ruler_max_rule_groups_per_tenant): "
                   "the ruler refuses the upload -- raise the tenant's limit, or split the spec into tenants")
    e = spec.kubernetes.engines
    if "kv" in discovering(spec) and e is not None and not e.models:
        out.append("kubernetes.collectors.run has kv and kubernetes.engines names no models: the KV collector finds "
                   "the engine pods but knows no model's geometry, so it counts each engine as unknown and exports no KV "
                   "bytes -- list each served model (its model_name) under kubernetes.engines.models with its config.json "
                   "or {layers, kv_heads, head_dim, dtype}")
    out += adapter_warnings(spec)
    out += render_inpath.inpath_warnings(spec)
    out += order_problems(spec)
    out += [late_scaling_text(r) for r in scaling_rows(spec) if not r.ok]
    if "your-org" in spec.runbook_base_url:
        out.append(f"global.runbook_base_url is still the placeholder {spec.runbook_base_url!r}: every alert's "
                   "runbook link leads nowhere -- set it to where your runbooks/ are served")
    return out


def _collector_warnings(spec: Spec) -> tuple[list[str], list[Signal]]:
    """With ``kubernetes.collectors.enabled: false``: the tiered GPU signals that read the fusebox
    collectors (each a line), and one line for discovering collectors ``run`` still names; also
    returns those signals (their metric is not warned of again as unproduced)."""
    from fusebox.signal_kinds.base import FUSEBOX

    if spec.kubernetes.collectors.enabled:
        return [], []
    out = []
    reading = [s for s in spec.signals if s.tiers and s.level == "gpu" and s.source.backend == FUSEBOX]
    for s in reading:
        out.append(f"signal {s.name!r} reads {s.source.metric or 'an expression'} from the fusebox collectors, "
                   "but kubernetes.collectors.enabled is false: it cannot fire and its "
                   f"{C.ABSENT_ALERT} will fire for good -- give it another source (global.source / its "
                   f"sources), or disable it (overrides: [{{alert: {s.alert}, enabled: false}}])")
    idle = [n for n in spec.kubernetes.collectors.run if n in DISCOVERING]
    if idle:
        out.append(f"kubernetes.collectors.run names {', '.join(idle)} but kubernetes.collectors.enabled is false: "
                   "k8s/ deploys no collector, so nothing discovers the engines for them (their KV bytes / "
                   "alignment series stay empty, see below) -- set kubernetes.collectors.enabled: true, or "
                   "remove them from run")
    return out, reading


def _unproduced_warnings(spec: Spec, groups: list[dict[str, Any]], warned: set[tuple[str, str | None]]) -> list[str]:
    """One line per reader (a signal or a rule) of metrics nothing deployed or named publishes
    (:func:`.producers.unproduced`), but ``warned`` (reader, metric) pairs; a kind may say instead
    what its rules compute without them (``unread_inputs_warning``)."""
    missing: dict[str, tuple[list[str], str]] = {}
    for reader, metric, how in unproduced(spec, groups):
        if (reader, metric) not in warned:
            missing.setdefault(reader, ([], how))[0].append(metric)
    out = []
    for reader, (metrics, how) in missing.items():
        sig = next((s for s in spec.signals if reader == f"signal {s.name!r}"), None)
        kind_says = kind_of(sig).unread_inputs_warning(sig, metrics) if sig is not None else None
        if kind_says is not None:  # the rules compute something else, not nothing (e.g. GPU memory uncorrected)
            out.append(kind_says)
            continue
        them = "it" if len(metrics) == 1 else "them"
        out.append(f"{reader} reads {', '.join(metrics)}, which nothing k8s/ deploys produces and no exporter the "
                   f"spec names publishes: the rules reading {them} stay empty (an absent alert on {them} fires for "
                   "good) -- " + (how or "publish it, or read another source"))
    return out


def _namespace_fuse_warnings(spec: Spec) -> list[str]:
    """A signal aggregated by namespace that requests a fuse: the operator routes only its own namespace."""
    return [f"signal {s.name!r} is aggregated by namespace and requests a fuse: the Prometheus Operator "
            "routes an AlertmanagerConfig only the alerts of its own namespace (its default matcher "
            f"strategy), so k8s/alertmanagerconfig.yml takes {s.alert} to the fuse only from namespace "
            f"{spec.kubernetes.namespace!r} (kubernetes.namespace) -- aggregate it by another label, or "
            "merge the route into the main config (fusebox alertmanager merge)"
            for s in spec.signals if "namespace" in (s.by or ()) and any(t.fuse for t in s.tiers)]


def _slo_window_warnings(spec: Spec) -> list[str]:
    """An SLO window under 28d whose ticket pairs fire below 1x (docs/slo.md)."""
    out = []
    for slo in spec.slos:
        low = [(f, lw) for t in slo.tiers if t.name == "ticket" for f, lw, _ in t.windows if f < 1]
        if low and slo.window_s < 28 * 86400:
            pairs = " and ".join(f"{format_number(round(f, 3))}x over {format_duration(lw)}" for f, lw in low)
            out.append(f"SLO {slo.name!r} has a {format_duration(slo.window_s)} window: its ticket fires at {pairs}, below "
                       "the sustainable rate (1x), so it tickets burns that would still leave budget at the window's end "
                       "-- use a 28d or 30d window (the workbook's budget shares assume one), or read it as an early "
                       "notice (docs/slo.md)")
    return out


# The scope labels of a GPU-level alert (the GPU's series, every scraper label dropped).
_GPU_SCOPE = ("cluster", "host_name", "hw_id")


def _scope(signal) -> tuple[str, ...]:
    """The scope labels (conventions.SCOPE_LABELS) the alerts of ``signal`` carry."""
    if signal.by:
        return tuple(k for k in signal.by if k in C.SCOPE_LABELS)
    return _GPU_SCOPE if signal.level == "gpu" else ()


def kps_prometheus_url(release: str, namespace: str) -> str:
    """The URL of kube-prometheus-stack's Prometheus Service for Helm release ``release`` installed in
    ``namespace``: ``http://<fullname>-prometheus.<namespace>:9090``, where the chart's fullname
    (templates/_helpers.tpl, no fullnameOverride) is the release name when it contains
    ``kube-prometheus-stack``, else ``<release>-kube-prometheus-stack``; either cut to 26 characters,
    a trailing ``-`` dropped. ``kps`` -> ``kps-kube-prometheus-stack-prometheus``, ``prometheus`` ->
    ``prometheus-kube-prometheus-prometheus``."""
    chart = "kube-prometheus-stack"
    full = (release if chart in release else f"{release}-{chart}")[:26].rstrip("-")
    return f"http://{full}-prometheus.{namespace}:9090"


def adapter_warnings(spec: Spec) -> list[str]:
    """What ``fuse.adapters`` (when the spec lists any) will not apply, one line each:

    * a fuse action a tier requests that no adapter lists: its trips show ``applied: false`` in the
      fuse's ``/state`` and FuseboxFuseLevelUnapplied fires. A warning, not an error: ``fusebox fuse
      serve --gateway-url`` adds the generic control call, which applies every level.
    * an adapter that applies a signal's action, but none of whose targets can ever match that
      signal's scope (a target matches when its ``match`` keys are all in the scope, or the scope's
      labels all in ``match``) and which cannot discover it (``discover`` resolves GPU scopes, those
      with ``hw_id``, and engine scopes, ``engine="<namespace>/<pod>"``): every trip of that signal
      is refused there (``scope not mapped``). A warning: another adapter may apply it.
    * a ``discover`` without ``prometheus`` while the generated fuse Deployment gives the fuse no
      ``--prometheus-url`` (neither ``kubernetes.fuse.prometheus_url`` nor its ``args``): it exits 2 at start.
    * a ``credentials_file`` while ``kubernetes.fuse.gateway_secret`` is unset: the generated
      Deployment mounts no key there, and the fuse exits 2 at start.
    * a ``discover`` whose attribution reads a GPU's pod from a label the dcgm selector
      (``global.selectors.dcgm`` or ``global.selector``) also matches on, while a signal reads dcgm:
      see :func:`dcgm_attribution_warnings`.
    """
    if not spec.adapters:
        return []
    out = []
    levels = {name: a.level for name, a in spec.actions.items()}
    for action in dict.fromkeys(t.fuse for s in spec.signals for t in s.tiers if t.fuse):
        if not any(action in a.actions for a in spec.adapters):
            users = sorted({s.name for s in spec.signals for t in s.tiers if t.fuse == action})
            out.append(f"fuse action {action!r} (level {levels.get(action)}), requested by {', '.join(users)}, is applied "
                       f"by no adapter of fuse.adapters: its trips will show applied: false in the fuse's /state and "
                       f"{C.SELF_ALERTS['level_unapplied']} will fire -- list it in an adapter whose kind applies level "
                       f"{levels.get(action)} (kind http applies every level), or give the fuse --gateway-url")
    release = spec.kubernetes.labels.get("release")
    example = (f"{kps_prometheus_url(release, spec.kubernetes.namespace)} if kube-prometheus-stack's release "
               f"{release!r} runs in {spec.kubernetes.namespace!r}" if release else
               "kube-prometheus-stack: http://<fullname>-prometheus.<namespace>:9090, <fullname> being the "
               "release, or <release>-kube-prometheus-stack cut to 26 characters")
    for a in spec.adapters:
        out += ADAPTER_KINDS[a.kind].warnings(a, spec, example)  # its kind's: discover, credentials_file
        out += _unmatched_scope_warnings(a, spec)
    return out + dcgm_attribution_warnings(spec)


def _unmatched_scope_warnings(a: FuseAdapter, spec: Spec) -> list[str]:
    """One line per signal whose action adapter ``a`` applies but whose scope none of its targets
    (nor its ``discover``) can match (:func:`adapter_warnings`)."""
    out = []
    for s in spec.signals:
        scope = set(_scope(s))
        if not scope or not any(t.fuse in a.actions for t in s.tiers):
            continue
        if any(set(t.match) <= scope or scope <= set(t.match) for t in a.targets):
            continue
        if a.discover is not None and ("hw_id" in scope or "engine" in scope):
            continue
        hint = ("add discover: {prometheus: <url>} to resolve GPUs to the gateway's workers" if "hw_id" in scope
                else f"add targets matching on {', '.join(sorted(scope))}")
        out.append(f"fuse.adapters.{a.name} applies {', '.join(sorted({t.fuse for t in s.tiers if t.fuse in a.actions}))} "
                   f"for signal {s.name!r}, whose alerts are scoped by {{{', '.join(sorted(scope))}}}, but none of its "
                   f"targets can match that scope: those trips will be refused there (scope not mapped) -- {hint}")
    return out


def dcgm_attribution_warnings(spec: Spec) -> list[str]:
    """One line per ``discover`` whose attribution labels contradict the dcgm selector.

    A scrape that honors dcgm-exporter's labels (``honorLabels: true``) puts a busy GPU's pod in
    ``pod``/``namespace``: an attribution reading those labels says that is how the cluster
    scrapes. A dcgm selector matching on one of them (``{namespace: gpu-operator}``) then keeps
    only the series without a pod, the idle GPUs, and hides exactly the busy ones from every rule
    that reads dcgm. With the GPU Operator's default (``honorLabels: false``) ``namespace`` is
    gpu-operator's on every series and the pod moves to ``exported_*``, which the default
    attribution reads: the two agree."""
    if not any(s.source.backend == DCGM for s in spec.signals):
        return []
    matchers = spec.selector_for(DCGM)
    where = "global.selectors.dcgm" if DCGM in spec.selectors else "global.selector"
    out = []
    for a in spec.adapters:
        d = a.discover
        clash = [k for k in matchers if d is not None and k in (d.pod, d.namespace) and not k.startswith("exported_")]
        if clash:
            sel = ", ".join(f"{k}: {matchers[k]}" for k in clash)
            out.append(f"{where} matches {{{sel}}} while fuse.adapters.{a.name}.discover.attribution reads each GPU's pod "
                       f"from {', '.join(clash)}: a scrape that puts the pod there (honorLabels true) gives a busy GPU its "
                       f"pod's {clash[0]}, so that selector hides exactly the busy GPUs from the dcgm rules -- scrape "
                       "dcgm-exporter with honorLabels false (the GPU Operator's ServiceMonitor default) and leave attribution "
                       "at its defaults (exported_pod, exported_namespace), or select dcgm on another label (job, service)")
    return out
