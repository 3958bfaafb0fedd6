"""The training workflow's ``"gbdt"`` model: :func:`run_gbdt` with a :class:`TrainingOutcome`.

:func:`fedtab.federation.workflows.training.run_training` hands a ``"gbdt"`` model here, so the job,
the pipeline and the engines get boosted trees without wiring of their own. The outcome's
``params`` are the model's arrays (:meth:`~fedtab.learn.gbdt.GBDTModel.to_arrays`: numbers
only), ``mean``/``std`` are 0/1 (trees need no standardisation; missing cells stay missing),
``rounds`` the rounds kept, ``traffic`` one row per exchange with its payload bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtab.learn.models import GradientBoostedTreesModel, make_model
from fedtab.federation.protocol import Federation
from fedtab.federation.workflows.gbdt.server import dp_plan, run_gbdt
from fedtab.federation.workflows.training.outcome import TrainingOutcome, historic_scores

__all__ = ["is_gbdt", "train_gbdt", "training_dp_plan"]


def is_gbdt(model: Any) -> bool:
    """Whether a training ``model`` spec names the boosted trees."""
    name = model.get("name") if isinstance(model, dict) else model
    return isinstance(model, GradientBoostedTreesModel) or name == GradientBoostedTreesModel.name


def train_gbdt(federation: Federation, features: list[str] | None, model: Any, *, seed: int = 0,
               described: Any = None, train_part: str = "train", score_bins: int | None = None,
               **settings: Any) -> Any:
    """:func:`run_gbdt` for :func:`~fedtab.federation.workflows.training.run_training` (same arguments).

    ``train_part="train"`` lets :func:`run_gbdt` choose (``"fit"``/``"validation"`` with early
    stopping); ``seed`` is mixed into the sites' subsampling streams; ``described`` (the
    election's description) only supplies the features when none are given; ``settings``:
    ``eval_part``, ``min_sites``, ``on_error`` (:class:`~.server.GBDTRunOptions` fields).

    Raises:
        TypeError: a setting that is not a :class:`~.server.GBDTRunOptions` field.
    """
    fm = make_model(model)
    params = {**fm.get_params(), "seed": int(fm.get_params().get("seed", 0)) + int(seed)}
    if features is None and described is not None and getattr(described, "features", None):
        features = list(described.features)
    out = run_gbdt(federation, features, params=params, train_part=None if train_part == "train" else train_part,
                   score_bins=score_bins, **settings)
    pooled, per_site = historic_scores(out.metrics)
    d = len(out.features)
    traffic = [{"round": e["round"], "step": e["step"], "level": e["level"], "nodes": e["nodes"],
                "bytes_down": e["bytes_down"], "bytes_up": e["bytes_up"]} for e in out.exchanges]
    return TrainingOutcome(
        model=fm.name, params=out.model.to_arrays(), features=out.features, classes=out.classes, mean=np.zeros(d),
        std=np.ones(d), pooled=pooled, per_site=per_site,
        history=[{"round": r, "validation_loss": v} for r, v in enumerate(out.history)],
        n_params=int(out.model.tree_ptr[-1]), bytes_down=sum(t["bytes_down"] for t in traffic),
        bytes_up=sum(t["bytes_up"] for t in traffic), traffic=traffic, rounds=out.model.n_rounds, metrics=out.metrics,
        local_epochs=0, seed=int(seed), model_spec={"name": fm.name, "params": out.params.to_dict()},
        participation=out.participation, dropped=out.dropped, robust=federation.options.robust,
        left_out={s: f"gbdt: hessian share {v:.3g} capped" for s, v in out.left_out.items()}, privacy=out.privacy,
        importance=out.importance,
        task="regression" if out.params.objective == "regression" else "binary" if len(out.classes) <= 2
        else "multiclass")


def training_dp_plan(fm: Any) -> tuple[dict[str, int], dict[str, float]]:
    """The DP plan of a boosted-trees training run (:func:`~fedtab.federation.workflows.gbdt.server.dp_plan`):
    releases per depth level, not per FedAvg round."""
    params = fm.gbdt_params()
    return dp_plan(params, params.early_stopping_rounds is not None)
