"""A real Kubernetes control plane on loopback, for tests, with no node and no kubelet.

``ControlPlane`` starts etcd, kube-apiserver (v1.37.2) and the Prometheus Operator (v0.85.0),
each built into the tool cache by ``make tools`` (tools/build-kube.sh,
tools/build-prometheus-operator.sh; the CRDs by tools/build-operator-crds.sh), on free loopback
ports in a temporary folder, with the start-up flags tools/kube/README.md explains: etcd with one
member over plain HTTP; the API server with a self-signed serving certificate for 127.0.0.1, a
static bearer token in group ``system:masters``, ``AlwaysAllow`` authorization (or ``RBAC``), a service-account
signing key and ``--endpoint-reconciler-type none`` (no node ever registers); the operator with a
kubeconfig pointing at it. Objects go in by server-side apply (``PATCH`` with
``application/apply-patch+yaml``, a field manager and ``fieldValidation=Strict``: an unknown field
is refused, as ``kubectl apply --server-side`` refuses it) through the official ``kubernetes``
Python client's dynamic client.

A missing tool fails the test under CI (``CI=true``) and skips it elsewhere (``_support.need``).
"""

from __future__ import annotations

import base64
import gzip
import os
import secrets
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import yaml
from _support import missing, need

from fusebox.tooling import free_port, tools_dir

KUBE_VERSION = "v1.37.2"  # tools/build-kube.sh VERSION
OPERATOR_VERSION = "v0.85.0"  # tools/build-prometheus-operator.sh and build-operator-crds.sh VERSION
# every file of the operator module's example/prometheus-operator-crd/ (the operator needs them all)
CRD_KINDS = ("alertmanagerconfigs", "alertmanagers", "podmonitors", "probes", "prometheusagents", "prometheuses",
             "prometheusrules", "scrapeconfigs", "servicemonitors", "thanosrulers")
HOW = "run `make tools` (tools/bootstrap.sh builds kube-apiserver, etcd and the Prometheus Operator with Go)"
FIELD_MANAGER = "fusebox-test"


def kube_tools() -> dict[str, Any]:
    """Paths of etcd, kube-apiserver, the operator, the CRD folder and openssl (``need`` each)."""
    base = tools_dir()
    k8s = base / f"kubernetes-{KUBE_VERSION}"
    found: dict[str, Any] = {
        "etcd": need(str(k8s / "etcd"), HOW),
        "kube-apiserver": need(str(k8s / "kube-apiserver"), HOW),
        "operator": need(str(base / f"prometheus-operator-{OPERATOR_VERSION}" / "operator"), HOW),
        "openssl": need("openssl", "install Debian's openssl package"),
    }
    crds = base / f"prometheus-operator-crds-{OPERATOR_VERSION}"
    lacking = [k for k in CRD_KINDS if not (crds / f"monitoring.coreos.com_{k}.yaml").is_file()]
    if lacking:
        missing(f"the Prometheus Operator {OPERATOR_VERSION} CRDs {', '.join(lacking)} are missing from {crds}: {HOW}")
    found["crds"] = crds
    return found


def wait_until(pred: Callable[[], Any], timeout: float, what: str, step: float = 0.25,
               alive: Callable[[], None] | None = None, why: Callable[[], str] | None = None) -> Any:
    """``pred()``'s first truthy value, polled every ``step`` s; AssertionError after ``timeout``
    (with ``why()``'s text: a log tail). ``alive()`` is called each round and may raise (a process
    that died)."""
    end = time.monotonic() + timeout
    while True:
        if alive is not None:
            alive()
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}" + (f":\n{why()}" if why else ""))
        time.sleep(step)


class Proc:
    """A child process in its own process group, its output in ``log``."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None):
        self.name, self.argv, self.log = name, argv, log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         cwd=str(cwd) if cwd else None, start_new_session=True)

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited {self.proc.returncode}: {self.tail()}")

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def stop(self, grace: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class ControlPlane:
    """etcd + kube-apiserver + the Prometheus Operator under ``root``; ``start()``, ``close()``."""

    def __init__(self, root: Path, authorization: str = "AlwaysAllow", apiserver_args: Iterable[str] = ()):
        self.tools = kube_tools()
        self.authorization = authorization  # the API server's --authorization-mode (RBAC: the roles apply)
        self.apiserver_args = list(apiserver_args)  # added to the flags below (the aggregator's, for one)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        self.token = secrets.token_hex(16)
        self.etcd_port, self.peer_port, self.api_port, self.operator_port = (free_port() for _ in range(4))
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.kubeconfig = self.root / "kubeconfig"
        self.ca = self.root / "serving.crt"
        self.client: Any = None  # kubernetes.dynamic.DynamicClient once started
        self.operator: Proc | None = None

    # ------------------------------------------------------------------ processes
    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        p = Proc(name, argv, self.root / f"{name}.log", env=env)
        self.procs.append(p)
        return p

    def _openssl(self, *args: str) -> None:
        r = subprocess.run([self.tools["openssl"], *args], capture_output=True, text=True, timeout=120)
        if r.returncode:
            raise RuntimeError(f"openssl {' '.join(args[:2])}: {r.stderr}")

    def start(self) -> ControlPlane:
        r, t = self.root, self.tools
        etcd = self._start("etcd", [
            t["etcd"], "--name", "test", "--data-dir", str(r / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-cluster", f"test=http://127.0.0.1:{self.peer_port}",
            "--unsafe-no-fsync", "--log-level", "warn"])
        # the API server's serving certificate (self-signed, for 127.0.0.1) and service-account key
        self._openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                      "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                      "-addext", "basicConstraints=critical,CA:TRUE",
                      "-keyout", str(r / "serving.key"), "-out", str(self.ca))
        self._openssl("genrsa", "-out", str(r / "sa.key"), "2048")
        self._openssl("rsa", "-in", str(r / "sa.key"), "-pubout", "-out", str(r / "sa.pub"))
        (r / "tokens.csv").write_text(f"{self.token},test-admin,test-admin,system:masters\n")
        wait_until(lambda: _etcd_healthy(self.etcd_port), 60, "etcd healthy", alive=etcd.check)
        api = self._start("kube-apiserver", [
            t["kube-apiserver"], "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}",
            "--bind-address", "127.0.0.1", "--secure-port", str(self.api_port), "--advertise-address", "127.0.0.1",
            "--tls-cert-file", str(self.ca), "--tls-private-key-file", str(r / "serving.key"),
            "--cert-dir", str(r / "certs"), "--token-auth-file", str(r / "tokens.csv"),
            "--authorization-mode", self.authorization, "--anonymous-auth=false",
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(r / "sa.pub"), "--service-account-signing-key-file", str(r / "sa.key"),
            "--service-cluster-ip-range", "10.96.0.0/24", "--endpoint-reconciler-type", "none", *self.apiserver_args])
        # a loaded 2-core machine takes tens of seconds to open every API group
        wait_until(self._ready, 180, "kube-apiserver /readyz", step=0.5, alive=api.check)
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: test\n  cluster: {{server: \"{self.server}\", certificate-authority: \"{self.ca}\"}}\n"
            f"users:\n- name: test-admin\n  user: {{token: \"{self.token}\"}}\n"
            "contexts:\n- name: test\n  context: {cluster: test, user: test-admin}\ncurrent-context: test\n")
        self.kubeconfig.chmod(0o600)
        from kubernetes import config, dynamic

        self.client = dynamic.DynamicClient(config.new_client_from_config(config_file=str(self.kubeconfig)))
        return self

    def _tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))

    def _ready(self) -> bool:
        try:
            r = httpx.get(self.server + "/readyz", verify=self._tls(), timeout=5,
                          headers={"Authorization": f"Bearer {self.token}"})
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    def version(self) -> str:
        r = httpx.get(self.server + "/version", verify=self._tls(), timeout=10,
                      headers={"Authorization": f"Bearer {self.token}"})
        return str(r.json()["gitVersion"])

    def install_crds(self) -> list[str]:
        """Server-side apply every CRD file of the tool cache as it is (the YAML text, as
        ``kubectl apply --server-side -f`` sends it); wait until each is Established."""
        return self.install_crd_files(sorted(Path(self.tools["crds"]).glob("*.yaml")))

    def install_crd_files(self, files: Iterable[Path]) -> list[str]:
        """Server-side apply each CRD file as it is; wait until each is Established; their names."""
        names = []
        for f in files:
            text = f.read_text()
            doc = yaml.load(text, Loader=_YAML11Loader)
            self.apply(doc, text=text)
            names.append(doc["metadata"]["name"])
        crd = self.resource("apiextensions.k8s.io/v1", "CustomResourceDefinition")

        def established(name: str) -> bool:
            conds = (self.client.get(crd, name=name).to_dict().get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

        for n in names:
            wait_until(lambda n=n: established(n), 60, f"CRD {n} Established")
        self.client.resources.invalidate_cache()
        return names

    def start_operator(self, timeout: float = 120) -> Proc:
        """The operator with its defaults (it reads $KUBECONFIG); returns once its Prometheus and
        Alertmanager controllers have synced their caches."""
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.root), "KUBECONFIG": str(self.kubeconfig)}
        op = self.operator = self._start("operator", [self.tools["operator"], "--web.listen-address", f"127.0.0.1:{self.operator_port}",
                                      "--log-level", "info", "--log-format", "logfmt"], env=env)

        def synced() -> bool:
            lines = op.tail(10**7).splitlines()
            return all(any(f"component={c}-controller" in ln and "successfully synced all caches" in ln for ln in lines)
                       for c in ("prometheus", "alertmanager"))

        wait_until(synced, timeout, "the operator's controllers to sync", step=0.5, alive=op.check)
        return op

    def operator_log(self) -> str:
        return self.operator.tail(20000) if self.operator is not None else ""

    def check(self) -> None:
        for p in self.procs:
            p.check()

    def close(self) -> None:
        for p in reversed(self.procs):
            p.stop()

    # ------------------------------------------------------------------ objects
    def resource(self, api_version: str, kind: str) -> Any:
        return self.client.resources.get(api_version=api_version, kind=kind)

    def apply(self, doc: dict[str, Any], text: str | None = None, dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply ``doc`` (sent as ``text`` when given, else as JSON, which is YAML too);
        the object as the API server stored it (a dict), or with ``dry_run`` as it would store it
        (``dryRun=All``: validated, defaulted and admitted, not persisted). Raises the client's
        ApiException when the server refuses it (an unknown field included: Strict)."""
        res = self.resource(doc["apiVersion"], doc["kind"])
        meta = doc["metadata"]
        params = [("fieldValidation", "Strict")] + ([("dryRun", "All")] if dry_run else [])
        out = self.client.server_side_apply(res, body=text if text is not None else doc, name=meta["name"],
                                            namespace=meta.get("namespace"), field_manager=FIELD_MANAGER,
                                            force_conflicts=True, query_params=params)
        return out.to_dict()

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        from kubernetes.dynamic.exceptions import NotFoundError

        try:
            return self.client.get(self.resource(api_version, kind), name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None

    def list(self, api_version: str, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return [i.to_dict() for i in self.client.get(self.resource(api_version, kind), namespace=namespace).items]


class _YAML11Loader(yaml.SafeLoader):
    """PyYAML reads a bare ``=`` as YAML 1.1's "value" type, which the operator's CRDs hold as an
    enum entry (matchType ``=``); Kubernetes' YAML reads it as a string, and so does this."""


_YAML11Loader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_yaml_str)


def _etcd_healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json().get("health") == "true"
    except (httpx.HTTPError, ValueError):
        return False


def secret_data(secret: dict[str, Any], key: str) -> bytes:
    """A key of a Secret as read from the API server (base64 in ``data``), decoded."""
    return base64.b64decode(secret["data"][key])


def gunzip_text(data: bytes) -> str:
    return gzip.decompress(data).decode()


def secret_doc(name: str, namespace: str, data: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Secret with ``stringData`` (what ``kubectl create secret generic --from-literal`` makes)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "stringData": dict(data)}


def names(objs: Iterable[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)
