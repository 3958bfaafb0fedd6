"""The trainer registry: models that a training run hands to a workflow of their own.

:func:`~fedtab.federation.workflows.training.run_training` trains every model of
:mod:`fedtab.learn.models` by FedAvg rounds (or one exact round) unless a trainer is registered
for the model's name: then the trainer runs the whole training — boosted trees grow level by
level from summed histograms (:mod:`fedtab.federation.workflows.gbdt`). A trainer is declared
here by its home module and function names and imported when a run needs it, so the training
workflow imports no other workflow (and a trainer's module may import the training workflow's
outcome and steps).

A trainer's ``train(federation, features, model, *, seed, train_part, eval_part, score_bins,
min_sites, on_error, described[, bounds]) -> TrainingOutcome`` has :func:`run_training`'s arguments
(``bounds``, the public data dictionary, only when the run has one); its
``dp_plan(fm) -> (releases per step, noise scale per step)`` is its DP accountant's plan.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Trainer", "TRAINERS", "register_trainer", "trainer_for", "model_name"]


@dataclass(frozen=True)
class Trainer:
    """A model trained by a workflow of its own.

    Attributes:
        model: the model's name (``{"name": ...}`` of a job's model spec).
        home: the module that defines ``train`` and ``dp_plan``.
        train_name / dp_plan_name: the functions' names in ``home``.
    """

    model: str
    home: str
    train_name: str
    dp_plan_name: str

    def _function(self, name: str) -> Callable[..., Any]:
        return getattr(importlib.import_module(self.home), name)

    @property
    def train(self) -> Callable[..., Any]:
        """The trainer's training function (its module imported on first use)."""
        return self._function(self.train_name)

    @property
    def dp_plan(self) -> Callable[..., Any]:
        """The trainer's DP plan: ``dp_plan(fm) -> (releases per step, noise scale per step)``."""
        return self._function(self.dp_plan_name)


#: model name -> its trainer
TRAINERS: dict[str, Trainer] = {}


def register_trainer(trainer: Trainer) -> Trainer:
    """Declare ``trainer`` for its model name.

    Raises:
        ValueError: another trainer is declared for that model.
    """
    if TRAINERS.get(trainer.model, trainer) != trainer:
        raise ValueError(f"a trainer for the model {trainer.model!r} is already declared")
    TRAINERS[trainer.model] = trainer
    return trainer


def model_name(model: Any) -> str | None:
    """The name of a model spec: a name, a ``{"name": ...}`` dict or a model object's ``name``."""
    if isinstance(model, str):
        return model
    if isinstance(model, dict):
        name = model.get("name")
        return name if isinstance(name, str) else None
    name = getattr(model, "name", None)
    return name if isinstance(name, str) else None


def trainer_for(model: Any) -> Trainer | None:
    """The trainer declared for ``model``'s name, or ``None`` (FedAvg / one exact round)."""
    name = model_name(model)
    return TRAINERS.get(name) if name is not None else None


register_trainer(Trainer("gbdt", "fedtab.federation.workflows.gbdt.training", "train_gbdt", "training_dp_plan"))
