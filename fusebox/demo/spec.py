"""The demo's spec variant: the user's spec with intervals tuned for fast detection.

Only the spec's own fields change (global intervals, each tier's ``for`` and
``keep_firing_for``, the fuse receiver's ``group_wait``/``group_interval``, the webhook URL and
the token file), so the generated rules, Alertmanager config and Collector config are exactly
what ``fusebox generate`` makes of such a spec. Thresholds, windows and buckets are untouched.
The demo's series come from fusebox's collectors on loopback, so every signal that lists a
``fusebox`` source reads it, and no label matcher of ``global.selector``/``selectors`` (meant
for the user's cluster) applies.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from fusebox import promsim

__all__ = ["Timing", "FAST", "demo_spec_text", "floor_s"]


@dataclass(frozen=True)
class Timing:
    """Durations written into the demo spec (spec syntax, e.g. ``"1s"``).

    ``warning_for`` / ``critical_for`` cap each tier's ``for`` (a tier already shorter keeps
    its own, e.g. the PCIe 3s and the OOM-imminent 0s tiers).
    """

    scrape_interval: str = "1s"
    evaluation_interval: str = "1s"
    warning_for: str = "20s"
    critical_for: str = "10s"
    keep_firing_for: str = "10s"
    group_wait_critical: str = "1s"
    group_wait: str = "5s"
    group_interval: str = "5s"


# Fast detection for the demo: floor = 1 s scrape + 1 s evaluation + 10 s for + 1 s group_wait.
# Warnings keep a longer `for` than criticals so that, as in the shipped spec, a warning
# fires before its critical on a signal that climbs through both.
FAST = Timing()


def _seconds(text) -> float:
    from fusebox.spec.units import parse_duration

    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    return parse_duration(str(text))


def demo_spec_text(base_text: str, *, webhook_url: str, credentials_file: str,
                   timing: Timing | None = FAST, source: str = "fusebox.yaml",
                   adapters: dict | None = None) -> str:
    """The demo spec (YAML text) derived from ``base_text`` (the user's spec).

    Args:
        base_text: the spec's YAML text (``apiVersion: fusebox/v1``).
        webhook_url: the fuse service's Alertmanager webhook on its demo port.
        credentials_file: absolute path of the bearer-token file Alertmanager reads.
        timing: durations to write; None keeps the spec's own (the "default intervals" run).
        source: named in the header comment.
        adapters: ``fuse.adapters`` to set (the demo's SGLang Model Gateway); None keeps the spec's.

    Raises:
        ValueError: ``base_text`` is not a mapping with ``global``/``fuse``/``signals``.
    """
    raw = yaml.safe_load(base_text)
    if not isinstance(raw, dict) or not isinstance(raw.get("signals"), dict):
        raise ValueError(f"{source}: not a fusebox spec (no 'signals' mapping)")
    g = raw.setdefault("global", {})
    g["source"] = "fusebox"
    # The demo's engines (Prometheus, vmalert) read the engine-neutral rules; Thanos' group key
    # would make both refuse the file.
    g["rule_engine"] = "prometheus"
    g["selector"] = {}
    g.pop("selectors", None)
    for sig in raw["signals"].values():
        if isinstance(sig, dict) and "fusebox" in (sig.get("sources") or {}):
            sig.pop("source", None)
    for o in raw.get("overrides") or []:
        if isinstance(o, dict):
            o.pop("source", None)
    fuse = raw.setdefault("fuse", {})
    fuse["webhook_url"] = webhook_url
    fuse["credentials_file"] = credentials_file
    if adapters is not None:
        fuse["adapters"] = adapters
    if timing is not None:
        g["scrape_interval"] = timing.scrape_interval
        g["evaluation_interval"] = timing.evaluation_interval
        # the watcher shows each signal's value record (a quantile's in its panels group): at the
        # demo's pace, not every 30 s
        g["slow_evaluation_interval"] = timing.evaluation_interval
        d = raw.setdefault("defaults", {})
        default_for = _seconds(d.get("for", "1m"))
        d["keep_firing_for"] = timing.keep_firing_for
        fuse["group_wait_critical"] = timing.group_wait_critical
        fuse["group_wait"] = timing.group_wait
        fuse["group_interval"] = timing.group_interval
        for sig in raw["signals"].values():
            for name, tier in (sig.get("tiers") or {}).items():
                if not isinstance(tier, dict):
                    continue
                cap = timing.warning_for if name == "warning" else timing.critical_for
                own = _seconds(tier.get("for", default_for))
                if own > _seconds(cap):
                    tier["for"] = cap
                if "keep_firing_for" in tier:
                    tier["keep_firing_for"] = timing.keep_firing_for
        for o in raw.get("overrides") or []:
            if isinstance(o, dict) and "for" in o:
                cap = timing.warning_for if o.get("tier") == "warning" else timing.critical_for
                if _seconds(o["for"]) > _seconds(cap):
                    o["for"] = cap
    head = (f"# fusebox demo spec: {source} with the demo's ports"
            + (" and intervals tuned for fast detection" if timing is not None else "") + ".\n"
            "# Written by `fusebox demo`; edit the source spec, not this file.\n")
    return head + yaml.safe_dump(raw, sort_keys=False, width=120)


def floor_s(spec, signal_name: str) -> float:
    """Breach-to-fuse floor the configuration implies for a signal's critical tier, seconds:
    scrape interval + evaluation interval + the tier's ``for`` (rounded up to whole evaluations, as
    the alert waits: :func:`fusebox.promsim.for_elapsed`) + the critical ``group_wait``."""
    sig = spec.signal(signal_name)
    crit = [t for t in sig.tiers if t.fuse]
    tier = crit[-1] if crit else sig.tiers[-1]
    return (spec.scrape_interval_s + spec.evaluation_interval_s + promsim.for_elapsed(tier.for_s, spec.evaluation_interval_s)
            + spec.group_wait_critical_s)
