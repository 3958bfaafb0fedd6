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
  nothing was counted, no negative variance, every sum within :data:`MAX_SUM`;
* :func:`pair_statistics` -- co-observed counts <= each column's count, symmetric, with
  the per-column statistics on the diagonal; implied variances >= 0 and implied
  correlations in [-1, 1];
* :func:`confusion_matrix` -- ``(C, C)`` non-negative integers summing to the declared rows;
* :func:`parameters` -- the expected names and shapes, finite, entries within a
  plausible magnitude.

Every check is overflow-safe: a sum is scaled (divided by ``√count·√sumsq``) before
anything is squared, so a forged sum of ``1e300`` is rejected by name instead of turning a
check into ``inf - inf`` that passes.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fedtab.federation.protocol.messages import Message

__all__ = ["array", "counts", "bounded", "moments", "pair_statistics", "confusion_matrix", "parameters",
           "MAX_PARAM_ABS", "MAX_SUM", "REL_TOL"]

#: Largest ``|entry|`` accepted in model parameters (standardised inputs never need more;
#: a site scaling its weights by 10**6 is rejected instead of overflowing the average).
MAX_PARAM_ABS = 1e6
#: Relative tolerance of the moment and correlation checks (float rounding of honest sums).
REL_TOL = 1e-6
#: Largest ``|sum|`` accepted in moments and co-observation sums: the float64 maximum over
#: 2**32, so the server can add the replies of billions of sites without overflow (honest
#: sums of squares this large need values beyond 10**149).
MAX_SUM = float(np.finfo(np.float64).max) / 2.0**32


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
        raise ValueError(f"{what} are more than the {upper:g} rows declared")
    return v


def _close(a: np.ndarray, b: np.ndarray, scale: np.ndarray) -> bool:
    """``|a - b| <= REL_TOL · scale`` (+ a tiny absolute slack) everywhere (an overflowing
    difference is ``inf`` and fails)."""
    with np.errstate(over="ignore", invalid="ignore"):
        diff = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
        return bool(np.all(diff <= REL_TOL * np.abs(scale) + 1e-12))


def bounded(values: np.ndarray, what: str = "sums") -> np.ndarray:
    """``values`` as float64 with every ``|entry| <= MAX_SUM`` (so sums of many sites' replies
    cannot overflow); ``ValueError`` otherwise (the value itself is not echoed)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size and not float(np.max(np.abs(v))) <= MAX_SUM:
        raise ValueError(f"{what} are beyond the range sums can be pooled in (|x| <= {MAX_SUM:.0e})")
    return v


def _cauchy_schwarz(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray) -> np.ndarray:
    """Where ``count·sumsq - total² >= -REL_TOL·max(count·sumsq, total², 1)`` holds, computed
    without squaring a sum: both sides are divided by ``max(√count·√sumsq, |total|, 1)²``."""
    a = np.sqrt(np.maximum(count, 0.0)) * np.sqrt(np.maximum(sumsq, 0.0))
    b = np.abs(total)
    scale = np.maximum(np.maximum(a, b), 1.0)
    return (a / scale) ** 2 - (b / scale) ** 2 >= -REL_TOL


def moments(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray, what: str = "moments") -> None:
    """Per column: finite, zero sums where the count is zero, ``sumsq >= 0``, every sum within
    :data:`MAX_SUM`, and ``count·sumsq >= sum²`` (Cauchy-Schwarz: no negative variance).

    Overflow-safe: nothing site-sent is squared (see :func:`_cauchy_schwarz`), so sums of
    ``1e200``-``1e300`` are rejected, not waved through as ``inf - inf``.
    """
    count, total, sumsq = (np.asarray(x, dtype=np.float64) for x in (count, total, sumsq))
    if not (np.isfinite(count).all() and np.isfinite(total).all() and np.isfinite(sumsq).all()):
        raise ValueError(f"{what}: not finite")
    empty = count == 0
    if np.any(empty & ((total != 0) | (sumsq != 0))):
        raise ValueError(f"{what}: non-zero sums over columns with no observed value")
    if np.any(sumsq < 0):
        raise ValueError(f"{what}: negative sum of squares")
    bounded(total, f"{what}: sums")
    bounded(sumsq, f"{what}: sums of squares")
    if not np.all(_cauchy_schwarz(count, total, sumsq)):
        raise ValueError(f"{what}: sums beyond the range its own counts allow (the sums of squares imply a "
                         "negative variance)")


def pair_statistics(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray, pair_count: np.ndarray,
                    pair_sx: np.ndarray, pair_sxx: np.ndarray, pair_sxy: np.ndarray) -> None:
    """Co-observation statistics of ``F`` columns against their per-column statistics.

    Checks: ``pair_count`` symmetric, ``<= min(count_i, count_j)``, diagonal = ``count``;
    ``pair_sx``/``pair_sxx`` diagonals = ``sum``/``sumsq``; ``pair_sxy`` symmetric with
    ``sumsq`` on the diagonal; every sum within :data:`MAX_SUM`; per pair the implied
    variances of both columns are ``>= 0`` and the implied correlation lies in ``[-1, 1]``
    (Cauchy-Schwarz). Overflow-safe: the correlation is checked on sums divided by
    ``√pair_count·√pair_sxx`` (values of order 1), never on products of raw sums.
    """
    moments(count, total, sumsq)
    pc = np.asarray(pair_count, dtype=np.float64)
    pair_sx, pair_sxx, pair_sxy = (np.asarray(a, dtype=np.float64) for a in (pair_sx, pair_sxx, pair_sxy))
    if not np.array_equal(pc, pc.T):
        raise ValueError("pair counts are not symmetric")
    if np.any(pc > np.minimum.outer(count, count)):
        raise ValueError("a pair count exceeds the count of one of its columns")
    for a, name in ((pair_sx, "co-observed sums"), (pair_sxx, "co-observed sums of squares"),
                    (pair_sxy, "co-observed products")):
        bounded(a, name)
    # signed sums can cancel to ~0, so their tolerance scales with the terms (sqrt(n·Σx²)), not the sum
    spread = np.sqrt(np.maximum(count, 0.0)) * np.sqrt(np.maximum(sumsq, 0.0))
    if not (np.array_equal(np.diag(pc), count) and _close(np.diag(pair_sx), total, spread)
            and _close(np.diag(pair_sxx), sumsq, sumsq) and _close(np.diag(pair_sxy), sumsq, sumsq)):
        raise ValueError("pair statistics disagree with the per-column statistics on their diagonal")
    root = np.sqrt(np.maximum(pair_sxx, 0.0))
    if not _close(pair_sxy, pair_sxy.T, root * root.T):
        raise ValueError("co-observed products are not symmetric")
    empty = pc == 0
    if np.any(empty & ((pair_sx != 0) | (pair_sxx != 0) | (pair_sxy != 0))):
        raise ValueError("non-zero sums over column pairs never observed together")
    if np.any(pair_sxx < 0):
        raise ValueError("negative co-observed sum of squares")
    if not np.all(_cauchy_schwarz(pc, pair_sx, pair_sxx)):
        raise ValueError("co-observed sums imply a negative variance")
    if not np.all(_correlation_ok(pc, pair_sx, pair_sxx, pair_sxy)):
        raise ValueError("co-observed sums imply a correlation outside [-1, 1]")


def _correlation_ok(pc: np.ndarray, sx: np.ndarray, sxx: np.ndarray, sxy: np.ndarray) -> np.ndarray:
    """Where ``cov² <= vx·vy + REL_TOL·max(cov², vx·vy, (pc·sxx)(pc·syy), 1)`` holds, with
    ``cov = pc·sxy - sx·sy`` and ``vx = pc·sxx - sx²`` (``sy``/``syy`` the transposes).

    Computed scaled: with ``A = √pc·√sxx`` and ``B = √pc·√syy`` every term is divided by
    ``(A·B)²``, so ``u_x = sx/A``, ``u_xy = sxy/(√sxx·√syy)`` are of order 1 for honest sums
    and a forged one that is not fails before anything is squared. Where ``A·B = 0`` the
    condition is checked directly (``|cov| <= √REL_TOL``, as ``vx·vy = 0`` there). An honest
    ``|u_xy|`` is at most 1; one above 2 is refused before it is squared.
    """
    sy, syy = sx.T, sxx.T
    rx, ry = np.sqrt(np.maximum(sxx, 0.0)), np.sqrt(np.maximum(syy, 0.0))
    n = np.sqrt(np.maximum(pc, 0.0))
    ab = (n * rx) * (n * ry)
    live = ab > 0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        one = np.where(live, 1.0, np.nan)
        ux, uy = sx / (n * rx) * one, sy / (n * ry) * one
        uxy = sxy / (rx * ry) * one
        cov = uxy - ux * uy
        vv = np.maximum(1.0 - ux * ux, 0.0) * np.maximum(1.0 - uy * uy, 0.0)
        inv_p = np.minimum((1.0 / ab) ** 2, np.finfo(np.float64).max)  # the absolute slack, in scaled units
        sq = cov * cov
        ok_live = (np.abs(uxy) <= 2.0) & (  # honest: <= 1; larger would overflow below
            (sq <= vv + REL_TOL * np.maximum(np.maximum(vv, 1.0), inv_p)) | (sq * (1.0 - REL_TOL) <= vv))
        # A·B = 0: vx·vy = 0, so only the absolute slack is left (cov² <= REL_TOL)
        ok_dead = np.abs(pc * sxy - sx * sy) <= np.sqrt(REL_TOL)
    return np.where(live, ok_live, ok_dead | (pc == 0))


def confusion_matrix(reply: Message, n_classes: int, n_rows: int) -> np.ndarray:
    """The ``(C, C)`` confusion matrix of ``reply``: non-negative integers summing to ``n_rows``."""
    cm = array(reply, "confusion", (n_classes, n_classes))
    counts(cm, n_rows, "confusion matrix entries")
    if cm.sum() != n_rows:
        raise ValueError(f"confusion matrix does not sum to the {n_rows} test rows declared")
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
    from fedtab.federation.protocol.schema import as_count

    n = as_count(value, what, upper)
    if equal is not None and n != equal:
        raise ValueError(f"{what} is {n}, but {equal} were declared")
    return n
