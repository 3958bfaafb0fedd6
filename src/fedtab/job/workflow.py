"""The job's one step loop: ``run_workflow(federation, spec) -> Outputs``, on every engine.

Every front door runs this loop: ``fedtab run`` (:func:`fedtab.job.run.run_job`),
``fedtab elect`` / ``impute`` / ``demo``, the estimators' ``fit``, and on a distributed engine
the server side — the Flower ServerApp (:func:`fedtab.engines.flower.make_server_app`) and the
FLARE controller (:class:`fedtab.engines.nvflare.FedtabController`) call
:func:`engine_workflow` with their run config, whose ``job`` key holds the plan
(:meth:`JobSpec.plan` as JSON). The steps (:data:`fedtab.job.steps.STEPS`) run in one order:
schema → categories → imputation (never the label) → tuning → election or score test →
training (and its evaluation) → baselines → all-columns comparison; a step the job does not
need is skipped and costs no exchange. With ``[election] tune = "cv"`` the selection step
(:mod:`fedtab.job.steps.selection`) does the work of tuning, election, training, baselines and
the all-columns comparison, which are skipped. Every step's row in ``result["steps"]`` counts
its exchanges (``federation.exchange_count`` around it: every message round, a secure sum's
included). Nothing here imports an engine.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Mapping

import numpy as np

from ..federation.protocol import Federation
from ..federation.protocol.piggyback import pending
from ..federation.protocol.riders import flush
from .guarantees import apply_options, apply_trust, participation_record, privacy_record, trust_record
from .outputs import Outputs
from .spec import JobError, JobSpec, spec_from_plan
from .steps import STEPS
from .steps.schema import encoded_columns, from_declaration, one_class_participation
from .steps.selection import model_section, replaced

__all__ = ["engine_workflow", "run_workflow"]


def run_workflow(federation: Federation, spec: JobSpec, *, progress: Callable[[str], None] | None = None,
                 outputs: Outputs | None = None) -> Outputs:
    """Run ``spec``'s steps on ``federation``.

    Args:
        spec: a validated job (:func:`~fedtab.job.spec.check_spec`).
        progress: called with each step's name as it starts.
        outputs: outputs to start from (e.g. ``Outputs(ballots=...)`` to elect from ballots
            already gathered, or ``hooks``); a fresh :class:`Outputs` by default.

    Returns:
        The :class:`Outputs`; ``.result`` is JSON-able: the step sections (``sites``,
        ``schema``, ``imputation``, ``tuning``, ``election``, ``training``, ``baselines``,
        ``all_columns``; ``None`` for a step that did not run), ``steps`` (seconds and bytes
        per step), ``privacy``, ``trust``, ``participation`` and, when the job trains,
        ``model`` (what the model file needs). ``docs/job.md`` describes each key.

    Raises:
        FederationError: a site failed or replied something invalid (naming it) beyond what
            the quorum allows, sites whose columns are disjoint, a selection that keeps no column.
        ValueError: settings the sites' data cannot support (e.g. ``min_sites`` above the
            federation's sites).
    """
    say = progress or (lambda _name: None)
    out = outputs if outputs is not None else Outputs()
    apply_trust(federation, spec)
    apply_options(federation, spec)
    rows: list[dict[str, Any]] = []
    spans: list[tuple[str, int, dict[str, str]]] = []
    from_declaration(federation, spec, out)  # a schema this federation agreed before the run
    skipped = replaced(spec)
    for step in STEPS:
        if step.name in skipped or not step.needed(spec, out):
            continue
        say(step.name)
        spans.append((step.name, len(federation.participation), dict(federation.dropped)))
        d0, u0 = federation.traffic.total()
        x0, t0 = federation.exchange_count, time.perf_counter()
        step.run(federation, spec, out)
        d1, u1 = federation.traffic.total()
        rows.append({"step": step.name, "seconds": time.perf_counter() - t0, "bytes_down": d1 - d0,
                     "bytes_up": u1 - u0, "exchanges": federation.exchange_count - x0})
        from_declaration(federation, spec, out)  # without a profile: the schema the sites declared
    if pending(federation):  # requests still waiting for an exchange to ride on: sent now, in one
        d0, u0 = federation.traffic.total()
        x0, t0 = federation.exchange_count, time.perf_counter()
        flush(federation)
        d1, u1 = federation.traffic.total()
        rows.append({"step": "riders", "seconds": time.perf_counter() - t0, "bytes_down": d1 - d0,
                     "bytes_up": u1 - u0, "exchanges": federation.exchange_count - x0})
    out.result["steps"] = rows
    out.result["privacy"] = privacy_record(spec, out.privacy)
    out.result["trust"] = trust_record(spec)
    out.result["participation"] = participation_record(federation, spans)
    one_class_participation(out.result)
    if "selection" in out.outcomes:
        out.result["model"] = model_section(out)
    elif "training" in out.outcomes:
        out.result["model"] = _model(out)
    return out


def _model(out: Outputs) -> dict[str, Any]:
    """Everything the model file needs (:func:`fedtab.job.model_file.write_model`)."""
    from ..learn.models import make_model

    tr = out.outcomes["training"]
    schema = out.result["schema"] or {"columns": list(tr.features), "target": None, "classes": list(tr.classes),
                                      "categorical": [], "categories": {}, "integer_columns": [], "ranges": {}}
    fm = make_model(tr.model_spec or tr.model)
    return {
        "schema": schema,
        "encoded_columns": encoded_columns(schema)[0],
        "imputer": out.imputer,
        "features": list(tr.features),
        "classes": list(tr.classes),
        "mean": np.asarray(tr.mean).tolist(),
        "std": np.asarray(tr.std).tolist(),
        "model": {"name": fm.name, "params": fm.get_params()},
        "params": {k: np.asarray(v).tolist() for k, v in tr.params.items()},
    }


def engine_workflow(federation: Federation, run_config: Mapping[str, Any], *,
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The server side of a distributed engine: the job of ``run_config["job"]`` (the plan as JSON
    text or a dict, see :func:`~fedtab.job.spec.spec_from_plan`) run on ``federation``
    (``progress``: as :func:`run_workflow`'s).

    Returns:
        The JSON-able ``Outputs.result``, with ``plan``: the plan it ran, as received (``fedtab
        attach`` checks its job file against it).

    Raises:
        JobError: no ``job`` in the run config, or an invalid plan. As :func:`run_workflow`.
    """
    plan = run_config.get("job")
    if plan in (None, ""):
        raise JobError("the run config needs job = '<the job plan as JSON>' (JobSpec.plan(); fedtab run writes it, "
                       "see docs/deployment.md)")
    result = run_workflow(federation, spec_from_plan(plan), progress=progress).result
    return {**result, "plan": json.loads(plan) if isinstance(plan, str) else dict(plan)}
