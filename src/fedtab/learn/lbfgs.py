"""Limited-memory BFGS over numpy, for the logistic model's local update.

Why not ``scipy.optimize.minimize(method="L-BFGS-B")``: on Flower every message is
answered by a fresh ``flwr-clientapp`` process, and importing ``scipy.optimize``
(which pulls in ``scipy.linalg``, ``scipy.sparse`` and scipy's array-API layer)
costs 0.5–0.9 s of CPU per process -- more than the whole FedAvg round's work on a
site's rows. The local update only needs unconstrained L-BFGS on a smooth, strongly
convex objective, which is the textbook two-loop recursion (Nocedal & Wright,
*Numerical Optimization*, Alg. 7.4) with a weak-Wolfe line search (bisection and
doubling, Lewis & Overton 2013); both are a few lines of numpy.

Semantics follow scipy's: ``maxiter`` counts iterations (each evaluates the objective
at least once), the first step has unit length along ``−g``, and the run stops early
when ``max|g| ≤ gtol`` or the relative decrease of the objective falls below
``ftol``. On a strongly convex problem both optimisers converge to the same
minimiser; after a fixed small number of iterations their iterates differ slightly
(different line searches), as any two L-BFGS implementations do.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import numpy as np

__all__ = ["minimize_lbfgs"]

FunGrad = Callable[[np.ndarray], tuple[float, np.ndarray]]

_C1 = 1e-4  # sufficient decrease (Armijo)
_C2 = 0.9  # curvature (weak Wolfe): quasi-Newton default
_MAX_LINE_STEPS = 40


def _wolfe_step(fun: FunGrad, x: np.ndarray, f: float, g: np.ndarray,
                d: np.ndarray) -> tuple[float, float, np.ndarray] | None:
    """A step ``t`` along the descent direction ``d`` meeting the weak Wolfe conditions,
    as ``(t, f(x + t d), ∇f(x + t d))``; ``None`` if none is found (then stop)."""
    slope = float(g @ d)
    lo, hi, t = 0.0, np.inf, 1.0
    best: tuple[float, float, np.ndarray] | None = None
    for _ in range(_MAX_LINE_STEPS):
        f_t, g_t = fun(x + t * d)
        if not np.isfinite(f_t) or f_t > f + _C1 * t * slope:
            hi = t
        else:
            best = (t, f_t, g_t)  # decreases enough: usable even if the curvature test fails
            if float(g_t @ d) < _C2 * slope:
                lo = t
            else:
                return best
        t = 0.5 * (lo + hi) if np.isfinite(hi) else 2.0 * lo
    return best


def minimize_lbfgs(fun: FunGrad, x0: np.ndarray, *, maxiter: int, history: int = 10,
                   gtol: float = 1e-5, ftol: float = 2.220446049250313e-09) -> np.ndarray:
    """Minimise a smooth function with L-BFGS; return the last iterate ``(p,)``.

    Args:
        fun: ``theta -> (value, gradient)``, gradient shaped like ``theta``.
        x0: start ``(p,)`` float (not modified).
        maxiter: iterations (≥ 1); each takes one line search.
        history: correction pairs kept (scipy's ``maxcor``).
        gtol: stop when ``max|∇f| ≤ gtol``.
        ftol: stop when ``(f_k − f_{k+1}) / max(|f_k|, |f_{k+1}|, 1) ≤ ftol``.

    Raises:
        ValueError: ``maxiter`` < 1 or ``x0`` not a finite 1-D float array.
    """
    if int(maxiter) < 1:
        raise ValueError(f"maxiter must be at least 1, got {maxiter}")
    x = np.array(x0, dtype=np.float64)
    if x.ndim != 1 or not np.all(np.isfinite(x)):
        raise ValueError("x0 must be a finite 1-D array")
    f, g = fun(x)
    pairs: deque[tuple[np.ndarray, np.ndarray, float]] = deque(maxlen=max(int(history), 1))
    for _ in range(int(maxiter)):
        gnorm = float(np.max(np.abs(g))) if g.size else 0.0
        if gnorm <= gtol:
            break
        q = g.copy()
        alphas = []
        for s, y, rho in reversed(pairs):
            a = rho * float(s @ q)
            q -= a * y
            alphas.append(a)
        if pairs:
            s, y, _ = pairs[-1]
            q *= float(s @ y) / float(y @ y)
        else:
            q /= float(np.linalg.norm(g))  # first step: unit length along −g
        for (s, y, rho), a in zip(pairs, reversed(alphas)):
            q += (a - rho * float(y @ q)) * s
        d = -q
        if float(g @ d) >= 0.0:  # not a descent direction (numerical trouble): restart from −g
            pairs.clear()
            d = -g / float(np.linalg.norm(g))
        found = _wolfe_step(fun, x, f, g, d)
        if found is None:
            break
        t, f_new, g_new = found
        s, y = t * d, g_new - g
        sy = float(s @ y)
        if sy > 1e-10 * float(y @ y):
            pairs.append((s, y, 1.0 / sy))
        decrease = (f - f_new) / max(abs(f), abs(f_new), 1.0)
        x, f, g = x + s, f_new, g_new
        if decrease <= ftol:
            break
    return x
