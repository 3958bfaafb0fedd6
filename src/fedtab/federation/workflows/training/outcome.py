"""What a training run returns (:class:`TrainingOutcome`), whichever trainer ran it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from fedtab.learn.models import Params

__all__ = ["TrainingOutcome", "historic_scores"]


@dataclass
class TrainingOutcome:
    """Result of :func:`run_training`.

    Attributes:
        params: final global parameters.
        features / classes: the columns and agreed class labels the model uses.
        mean / std: the global standardisation the sites applied.
        pooled: weighted_f1, macro_f1, accuracy over all sites' test rows.
        per_site: the same per site.
        history: per evaluated round, ``{"round", **pooled metrics}``.
        n_params: trainable parameters; bytes_down / bytes_up: traffic of the fit rounds
            (round 1's requests include the setup they carry: features, classes, mean/std).
        traffic: per round and site ``{"round", "site", "bytes_down", "bytes_up",
            "params_down", "params_up"}`` (bytes measured on the wire when the engine
            logs traffic, params counted from the messages).
        rounds: rounds actually run (1 for exact-aggregation models).
        metrics: ``{"pooled", "per_site"}`` of the final evaluation with every metric of
            :func:`fedtab.learn.metrics.evaluation_scores` (F1, accuracy, confusion matrix,
            Brier score and, for two classes, AUROC / PR-AUC with their error bounds).
        local_epochs / seed / model_spec: the settings used (``model_spec`` is the
            ``{"name", "params"}`` the sites built the model from; baselines repeat them).
        participation: per exchange ``{"step", "sites"}``: the sites whose reply was used.
        dropped: ``{site: reason}`` of sites left out during this run.
        robust: whether the robust reducers were used (see :func:`run_training`).
        left_out: ``{site: reason}`` of the sites whose statistics robust mode left out
            of a pooled sum (``"describe: ..."``, ``"fit round r: ..."``).
        privacy: with DP, the run accountant's bill so far: ``{"epsilon", "delta",
            "noise_multiplier", "steps": {step: ε}, "total", "releases"}``.
        importance: boosted trees only, feature importance by gain pooled and per site
            (:func:`fedtab.federation.workflows.gbdt.server.importance_step`); None for other models.
    """

    model: str
    params: Params
    features: list[str]
    classes: list[str]
    mean: np.ndarray
    std: np.ndarray
    pooled: dict[str, float]
    per_site: dict[str, dict[str, float]]
    history: list[dict[str, float]] = field(default_factory=list)
    n_params: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    traffic: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    #: Newton–Raphson only: the L2 norm of each iteration's step (standardised coefficients)
    steps: list[float] = field(default_factory=list)
    local_epochs: int = 0
    seed: int = 0
    model_spec: dict[str, Any] = field(default_factory=dict)
    participation: list[dict[str, Any]] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    robust: bool = False
    left_out: dict[str, str] = field(default_factory=dict)
    privacy: dict[str, Any] | None = None
    importance: dict[str, Any] | None = None
    #: ``"binary"``, ``"multiclass"`` or ``"regression"`` (:func:`training_task`)
    task: str = "binary"
    #: logistic regression only: the solver that ran (``"newton"`` or ``"fedavg"``; ``None`` for other models)
    solver: str | None = None
    #: why a logistic model asked for Newton–Raphson trained by FedAvg (a run mode Newton does not serve:
    #: DP, robust; or a model too wide), ``None`` when it ran as asked
    solver_reason: str | None = None


def historic_scores(detail: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """The historic ``pooled`` / ``per_site`` dicts (F1, macro F1, accuracy, rows) of a full evaluation
    (a regression evaluation: RMSE, MAE, R², rows)."""
    keep = ("rmse", "mae", "r2", "n") if "rmse" in detail["pooled"] else ("weighted_f1", "macro_f1", "accuracy", "n")
    return ({k: detail["pooled"].get(k) for k in keep},
            {s: {k: m.get(k) for k in keep} for s, m in detail["per_site"].items()})
