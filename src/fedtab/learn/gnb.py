"""Gaussian Naive Bayes with exact federated aggregation.

A site's "update" is not a parameter vector but its sufficient statistics: per class
the row count ``(C,)``, the per-feature sum ``(C, d)`` and sum of squares ``(C, d)``.
Summing them over sites and turning the sums into means/variances gives exactly the
model :class:`sklearn.naive_bayes.GaussianNB` fits on the pooled rows (up to float
rounding), so one round is enough.

``var_smoothing`` has scikit-learn's meaning: ``epsilon = var_smoothing · max_j var(X_j)``
(the variance of each feature over *all* pooled rows, every class together) is added
to every per-class variance. The pooled variance is itself recovered exactly from the
summed statistics.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .models import STEP_OVERHEAD, Cost, FederatedModel, Params

__all__ = ["GaussianNBModel", "gnb_statistics", "gnb_from_statistics"]

_STATS = ("count", "sum", "sumsq")


def gnb_statistics(X: np.ndarray, y: np.ndarray, n_classes: int) -> Params:
    """Per-class sufficient statistics of one site.

    Args:
        X: ``(n, d)`` float, no NaN. y: ``(n,)`` class indices in ``0..n_classes-1``.

    Returns:
        ``{"count": (C,), "sum": (C, d), "sumsq": (C, d)}`` as float64.

    Raises:
        ValueError: shapes disagree or a label is out of range.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise ValueError(f"X must be (n, d) and y (n,), got {X.shape} and {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise ValueError(f"labels must be in 0..{n_classes - 1}")
    onehot = np.zeros((len(y), n_classes))
    onehot[np.arange(len(y)), y] = 1.0
    return {"count": onehot.sum(axis=0), "sum": onehot.T @ X, "sumsq": onehot.T @ (X * X)}


def gnb_from_statistics(stats: Params, var_smoothing: float = 1e-9) -> Params:
    """Model parameters from (summed) statistics: ``theta``, ``var`` ``(C, d)``, ``log_prior`` ``(C,)``.

    Classes with no rows get prior 0 (``log_prior = -inf`` is replaced by a very
    negative finite number so the parameters stay serialisable) and unit variance.

    Raises:
        ValueError: no rows at all, or negative counts.
    """
    count = np.asarray(stats["count"], dtype=np.float64)
    s = np.asarray(stats["sum"], dtype=np.float64)
    q = np.asarray(stats["sumsq"], dtype=np.float64)
    n = count.sum()
    if n <= 0 or (count < 0).any():
        raise ValueError("GaussianNB needs at least one row and non-negative class counts")
    safe = np.maximum(count, 1.0)[:, None]
    theta = s / safe
    var = np.maximum(q / safe - theta**2, 0.0)
    total_mean = s.sum(axis=0) / n
    total_var = np.maximum(q.sum(axis=0) / n - total_mean**2, 0.0)
    epsilon = var_smoothing * (total_var.max() if total_var.size else 0.0)
    var = var + epsilon
    empty = count == 0
    var[empty] = 1.0
    var[var <= 0] = np.finfo(np.float64).tiny  # all-constant data with var_smoothing=0
    with np.errstate(divide="ignore"):
        log_prior = np.where(empty, -1e300, np.log(count / n))
    return {"theta": theta, "var": var, "log_prior": log_prior}


class GaussianNBModel(FederatedModel):
    """Gaussian Naive Bayes, aggregated exactly (``exact = True``: one round suffices).

    ``local_update`` ignores the incoming parameters and returns the site's
    statistics (see :func:`gnb_statistics`); ``aggregate`` sums them and returns the
    pooled model. What a site sends up is ``C·(2d + 1)`` numbers; nothing has to be
    sent down before the round.

    Args:
        var_smoothing: scikit-learn's ``var_smoothing`` (see module docstring).
    """

    name = "gnb"
    exact = True

    def __init__(self, var_smoothing: float = 1e-9):
        if var_smoothing < 0:
            raise ValueError("var_smoothing must be non-negative")
        self.var_smoothing = var_smoothing

    def init(self, n_features: int, n_classes: int, seed: int = 0) -> Params:
        if n_classes < 2:
            raise ValueError(f"GaussianNB needs at least 2 classes, got {n_classes}")
        return {"theta": np.zeros((n_classes, n_features)), "var": np.ones((n_classes, n_features)),
                "log_prior": np.full(n_classes, -np.log(n_classes))}

    def update_template(self, n_features: int, n_classes: int) -> dict[str, tuple[int, ...]]:
        return {"count": (n_classes,), "sum": (n_classes, n_features), "sumsq": (n_classes, n_features)}

    def cost(self, n_features: int, n_classes: int, n_rows: int = 1, epochs: int = 1) -> Cost:
        """One pass over the rows (sums per class), whatever ``epochs``."""
        size = float(n_classes * (2 * n_features + 1))
        return Cost(3.0 * n_rows * n_features + STEP_OVERHEAD, size, "rows × features")

    def local_update(self, params: Params, X: np.ndarray, y: np.ndarray, *, epochs: int = 1, seed: int = 0) -> Params:
        n_classes = len(params["log_prior"]) if "log_prior" in params else int(np.max(y)) + 1
        return gnb_statistics(X, y, n_classes)

    def aggregate(self, updates: Sequence[tuple[Params, int]]) -> Params:
        """Sum the sites' statistics and return the pooled parameters.

        Raises:
            ValueError: no updates, or statistics with different names/shapes.
        """
        if not updates:
            raise ValueError("GaussianNB aggregation needs at least one site")
        total = {k: np.zeros_like(np.asarray(updates[0][0][k], dtype=np.float64)) for k in _STATS}
        for stats, _ in updates:
            if set(stats) != set(_STATS):
                raise ValueError(f"GaussianNB update must hold {_STATS}, got {sorted(stats)}")
            for k in _STATS:
                v = np.asarray(stats[k], dtype=np.float64)
                if v.shape != total[k].shape:
                    raise ValueError(f"statistic {k!r} has shape {v.shape}, expected {total[k].shape}")
                total[k] += v
        return gnb_from_statistics(total, self.var_smoothing)

    def joint_log_likelihood(self, params: Params, X: np.ndarray) -> np.ndarray:
        """``(n, C)`` log p(x, c), as scikit-learn's ``_joint_log_likelihood``."""
        theta, var = params["theta"], params["var"]
        const = -0.5 * np.sum(np.log(2.0 * np.pi * var), axis=1)
        quad = ((X[:, None, :] - theta[None]) ** 2 / var[None]).sum(axis=2)
        return params["log_prior"][None, :] + const[None, :] - 0.5 * quad

    def predict_proba(self, params: Params, X: np.ndarray) -> np.ndarray:
        jll = self.joint_log_likelihood(params, X)
        from scipy.special import logsumexp  # here, not at import: scipy.special costs ~0.5 s per process

        return np.exp(jll - logsumexp(jll, axis=1, keepdims=True))

    def predict(self, params: Params, X: np.ndarray) -> np.ndarray:
        return np.argmax(self.joint_log_likelihood(params, X), axis=1)
