"""The fuse service: Alertmanager webhook -> tiered circuit breaker on the inference gateway.

Public surface: :class:`Breaker` (pure state machine), :class:`FuseRules`, :func:`parse_payload`,
:class:`FuseService`, :func:`create_app`, the adapters and :class:`ReferenceGateway`.
Heavy imports (FastAPI) stay in :mod:`fusebox.fuse.http.app` and the ``http_*`` modules it wires.
"""

from .intake.breaker import Breaker, Decision, Outcome, OverrideError, ScopeNotFound
from .intake.payload import AlertEvent, Notification, PayloadError, fingerprint, parse_payload
from .rules import FuseRules, Target, scope_key, scope_of

__all__ = [
    "Breaker", "Decision", "Outcome", "OverrideError", "ScopeNotFound",
    "AlertEvent", "Notification", "PayloadError", "fingerprint", "parse_payload",
    "FuseRules", "Target", "scope_key", "scope_of",
]
