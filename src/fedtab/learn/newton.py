"""Newton–Raphson for (multinomial) logistic regression from summed gradients and Hessians.

Federated Newton–Raphson: every site returns, at the server's coefficients ``θ``, the sums over
its rows of the log-loss's gradient and Hessian (:func:`logistic_sums`); the server adds them up
and takes one Newton step on the pooled penalised objective (:func:`newton_update`)

    J(θ) = (1/N) Σ_i logloss_i(θ) + (l2/2)·‖coef‖²,

which is :class:`~fedtab.learn.models.LogisticRegressionModel`'s objective on the pooled rows
(scikit-learn's ``LogisticRegression(C = 1/(l2·N))``: the intercepts are not penalised).
Because the sums are exact, the iterates are those of Newton's method on the pooled rows: the
fit converges quadratically to the pooled maximum-likelihood (MAP) fit itself.

Layout: ``θ`` is ``(k, d + 1)`` — per output (k = 1 for two classes, else one per class) the
``d`` coefficients then the intercept; the gradient is ``θ``'s flattening ``(k·(d+1),)`` and the
Hessian ``(k·(d+1), k·(d+1))`` in the same order.

Differential privacy (:func:`dp_logistic_sums`): each row's gradient is clipped to L2 norm
``clip`` and each row ``[z, 1]`` to L2 norm ``radius`` (from the public bounds), so one replaced
row moves the gradient sum by at most ``2·clip`` and the Hessian sum (positive semi-definite terms)
by at most ``√2·h·radius²`` (``h`` = 1/4 for two classes, 1/2 for more, :func:`hessian_sensitivity`).

Numpy only: nothing here knows about sites, messages or engines.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

__all__ = ["as_theta", "from_theta", "logistic_sums", "dp_logistic_sums", "newton_update", "hessian_sensitivity",
           "restandardise", "row_bound", "sub_block", "NEWTON_TOL", "NEWTON_MAX_ITER"]

#: stop when the Newton step's L2 norm (standardised coefficients) falls below this. The point
#: returned is the one *after* that step: Newton's convergence is quadratic near the optimum of this
#: strongly convex objective, so it is within about ‖step‖² (~1e-8) of the pooled fit — the
#: iteration that would only confirm it is saved (heart job: 5 exchanges instead of 6, 1e-8 off)
NEWTON_TOL = 1e-4
#: the most Newton iterations (exchanges) a fit makes by default
NEWTON_MAX_ITER = 25


def as_theta(params: Mapping[str, np.ndarray]) -> np.ndarray:
    """``(k, d + 1)`` from ``{"coef": (k, d), "intercept": (k,)}``.

    Raises:
        ValueError: shapes that do not match.
    """
    coef = np.asarray(params["coef"], dtype=np.float64)
    b = np.asarray(params["intercept"], dtype=np.float64)
    if coef.ndim != 2 or b.shape != (coef.shape[0],):
        raise ValueError(f"logistic parameters of shapes {coef.shape} and {b.shape} do not match")
    return np.concatenate([coef, b[:, None]], axis=1)


def from_theta(theta: np.ndarray) -> dict[str, np.ndarray]:
    """``{"coef", "intercept"}`` from ``(k, d + 1)``."""
    theta = np.asarray(theta, dtype=np.float64)
    return {"coef": theta[:, :-1].copy(), "intercept": theta[:, -1].copy()}


def _residuals(theta: np.ndarray, Xb: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(p, p - target)`` ``(n, k)``: predicted probabilities (of class 1 when k = 1) and residuals."""
    k = theta.shape[0]
    z = Xb @ theta.T
    if k == 1:
        p = 0.5 * (1.0 + np.tanh(0.5 * z))  # the logistic function without overflow
        return p, p - y[:, None].astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=1, keepdims=True)
    return p, p - np.eye(k)[y]


def _hessian(p: np.ndarray, Xb: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """``Σ_i w_i (diag(p_i) - p_i p_iᵀ) ⊗ x_i x_iᵀ`` (k = 1: ``Σ_i w_i p_i(1-p_i) x_i x_iᵀ``)."""
    n, k = p.shape
    m = Xb.shape[1]
    w = np.ones(n) if weights is None else weights
    if k == 1:
        s = (p[:, 0] * (1.0 - p[:, 0]) * w)
        return (Xb * s[:, None]).T @ Xb
    H = np.empty((k * m, k * m))
    for a in range(k):
        for b in range(a, k):
            s = p[:, a] * ((1.0 if a == b else 0.0) - p[:, b]) * w
            block = (Xb * s[:, None]).T @ Xb
            H[a * m:(a + 1) * m, b * m:(b + 1) * m] = block
            H[b * m:(b + 1) * m, a * m:(a + 1) * m] = block.T
    return H


def _checked_inputs(theta: Any, X: Any, y: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(theta, X, y)`` as float64 ``(k, d + 1)``, float64 ``(n, d)`` and int64 ``(n,)``.

    Raises:
        ValueError: ``X`` and ``y`` that do not fit the coefficients.
    """
    theta = np.asarray(theta, dtype=np.float64)
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    if X.ndim != 2 or X.shape[1] != theta.shape[1] - 1 or len(y) != len(X):
        raise ValueError(f"logistic sums: X of shape {X.shape} and {len(y)} labels do not fit coefficients {theta.shape}")
    return theta, X, y


def logistic_sums(theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The log-loss's gradient and Hessian summed over the rows, at ``theta``.

    Args:
        theta: ``(k, d + 1)`` (:func:`as_theta`). X: ``(n, d)`` standardised features, no NaN.
        y: ``(n,)`` class indices ``0..C-1`` (C = 2 when k = 1, else C = k).

    Returns:
        ``(grad (k·(d+1),), hess (k·(d+1), k·(d+1)))`` (no penalty: the server adds it).

    Raises:
        ValueError: shapes that do not match, or a label outside the classes.
    """
    theta, X, y = _checked_inputs(theta, X, y)
    k, m = theta.shape
    if len(y) and (y.min() < 0 or y.max() >= max(k, 2)):
        raise ValueError("logistic sums: a label outside the classes")
    Xb = np.concatenate([X, np.ones((len(X), 1))], axis=1)
    if not len(y):
        return np.zeros(k * m), np.zeros((k * m, k * m))
    p, r = _residuals(theta, Xb, y)
    return (r.T @ Xb).ravel(), _hessian(p, Xb)


def hessian_sensitivity(k: int, radius: float) -> float:
    """L2 (Frobenius) sensitivity of the Hessian sum under the replacement of one row whose
    ``[z, 1]`` has L2 norm ≤ ``radius``: each row's term ``A ⊗ x xᵀ`` (``A = diag(p) − ppᵀ``) is
    positive semi-definite with Frobenius norm ``‖A‖_F·‖x‖² ≤ h·radius²`` — ``h`` = 1/4 for k = 1;
    for more classes ``0 ≤ A ≤ diag(p)``, so ``‖A‖_F² ≤ max(p)·tr(A) ≤ max(p)(1 − max(p)²) < 1/2``:
    ``h`` = 1/√2 — and two PSD terms differ by at most ``√2`` times that."""
    h = 0.25 if k == 1 else 1.0 / math.sqrt(2.0)
    return math.sqrt(2.0) * h * float(radius) ** 2


def row_bound(lo: np.ndarray, hi: np.ndarray, mean: np.ndarray, std: np.ndarray) -> float:
    """L2 bound of a standardised row ``[z, 1]`` whose raw values lie in ``[lo, hi]`` (a missing
    value is the mean: ``z = 0``): ``√(1 + Σ_j max(|lo_j − μ_j|, |hi_j − μ_j|)² / σ_j²)``."""
    lo, hi, mean, std = (np.asarray(a, dtype=np.float64) for a in (lo, hi, mean, std))
    far = np.maximum(np.abs(lo - mean), np.abs(hi - mean)) / np.where(std > 0, std, 1.0)
    return float(math.sqrt(1.0 + float((far * far).sum())))


def dp_logistic_sums(theta: np.ndarray, X: np.ndarray, y: np.ndarray, *, clip: float, radius: float
                     ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`logistic_sums` with each row's gradient clipped to L2 norm ``clip`` and each row
    ``[z, 1]`` scaled to L2 norm ≤ ``radius`` before its Hessian term (no noise: the caller adds
    ``N(0, (z·2·clip)²)`` to the gradient and ``N(0, (z·hessian_sensitivity)²)``, symmetric, to the
    Hessian).

    Raises:
        ValueError: as :func:`logistic_sums`; ``clip`` or ``radius`` not positive.
    """
    if not clip > 0 or not radius > 0:
        raise ValueError("DP logistic sums need a positive clip and row radius")
    theta, X, y = _checked_inputs(theta, X, y)
    k, m = theta.shape
    if not len(y):
        return np.zeros(k * m), np.zeros((k * m, k * m))
    Xb = np.concatenate([X, np.ones((len(X), 1))], axis=1)
    p, r = _residuals(theta, Xb, y)
    x_norm = np.linalg.norm(Xb, axis=1)
    g_norm = np.linalg.norm(r, axis=1) * x_norm  # ‖r_i ⊗ x_i‖
    g_factor = np.minimum(1.0, clip / np.maximum(g_norm, 1e-300))
    grad = ((r * g_factor[:, None]).T @ Xb).ravel()
    h_factor = np.minimum(1.0, radius / np.maximum(x_norm, 1e-300))
    return grad, _hessian(p, Xb * h_factor[:, None])


def newton_update(theta: np.ndarray, grad: np.ndarray, hess: np.ndarray, n: float, l2: float, *,
                  min_curvature: float = 0.0) -> tuple[np.ndarray, float]:
    """One Newton step on ``J(θ) = (1/n)·Σ logloss + (l2/2)·‖coef‖²`` from summed ``grad``/``hess``.

    Args:
        theta: ``(k, d + 1)`` the point the sums were taken at.
        grad / hess: the sites' summed :func:`logistic_sums` (``(k(d+1),)``, ``(k(d+1),)²``).
        n: the rows behind the sums (> 0). l2: the penalty on the coefficients (not intercepts).
        min_curvature: the smallest eigenvalue kept in the (symmetrised) Hessian of ``J`` — a noisy
            (DP) Hessian can be indefinite; 0 keeps it as it is.

    Returns:
        ``(next θ, ‖step‖₂)``. A singular Hessian (e.g. the softmax's free intercept shift) takes
        the minimum-norm step.

    Raises:
        ValueError: shapes that do not match, non-finite sums or ``n <= 0``.
    """
    theta = np.asarray(theta, dtype=np.float64)
    k, m = theta.shape
    size = k * m
    g = np.asarray(grad, dtype=np.float64).reshape(-1)
    H = np.asarray(hess, dtype=np.float64)
    if g.shape != (size,) or H.shape != (size, size):
        raise ValueError(f"Newton step: gradient {g.shape} and Hessian {H.shape} do not fit coefficients {theta.shape}")
    if not n > 0 or not np.isfinite(g).all() or not np.isfinite(H).all():
        raise ValueError("Newton step: the sums must be finite over a positive number of rows")
    penal = np.zeros((k, m))
    penal[:, :-1] = l2
    p = penal.ravel()
    g_J = g / n + p * theta.ravel()
    H_J = 0.5 * (H + H.T) / n + np.diag(p)
    if min_curvature > 0:
        w, V = np.linalg.eigh(H_J)
        H_J = (V * np.maximum(w, min_curvature)) @ V.T
    step = -np.linalg.lstsq(H_J, g_J, rcond=None)[0]
    return theta + step.reshape(k, m), float(np.linalg.norm(step))


def restandardise(theta: np.ndarray, grad: np.ndarray, hess: np.ndarray, mean_from: np.ndarray, std_from: np.ndarray,
                  mean_to: np.ndarray, std_to: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The point ``theta`` and the :func:`logistic_sums` taken there, all over columns standardised
    with ``(mean_from, std_from)``, rewritten for columns standardised with ``(mean_to, std_to)``.

    A row's ``[z_to, 1] = A·[z_from, 1]`` with ``A = [[diag(s_from/s_to), (μ_from − μ_to)/s_to], [0, 1]]``,
    so the same model is ``θ_to = θ_from·A⁻¹``, its gradient sums ``(I_k ⊗ A)·g`` and its Hessian sums
    ``(I_k ⊗ A)·H·(I_k ⊗ A)ᵀ``: exact for every observed cell. A missing cell is ``z = 0`` in either
    standardisation (the mean of each), so rows with missing cells make the rewritten sums approximate
    (they stand for the value ``μ_from``, not ``μ_to``).

    Args:
        theta: ``(k, d + 1)``. grad: ``(k·(d+1),)``. hess: ``(k·(d+1), k·(d+1))``.
        mean_from / std_from / mean_to / std_to: ``(d,)``; the stds positive.

    Returns:
        ``(theta_to, grad_to, hess_to)`` of the same shapes.

    Raises:
        ValueError: shapes that do not match, or a std that is not positive and finite.
    """
    theta = np.asarray(theta, dtype=np.float64)
    k, m = theta.shape
    d = m - 1
    cols = [np.asarray(a, dtype=np.float64).reshape(-1) for a in (mean_from, std_from, mean_to, std_to)]
    if any(c.shape != (d,) for c in cols):
        raise ValueError(f"restandardise: standardisations of {[c.shape for c in cols]} do not fit coefficients "
                         f"{theta.shape}")
    mu_f, s_f, mu_t, s_t = cols
    if not (np.isfinite(s_f).all() and np.isfinite(s_t).all() and (s_f > 0).all() and (s_t > 0).all()
            and np.isfinite(mu_f).all() and np.isfinite(mu_t).all()):
        raise ValueError("restandardise: means must be finite and stds positive and finite")
    g = np.asarray(grad, dtype=np.float64).reshape(-1)
    H = np.asarray(hess, dtype=np.float64)
    if g.shape != (k * m,) or H.shape != (k * m, k * m):
        raise ValueError(f"restandardise: gradient {g.shape} and Hessian {H.shape} do not fit coefficients {theta.shape}")
    A = np.eye(m)
    A[:d, :d] = np.diag(s_f / s_t)
    A[:d, d] = (mu_f - mu_t) / s_t
    B = np.kron(np.eye(k), A)
    return np.linalg.solve(A.T, theta.T).T, B @ g, B @ H @ B.T


def sub_block(theta: np.ndarray, grad: np.ndarray, hess: np.ndarray, columns: Any
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The point ``theta`` and the :func:`logistic_sums` taken there over ``d`` columns, cut down to the
    columns at positions ``columns`` (and the intercept), per output.

    Exact whenever ``theta``'s coefficients on the columns left out are zero — above all at ``θ = 0``,
    where every logit is 0 whatever the columns (``g = Xᵀ(y − ½)``, ``H = ¼·XᵀX`` with the intercept
    column for two classes): the sums over a column subset are then sub-blocks of those over all columns.

    Args:
        theta: ``(k, d + 1)``. grad: ``(k·(d+1),)``. hess: ``(k·(d+1), k·(d+1))``.
        columns: ``(d',)`` distinct positions in ``0..d-1``, in the order wanted.

    Returns:
        ``(theta' (k, d'+1), grad' (k·(d'+1),), hess' (k·(d'+1), k·(d'+1)))``.

    Raises:
        ValueError: shapes that do not match, a position out of range or repeated, or a left-out column
            with a non-zero coefficient (the cut sums would not be the sums over the kept columns).
    """
    theta = np.asarray(theta, dtype=np.float64)
    if theta.ndim != 2:
        raise ValueError(f"sub_block: coefficients of shape {theta.shape}, expected (k, d + 1)")
    k, m = theta.shape
    d = m - 1
    cols = np.asarray(columns, dtype=np.int64).reshape(-1)
    if len(set(cols.tolist())) != len(cols) or (len(cols) and (cols.min() < 0 or cols.max() >= d)):
        raise ValueError(f"sub_block: column positions must be distinct and within 0..{d - 1}")
    g = np.asarray(grad, dtype=np.float64).reshape(-1)
    H = np.asarray(hess, dtype=np.float64)
    if g.shape != (k * m,) or H.shape != (k * m, k * m):
        raise ValueError(f"sub_block: gradient {g.shape} and Hessian {H.shape} do not fit coefficients {theta.shape}")
    dropped = np.ones(d, dtype=bool)
    dropped[cols] = False
    if np.any(theta[:, :-1][:, dropped] != 0):
        raise ValueError("sub_block: a column left out has a non-zero coefficient")
    keep = np.concatenate([cols, [d]])
    idx = (np.arange(k)[:, None] * m + keep[None, :]).ravel()
    return theta[:, keep].copy(), g[idx].copy(), H[np.ix_(idx, idx)].copy()
