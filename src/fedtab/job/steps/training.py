"""Step 6, the training (``[training]``) with the final evaluation on the sites' test rows.

The task is ``[training] task`` or read from the sites (binary, multiclass or regression:
:func:`fedtab.federation.workflows.training.training_task`); a model that cannot serve it is refused
in one line. A regression run reports RMSE, MAE and R² (pooled from each site's sums over its
test part) where a classification run reports F1, accuracy and AUROC.

FedAvg (or exact aggregation) of the model on the selected columns (all columns without a
selection step), then one ``evaluate`` exchange: metrics pooled and per site. Robust mode and
``max_site_share`` come from ``[trust]``, secure aggregation and the step's DP share from
``[privacy]``; a description gathered by the election is reused. The data dictionary's bounds
(``[columns] bounds`` / ``levels``) reach boosted trees as public bounds: those columns are binned
on the equal-width grid of their bounds, without a sketch exchange.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..guarantees import use_run_accountant
from ..outputs import Outputs
from .step import Step

if TYPE_CHECKING:
    from ...federation.protocol import Federation
    from fedtab.federation.workflows.training import TrainingOutcome
    from ..spec import JobSpec

__all__ = ["STEP", "ride_ballot_iteration", "ride_first_iteration", "summary", "train", "wants_baselines"]


def train(federation: "Federation", spec: "JobSpec", out: Outputs, features: list[str] | None,
          described: Any = None, before_rounds: Any = None, ahead: Any = None) -> "TrainingOutcome":
    """:func:`~fedtab.federation.workflows.training.run_training` with the job's model and guarantees
    (robust mode, ``max_site_share`` and secure sums: the run's options; DP: the run's accountant);
    ``before_rounds(setup)`` runs before the first round's exchange; ``ahead``: the first Newton
    iteration asked on the election's ``set_mask`` (:func:`ride_first_iteration`)."""
    from fedtab.federation.workflows.training import run_training

    tr = spec.training
    assert tr is not None
    use_run_accountant(federation, spec, out)
    return run_training(federation, features, model=tr.model, rounds=tr.rounds, local_epochs=tr.local_epochs,
                        seed=spec.run.seed, described=described, task=tr.task,
                        bounds=spec.columns.public_bounds() or None, before_rounds=before_rounds, ahead=ahead)


def summary(tr: "TrainingOutcome") -> dict[str, Any]:
    """The JSON-able ``result["training"]`` of a training outcome (no parameters: they are in the model file)."""
    return {"model": tr.model, "task": tr.task, "rounds": tr.rounds, "local_epochs": tr.local_epochs, "features": list(tr.features),
            "classes": list(tr.classes), "n_params": tr.n_params, "history": tr.history, "metrics": tr.metrics,
            "robust": tr.robust, "left_out": dict(tr.left_out), "privacy": tr.privacy,
            **({"solver": tr.solver, "solver_reason": tr.solver_reason} if tr.solver is not None else {}),
            **({"importance": tr.importance} if tr.importance is not None else {})}


def wants_baselines(spec: "JobSpec", out: Outputs) -> bool:
    if spec.training is None:
        return False
    if getattr(out.outcomes.get("training"), "task", None) == "regression":
        return False  # the local-only baselines score classes; `python -m benchmarks.regression` compares RMSE
    return spec.evaluation.baselines if spec.evaluation.baselines is not None else not spec.privacy.private


def _ride_baselines(federation: "Federation", spec: "JobSpec", out: Outputs) -> Any:
    """``before_rounds`` of the job's training: when the baselines step follows, the local baselines
    ride on the first Newton iteration (:func:`~fedtab.federation.steps.baselines.ride_baselines`;
    the baselines step reuses them when the run converged, else asks again with its budget)."""
    def before(setup: Any) -> None:
        from fedtab.federation.steps.baselines import ride_baselines

        if wants_baselines(spec, out):  # a classification run (setup: the rounds of a classifier)
            out.ridden_baselines = ride_baselines(federation, list(setup["features"]), list(setup["classes"]),
                                                  setup["model"], seed=spec.run.seed)

    return before


def _newton_classes(federation: "Federation", spec: "JobSpec") -> list[str] | None:
    """The sorted class labels when the job trains a classifier next (``None`` otherwise)."""
    from fedtab.federation.protocol.schema import sort_labels

    tr, schema = spec.training, federation.schema
    if tr is None or schema is None or tr.task == "regression":
        return None
    if any(d.target is not None and not d.classes for d in schema.sites.values()):
        return None  # a site reads the target as a number: not a classifier's run
    return sort_labels(schema.classes)


def _profiled(spec: "JobSpec", out: Outputs) -> tuple[list[str], list[str] | None]:
    """``(columns, sorted classes or None)`` from the job's column profile (before a schema is agreed)."""
    from fedtab.federation.protocol.schema import sort_labels

    classes = out.result["schema"].get("classes") or ()
    tr, columns = spec.training, list(out.features or ())
    if tr is None or tr.task == "regression" or len(classes) < 2:
        return columns, None
    return columns, sort_labels([str(c) for c in classes])


def _reference(out: Outputs, features: list[str]) -> Any:
    """``(mean, std)`` ``(d,)`` of ``features`` in the reference standardisation the server holds: the
    imputation's pooled means and standard deviations, else the profile's ranges (centre, half width)."""
    from fedtab.federation.workflows.training.ahead import reference_standardisation

    known = {c: (0.5 * (lo + hi), 0.5 * (hi - lo)) for c, (lo, hi) in out.ranges.items()}
    if out.imputer is not None:
        known.update({c: (m, s) for c, m, s in zip(out.imputer["columns"], out.imputer["mean"], out.imputer["std"])})
    return reference_standardisation(features, known)


def ride_ballot_iteration(federation: "Federation", spec: "JobSpec", out: Outputs) -> Any:
    """``before_ballot`` of the job's election when a classifier is trained next: the Newton iteration
    at zero over every candidate column rides on the ballot
    (:func:`~fedtab.federation.workflows.training.ahead.ride_candidates`: plain runs, candidates within
    the Newton width), over the reference standardisation (:func:`ride_first_iteration` turns its
    elected sub-block into θ1); kept in ``out.newton_ballot``."""
    def before(candidates: list[str] | None) -> None:
        from fedtab.federation.workflows.training.ahead import ride_candidates
        from fedtab.federation.workflows.training.server import NEWTON_MAX_PARAMS

        out.newton_ballot = None
        if candidates is None and federation.schema is None and out.result.get("schema") is not None:
            candidates, classes = _profiled(spec, out)  # the ballot agrees the schema: the profile's columns
        else:
            classes = _newton_classes(federation, spec)
        if classes is None or not candidates:
            return
        assert spec.training is not None
        mean, std = _reference(out, candidates)
        out.newton_ballot = ride_candidates(federation, candidates, classes, spec.training.model, mean=mean, std=std,
                                            max_params=NEWTON_MAX_PARAMS, seed=spec.run.seed)

    return before


def ride_first_iteration(federation: "Federation", spec: "JobSpec", out: Outputs) -> Any:
    """``before_mask`` of the job's election when a classifier is trained next: a Newton iteration of a
    logistic model rides on ``set_mask``
    (:func:`~fedtab.federation.workflows.training.ahead.ride_first_newton`, plain runs only), over the
    reference standardisation the server holds (:func:`_reference`) — at θ1 from the ballot's sums at
    zero (``out.newton_ballot``, :func:`~fedtab.federation.workflows.training.ahead.elected_start`) when
    they were answered by the sites active now, else at the model's start — kept in ``out.newton_ahead``
    for the training step (which uses it only when it trains exactly that setup)."""
    def before(features: list[str]) -> None:
        from fedtab.federation.workflows.training.ahead import elected_start, ride_first_newton, settle

        out.newton_ahead = None
        settle(federation, out.newton_ballot)  # the ballot's sums, checked against the agreed schema
        classes = _newton_classes(federation, spec)
        if classes is None or not features:
            return
        assert spec.training is not None
        mean, std = _reference(out, features)
        theta1 = elected_start(out.newton_ballot, features, classes, mean, std, federation.active)
        out.newton_ahead = ride_first_newton(federation, features, classes, spec.training.model,
                                             mean=mean, std=std, seed=spec.run.seed, theta=theta1)

    return before


def _run(federation: "Federation", spec: "JobSpec", out: Outputs) -> None:
    tr = train(federation, spec, out, out.features, out.described, before_rounds=_ride_baselines(federation, spec, out),
               ahead=out.newton_ahead)
    out.outcomes["training"] = tr
    out.privacy["run"] = tr.privacy
    out.result["training"] = summary(tr)


STEP = Step("training", lambda spec, out: spec.training is not None, _run)
