"""95 % intervals of an AUROC from what a job's evaluation releases: the AUROC and the class counts.

A site's evaluation reply carries its confusion matrix (rows = true class), so the report
knows how many test positives and negatives lie behind every AUROC, per site and pooled,
without any new statistic leaving a site. The interval is Hanley & McNeil's (Radiology
143:29-36, 1982): the standard error of the Mann-Whitney AUROC under their exponential
approximation of the two placement variances,

    SE² = (A(1−A) + (P−1)(Q₁−A²) + (N−1)(Q₂−A²)) / (P·N),  Q₁ = A/(2−A),  Q₂ = 2A²/(1+A),

and ``A ± 1.96·SE`` clipped to ``[0, 1]``. It is close to DeLong's for smooth score
distributions and needs no score; it is an approximation, and with a handful of rows of a
class no interval is trustworthy: :data:`FEW_ROWS` marks such an AUROC. At ``A`` = 0 or 1 the
formula gives SE = 0, which is no interval at all: ``low``/``high`` are then ``None``.

An AUROC pooled from score histograms comes with bounds ``auroc_bounds`` ``[lo, hi]`` that
hold the exact AUROC of the same predictions (pairs of rows the histograms do not order count
as unknown, :func:`fedtab.learn.metrics.pooled_ranking`); the interval runs from ``lo`` minus
its margin to ``hi`` plus it, so it covers the exact AUROC's interval. An older result with
only ``auroc_error_bound`` is widened by that bound on both sides.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

__all__ = ["Z95", "FEW_ROWS", "hanley_mcneil_se", "auroc_interval", "class_counts", "auroc_bounds", "bounded"]

#: the two-sided 95 % normal quantile
Z95 = 1.959963984540054
#: a class with fewer test rows than this makes an AUROC unreliable (the report warns)
FEW_ROWS = 10


def hanley_mcneil_se(auroc: float, positives: int, negatives: int) -> float:
    """Hanley-McNeil standard error of an AUROC over ``positives`` × ``negatives`` rows.

    Raises:
        ValueError: a count below 1, or ``auroc`` outside ``[0, 1]``.
    """
    a, p, n = float(auroc), int(positives), int(negatives)
    if p < 1 or n < 1:
        raise ValueError(f"an AUROC needs rows of both classes, got {p} positives and {n} negatives")
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"AUROC must be in [0, 1], got {a}")
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (p - 1) * (q1 - a * a) + (n - 1) * (q2 - a * a)) / (p * n)
    return math.sqrt(max(var, 0.0))


def class_counts(metrics: Mapping[str, Any]) -> tuple[int, int] | None:
    """``(positives, negatives)`` of a binary evaluation (from its ``confusion``), else ``None``."""
    cm = metrics.get("confusion")
    if not isinstance(cm, list) or len(cm) != 2 or not all(isinstance(r, list) and len(r) == 2 for r in cm):
        return None
    try:
        return int(round(sum(map(float, cm[1])))), int(round(sum(map(float, cm[0]))))
    except (TypeError, ValueError):
        return None


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def auroc_bounds(metrics: Mapping[str, Any] | None, key: str = "auroc") -> tuple[float, float] | None:
    """``(lo, hi)`` that hold the exact ``metrics[key]`` (``auroc`` or ``pr_auc``): its
    ``*_bounds``, else the point ± ``*_error_bound``; ``None`` when the value has no bound (an
    estimate the report must not headline)."""
    if not isinstance(metrics, Mapping) or not _finite(metrics.get(key)):
        return None
    b = metrics.get(f"{key}_bounds")
    if isinstance(b, (list, tuple)) and len(b) == 2 and all(_finite(v) for v in b) and b[0] <= b[1]:
        return float(b[0]), float(b[1])
    err = metrics.get(f"{key}_error_bound")
    if _finite(err):
        a = float(metrics[key])
        return max(0.0, a - float(err)), min(1.0, a + float(err))
    return None


def bounded(metrics: Mapping[str, Any] | None, key: str = "auroc") -> bool:
    """Whether ``metrics[key]`` is exact or comes with bounds (:func:`auroc_bounds`)."""
    return auroc_bounds(metrics, key) is not None


def auroc_interval(metrics: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The 95 % interval of ``metrics["auroc"]`` (an :func:`fedtab.learn.metrics.evaluation_scores`
    dict): ``{auroc, low, high, se, positives, negatives, few, binning, bounds}``; ``few`` is true when
    a class has fewer than :data:`FEW_ROWS` test rows; ``low``/``high`` are ``None`` at an AUROC of 0
    or 1; ``bounds`` is :func:`auroc_bounds` (``None``: an estimate without a bound) and ``binning``
    half its width. ``None`` without an AUROC or without class counts."""
    if not isinstance(metrics, Mapping):
        return None
    a, counts = metrics.get("auroc"), class_counts(metrics)
    if not isinstance(a, (int, float)) or isinstance(a, bool) or not math.isfinite(a) or counts is None:
        return None
    p, n = counts
    if p < 1 or n < 1:
        return None
    a = min(max(float(a), 0.0), 1.0)
    a = 1.0 if a > 1 - 1e-9 else 0.0 if a < 1e-9 else a  # float noise of an exact 0 or 1
    se = hanley_mcneil_se(a, p, n)
    bounds = auroc_bounds(metrics)
    lo, hi = bounds if bounds is not None else (a, a)
    low = high = None
    if se > 0:
        low, high = max(0.0, lo - Z95 * se), min(1.0, hi + Z95 * se)
    return {"auroc": a, "low": low, "high": high, "se": se, "positives": p, "negatives": n,
            "few": min(p, n) < FEW_ROWS, "binning": (hi - lo) / 2, "bounds": bounds}
