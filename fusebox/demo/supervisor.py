"""Start child processes in their own process groups and stop exactly those, by id.

Each child gets a new session (``start_new_session``), so Ctrl-C in the terminal reaches only
the demo, which then stops its children in reverse start order: SIGTERM to the child's process
group, SIGKILL to the group after a grace period. Nothing is ever stopped by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Child", "ChildDied", "Supervisor"]


class ChildDied(RuntimeError):
    """A child exited while it was meant to run; ``str()`` names it, its status and log file."""

    def __init__(self, child: Child):
        self.child = child
        tail = child.log_tail(12)
        super().__init__(
            f"{child.name} (pid {child.pid}) exited with status {child.proc.returncode}; "
            f"its log: {child.log_path}" + ("\n  last lines:\n    " + "\n    ".join(tail) if tail else ""))


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path
    may_exit: bool = False  # exiting 0 is its job (the scenario player)
    lines: list = field(default_factory=list)  # (wall time, line) when its stdout is followed

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, n: int) -> list[str]:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip()][-n:]


class Supervisor:
    """Children of one demo run; :meth:`stop_all` is safe to call more than once."""

    def __init__(self, log_dir: Path, *, say: Callable[[str], None] = lambda _m: None):
        self.log_dir = Path(log_dir)
        self.children: list[Child] = []
        self.say = say

    def start(self, name: str, args: Sequence[str], *, env: dict | None = None, cwd: Path | None = None,
              may_exit: bool = False, on_line: Callable[[float, str], None] | None = None) -> Child:
        """Start ``args`` with stdout+stderr to ``<log_dir>/<name>.log``.

        ``on_line(wall_time, line)``: follow the child's output line by line (a reader thread
        stamps each line as it arrives, then appends it to the log file).
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "ab", buffering=0)
        try:
            proc = subprocess.Popen(list(args), stdout=subprocess.PIPE if on_line else log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
        except OSError as e:
            log.close()
            raise RuntimeError(f"cannot start {name} ({args[0]}): {e.strerror}") from None
        child = Child(name, proc, log_path, may_exit)
        self.children.append(child)
        if on_line:
            def follow() -> None:
                with log:
                    for raw in proc.stdout:  # type: ignore[union-attr]
                        now = time.time()
                        log.write(raw)
                        line = raw.decode("utf-8", "replace").rstrip("\n")
                        child.lines.append((now, line))
                        try:
                            on_line(now, line)
                        except Exception:  # noqa: BLE001 -- a view error must not stop the reader
                            pass
            threading.Thread(target=follow, name=f"follow-{name}", daemon=True).start()
        else:
            log.close()
        return child

    def check(self) -> None:
        """Raise :class:`ChildDied` for the first child that exited when it should not have
        (any exit of a service; a non-zero exit of a ``may_exit`` child)."""
        for c in self.children:
            rc = c.proc.poll()
            if rc is not None and not (c.may_exit and rc == 0):
                raise ChildDied(c)

    def stop(self, child: Child, grace_s: float = 8.0) -> None:
        """SIGTERM the child's process group, SIGKILL it after ``grace_s``; reap the child."""
        pgid = child.pid  # start_new_session: the child leads its own group
        if child.proc.poll() is None:
            _killpg(pgid, signal.SIGTERM)
            try:
                child.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _killpg(pgid, signal.SIGKILL)
                child.proc.wait(timeout=5)
        # Grandchildren left in the group (the leader is gone, the group may not be).
        _killpg(pgid, signal.SIGKILL)

    def retire(self, child: Child) -> None:
        """Stop ``child`` for good while the others run on: :meth:`stop`, then forget it, so
        :meth:`check` no longer counts its exit as a death (a replica lost on purpose)."""
        if child in self.children:
            self.children.remove(child)
        self.stop(child)

    def stop_all(self) -> None:
        while self.children:
            c = self.children.pop()
            try:
                self.stop(c)
            except Exception as e:  # noqa: BLE001 -- keep stopping the others
                self.say(f"demo: could not stop {c.name} (pid {c.pid}): {e}")


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
