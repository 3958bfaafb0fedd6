"""Losses of histogram boosting: intercepts from pooled label sums, gradients, validation sums.

Margins are ``(n, K)`` float32 arrays (``K = 1`` for binary and regression, ``K =
n_classes`` for softmax); gradients and hessians are float32 like XGBoost's
``GradientPair`` and computed with the same formulas (``binary:logistic``:
``g = p − y``, ``h = max(p(1−p), 1e-16)``; ``multi:softprob``: ``g = p_k − [y = k]``,
``h = max(2 p_k (1 − p_k), 1e-16)``; ``reg:squarederror``: ``g = m − y``, ``h = 1``).

The intercept is XGBoost ≥ 3.1's estimate, computed from sums a site can release
(:func:`label_sums`): the label mean for binary (as a probability) and regression, and
``ln f_k − mean_k ln f_k`` of the class frequencies for multiclass.
"""

from __future__ import annotations

import numpy as np

from .params import GBDTParams

__all__ = ["label_sums", "base_margin", "gradients", "loss_sums", "metric_from_sums", "transform", "METRICS"]

_EPS = np.float32(1e-16)
_RT_EPS = 1e-6
#: the validation metric of each objective (XGBoost's default eval metric).
METRICS = {"binary": "logloss", "multiclass": "mlogloss", "regression": "rmse"}


def _labels(params: GBDTParams, y: np.ndarray) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"labels must be a 1-d array, got shape {y.shape}")
    if params.objective == "regression":
        out = y.astype(np.float64)
        if not np.isfinite(out).all():
            raise ValueError("regression labels must be finite")
        return out
    if y.size and (not np.all(np.equal(np.mod(y, 1), 0)) or y.min() < 0 or y.max() >= params.n_classes):
        raise ValueError(f"labels must be class indices 0..{params.n_classes - 1}")
    return y.astype(np.int64)


def label_sums(params: GBDTParams, y: np.ndarray) -> np.ndarray:
    """What a site releases for the intercept: ``[Σy, n]`` (binary, regression) or the
    ``(n_classes,)`` class counts (multiclass), float64. Sums over sites pool exactly.

    Raises:
        ValueError: labels that do not fit the objective.
    """
    t = _labels(params, y)
    if params.objective == "multiclass":
        return np.bincount(t, minlength=params.n_classes).astype(np.float64)
    return np.array([float(t.sum()), float(t.size)])


def base_margin(params: GBDTParams, pooled_sums: np.ndarray) -> np.ndarray:
    """``(K,)`` float32 starting margins from the pooled :func:`label_sums` (or ``base_score``).

    Raises:
        ValueError: the sums have the wrong shape, are negative or count no rows.
    """
    s = np.asarray(pooled_sums, dtype=np.float64)
    k = params.n_classes if params.objective == "multiclass" else 2
    if s.shape != (k,) or not np.isfinite(s).all():
        raise ValueError(f"pooled label sums must be {k} finite numbers, got shape {s.shape}")
    n = s.sum() if params.objective == "multiclass" else s[1]
    if n <= 0 or (params.objective != "regression" and (s < 0).any()):
        raise ValueError("pooled label sums count no rows (or are negative)")
    if params.objective == "multiclass":
        freq = (s / n).astype(np.float32)
        logf = np.log(np.maximum(freq, np.float32(_RT_EPS)))
        return (logf - logf.mean(dtype=np.float32)).astype(np.float32)
    mean = float(s[0] / n) if params.base_score is None else float(params.base_score)
    if params.objective == "regression":
        return np.array([mean], dtype=np.float32)
    p = np.float32(min(max(mean, _RT_EPS), 1.0 - _RT_EPS))
    return np.array([-np.log(np.float32(1.0) / p - np.float32(1.0))], dtype=np.float32)


def _sigmoid32(m: np.ndarray) -> np.ndarray:
    x = np.minimum(-m, np.float32(88.7))
    return (np.float32(1.0) / (np.exp(x) + np.float32(1.0) + _EPS)).astype(np.float32)


def _softmax32(m: np.ndarray) -> np.ndarray:
    # XGBoost's softmax: the max starts at the smallest positive float, the sum is double
    wmax = np.maximum(m.max(axis=1, keepdims=True), np.finfo(np.float32).tiny)
    e = np.exp(m - wmax)
    wsum = e.astype(np.float64).sum(axis=1, keepdims=True).astype(np.float32)
    return (e / wsum).astype(np.float32)


def gradients(params: GBDTParams, margins: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and hessian ``(n, K)`` float32 of the loss at ``margins`` ``(n, K)``.

    Raises:
        ValueError: shapes that do not match or labels that do not fit the objective.
    """
    m = np.asarray(margins, dtype=np.float32)
    t = _labels(params, y)
    if m.ndim != 2 or m.shape != (t.size, params.n_outputs):
        raise ValueError(f"margins must be ({t.size}, {params.n_outputs}), got {m.shape}")
    if params.objective == "regression":
        g = m - t.astype(np.float32)[:, None]
        return g.astype(np.float32), np.ones_like(g, dtype=np.float32)
    if params.objective == "binary":
        p = _sigmoid32(m)
        return (p - t.astype(np.float32)[:, None]).astype(np.float32), np.maximum(p * (np.float32(1) - p), _EPS)
    p = _softmax32(m)
    h = np.maximum(np.float32(2.0) * p * (np.float32(1.0) - p), _EPS)
    g = p.copy()
    g[np.arange(t.size), t] -= np.float32(1.0)
    return g.astype(np.float32), h.astype(np.float32)


def transform(params: GBDTParams, margins: np.ndarray) -> np.ndarray:
    """Predictions from ``(n, K)`` margins (float64): ``(n, 2)`` probabilities for binary,
    ``(n, C)`` for multiclass, ``(n,)`` values for regression."""
    z = np.asarray(margins, dtype=np.float64)
    if params.objective == "regression":
        return z[:, 0]
    if params.objective == "binary":
        p1 = 0.5 * (1.0 + np.tanh(0.5 * z[:, 0]))
        return np.column_stack([1.0 - p1, p1])
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def loss_sums(params: GBDTParams, margins: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``[loss sum, n]`` (float64) of the validation metric on these rows: log-loss summed
    over rows (binary, multiclass; probabilities clipped at 1e-16 as XGBoost) or the squared
    error sum (regression). Sums over sites pool exactly; :func:`metric_from_sums` scores them."""
    t = _labels(params, y)
    z = np.asarray(margins, dtype=np.float64)
    if z.shape != (t.size, params.n_outputs):
        raise ValueError(f"margins must be ({t.size}, {params.n_outputs}), got {z.shape}")
    if params.objective == "regression":
        return np.array([float(((z[:, 0] - t) ** 2).sum()), float(t.size)])
    p = transform(params, z)
    picked = p[np.arange(t.size), t] if params.objective == "multiclass" else np.where(t == 1, p[:, 1], p[:, 0])
    return np.array([float(-np.log(np.maximum(picked, 1e-16)).sum()), float(t.size)])


def metric_from_sums(params: GBDTParams, sums: np.ndarray) -> float:
    """The pooled validation metric (:data:`METRICS`) of pooled :func:`loss_sums`.

    Raises:
        ValueError: no rows.
    """
    s = np.asarray(sums, dtype=np.float64)
    if s.shape != (2,) or not np.isfinite(s).all() or s[1] <= 0 or s[0] < 0:
        raise ValueError(f"validation sums must be [loss sum >= 0, n > 0], got {s.tolist()}")
    value = s[0] / s[1]
    return float(np.sqrt(value) if params.objective == "regression" else value)
