"""Adapters built from the spec's ``fuse.adapters`` (:mod:`fusebox.spec.adapters`).

Each follows :class:`fusebox.fuse.adapters.protocol.Adapter`: ``name`` (the outbox key: ``<kind>:<name>``),
``label`` (the spec's name: metrics, audit, status page), ``wants(call)``, ``apply(call)`` (a :class:`fusebox.fuse.control.ControlCall`),
``max_attempts``. Every call goes through the service's outbox, retried per (adapter, scope) lane.

Scope -> target: a target applies to a decision's scope when its ``match`` labels all equal the
scope's (the scope may carry more), or when every scope label is in ``match`` with the same value
(a broader scope, e.g. a cluster, covers the targets inside it). A scope no target applies to is
refused: :class:`~fusebox.fuse.adapters.protocol.ActionError` (permanent), audited as failed, and no label
value of it is sent anywhere. Only the spec's values (``match``, ``worker_url``, ``vars``) reach a
gateway; label values of the alert never do.

* :class:`SglangGateway`: the SGLang Model Gateway (``sglang-router``). Trip = take the target's
  worker out of rotation (``GET /workers`` to find its id and record its settings, then
  ``DELETE /workers/{id}``); release = ``POST /workers`` with the URL and the recorded settings
  (priority, cost, model_id, worker_type...). Idempotent: a worker already out (or already in) is
  left as it is. A closed control plane (smg ``--control-plane-api-keys``): the spec's
  ``credentials_file`` holds the key, sent as ``Authorization: Bearer`` (also by :class:`VllmRouter`).
* :class:`VllmRouter`: the vLLM router (``vllm-router``, a fork of it): ``POST /remove_worker?url=``
  and ``POST /add_worker?url=`` (its API takes the URL only: there are no settings to keep).
* :class:`HaproxyRuntime`: HAProxy's runtime API on its stats socket: ``set server <backend>/<server>
  state drain`` on a trip, ``state ready`` on release; level 2 (text-only fallback) sets the map
  entry ``<backend> 1`` (``set map``, or ``add map`` when absent) and deletes it on release
  (``del map``); the generated ``haproxy/fusebox.cfg`` reads that map.
* :class:`HttpAction`: method, URL and JSON body per (trip, release) as Jinja2 templates rendered
  in :class:`jinja2.sandbox.SandboxedEnvironment`; every value an URL template prints is
  percent-encoded; the URL must reach one of the spec's ``hosts``; headers are read from files.

What the target itself shows (``observe``, :class:`fusebox.fuse.adapters.protocol.Observable`, for the
service's reconciler): the SGLang gateway's ``GET /workers``, the vLLM router's ``GET
/list_workers``, HAProxy's ``show servers state`` and ``show map``. :class:`HttpAction` cannot
report (an arbitrary API): it is not reconciled.

A worker stays out of rotation while any (action, scope) that took it out is still tripped: the
adapter keeps these *holds* (and the recorded settings) in the service's store (table
``adapter_state``, :mod:`fusebox.fuse.store`) once :meth:`attach`-ed to it (the service does that),
so a restart keeps them and replicas sharing a PostgreSQL store see the same ones; in memory before.

Modules: :mod:`.base` (scope -> target, holds, the rotation base class), one per kind
(:mod:`.sglang_gateway`, :mod:`.vllm_router`, :mod:`.haproxy`, :mod:`.http`) and :mod:`.factory`
(:func:`build_adapters`). The names below are re-exported here: import them from this package.
"""

from __future__ import annotations

from .base import targets_for
from .factory import build_adapters
from .haproxy import HaproxyRuntime
from .http import HttpAction
from .sglang_gateway import WORKER_SETTINGS, SglangGateway
from .vllm_router import VllmRouter

__all__ = ["SglangGateway", "VllmRouter", "HaproxyRuntime", "HttpAction", "targets_for", "build_adapters", "WORKER_SETTINGS"]
