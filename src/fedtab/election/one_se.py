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
buy a bigger one — unlike a fixed tolerance, which ignores how noisy the scores are.

The log-loss alone can trade ranking for sparsity: a few columns with well-calibrated
probabilities can sit within one standard error of all columns while ranking patients
clearly worse. :func:`guarded_one_standard_error` therefore also reads every candidate's CV
AUROC and never chooses one more than ``tolerance`` (0.01) below the best CV AUROC when a
candidate within it exists: the sparsest such candidate within one standard error, else the
lowest-log-loss one within it. What it passed over is returned (:class:`AurocGuard`) for the
report to say. Pure functions, no federation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Scored", "OneSEChoice", "standard_error", "one_standard_error", "AurocGuard",
           "guarded_one_standard_error", "AUROC_TOLERANCE"]

#: the largest CV AUROC shortfall to the best candidate a choice may have unannounced
AUROC_TOLERANCE = 0.01


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


@dataclass(frozen=True)
class AurocGuard:
    """What the AUROC guard of :func:`guarded_one_standard_error` did.

    Attributes:
        tolerance: the largest allowed CV AUROC shortfall. best / best_auroc: the candidate
            with the highest CV AUROC and that AUROC (``None`` when no candidate has one).
        rule_choice / rule_auroc: the plain one-SE rule's choice and its CV AUROC.
        chosen_auroc: the CV AUROC of the final choice; shortfall = ``best_auroc − chosen_auroc``.
        passed_over: candidates the rule would have preferred (sparser or the rule's own
            choice) set aside because their AUROC fell more than ``tolerance`` below the best.
        flagged: the final choice is more than ``tolerance`` below the best (or has no AUROC
            while another candidate has one); by construction only a caller's own choice
            (not this function's) can be flagged, and the report must then say so.
    """

    tolerance: float
    best: str | None
    best_auroc: float | None
    rule_choice: str
    rule_auroc: float | None
    chosen_auroc: float | None
    shortfall: float | None
    passed_over: tuple[str, ...]
    flagged: bool

    def to_dict(self) -> dict[str, object]:
        return {"tolerance": self.tolerance, "best": self.best, "best_auroc": self.best_auroc,
                "rule_choice": self.rule_choice, "rule_auroc": self.rule_auroc, "chosen_auroc": self.chosen_auroc,
                "shortfall": self.shortfall, "passed_over": list(self.passed_over), "flagged": self.flagged}


def _margin(c: Scored, best: Scored, paired: bool) -> float:
    if c is best:
        return 0.0
    if not paired:
        return best.se
    return standard_error(np.asarray(c.fold_scores, np.float64) - np.asarray(best.fold_scores, np.float64))


def guarded_one_standard_error(candidates: Sequence[Scored], aurocs: Sequence[float | None], *,
                               paired: bool = True, tolerance: float = AUROC_TOLERANCE
                               ) -> tuple[OneSEChoice, AurocGuard]:
    """The one-standard-error rule that does not trade AUROC for sparsity unannounced.

    ``aurocs[i]`` is candidate ``i``'s CV AUROC (``None``: unknown). The rule's choice stands
    when no AUROC is known or its AUROC is within ``tolerance`` of the best CV AUROC.
    Otherwise (also when its own AUROC is unknown but another's is known) the choice is the least complex candidate
    within one standard error whose AUROC is within ``tolerance``; if there is none, the
    lowest-log-loss candidate whose AUROC is within ``tolerance`` (there always is one: the
    best-AUROC candidate). ``OneSEChoice.se`` / ``threshold`` are the final choice's.

    Raises:
        ValueError: as :func:`one_standard_error`; ``aurocs`` of another length than
            ``candidates``; a negative or non-finite ``tolerance``; an AUROC outside ``[0, 1]``.
    """
    if len(aurocs) != len(candidates):
        raise ValueError(f"{len(candidates)} candidates but {len(aurocs)} AUROCs")
    if not (np.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"the AUROC tolerance must be finite and non-negative, got {tolerance!r}")
    auc = [None if a is None else float(a) for a in aurocs]
    if any(a is not None and not 0.0 <= a <= 1.0 for a in auc):
        raise ValueError("a CV AUROC must lie in [0, 1]")
    rule = one_standard_error(candidates, paired=paired)
    idx = {id(c): i for i, c in enumerate(candidates)}
    r = idx[id(rule.chosen)]
    known = [i for i, a in enumerate(auc) if a is not None]
    if not known:
        return rule, AurocGuard(tolerance, None, None, rule.chosen.name, None, None, None, (), False)
    b = max(known, key=lambda i: (auc[i], -candidates[i].complexity))
    best_auc = auc[b]
    assert best_auc is not None
    ok = [i for i in known if auc[i] >= best_auc - tolerance - 1e-12]  # type: ignore[operator]

    def guard(pick: int, passed: tuple[str, ...]) -> AurocGuard:
        a = auc[pick]
        return AurocGuard(tolerance, candidates[b].name, best_auc, rule.chosen.name, auc[r], a,
                          None if a is None else best_auc - a, passed,
                          a is None or best_auc - a > tolerance + 1e-12)

    if r in ok:
        return rule, guard(r, ())
    best = rule.best
    margins = {i: _margin(c, best, paired) for i, c in enumerate(candidates)}
    within = [i for i in ok if candidates[i].score - best.score <= margins[i] + 1e-12]
    if within:
        pick = min(within, key=lambda i: (candidates[i].complexity, candidates[i].score))
    else:
        pick = min(ok, key=lambda i: (candidates[i].score, candidates[i].complexity))
    chosen = candidates[pick]
    passed = tuple(c.name for i, c in enumerate(candidates)
                   if i not in ok and (i == r or c.complexity < chosen.complexity)
                   and c.score - best.score <= margins[i] + 1e-12)
    return (OneSEChoice(chosen, best, best.score + margins[pick], margins[pick]), guard(pick, passed))
