"""The one-standard-error rule: the simplest candidate whose cross-validated score is
within one standard error of the best (Breiman et al. 1984; Hastie, Tibshirani & Friedman,
*Elements of Statistical Learning*, §7.10).

A candidate (a feature mask, a personalisation mode) has a score per cross-validation fold
(lower is better: a log-loss) and an overall score (the row-weighted mean over the folds,
given). The rule picks the candidate of least ``complexity`` whose score is within one
standard error of the best candidate's (ties: the better score). Two standard errors, both
from the folds:

* ``paired=True`` (the default) — the standard error of the candidate's *difference* to the
  best, ``std(fold_c − fold_best, ddof=1) / sqrt(K)``: every candidate is scored on the same
  fold rows, so the folds' shared difficulty cancels and what is left is the noise of the
  comparison itself;
* ``paired=False`` — the textbook rule: the best candidate's own standard error
  ``std(fold_best, ddof=1) / sqrt(K)`` for every candidate (more parsimonious: it counts the
  folds' differences in difficulty as noise).

Either way a flat curve picks the smaller mask, and a dip smaller than the noise does not
buy a bigger one — unlike a fixed tolerance, which ignores how noisy the scores are. Pure
functions, no federation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Scored", "OneSEChoice", "standard_error", "one_standard_error"]


@dataclass(frozen=True)
class Scored:
    """A candidate's cross-validated score.

    Attributes:
        name: the candidate's label. complexity: what the rule minimises (kept columns...).
        score: the overall CV score (lower is better). fold_scores: ``(K,)`` the score of
            each fold (``K >= 2``).
    """

    name: str
    complexity: float
    score: float
    fold_scores: tuple[float, ...]

    @property
    def se(self) -> float:
        return standard_error(self.fold_scores)


@dataclass(frozen=True)
class OneSEChoice:
    """The rule's outcome: ``chosen`` and ``best`` (lowest score) candidates, and the
    ``threshold`` = best score + its standard error ``se``."""

    chosen: Scored
    best: Scored
    threshold: float
    se: float

    def to_dict(self) -> dict[str, object]:
        return {"rule": "one-standard-error", "chosen": self.chosen.name, "best": self.best.name,
                "threshold": self.threshold, "se": self.se}


def standard_error(fold_scores: Sequence[float]) -> float:
    """``std(fold_scores, ddof=1) / sqrt(K)``.

    Raises:
        ValueError: fewer than 2 folds, or a non-finite fold score.
    """
    a = np.asarray(fold_scores, dtype=np.float64)
    if a.ndim != 1 or a.size < 2:
        raise ValueError(f"a standard error from folds needs at least 2 fold scores, got {a.size}")
    if not np.isfinite(a).all():
        raise ValueError("fold scores must be finite")
    return float(a.std(ddof=1) / np.sqrt(a.size))


def one_standard_error(candidates: Sequence[Scored], *, paired: bool = True) -> OneSEChoice:
    """Choose by the one-standard-error rule (see the module docstring).

    ``OneSEChoice.se`` / ``threshold`` are the best candidate's own standard error and
    score + it (``paired=False``), or the chosen candidate's paired standard error and the
    best score + it (``paired=True``).

    Raises:
        ValueError: no candidates, a non-finite score, or fold scores the rule cannot use
            (fewer than 2, not finite, or of different counts when ``paired``).
    """
    if not candidates:
        raise ValueError("the one-standard-error rule needs at least one candidate")
    if not all(np.isfinite(c.score) for c in candidates):
        raise ValueError("candidate scores must be finite")
    best = min(candidates, key=lambda c: (c.score, c.complexity))
    if not paired:
        se = best.se
        threshold = best.score + se
        within = [c for c in candidates if c.score <= threshold + 1e-12]
        chosen = min(within, key=lambda c: (c.complexity, c.score))
        return OneSEChoice(chosen, best, threshold, se)
    ref = np.asarray(best.fold_scores, dtype=np.float64)
    margins: dict[int, float] = {}
    for i, c in enumerate(candidates):
        folds = np.asarray(c.fold_scores, dtype=np.float64)
        if folds.shape != ref.shape:
            raise ValueError(f"candidate {c.name!r} has {folds.size} fold scores, the best has {ref.size}")
        margins[i] = 0.0 if c is best else standard_error(folds - ref)
    within = [i for i, c in enumerate(candidates) if c.score - best.score <= margins[i] + 1e-12]
    pick = min(within, key=lambda i: (candidates[i].complexity, candidates[i].score))
    return OneSEChoice(candidates[pick], best, best.score + margins[pick], margins[pick])
