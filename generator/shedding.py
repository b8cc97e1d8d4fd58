"""In-path shedding made visible: what the SGLang Model Gateway refused, shed and cut off, recorded
and drawn beside the fuse (docs/inpath.md, "What the fast path did").

Pure: returns data, no I/O. Generated only where the spec's ``inpath.shedders`` names a gateway
(``smg`` or ``sglang_router``); otherwise every function here returns nothing.

* :func:`records`: the record names by role (:func:`rules` writes them, the dashboard and the
  runbooks read them; defined in :mod:`fusebox.spec.inpath`, where the spec's check of the
  runbooks' queries reads them too);
* :func:`rules`: the ``fusebox-inpath`` group's rules (the generator runs it at
  ``global.slow_evaluation_interval``, as the dashboard records: no alert reads them);
* :func:`dashboard`: the "in-path shedding" board: the shedders' signals against their tiers and
  the fuse level (the slow path) above the gateways' refusals, overload sheds and open breakers
  (the fast path);
* :func:`runbook_diagnosis`: the (title, query) lines a signal's runbook adds.

The series, read from each version's own ``/metrics`` (``--prometheus-port``; docs/metrics.md
section 6): ``smg_http_rate_limit_total{result="allowed"|"rejected"}`` (smg 1.13 and
sglang-router 0.3.2), ``smg_worker_overload_shed_total{stage}`` (smg 1.13 only), and
``smg_worker_cb_state{worker}`` (both; 1 is open).
"""

from __future__ import annotations

from typing import Any

from fusebox import conventions as C
from fusebox.signal_kinds import records as signal_records
from fusebox.signal_kinds.base import DashboardDef, PanelDef, Query, sel, signal_legend, signal_panel, signal_sel, tier_text
from fusebox.spec import Spec
from fusebox.spec.inpath import GATEWAY_KINDS, Shedder
from fusebox.spec.inpath import shedding_records as records
from fusebox.spec.inpath import shedding_window_s as window_s
from fusebox.spec.units import format_duration, format_number

__all__ = ["GROUP", "DASHBOARD", "window_s", "refused_in_window", "gateways", "records", "rules", "dashboard", "runbook_diagnosis"]

GROUP = "fusebox-inpath"
DASHBOARD = "in-path-shedding"
_TOPK = 5  # series per signal panel, as the overview draws them


def gateways(spec: Spec) -> tuple[Shedder, ...]:
    """The spec's gateway shedders (``smg``, ``sglang_router``), in spec order."""
    return tuple(s for s in spec.inpath.shedders if s.kind in GATEWAY_KINDS)


def refused_in_window(spec: Spec) -> str:
    """Per gateway series, the requests it refused within :func:`window_s` (an instant vector,
    a count): the rise of ``smg_http_rate_limit_total{result="rejected"}`` since a window ago, or
    all of it for a series born within the window (or restarted: under its value a window ago).

    Not ``increase()``: the rejected series is born at a gateway's first refusal (neither smg 1.13
    nor sglang-router 0.3.2 writes it at 0 before; docs/metrics.md section 6), and ``rate()`` /
    ``increase()`` never count a series' first value, so a burst on a quiet gateway would read 0.
    The refusal record and the ``after_shedding`` gate both read this."""
    rejected = ",".join(f'{k}="{v}"' for k, v in C.GATEWAY_REJECTED.items())
    x = f"{C.GATEWAY_ADMISSIONS}{{{rejected}}}"
    return f"({x} - {x} offset {format_duration(window_s(spec))}) >= 0 or {x}"


def rules(spec: Spec) -> list[dict[str, Any]]:
    """The ``fusebox-inpath`` group's recording rules, records that read records last; ``[]``
    without a gateway shedder. Bare metric names, as the ``after_shedding`` gate reads them: any
    gateway this Prometheus scrapes counts. Series without a ``cluster`` label sum into one."""
    names = records(spec)
    if not names:
        return []
    w = format_duration(window_s(spec))
    out = [{"record": names["refused"],
            "expr": f"sum by (cluster) ({refused_in_window(spec)}) / {format_number(window_s(spec))}"}]
    if "overload_shed" in names:
        out.append({"record": names["overload_shed"], "expr": f"sum by (cluster, stage) (rate({C.GATEWAY_OVERLOAD_SHED}[{w}]))"})
    out += [
        {"record": names["breaker_open"],
         "expr": f"max by (cluster, worker) ({C.GATEWAY_BREAKER_STATE} == bool {C.GATEWAY_BREAKER_OPEN})"},
        {"record": names["breakers_open"], "expr": f"sum by (cluster) ({names['breaker_open']})"},
    ]
    return out


def _signals(spec: Spec) -> list[Any]:
    """The signals the gateways shed on, in spec order."""
    read = {s.signal for s in gateways(spec)}
    return [s for s in spec.signals if s.name in read]


def dashboard(spec: Spec) -> DashboardDef | None:
    """The "in-path shedding" board; None without a gateway shedder. Its panels link to the
    runbooks of the signals the gateways shed on."""
    names = records(spec)
    if not names:
        return None
    sigs = _signals(spec)
    alerts = tuple(s.alert for s in sigs)
    scope = ", ".join(C.SCOPE_LABELS)
    panels = [signal_panel(sig, f"{sig.alert}: {sig.name.replace('_', ' ')}",
                           f"{sig.description} The gateways shed from {next(g.shed_at_text for g in gateways(spec) if g.signal == sig.name)}; "
                           f"lines at {tier_text(sig)}. Top {_TOPK} series.",
                           f"topk({_TOPK}, {signal_sel(sig, signal_records(sig)['value'])})", signal_legend(sig))
              for sig in sigs]
    panels.append(PanelDef(
        "Fuse level per scope",
        f"The fuse service's level ({C.FUSE_LEVEL_METRIC}, 0 closed) over time: the slow path, beside what the gateways did.",
        (Query(f"max by ({scope}) ({sel(C.FUSE_LEVEL_METRIC, 'host')})", "{{cluster}} {{host_name}} {{hw_id}} {{engine}}"),),
        "none", alerts))
    w = format_duration(window_s(spec))
    cluster = 'cluster=~"$cluster"'
    panels.append(PanelDef(
        "Gateway refusals per second",
        f"Requests the in-path gateways refused with 429 (the concurrency bound, the rate limit, a full queue), "
        f"rate over {w} of {C.GATEWAY_ADMISSIONS}{{result=\"rejected\"}}; above 0 is what a tier with after_shedding waits for.",
        (Query(f"{names['refused']}{{{cluster}}}", "refused {{cluster}}"),), "reqps", alerts))
    if "overload_shed" in names:
        panels.append(PanelDef(
            "Overload sheds per second by stage",
            f"Requests smg shed because every worker of the model was overloaded, rate over {w} of {C.GATEWAY_OVERLOAD_SHED}, "
            "by stage (selection, dispatch, pd_admission). Needs smg's worker overload shedding on (--worker-overload-shed).",
            (Query(f"{names['overload_shed']}{{{cluster}}}", "{{cluster}} {{stage}}"),), "reqps", alerts))
    panels.append(PanelDef(
        "Circuit breakers open by worker",
        f"1 while the gateway's breaker for a worker is open ({C.GATEWAY_BREAKER_STATE} == {C.GATEWAY_BREAKER_OPEN}): "
        "it sends that worker nothing until the breaker's timeout passes; and the workers open per cluster.",
        (Query(f"{names['breaker_open']}{{{cluster}}}", "{{cluster}} {{worker}}"),
         Query(f"{names['breakers_open']}{{{cluster}}}", "open in {{cluster}}")),
        "none", alerts, width=24 if "overload_shed" in names else 12))
    return DashboardDef(DASHBOARD, f"fusebox / {spec.name} / in-path shedding",
                        "Both speeds on one board: the signals the gateways shed on and the fuse level (slow path), "
                        "the gateways' refusals, overload sheds and open breakers (fast path).", tuple(panels))


def runbook_diagnosis(spec: Spec, sig: Any) -> list[tuple[str, str]]:
    """The runbook lines of signal ``sig`` when a gateway sheds on it or a tier of it waits for
    shedding (``after_shedding``): the refusal, overload and breaker records; ``[]`` otherwise."""
    names = records(spec)
    if not names or not (sig.name in {s.signal for s in gateways(spec)} or any(t.after_shedding for t in sig.tiers)):
        return []
    board = f"dashboard fusebox / {spec.name} / in-path shedding"
    out = [(f"Requests the in-path gateways refused per second ({board})", names["refused"])]
    if "overload_shed" in names:
        out.append((f"Requests smg shed on overloaded workers per second, by stage ({board})", names["overload_shed"]))
    out.append((f"Workers whose circuit breaker is open, per cluster ({board})", names["breakers_open"]))
    return out
