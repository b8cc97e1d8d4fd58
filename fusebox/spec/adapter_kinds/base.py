"""What every adapter kind provides, and the helpers the kinds share.

An adapter kind (``fuse.adapters.<name>.kind``: a gateway or API the fuse acts on) is one module
in this package holding everything the spec knows about it: the fuse levels it can apply, the
checks of its own fields (called by :func:`fusebox.spec.adapters.normalise_adapters` while the
spec loads) and the warnings ``fusebox generate`` prints for it
(:func:`fusebox.generator.outputs.adapter_warnings`). Its runtime class, what calls the gateway,
lives in ``fuse/adapters/`` and is found by the kind's name (``fuse/adapters/factory.py``).
Adding a kind is adding a module and listing it in ``fusebox/spec/adapter_kinds/__init__.py``.

Every check reports through ``err(path, what, fix, key=False)``: ``path`` the spec path as a tuple
(``("fuse", "adapters", name, ...)``), ``what`` the problem, ``fix`` how to fix it; ``key=True``
places the problem on the key rather than its value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlsplit

if TYPE_CHECKING:  # the spec's types, for the signatures only (fusebox.spec.adapters imports this package)
    from fusebox.spec.adapters import Adapter, RawAdapter, RawTarget
    from fusebox.spec.normalised import Spec

__all__ = ["AdapterKind", "Err", "http_url"]

Err = Callable[..., None]  # err(path, what, fix, key=False)


def http_url(value: str) -> bool:
    """Whether ``value`` is an http or https URL with a host (and, if given, a valid port)."""
    try:
        u = urlsplit(value)
        return u.scheme in ("http", "https") and bool(u.hostname) and (u.port or 0) >= 0
    except ValueError:
        return False


class AdapterKind:
    """One adapter kind; the base checks nothing and warns of nothing.

    ``name``: the spec's ``kind``; ``levels``: the fuse levels it can apply (1 freeze admissions,
    2 text-only fallback, 3 KV-cache eviction), an action of any other level is refused at load;
    ``fields``: the ``fuse.adapters.<name>`` fields only this kind may set, in the order they are
    checked (set on another kind: "<field> is for kind <name> only"); ``discovers``: may set
    ``discover`` (GPU and engine scopes -> its workers); ``credentials``: may set
    ``credentials_file`` (a control-plane key); ``credentials_fix``: the fix named when
    ``credentials_file`` is set on this kind although it takes none (None: remove it).
    """

    name: ClassVar[str] = ""
    levels: ClassVar[tuple[int, ...]] = ()
    fields: ClassVar[tuple[str, ...]] = ()
    discovers: ClassVar[bool] = False
    credentials: ClassVar[bool] = False
    credentials_fix: ClassVar[str | None] = None

    def check_adapter(self, a: RawAdapter, name: str, path: tuple, err: Err) -> None:
        """The kind's checks of the adapter as a whole, run right after its actions are checked."""

    def check_target(self, t: RawTarget, path: tuple, err: Err) -> None:
        """The kind's checks of one ``targets`` row (at ``path``), after its ``match``."""

    def check_fields(self, a: RawAdapter, name: str, path: tuple, levels: dict[str, int], err: Err) -> None:
        """The checks of the kind's own :attr:`fields`; ``levels``: fuse action name -> level."""

    def warnings(self, a: Adapter, spec: Spec, prometheus_example: str) -> list[str]:
        """What ``fusebox generate`` warns of for adapter ``a`` of ``spec`` (a loaded Spec), one line
        each; ``prometheus_example``: where kube-prometheus-stack's Prometheus would be for the
        spec's release (the text a missing ``--prometheus-url`` warning suggests)."""
        return []
