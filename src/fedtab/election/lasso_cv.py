"""Lasso / L1-logistic regression whose strength is chosen by cross-validation on the site."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..learn.models import STEP_OVERHEAD, Cost, count_param, driver
from .selector_base import Selection, Selector, check_xy, is_regression

__all__ = ["LassoCVSelector"]


class LassoCVSelector(Selector):
    """L1 model on standardised X with its strength picked by ``cv``-fold cross-validation.

    Classification: :class:`~sklearn.linear_model.LogisticRegressionCV` (pure L1,
    ``liblinear`` for two classes, ``saga`` otherwise, log-loss scoring) over ``Cs``
    values log-spaced in ``[1e-3, 1e1]``. Regression: :class:`~sklearn.linear_model.LassoCV`.
    Keeps the non-zero coefficients; scores are ``|coef|`` (L2 norm over classes).
    If the chosen strength zeroes every coefficient, the largest one is kept so the
    ballot is never empty.

    Args:
        Cs: number of strengths tried. cv: folds. task, tol, seed: as ``LassoSelector``.
    """

    name = "lasso_cv"

    def __init__(self, Cs: int = 10, cv: int = 3, task: str = "auto", tol: float = 1e-10, seed: int = 0):
        self.Cs = Cs
        self.cv = cv
        self.task = task
        self.tol = tol
        self.seed = seed

    def cost(self, n_rows: int, n_features: int) -> Cost:
        """``Cs`` strengths × (``cv`` folds + the refit) lasso fits of about 100 passes each
        (what the warm-started path takes on the shipped benchmarks' data; its ``max_iter`` of
        5,000 is a bound it does not reach there: ``python -m benchmarks.cost_model``)."""
        cs, cv = count_param(self.Cs, "Cs"), count_param(self.cv, "cv")
        fits = max(cs, 1.0) * (max(cv, 1.0) + 1.0)
        return Cost(fits * (100.0 * n_rows * n_features + STEP_OVERHEAD), float(n_rows * n_features),
                    driver({"Cs": (cs, 10), "cv": (cv, 3)}))

    def select(self, X: Any, y: Any) -> Selection:
        from sklearn.linear_model import LassoCV, LogisticRegressionCV  # lazy: keeps `import fedtab` cheap
        from sklearn.preprocessing import StandardScaler

        X, y = check_xy(X, y)
        Z = StandardScaler().fit_transform(X)
        if is_regression(y, self.task):
            model: Any = LassoCV(alphas=self.Cs, cv=self.cv, random_state=self.seed, max_iter=5000)
        else:
            binary = np.unique(y).size <= 2
            model = LogisticRegressionCV(
                Cs=np.logspace(-3, 1, self.Cs), l1_ratios=(1.0,), cv=self.cv, scoring="neg_log_loss",
                solver="liblinear" if binary else "saga", max_iter=2000 if binary else 500, tol=1e-3,
                random_state=self.seed, use_legacy_attributes=False,
            )
        coef = np.atleast_2d(model.fit(Z, y).coef_)
        scores = np.linalg.norm(coef.reshape(-1, X.shape[1]), axis=0)
        mask = scores > self.tol
        if not mask.any():
            mask[int(np.argmax(scores))] = True
        self.strength_ = float(np.ravel(getattr(model, "C_", getattr(model, "alpha_", np.nan)))[0])
        return Selection(mask, scores)
