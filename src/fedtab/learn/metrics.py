"""Classification metrics computed from confusion matrices, so they pool exactly.

A site reports its ``(C, C)`` confusion matrix (rows = true class, columns =
predicted); summing the sites' matrices and scoring the sum gives exactly the
metric on the pooled test rows, without any row leaving a site. The same holds for
the ranking metrics (AUROC, PR-AUC) computed from per-class histograms of predicted
probabilities on a fixed grid, and for the Brier score from a sum of squared errors.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

__all__ = ["confusion", "scores_from_confusion", "score_histogram", "ranking_scores", "brier_sum",
           "evaluation_scores", "rank_pairs", "cross_pairs", "pooled_auroc", "SCORE_BINS"]


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
                      pairs: float | None = None) -> dict[str, Any]:
    """Every metric of one evaluation, from sums only (one site's or the pooled sums).

    Args:
        cm: ``(C, C)`` confusion matrix (:func:`confusion`).
        hist: ``(2, B)`` score histogram (:func:`score_histogram`, binary only) or None.
        brier: :func:`brier_sum` over the same rows, or None.
        pairs: :func:`rank_pairs` over the same rows (one site's), or None: the AUROC is
            then exact (error bound 0) instead of the histogram's.

    Returns:
        :func:`scores_from_confusion`'s keys, ``confusion`` (nested lists, rows = true
        class), and — when their inputs are given — ``auroc``, ``pr_auc`` and their
        ``*_error_bound`` (:func:`ranking_scores`) and ``brier``: the mean over rows,
        halved for two classes, i.e. ``sklearn.metrics.brier_score_loss`` (binary: mean
        ``(p₁ − y)²``; more classes: mean ``Σ_c (p_c − y_c)²``). Absent inputs give no key.
    """
    m = np.asarray(cm)
    out: dict[str, Any] = {**scores_from_confusion(m), "confusion": m.astype(np.int64).tolist()}
    if hist is not None:
        out.update(ranking_scores(hist))
        if pairs is not None and out.get("auroc") is not None:
            h = np.asarray(hist, np.float64)
            out["auroc"], out["auroc_error_bound"] = float(pairs) / float(h[1].sum() * h[0].sum()), 0.0
    if brier is not None:
        n = out["n"]
        out["brier"] = (float(brier) / n / (2 if m.shape[0] == 2 else 1)) if n else None
    return out
