"""The handler registry: which function answers each declared message kind, and which module holds it.

A workflow module registers its site handlers with ``@handler(kind)`` and its table changes with
``@table_step(kind)`` when it is imported; every kind is declared first, once, in
:mod:`fedtab.federation.protocol.kinds`. :func:`find_handler` imports only the module a request
needs (its declared home), so a process that answers one message (a Flower ClientApp) does not
import every workflow.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping

from fedtab.federation.protocol.kinds import KINDS, TABLE_STEP_HOMES, declared, home_of
from fedtab.federation.protocol.messages import Message
from fedtab.privacy.gate import Releases

if TYPE_CHECKING:
    import pandas as pd

    from fedtab.federation.site.core import Site

__all__ = ["Handler", "HANDLERS", "HANDLER_HOMES", "RELEASES", "TableStep", "TABLE_STEPS", "table_step", "handler",
           "find_handler", "find_releases", "find_table_step"]

log = logging.getLogger("fedtab.site")


Handler = Callable[["Site", Message], Message]


#: kind -> handler; filled by the workflow modules when they are imported (all of them
#: when ``fedtab.federation`` is, or one on demand by :func:`find_handler`). Every kind is
#: declared first in :mod:`fedtab.federation.protocol.kinds`.
HANDLERS: dict[str, Handler] = {}


class _Derived(Mapping[str, Any]):
    """A read-only view of the kind registry (:mod:`fedtab.federation.protocol.kinds`), computed on access:
    a kind declared later (a test's toy kind) is in it too."""

    def __init__(self, build: Callable[[], dict[str, Any]], doc: str) -> None:
        self._build, self.__doc__ = build, doc

    def __getitem__(self, key: str) -> Any:
        return self._build()[key]

    def __iter__(self):  # noqa: ANN204 - a Mapping's iterator
        return iter(self._build())

    def __len__(self) -> int:
        return len(self._build())

    def __repr__(self) -> str:
        return repr(self._build())


def _homes() -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for name, kind in KINDS.items():
        out.setdefault(kind.home, []).append(name)
    for name, home in TABLE_STEP_HOMES.items():
        if name not in out.get(home, []):
            out.setdefault(home, []).append(name)
    return {module: tuple(names) for module, names in sorted(out.items())}


#: kind -> what the handler's reply releases (:class:`fedtab.privacy.gate.Releases`), derived
#: from the declarations; a handler without a declaration is refused (the gate is default-deny).
RELEASES: Mapping[str, Releases] = _Derived(lambda: {n: k.releases for n, k in KINDS.items()},
                                            "kind -> Releases, from fedtab.federation.protocol.kinds")


#: module -> the handler and table-step kinds it registers, derived from the declarations.
#: :func:`find_handler` imports only the module a request needs, so a process that answers one
#: message (a Flower ClientApp) does not import every workflow.
HANDLER_HOMES: Mapping[str, tuple[str, ...]] = _Derived(_homes, "module -> kinds, from fedtab.federation.protocol.kinds")


TableStep = Callable[["Site", dict[str, Any]], "pd.DataFrame"]


#: kind -> ``fn(site, params) -> new table``: changes of a site's table that a workflow
#: agreed (one-hot encoding, imputation). See :meth:`Site.apply_table_step`.
TABLE_STEPS: dict[str, TableStep] = {}


def table_step(kind: str) -> Callable[[TableStep], TableStep]:
    """Register ``fn(site, params) -> table`` as the table change named ``kind``.

    Raises:
        ValueError: ``kind`` is not a declared table step (:func:`fedtab.federation.protocol.kinds.declare_table_step`).
    """
    if kind not in TABLE_STEP_HOMES:
        raise ValueError(f"table step {kind!r} is not declared in fedtab.federation.protocol.kinds")

    def register(fn: TableStep) -> TableStep:
        TABLE_STEPS[kind] = fn
        return fn

    return register


def _registered(registry: dict[str, Any], kind: str) -> Any:
    fn = registry.get(kind)
    home = home_of(kind)
    if fn is None and home is not None:
        try:
            importlib.import_module(home)
        except ImportError as exc:  # e.g. imputation without torch: the caller reports the unknown kind
            log.debug("handler module %s of %r cannot be imported: %s", home, kind, exc)
        fn = registry.get(kind)
    return fn


def find_handler(kind: str) -> Handler | None:
    """The handler registered for ``kind``, importing its workflow module if needed; ``None``
    if there is none."""
    return _registered(HANDLERS, kind)


def find_releases(kind: str) -> Releases | None:
    """The release declaration of ``kind`` (``None``: not declared). Imports nothing."""
    decl = declared(kind)
    return None if decl is None else decl.releases


def find_table_step(kind: str) -> TableStep | None:
    """The table step registered as ``kind``, importing its workflow module if needed."""
    return _registered(TABLE_STEPS, kind)


def handler(kind: str) -> Callable[[Handler], Handler]:
    """Register ``fn(site, request) -> reply`` as the site-side handler for the declared ``kind``.

    Everything about what the replies release is in the declaration
    (:mod:`fedtab.federation.protocol.kinds`), so that it is readable without importing the handler.

    Raises:
        ValueError: ``kind`` is not declared, or another handler is registered for it.
    """
    if declared(kind) is None:
        raise ValueError(f"message kind {kind!r} is not declared in fedtab.federation.protocol.kinds (declare it first)")

    def register(fn: Handler) -> Handler:
        if kind in HANDLERS and HANDLERS[kind] is not fn:
            raise ValueError(f"a handler for {kind!r} is already registered")
        HANDLERS[kind] = fn
        return fn

    return register
