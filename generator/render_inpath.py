"""The in-path shedders' settings from the spec's ``inpath:`` section (docs/inpath.md).

Pure renderer: ``outputs(spec, header) -> {"inpath/<name>.flags": text}``, one file per shedder;
no I/O. Each file holds the launch flags its shedder reads, one ``--flag value`` per line, each
under a ``#`` comment saying how its number follows from the spec (which key). Use::

    python -m smg.launch_router --worker-urls ... $(grep -v '^#' inpath/gateway.flags)
    vllm serve MODEL $(grep -v '^#' inpath/engine.flags)

Flag names, read from each version's own ``--help``: ``python -m smg.launch_router --help``
(smg 1.13.0) and ``python -m sglang_router.launch_router --help`` (sglang-router 0.3.2) both take
``--max-concurrent-requests``, ``--queue-size``, ``--queue-timeout-secs``,
``--rate-limit-tokens-per-second``, ``--request-timeout-secs`` and ``--cb-*`` (integers); vLLM's
``--max-num-queued-reqs`` / ``--max-num-queued-tokens`` are ``SchedulerConfig.max_num_queued_reqs``
/ ``max_num_queued_tokens`` (vllm/config/scheduler.py; tests/v1/engine/test_admission_control.py:
the request over either bound is refused with HTTP 503).

:func:`inpath_warnings` is the consistency check (``fusebox check`` fails on it, ``fusebox
generate`` prints it): a shedder that lets its signal reach the fuse's threshold before it sheds,
and a gateway whose breaker window or request timeout is shorter than ``inpath.max_generation``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fusebox.conventions import SMG_VETO_READS
from fusebox.spec import Spec
from fusebox.spec.inpath import GATEWAY_KINDS, Shedder
from fusebox.spec.overload import OVERLOAD_QUANTITIES, SMG_DEFAULT_KEY, SMG_OVERLOAD_DEFAULTS, Overload, Veto
from fusebox.spec.units import format_duration, format_number, humanize

__all__ = ["Setting", "settings", "overload_lines", "render_shedder", "outputs", "inpath_warnings", "OUT_DIR", "FLAGS",
           "OVERLOAD_FLAGS", "OVERLOAD_OFF", "OVERLOAD_SHED", "LAUNCH"]

OUT_DIR = "inpath"

# `set:` key -> the flag it sets (the same names in smg 1.13.0 and sglang-router 0.3.2).
FLAGS = {
    "max_concurrent_requests": "--max-concurrent-requests",
    "queue_size": "--queue-size",
    "queue_timeout": "--queue-timeout-secs",
    "rate_limit": "--rate-limit-tokens-per-second",
    "request_timeout": "--request-timeout-secs",
    "cb_failure_threshold": "--cb-failure-threshold",
    "cb_success_threshold": "--cb-success-threshold",
    "cb_timeout": "--cb-timeout-duration-secs",
    "cb_window": "--cb-window-duration-secs",
    "max_num_queued_reqs": "--max-num-queued-reqs",
    "max_num_queued_tokens": "--max-num-queued-tokens",
}
# smg 1.13's worker overload veto (python -m smg.launch_router --help): a threshold flag per quantity
# (each "AT OR ABOVE which a worker is considered overloaded and left out of routing"), the switch
# that turns both off, and the one that refuses (503) instead of falling back to the least-loaded worker.
OVERLOAD_FLAGS = {"token_usage": "--worker-overload-token-usage", "waiting_requests": "--worker-overload-waiting-requests"}
OVERLOAD_OFF, OVERLOAD_SHED = "--disable-worker-overload-protection", "--worker-overload-shed"
# What reads the file, per kind.
LAUNCH = {
    "smg": "smg 1.13 (python -m smg.launch_router)",
    "sglang_router": "sglang-router 0.3.2 (python -m sglang_router.launch_router)",
    "vllm": "a vLLM engine (vllm serve), one per engine",
}


@dataclass(frozen=True)
class Setting:
    """One flag: its ``set:`` key, the flag, its value (an integer: a count, requests per second,
    or seconds) and how the value follows from the spec."""

    key: str
    flag: str
    value: int
    why: str


def _h(s: Shedder, x: float) -> str:
    return humanize(x, s.unit)


def _secs(x: float) -> int:
    return max(1, math.ceil(x))


def settings(spec: Spec, s: Shedder) -> list[Setting]:
    """The settings of shedder ``s``, in file order: derived from the spec unless ``set:`` gives one.

    Gateways (smg, sglang_router): ``max_concurrent_requests`` engines x per-engine requests;
    ``queue_size`` 0 (refuse at once: a queue at the gateway holds requests the signal does not
    see); ``queue_timeout`` the fuse tier's ``for`` (a request waiting longer would wait past the
    fuse); ``rate_limit`` max_concurrent_requests / ``inpath.mean_generation`` (Little's law),
    rounded up, when that is set; ``request_timeout`` and ``cb_window`` ``inpath.max_generation``
    when that is set; the other breaker settings only from ``set:``. vLLM:
    ``max_num_queued_reqs`` the per-engine requests; ``max_num_queued_tokens`` only from ``set:``."""
    ip = spec.inpath
    n = s.per_engine
    level = (f"{n} = floor(({s.shed_at_text} - idle {_h(s, s.idle)}) / per_request {_h(s, s.per_request)}), "
             f"{s.shed_at_text} being {s.shed_at_key}")
    derived: dict[str, tuple[int, str]] = {}
    if s.kind in GATEWAY_KINDS:
        derived["max_concurrent_requests"] = (s.engines * n, f"engines {s.engines} x requests per engine {level}")
        derived["queue_size"] = (0, "0: refuse at once (429) instead of queueing where the signal cannot see it")
        if s.fuse_for_s is not None:
            derived["queue_timeout"] = (_secs(s.fuse_for_s), f"the fuse tier's for ({s.fuse_key.rsplit('.', 1)[0] if s.fuse_key else ''}.for, "
                                        f"{format_duration(s.fuse_for_s)}): no request waits past the fuse")
        mcr = int(s.settings.get("max_concurrent_requests", s.engines * n))
        if ip.mean_generation_s:
            rate = max(1, math.ceil(round(mcr / ip.mean_generation_s, 9)))
            derived["rate_limit"] = (rate, f"ceil(max_concurrent_requests {mcr} / inpath.mean_generation "
                                     f"{format_duration(ip.mean_generation_s)}) requests per second (Little's law)")
        if ip.max_generation_s:
            mg = format_duration(ip.max_generation_s)
            derived["request_timeout"] = (_secs(ip.max_generation_s), f"inpath.max_generation ({mg}): the longest request runs to its end")
            derived["cb_window"] = (_secs(ip.max_generation_s), f"inpath.max_generation ({mg}): the breaker's window holds the longest request")
    else:
        derived["max_num_queued_reqs"] = (n, f"requests in flight (waiting or running) on the engine: {level}")
    out = []
    for key in FLAGS:
        if key in s.settings:
            out.append(Setting(key, FLAGS[key], int(s.settings[key]), f"inpath.shedders.{s.name}.set.{key}"))
        elif key in derived:
            out.append(Setting(key, FLAGS[key], *derived[key]))
    return out


def _veto_why(ov: Overload, v: Veto) -> str:
    """Where veto threshold ``v`` comes from and what it was checked against, for its comment."""
    quantity, text, key, signals = v.quantity, v.text, v.key, v.signals
    what = OVERLOAD_QUANTITIES[quantity][1]
    if key == SMG_DEFAULT_KEY:
        origin = f"{text}, smg 1.13's own default, stated ({ov.key}.{quantity} not given, and no safe level of {what} to derive it from)"
    elif key.startswith(ov.key):
        origin = f"{text} ({key})"
    else:
        origin = f"{text}, the safe level of the spec's {what} ({key})"
    if signals:
        checked = f"checked against signal {', '.join(repr(n) for n in signals)}: at or above its safe level, under its fuse"
    else:
        reads = SMG_VETO_READS[quantity]
        engines = ", ".join(next(n for n in reads if n.startswith(p)) for p in ("vllm:", "sglang:"))
        checked = f"no signal of the spec reads {what} ({engines}) to check it against"
    return f"{origin}; a worker at or above it leaves routing while another worker is under; {checked}"


def overload_lines(s: Shedder) -> list[str]:
    """The flags file's lines for smg's worker overload veto (kind smg; ``[]`` for the others): each
    threshold's flag under a comment saying where its number comes from, or the switch that turns
    the veto off; ``--worker-overload-shed`` where the spec asks for it (a comment where not)."""
    ov = s.overload
    if ov is None:
        return []
    if not ov.protection:
        defaults = " or ".join(humanize(SMG_OVERLOAD_DEFAULTS[q], OVERLOAD_QUANTITIES[q][0]) + " " + OVERLOAD_QUANTITIES[q][1]
                               for q in OVERLOAD_FLAGS)
        return [f"# {OVERLOAD_OFF}: {ov.key}.protection false: no worker leaves routing for its KV-cache token usage or "
                f"waiting queue (smg 1.13 vetoes at {defaults} unless told)", OVERLOAD_OFF]
    out = []
    for v in ov.vetoes:
        value = format_number(v.at) if v.quantity == "token_usage" else str(int(v.at))
        out += [f"# {OVERLOAD_FLAGS[v.quantity]}: {_veto_why(ov, v)}",
                f"{OVERLOAD_FLAGS[v.quantity]} {value}"]
    if ov.shed:
        out += [f"# {OVERLOAD_SHED}: {ov.key}.shed true: refuse with 503 (worker_overload_protection_shed) when every "
                "worker the request could use is over a threshold", OVERLOAD_SHED]
    else:
        out.append(f"# {OVERLOAD_SHED} not given ({ov.key}.shed false, smg's default): when every worker is over a "
                   "threshold, the request goes to the least-loaded one")
    return out


def render_shedder(spec: Spec, s: Shedder) -> str:
    """The flags file of ``s`` (without the generated-file header)."""
    lines = [f"# inpath.shedders.{s.name}: launch flags for {LAUNCH[s.kind]}; it sheds on signal {s.signal!r}",
             f"# at {s.shed_at_text} ({s.shed_at_key})"
             + (f", before the fuse trips at {_h(s, s.fuse_at)} ({s.fuse_key})." if s.fuse_at is not None else "."),
             f"# Use: $(grep -v '^#' {OUT_DIR}/{s.name}.flags) on its command line (docs/inpath.md)."]
    for st in settings(spec, s):
        lines += [f"# {st.flag}: {st.why}", f"{st.flag} {st.value}"]
    lines += overload_lines(s)
    return "\n".join(lines) + "\n"


def outputs(spec: Spec, header: str) -> dict[str, str]:
    """``{inpath/<name>.flags: text}`` for every shedder of ``inpath.shedders``; ``{}`` without any."""
    return {f"{OUT_DIR}/{s.name}.flags": f"# {header}\n{render_shedder(spec, s)}" for s in spec.inpath.shedders}


def _reached(s: Shedder, value: dict[str, int]) -> tuple[float, str]:
    """The signal's level when the shedder starts to refuse, and how it is worked out."""
    if s.kind in GATEWAY_KINDS:
        mcr = value["max_concurrent_requests"]
        per = math.ceil(mcr / s.engines)
        how = f"idle {_h(s, s.idle)} + {per} requests per engine ({mcr} over {s.engines} engines) x {_h(s, s.per_request)}"
    else:
        per = value["max_num_queued_reqs"]
        how = f"idle {_h(s, s.idle)} + {per} requests x {_h(s, s.per_request)}"
    return s.idle + per * s.per_request, how


def inpath_warnings(spec: Spec) -> list[str]:
    """The fast path against the slow path, one line each naming both numbers:

    * a shedder whose shedding level (``shed_at``), or the level its request bound lets the signal
      reach (idle + per-engine requests x per_request), is at or above the threshold of the
      signal's first fuse tier: it would shed only after the fuse trips;
    * a gateway whose ``cb_window`` (``--cb-window-duration-secs``) or ``request_timeout`` is
      shorter than ``inpath.max_generation``: healthy engines serving the longest generations
      count as failing (the request times out, the breaker opens)."""
    out = []
    for s in spec.inpath.shedders:
        value = {st.key: st.value for st in settings(spec, s)}
        where = f"inpath.shedders.{s.name} ({s.kind})"
        if s.fuse_at is not None:
            reached, how = _reached(s, value)
            if s.shed_at >= s.fuse_at:
                out.append(f"{where} sheds at {s.shed_at_text} ({s.shed_at_key}), at or above the fuse's "
                           f"{_h(s, s.fuse_at)} ({s.fuse_key}): the fast path acts after the fuse -- shed below the fuse "
                           "tier's threshold (the warning tier's, by default)")
            elif round(reached, 9) >= s.fuse_at:
                key = "max_concurrent_requests" if s.kind in GATEWAY_KINDS else "max_num_queued_reqs"
                out.append(f"{where} admits up to {value[key]} requests ({key}), which lets signal {s.signal!r} reach "
                           f"{_h(s, reached)} ({how}), at or above the fuse's {_h(s, s.fuse_at)} ({s.fuse_key}): the fast "
                           f"path acts after the fuse -- lower {key}, or drop the override")
        mg = spec.inpath.max_generation_s
        if s.kind in GATEWAY_KINDS and mg:
            for key, what in (("cb_window", "the breaker's failure window: engines serving the longest generations "
                                            "would count as failing"),
                              ("request_timeout", "the request timeout: the longest generations would be cut off")):
                v: int | None = value.get(key)
                if v is not None and v < mg:
                    out.append(f"{where} {FLAGS[key]} {v} s is shorter than inpath.max_generation "
                               f"{format_duration(mg)} ({format_number(mg)} s), {what} -- raise {key} to at least {format_number(mg)} s, or drop the override")
    return out
