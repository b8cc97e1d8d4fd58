"""One Markdown runbook per alert, linked from each alert's runbook_url."""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

import jinja2

from fusebox import conventions as C
from fusebox.signal_kinds import kind_of, lost_gpu_fuses, records
from fusebox.spec import Spec
from fusebox.spec.units import format_duration, format_number, humanize

from . import render_scaling, render_slo, shedding
from .render_rules import Rules
from .selfmon import runbook_facts

_ENV = jinja2.Environment(loader=jinja2.PackageLoader("fusebox.generator", "templates"),
                          keep_trailing_newline=True, trim_blocks=False, autoescape=False)


def diagnosis(spec: Spec, sig: Any) -> list[tuple[str, str]]:
    """A signal's runbook queries, ``(title, PromQL)``: its kind's standard ones (built from the
    records its rules write: :meth:`fusebox.signal_kinds.Kind.diagnosis`), the spec's
    ``runbook.diagnosis`` (references already replaced by record names: fusebox/spec/diagnosis.py),
    then the in-path gateways' records where they shed on it; a query listed twice is kept once."""
    out: dict[str, str] = {}
    for title, query in (*kind_of(sig).diagnosis(sig, spec), *sig.runbook.diagnosis, *shedding.runbook_diagnosis(spec, sig)):
        out.setdefault(query, title)
    return [(title, query) for query, title in out.items()]


def render_runbooks(spec: Spec, rules: Rules, header: str) -> dict[str, str]:
    """{relative path: markdown} for every alert name: the signals', the absent, GPU-down and self-monitoring alerts'."""
    out: dict[str, str] = {}
    tmpl = _ENV.get_template("runbook.md.j2")
    for sig in spec.signals:
        value = records(sig)["value"]
        op = ">=" if sig.direction == "above" else "<="
        tiers = [{
            "name": t.name, "threshold": humanize(t.threshold, sig.unit),
            "expr": f"{value} {op} {format_number(t.threshold)}",
            "for": format_duration(t.for_s), "kff": format_duration(t.keep_firing_for_s),
            "severity": t.severity,
            "fuse": f"level {t.fuse_level}: {t.fuse}" if t.fuse else "none",
            "sop": sig.runbook.sop.get(t.name, ()),
        } for t in sig.tiers]
        out[f"runbooks/{sig.alert}.md"] = tmpl.render(
            header=header, alert=sig.alert, description=sig.description, tiers=tiers,
            symptom=sig.runbook.symptom, impact=sig.runbook.impact,
            diagnosis=diagnosis(spec, sig),
            signal=sig.name, spec_file=PurePath(spec.file).name, source=sig.source.backend,
            measured=kind_of(sig).measured(sig), measured_label=C.ALIGNMENT_SOURCE_LABEL,
        )
    from .render_rules import GPU_DOWN_FOR_S, gpu_down_enabled

    if gpu_down_enabled(spec):
        out[f"runbooks/{C.GPU_DOWN_ALERT}.md"] = _ENV.get_template("runbook_gpu_down.md.j2").render(
            header=header, alert=C.GPU_DOWN_ALERT, down_for=format_duration(GPU_DOWN_FOR_S),
            fuses=", ".join(f"level {spec.actions[a].level} {a}" for a in lost_gpu_fuses(spec)))
    if spec.absent_enabled:
        out[f"runbooks/{C.ABSENT_ALERT}.md"] = _ENV.get_template("runbook_absent.md.j2").render(
            header=header, alert=C.ABSENT_ALERT, absent_for=format_duration(spec.absent_for_s),
            metrics=sorted(rules.raw_metrics.items()),
        )
    for alert, facts in (*runbook_facts(spec).items(), *render_scaling.runbook_facts(spec).items(), *render_slo.runbook_facts(spec).items()):
        out[f"runbooks/{alert}.md"] = _ENV.get_template("runbook_self.md.j2").render(header=header, alert=alert, **facts)
    return out
