"""The fuse service: the breaker, the store, the dispatcher and the reconciler composed
(:class:`FuseService`, :mod:`.core`), without HTTP; :mod:`.refused` bounds what the audit keeps of
refused and truncated notifications."""

from .core import FuseService, Unavailable

__all__ = ["FuseService", "Unavailable"]
