"""Reply validators: is what a site sent consistent with what it claims?

Pure functions over numpy arrays. Each raises ``ValueError`` with the reason; the
protocol path (:func:`~fedtab.federation.protocol.exchange`) prefixes the sending
site's name, so a validation failure always names that site and only that site.
They run on each reply *before* anything is reduced, so one site's values can never
make another site's reply look bad (e.g. an overflowing average).

What is checked (issue 10, "every reply validated against what it claims"):

* :func:`array` -- present, numeric, finite, of the expected shape;
* :func:`counts` -- non-negative integers no larger than the rows declared;
* :func:`moments` -- per column ``count``/``sum``/``sumsq``: nothing summed where
  nothing was counted, no negative variance;
* :func:`pair_statistics` -- co-observed counts <= each column's count, symmetric, with
  the per-column statistics on the diagonal; implied variances >= 0 and implied
  correlations in [-1, 1];
* :func:`confusion_matrix` -- ``(C, C)`` non-negative integers summing to the declared rows;
* :func:`parameters` -- the expected names and shapes, finite, entries within a
  plausible magnitude.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .messages import Message

__all__ = ["array", "counts", "moments", "pair_statistics", "confusion_matrix", "parameters", "MAX_PARAM_ABS",
           "REL_TOL"]

#: Largest ``|entry|`` accepted in model parameters (standardised inputs never need more;
#: a site scaling its weights by 10**6 is rejected instead of overflowing the average).
MAX_PARAM_ABS = 1e6
#: Relative tolerance of the moment and correlation checks (float rounding of honest sums).
REL_TOL = 1e-6


def array(reply: Message, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """``reply.arrays[name]`` as float64 of ``shape``; ``ValueError`` if absent, mis-shaped, non-numeric or not finite."""
    a = reply.arrays.get(name)
    if a is None:
        raise ValueError(f"reply lacks array {name!r}")
    if a.shape != tuple(shape):
        raise ValueError(f"array {name!r} has shape {a.shape}, expected {tuple(shape)}")
    if a.dtype.kind not in "biuf":
        raise ValueError(f"array {name!r} has dtype {a.dtype}, expected numbers")
    out = np.asarray(a, dtype=np.float64)
    if not np.isfinite(out).all():
        raise ValueError(f"array {name!r} is not finite")
    return out


def counts(values: np.ndarray, upper: float, what: str = "counts") -> np.ndarray:
    """Check ``values`` are non-negative integers no larger than ``upper`` (the declared rows)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return v
    if not np.isfinite(v).all() or (v < 0).any() or (v != np.round(v)).any():
        raise ValueError(f"{what} must be non-negative integers")
    if v.max() > upper:
        raise ValueError(f"{what} reach {v.max():g}, more than the {upper:g} rows declared")
    return v


def _tol(*scales: np.ndarray) -> np.ndarray:
    return REL_TOL * np.maximum.reduce([np.abs(s) for s in scales] + [np.ones_like(scales[0])])


def _close(a: np.ndarray, b: np.ndarray, scale: np.ndarray) -> bool:
    """``|a - b| <= REL_TOL · scale`` (+ a tiny absolute slack) everywhere."""
    return bool(np.all(np.abs(np.asarray(a) - np.asarray(b)) <= REL_TOL * np.abs(scale) + 1e-12))


def moments(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray, what: str = "moments") -> None:
    """Per column: zero sums where the count is zero, ``sumsq >= 0`` and ``count·sumsq >= sum²``."""
    count, total, sumsq = (np.asarray(x, dtype=np.float64) for x in (count, total, sumsq))
    empty = count == 0
    if np.any(empty & ((total != 0) | (sumsq != 0))):
        raise ValueError(f"{what}: non-zero sums over columns with no observed value")
    if np.any(sumsq < 0):
        raise ValueError(f"{what}: negative sum of squares")
    spread = count * sumsq - total * total
    if np.any(spread < -_tol(count * sumsq, total * total)):
        raise ValueError(f"{what}: sums of squares imply a negative variance")


def pair_statistics(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray, pair_count: np.ndarray,
                    pair_sx: np.ndarray, pair_sxx: np.ndarray, pair_sxy: np.ndarray) -> None:
    """Co-observation statistics of ``F`` columns against their per-column statistics.

    Checks: ``pair_count`` symmetric, ``<= min(count_i, count_j)``, diagonal = ``count``;
    ``pair_sx``/``pair_sxx`` diagonals = ``sum``/``sumsq``; ``pair_sxy`` symmetric with
    ``sumsq`` on the diagonal; per pair the implied variances of both columns are
    ``>= 0`` and the implied correlation lies in ``[-1, 1]`` (Cauchy-Schwarz).
    """
    moments(count, total, sumsq)
    pc = np.asarray(pair_count, dtype=np.float64)
    if not np.array_equal(pc, pc.T):
        raise ValueError("pair counts are not symmetric")
    if np.any(pc > np.minimum.outer(count, count)):
        raise ValueError("a pair count exceeds the count of one of its columns")
    # signed sums can cancel to ~0, so their tolerance scales with the terms (sqrt(n·Σx²)), not the sum
    spread = np.sqrt(np.maximum(count * sumsq, 0.0))
    if not (np.array_equal(np.diag(pc), count) and _close(np.diag(pair_sx), total, spread)
            and _close(np.diag(pair_sxx), sumsq, sumsq) and _close(np.diag(pair_sxy), sumsq, sumsq)):
        raise ValueError("pair statistics disagree with the per-column statistics on their diagonal")
    if not _close(pair_sxy, pair_sxy.T, np.sqrt(np.maximum(pair_sxx * pair_sxx.T, 0.0))):
        raise ValueError("co-observed products are not symmetric")
    empty = pc == 0
    if np.any(empty & ((pair_sx != 0) | (pair_sxx != 0) | (pair_sxy != 0))):
        raise ValueError("non-zero sums over column pairs never observed together")
    if np.any(pair_sxx < 0):
        raise ValueError("negative co-observed sum of squares")
    sy, syy = pair_sx.T, pair_sxx.T
    vx = pc * pair_sxx - pair_sx * pair_sx
    vy = pc * syy - sy * sy
    if np.any(vx < -_tol(pc * pair_sxx, pair_sx * pair_sx)):
        raise ValueError("co-observed sums imply a negative variance")
    cov = pc * pair_sxy - pair_sx * sy
    bound = np.maximum(vx, 0.0) * np.maximum(vy, 0.0)
    if np.any(cov * cov > bound + _tol(cov * cov, bound, (pc * pair_sxx) * (pc * syy))):
        raise ValueError("co-observed sums imply a correlation outside [-1, 1]")


def confusion_matrix(reply: Message, n_classes: int, n_rows: int) -> np.ndarray:
    """The ``(C, C)`` confusion matrix of ``reply``: non-negative integers summing to ``n_rows``."""
    cm = array(reply, "confusion", (n_classes, n_classes))
    counts(cm, n_rows, "confusion matrix entries")
    if cm.sum() != n_rows:
        raise ValueError(f"confusion matrix sums to {cm.sum():g}, not the {n_rows} test rows declared")
    return cm


def parameters(arrays: Mapping[str, np.ndarray], template: Mapping[str, tuple[int, ...]], *,
               max_abs: float = MAX_PARAM_ABS, what: str = "parameter") -> dict[str, np.ndarray]:
    """Exactly the names and shapes of ``template``, finite, every ``|entry| <= max_abs``."""
    extra, missing = sorted(set(arrays) - set(template)), sorted(set(template) - set(arrays))
    if extra or missing:
        raise ValueError(f"{what}s {extra[:3]} were not expected and {missing[:3]} are missing")
    out = {}
    for name, shape in template.items():
        a = arrays[name]
        if tuple(a.shape) != tuple(shape) or a.dtype.kind not in "biuf":
            raise ValueError(f"{what} {name!r} has shape {a.shape} (dtype {a.dtype}), expected {tuple(shape)}")
        if not np.isfinite(a).all():
            raise ValueError(f"{what} {name!r} is not finite")
        if a.size and float(np.abs(a).max()) > max_abs:
            raise ValueError(f"{what} {name!r} has entries beyond ±{max_abs:g} (implausible norm)")
        out[name] = a
    return out


def integer(value: Any, what: str, *, equal: int | None = None, upper: int | None = None) -> int:
    """``value`` as a non-negative int (no bools), equal to ``equal`` or at most ``upper`` when given."""
    from .schema import as_count

    n = as_count(value, what, upper)
    if equal is not None and n != equal:
        raise ValueError(f"{what} is {n}, but {equal} were declared")
    return n
