"""Classification metrics computed from confusion matrices, so they pool exactly.

A site reports its ``(C, C)`` confusion matrix (rows = true class, columns =
predicted); summing the sites' matrices and scoring the sum gives exactly the
metric on the pooled test rows, without any row leaving a site.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["confusion", "scores_from_confusion"]


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
