"""Adapters built from the spec's ``fuse.adapters`` (:mod:`fusebox.spec.adapters`).

Each follows :class:`fusebox.fuse.actions.Adapter`: ``name`` (the outbox key: ``<kind>:<name>``),
``label`` (the spec's name: metrics, audit, status page), ``wants(payload)``, ``apply(payload)``,
``max_attempts``. Every call goes through the service's outbox, retried per (adapter, scope) lane.

Scope -> target: a target applies to a decision's scope when its ``match`` labels all equal the
scope's (the scope may carry more), or when every scope label is in ``match`` with the same value
(a broader scope, e.g. a cluster, covers the targets inside it). A scope no target applies to is
refused: :class:`~fusebox.fuse.actions.ActionError` (permanent), audited as failed, and no label
value of it is sent anywhere. Only the spec's values (``match``, ``worker_url``, ``vars``) reach a
gateway; label values of the alert never do.

* :class:`SglangGateway`: the SGLang Model Gateway (``sglang-router``). Trip = take the target's
  worker out of rotation (``GET /workers`` to find its id and record its settings, then
  ``DELETE /workers/{id}``); release = ``POST /workers`` with the URL and the recorded settings
  (priority, cost, model_id, worker_type...). Idempotent: a worker already out (or already in) is
  left as it is.
* :class:`VllmRouter`: the vLLM router (``vllm-router``, a fork of it): ``POST /remove_worker?url=``
  and ``POST /add_worker?url=`` (its API takes the URL only: there are no settings to keep).
* :class:`HaproxyRuntime`: HAProxy's runtime API on its stats socket: ``set server <backend>/<server>
  state drain`` on a trip, ``state ready`` on release; level 2 (text-only fallback) sets the map
  entry ``<backend> 1`` (``set map``, or ``add map`` when absent) and deletes it on release
  (``del map``); the generated ``haproxy/fusebox.cfg`` reads that map.
* :class:`HttpAction`: method, URL and JSON body per (trip, release) as Jinja2 templates rendered
  in :class:`jinja2.sandbox.SandboxedEnvironment`; every value an URL template prints is
  percent-encoded; the URL must reach one of the spec's ``hosts``; headers are read from files.

What the target itself shows (``observe``, :class:`fusebox.fuse.actions.Observable`, for the
service's reconciler): the SGLang gateway's ``GET /workers``, the vLLM router's ``GET
/list_workers``, HAProxy's ``show servers state`` and ``show map``. :class:`HttpAction` cannot
report (an arbitrary API): it is not reconciled.

A worker stays out of rotation while any (action, scope) that took it out is still tripped: the
adapter keeps these *holds* (and the recorded settings) in the service's store (table
``adapter_state``, :mod:`fusebox.fuse.store`) once :meth:`attach`-ed to it (the service does that),
so a restart keeps them and replicas sharing a PostgreSQL store see the same ones; in memory before.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from jinja2.sandbox import SandboxedEnvironment

from fusebox.spec.adapters import TEXT_ONLY_LEVEL, Target
from fusebox.spec.adapters import Adapter as AdapterSpec

from .actions import ActionError, answer_text, call_deadline, deadline_client, remaining
from .discovery import GpuWorkers
from .logsafe import install
from .rules import scope_key

log = install(logging.getLogger("fusebox.fuse"))

__all__ = ["SglangGateway", "VllmRouter", "HaproxyRuntime", "HttpAction", "targets_for", "build_adapters", "WORKER_SETTINGS"]

# The fields of a worker in SGLang's GET /workers that POST /workers takes back (its WorkerConfigRequest).
WORKER_SETTINGS = ("model_id", "priority", "cost", "worker_type", "bootstrap_port", "labels", "api_key",
                   "disable_health_check", "tokenizer_path", "reasoning_parser", "tool_parser", "chat_template")


def targets_for(spec: AdapterSpec, scope: dict) -> list[Target]:
    """The spec's targets that apply to ``scope`` (see the module's doc); [] when none."""
    scope = {k: v for k, v in scope.items() if isinstance(v, str)}
    if not scope:
        return []
    out = []
    for t in spec.targets:
        narrower = all(scope.get(k) == v for k, v in t.match.items())
        broader = all(t.match.get(k) == v for k, v in scope.items())
        if narrower or broader:
            out.append(t)
    return out


def _unmapped(spec: AdapterSpec) -> ActionError:
    # The scope's values are left out: they are untrusted and may be anything (1 MB, newlines).
    msg = f"scope not mapped by fuse.adapters.{spec.name}.targets: refused, nothing sent"
    e = ActionError(msg, status=None, summary="scope not mapped in the spec: refused")
    e.permanent = True
    return e


def _call_error(url: str, e: httpx.HTTPError) -> ActionError:
    return ActionError(f"{url}: {type(e).__name__}: {e}", summary=type(e).__name__)


class _Holds:
    """(action, scope) holds per worker and the settings recorded per worker: in the store once
    :meth:`attach`-ed (``adapter_state``, keyed by the adapter's outbox name), in memory before."""

    def __init__(self, adapter: str):
        self.adapter = adapter
        self.store: Any = None
        self._lock = threading.Lock()
        self._holds: dict[str, set[str]] = {}
        self._settings: dict[str, dict] = {}

    def attach(self, store: Any) -> None:
        """Keep them in ``store`` (a :class:`fusebox.fuse.store.Store`) from now on."""
        self.store = store

    def change(self, worker: str, hold: str, on: bool) -> bool:
        """Add (``on``) or drop a hold; returns whether the worker is still held by anything. Raises StoreError."""
        if self.store is not None:
            return bool(self.store.adapter_hold(self.adapter, worker, hold, on))
        with self._lock:
            cur = self._holds.get(worker, set())
            cur = cur | {hold} if on else cur - {hold}
            self._holds[worker] = cur
            return bool(cur)

    def held_by(self, hold: str | None) -> list[str]:
        """The workers ``hold`` holds (None: any hold), sorted. Raises StoreError."""
        if self.store is not None:
            held = {w: st["holds"] for w, st in self.store.adapter_state(self.adapter).items()}
        else:
            with self._lock:
                held = {w: list(hs) for w, hs in self._holds.items()}
        return sorted(w for w, hs in held.items() if (hold in hs if hold is not None else hs))

    def record(self, worker: str, settings: dict) -> None:
        if self.store is not None:
            self.store.adapter_record(self.adapter, worker, settings)
            return
        with self._lock:
            self._settings[worker] = settings

    def held(self, worker: str) -> bool:
        """Whether any (action, scope) holds ``worker`` out now."""
        if self.store is not None:
            return bool(self.store.adapter_state(self.adapter).get(worker, {}).get("holds"))
        with self._lock:
            return bool(self._holds.get(worker))

    def settings(self, worker: str) -> dict:
        """The settings recorded for ``worker`` ({} when none)."""
        if self.store is not None:
            return dict(self.store.adapter_state(self.adapter).get(worker, {}).get("settings", {}))
        with self._lock:
            return dict(self._settings.get(worker, {}))


class _Rotation:
    """Take workers out of a gateway's rotation and put them back; subclasses say how."""

    kind = ""

    def __init__(self, spec: AdapterSpec):
        self.spec = spec
        self.name = f"{self.kind}:{spec.name}"
        self.label = spec.name
        self.max_attempts: int | None = spec.max_attempts
        self.url = spec.url or ""
        self.timeout_s = spec.timeout_s  # one apply() in total, every request of it (call_deadline)
        self._client = deadline_client(spec.timeout_s)
        self.holds = _Holds(self.name)
        self.discovery = GpuWorkers(spec.discover, spec.timeout_s) if spec.discover else None

    def attach(self, store: Any) -> None:
        """Keep the holds and recorded settings in ``store`` (the service calls it)."""
        self.holds.attach(store)

    def wants(self, payload: dict) -> bool:
        return payload["action"] in self.spec.actions

    def apply(self, payload: dict) -> None:
        hold = f"{payload['action']} {scope_key(payload['scope'])}"
        with call_deadline(self.timeout_s):
            workers = [t.worker_url for t in targets_for(self.spec, payload["scope"]) if t.worker_url]
            if not workers and self.discovery is not None:
                workers = self._discovered(payload, hold)
            elif not workers:
                raise _unmapped(self.spec)
            for w in workers:
                if self.holds.change(w, hold, payload["state"] == "trip"):
                    self.take_out(w)
                else:
                    self.put_back(w)

    def _discovered(self, payload: dict, hold: str) -> list[str]:
        """A scope no static target maps: on a trip, the gateway's workers on the scope's GPU
        (:class:`~fusebox.fuse.discovery.GpuWorkers`; raises its ResolveError), those another hold
        already took out included (the gateway listed them then); on a release, the workers this
        (action, scope) holds (whatever the attribution says by then)."""
        assert self.discovery is not None
        if payload["state"] != "trip":
            return self.holds.held_by(hold)
        return self.discovery.workers(payload["scope"], [*self.worker_urls(), *self.holds.held_by(None)])

    def worker_urls(self) -> list[str]:
        """The gateway's own worker URLs."""
        raise NotImplementedError

    def take_out(self, worker: str) -> None:
        raise NotImplementedError

    def put_back(self, worker: str) -> None:
        raise NotImplementedError

    def listed(self) -> set[str]:
        """The worker URLs in the gateway's own rotation (one read). Raises ActionError."""
        raise NotImplementedError

    def observe(self, payloads) -> list[bool]:
        """:class:`fusebox.fuse.actions.Observable`: one read of the gateway's worker list."""
        listed = self.listed()
        return [all((t.worker_url not in listed) == (p["state"] == "trip" or self.holds.held(t.worker_url))
                    for t in targets_for(self.spec, p["scope"]) if t.worker_url) for p in payloads]

    def _req(self, method: str, path: str, **kw) -> httpx.Response:
        url = self.url + path
        try:
            return self._client.request(method, url, **kw)
        except httpx.HTTPError as e:
            raise _call_error(url, e) from None

    def _check(self, r: httpx.Response, ok: tuple[int, ...] = ()) -> None:
        if not (200 <= r.status_code < 300 or r.status_code in ok):
            raise ActionError(f"{r.request.method} {r.request.url}: HTTP {r.status_code} {answer_text(r)}", r.status_code)


class SglangGateway(_Rotation):
    """The SGLang Model Gateway's ``/workers`` API (sglang-router 0.3)."""

    kind = "sglang_gateway"

    def workers(self) -> list[dict]:
        """The gateway's own worker list (``GET /workers``: ``{"workers": [{"id", "url", ...}]}``)."""
        r = self._req("GET", "/workers")
        self._check(r)
        return list(r.json().get("workers", []))

    def worker_urls(self) -> list[str]:
        return [str(w.get("url", "")).rstrip("/") for w in self.workers() if w.get("url")]
    def listed(self) -> set[str]:
        return {str(w.get("url", "")).rstrip("/") for w in self.workers()}

    def take_out(self, worker: str) -> None:
        for w in self.workers():
            if w.get("url", "").rstrip("/") == worker:
                self.holds.record(worker, {k: w[k] for k in WORKER_SETTINGS if k in w and w[k] is not None})
                r = self._req("DELETE", f"/workers/{quote(str(w['id']), safe='')}")
                self._check(r, ok=(404,))  # 404: removed meanwhile
        # not listed: already out of rotation (idempotent)

    def put_back(self, worker: str) -> None:
        if any(w.get("url", "").rstrip("/") == worker for w in self.workers()):
            return  # already in rotation
        settings = self.holds.settings(worker)
        r = self._req("POST", "/workers", json={**settings, "url": worker})
        self._check(r)


class VllmRouter(_Rotation):
    """The vLLM router's ``/add_worker``, ``/remove_worker`` and ``/list_workers`` (vllm-router 0.1)."""

    kind = "vllm_router"

    def workers(self) -> list[str]:
        """The router's own worker URLs (``GET /list_workers``: ``{"urls": [...]}``)."""
        r = self._req("GET", "/list_workers")
        self._check(r)
        return [u.rstrip("/") for u in r.json().get("urls", [])]

    def worker_urls(self) -> list[str]:
        return self.workers()
    def listed(self) -> set[str]:
        return set(self.workers())

    def take_out(self, worker: str) -> None:
        self._check(self._req("POST", "/remove_worker", params={"url": worker}))

    def put_back(self, worker: str) -> None:
        if worker in self.workers():
            return
        r = self._req("POST", "/add_worker", params={"url": worker})
        if r.status_code == 400 and "already exists" in r.text:
            return
        self._check(r)


class HaproxyRuntime:
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
        self.spec = spec
        self.name = f"haproxy:{spec.name}"
        self.label = spec.name
        self.max_attempts: int | None = spec.max_attempts
        self.socket = spec.socket or ""
        self.timeout_s = spec.timeout_s  # one apply() in total, every command of it (call_deadline)
        self.holds = _Holds(self.name)

    def attach(self, store: Any) -> None:
        """Keep the holds in ``store`` (the service calls it)."""
        self.holds.attach(store)

    def wants(self, payload: dict) -> bool:
        return payload["action"] in self.spec.actions

    def command(self, line: str) -> str:
        """Send one runtime-API command (no newline in it), return HAProxy's answer (stripped)."""
        import socket

        if "\n" in line or "\r" in line or ";" in line:
            raise ValueError("one runtime-API command, without newline or ';'")
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

    def apply(self, payload: dict) -> None:
        targets = targets_for(self.spec, payload["scope"])
        if not targets:
            raise _unmapped(self.spec)
        with call_deadline(self.timeout_s):
            self._apply(targets, payload)

    def _apply(self, targets: list[Target], payload: dict) -> None:
        hold = f"{payload['action']} {scope_key(payload['scope'])}"
        on = payload["state"] == "trip"
        for t in targets:
            assert t.server
            if payload["level"] == TEXT_ONLY_LEVEL and self.spec.text_only:
                backend = t.server.split("/", 1)[0]
                self.text_only(backend, self.holds.change(f"map {backend}", hold, on))
                continue
            state = "drain" if self.holds.change(t.server, hold, on) else "ready"
            self._run(f"set server {t.server} state {state}")

    def observe(self, payloads) -> list[bool]:
        """:class:`fusebox.fuse.actions.Observable`: ``show servers state <backend>`` (a server is out
        when its admin state has the drain bit, 0x08) for each backend named, and ``show map``
        for the text-only level; each read once per call. Raises ActionError when HAProxy cannot be
        reached or answers an error (an unknown backend)."""
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
        for p in payloads:
            ok = True
            for t in targets_for(self.spec, p["scope"]):
                assert t.server
                backend = t.server.split("/", 1)[0]
                if p["level"] == TEXT_ONLY_LEVEL and self.spec.text_only:
                    if mapped is None:
                        answer = self.command(f"show map {self.spec.text_only.map}")
                        mapped = {ln.split()[1] for ln in answer.splitlines() if len(ln.split()) >= 3}
                    want = p["state"] == "trip" or self.holds.held(f"map {backend}")
                    ok = ok and (backend in mapped) == want
                else:
                    want = p["state"] == "trip" or self.holds.held(t.server)
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


def _url_value(value: Any) -> str:
    """What an URL template prints for ``{{ value }}``: percent-encoded, '/' included."""
    return quote("" if value is None else str(value), safe="")


class HttpAction:
    """The generic HTTP action of kind ``http`` (see the module's doc).

    Template context: ``scope`` (the target's ``match``: the spec's values), ``target`` (its ``vars``),
    ``action``, ``level``, ``state`` (trip|release), ``decision_id``. Raises at construction
    (OSError) when a headers file cannot be read.
    """

    kind = "http"

    def __init__(self, spec: AdapterSpec):
        self.spec = spec
        self.name = f"http:{spec.name}"
        self.label = spec.name
        self.max_attempts: int | None = spec.max_attempts
        self._url_env = SandboxedEnvironment(finalize=_url_value, autoescape=False)
        self._body_env = SandboxedEnvironment(autoescape=False)
        self.headers = {k: Path(p).read_text(encoding="utf-8").strip() for k, p in spec.headers_files.items()}
        self.timeout_s = spec.timeout_s  # one apply() in total, every target's request (call_deadline)
        self._client = deadline_client(spec.timeout_s)

    def wants(self, payload: dict) -> bool:
        req = self.spec.trip if payload["state"] == "trip" else self.spec.release
        return payload["action"] in self.spec.actions and req is not None

    def render(self, payload: dict, target: Target) -> tuple[str, str, Any]:
        """(method, url, body) for ``target``; raises ActionError (permanent) when the URL leaves the spec's hosts."""
        req = self.spec.trip if payload["state"] == "trip" else self.spec.release
        assert req is not None
        ctx = {"scope": dict(target.match), "target": dict(target.vars), "action": payload["action"],
               "level": payload["level"], "state": payload["state"], "decision_id": payload["decision_id"]}
        url = self._url_env.from_string(req.url).render(ctx)
        try:
            u = urlsplit(url)
            port = u.port or {"http": 80, "https": 443}.get(u.scheme)
        except ValueError:  # a port that is not a number
            u, port = urlsplit(""), None
        hostport = f"{(u.hostname or '').lower()}:{port}"
        if u.scheme not in ("http", "https") or (hostport not in self.spec.hosts and (u.hostname or "").lower() not in self.spec.hosts):
            e = ActionError(f"rendered URL leaves fuse.adapters.{self.spec.name}.hosts ({hostport[:200]}): refused",
                            summary="URL outside the spec's hosts: refused")
            e.permanent = True
            raise e
        return req.method, url, self._body(req.body, ctx)

    def _body(self, body: Any, ctx: dict) -> Any:
        if isinstance(body, str):
            return self._body_env.from_string(body).render(ctx)
        if isinstance(body, dict):
            return {k: self._body(v, ctx) for k, v in body.items()}
        if isinstance(body, list):
            return [self._body(v, ctx) for v in body]
        return body

    def apply(self, payload: dict) -> None:
        targets = targets_for(self.spec, payload["scope"])
        if not targets:
            raise _unmapped(self.spec)
        with call_deadline(self.timeout_s):
            for t in targets:
                self._send(payload, t)

    def _send(self, payload: dict, t: Target) -> None:
        method, url, body = self.render(payload, t)
        headers = {**self.headers, "Idempotency-Key": payload["decision_id"]}
        try:
            r = self._client.request(method, url, headers=headers, **({"json": body} if body is not None else {}))
        except httpx.HTTPError as e:
            raise _call_error(url, e) from None
        if not 200 <= r.status_code < 300:
            raise ActionError(f"{method} {url}: HTTP {r.status_code} {answer_text(r)}", r.status_code)


def build_adapters(specs, prometheus_url: str | None = None) -> list:
    """One adapter per ``spec.adapters`` entry, in order; those that keep holds have ``attach(store)``
    (:class:`fusebox.fuse.service.FuseService` calls it). ``prometheus_url``: where a ``discover``
    without its own ``prometheus`` reads (``--prometheus-url``). Raises OSError (a headers file),
    ValueError (a ``discover`` with no Prometheus URL at all)."""
    kinds = {"sglang_gateway": SglangGateway, "vllm_router": VllmRouter, "haproxy": HaproxyRuntime}
    out: list = []
    for a in specs:
        if a.discover is not None and not a.discover.prometheus:
            if not prometheus_url:
                raise ValueError(f"fuse.adapters.{a.name}.discover names no prometheus: give --prometheus-url "
                                 "(kubernetes.fuse.prometheus_url in the generated Deployment) or discover.prometheus")
            a = replace(a, discover=replace(a.discover, prometheus=prometheus_url.rstrip("/")))
        out.append(HttpAction(a) if a.kind == "http" else kinds[a.kind](a))
    return out
