"""What a distributed engine's server runs: the *server app* its run configuration names.

The Flower ServerApp (:func:`fedtab.engines.flower.make_server_app`) and the FLARE controller
(:class:`fedtab.engines.nvflare.FedtabController`) only move messages. What they run on the
federation is a server app, ``app(federation, run_config, emit) -> result``:

* ``federation``: the engine's :class:`~fedtab.federation.protocol.Federation` of the run's sites;
* ``run_config``: the run configuration as the engine received it (``str`` keys);
* ``emit``: where progress lines go (``None``: the run wants none); an app that reports progress
  may set the federation's ``on_exchange`` hook (both engines' federations have one);
* returns the run's JSON-able result (a ``dict``), which the engine completes with its own keys
  (``engine``, ``seconds_total``, ``bytes``...).

A deployed server process imports its app by name: the run configuration's ``server-app``
(:data:`SERVER_APP_KEY`) is ``"module:function"``, written by whoever builds the run — the job's
side (:data:`fedtab.job.apps.SERVER_APP`, which ``fedtab run`` and :func:`fedtab.job.apps.engine_config`
write), never this package. :func:`load_server_app` accepts only a function of a ``fedtab.``
module (no private or ``__main__`` part) that is declared a server app with :func:`server_app`,
so a run configuration cannot make the server import an arbitrary module or call an arbitrary
function.
"""

from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from ..federation.protocol import FederationError

if TYPE_CHECKING:  # pragma: no cover
    from ..federation.protocol import Federation

__all__ = ["SERVER_APP_KEY", "ServerApp", "load_server_app", "prepare_of", "server_app", "start_prepare",
           "workflow_app"]

#: the run-configuration key naming the server app (``"module:function"``)
SERVER_APP_KEY = "server-app"
#: ``fedtab.<public module path>:<public name>`` (no part starting with ``_``: no ``__main__``, no private module)
_NAME = re.compile(r"fedtab(?:\.[A-Za-z][A-Za-z0-9_]*)+:[A-Za-z][A-Za-z0-9_]*")
_MARK = "__fedtab_server_app__"
_PREPARE = "__fedtab_server_prepare__"


class ServerApp(Protocol):
    """``app(federation, run_config, emit) -> result`` (see the module docstring)."""

    def __call__(self, federation: "Federation", run_config: Mapping[str, Any],
                 emit: Callable[[str], None] | None = None) -> dict[str, Any]: ...


def server_app(fn: Callable[..., dict[str, Any]] | None = None, *,
               prepare: Callable[[Mapping[str, Any]], None] | None = None) -> Any:
    """Declare ``fn`` a server app that a run configuration may name (returns ``fn``, marked).

    ``prepare(run_config)``: optional work the engine may run in a background thread while it
    waits for the sites to connect and name themselves, before it calls the app (e.g. parsing
    the run's plan, whose checks import modules the app would otherwise import between the
    sites' first replies and its first request: :func:`prepare_of`). It must have no effect
    beyond warming the process (imports, caches); its errors are ignored (the app reports them).
    Usable bare (``@server_app``) or with arguments (``@server_app(prepare=...)``).
    """
    def mark(f: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        setattr(f, _MARK, True)
        if prepare is not None:
            setattr(f, _PREPARE, prepare)
        return f

    return mark if fn is None else mark(fn)


def prepare_of(app: Any) -> Callable[[Mapping[str, Any]], None] | None:
    """The ``prepare`` a server app was declared with (:func:`server_app`), or ``None``."""
    fn = getattr(app, _PREPARE, None)
    return fn if callable(fn) else None


def start_prepare(app: Any, run_config: Mapping[str, Any]) -> Callable[[], None]:
    """Run ``app``'s ``prepare(run_config)`` in a daemon thread; returns ``join()``, which waits for it
    (at once when the app declared none). The thread's errors are swallowed: ``prepare`` only warms."""
    import threading

    prepare = prepare_of(app)
    if prepare is None:
        return lambda: None

    def run() -> None:
        try:
            prepare(dict(run_config))
        except Exception:  # noqa: BLE001 - warming only: the app itself reports a bad run config
            pass

    thread = threading.Thread(target=run, name="fedtab-server-prepare", daemon=True)
    thread.start()
    return thread.join


def load_server_app(name: Any) -> ServerApp:
    """The server app a run configuration's :data:`SERVER_APP_KEY` value ``name`` names.

    Raises:
        FederationError: ``name`` missing or not ``"fedtab.<module>:<function>"`` with public parts,
            its module cannot be imported, or it names no function declared with :func:`server_app`.
    """
    where = f"run config {SERVER_APP_KEY!r}"
    if name in (None, ""):
        raise FederationError(f"{where} is missing: it names the server app as 'module:function' (fedtab run writes "
                              "it, see fedtab.job.apps.engine_config)")
    if not isinstance(name, str) or len(name) > 200 or not _NAME.fullmatch(name):
        raise FederationError(f"{where} must be 'fedtab.<module>:<function>' with public names, got {str(name)[:80]!r}")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FederationError(f"{where}: cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attr, None)
    if not callable(app) or getattr(app, _MARK, False) is not True:
        raise FederationError(f"{where}: {name!r} is not a server app (a function declared with "
                              "fedtab.engines.server_apps.server_app)")
    return app


def workflow_app(workflow: Callable[["Federation", Mapping[str, Any]], dict[str, Any]]) -> ServerApp:
    """A server app running ``workflow(federation, run_config)``, a workflow that is not a job (tests,
    a curious server): with ``emit``, one progress line per exchange (no rounds, no estimate)."""

    def app(federation: "Federation", run_config: Mapping[str, Any],
            emit: Callable[[str], None] | None = None) -> dict[str, Any]:
        if emit is not None:
            from .progress import ProgressLog

            federation.on_exchange = ProgressLog(None, emit=emit).exchange  # type: ignore[attr-defined]
        return workflow(federation, run_config)

    return app
