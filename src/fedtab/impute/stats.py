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

__all__ = ["SiteStats", "PooledStats", "ReleasePlan", "column_sums", "site_stats", "suppressed_stats", "release_plan",
           "released_stats", "pool_stats", "STAT_ARRAYS"]

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
class ReleasePlan:
    """Which co-observation cells a site releases, and how (see :func:`release_plan`).

    Attributes:
        kept: (F, F) bool, symmetric: the pair cell is released (its count and product); off
            the diagonal ``False`` means every array of the cell is sent as zero.
        exact: (F, F) bool: ``pair_sx[i, j]``/``pair_sxx[i, j]`` (sums of ``x_i`` over the rows
            where ``i`` and ``j`` are both observed) are the exact sums; where ``kept`` but not
            ``exact`` they are the site's own column moments scaled to the pair's row count
            (:func:`released_stats`), which are functions of what is released anyway.
    """

    kept: np.ndarray
    exact: np.ndarray


def _two_valued(x: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """(F, F) bool: ``x_j`` takes at most two distinct values over the rows where ``i`` and ``j``
    are both observed (entry ``[i, j]``). Such a ``x_j`` makes ``Σ x_i x_j`` a sum of ``x_i`` over
    each of its level sets, so it splits ``i``'s rows like an observation mask does."""
    f = x.shape[1]
    out = np.zeros((f, f), dtype=bool)
    for j in range(f):
        both = obs & obs[:, [j]]  # (n, F): rows of pair (i, j), per i
        col = x[:, [j]]
        lo = np.where(both, col, np.inf).min(0)
        hi = np.where(both, col, -np.inf).max(0)
        other = both & (col != lo) & (col != hi)
        out[:, j] = ~other.any(0)
    return out


#: most candidate row sets :func:`_isolates` examines for one check; beyond it the check answers
#: "isolates" (the plan then suppresses or replaces the cell: never less safe, only coarser).
MAX_SUBSETS = 4096


def _isolates(member: np.ndarray, min_rows: int) -> bool:
    """Whether some linear combination of row-set sums isolates fewer than ``min_rows`` rows.

    ``member`` is an ``(n, g)`` bool matrix: column ``k`` is the ``k``-th row set over which the
    server holds ``Σ x`` of one column's ``n`` observed rows. The server learns ``v · x`` for
    every ``v`` in the span of those indicator vectors; the answer is ``True`` when a non-zero
    ``v`` there is supported on fewer than ``min_rows`` rows (its dot product with ``x`` is then a
    function of those rows alone: a complement, an overlap of two complements, a cell of two
    cross-classified levels that the other sums pin down, …).

    Rows with the same membership (an *atom*) get the same weight in every ``v``, so a support is
    a union of atoms; only atoms below ``min_rows`` can be in a small support. With ``B`` the
    span vectors that vanish on every atom of ``min_rows`` rows or more (restricted to the small
    atoms), a small support exists iff some set ``T`` of small atoms holding fewer than
    ``min_rows`` rows carries a non-zero vector of ``B``, i.e. ``rank(B without T) < rank(B)``;
    maximal such ``T`` are enumerated (at most :data:`MAX_SUBSETS`, else ``True``).
    """
    if member.shape[0] == 0 or member.shape[1] == 0:
        return False
    patterns, counts = np.unique(member, axis=0, return_counts=True)
    m = patterns.astype(np.float64)
    small = counts < min_rows
    if not small.any():
        return False
    big = m[~small]
    # null space of the big atoms' rows: coefficient vectors c with big @ c == 0
    if big.shape[0]:
        _, sv, vt = np.linalg.svd(big, full_matrices=True)
        rank_big = int(np.sum(sv > 1e-9 * max(sv.max(initial=0.0), 1.0)))
        null = vt[rank_big:].T
    else:
        null = np.eye(m.shape[1])
    if null.shape[1] == 0:
        return False
    b = m[small] @ null  # (small atoms, d): the span vectors that vanish on the big atoms
    d = np.linalg.matrix_rank(b, tol=1e-9)
    if d == 0:
        return False
    w = counts[small]
    order = np.argsort(w, kind="stable")
    w, b = w[order], b[order]
    s = len(w)
    visited = 0

    def search(k: int, chosen: list[int], weight: int) -> bool | None:
        """True: a small support found; None: too many subsets (treated as found)."""
        nonlocal visited
        if k == s:
            # maximal: no atom left out could still join (atoms sorted by weight)
            out = [a for a in range(s) if a not in chosen]
            if any(weight + w[a] < min_rows for a in out):
                return False
            visited += 1
            if visited > MAX_SUBSETS:
                return None
            rest = b[out] if out else np.zeros((0, b.shape[1]))
            return bool(np.linalg.matrix_rank(rest, tol=1e-9) < d) if rest.size else True
        if weight + w[k] < min_rows:
            got = search(k + 1, chosen + [k], weight + int(w[k]))
            if got is not False:
                return got
        return search(k + 1, chosen, weight)

    return search(0, [], 0) is not False


class _Exposure:
    """The row sets over which the server holds ``Σ x`` of one column (its observed rows)."""

    def __init__(self, rows: np.ndarray, min_rows: int):
        self.rows = rows  # indices of the observed rows of the column
        self.sets: list[np.ndarray] = [np.ones(len(rows), dtype=bool)]  # O_i itself (count, sum)
        self.min_rows = min_rows

    def add(self, sets: list[np.ndarray]) -> bool:
        """Add ``sets`` (bool masks over all rows) if no combination of the held and the new
        sums then isolates fewer than ``min_rows`` rows; return whether they were added."""
        new = [np.asarray(m, dtype=bool)[self.rows] for m in sets]
        new = [m for m in new if m.any() and not m.all()]  # empty or all rows: nothing new
        if not new:
            return True
        if _isolates(np.stack(self.sets + new, axis=1), self.min_rows):
            return False
        self.sets += new
        return True


def release_plan(values: np.ndarray, min_rows: int) -> ReleasePlan:
    """The co-observation cells a site may release so that no difference isolates a few rows.

    The sums of ``x_i`` (and ``x_i**2``) a site releases are over ``O_i`` (rows where ``i`` is
    observed: ``count``, ``sum``, ``sumsq``) and over ``R_ij = O_i ∩ O_j`` for each partner ``j``
    (``pair_sx``, ``pair_sxx``); a two-valued ``x_j`` also makes the product ``Σ x_i x_j`` a sum
    of ``x_i`` per level of ``x_j``. A server combining them linearly learns ``v · x_i`` for every
    ``v`` in the span of the indicator vectors of those row sets. The plan keeps every non-zero
    ``v`` of that span supported on ``>= min_rows`` rows (:func:`_isolates`), so no combination
    of the released sums (``Σ_{O_i} − Σ_{R_ij}`` — the complement —, ``Σ_{R_ij} + Σ_{R_ik} −
    Σ_{O_i}``, the cell of two cross-classified levels when the other cells are known, …) is a
    function of fewer than ``min_rows`` rows' values.

    Cells are decided greedily, most co-observed pair first (ties by index: the plan depends on
    the observation pattern and on the level sets of two-valued columns, never on other values):

    1. the pair is co-observed in fewer than ``min_rows`` rows, or its product's level sums (a
       two-valued partner) would let a combination isolate fewer than ``min_rows`` rows: the
       whole cell is suppressed;
    2. otherwise the cell is kept, and ``pair_sx[i, j]``/``pair_sxx[i, j]`` are exact when
       adding ``R_ij`` to the row sets of ``i`` keeps that so (always when ``j`` is observed
       wherever ``i`` is), else replaced (see :func:`released_stats`).

    Args:
        values: (n, F) float array, NaN = missing (no inf).
        min_rows: the site's ``min_rows`` (``<= 1``: everything exact).

    Returns:
        a :class:`ReleasePlan` over the F columns (the diagonal: ``kept``/``exact`` where the
        column is observed in ``>= min_rows`` rows).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"values have shape {x.shape}, expected (n, F)")
    obs = ~np.isnan(x)
    f = x.shape[1]
    count = obs.sum(0)
    pc = obs.T.astype(np.int64) @ obs.astype(np.int64)
    if min_rows <= 1:
        full = pc > 0
        return ReleasePlan(kept=full, exact=full.copy())
    col_ok = count >= min_rows
    kept = np.zeros((f, f), dtype=bool)
    exact = np.zeros((f, f), dtype=bool)
    kept[np.diag_indices(f)] = col_ok
    exact[np.diag_indices(f)] = col_ok
    two = _two_valued(np.where(obs, x, 0.0), obs)
    exposed = [_Exposure(np.flatnonzero(obs[:, i]), min_rows) for i in range(f)]
    iu, ju = np.triu_indices(f, k=1)
    cand = (pc[iu, ju] >= min_rows) & col_ok[iu] & col_ok[ju]
    order = np.lexsort((ju[cand], iu[cand], -pc[iu, ju][cand]))
    for i, j in zip(iu[cand][order], ju[cand][order]):
        sides = ((i, j), (j, i))
        levels = {}
        for a, b in sides:  # the levels of b split a's rows when b is two-valued on the pair's rows
            if two[a, b]:
                both = obs[:, a] & obs[:, b]
                lo = x[both, b].min()
                levels[a] = [both & (x[:, b] == lo), both & (x[:, b] != lo)]
        saved = {a: list(exposed[a].sets) for a in levels}
        if not all(exposed[a].add(levels[a]) for a in levels):
            for a, sets in saved.items():
                exposed[a].sets = sets
            continue
        kept[i, j] = kept[j, i] = True
        for a, b in sides:
            exact[a, b] = a in levels or exposed[a].add([obs[:, b]])
    return ReleasePlan(kept=kept, exact=exact)


def released_stats(values: np.ndarray, columns: Sequence[str], min_rows: int,
                   shift: np.ndarray | None = None) -> SiteStats:
    """The statistics a site releases without DP: :func:`site_stats` of ``values`` under the
    :func:`release_plan` for ``min_rows``.

    Suppressed cells (and columns observed in fewer than ``min_rows`` rows) are sent as zero. A
    kept cell whose ``pair_sx[i, j]``/``pair_sxx[i, j]`` may not be exact carries
    ``pair_count[i, j]`` times the column's own mean / mean square over ``O_i`` (what the
    site's full column would contribute; a function of ``count``, ``sum``, ``sumsq`` and
    ``pair_count``, so it adds nothing to them). Where such a replacement would imply a
    correlation outside [-1, 1] with the exact product, its variance is widened just enough
    (again a function of released numbers). The pooled correlation of such a pair is then the
    product moment over the co-observed rows against the columns' own moments: exact under
    missingness completely at random, in expectation.

    Raises:
        ValueError: as :func:`site_stats`.
    """
    s = site_stats(values, columns, shift)
    plan = release_plan(values, min_rows)
    keep = plan.kept
    count, total, sumsq = (np.where(np.diag(keep), getattr(s, k), 0.0) for k in ("count", "sum", "sumsq"))
    pc = np.where(keep, s.pair_count, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.where(count > 0, total / np.where(count > 0, count, 1.0), 0.0)
        q = np.where(count > 0, sumsq / np.where(count > 0, count, 1.0), 0.0)
    sx = np.where(plan.exact, s.pair_sx, pc * m[:, None])
    sxx = np.where(plan.exact, s.pair_sxx, pc * q[:, None])
    sxy = np.where(keep, s.pair_sxy, 0.0)
    sx, sxx = np.where(keep, sx, 0.0), np.where(keep, sxx, 0.0)
    sxx = _widened(pc, sx, sxx, sxy, ~plan.exact & keep)
    return SiteStats(columns=list(s.columns), shift=s.shift.copy(), count=count, sum=total, sumsq=sumsq,
                     pair_count=pc, pair_sx=sx, pair_sxx=sxx, pair_sxy=sxy)


def _widened(pc: np.ndarray, sx: np.ndarray, sxx: np.ndarray, sxy: np.ndarray, loose: np.ndarray) -> np.ndarray:
    """``sxx`` with the variances of the ``loose`` (replaced) entries widened so that every pair's
    implied correlation lies in [-1, 1]; exact entries are never changed."""
    n = np.where(pc > 0, pc, 1.0)
    mx = sx / n
    vx = np.maximum(sxx / n - mx * mx, 0.0)
    vy, my = vx.T, mx.T
    cov = sxy / n - mx * my
    need = cov * cov * (1.0 + 1e-9)
    out = sxx.copy()
    lx, ly = loose, loose.T
    with np.errstate(invalid="ignore", divide="ignore"):
        # both replaced: widen both by the same factor; one: widen that one alone
        t = np.sqrt(need / np.maximum(vx * vy, 1e-300))
        both = lx & ly & (need > vx * vy)
        vx_new = np.where(both, vx * np.maximum(t, 1.0), vx)
        only = lx & ~ly & (need > vx * vy) & (vy > 0)
        vx_new = np.where(only, need / np.where(vy > 0, vy, 1.0), vx_new)
    fix = both | only
    out[fix] = (n * (mx * mx + vx_new))[fix]
    return out


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
