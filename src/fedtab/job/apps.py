"""The job's server app: what a distributed engine's server runs for a job, handed over by name.

The engines only move messages (:mod:`fedtab.engines.server_apps`); the job builds what their
server runs: :func:`server_app` reads the job plan from the run configuration's ``job`` and runs
the job's one step loop (:func:`fedtab.job.workflow.engine_workflow`), with the progress lines of
:class:`~fedtab.engines.progress.ProgressLog` when the engine asks for them. The job's side writes
the run configuration (:func:`engine_config`: ``fedtab run`` for Flower in process, on a SuperLink
and for FLARE), naming this app in its ``server-app`` key (:data:`SERVER_APP`), which the Flower
ServerApp and the FLARE controller import in their own process.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from ..engines.server_apps import SERVER_APP_KEY, server_app as declare_server_app
from ..federation.protocol import Federation

__all__ = ["SERVER_APP", "engine_config", "server_app"]


def _prepare(run_config: Mapping[str, Any]) -> None:
    """Import the job's step loop and parse the run's plan (no scikit-learn or pandas: a named selector is
    checked against :mod:`fedtab.election.selector_specs`): the engine runs this while the sites connect
    (:func:`~fedtab.engines.server_apps.server_app`)."""
    from . import workflow  # noqa: F401 - the step loop and its steps, imported here rather than after the hello
    from .spec import spec_from_plan

    spec_from_plan(run_config.get("job") or "")


@declare_server_app(prepare=_prepare)
def server_app(federation: Federation, run_config: Mapping[str, Any],
               emit: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the job of ``run_config["job"]`` (the plan, JSON text or a dict) on ``federation``.

    With ``emit``, the run's progress lines go there (:class:`~fedtab.engines.progress.ProgressLog`:
    the plan's exchanges first, then one per exchange, through the federation's ``on_exchange``).

    Returns:
        :func:`~fedtab.job.workflow.engine_workflow`'s result (with the ``plan`` it ran).

    Raises:
        JobError: no ``job`` in the run config, or an invalid plan. As :func:`~fedtab.job.workflow.run_workflow`.
    """
    from .workflow import engine_workflow

    if emit is None:
        return engine_workflow(federation, run_config)
    from ..engines.progress import ProgressLog
    from .exchange_plan import exchange_plan
    from .spec import JobError, spec_from_plan

    try:
        spec = spec_from_plan(run_config.get("job") or "")
    except JobError:
        spec = None  # engine_workflow reports the bad plan itself
    progress = ProgressLog(None if spec is None else exchange_plan(spec), emit=emit)
    federation.on_exchange = progress.exchange  # type: ignore[attr-defined]
    progress.estimate(len(federation.sites))
    return engine_workflow(federation, run_config, progress=progress.step)


#: the run configuration's name of :func:`server_app` (``"module:function"``)
SERVER_APP = f"{__name__}:{server_app.__name__}"


def engine_config(plan: Mapping[str, Any] | str, **engine_keys: Any) -> dict[str, Any]:
    """The run configuration of the job ``plan`` (:meth:`~fedtab.job.spec.JobSpec.plan`) on a distributed
    engine: ``job`` (the plan as JSON text: FLARE takes a dict with a ``name`` key for a component),
    ``server-app`` (:data:`SERVER_APP`) and the engine's own keys (``min-sites``, ``site-keys``...)."""
    text = plan if isinstance(plan, str) else json.dumps(plan)
    return {"job": text, SERVER_APP_KEY: SERVER_APP, **engine_keys}
