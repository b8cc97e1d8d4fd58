"""Persistence: the breaker's state, an outbox of actions to apply, an append-only audit log.

One interface, two databases (:func:`open_store` picks by URL):

* :class:`Store` -- SQLite, one file (``fuse.sqlite`` in ``--state-dir``, or ``sqlite:///path``), WAL
  journal, ``synchronous=FULL``; one replica. A new file is created with mode 0600 (its -wal and -shm
  files follow it).
* :class:`PgStore` -- PostgreSQL (``postgresql://user@host:port/db``, psycopg 3); any number of
  replicas share it.

A decision is on disk, with the actions it needs, before the webhook answers 200, so a crash or
restart loses none and repeats none. Every change of the breaker runs in one *exclusive* transaction
(:meth:`Store.change`: SQLite ``BEGIN IMMEDIATE``; PostgreSQL ``SELECT ... FOR UPDATE`` of the
``breaker_version`` row), which reads
the state's ``version`` first: a replica whose copy is older takes back what changed since its
version before deciding, so two replicas never decide the same thing twice. Tables (schema version 5):

* ``schema_version(version, applied_at)``: the migrations applied (:data:`SCHEMA_VERSION` the
  newest); run at start-up, idempotent, safe when replicas start together (under the same lock).
* ``meta(key, value)``: ``breaker_version`` = how many times the breaker's state was written (its
  row's lock serialises the changes on PostgreSQL; migrations take an advisory lock),
  ``state_horizon`` = the version below which rows of removed scopes were purged (a replica older
  than that reads the whole state again). Before version 5, ``breaker`` held the whole state as one
  JSON snapshot, rewritten on every change.
* ``breaker_state(kind, key, value, version)``: the breaker's state, one row per scope (kind ``s``,
  key the scope key, value its JSON) and per resolved fingerprint (kind ``r``, value ``[startsAt,
  seen]``); a change writes only the rows it touched, with the new ``version``; a removed scope or
  fingerprint keeps its row with value NULL for a while, so that other replicas learn it is gone
  (:meth:`Store.changes_since`).
* ``outbox(seq, decision_id, adapter, payload, received, status, attempts, last_error, applied_at,
  idem_key, claimed_by, lease_until, claim_gen)``: one row per decision and adapter; ``status`` is
  ``pending``, ``applied`` or ``failed`` (given up, see :mod:`fusebox.fuse.adapters.gateway`). ``idem_key``
  (unique with ``adapter``) names the decision by what it changes: ``trip|release``, scope, level and
  the trip's time, so the same change is never queued twice. A replica *claims* a row before it
  calls the adapter (:meth:`Store.claim`: ``claimed_by``, ``lease_until`` in Unix seconds); others
  leave it alone until the lease ends, then take it over (its claimer died). Every claim adds one
  to ``claim_gen`` (the *fencing token*): a result is recorded (:meth:`Store.mark_applied`,
  ``mark_given_up``, ``mark_failed``) only by the replica that holds the row's latest claim, so a
  replica whose call outlived its lease cannot record it over the one that took the row over.
  Leases are on the database's clock with PostgreSQL (:meth:`Store.now`), the host's with SQLite.
* ``audit(seq, at, kind, decision_id, scope_key, level, action, source, reason, detail)``: append-only
  (triggers reject UPDATE and DELETE; on PostgreSQL TRUNCATE too). Retention
  (:meth:`Store.prune_audit`, ``fusebox fuse audit prune``): rows leave it only after their export,
  through a prune recorded in the append-only ``audit_prune(seq, at, through_seq, row_count, sha256,
  export)`` and in a ``pruned`` audit row; from the first prune on, the delete trigger lets a row go
  only when a recorded prune covers its ``seq``.
* ``adapter_state(adapter, worker, holds, settings)``: what the spec's adapters keep between calls
  (:mod:`fusebox.fuse.adapters`), shared by every replica: per adapter (``<kind>:<name>``) and
  worker (a worker URL, an HAProxy ``<backend>/<server>`` or ``map <backend>``), ``holds`` = the
  JSON list of the (action, scope) holding it out, ``settings`` = the JSON object of the settings
  recorded when it was taken out (SGLang's priority, cost...). :meth:`Store.adapter_hold` changes a
  hold under the row's lock (``SELECT ... FOR UPDATE`` on PostgreSQL).

Errors: :class:`StoreError` when the database cannot be written or reached (disk full, locked, the
server down): a retry may help. :attr:`Store.health` (:class:`Health`) follows whether it answers,
logging one line when it is lost and one when it is back; :meth:`Store.ping`,
:meth:`Store.probe_write` and :meth:`Store.free_bytes` serve ``/readyz``. SQLite's WAL is
checkpointed every :data:`WAL_AUTOCHECKPOINT_PAGES` pages and cut back to :data:`WAL_LIMIT_BYTES`.

Modules: :mod:`.base` (what both databases share: transactions, the breaker's state, readiness,
the migration runner), :mod:`.outbox` (claims, results, the adapters' state), :mod:`.audit_log`
(the audit's reads and retention), :mod:`.sqlite` and :mod:`.postgres` (each database's
connection and locks), :mod:`.migrations` (the schema, written once over :mod:`.dialect`'s column
types), :mod:`.health` and :mod:`.errors`.
"""


from __future__ import annotations

from .base import PURGE_EVERY as PURGE_EVERY
from .base import Head
from .errors import NoStoreError, StoreError, store_label
from .health import Health
from .health import local_clock as local_clock
from .migrations import SCHEMA_VERSION
from .postgres import CLOCK_REFRESH_S as CLOCK_REFRESH_S
from .postgres import PgStore
from .sqlite import HEADROOM_BYTES, WAL_AUTOCHECKPOINT_PAGES, WAL_LIMIT_BYTES, Store
from .sqlite import SHM_RESERVE_BYTES as SHM_RESERVE_BYTES
from .sqlite import STATE_FILE as STATE_FILE
from .sqlite import default_state_dir as default_state_dir

__all__ = ["Store", "PgStore", "StoreError", "NoStoreError", "Head", "Health", "open_store", "SCHEMA_VERSION", "store_label",
           "WAL_AUTOCHECKPOINT_PAGES", "WAL_LIMIT_BYTES", "HEADROOM_BYTES"]

def open_store(url: str, existing: bool = False) -> Store:
    """The store a ``--store`` URL names: ``sqlite:///abs/path`` (or ``sqlite:////abs/path``),
    ``sqlite://rel/path`` or a plain path
    (SQLite), ``postgresql://`` / ``postgres://`` (PostgreSQL). ``existing``: open a store that is
    already there only (its file, its schema), never create one.

    Raises:
        ValueError: another scheme.
        NoStoreError: ``existing`` and no fuse store there (nothing created).
        StoreError: the database cannot be opened or migrated.
    """
    if url.startswith(("postgresql://", "postgres://")):
        return PgStore(url, existing=existing)
    if url.startswith("sqlite://"):
        path = url[len("sqlite://"):]
        path = "/" + path.lstrip("/") if path.startswith("/") else path  # sqlite:////abs as SQLAlchemy writes it too
        return Store(path, existing=existing)
    if "://" in url:
        raise ValueError(f"--store {store_label(url)}: unknown scheme -- use sqlite:///path/fuse.sqlite or "
                         "postgresql://user@host:port/db")
    return Store(url, existing=existing)
