"""Kind ``haproxy``: HAProxy's runtime API (a stats socket at level admin; runtime:
``fuse/adapters/haproxy.py``). Levels 1 and 3 set a server to drain (running requests finish) and
back to ready; level 2 adds an entry per backend to a map that the generated
``haproxy/fusebox.cfg`` reads, sending multimodal requests to a text-only backend (``text_only``).
Each target names a server, ``<backend>/<server>``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .base import AdapterKind, Err

if TYPE_CHECKING:
    from fusebox.spec.adapters import RawAdapter, RawTarget

__all__ = ["KIND", "HaproxyKind", "TEXT_ONLY_LEVEL"]

TEXT_ONLY_LEVEL = 2  # the fuse level the haproxy adapter applies through its map (text-only fallback)

# HAProxy proxy and server names: letters, digits, '-', '_', '.' and ':' (its cfgparse rule);
# nothing that could end a runtime-API command or start another (no space, ';' or newline).
# Checked with fullmatch: with match, '$' also matches before a trailing newline ("be/x\n").
_HAPROXY_NAME = r"[A-Za-z0-9_.:-]+"
_HAPROXY_SERVER = re.compile(rf"^{_HAPROXY_NAME}/{_HAPROXY_NAME}\Z")
_HAPROXY_BACKEND = re.compile(rf"^{_HAPROXY_NAME}\Z")
# A map file as HAProxy names it on the runtime API: an absolute path, no space, ';' or newline.
_HAPROXY_MAP = re.compile(r"^/[A-Za-z0-9_.@+/-]+\Z")
_HEADER = re.compile(r"^[A-Za-z0-9-]+\Z")


class HaproxyKind(AdapterKind):
    name = "haproxy"
    levels = (1, 2, 3)
    fields = ("socket", "text_only")

    def check_target(self, t: RawTarget, path: tuple, err: Err) -> None:
        """``server``: ``<backend>/<server>``, HAProxy names only."""
        if not (t.server and _HAPROXY_SERVER.fullmatch(t.server)):
            err(path + (("server",) if t.server else ()), f"this target needs a server <backend>/<server>, got {t.server!r}",
                "e.g. server: be_llm/engine0 (letters, digits, '-', '_', '.', ':')")

    def check_fields(self, a: RawAdapter, name: str, path: tuple, levels: dict[str, int], err: Err) -> None:
        """``socket``: required; ``text_only``: see :func:`check_text_only`."""
        if not a.socket:
            err(path, f"haproxy adapter {name!r} needs its runtime API socket", "socket: /run/haproxy/admin.sock")
        check_text_only(a, name, path, levels, err)


def check_text_only(a: RawAdapter, name: str, path: tuple, levels: dict[str, int], err: Err) -> None:
    """``text_only``: needed when the adapter applies a level-2 action; its map an absolute path, its
    backend and the adapter's name HAProxy names (they name the generated ACLs), its header an
    HTTP header name."""
    t = a.text_only
    if t is None:
        for i, act in enumerate(a.actions):
            if levels.get(act) == TEXT_ONLY_LEVEL:
                err(path + ("actions", i), f"haproxy adapter {name!r} applies {act} (level 2) but has no text_only",
                    "add text_only: {map: /etc/haproxy/fusebox-text-only.map, backend: be_llm_text}")
        return
    tp = path + ("text_only",)
    if not _HAPROXY_BACKEND.fullmatch(name):
        err(path, f"adapter name {name[:100]!r} names the generated HAProxy ACLs: it must be an HAProxy name",
            "rename it with letters, digits, '-', '_', '.', ':' only", key=True)
    if not _HAPROXY_MAP.fullmatch(t.map):
        err(tp + ("map",), f"map must be an absolute file path, got {t.map[:100]!r}",
            "e.g. map: /etc/haproxy/fusebox-text-only.map (letters, digits, '_.@+/-')")
    if not _HAPROXY_BACKEND.fullmatch(t.backend):
        err(tp + ("backend",), f"backend must be an HAProxy backend name, got {t.backend[:100]!r}",
            "e.g. backend: be_llm_text (letters, digits, '-', '_', '.', ':')")
    if not _HEADER.fullmatch(t.header):
        err(tp + ("header",), f"header must be an HTTP header name, got {t.header[:100]!r}", "e.g. header: X-Fusebox-Multimodal")


KIND = HaproxyKind()
