"""What people read: the status page (``GET /``) and the readable times of ``GET /state``.

The page is written for an on-call engineer woken at 3 am: per scope and level, the state, since
when (UTC ISO-8601 and "for 12 min"), the alerts holding it with links to their runbook, to
Alertmanager and to the Grafana dashboard, and the adapter calls made for it with their outcome
(from the audit log and the outbox). A service in dry-run says so in a banner at the top.

Links are built from the spec (``global.runbook_base_url``, ``global.dashboard_base_url``) and from
Alertmanager's own address: ``--alertmanager-url`` when given, else the ``externalURL`` of the last
notification (Alertmanager sends it in every one). Only ``http`` and ``https`` URLs become links.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from fusebox import conventions as C
from fusebox.signal_kinds.base import VARIABLES

from ..logsafe import escape_control
from ..rows import AuditRow, FuseState, LevelStateView, LevelView, ScopeStateView, ScopeView, StateView
from ..rules import scope_key

__all__ = ["StatusLinks", "render_status", "status_headers", "state_view", "iso", "for_text", "web_url", "STATUS_ROWS",
           "STATUS_DECISIONS", "STATUS_CALLS_PER_ROW", "STATUS_CALL_ROWS", "CALL_KINDS"]

# The status page lists at most this many scope rows (scope x level) and audit rows, and clips the
# text of each cell, so that its size stays bounded (under 1 MB) whatever the alerts carried.
STATUS_ROWS = 100
STATUS_DECISIONS = 30
STATUS_ALERTS_PER_ROW = 5
STATUS_CALLS_PER_ROW = 5
STATUS_TRIPPED_IN_SUMMARY = 10
STATUS_CELL_CHARS = 200
# Audit kinds that record an adapter call: applied, given up (failed), or not made (dry-run).
CALL_KINDS = ("applied", "failed", "dry_run")
# How far back the page reads the audit log for the calls of each scope (newest first).
STATUS_CALL_ROWS = 500

# Grafana variable of each scope label (the dashboards' template variables), e.g. hw_id -> gpu.
_GRAFANA_VAR = {label: var for var, (label, _title) in VARIABLES.items()}


def iso(t: float | None) -> str | None:
    """Unix seconds as UTC ISO-8601 to the second (``2026-12-01T03:04:05Z``); None stays None."""
    if t is None or not math.isfinite(t):
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def for_text(seconds: float) -> str:
    """A duration as people say it: ``45 s``, ``12 min``, ``3 h 5 min``, ``2 d 4 h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 2 * 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(s // 3600, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def web_url(text: str | None) -> str:
    """``text`` when it is an absolute http(s) URL with a host (trailing ``/`` removed), else ``""``:
    nothing else (``javascript:``, a relative path) ever becomes a link."""
    if not text:
        return ""
    try:
        u = urlsplit(text.strip())
    except ValueError:
        return ""
    if u.scheme.lower() not in ("http", "https") or not u.netloc or any(c.isspace() for c in text.strip()):
        return ""
    return text.strip().rstrip("/")


@dataclass(frozen=True)
class StatusLinks:
    """Where the page links to.

    Args:
        runbook: alert name -> its runbook URL (the spec's :meth:`Spec.runbook_url`); None: no link.
        dashboard: the overview dashboard's URL (``<grafana>/d/<uid>``); empty: no link.
        alertmanager: Alertmanager's URL as the on-call reaches it; empty: the ``externalURL`` of the
            last notification is used.
    """

    runbook: Callable[[str], str] | None = None
    dashboard: str = ""
    alertmanager: str = ""

    @classmethod
    def from_spec(cls, spec, alertmanager: str = "") -> StatusLinks:
        """From a loaded spec: its runbook URLs and, when ``global.dashboard_base_url`` is set, the
        overview dashboard (the UID the generator gives it)."""
        base = web_url(spec.dashboard_base_url)
        dash = f"{base}/d/{C.dashboard_uid(spec.name, C.OVERVIEW_DASHBOARD)}" if base else ""
        return cls(runbook=spec.runbook_url, dashboard=dash, alertmanager=web_url(alertmanager))

    def runbook_href(self, alert: str) -> str:
        return web_url(self.runbook(quote(alert, safe=""))) if self.runbook else ""

    def alertmanager_href(self, base: str, alert: str, labels: dict) -> str:
        """Alertmanager's alert list filtered to this alert in this scope (silenced and inhibited
        ones shown too: they still hold the fuse)."""
        if not base:
            return ""
        key = scope_key(labels)
        matchers = f'{{alertname="{_matcher_value(alert)}"' + ("," + key[1:] if labels else "}")
        return f"{base}/#/alerts?silenced=true&inhibited=true&filter={quote(matchers, safe='')}"

    def dashboard_href(self, labels: dict, since: float | None) -> str:
        """The overview dashboard with the scope's variables set, from 15 min before ``since``."""
        if not self.dashboard:
            return ""
        q = [(f"var-{_GRAFANA_VAR[k]}", v) for k, v in labels.items() if k in _GRAFANA_VAR]
        if since is not None and math.isfinite(since):
            q += [("from", str(int((since - 900) * 1000))), ("to", "now")]
        return f"{self.dashboard}?{urlencode(q)}" if q else self.dashboard


def _matcher_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _clip(text, n: int = STATUS_CELL_CHARS) -> str:
    # control and format characters (bidi overrides, zero-width) shown as escapes, as in the log
    text = escape_control("" if text is None else str(text))
    return text if len(text) <= n else text[: n - 1] + "…"


def _when(t: float | None, now: float, prefix: str = "for") -> dict:
    """``{"iso", "ago"}`` of a time: ``ago`` is "for 12 min" (or "in 4 min" for a future time)."""
    if t is None:
        return {"iso": "", "ago": ""}
    d = now - t
    return {"iso": iso(t) or "", "ago": f"{prefix} {for_text(d)}" if d >= 0 else f"in {for_text(-d)}"}


def state_view(state: FuseState, now: float) -> StateView:
    """``state`` (:meth:`FuseService.state`) with readable times beside the Unix seconds, for
    ``GET /state``: ``now``/``now_iso``; per scope level ``tripped_at_iso``, ``tripped_for_s``
    (seconds tripped, None when not), ``release_at_iso``, override ``until_iso``; truncated
    ``last.at_iso``. The numbers stay (readers of /state use them). A new dict: ``state`` is not
    changed."""
    scopes: list[ScopeStateView] = []
    for sc in state["scopes"]:
        levels: dict[str, LevelStateView] = {}
        for lvl, st in sc["levels"].items():
            ov = st.get("override")
            levels[lvl] = {**st, "tripped_at_iso": iso(st.get("tripped_at")),
                           "tripped_for_s": (max(0.0, now - at)
                                             if st.get("tripped") and (at := st.get("tripped_at")) is not None else None),
                           "release_at_iso": iso(st.get("release_at")),
                           "override": {**ov, "until_iso": iso(ov.get("until"))} if ov else ov}
        scopes.append({**sc, "levels": levels})
    out: StateView = {**state, "now": now, "now_iso": iso(now), "scopes": scopes}
    cut = state.get("truncated")
    if cut and (last := cut.get("last")):
        out["truncated"] = {**cut, "last": {**last, "at_iso": iso(last.get("at"))}}
    return out


def _template_text() -> str:
    return resources.files("fusebox.fuse.http").joinpath("static/status.html").read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _template():
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(_template_text())


@lru_cache(maxsize=1)
def status_headers() -> dict[str, str]:
    """The status page's security headers: a Content-Security-Policy that allows nothing but the
    page's own ``<style>`` block (by its SHA-256; the page has no script, image, form or frame), no
    framing (``frame-ancestors 'none'`` and ``X-Frame-Options: DENY``), no MIME sniffing, no
    Referer sent with its links (they carry scope labels to Grafana and Alertmanager), and no
    caching of a page that a token unlocked.

    Raises:
        RuntimeError: the template's ``<style>`` block is not exactly one static block (its hash
            would not match what the browser sees).
    """
    blocks = re.findall(r"<style>(.*?)</style>", _template_text(), flags=re.S)
    if len(blocks) != 1 or "{{" in blocks[0] or "{%" in blocks[0] or "{#" in blocks[0]:
        raise RuntimeError("static/status.html must hold exactly one <style> block without template syntax")
    digest = base64.b64encode(hashlib.sha256(blocks[0].encode("utf-8")).digest()).decode("ascii")
    csp = (f"default-src 'none'; style-src 'sha256-{digest}'; base-uri 'none'; form-action 'none'; "
           "frame-ancestors 'none'")
    return {"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}


def _call(row: AuditRow) -> dict:
    """One adapter call of the audit log, as the page shows it."""
    kind = row["kind"]
    outcome = {"applied": "applied", "failed": "FAILED", "dry_run": "not applied (dry-run)"}.get(kind, kind)
    return {"at": iso(row["at"]) or "", "adapter": _clip(row.get("source"), 60), "outcome": outcome,
            "kind": kind, "state": _clip((row.get("reason") or "").split(" ", 1)[0], 20),
            "reason": _clip(row.get("reason")) if kind == "failed" else ""}


def _applied(st: LevelView) -> dict | None:
    """What a tripped level's ``applied`` fields (:meth:`FuseService.state`) say, for the page:
    ``{"css": yes|no, "text", "why": [...]}``; None when the state has none."""
    if "applied" not in st:
        return None
    if st["applied"]:
        text = "APPLIED by " + ", ".join(st.get("applied_by") or [])
    else:
        text = "NOT APPLIED" + (" (pending: " + ", ".join(st["pending"]) + ")" if st.get("pending") else "")
    why = [f"{n['adapter'] or 'no adapter'}: {n['why']}" for n in (st.get("not_applied") or [])[:STATUS_CALLS_PER_ROW]]
    return {"css": "yes" if st["applied"] else "no", "text": _clip(text), "why": [_clip(w) for w in why]}


def _per_row(items: Sequence, key: Callable[[Any], tuple[str, int]]) -> dict[tuple[str, int], list]:
    """``items`` grouped by their (scope key, level), in their order."""
    out: dict[tuple[str, int], list] = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


def _alerts(sc: ScopeView, st: LevelView, links: StatusLinks, am: str) -> list[dict]:
    """The first ``STATUS_ALERTS_PER_ROW`` alerts holding a level, with their links."""
    out = []
    for a in st["alerts"][:STATUS_ALERTS_PER_ROW]:
        name, _, fp = a.rpartition("/")
        out.append({"name": _clip(name or a), "fingerprint": _clip(fp, 64), "runbook": links.runbook_href(name or a),
                    "alertmanager": links.alertmanager_href(am, name or a, sc["labels"])})
    return out


def _scope_row(sc: ScopeView, lvl: str, st: LevelView, now: float, links: StatusLinks, am: str, row_calls: list[AuditRow],
               waiting: list[dict]) -> dict[str, Any]:
    """One (scope, level) row of the page: its state, alerts, override, calls and pending calls."""
    ov = st["override"]
    tripped, releasing = st["tripped"], st["tripped"] and st["release_at"] is not None
    return {
        "key": _clip(sc["key"]), "labels": [(k, _clip(v)) for k, v in sc["labels"].items()],
        "level": lvl, "action": _clip(st["action"]), "tripped": tripped,
        "state": "RELEASE PENDING" if releasing else "TRIPPED" if tripped else "ok",
        "css": "releasing" if releasing else "tripped" if tripped else "ok",
        "since": _when(st["tripped_at"], now) if tripped else {"iso": "", "ago": ""},
        "alerts": _alerts(sc, st, links, am), "alerts_more": max(0, len(st["alerts"]) - STATUS_ALERTS_PER_ROW),
        "release_at": _when(st["release_at"], now, "") if st["release_at"] is not None else None,
        "override": ({"mode": ov["mode"], "until": _when(ov["until"], now, ""), "reason": _clip(ov["reason"])}
                     if ov else None),
        "dashboard": links.dashboard_href(sc["labels"], st["tripped_at"] if tripped else None),
        "calls": [_call(c) for c in row_calls[:STATUS_CALLS_PER_ROW]],
        "calls_more": max(0, len(row_calls) - STATUS_CALLS_PER_ROW),
        "applied": _applied(st) if tripped else None,
        "pending": [{"adapter": _clip(p["adapter"], 60), "state": p["state"], "attempts": p["attempts"]}
                    for p in waiting[:STATUS_CALLS_PER_ROW]],
    }


def _decision(a: AuditRow) -> dict:
    """One audit row of the "last decisions" table."""
    return {"at": iso(a["at"]) or "", "kind": "not applied (dry-run)" if a["kind"] == "dry_run" else _clip(a["kind"]),
            "css": a["kind"], "scope": _clip(a["scope_key"]), "level": a["level"] or "",
            "action": _clip(a["action"]), "source": _clip(a["source"]), "reason": _clip(a["reason"])}


def _truncated(state: FuseState) -> dict | None:
    """The newest notification Alertmanager truncated, and the counts since start (None: none)."""
    cut = state.get("truncated") or {}
    last = cut.get("last")
    if not last:
        return None
    return {"at": iso(last["at"]), "left_out": last["truncated_alerts"], "sent": last["alerts"],
            "group": _clip(last["group_key"]), "notifications": cut.get("notifications", 0),
            "alerts": cut.get("alerts", 0)}


def render_status(state: FuseState, audit: Sequence[AuditRow], *, now: float, calls: Sequence[AuditRow] = (),
                  pending: Sequence[dict] = (), links: StatusLinks | None = None, alertmanager: str = "",
                  pages: dict | None = None) -> str:
    """The status page as one HTML string.

    Args:
        state: :meth:`FuseService.state`.
        audit: the newest audit rows, newest first (the "last decisions" table).
        now: Unix seconds (for "for 12 min").
        calls: audit rows of kinds :data:`CALL_KINDS`, newest first: each scope row shows its own.
        pending: outbox rows not yet applied, ``{"scope_key", "level", "state", "adapter", "attempts"}``.
        links: where alerts and scopes link to; None: no links.
        alertmanager: the ``externalURL`` of the last notification (used when ``links`` names none).
        pages: ``{"prev", "next"}`` query strings of the neighbouring pages, when ``state`` is a page
            (:meth:`FuseService.state` with a limit; its ``rows`` and ``tripped`` cover every page).

    Rendered in one pass by Jinja2 with autoescape (template static/status.html, no script), so text
    from alerts is shown as text, never read as markup or as a placeholder. At most ``STATUS_ROWS``
    scope rows and the first ``STATUS_DECISIONS`` audit rows, every cell clipped to
    ``STATUS_CELL_CHARS`` characters: the page stays under 1 MB."""
    links = links or StatusLinks()
    am = links.alertmanager or web_url(alertmanager)
    by_row = _per_row(calls, lambda c: (c.get("scope_key") or "", int(c.get("level") or 0)))
    waiting = _per_row(pending, lambda p: (p["scope_key"], int(p["level"] or 0)))
    rows: list[dict[str, Any]] = []
    total = 0
    for sc in state["scopes"]:
        for lvl, st in sc["levels"].items():
            total += 1
            if len(rows) < STATUS_ROWS:
                rows.append(_scope_row(sc, lvl, st, now, links, am, by_row.get((sc["key"], int(lvl)), []),
                                       waiting.get((sc["key"], int(lvl)), [])))
    total = max(total, state.get("rows", total))  # a page: the rows of every page
    tripped_levels = sorted(state.get("tripped", state["levels"]).items())
    decisions = [_decision(a) for a in audit[:STATUS_DECISIONS]]
    return _template().render(
        truncated=_truncated(state), now=iso(now),
        tripped=[(_clip(k), v) for k, v in tripped_levels[:STATUS_TRIPPED_IN_SUMMARY]],
        tripped_more=max(0, state.get("tripped_total", len(tripped_levels)) - min(len(tripped_levels),
                                                                             STATUS_TRIPPED_IN_SUMMARY)),
        rows=rows, rows_more=total - len(rows), decisions=decisions, dry_run=bool(state["dry_run"]),
        prev_page=(pages or {}).get("prev", ""), next_page=(pages or {}).get("next", ""),
        alertmanager=am, dashboard=links.dashboard,
        pending=state["pending_actions"], hold=f'{state["hold_s"]:g}')
