"""Robust reducers: the alternatives of a workflow's reduce step when ``robust=True``.

Every workflow reduces the sites' replies in one place; in robust mode it calls the
functions below instead of the plain (sample-weighted) sum or mean. They are pure
numpy/scipy functions over what the sites sent, and they never look at rows.

Two kinds of defence, used together:

* **Medians over sites** (:func:`site_median`, :func:`robust_params`,
  :func:`robust_votes`): coordinate-wise, one vote per site, so a site's claimed
  row count buys it no influence (like Flower's ``FedMedian``/``FedTrimmedAvg``,
  which are unweighted too). With ``K`` sites of which ``f`` are hostile, every
  coordinate of the median lies between two honest sites' values as long as
  ``K >= 2f + 1``. :func:`trimmed_mean` (``scipy.stats.trim_mean``) is the
  alternative that tolerates ``f <= floor(trim * K)``.
* **Screen, then capped sums** (:func:`screen_sites`, :func:`cap_weights`): quantities
  the server needs as sums (feature moments for standardisation, the imputation
  sufficient statistics, GaussianNB's statistics) stay sums, but first every site's
  per-row summary (column means, spreads, correlations) is compared with the median
  site; a site that disagrees beyond a tolerance is left out with a warning naming
  it, and no remaining site may carry more than ``max_site_share`` of the total
  weight (its sums are scaled down, its own means and correlations are unchanged).

Nothing here imports an engine.
"""

from __future__ import annotations

import logging
from typing import Mapping, Sequence

import numpy as np

__all__ = [
    "DEFAULT_MAX_SITE_SHARE",
    "MEAN_TOLERANCE",
    "SCALE_TOLERANCE",
    "CORR_TOLERANCE",
    "cap_weights",
    "check_max_site_share",
    "site_median",
    "trimmed_mean",
    "robust_params",
    "robust_votes",
    "screen_sites",
    "moment_summaries",
    "usable_counts",
]

log = logging.getLogger("fedtab.federation.protocol.reduce")

#: default ceiling of one site's share of the total weight in robust mode.
DEFAULT_MAX_SITE_SHARE = 0.5
#: a site is an outlier when a column mean is further than this many (median-site)
#: standard deviations from the median site's mean ...
MEAN_TOLERANCE = 1.0
#: ... or a column's standard deviation differs from the median site's by more than this factor ...
SCALE_TOLERANCE = 4.0
#: ... or a correlation differs from the median site's by more than this.
CORR_TOLERANCE = 0.5


def check_max_site_share(value: float) -> float:
    """``value`` as a float in ``(0, 1]``; raises ``ValueError`` otherwise (NaN included)."""
    try:
        share = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"max_site_share must be a number in (0, 1], got {value!r}") from None
    if not 0 < share <= 1:
        raise ValueError(f"max_site_share must be in (0, 1], got {value!r}")
    return share


def cap_weights(weights: Sequence[float] | np.ndarray, max_share: float = DEFAULT_MAX_SITE_SHARE) -> np.ndarray:
    """Normalised weights with no site above ``max_share`` of the total.

    Water-filling: entries above the cap are set to it and the freed weight is shared
    among the others in proportion to their own weights, repeated until none is above
    the cap. Where fewer than ``1 / max_share`` sites have a positive weight no
    weighting can respect the cap, and those sites get equal weights. Weights that
    already respect the cap come back only normalised.

    Args:
        weights: ``(K,)`` or ``(K, d)`` non-negative finite numbers (e.g. claimed row
            counts); a 2-D array is capped column by column (sites along axis 0).
        max_share: the ceiling, in ``(0, 1]``.

    Returns:
        float64 of the same shape, non-negative; every column with a positive weight
        sums to 1 (an all-zero column stays zero). A share below 1e-300 counts as zero.

    Raises:
        ValueError: empty, negative or non-finite weights, all-zero 1-D weights,
            ``max_share`` outside (0, 1].
    """
    cap = check_max_site_share(max_share)
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0 or w.ndim not in (1, 2) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be a non-empty (K,) or (K, d) array of finite non-negative numbers")
    if w.ndim == 1 and not w.sum() > 0:
        raise ValueError("weights are all zero")
    total = w.sum(axis=0)
    w = np.divide(w, total, out=np.zeros_like(w), where=total > 0)
    w[w < 1e-300] = 0.0  # shares below any float's resolution count as none (no overflow below)
    positive = w > 0
    feasible = positive.sum(axis=0) * cap >= 1 - 1e-12
    capped = np.zeros(w.shape, dtype=bool)
    for _ in range(w.shape[0]):
        over = feasible & ~capped & (w > cap * (1 + 1e-12))
        if not over.any():
            break
        capped |= over
        free = 1.0 - cap * capped.sum(axis=0)
        rest = np.where(capped, 0.0, w).sum(axis=0)
        scale = np.divide(free, rest, out=np.zeros_like(free), where=rest > 0)
        w = np.where(capped, cap, w * scale)
    uniform = np.divide(positive, positive.sum(axis=0), out=np.zeros_like(w), where=positive.sum(axis=0) > 0)
    return np.where(feasible, w, uniform)


def site_median(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """Coordinate-wise median over sites (``axis``), one vote per site.

    NaN entries (a site that lacks the value) are ignored; a coordinate no site has is
    NaN. For an even number of sites, the mean of the two middle values.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices -> NaN, on purpose
        return np.nanmedian(np.asarray(values, dtype=np.float64), axis=axis)


def trimmed_mean(values: np.ndarray, trim: float = 0.2, axis: int = 0) -> np.ndarray:
    """Coordinate-wise mean over sites after cutting ``trim`` of them at each end (``scipy.stats.trim_mean``)."""
    from scipy.stats import trim_mean

    if not 0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}")
    return np.asarray(trim_mean(np.asarray(values, dtype=np.float64), trim, axis=axis))


def robust_params(updates: Sequence[Mapping[str, np.ndarray]], method: str = "median",
                  trim: float = 0.2) -> dict[str, np.ndarray]:
    """Combine parameter dicts from the sites coordinate-wise, one vote per site.

    Args:
        updates: one ``{name: array}`` per site, same names and shapes (validated
            before, by the workflow).
        method: ``"median"`` (tolerates ``f`` hostile sites when ``K >= 2f + 1``) or
            ``"trimmed_mean"`` (``trim`` of the sites cut at each end).

    Returns:
        ``{name: array}`` with each array's dtype kept (float32 weights stay float32).

    Raises:
        ValueError: no updates, differing names or shapes, unknown method.
    """
    if not updates:
        raise ValueError("robust aggregation needs at least one update")
    if method not in ("median", "trimmed_mean"):
        raise ValueError(f"unknown robust method {method!r}; expected 'median' or 'trimmed_mean'")
    keys = list(updates[0])
    out = {}
    for k in keys:
        try:
            stack = np.stack([np.asarray(u[k], dtype=np.float64) for u in updates])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"parameter {k!r} is missing or has different shapes across sites: {exc}") from None
        agg = np.median(stack, axis=0) if method == "median" else trimmed_mean(stack, trim)
        out[k] = agg.astype(np.asarray(updates[0][k]).dtype, copy=False)
    return out


def robust_votes(normalised: np.ndarray) -> np.ndarray:
    """Election votes as the median of the holders' normalised scores, one vote per site.

    Args:
        normalised: ``(K, d)`` per-site min-max-normalised scores, NaN where the site
            does not hold the feature.

    Returns:
        ``(d,)`` votes (0 for a feature no site holds).
    """
    v = site_median(np.asarray(normalised, dtype=np.float64))
    return np.nan_to_num(np.atleast_1d(v), nan=0.0)


def usable_counts(count: np.ndarray | float) -> np.ndarray:
    """``count`` as float64 with every entry below 1 (or not finite) read as 0.

    Noisy (DP) counts can be negative or tiny; a reducer that divides by a count or
    weights by it uses this first, so one convention holds everywhere: fewer than one
    row counts as none (post-processing, no privacy cost)."""
    c = np.asarray(count, dtype=np.float64)
    return np.where(np.isfinite(c) & (c >= 1), c, 0.0)


def moment_summaries(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row mean and population std from count/sum/sum-of-squares (NaN where the count is
    below 1, see :func:`usable_counts`). Overflow-safe: the sums are divided by the count
    before anything is squared, and ``std = √(E[x²] − mean²)`` is taken as
    ``√E[x²]·√(1 − (mean/√E[x²])²)``."""
    c = usable_counts(count)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        mean = np.where(c > 0, np.asarray(total, dtype=np.float64) / np.where(c > 0, c, 1.0), np.nan)
        rms = np.sqrt(np.maximum(np.where(c > 0, np.asarray(sumsq, dtype=np.float64) / np.where(c > 0, c, 1.0),
                                          np.nan), 0.0))
        ratio = np.where(rms > 0, mean / np.where(rms > 0, rms, 1.0), 0.0)
        std = rms * np.sqrt(np.maximum(1.0 - ratio * ratio, 0.0))
    return mean, np.where(c > 0, std, np.nan)


def screen_sites(
    means: Mapping[str, np.ndarray],
    stds: Mapping[str, np.ndarray],
    corrs: Mapping[str, np.ndarray] | None = None,
    *,
    mean_tol: float = MEAN_TOLERANCE,
    scale_tol: float = SCALE_TOLERANCE,
    corr_tol: float = CORR_TOLERANCE,
    columns: Sequence[str] | None = None,
    what: str = "statistics",
) -> dict[str, str]:
    """Sites whose per-row statistics disagree with the median site, and why.

    Every array is over one shared column order; NaN marks a column (pair) the site
    does not hold. The reference is the coordinate-wise median over the sites, and a
    site *disagrees* when, for some column (pair) held by at least three sites,

    * ``|mean - median mean| > mean_tol * median std``, or
    * ``std / median std`` is above ``scale_tol`` or below ``1 / scale_tol``, or
    * (with ``corrs``) a correlation differs from the median one by more than ``corr_tol``.

    Sites are left out one at a time: of the disagreeing sites, the one with the
    largest mean disagreement over all its coordinates (each measured in units of its
    tolerance) goes first, the medians are recomputed without it, and so on until no
    site disagrees or fewer than three remain. So an honest site that disagrees only
    where hostile sites hold the median majority is kept once they are out. With
    fewer than three sites nothing is flagged (no majority to compare with).

    Args:
        columns: names of the columns, used in the reasons (default: positions).
        what: the step, used in the warning.

    Returns:
        ``{site: reason}`` for the left-out sites, in the order they were left out
        (a warning naming each is logged).
    """
    names = list(means)
    if len(names) < 3 or np.asarray(next(iter(means.values()))).size == 0:
        return {}
    m = np.stack([np.asarray(means[s], dtype=np.float64) for s in names])
    sd = np.stack([np.asarray(stds[s], dtype=np.float64) for s in names])
    r = None if corrs is None else np.stack([np.asarray(corrs[s], dtype=np.float64) for s in names])

    def col(j: int) -> str:
        return repr(columns[j]) if columns is not None else str(j)

    flagged: dict[str, str] = {}
    remaining = list(range(len(names)))
    while len(remaining) >= 3:
        worst: dict[int, tuple[float, str]] = {}
        mean_score: dict[int, float] = {}
        for i, parts in _disagreements(m[remaining], sd[remaining], None if r is None else r[remaining],
                                       mean_tol, scale_tol, corr_tol).items():
            site = remaining[i]
            (w, (kind, idx, value)), mean_score[site] = max(parts[0], key=lambda t: t[0]), parts[1]
            if kind == "mean":
                why = f"mean of column {col(idx[0])} is {value:.3g} standard deviations from the median site's"
            elif kind == "spread":
                why = f"spread of column {col(idx[0])} differs {value:.3g}x from the median site's"
            else:
                why = f"correlation of columns {col(idx[0])} and {col(idx[1])} differs by {value:.3g} from the median site's"
            worst[site] = (w, why)
        bad = [i for i in remaining if worst[i][0] > 1]
        if not bad:
            break
        out = max(bad, key=lambda i: (mean_score[i], worst[i][0]))
        flagged[names[out]] = worst[out][1]
        remaining.remove(out)
    for s, why in flagged.items():
        log.warning("robust %s: leaving out site %r: %s", what, s, why)
    return flagged


def _disagreements(m: np.ndarray, sd: np.ndarray, r: np.ndarray | None, mean_tol: float, scale_tol: float,
                   corr_tol: float) -> dict[int, tuple[list[tuple[float, tuple]], float]]:
    """Per site: its worst disagreement of each kind ``(score, (kind, index, value))`` and its
    mean score over the coordinates it holds (score = disagreement / tolerance)."""
    enough = (~np.isnan(m)).sum(0) >= 3
    ref_m, ref_sd = site_median(m), site_median(sd)
    with np.errstate(invalid="ignore", divide="ignore"):
        dev = np.abs(m - ref_m) / np.where(ref_sd > 0, ref_sd, 1.0)
        ratio = np.where(ref_sd > 0, sd / ref_sd, np.where(sd > 0, np.inf, 1.0))
        spread = np.abs(np.log(np.where(ratio > 0, ratio, 1e-300))) / np.log(scale_tol)
    held = enough & ~np.isnan(dev)
    scores = [("mean", np.where(held, dev / mean_tol, np.nan), dev),
              ("spread", np.where(held & ~np.isnan(spread), np.minimum(spread, 1e6), np.nan), ratio)]
    if r is not None:
        pair_enough = (~np.isnan(r)).sum(0) >= 3
        diff = np.abs(r - site_median(r))
        scores.append(("corr", np.where(pair_enough & ~np.isnan(diff), diff / corr_tol, np.nan), diff))
    out = {}
    for i in range(m.shape[0]):
        parts, total, count = [], 0.0, 0
        for kind, score, value in scores:
            s_i = score[i]
            ok = ~np.isnan(s_i)
            if not ok.any():
                parts.append((0.0, (kind, (0, 0), 0.0)))
                continue
            flat = int(np.nanargmax(np.where(ok, s_i, -np.inf)))
            idx = np.unravel_index(flat, s_i.shape)
            parts.append((float(s_i[idx]), (kind, tuple(int(v) for v in idx), float(value[i][idx]))))
            total += float(s_i[ok].sum())
            count += int(ok.sum())
        out[i] = (parts, total / count if count else 0.0)
    return out
