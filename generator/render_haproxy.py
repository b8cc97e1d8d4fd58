"""The HAProxy configuration snippet of the text-only fallback (fuse level 2) from the spec.

Pure renderer: ``outputs(spec, header) -> {"haproxy/fusebox.cfg": text}`` when a ``kind: haproxy``
adapter has ``text_only``, else ``{}``; no I/O. The snippet goes inside the user's ``frontend``
(before its ``use_backend``/``default_backend`` lines): per backend of the adapter's targets, an ACL
reads the map entry ``<backend> 1`` that the fuse service sets through the runtime API
(``fuse/adapters/haproxy.py``: ``set map``/``add map``/``del map``) and sends requests that carry the
multimodal header to the text-only backend while it is set. Every name comes from the spec (checked
against HAProxy's name rules when it loads). Tested with Debian's haproxy 2.6.
"""

from __future__ import annotations

from fusebox.spec import Spec

__all__ = ["OUT_PATH", "render_haproxy", "outputs"]

OUT_PATH = "haproxy/fusebox.cfg"


def render_haproxy(spec: Spec) -> str:
    """The snippet's text (without the generated-file header); "" when no haproxy adapter has ``text_only``."""
    parts = []
    for a in spec.adapters:
        t = a.text_only
        if a.kind != "haproxy" or t is None:
            continue
        backends = sorted({x.server.split("/", 1)[0] for x in a.targets if x.server})
        mm = f"fusebox_{a.name}_multimodal"
        lines = [
            f"# fuse.adapters.{a.name}: text-only fallback (level 2). Paste inside the frontend that",
            f"# sends to {', '.join(backends)}, before its use_backend / default_backend lines.",
            f"# HAProxy must start with the map file present (create it empty: touch {t.map}).",
            "# The fuse service sets `<backend> 1` in it through the runtime API while the level is",
            "# tripped and deletes it on release (HAProxy forgets runtime changes when it reloads).",
            f"# A request is multimodal when it carries the header {t.header} (any value):",
            "# the client or an earlier rule sets it (e.g. http-request set-header on a path).",
            f"    acl {mm} req.hdr({t.header}) -m found",
        ]
        for b in backends:
            acl = f"fusebox_{a.name}_text_only_{b}"
            lines += [f"    acl {acl} str({b}),map({t.map},0) -m str 1",
                      f"    use_backend {t.backend} if {mm} {acl}"]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def outputs(spec: Spec, header: str) -> dict[str, str]:
    """``{OUT_PATH: text}`` when the spec asks for the snippet, else ``{}``."""
    text = render_haproxy(spec)
    return {OUT_PATH: f"# {header}\n{text}"} if text else {}
