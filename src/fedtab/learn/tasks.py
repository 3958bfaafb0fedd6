"""What a target column asks for: classes or a number (pure; no engine, no federation).

A site reads its own target with :func:`target_kind` (``"classes"`` or ``"regression"``);
the job then names the task (:data:`TASKS`): ``binary`` / ``multiclass`` (by the number of
classes the sites agree) or ``regression``. :func:`model_refusal` says, in one line, why a
model cannot serve a task (``None`` when it can).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["given_objective", "TASKS", "SITE_KINDS", "MAX_AUTO_CLASSES", "target_kind", "site_kind", "model_refusal",
           "REGRESSION_MODELS", "CLASSIFICATION_MODELS"]

#: the tasks a job may name (``[training] task``)
TASKS = ("binary", "multiclass", "regression")
#: what a site may be told about its target (``auto``: read it from the values)
SITE_KINDS = ("auto", "classes", "regression")
#: a numeric target with more distinct values than this is read as continuous
MAX_AUTO_CLASSES = 20
#: models that predict a number; models that predict a class (GBDT does both, by its objective)
REGRESSION_MODELS = ("linear", "gbdt")
CLASSIFICATION_MODELS = ("logistic", "sgd", "gnb", "mlp", "gbdt")


def target_kind(values: Any) -> str:
    """``"regression"`` or ``"classes"`` for a target's (non-missing) values ``(n,)``.

    Continuous: every value is a finite number and either some value is not an integer (with
    more than two distinct values) or there are more than :data:`MAX_AUTO_CLASSES` distinct
    values (``Length_of_stay`` in days: 79 values). Anything else (strings, booleans, a few
    integer codes) is classes.
    """
    y = np.asarray(values)
    if y.dtype.kind == "b" or y.size == 0:
        return "classes"
    if y.dtype.kind not in "iuf":
        try:
            y = y.astype(np.float64)
        except (TypeError, ValueError):
            return "classes"
    y = y.astype(np.float64)
    if not np.isfinite(y).all():
        return "classes"
    distinct = np.unique(y)
    if distinct.size > MAX_AUTO_CLASSES:
        return "regression"
    if distinct.size > 2 and not np.all(np.equal(np.mod(distinct, 1), 0)):
        return "regression"
    return "classes"


def site_kind(values: Any, told: str = "auto") -> str:
    """The kind a site gives its target: ``told`` unless ``"auto"``, then :func:`target_kind`.

    Raises:
        ValueError: ``told`` is not one of :data:`SITE_KINDS`.
    """
    if told not in SITE_KINDS:
        raise ValueError(f"task must be one of {', '.join(SITE_KINDS)}, got {told!r}")
    return target_kind(values) if told == "auto" else told


def given_objective(spec: Any) -> str | None:
    """The objective a ``{"name": "gbdt", "params": {...}}`` spec (or a GBDT model object) names;
    ``None`` when it names none (the task then chooses it)."""
    if isinstance(spec, dict):
        obj = (spec.get("params") or {}).get("objective")
        return None if obj is None else str(obj)
    params = getattr(spec, "_params", None)
    return getattr(params, "objective", None) if params is not None else None


def model_refusal(model: str, task: str, objective: str | None = None) -> str | None:
    """Why ``model`` (a name; ``objective``: a GBDT's) cannot serve ``task``, in one line; ``None`` if it can."""
    if task == "regression":
        if model == "gbdt" and objective not in (None, "regression"):
            return f"gbdt with objective = {objective!r} predicts classes; the target is continuous (task = " \
                   f"\"regression\"): use objective = \"regression\" or model = \"linear\""
        if model not in REGRESSION_MODELS:
            return f"model {model!r} predicts classes; the target is continuous (task = \"regression\"): use " \
                   f"model = \"linear\" or \"gbdt\""
        return None
    if model == "gbdt" and objective == "regression":
        return f"gbdt with objective = \"regression\" predicts a number; the target has classes (task = {task!r})"
    if model not in CLASSIFICATION_MODELS and model in REGRESSION_MODELS:
        return f"model {model!r} predicts a number; the target has classes (task = {task!r}): use \"logistic\", " \
               f"\"gbdt\", \"gnb\", \"sgd\" or \"mlp\""
    return None
