"""What every local feature selector shares: its answer (:class:`Selection`), its base class
(:class:`Selector`, a scikit-learn selector) and the input checks.

The selectors themselves live in :mod:`fedtab.election.selectors` (the built-in ones and the
name → class table :data:`~fedtab.election.selectors.SELECTORS`) and in modules of their own
(:mod:`~fedtab.election.lasso_cv`, :mod:`~fedtab.election.markov_blanket`,
:mod:`~fedtab.election.sequential_attention`), which build on this module only; the table in
:mod:`~fedtab.election.selectors` lists them, so no selector module imports the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.feature_selection import SelectorMixin

from ..learn.models import STEP_OVERHEAD, Cost

__all__ = ["Selection", "Selector", "check_xy", "is_regression", "is_regression_target"]


@dataclass(frozen=True)
class Selection:
    """A selector's answer: ``mask`` ``(d,)`` bool and ``scores`` ``(d,)`` float, and for a
    selector built on a statistical test, ``pvalues`` ``(d,)`` in [0, 1] (else ``None``;
    ``consensus="stouffer"`` elections need them, see :mod:`fedtab.election.evidence`)."""

    mask: np.ndarray
    scores: np.ndarray
    pvalues: np.ndarray | None = None


def is_regression(y: np.ndarray, task: str) -> bool:
    """Whether ``y`` is a regression target under ``task`` (``"auto"``, ``"classification"`` or
    ``"regression"``; ``ValueError`` for any other)."""
    if task == "regression":
        return True
    if task == "classification":
        return False
    if task != "auto":
        raise ValueError(f"task must be 'auto', 'classification' or 'regression', got {task!r}")
    y = np.asarray(y)
    return y.dtype.kind == "f" and np.unique(y).size > max(20, int(0.05 * y.size))


def is_regression_target(y: Any) -> bool:
    """Whether ``task="auto"`` reads ``y`` as a continuous target (float, many distinct values)."""
    return is_regression(y, "auto")


def check_xy(X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` as ``(n, d)`` float64 and ``(n,)`` arrays; ``ValueError`` for other shapes, fewer than
    2 rows or no feature, NaN or inf in ``X``."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (rows × features), got shape {X.shape}")
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise ValueError(f"y must be 1-D with {X.shape[0]} entries, got shape {y.shape}")
    if X.shape[0] < 2 or X.shape[1] < 1:
        raise ValueError(f"need at least 2 rows and 1 feature to select, got {X.shape}")
    if not np.isfinite(X).all():
        raise ValueError("X contains NaN or inf; impute missing values before selecting")
    return X, y


class Selector(SelectorMixin, BaseEstimator):
    """Base class: subclasses keep their constructor arguments as given and implement
    :meth:`select`; :meth:`fit` stores its answer as ``support_`` / ``scores_``."""

    name = "selector"

    def select(self, X: Any, y: Any) -> Selection:  # pragma: no cover - interface
        raise NotImplementedError

    def cost(self, n_rows: int, n_features: int) -> Cost:
        """What :meth:`select` on ``(n_rows, n_features)`` costs, estimated before it runs
        (:class:`~fedtab.learn.models.Cost`). The default: a hundred passes over the table."""
        return Cost(100.0 * n_rows * n_features + STEP_OVERHEAD, float(n_rows * n_features), "rows × features")

    def fit(self, X: Any, y: Any) -> "Selector":
        """Run :meth:`select` and keep ``support_`` ``(d,)`` bool and ``scores_`` ``(d,)`` float
        (and ``pvalues_`` for a selector built on a test).

        Raises:
            ValueError: as :meth:`select` (shapes, NaN/inf, fewer than 2 rows).
        """
        from sklearn.utils.validation import validate_data

        validate_data(self, X, skip_check_array=True, reset=True)  # n_features_in_, feature_names_in_
        sel = self.select(X, y)
        self.support_ = np.asarray(sel.mask, dtype=bool)
        self.scores_ = np.asarray(sel.scores, dtype=np.float64)
        if sel.pvalues is not None:
            self.pvalues_ = np.asarray(sel.pvalues, dtype=np.float64)
        return self

    def _get_support_mask(self) -> np.ndarray:
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "support_")
        return self.support_

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        return tags

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params(deep=False).items())
        return f"{type(self).__name__}({args})"
