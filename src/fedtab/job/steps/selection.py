"""The selection step (``[election] tune = "cv"``): honest model selection in place of the
tuning, election and training steps (and of the baselines and all-columns comparison, whose
numbers it measures on the same test rows in its own exchanges).

:func:`fedtab.federation.workflows.selection.select_model` chooses the columns (Feature Election at
every freedom degree of ``[election] grid``, and all columns) and the personalisation by
federated K-fold cross-validation on each site's own folds (pooled log-loss, one-standard-
error rule), refits the choice on every site's training rows and scores it on their test
rows, in ``[training] rounds + 3`` exchanges. The step fills ``result.json``'s sections from
:meth:`~fedtab.federation.workflows.selection.SelectionOutcome.result_sections` (``selection``,
``metrics_from``, ``contributions``, ``measured``, ``local_only``), plus ``election``,
``training``, ``baselines`` (its local-only mode) and ``all_columns`` (the no-election refit),
so the report and the model file read what they read after a plain training.

Plain sums only: :func:`fedtab.job.spec.check_spec` refuses ``tune = "cv"`` with secure
aggregation, DP or robust reducers (``docs/privacy.md`` says why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..outputs import Outputs
from .step import Step

if TYPE_CHECKING:
    from ...federation.protocol import Federation
    from fedtab.federation.workflows.selection import SelectionOutcome
    from ..spec import JobSpec

__all__ = ["STEP", "REPLACES", "replaced", "model_section"]

#: the steps a ``tune = "cv"`` job skips: the selection does their work
REPLACES = ("tuning", "election", "training", "baselines", "all_columns")


def _wanted(spec: "JobSpec", out: Outputs | None = None) -> bool:
    e = spec.election
    return e is not None and e.method == "vote" and e.tune == "cv" and spec.training is not None


#: the steps a regression's ``tune = "cv"`` skips: the training step then fits the linear model
#: on the chosen columns exactly (one round) and writes the model file and the test metrics
REPLACES_REGRESSION = ("tuning", "election")


def _regression(spec: "JobSpec") -> bool:
    """A ``linear`` model: the selection scores squared error (the model serves numbers only)."""
    from ...learn.models import LinearRegressionModel, make_model

    return spec.training is not None and isinstance(make_model(spec.training.model), LinearRegressionModel)


def replaced(spec: "JobSpec") -> tuple[str, ...]:
    """The step names :data:`REPLACES` (:data:`REPLACES_REGRESSION` for a linear model) when
    ``spec`` selects by cross-validation, else ``()``."""
    if not _wanted(spec):
        return ()
    return REPLACES_REGRESSION if _regression(spec) else REPLACES


def _selection_kwargs(spec: "JobSpec") -> dict[str, Any]:
    """The job's settings of :func:`~fedtab.federation.workflows.selection.select_model`, as the
    keyword arguments of a :class:`~fedtab.federation.workflows.selection.SelectionOptions`."""
    e, tr = spec.election, spec.training
    assert e is not None and tr is not None
    kwargs: dict[str, Any] = {
        "model": tr.model, "rounds": tr.rounds, "local_epochs": tr.local_epochs, "contributions": e.contributions,
        "aggregation": e.aggregation, "normalization": e.normalization, "min_holders": spec.trust.min_holders,
        "seed": spec.run.seed,
    }
    for key in ("grid", "modes", "l2_grid"):
        if getattr(e, key) is not None:
            kwargs[key] = tuple(getattr(e, key))
    return kwargs


def _election_section(outcome: "SelectionOutcome") -> dict[str, Any] | None:
    """``result["election"]``: the refit election at the chosen freedom degree, explained per
    column as the election step explains it; ``None`` when all columns won (nothing was elected)."""
    from fedtab.federation.workflows.election.server import elect_from_ballots
    from .election import _jsonable

    el = outcome.election
    ballots = [b for b in outcome.ballots.values() if b is not None]
    if outcome.freedom_degree is None or not ballots:
        return None
    res = elect_from_ballots(ballots, outcome.freedom_degree, el["aggregation"], el["normalization"],
                             min_holders=el.get("min_holders"))
    chosen = {b.site: {n for n, m in zip(b.feature_names or (), b.mask) if m} for b in ballots}
    return {"method": "vote", "tune": "cv", **_jsonable(res.to_dict()), "freedom_degree": outcome.freedom_degree,
            "feature_names": list(el["columns"]), "selected": list(outcome.features), "kept": len(outcome.features),
            "mask": [c in set(outcome.features) for c in el["columns"]],
            "features": [{**f, "chosen_by": [s for s, c in chosen.items() if f["feature"] in c]}
                         for f in _jsonable(res.explain_records())]}


def _run_regression(federation: "Federation", spec: "JobSpec", out: Outputs) -> None:
    """A numeric target: the columns chosen by pooled CV squared error (no test exchange here:
    the training step that follows fits the same least squares on the chosen columns and scores
    it); ``result["selection"]`` holds every candidate's CV RMSE beside its columns."""
    from fedtab.federation.workflows.selection import SelectionOptions, select_model

    kwargs = {k: v for k, v in _selection_kwargs(spec).items() if k not in ("modes", "l2_grid", "contributions")}
    outcome = select_model(federation, SelectionOptions(**kwargs, score_test=False))
    sections = outcome.result_sections()
    out.outcomes["regression_selection"] = outcome
    out.features = list(outcome.features)
    out.freedom_degree = outcome.freedom_degree
    out.result["selection"] = {**sections["selection"], "task": "regression", "cv_rmse": outcome.chosen["rmse"],
                               "all_columns_cv_rmse": outcome.all_columns["rmse"], "exchanges": outcome.exchanges}
    out.result["measured"] = sections["measured"]
    out.result["election"] = _election_section(outcome)


def _run(federation: "Federation", spec: "JobSpec", out: Outputs) -> None:
    from fedtab.federation.workflows.selection import SelectionOptions, select_model

    if _regression(spec):
        _run_regression(federation, spec, out)
        return
    outcome = select_model(federation, SelectionOptions(**_selection_kwargs(spec)))
    sections = outcome.result_sections()
    out.outcomes["selection"] = outcome
    out.features = list(outcome.features)
    out.freedom_degree = outcome.freedom_degree
    for key in ("selection", "metrics_from", "contributions", "measured", "local_only"):
        out.result[key] = sections[key]
    shipped = sections["metrics"][outcome.personalisation]
    out.result["election"] = _election_section(outcome)
    out.result["training"] = {
        "model": outcome.model["model"]["name"], "rounds": outcome.rounds, "local_epochs": outcome.local_epochs,
        "features": list(outcome.features), "classes": list(outcome.model["classes"]),
        "personalisation": outcome.personalisation, "metrics": shipped,
        "metrics_unpersonalised": sections["metrics"]["none"], "metrics_from": sections["metrics_from"],
    }
    if sections["local_only"] is not None:
        out.result["baselines"] = {"local_only": sections["local_only"]}
    out.result["all_columns"] = {"features": list(outcome.model_all_columns["features"]),
                                 "metrics": sections["all_columns"]}


def model_section(out: Outputs) -> dict[str, Any]:
    """The model file's section (:func:`fedtab.job.model_file.write_model`) of a selection: the
    refit model with its per-site personalisation (``personalisation``: ``{"mode", "sites":
    {site: {name: array}}}``; every site is listed, with no arrays in mode ``"none"``)."""
    from .schema import encoded_columns

    outcome = out.outcomes["selection"]
    m = outcome.model
    schema = out.result["schema"] or {"columns": list(m["features"]), "target": None, "classes": list(m["classes"]),
                                      "categorical": [], "categories": {}, "integer_columns": [], "ranges": {}}
    pers = m["personalisation"]
    sites = {s: {} for s in outcome.measured} if pers["mode"] == "none" else pers["sites"]
    return {
        "schema": schema, "encoded_columns": encoded_columns(schema)[0], "imputer": out.imputer,
        "features": list(m["features"]), "classes": list(m["classes"]),
        "mean": np.asarray(m["mean"]).tolist(), "std": np.asarray(m["std"]).tolist(), "model": dict(m["model"]),
        "params": {k: np.asarray(v).tolist() for k, v in m["params"].items()},
        "personalisation": {"mode": pers["mode"], "sites": {s: {k: np.asarray(v).tolist() for k, v in p.items()}
                                                            for s, p in sites.items()}},
    }


STEP = Step("selection", _wanted, _run)
