"""HAProxy's runtime API as a ``fuse.adapters`` kind, ``haproxy`` (see :class:`HaproxyRuntime`).

Level 2 (text-only fallback) sets a map entry that the generated ``haproxy/fusebox.cfg`` reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from fusebox.spec.adapters import TEXT_ONLY_LEVEL, Target
from fusebox.spec.adapters import Adapter as AdapterSpec

from ..control import ControlCall
from ..logsafe import escape_control
from ..rules import scope_key
from .base import FromSpec, Holds, targets_for, unmapped
from .protocol import ActionError, AdapterStateStore
from .transport import call_deadline, remaining

__all__ = ["HaproxyRuntime"]


def _sendable(line: str) -> bool:
    """Whether ``line`` is one runtime-API command: no newline, carriage return or ``;``."""
    return not any(c in line for c in "\n\r;")


class HaproxyRuntime(FromSpec):
    """HAProxy's runtime API on its UNIX stats socket (``stats socket PATH level admin``).

    Trip = ``set server <backend>/<server> state drain`` (no new connections; running ones finish,
    health checks go on); release = ``set server <backend>/<server> state ready``, once no
    (action, scope) holds it. Level 2 with ``text_only`` in the spec: ``set map <map> <backend> 1``
    (``add map`` when HAProxy answers ``entry not found``) while any (action, scope) holds that
    backend, ``del map <map> <backend>`` after (``Key not found.``: already gone). Server, backend
    and map names come from the spec, checked against HAProxy's name rules when the spec loads, so
    no value can add a line or a command. HAProxy answers an empty line when it applied the
    command; any other text is an error (``No such server.``, ``Unknown map identifier``: permanent).
    """

    kind = "haproxy"

    def __init__(self, spec: AdapterSpec):
        super().__init__(spec)
        self.socket = spec.socket or ""
        self.holds = Holds(self.name)

    def attach(self, store: AdapterStateStore) -> None:
        """Keep the holds in ``store`` (the service calls it)."""
        self.holds.attach(store)

    def wants(self, call: ControlCall) -> bool:
        return call.action in self.spec.actions

    def command(self, line: str) -> str:
        """Send one runtime-API command (no newline in it), return HAProxy's answer (stripped).

        Raises :class:`ActionError`: HAProxy cannot be reached, or (permanent, nothing sent) ``line``
        holds a newline, a carriage return or ``;``."""
        import socket

        if not _sendable(line):
            # a name the spec check let through (or an adapter built without it): never sent, and
            # final, since sending it again cannot help (a ValueError here was retried forever)
            e = ActionError(f"{self.socket}: {escape_control(line[:200])}: a runtime-API command holds a newline or ';'",
                            summary="a name that could add a runtime-API command")
            e.permanent = True
            raise e
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(remaining(self.spec.timeout_s))
                s.connect(self.socket)
                s.settimeout(remaining(self.spec.timeout_s))
                s.sendall(line.encode() + b"\n")
                chunks = []
                while True:
                    s.settimeout(remaining(self.spec.timeout_s))  # HAProxy answering a byte at a time: the deadline holds
                    b = s.recv(65536)
                    if not b:
                        break
                    chunks.append(b)
        except OSError as e:
            raise ActionError(f"{self.socket}: {type(e).__name__}: {e}", summary=type(e).__name__) from None
        return b"".join(chunks).decode(errors="replace").strip()

    def apply(self, call: ControlCall) -> None:
        targets = targets_for(self.spec, call.scope)
        if not targets:
            raise unmapped(self.spec)
        with call_deadline(self.timeout_s):
            self._apply(targets, call)

    def _apply(self, targets: list[Target], call: ControlCall) -> None:
        hold = f"{call.action} {scope_key(call.scope)}"
        on = call.state == "trip"
        for t in targets:
            assert t.server
            if call.level == TEXT_ONLY_LEVEL and self.spec.text_only:
                backend = t.server.split("/", 1)[0]
                self.text_only(backend, self.holds.change(f"map {backend}", hold, on))
                continue
            state = "drain" if self.holds.change(t.server, hold, on) else "ready"
            self._run(f"set server {t.server} state {state}")

    def observe(self, calls: Sequence[ControlCall]) -> list[bool]:
        """:class:`fusebox.fuse.adapters.protocol.Observable`: ``show servers state <backend>`` (a server is out
        when its admin state has the drain bit, 0x08) for each backend named, and ``show map``
        for the text-only level; each read once per call. A target whose name cannot be sent
        (:meth:`command`) is left out of the comparison, so the reconciler does not queue again a
        call that can only fail. Raises ActionError when HAProxy cannot be reached or answers an
        error (an unknown backend)."""
        servers: dict[str, set[str]] = {}  # backend -> its drained servers
        mapped: set[str] | None = None  # backends with a text-only map entry

        def drained(server: str) -> bool:
            backend, _, name = server.partition("/")
            if backend not in servers:
                lines = self.command(f"show servers state {backend}").splitlines()
                if not lines or not lines[0].strip().isdigit():  # not the state file format: an error
                    raise ActionError(f"{self.socket}: show servers state {backend}: {(lines or [''])[0][:200]}",
                                      summary="HAProxy refused the command")
                rows = [ln.split() for ln in lines[1:] if ln.strip() and not ln.startswith("#")]
                servers[backend] = {r[3] for r in rows if len(r) > 6 and r[6].isdigit() and int(r[6]) & 0x08}
            return name in servers[backend]

        out = []
        for p in calls:
            ok = True
            for t in targets_for(self.spec, p.scope):
                assert t.server
                if not _sendable(t.server):
                    continue  # never sent (its call failed for good, audited): nothing to compare or retry
                backend = t.server.split("/", 1)[0]
                if p.level == TEXT_ONLY_LEVEL and self.spec.text_only:
                    if mapped is None:
                        answer = self.command(f"show map {self.spec.text_only.map}")
                        mapped = {ln.split()[1] for ln in answer.splitlines() if len(ln.split()) >= 3}
                    want = p.state == "trip" or self.holds.held(f"map {backend}")
                    ok = ok and (backend in mapped) == want
                else:
                    want = p.state == "trip" or self.holds.held(t.server)
                    ok = ok and drained(t.server) == want
            out.append(ok)
        return out

    def text_only(self, backend: str, on: bool) -> None:
        """Set (``on``) or delete the map entry ``<backend> 1`` of ``text_only.map``; idempotent."""
        assert self.spec.text_only
        m = self.spec.text_only.map
        if not on:
            self._run(f"del map {m} {backend}", ok=("Key not found.",))
        elif self._run(f"set map {m} {backend} 1", ok=("entry not found.",)):
            self._run(f"add map {m} {backend} 1")

    def _run(self, line: str, ok: tuple[str, ...] = ()) -> str:
        """Send ``line``; returns HAProxy's answer when empty or one of ``ok``, else raises :class:`ActionError`."""
        answer = self.command(line)
        if not answer or answer in ok:
            return answer
        e = ActionError(f"{self.socket}: {line}: {answer[:200]}", summary="HAProxy refused the command")
        e.permanent = "No such" in answer or "Unknown map" in answer
        raise e
