"""The fusebox spec (``apiVersion: fusebox/v1``): its schema, validation and normalised model.

``load_spec(path)`` reads YAML, checks its shape with pydantic (unknown keys are errors),
converts human units, applies defaults and overrides, and checks semantics (tier order,
windows vs scrape interval, quantile thresholds on bucket boundaries, PromQL syntax).
Every problem becomes a :class:`~fusebox.spec.errors.Problem` anchored at the line
and column of the offending YAML node. The result is a frozen :class:`Spec` that renderers
consume; renderers never see raw YAML.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pydantic import ValidationError

from . import deploy
from .adapters import normalise_adapters
from .budget import normalise_budget
from .checking import STANDARD_LEVELS, TIER_ORDER, Checker
from .connections import normalise_connections
from .deploy import Kubernetes, normalise_grafana, normalise_kubernetes, normalise_otelcol
from .diagnosis import resolve_diagnosis
from .errors import SpecError
from .inpath import normalise_inpath
from .normalised import ENGINES, Audit, FuseAction, Runbook, SelfMonitoring, Signal, Source, Spec, Tier
from .positions import Positions, load, read_text
from .scaling import normalise_scaling
from .schema import RULE_ENGINES, RawSpec
from .section_fuse import audit, check_after_shedding, check_human_receiver, group_timings, normalise_actions, normalise_self_monitoring
from .section_global import normalise_defaults, normalise_global
from .section_signals import SignalInputs, normalise_overrides, normalise_signals
from .slo import normalise_slos
from .validation import pydantic_problems

__all__ = ["API_VERSION", "ENGINES", "RULE_ENGINES", "STANDARD_LEVELS", "TIER_ORDER", "Audit", "FuseAction", "Kubernetes", "RawSpec",
           "Runbook", "SelfMonitoring", "Signal", "Source", "Spec", "Tier", "load_spec", "parse_spec"]

API_VERSION = "fusebox/v1"


# ----------------------------------------------------------------------------- loading
def load_spec(path: str | Path, *, display_path: str | None = None) -> Spec:
    """Read, validate and normalise a spec file.

    Args:
        path: the YAML file.
        display_path: how to name the file in errors (default: ``path`` as given).

    Raises:
        SpecError: with one Problem per fault, each ``file:line:col: what -- fix`` (a file over
            1 MiB or not UTF-8 too: see :mod:`.positions`).
        OSError: when the file cannot be read (FileNotFoundError, IsADirectoryError, ...).
    """
    file = display_path or str(path)
    return parse_spec(read_text(Path(path), file), file, base_dir=Path(path).parent)


def parse_spec(text: str, file: str = "<spec>", *, base_dir: Path | None = None) -> Spec:
    """Like :func:`load_spec` on a string. ``base_dir``: the folder the spec's relative paths
    (``kubernetes.engines.models.*.config``) are read from; default: ``file``'s folder (the
    working directory for ``<spec>``)."""
    data, pos = load(text, file)
    if not isinstance(data, dict):
        raise SpecError([pos.problem((), "the spec must be a YAML mapping", "start from the shipped fusebox.yaml")])
    if data.get("apiVersion") != API_VERSION:
        raise SpecError([pos.problem(("apiVersion",), f"apiVersion must be {API_VERSION!r} (got {data.get('apiVersion')!r})",
                                     f"set 'apiVersion: {API_VERSION}'")])
    try:
        raw = RawSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(pydantic_problems(e.errors(), pos, RawSpec, aliases=_ALIASES)) from None
    return _normalise(raw, data, pos, Path(file).parent if base_dir is None else base_dir)


_ALIASES = {"for_": "for", "global_": "global"}


def _normalise(raw: RawSpec, data: dict, pos: Positions, base_dir: Path | None) -> Spec:
    """The frozen Spec of a spec that passed its schema: each section's normaliser in turn (the
    problems in the order they report them), then the runbooks' queries against the records."""
    ck = Checker(pos, base_dir)
    r = raw
    g = r.global_
    intervals = normalise_global(ck, g, r.signals)
    check_human_receiver(ck, r.fuse)
    actions = normalise_actions(ck, r.fuse)
    defaults = normalise_defaults(ck, r.defaults)
    overrides = normalise_overrides(ck, r.overrides)
    signals = normalise_signals(ck, r.signals, SignalInputs(g, defaults, actions, overrides, intervals.scrape_s))
    # read before the check below: a malformed one must stop the run, not become 0
    group_waits = group_timings(ck, r.fuse)
    self_monitoring = normalise_self_monitoring(ck, r.fuse, intervals.scrape_s)
    if not r.metadata.name.strip():
        ck.err(("metadata", "name"), "metadata.name is empty", "name the cluster, e.g. multimodal-inference: it is the "
               "cluster label of the rules and the fusebox label Alertmanager routes to the fuse on")
    kube = normalise_kubernetes(r.kubernetes, r.metadata.name, ck.err, ck.base_dir)
    grafana = normalise_grafana(r.grafana, ck.err)
    otelcol = normalise_otelcol(r.otelcol, ck.duration, ck.err, intervals.scrape_s)
    adapters = normalise_adapters(r.fuse.adapters, {n: a.level for n, a in actions.items()}, ck.duration, ck.err)
    deploy.check_gateway_secret(kube.fuse, adapters, ck.err)
    budget = normalise_budget(r.budget, ck.err)
    connections = normalise_connections(r.connections, ck.duration, ck.err)
    inpath = normalise_inpath(r.inpath, {s.name: s for s in signals}, set(r.signals), ck.err)
    check_after_shedding(ck, signals, inpath)
    scaling = normalise_scaling(r.scaling, {s.name: s for s in signals}, set(r.signals), ck.duration, ck.err)
    slos = normalise_slos(r.slos, {s.name: s for s in signals}, set(r.signals), {n: a.level for n, a in actions.items()}, ck.duration, ck.err)
    if ck.problems:
        raise SpecError(ck.problems)
    d = r.defaults
    spec = Spec(
        file=pos.file, name=r.metadata.name, description=r.metadata.description,
        scrape_interval_s=intervals.scrape_s, evaluation_interval_s=intervals.evaluation_s,
        slow_evaluation_interval_s=max(intervals.slow_s, intervals.evaluation_s),
        runbook_base_url=g.runbook_base_url, dashboard_base_url=g.dashboard_base_url,
        selector=dict(g.selector), labels=dict(g.labels),
        absent_enabled=d.absent.enabled, absent_for_s=defaults.absent_for_s, absent_severity=d.absent.severity,
        receiver=r.fuse.receiver, human_receiver=dict(r.fuse.human_receiver), webhook_url=r.fuse.webhook_url, credentials_file=r.fuse.credentials_file,
        group_wait_s=group_waits["group_wait"], group_wait_critical_s=group_waits["group_wait_critical"],
        group_interval_s=group_waits["group_interval"], repeat_interval_s=group_waits["repeat_interval"],
        actions=actions, signals=tuple(signals), raw=data,
        allow_fleet_wide_alerts=r.fuse.allow_fleet_wide_alerts, adapters=adapters,
        kubernetes=kube, grafana=grafana, otelcol=otelcol, self_monitoring=self_monitoring,
        selectors={b: dict(m) for b, m in g.selectors.items()}, source=g.source, rule_engine=g.rule_engine,
        budget=budget, inpath=inpath, connections=connections, audit=audit(r.fuse), scaling=scaling,
        slos=slos,
    )
    # runbook queries: references to records replaced, record-shaped names checked (spec/diagnosis.py)
    queries = resolve_diagnosis(spec, ck.err)
    if ck.problems:
        raise SpecError(ck.problems)
    return dataclasses.replace(spec, signals=tuple(
        dataclasses.replace(s, runbook=dataclasses.replace(s.runbook, diagnosis=queries[s.name])) for s in spec.signals))
