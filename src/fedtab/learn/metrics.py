"""Classification metrics computed from confusion matrices, so they pool exactly.

A site reports its ``(C, C)`` confusion matrix (rows = true class, columns =
predicted); summing the sites' matrices and scoring the sum gives exactly the
metric on the pooled test rows, without any row leaving a site. The same holds for
the ranking metrics (AUROC, PR-AUC) computed from per-class histograms of predicted
probabilities on a fixed grid, and for the Brier score from a sum of squared errors.
Regression pools the same way: each site's SSE, SAE, Σy, Σy² and row count over its test
part give the pooled RMSE, MAE and R² exactly (:func:`regression_scores`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["confusion", "scores_from_confusion", "score_histogram", "ranking_scores", "brier_sum",
           "evaluation_scores", "rank_pairs", "cross_pairs", "pooled_auroc", "histogram_runs", "pooled_ranking",
           "SCORE_BINS", "REGRESSION_SUMS", "regression_sums", "regression_scores"]


def confusion(y_true: Any, y_pred: Any, n_classes: int) -> np.ndarray:
    """``(n_classes, n_classes)`` int64 counts; labels are class indices ``0..n_classes-1``.

    Raises:
        ValueError: lengths differ or a label is outside ``0..n_classes-1``.
    """
    t = np.asarray(y_true, dtype=np.int64).ravel()
    p = np.asarray(y_pred, dtype=np.int64).ravel()
    if t.shape != p.shape:
        raise ValueError(f"y_true has {t.size} labels, y_pred {p.size}")
    if t.size and (min(t.min(), p.min()) < 0 or max(t.max(), p.max()) >= n_classes):
        raise ValueError(f"labels must be in 0..{n_classes - 1}")
    return np.bincount(t * n_classes + p, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def scores_from_confusion(cm: Any) -> dict[str, float]:
    """``weighted_f1``, ``macro_f1``, ``accuracy`` and ``n`` of a confusion matrix.

    Matches scikit-learn's ``f1_score(average="weighted"|"macro")`` on the same rows,
    with ``zero_division=0``, over the classes that occur in ``y_true`` or ``y_pred``
    (scikit-learn's label set). An empty matrix scores 0.
    """
    cm = np.asarray(cm, dtype=np.float64)
    n = cm.sum()
    if n == 0:
        return {"weighted_f1": 0.0, "macro_f1": 0.0, "accuracy": 0.0, "n": 0}
    tp = np.diag(cm)
    support = cm.sum(axis=1)
    predicted = cm.sum(axis=0)
    denom = support + predicted
    f1 = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=denom > 0)
    present = denom > 0
    return {
        "weighted_f1": float((f1 * support).sum() / support.sum()),
        "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
        "accuracy": float(tp.sum() / n),
        "n": int(n),
    }


#: default number of equal-width bins of ``[0, 1]`` on which sites histogram their
#: predicted positive-class probabilities (see :func:`score_histogram`).
SCORE_BINS = 1000


def score_histogram(y_true: Any, p_positive: Any, bins: int = SCORE_BINS) -> np.ndarray:
    """``(2, bins)`` int32 counts of predicted positive-class probabilities per true class.

    Row 0 counts the negatives (class index 0), row 1 the positives (class index 1);
    column ``b`` holds the probabilities in ``[b/bins, (b+1)/bins)`` (the last bin also
    holds 1.0). Histograms are sums over rows, so the sites' histograms add up to the
    pooled one: :func:`ranking_scores` of the sum scores the pooled test rows, and no
    prediction leaves a site.

    Raises:
        ValueError: lengths differ, a label is not 0/1, a probability is outside
            ``[0, 1]`` or not finite, or ``bins < 2``.
    """
    t = np.asarray(y_true, dtype=np.int64).ravel()
    p = np.asarray(p_positive, dtype=np.float64).ravel()
    if bins < 2:
        raise ValueError(f"bins must be at least 2, got {bins}")
    if t.shape != p.shape:
        raise ValueError(f"y_true has {t.size} labels, p_positive {p.size} probabilities")
    if t.size and (t.min() < 0 or t.max() > 1):
        raise ValueError("a score histogram needs binary labels 0/1")
    if not np.isfinite(p).all() or (p.size and (p.min() < 0 or p.max() > 1)):
        raise ValueError("probabilities must be finite and in [0, 1]")
    b = np.minimum((p * bins).astype(np.int64), bins - 1)
    return np.bincount(t * bins + b, minlength=2 * bins).reshape(2, bins).astype(np.int32)  # half the bytes of int64


def rank_pairs(y_true: Any, p_positive: Any) -> float:
    """The Mann-Whitney count of one site's rows: over every (positive, negative) pair,
    1 when the positive scores higher, ½ on a tie — ``AUROC · P · N`` on the raw
    probabilities (no binning). A site sends it beside its histogram so that the pairs
    inside the site are counted exactly (:func:`pooled_auroc`).

    Raises:
        ValueError: lengths differ or a label is not 0/1.
    """
    t = np.asarray(y_true, dtype=np.int64).ravel()
    p = np.asarray(p_positive, dtype=np.float64).ravel()
    if t.shape != p.shape:
        raise ValueError(f"y_true has {t.size} labels, p_positive {p.size} probabilities")
    if t.size and (t.min() < 0 or t.max() > 1):
        raise ValueError("rank pairs need binary labels 0/1")
    neg = np.sort(p[t == 0])
    pos = p[t == 1]
    below = np.searchsorted(neg, pos, side="left")
    ties = np.searchsorted(neg, pos, side="right") - below
    return float(below.sum() + 0.5 * ties.sum())


def cross_pairs(pos: np.ndarray, neg: np.ndarray) -> float:
    """Mann-Whitney count of the positives of one histogram row ``pos`` ``(B,)`` against the
    negatives of another ``neg`` ``(B,)``: pairs in one bin count ½."""
    pos, neg = np.asarray(pos, np.float64), np.asarray(neg, np.float64)
    return float((pos * (np.cumsum(neg) - neg + 0.5 * neg)).sum())


def pooled_auroc(hists: Sequence[np.ndarray], pairs: Sequence[float]) -> tuple[float | None, float | None]:
    """``(AUROC, error bound)`` of the pooled rows of several sites, from each site's
    ``(2, B)`` histogram and its exact :func:`rank_pairs`: pairs inside a site are counted
    exactly, pairs across sites from the histograms (a pair in one bin counts ½, so its
    error is at most ½). ``(None, None)`` when a class is absent.
    """
    hs = [np.asarray(h, np.float64) for h in hists]
    P, N = sum(h[1].sum() for h in hs), sum(h[0].sum() for h in hs)
    if P == 0 or N == 0:
        return None, None
    within = float(sum(pairs))
    across = bound = 0.0
    for i, a in enumerate(hs):
        for j, b in enumerate(hs):
            if i != j:
                across += cross_pairs(a[1], b[0])
                bound += 0.5 * float((a[1] * b[0]).sum())
    return (within + across) / (P * N), bound / (P * N)


def histogram_runs(row: Any, smoothed: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(start, end, count)`` ``(R,)`` of the runs of one class row ``(B,)`` of a score histogram:
    run ``r`` holds ``count[r]`` rows whose scores lie in bins ``start[r] .. end[r] - 1``, i.e. in
    ``[start/B, end/B)``, in unknown places; runs are disjoint and in increasing order, empty
    bins belong to none.

    An exact histogram (``smoothed=False``): each non-empty bin is a run. A smoothed one (the
    release gate spread each run's count evenly over its bins,
    :func:`fedtab.privacy.gate.smooth_histogram`): the maximal stretches of equal non-zero
    values. Every gate run lies inside one such stretch (two adjacent runs that happen to have
    the same per-bin value merge into one, wider, run), so a bound computed from these runs
    holds for the gate's runs too.
    """
    h = np.asarray(row, dtype=np.float64).ravel()
    nz = h > 0
    if not smoothed:
        idx = np.flatnonzero(nz)
        return idx, idx + 1, h[idx]
    if not nz.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    change = np.flatnonzero(np.diff(h) != 0) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [h.size]])
    keep = h[starts] > 0
    starts, ends = starts[keep], ends[keep]
    counts = np.array([h[a:b].sum() for a, b in zip(starts, ends)])
    return starts, ends, counts


def _pair_bounds(pos: tuple[np.ndarray, ...], neg: tuple[np.ndarray, ...]) -> tuple[float, float]:
    """``(lo, hi)`` of the Mann-Whitney count of the positives in runs ``pos`` against the
    negatives in runs ``neg``: a pair whose runs are disjoint is known (1 or 0), any other pair
    is somewhere in ``[0, 1]``."""
    ps, pe, pn = pos
    ns, ne, nn = neg
    if not pn.size or not nn.size:
        return 0.0, 0.0
    cum = np.concatenate([[0.0], np.cumsum(nn)])
    below = cum[np.searchsorted(ne, ps, side="right")]  # negatives surely below each positive run
    above = cum[-1] - cum[np.searchsorted(ns, pe, side="left")]  # negatives surely above it
    return float((pn * below).sum()), float((pn * (cum[-1] - above)).sum())


def _pr_bounds(runs: Sequence[tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]], P: float
               ) -> tuple[float, float]:
    """``(lo, hi)`` of the average precision of rows known by runs ``[(negative runs, positive
    runs) per site]``: the ``k``-th highest positive of run ``r`` has ``TP`` rows of its class and
    ``FP`` of the other at or above its score, with ``k + (positives surely above) ≤ TP ≤ (positives
    possibly at or above)`` and likewise ``FP``; its precision ``TP/(TP+FP)`` lies between the
    extremes."""
    from scipy.special import digamma  # here: a site answering a message in a fresh process skips scipy

    def cat(c: int, k: int) -> np.ndarray:
        return np.concatenate([r[c][k] for r in runs]).astype(np.float64)

    starts = {c: cat(c, 0) for c in (0, 1)}
    ends = {c: cat(c, 1) for c in (0, 1)}
    counts = {c: cat(c, 2) for c in (0, 1)}

    def surely_above(c: int, at: np.ndarray) -> np.ndarray:  # rows of class c in runs starting at or after ``at``
        o = np.argsort(starts[c], kind="stable")
        s, n = starts[c][o], counts[c][o]
        tail = np.concatenate([np.cumsum(n[::-1])[::-1], [0.0]])
        return tail[np.searchsorted(s, at, side="left")]

    def possibly_above(c: int, at: np.ndarray) -> np.ndarray:  # rows of class c in runs ending after ``at``
        o = np.argsort(ends[c], kind="stable")
        e, n = ends[c][o], counts[c][o]
        tail = np.concatenate([np.cumsum(n[::-1])[::-1], [0.0]])
        return tail[np.searchsorted(e, at, side="right")]

    s, e, n = starts[1], ends[1], counts[1]
    sure = surely_above(1, e)  # positives of other runs surely above (a run is never above itself)
    tp_min = 1.0 + sure
    tp_max = np.maximum(possibly_above(1, s), tp_min)
    fp_min, fp_max = surely_above(0, e), possibly_above(0, s)
    # the k-th highest of a run's m whole rows has the k−1 above it too: Σ_k (S+k)/(S+k+F)
    # = m − F·(ψ(S+F+m+1) − ψ(S+F+1)); a fractional remainder gets the k = 1 bound
    m = np.floor(n + 1e-9)
    whole = m - fp_max * (digamma(sure + fp_max + m + 1) - digamma(sure + fp_max + 1))
    lo = float((whole + (n - m) * tp_min / (tp_min + fp_max)).sum() / P)
    hi = float((n * tp_max / (tp_max + fp_min)).sum() / P)
    return lo, hi


def _unit_interval(lo: float, hi: float) -> tuple[float, float]:
    """``[lo, hi]`` within ``[0, 1]`` and ordered (float rounding can push an exact 1 past 1)."""
    lo, hi = min(max(lo, 0.0), 1.0), min(max(hi, 0.0), 1.0)
    return min(lo, hi), hi


def pooled_ranking(hists: Sequence[Any], pairs: Sequence[float | None] | None = None,
                   smoothed: Sequence[bool] | bool = False) -> dict[str, Any]:
    """AUROC and PR-AUC of the pooled rows of one or more sites, each with rigorous bounds.

    Args:
        hists: each site's ``(2, B)`` score histogram (row 0 negatives, row 1 positives),
            exact or smoothed by its release gate.
        pairs: each site's exact :func:`rank_pairs` (``None`` for a site that sent none).
        smoothed: per site (or for all), whether its histogram was smoothed: its rows are
            then known only by runs (:func:`histogram_runs`), otherwise by bins.

    Returns:
        ``auroc`` and ``pr_auc`` (point estimates), ``auroc_bounds`` / ``pr_auc_bounds``
        ``[lo, hi]`` that hold whatever the order of the rows inside a run or bin, and
        ``*_error_bound`` = the largest distance from the point to a bound. The AUROC counts
        pairs of rows inside a site with a ``rank_pairs`` exactly and every other (positive,
        negative) pair from the runs: 1 or 0 when the two runs are disjoint, unknown (between 0 and
        1) when they overlap; its point counts an unknown pair as the sites' own (exactly ranked)
        pairs score on average — ``lo + Â·(hi − lo)`` with ``Â`` their pooled AUROC — or ½ without
        any (on exact bins: a pair in one bin counts ½, as a tie). The PR-AUC point is the middle of its bounds when a
        histogram was smoothed, else the pooled histogram's (:func:`ranking_scores`). Every value
        is ``None`` when the pooled rows lack a class.

    Raises:
        ValueError: a histogram is not ``(2, B)`` with non-negative finite counts, or the
            lists differ in length.
    """
    hs = [np.asarray(h, np.float64) for h in hists]
    pr = list(pairs) if pairs is not None else [None] * len(hs)
    sm = [bool(smoothed)] * len(hs) if isinstance(smoothed, (bool, np.bool_)) else [bool(v) for v in smoothed]
    if len(pr) != len(hs) or len(sm) != len(hs):
        raise ValueError(f"{len(hs)} histograms but {len(pr)} rank pairs and {len(sm)} smoothing flags")
    for h in hs:
        if h.ndim != 2 or h.shape[0] != 2 or h.shape != hs[0].shape or not np.isfinite(h).all() or (h < 0).any():
            raise ValueError(f"a score histogram must be (2, B) non-negative counts, got shape {h.shape}")
    none = {"auroc": None, "pr_auc": None, "auroc_error_bound": None, "pr_auc_error_bound": None,
            "auroc_bounds": None, "pr_auc_bounds": None}
    if not hs:
        return none
    P, N = sum(float(h[1].sum()) for h in hs), sum(float(h[0].sum()) for h in hs)
    if not (P > 0 and N > 0):
        return none
    runs = [(histogram_runs(h[0], s), histogram_runs(h[1], s)) for h, s in zip(hs, sm)]
    lo = hi = 0.0
    within = within_pairs = 0.0  # the sites' exact rank pairs and how many pairs they rank
    for i in range(len(hs)):
        for j in range(len(hs)):
            if i == j and pr[i] is not None:
                lo, hi = lo + pr[i], hi + pr[i]
                within, within_pairs = within + pr[i], within_pairs + float(hs[i][1].sum() * hs[i][0].sum())
            else:
                l, u = _pair_bounds(runs[i][1], runs[j][0])
                lo, hi = lo + l, hi + u
    auroc_lo, auroc_hi = _unit_interval(lo / (P * N), hi / (P * N))
    # an unordered pair counts as the sites' own pairs do on average (½ without any)
    rate = min(max(within / within_pairs, 0.0), 1.0) if within_pairs > 0 else 0.5
    auroc = auroc_lo + rate * (auroc_hi - auroc_lo)
    pr_lo, pr_hi = _unit_interval(*_pr_bounds(runs, P))
    if any(sm):
        pr_auc = 0.5 * (pr_lo + pr_hi)
    else:
        pr_auc = min(max(float(ranking_scores(sum(hs))["pr_auc"]), pr_lo), pr_hi)
    return {"auroc": auroc, "pr_auc": pr_auc,
            "auroc_error_bound": max(auroc - auroc_lo, auroc_hi - auroc),
            "pr_auc_error_bound": max(pr_auc - pr_lo, pr_hi - pr_auc),
            "auroc_bounds": [auroc_lo, auroc_hi], "pr_auc_bounds": [pr_lo, pr_hi]}


def ranking_scores(hist: Any) -> dict[str, float | None]:
    """AUROC and PR-AUC (average precision) of a ``(2, B)`` score histogram, with error bounds.

    The values are exactly ``sklearn.metrics.roc_auc_score`` and
    ``average_precision_score`` on the rows with each probability replaced by its bin
    (rows in one bin tie). Against the unbinned probabilities the error is at most the
    returned, data-dependent bounds (0 when no bin holds both classes, for AUROC):

    - ``auroc_error_bound = Σ_b P_b·N_b / (2·P·N)``: only (positive, negative) pairs in
      the same bin can be ordered differently, and a tie already scores them ½.
    - ``pr_auc_error_bound = Σ_b (P_b/P)·(hi_b − lo_b)`` with ``hi_b = (T_b+P_b)/(A_b+P_b)``
      and ``lo_b = (T_b+1)/(A_b+N_b+1)``, where ``T_b``/``A_b`` count the positives/all rows
      in higher bins: every positive in bin ``b`` has its precision in ``[lo_b, hi_b]``
      whatever the order inside the bin, tied or not.

    ``P_b``/``N_b`` are the positives/negatives in bin ``b``, ``P``/``N`` their totals.
    Both scores and bounds are ``None`` when one class is absent.

    Raises:
        ValueError: ``hist`` is not ``(2, B)`` with non-negative finite counts.
    """
    h = np.asarray(hist, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] != 2 or not np.isfinite(h).all() or (h < 0).any():
        raise ValueError(f"a score histogram must be (2, B) non-negative counts, got shape {h.shape}")
    neg, pos = h
    P, N = pos.sum(), neg.sum()
    if P == 0 or N == 0:
        return {"auroc": None, "pr_auc": None, "auroc_error_bound": None, "pr_auc_error_bound": None}
    neg_below = np.cumsum(neg) - neg
    auroc = float((pos * (neg_below + 0.5 * neg)).sum() / (P * N))
    auroc_bound = float(0.5 * (pos * neg).sum() / (P * N))
    # descending thresholds: positives / rows in strictly higher bins
    pos_above = pos[::-1].cumsum()[::-1] - pos
    all_above = (pos + neg)[::-1].cumsum()[::-1] - pos - neg
    has = pos > 0
    precision = (pos_above + pos)[has] / (all_above + pos + neg)[has]
    pr_auc = float((pos[has] / P * precision).sum())
    hi = (pos_above + pos)[has] / (all_above + pos)[has]
    lo = (pos_above + 1)[has] / (all_above + neg + 1)[has]
    pr_bound = float((pos[has] / P * (hi - lo)).sum())
    return {"auroc": auroc, "pr_auc": pr_auc, "auroc_error_bound": auroc_bound, "pr_auc_error_bound": pr_bound}


def brier_sum(y_true: Any, proba: Any) -> float:
    """Sum over rows of ``Σ_c (proba[i, c] − [y_i = c])²``; ``proba`` is ``(n, C)``.

    Sites send this sum; :func:`evaluation_scores` turns the pooled sum into the Brier
    score. Raises ``ValueError`` on mismatched shapes or labels outside ``0..C-1``.
    """
    p = np.asarray(proba, dtype=np.float64)
    t = np.asarray(y_true, dtype=np.int64).ravel()
    if p.ndim != 2 or p.shape[0] != t.size:
        raise ValueError(f"proba must be (n, C) with n = {t.size} labels, got shape {p.shape}")
    if t.size and (t.min() < 0 or t.max() >= p.shape[1]):
        raise ValueError(f"labels must be in 0..{p.shape[1] - 1}")
    d = p.copy()
    d[np.arange(t.size), t] -= 1.0
    return float((d * d).sum())


def evaluation_scores(cm: Any, hist: Any = None, brier: float | None = None,
                      pairs: float | None = None, smoothed: bool = False) -> dict[str, Any]:
    """Every metric of one evaluation, from sums only (one site's or the pooled sums).

    Args:
        cm: ``(C, C)`` confusion matrix (:func:`confusion`).
        hist: ``(2, B)`` score histogram (:func:`score_histogram`, binary only) or None.
        brier: :func:`brier_sum` over the same rows, or None.
        pairs: :func:`rank_pairs` over the same rows (one site's), or None: the AUROC is
            then exact (bounds ``[a, a]``, error bound 0) instead of the histogram's.
        smoothed: ``hist`` was smoothed by a release gate (known by runs, not bins).

    Returns:
        :func:`scores_from_confusion`'s keys, ``confusion`` (nested lists, rows = true
        class), and — when their inputs are given — ``auroc``, ``pr_auc``, their
        ``*_bounds`` ``[lo, hi]`` and ``*_error_bound`` (:func:`pooled_ranking`) and ``brier``:
        the mean over rows, halved for two classes, i.e. ``sklearn.metrics.brier_score_loss``
        (binary: mean ``(p₁ − y)²``; more classes: mean ``Σ_c (p_c − y_c)²``). Absent inputs
        give no key.
    """
    m = np.asarray(cm)
    out: dict[str, Any] = {**scores_from_confusion(m), "confusion": m.astype(np.int64).tolist()}
    if hist is not None:
        out.update(pooled_ranking([hist], [pairs], smoothed))
    if brier is not None:
        n = out["n"]
        out["brier"] = (float(brier) / n / (2 if m.shape[0] == 2 else 1)) if n else None
    return out


#: the per-site sums a regression evaluation releases (each an aggregate over the site's part)
REGRESSION_SUMS = ("sse", "sae", "sum_y", "sum_y2")


def regression_sums(y_true: Any, y_pred: Any) -> dict[str, float]:
    """``{"sse", "sae", "sum_y", "sum_y2"}`` of predictions ``(n,)`` against targets ``(n,)``:
    Σ(ŷ−y)², Σ|ŷ−y|, Σy, Σy² (what :func:`regression_scores` pools)."""
    y = np.asarray(y_true, dtype=np.float64)
    e = np.asarray(y_pred, dtype=np.float64) - y
    return {"sse": float(e @ e), "sae": float(np.abs(e).sum()), "sum_y": float(y.sum()), "sum_y2": float(y @ y)}


def regression_scores(sse: float, sae: float, sum_y: float, sum_y2: float, n: float) -> dict[str, float | None]:
    """RMSE, MAE and R² from summed :func:`regression_sums` over ``n`` rows (pooled over sites:
    sum each term, then call this once; the result equals the metrics of the pooled rows).

    R² = 1 − SSE / SST with SST = Σy² − (Σy)²/n around the evaluated rows' own mean (``None``
    when SST is 0 or ``n < 2``); every score is ``None`` without rows.
    """
    if not n > 0:
        return {"rmse": None, "mae": None, "r2": None, "n": 0}
    sst = sum_y2 - sum_y * sum_y / n
    r2 = 1.0 - sse / sst if n >= 2 and sst > 1e-12 * max(1.0, abs(sum_y2)) else None
    return {"rmse": float(np.sqrt(max(sse, 0.0) / n)), "mae": float(max(sae, 0.0) / n),
            "r2": None if r2 is None else float(r2), "n": int(round(n))}
