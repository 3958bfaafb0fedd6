"""What a job's steps produce, step by step (:class:`Outputs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["Outputs", "RESULT_KEYS", "SELECTION_KEYS"]

#: the step sections of a job's result, each ``None`` until (unless) its step runs
RESULT_KEYS = ("sites", "schema", "imputation", "tuning", "election", "training", "baselines", "all_columns")
#: the sections a selection (``[election] tune = "cv"``) adds, from ``SelectionOutcome.result_sections()``
SELECTION_KEYS = ("selection", "metrics_from", "contributions", "measured", "local_only")


@dataclass
class Outputs:
    """The outputs so far of one run of :func:`fedtab.job.workflow.run_workflow`.

    Attributes:
        result: the JSON-able sections of ``result.json`` (:data:`RESULT_KEYS`, then
            ``steps``, ``privacy``, ``trust``, ``participation`` and ``model``; after a
            selection also :data:`SELECTION_KEYS`).
        outcomes: the workflows' own outcome objects by step (``SelectionOutcome``, ``ElectionOutcome``,
            ``TrainingOutcome``, ``ImputationResult``, ``TuneOutcome``, ``PooledScoreTest``),
            for callers in this process (the estimators, the commands).
        features: the columns the next step works on (after encoding, then the selected
            ones); ``None`` = whatever the sites hold (no profile was asked for).
        ranges / integer: pooled coarse range per encoded column and the integer columns
            (from the profile; what imputed values are clipped to and rounded).
        freedom_degree: the election's (tuned or given).
        described: the training's description gathered by the election's ``set_mask``.
        ballots: ballots to elect from instead of gathering them (a sweep over freedom
            degrees reuses the first run's, see ``fedtab demo``).
        imputer: the model file's imputer section, once imputation ran.
        privacy: the DP reports (:meth:`PrivacyLedger.report`): ``"imputation"``'s, and
            ``"run"``, the run's accountant that pays for the election and training steps.
        accountant: whether the run's accountant is planned (:func:`fedtab.job.guarantees.use_run_accountant`).
        ridden_baselines: the local baselines asked ahead on the first Newton iteration
            (:func:`fedtab.federation.steps.baselines.ride_baselines`), or ``None``.
        hooks: the caller's callbacks; ``"imputation"``: ``fn(round, rounds, info)``.
        newton_ahead: the first Newton iteration asked on the election's ``set_mask``
            (:func:`fedtab.job.steps.training.ride_first_iteration`), or ``None``.
        newton_ballot: the Newton iteration at zero over every candidate column asked on the ballot
            (:func:`fedtab.job.steps.training.ride_ballot_iteration`), or ``None``.
    """

    result: dict[str, Any] = field(default_factory=lambda: dict.fromkeys(RESULT_KEYS))
    outcomes: dict[str, Any] = field(default_factory=dict)
    features: list[str] | None = None
    ranges: dict[str, list[float]] = field(default_factory=dict)
    integer: list[str] = field(default_factory=list)
    freedom_degree: float | None = None
    described: dict[str, Any] | None = None
    ballots: list[Any] | None = None
    imputer: dict[str, Any] | None = None
    privacy: dict[str, Any] = field(default_factory=dict)
    accountant: bool = False
    hooks: dict[str, Callable[..., Any]] = field(default_factory=dict)
    ridden_baselines: Any = None
    newton_ahead: Any = None
    newton_ballot: Any = None
