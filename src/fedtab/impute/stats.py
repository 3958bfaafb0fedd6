"""Per-site sufficient statistics and their exact pooling.

A site summarises its own columns without sending rows:

* per column ``j``: observed count ``n_j``, ``sum x_j``, ``sum x_j**2``;
* per pair ``(i, j)`` of its columns, over the rows where *both* are observed:
  the co-observed count and the sums of ``x_i``, ``x_i**2`` and ``x_i * x_j``
  (the sums of ``x_j`` and ``x_j**2`` are the transposed entries).

Values are taken relative to an optional per-column ``shift`` (the server sends the
pooled mean after a first counting round), which keeps the sums of squares well
conditioned; Pearson correlations do not depend on the shift, so pooling stays exact.
The server adds the sums of all sites column-by-name and obtains exactly the
pairwise-complete Pearson correlation of the concatenated data (what
``pandas.DataFrame.corr()`` computes) and the global mean/std of every column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["SiteStats", "PooledStats", "column_sums", "site_stats", "suppressed_stats", "pool_stats", "STAT_ARRAYS"]

#: Names of the (F, F) pair arrays in a :class:`SiteStats` (used for messages).
STAT_ARRAYS = ("count", "sum", "sumsq", "pair_count", "pair_sx", "pair_sxx", "pair_sxy")


@dataclass
class SiteStats:
    """Sufficient statistics of one site over its own ``F`` columns (float64).

    Attributes:
        columns: the site's column names, length ``F``.
        shift: (F,) value subtracted from each column before summing.
        count, sum, sumsq: (F,) per-column observed count / sum / sum of squares.
        pair_count: (F, F) rows where columns i and j are both observed.
        pair_sx, pair_sxx: (F, F) sum of ``x_i`` / ``x_i**2`` over those rows.
        pair_sxy: (F, F) sum of ``x_i * x_j`` over those rows (symmetric).
    """

    columns: list[str]
    shift: np.ndarray
    count: np.ndarray
    sum: np.ndarray
    sumsq: np.ndarray
    pair_count: np.ndarray
    pair_sx: np.ndarray
    pair_sxx: np.ndarray
    pair_sxy: np.ndarray

    def validate(self) -> None:
        """Raise ``ValueError`` if shapes, finiteness or counts are inconsistent."""
        f = len(self.columns)
        if len(set(self.columns)) != f:
            raise ValueError("statistics have duplicate column names")
        for name in ("shift", "count", "sum", "sumsq"):
            if np.shape(getattr(self, name)) != (f,):
                raise ValueError(f"statistic {name!r} has shape {np.shape(getattr(self, name))}, expected ({f},)")
        for name in ("pair_count", "pair_sx", "pair_sxx", "pair_sxy"):
            if np.shape(getattr(self, name)) != (f, f):
                raise ValueError(f"statistic {name!r} has shape {np.shape(getattr(self, name))}, expected ({f}, {f})")
        for name in STAT_ARRAYS + ("shift",):
            if not np.all(np.isfinite(getattr(self, name))):
                raise ValueError(f"statistic {name!r} contains NaN or inf")
        if np.any(self.count < 0) or np.any(self.pair_count < 0):
            raise ValueError("negative counts")
        if np.any(self.sumsq < -1e-9) or not np.allclose(np.diag(self.pair_count), self.count):
            raise ValueError("counts and sums are inconsistent")


def column_sums(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Observed count and sum per column of an (n, F) array with NaN = missing."""
    x = np.asarray(values, dtype=np.float64)
    obs = ~np.isnan(x)
    return obs.sum(0).astype(np.float64), np.where(obs, x, 0.0).sum(0)


def site_stats(values: np.ndarray, columns: Sequence[str], shift: np.ndarray | None = None) -> SiteStats:
    """Sufficient statistics of an (n, F) array (NaN = missing) over ``columns``.

    Args:
        values: (n, F) numeric array; NaN marks a missing cell.
        columns: the F column names.
        shift: (F,) per-column shift (default 0).

    Raises:
        ValueError: shape mismatch or infinite values.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(columns):
        raise ValueError(f"values have shape {x.shape}, expected (n, {len(columns)})")
    if np.isinf(x).any():
        raise ValueError("values contain inf")
    shift = np.zeros(x.shape[1]) if shift is None else np.asarray(shift, dtype=np.float64)
    obs = ~np.isnan(x)
    o = obs.astype(np.float64)
    xs = np.where(obs, x - shift, 0.0)
    x2 = xs * xs
    return SiteStats(
        columns=[str(c) for c in columns],
        shift=shift.copy(),
        count=o.sum(0),
        sum=xs.sum(0),
        sumsq=x2.sum(0),
        pair_count=o.T @ o,
        pair_sx=xs.T @ o,
        pair_sxx=x2.T @ o,
        pair_sxy=xs.T @ xs,
    )


def suppressed_stats(stats: SiteStats, min_rows: int) -> SiteStats:
    """``stats`` with every cell over fewer than ``min_rows`` rows sent as zero (cell suppression).

    A column observed in fewer than ``min_rows`` rows loses its count and sums; a pair
    co-observed in fewer loses its co-observed count and sums. Consistency
    (``diag(pair_count) == count``) is kept.
    """
    small = (stats.pair_count > 0) & (stats.pair_count < min_rows)
    col = np.diag(small).copy()
    pair = {k: np.where(small, 0.0, getattr(stats, k)) for k in ("pair_count", "pair_sx", "pair_sxx", "pair_sxy")}
    cols = {k: np.where(col, 0.0, getattr(stats, k)) for k in ("count", "sum", "sumsq")}
    return SiteStats(columns=list(stats.columns), shift=stats.shift.copy(), **cols, **pair)


@dataclass
class PooledStats:
    """Pooled statistics over the global schema (union of all sites' columns).

    Attributes:
        columns: global column names (order of first appearance over the sites).
        count: (F,) observed count per column over all sites.
        mean, std: (F,) global mean and population standard deviation of the observed
            values (std is NaN for a column with < 2 observations, 0 for a constant one).
        pair_count: (F, F) co-observed count (0 for pairs no site observes together).
        corr: (F, F) pairwise-complete Pearson correlation; NaN where undefined
            (never co-observed, < 2 co-observations or zero variance). Diagonal is 1
            for every column with non-zero variance.
    """

    columns: list[str]
    count: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    pair_count: np.ndarray
    corr: np.ndarray

    def unobserved_pairs(self) -> int:
        """Number of unordered column pairs that no site observes together."""
        upper = np.triu(self.pair_count == 0, k=1)
        return int(upper.sum())


def pool_stats(stats: Sequence[SiteStats], columns: Sequence[str] | None = None) -> PooledStats:
    """Exactly pool per-site statistics into global mean/std and Pearson correlations.

    Args:
        stats: one :class:`SiteStats` per site. Sites that share a column must have
            used the same shift for it.
        columns: the global schema; default = ordered union of the sites' columns.

    Raises:
        ValueError: no statistics, inconsistent shifts, a site column outside ``columns``.
    """
    if not stats:
        raise ValueError("no site statistics to pool")
    if columns is None:
        seen: dict[str, None] = {}
        for s in stats:
            for c in s.columns:
                seen.setdefault(c, None)
        columns = list(seen)
    columns = [str(c) for c in columns]
    pos = {c: i for i, c in enumerate(columns)}
    f = len(columns)
    shift = np.full(f, np.nan)
    cnt, sm, sq = np.zeros(f), np.zeros(f), np.zeros(f)
    pc, sx, sxx, sxy = (np.zeros((f, f)) for _ in range(4))
    for s in stats:
        s.validate()
        try:
            idx = np.array([pos[c] for c in s.columns], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(f"site column {exc.args[0]!r} is not in the global schema") from None
        known = ~np.isnan(shift[idx])
        if np.any(known & ~np.isclose(shift[idx], s.shift, rtol=0, atol=0)):
            bad = [s.columns[k] for k in np.flatnonzero(known & (shift[idx] != s.shift))[:5]]
            raise ValueError(f"sites used different shifts for columns {bad}")
        shift[idx] = s.shift
        cnt[idx] += s.count
        sm[idx] += s.sum
        sq[idx] += s.sumsq
        ix = np.ix_(idx, idx)
        pc[ix] += s.pair_count
        sx[ix] += s.pair_sx
        sxx[ix] += s.pair_sxx
        sxy[ix] += s.pair_sxy
    shift = np.nan_to_num(shift)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = sm / cnt
        var = np.maximum(sq / cnt - m * m, 0.0)
        std = np.where(cnt >= 2, np.sqrt(var), np.nan)
        mean = np.where(cnt > 0, m + shift, np.nan)
        # per co-observed row (sums divided by the count first): no product of two sums is formed,
        # so sums near the float range cannot overflow the correlation
        n = np.where(pc > 0, pc, 1.0)
        mx, qx, qxy = sx / n, sxx / n, sxy / n
        my, qy = mx.T, qx.T
        cov = qxy - mx * my
        vx = qx - mx * mx
        vy = qy - my * my
        den = np.sqrt(np.maximum(vx, 0.0)) * np.sqrt(np.maximum(vy, 0.0))
        # relative tolerance: a variance that is rounding noise counts as zero
        tiny = 1e-12 * np.maximum(np.maximum(qx, qy), 1e-300 / n**2)
        ok = (pc >= 2) & (vx > tiny) & (vy > tiny)
        corr = np.where(ok, cov / np.where(ok, den, 1.0), np.nan)
    corr = np.clip(corr, -1.0, 1.0)
    corr = 0.5 * (corr + corr.T)  # exact symmetry despite rounding
    return PooledStats(columns=columns, count=cnt, mean=mean, std=std, pair_count=pc, corr=corr)
