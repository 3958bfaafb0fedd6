"""Bin edges from pooled counts over public grids: a quantile sketch no site's values are behind.

The server never sees a value: each site releases, per feature, **counts of its training
rows over a public grid**, the counts are summed over the sites (the run's summing strategy:
plain or secure), and the server places the bin edges at quantiles of the pooled counts.
Every edge is a point of the public grid, never a row's value. Two grids, in two exchanges:

1. **The range grid** (:func:`range_grid`, a constant): the signed powers of two
   ``±2^-16 … ±2^127`` and 0 — 289 edges, 290 bins, covering every float32 value. The
   pooled counts give each feature a range ``[lo, hi]`` whose ends are points of this grid
   (:func:`range_from_counts`: the outer ends of the lowest and highest bins holding rows).
2. **The fine grid** (:func:`fine_grid`): :data:`SKETCH_BINS` equal steps over ``[lo, hi]``
   (``SKETCH_BINS + 1`` edges). The site recomputes it from ``(lo, hi)``, which must be points
   of the range grid (:func:`fine_grid_refusal`), so the server chooses none of its edges.
   :func:`quantile_edges` then places at most ``max_bins − 1`` edges at fine-grid points.

**What one site's counts disclose.** A site cuts each feature's counts into runs of adjacent
bins holding at least ``min_rows`` rows (its floor; the last short run joins the one before)
and releases each run's count in one bin of the run — the run's last bin, the last run's
first bin (:func:`merge_counts`) — so every non-zero number it sends counts at least
``min_rows`` of its rows, over an interval of the public grid, and runs tile the line: the
rows below any released boundary differ from those below another by 0 or ≥ ``min_rows``.
The site merges in every mode (a secure sum then pools the merged counts), so plain and
secure runs agree on the same edges. Values outside ``[lo, hi]`` fall in the end bins.

**What the tail discloses** (plain and secure runs). The short tail (fewer than ``min_rows``
rows above the last complete run's cut) joins the last run, whose count sits at that cut: a
curious server reading one site's counts ``c_1 … c_m`` at cuts ``e_1 < … < e_m`` learns that at
most ``c_m − min_rows`` of the site's rows lie above ``e_m`` (exactly that many when no bin of the
last run holds two rows), and nothing about where above ``e_m`` they lie: moving those rows
anywhere above ``e_m`` leaves every released number unchanged (:func:`tail_bound`). A secure
sum shows the same bound only for the pooled counts.

**Under differential privacy** (:func:`dp_counts_sensitivity`, :func:`noisy_range`,
:func:`noisy_quantile_edges`) a site releases its raw counts over the same public grids (no
runs: the noise, not a floor, protects the rows), with Gaussian noise from its own budget; the
server derives the range from the bins whose pooled noisy count stands clear of the noise, and
the edges from the monotone CDF of the pooled noisy counts (negatives clipped).

A bin ``b`` of a grid ``e`` holds the values ``x`` with ``b`` = the number of edges ``≤ x``
(:meth:`~.bins.BinLayout.bin`'s rule, in float32); NaN cells are not counted.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["SKETCH_BINS", "FINE_WIDTH", "RANGE_EDGES", "RANGE_WIDTH", "sketch_grids", "range_grid", "fine_grid", "grid_counts", "merge_counts",
           "range_from_counts", "quantile_edges", "fine_grid_refusal", "check_counts", "sketch_edges",
           "dp_counts_sensitivity", "noise_sigma", "noisy_range", "noisy_quantile_edges", "tail_bound",
           "RANGE_NOISE_SIGMAS"]

#: equal steps of a feature's fine grid (fixed here: no request sets it)
SKETCH_BINS = 1024
#: the bins of a fine-grid count release per feature (a shorter, deduplicated grid leaves zeros)
FINE_WIDTH = SKETCH_BINS + 2
_EXP_LO, _EXP_HI = -16, 127
_F32_MAX = float(np.finfo(np.float32).max)


def range_grid() -> np.ndarray:
    """The constant range grid: ``(289,)`` float32 ``−2^127 … −2^-16, 0, 2^-16 … 2^127``."""
    pos = np.ldexp(1.0, np.arange(_EXP_LO, _EXP_HI + 1))
    return np.concatenate([-pos[::-1], [0.0], pos]).astype(np.float32)


#: :func:`range_grid` (read-only)
RANGE_EDGES = range_grid()
RANGE_EDGES.setflags(write=False)
#: the bins of a range-grid count release per feature
RANGE_WIDTH = RANGE_EDGES.size + 1
#: the points a fine grid may start or end at: the range grid and ±FLT_MAX
_RANGE_POINTS = np.concatenate([[-_F32_MAX], RANGE_EDGES.astype(np.float64), [_F32_MAX]])


def fine_grid(lo: float, hi: float, n: int = SKETCH_BINS) -> np.ndarray:
    """``n`` equal steps over ``[lo, hi]``: the float32 points of ``linspace(lo, hi, n + 1)``
    (deduplicated; ``[lo]`` when ``lo == hi``). Uses no site data.

    Raises:
        ValueError: ``lo > hi``, non-finite ends, ``n < 1``.
    """
    lo, hi = float(lo), float(hi)
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi or n < 1:
        raise ValueError(f"a fine grid needs finite lo <= hi and n >= 1, got [{lo}, {hi}], n={n}")
    return np.unique(np.linspace(lo, hi, int(n) + 1).astype(np.float32))


def grid_counts(X: np.ndarray, grids: Sequence[np.ndarray], width: int | None = None) -> np.ndarray:
    """``(d, width)`` float64: per feature ``j``, the observed cells of column ``j`` of ``X``
    ``(n, d)`` in each bin of ``grids[j]`` (bins past a shorter grid's end stay 0; ``width``
    defaults to the longest grid's bins).

    Raises:
        ValueError: ``X`` not 2-d, not one grid per column, a grid with more bins than ``width``.
    """
    A = np.asarray(X, dtype=np.float64)
    if A.ndim != 2 or A.shape[1] != len(grids):
        raise ValueError(f"X must be 2-d with one column per grid ({len(grids)}), got shape {A.shape}")
    longest = max((np.asarray(g).size for g in grids), default=0) + 1
    width = longest if width is None else int(width)
    if longest > width:
        raise ValueError(f"a grid has {longest} bins, more than the width {width}")
    out = np.zeros((A.shape[1], width))
    # a column holding only 0, 1 and NaN (a one-hot column) is counted without a search per cell
    zeros, ones = (A == 0).sum(axis=0), (A == 1).sum(axis=0)
    binary = (zeros + ones + np.isnan(A).sum(axis=0)) == A.shape[0]
    for j, g in enumerate(grids):
        if binary[j]:
            at = np.searchsorted(np.asarray(g, dtype=np.float32), np.array([0.0, 1.0], dtype=np.float32), side="right")
            out[j, at[0]] += zeros[j]
            out[j, at[1]] += ones[j]
            continue
        col = A[:, j]
        col = col[~np.isnan(col)]
        if col.size:
            with np.errstate(over="ignore"):
                b = np.searchsorted(np.asarray(g, dtype=np.float32), col.astype(np.float32), side="right")
            out[j, :np.asarray(g).size + 1] = np.bincount(b, minlength=np.asarray(g).size + 1)
    return out


def merge_counts(counts: np.ndarray, min_rows: int) -> np.ndarray:
    """Each row of ``counts`` ``(d, B)`` cut into runs of adjacent bins holding at least
    ``min_rows`` rows (a greedy cut left to right, as the gate's histogram smoothing; a short
    tail joins the last run), each run's count put in the bin where its running count reached
    ``min_rows`` (the cut the run's rows fix anyway) and zeros elsewhere. A row holding fewer
    than ``min_rows`` rows in all becomes zeros. Row totals are kept otherwise; ``min_rows <= 1``
    changes nothing. Every non-zero cell of the result is ``≥ min_rows``."""
    c = np.asarray(counts, dtype=np.float64)
    if min_rows <= 1 or c.size == 0:
        return c.copy()
    out = np.zeros_like(c)
    for j in range(c.shape[0]):
        row = c[j]
        cum = np.cumsum(row)
        if cum[-1] < min_rows:
            continue
        ends: list[int] = []
        below = 0.0  # rows in the runs cut so far
        while cum[-1] - below >= min_rows:
            k = int(np.searchsorted(cum, below + min_rows - 1e-9, side="left"))
            ends.append(k)
            below = float(cum[k])
        totals = np.diff(np.r_[0.0, cum[ends]])
        totals[-1] += cum[-1] - below  # the short tail joins the last run
        out[j, ends] = totals
    return out


def range_from_counts(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` float64 ``(d,)`` per feature from pooled counts over :data:`RANGE_EDGES`
    ``(d, 290)``: the lower end of the lowest bin and the upper end of the highest bin holding
    rows (``±FLT_MAX`` for the outer bins); ``(0, 0)`` for a feature without rows.

    Raises:
        ValueError: counts of another width.
    """
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] != RANGE_EDGES.size + 1:
        raise ValueError(f"range counts must be (features, {RANGE_EDGES.size + 1}), got {c.shape}")
    lo, hi = np.zeros(c.shape[0]), np.zeros(c.shape[0])
    for j in range(c.shape[0]):
        held = np.flatnonzero(c[j] > 0.5)
        if held.size:
            lo[j], hi[j] = _RANGE_POINTS[held[0]], _RANGE_POINTS[held[-1] + 1]
    return lo, hi


def _grid_counts_checked(grid: np.ndarray, counts: np.ndarray, max_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """``(grid as float32, counts as float64)`` once ``max_bins`` is in 2..65535 and the counts
    cover the grid's ``g + 1`` bins.

    Raises:
        ValueError: naming what is wrong.
    """
    if not 2 <= int(max_bins) <= 65535:
        raise ValueError(f"max_bins must be in 2..65535, got {max_bins}")
    g = np.asarray(grid, dtype=np.float32)
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 1 or c.size < g.size + 1:
        raise ValueError(f"counts must cover the grid's {g.size + 1} bins, got shape {c.shape}")
    return g, c


def quantile_edges(counts: np.ndarray, grid: np.ndarray, max_bins: int) -> np.ndarray:
    """At most ``max_bins − 1`` float32 edges, points of ``grid`` ``(g,)``, from pooled counts
    ``(≥ g + 1,)`` over its bins: every edge between two bins holding rows when at most
    ``max_bins`` bins do, else the grid points nearest the pooled ranks ``k·N / max_bins``.
    Each edge has rows on both sides.

    Raises:
        ValueError: ``max_bins`` outside 2..65535, counts shorter than the grid's bins.
    """
    g, c = _grid_counts_checked(grid, counts, max_bins)
    c = np.where(c > 0, c, 0.0)[:g.size + 1]
    cum = np.cumsum(c)[:-1]  # rows below grid point i (the rank of the edge g[i])
    total = float(c.sum())
    inner = np.flatnonzero((cum > 0) & (cum < total))  # edges with rows on both sides
    if inner.size == 0:
        return np.zeros(0, np.float32)
    held = np.flatnonzero(c > 0)
    if held.size <= max_bins:
        cand = held[:-1]  # the upper edge of every held bin but the last
        return g[cand]
    targets = np.arange(1, int(max_bins)) * (total / int(max_bins))
    r = cum[inner]
    hi = np.minimum(np.searchsorted(r, targets), r.size - 1)
    lo = np.maximum(hi - 1, 0)
    pick = np.where(np.abs(r[lo] - targets) <= np.abs(r[hi] - targets), lo, hi)
    return g[inner[np.unique(pick)]]


def fine_grid_refusal(lo: Sequence[float], hi: Sequence[float], n_features: int) -> str | None:
    """Why the ends of a fine-grid request are refused, or ``None``: one ``(lo, hi)`` per
    feature, each a point of the range grid or ``±FLT_MAX``, ``lo <= hi``."""
    try:
        a = np.asarray(lo, dtype=np.float64).reshape(-1)
        b = np.asarray(hi, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return "the fine grid's ends must be numbers"
    if a.size != n_features or b.size != n_features:
        return f"the fine grid needs one (lo, hi) per feature ({n_features})"
    if not (np.isin(a, _RANGE_POINTS) & np.isin(b, _RANGE_POINTS)).all():
        return "the fine grid's ends must be points of the public range grid (signed powers of two or 0)"
    if (a > b).any():
        return "the fine grid's ends must have lo <= hi"
    return None


def sketch_grids(stage: object, lo: object, hi: object, n_features: int) -> tuple[list[np.ndarray], int]:
    """``(grid per feature, release width)`` of a sketch request: ``stage = "range"`` the range
    grid for every feature; ``stage = "fine"`` the fine grid of each feature's ``(lo, hi)``.

    Raises:
        ValueError: another stage, or ends :func:`fine_grid_refusal` refuses.
    """
    if stage == "range":
        return [RANGE_EDGES] * n_features, RANGE_WIDTH
    if stage != "fine":
        raise ValueError("a sketch request's stage must be 'range' or 'fine'")
    reason = fine_grid_refusal(lo, hi, n_features)  # type: ignore[arg-type]
    if reason is not None:
        raise ValueError(reason)
    return [fine_grid(a, b) for a, b in zip(np.asarray(lo, float).tolist(), np.asarray(hi, float).tolist())], FINE_WIDTH


def check_counts(counts: np.ndarray, n_features: int, width: int, n_rows: int, what: str = "sketch counts") -> np.ndarray:
    """``counts`` as ``(n_features, width)`` float64, checked: finite, ``≥ 0`` (a rounding
    slack of 1e-6), at most ``n_rows`` rows per feature.

    Raises:
        ValueError: otherwise (the message names ``what``).
    """
    c = np.asarray(counts, dtype=np.float64)
    if c.size != n_features * width:
        raise ValueError(f"{what} must be {n_features} x {width} numbers, got shape {c.shape}")
    c = c.reshape(n_features, width)
    if not np.isfinite(c).all() or (c < -1e-6).any():
        raise ValueError(f"{what} must be finite non-negative counts")
    if (c.sum(axis=1) > n_rows + 1e-6 * max(n_rows, 1) + 1e-3).any():
        raise ValueError(f"{what} count more rows in a feature than the {n_rows} declared")
    return c


def sketch_edges(sites_X: Sequence[np.ndarray], max_bins: int, min_rows: int) -> list[np.ndarray]:
    """The edges a federation agrees by the two exchanges above, computed over the sites'
    arrays in one process (each ``(n_i, d)``, NaN = missing): each site's merged counts summed,
    per stage. The reference for the federated flow."""
    d = np.asarray(sites_X[0]).shape[1]
    pooled = sum(merge_counts(grid_counts(X, [RANGE_EDGES] * d), min_rows) for X in sites_X)
    lo, hi = range_from_counts(pooled)
    grids = [fine_grid(a, b) for a, b in zip(lo, hi)]
    pooled = sum(merge_counts(grid_counts(X, grids, FINE_WIDTH), min_rows) for X in sites_X)
    return [quantile_edges(pooled[j], grids[j], max_bins) for j in range(d)]


# ----------------------------------------------------------------------------- tail
def tail_bound(released: np.ndarray, min_rows: int) -> np.ndarray:
    """What one site's merged counts ``(d, B)`` (:func:`merge_counts`) tell a server about the rows
    above the last non-zero bin, per feature: at most ``c_last − min_rows`` of them (0 for a
    feature without counts). The bound is tight when no bin of the last run holds two rows."""
    c = np.asarray(released, dtype=np.float64)
    out = np.zeros(c.shape[0])
    for j in range(c.shape[0]):
        nz = np.flatnonzero(c[j] > 0)
        if nz.size:
            out[j] = max(float(c[j, nz[-1]]) - int(min_rows), 0.0)
    return out


# ----------------------------------------------------------------------------- differential privacy
#: a range-grid bin holds rows under DP when its pooled noisy count exceeds this many standard
#: deviations of the pooled noise (5σ: about 3e-7 false bins per bin, 290 bins a feature)
RANGE_NOISE_SIGMAS = 5.0


def dp_counts_sensitivity(n_features: int) -> float:
    """L2 sensitivity of a ``(n_features, width)`` count release to adding or removing one row:
    the row adds 1 to one bin of each feature where its cell is observed, so ``√n_features``
    (at least 1)."""
    return float(np.sqrt(max(int(n_features), 1)))


def noise_sigma(counts: np.ndarray, planned: float) -> float:
    """The standard deviation of the pooled noise in noisy counts ``(d, B)``: the larger of the
    ``planned`` one (the server's multiplier × sensitivity × √sites) and the robust estimate
    ``1.4826 · median |count|`` over all bins (most range-grid bins hold no row, so their counts
    are noise alone; a site that answered with more noise than asked, its own floor, is seen)."""
    c = np.asarray(counts, dtype=np.float64)
    robust = 1.4826 * float(np.median(np.abs(c))) if c.size else 0.0
    return max(float(planned), robust)


def noisy_range(counts: np.ndarray, sigma: float, n_sigmas: float = RANGE_NOISE_SIGMAS
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` float64 ``(d,)`` from pooled noisy counts over :data:`RANGE_EDGES` ``(d, 290)``:
    as :func:`range_from_counts` over the bins whose count exceeds ``n_sigmas · sigma`` (the rows of
    a bin below that fall in the end bins of the fine grid); ``(0, 0)`` for a feature with none.

    Raises:
        ValueError: counts of another width, ``sigma < 0``.
    """
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] != RANGE_WIDTH:
        raise ValueError(f"range counts must be (features, {RANGE_WIDTH}), got {c.shape}")
    if not sigma >= 0:
        raise ValueError(f"the noise's standard deviation must be >= 0, got {sigma}")
    held = np.where(c > max(float(n_sigmas) * float(sigma), 0.5), 1.0, 0.0)
    return range_from_counts(held)


def noisy_quantile_edges(counts: np.ndarray, grid: np.ndarray, max_bins: int) -> np.ndarray:
    """At most ``max_bins − 1`` float32 edges, points of ``grid`` ``(g,)``, from pooled noisy
    counts ``(≥ g + 1,)``: negatives clipped to 0 (so the CDF, rows below each grid point, is
    monotone; the clipping adds about ``0.4 σ`` per empty bin, negligible at large ε), and for each rank ``k·N / max_bins`` (``N`` the clipped total) the grid point whose
    CDF is nearest; points with no row on one side of them (CDF 0 or ``N``) are dropped. With
    noise-free counts the edges are those of :func:`quantile_edges`' rank rule.

    Raises:
        ValueError: as :func:`quantile_edges`.
    """
    g, c = _grid_counts_checked(grid, counts, max_bins)
    c = np.clip(np.nan_to_num(c[:g.size + 1], nan=0.0), 0.0, None)  # negatives clipped: a monotone CDF
    cdf = np.cumsum(c)[:-1]  # rows below grid point i
    total = float(c.sum())
    inner = np.flatnonzero((cdf > 0.5) & (cdf < total - 0.5))
    if inner.size == 0:
        return np.zeros(0, np.float32)
    r = cdf[inner]
    targets = np.arange(1, int(max_bins)) * (total / int(max_bins))
    hi = np.minimum(np.searchsorted(r, targets), r.size - 1)
    lo = np.maximum(hi - 1, 0)
    pick = np.where(np.abs(r[lo] - targets) <= np.abs(r[hi] - targets), lo, hi)
    return g[inner[np.unique(pick)]]
