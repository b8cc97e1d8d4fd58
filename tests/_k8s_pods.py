"""Run a generated workload's pod natively, as a kubelet would run it, with no kubelet.

A Deployment's, a DaemonSet's or a StatefulSet's pod template (its first container, or the one
named). What the container runs is taken from the manifest as written: its ``command``, else the
image's entry point (``fusebox``, the Dockerfile's ENTRYPOINT, unless another is given: Debian's
``prometheus`` for the operator's Prometheus image), and its ``args``, with ``$(VAR)`` references
to its env expanded as the kubelet expands them; its ``env`` (``value``, ``secretKeyRef`` from the
Secrets given, ``fieldRef`` ``status.podIP`` / ``spec.nodeName`` / ``metadata.name``); its volumes
(ConfigMap and Secret volumes written out key by key, with ``items`` and ``defaultMode``;
``emptyDir``, PVCs and projected volumes as empty folders; ``subPath`` mounts); its probes, polled
as a kubelet polls them (``httpGet`` path and named port, ``timeoutSeconds``, ``periodSeconds``,
``failureThreshold``, ``initialDelaySeconds``).

Two translations only, where a pod differs from a process on this machine, each said where it
happens: a mount path such as ``/etc/fusebox`` becomes a folder of the pod under the test's
temporary folder (every argument, ``--flag=`` value or env value that starts with it is rewritten
the same way), and the pod's own IP is a loopback address of its own (``127.a.b.c``), so
``0.0.0.0:PORT`` or ``:PORT`` in the args binds that address, as it binds the pod IP in a cluster
(on the manifest's port, unless another process of this machine holds that port on every address:
:func:`host_port`). ``HOME`` is an empty folder of the pod, checked afterwards: the image's root
file system is read-only, so nothing may be written there.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

ENTRYPOINT = "fusebox"  # the Dockerfile's ENTRYPOINT


def entrypoint() -> str:
    """The image's entry point as installed beside this interpreter (the project's virtualenv)."""
    here = Path(sys.executable).parent / ENTRYPOINT
    return str(here) if here.exists() else (shutil.which(ENTRYPOINT) or ENTRYPOINT)


def host_port(ip: str, port: int) -> int:
    """``port`` on ``ip`` if it can be bound there, else a free port of ``ip``. Each pod has an
    address of its own, so a manifest's port is free on it unless another process of this machine
    listens on that port on **every** address (a system Prometheus on :9090, a system Alertmanager
    on :9093): then, and only then, the pod's port moves."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
            return port
        except OSError:
            pass
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def pod_ip() -> str:
    """A loopback address for one pod (127.0.0.0/8 is all loopback on Linux)."""
    return f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(2, 254)}"


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of a container's command and args: a variable of the
    container's env is replaced by its value, an unknown one stays as written, ``$$`` is ``$``."""
    return _REF.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)


class Pod:
    """One replica of ``deployment``'s pod template (its first container).

    Args:
        deployment: the Deployment object as generated.
        root: a folder of this pod's own (mounts, HOME, log).
        secrets / configmaps: name -> {key: text}, the objects the cluster would hold.
        name: the pod's name (``metadata.name`` for fieldRef).
        node: the node's name (``spec.nodeName``).
    """

    def __init__(self, deployment: Mapping[str, Any], root: Path, *, secrets: Mapping[str, Mapping[str, str | bytes]],
                 configmaps: Mapping[str, Mapping[str, str]], name: str, node: str = "node-a",
                 ip: str | None = None, container: str | None = None,
                 entrypoint: list[str] | None = None):
        self.spec = deployment["spec"]["template"]["spec"]
        self.labels = dict(deployment["spec"]["template"].get("metadata", {}).get("labels") or {})
        cs = self.spec["containers"]
        self.container = next(c for c in cs if c["name"] == container) if container else cs[0]
        # the image's ENTRYPOINT, for a container without `command` (fusebox's own image by default)
        self.image_entrypoint = entrypoint
        self.root, self.name, self.node = Path(root), name, node
        self.ip = ip or pod_ip()
        self.secrets, self.configmaps = secrets, configmaps
        self.root.mkdir(parents=True, exist_ok=True)
        self.home = self.root / "home"
        self.home.mkdir(exist_ok=True)
        self.log = self.root / "container.log"
        self.mounts = self._volumes()
        self.proc: subprocess.Popen | None = None
        # containerPort -> the port it gets on the pod's address (the same unless taken, host_port)
        self.host_ports = {p["containerPort"]: host_port(self.ip, p["containerPort"])
                           for c in self.spec["containers"] for p in c.get("ports", [])}
        self.ports = {p["name"]: self.host_ports[p["containerPort"]] for p in self.container.get("ports", [])
                      if "name" in p}

    # ------------------------------------------------------------------ volumes
    def _volumes(self) -> dict[str, Path]:
        """mountPath -> local folder, each volume materialised as the kubelet would."""
        vols = {v["name"]: v for v in self.spec.get("volumes", [])}
        out = {}
        for m in self.container.get("volumeMounts", []):
            v = vols[m["name"]]
            where = self.root / "volumes" / m["name"]
            where.mkdir(parents=True, exist_ok=True)
            if "configMap" in v:
                self._write_keys(where, self.configmaps[v["configMap"]["name"]], v["configMap"].get("items"),
                                 v["configMap"].get("defaultMode", 0o644))
            elif "secret" in v:
                self._write_keys(where, self.secrets[v["secret"]["secretName"]], v["secret"].get("items"),
                                 v["secret"].get("defaultMode", 0o644))
            # a subPath mounts that part of the volume (a file or a folder) at mountPath
            out[m["mountPath"]] = where / m["subPath"] if m.get("subPath") else where
        return out

    @staticmethod
    def _write_keys(where: Path, data: Mapping[str, str | bytes], items, mode: int) -> None:
        pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
        for key, path in pairs:
            f = where / path
            f.parent.mkdir(parents=True, exist_ok=True)
            v = data[key]
            f.write_bytes(v) if isinstance(v, bytes) else f.write_text(v)
            os.chmod(f, mode)

    def local(self, value: str) -> str:
        """``value`` with a mount path prefix or an all-addresses bind (``0.0.0.0:PORT``, ``:PORT``)
        translated (the two translations); in a ``--flag=VALUE`` argument, its VALUE."""
        if value.startswith("--") and "=" in value:
            flag, rest = value.split("=", 1)
            return f"{flag}={self.local(rest)}" if rest else value
        for mount, where in sorted(self.mounts.items(), key=lambda kv: -len(kv[0])):
            if value == mount or value.startswith(mount + "/"):
                return str(where) + value[len(mount):]
        if re.fullmatch(r"(0\.0\.0\.0)?:\d+", value):
            port = int(value.split(":", 1)[1])
            return f"{self.ip}:{self.host_ports.get(port, port)}"
        return value

    # ------------------------------------------------------------------ process
    def env(self) -> dict[str, str]:
        fields = {"status.podIP": self.ip, "spec.nodeName": self.node, "metadata.name": self.name}
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.home), "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1"}
        for e in self.container.get("env", []):
            if "value" in e:
                env[e["name"]] = self.local(e["value"])
            else:
                src = e["valueFrom"]
                if "secretKeyRef" in src:
                    ref = src["secretKeyRef"]
                    env[e["name"]] = self.secrets[ref["name"]][ref["key"]]
                elif "fieldRef" in src:
                    env[e["name"]] = fields[src["fieldRef"]["fieldPath"]]
                else:
                    raise AssertionError(f"env {e['name']}: no stand-in for {src}")
        return env

    def argv(self) -> list[str]:
        """The command line: ``command`` (else the image's entry point) and ``args``, each with
        ``$(VAR)`` references to the container's env expanded as the kubelet expands them."""
        cmd = self.container.get("command") or self.image_entrypoint or [entrypoint()]
        env = self.env()
        args = [self.local(expand(a, env)) for a in self.container.get("args", [])]
        for i in range(1, len(args)):  # `--metrics-port 9410`: a container port given on its own
            if args[i - 1].startswith("--") and args[i - 1].endswith("port") and args[i].isdigit():
                args[i] = str(self.host_ports.get(int(args[i]), int(args[i])))
        return [*cmd, *args]

    def start(self) -> Pod:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(self.argv(), env=self.env(), cwd=str(self.home), stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.started = time.monotonic()
        return self

    def url(self, port: str | int = "http") -> str:
        p = self.ports[port] if isinstance(port, str) else self.host_ports.get(port, port)
        return f"http://{self.ip}:{p}"

    def probe(self, kind: str = "readinessProbe") -> bool:
        """One probe of ``kind`` as the kubelet sends it: True on a 2xx/3xx answer within its timeout."""
        pr = self.container[kind]["httpGet"]
        port = self.ports[pr["port"]] if isinstance(pr["port"], str) else self.host_ports.get(pr["port"], pr["port"])
        try:
            r = httpx.get(f"http://{self.ip}:{port}{pr.get('path', '/')}",
                          timeout=self.container[kind].get("timeoutSeconds", 1))
            return 200 <= r.status_code < 400
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 60.0, period: float | None = None) -> float:
        """Poll the readiness probe (every ``periodSeconds``, or ``period``) until it passes; the
        seconds it took. Raises AssertionError with the container's log when it does not."""
        spec = self.container["readinessProbe"]
        step = period if period is not None else spec.get("periodSeconds", 10)
        time.sleep(spec.get("initialDelaySeconds", 0))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"pod {self.name} exited {self.proc.returncode}: {self.output()[-3000:]}")
            if self.probe("readinessProbe"):
                return time.monotonic() - self.started
            time.sleep(step)
        raise AssertionError(f"pod {self.name} not Ready in {timeout:g}s: {self.output()[-3000:]}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM, then SIGKILL after ``terminationGracePeriodSeconds`` (default 30) as the kubelet does."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        grace = grace if grace is not None else self.spec.get("terminationGracePeriodSeconds", 30)
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)
