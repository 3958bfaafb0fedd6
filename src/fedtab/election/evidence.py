"""Combined evidence: the sites' per-feature p-values pooled into one test (Stouffer).

The plain rule's consensus is the *intersection*: a feature every holder selected.
Under label skew that is fragile twice over. A site that mostly sees one class has
little power, so its selector keeps almost nothing and the intersection is empty; and
no single site has the power the pooled rows have, so the union misses most of what
the selector finds on all rows at once (``benchmarks/scale.py``: at Dirichlet
α = 0.1 over 30 sites the union held 4 of the 11 informative features the pooled
ANOVA test finds).

``consensus="stouffer"`` replaces the intersection by a meta-analysis of the sites'
tests. Each voting site sends, with its ballot, the p-value of its selector's test per
feature (ANOVA F, chi², a scikit-learn ``SelectKBest``/``SelectFdr``/... over such a
test). For feature j held by sites i:

    z_ij = Φ⁻¹(1 − p_ij)            (p clipped into [P_FLOOR, 1 − P_FLOOR])
    Z_j  = Σ_i √m_i · z_ij / √(Σ_i m_i)
    p_j  = 1 − Φ(Z_j)

(Stouffer's weighted Z). The weight ``m_i`` is the site's *effective* sample size
(:func:`effective_rows`, sent with the ballot): its row count scaled by its class
balance, ``n · (1 − Σ_c p_c²) / (1 − 1/C)`` -- ``n`` for balanced classes (and for a
continuous target), about ``2 · n_minority`` for two very unbalanced classes, as the
two-sample test's power scales. Weighting by raw ``n`` would let a large site that saw
six rows of one class drown the others' evidence in its noise.
The consensus is the features whose ``p_j`` pass Benjamini-Hochberg at
``consensus_alpha`` among the features held by at least ``min_holders`` sites. The
rest of the rule is unchanged: the union's other features are disputed and
``ceil(fd · |disputed|)`` of them are admitted by the vote.

Under H0 each ``z_ij`` is standard normal whatever the site's size or class balance,
so a site with a handful of minority rows adds noise of weight √n_i but cannot veto a
feature the others support — the property the intersection lacks.

Trust. The combination believes each site's p-values as much as the vote believes its
scores, and that is a lot: one hostile site holding 10 % of the effective rows and
claiming p = 0 everywhere lifts every Z by up to 8.2 · √0.1 = 2.6 (the clip at
``P_FLOOR`` bounds it), and on the ``benchmarks.scale`` non-IID data ~800 of the 980
noise columns then pass. In robust mode (``run_election(..., robust=True)``) each
feature's test leaves out the site with the largest positive term ``√m_i · z_ij``: no
single site's p-values can make a feature consensus (a feature only one site supports
never is). That costs power when one site holds most of the evidence for a feature
(in ``tests/election/test_election_stouffer.py``'s 10-site label-skew example, where one site
holds most of the evidence, 3 of the 6 signal columns were then elected instead of 6);
on the benchmark's 30-site partitions all 11 columns stayed consensus. Two colluding sites
can still push (the second's term stays in).

What it cannot do: each site's test only contrasts its own rows, so the evidence that
lies *between* sites (class 0 seen at one, class 1 at another) is lost; the pooled
test from per-class sums (:func:`~fedtab.federation.workflows.pooled_anova.server.run_pooled_anova`)
uses it, but is confounded when sites' feature distributions differ for other reasons.

Pure functions over numpy; the streaming tally keeps ``Σ √n_i z_ij`` per feature.
"""

from __future__ import annotations

from numbers import Real
from typing import Any

import numpy as np

__all__ = ["CONSENSUS_RULES", "P_FLOOR", "check_consensus", "check_consensus_alpha", "effective_rows", "z_scores",
           "combined_pvalues", "benjamini_hochberg"]

#: ``"intersection"`` (the rule) or ``"stouffer"`` (combined p-values, see the module docstring).
CONSENSUS_RULES = ("intersection", "stouffer")
#: p-values are clipped into ``[P_FLOOR, 1 - P_FLOOR]`` before Φ⁻¹ (|z| ≤ 8.2).
P_FLOOR = 1e-16


def check_consensus(value: Any) -> str:
    """``value`` if it is one of :data:`CONSENSUS_RULES`, else ``ValueError``."""
    if value not in CONSENSUS_RULES:
        raise ValueError(f"unknown consensus {value!r}; expected one of {CONSENSUS_RULES}")
    return str(value)


def check_consensus_alpha(alpha: Any) -> float:
    """The Benjamini-Hochberg level as a float in (0, 1), else ``ValueError``."""
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, Real) or not 0.0 < float(alpha) < 1.0:
        raise ValueError(f"consensus_alpha must be a number in (0, 1), got {alpha!r}")
    return float(alpha)


def effective_rows(y: Any, regression: bool) -> float:
    """A site's Stouffer weight: ``len(y)`` for a continuous target, else
    ``n · (1 − Σ_c p_c²) / (1 − 1/C)`` over its ``C`` classes (0 for a single class)."""
    y = np.asarray(y)
    n = float(y.size)
    if regression or n == 0:
        return n
    _, counts = np.unique(y, return_counts=True)
    if counts.size < 2:
        return 0.0
    p = counts / n
    return float(n * (1.0 - np.sum(p * p)) / (1.0 - 1.0 / counts.size))


def z_scores(pvalues: np.ndarray) -> np.ndarray:
    """``Φ⁻¹(1 − p)`` per entry of ``pvalues`` (in [0, 1]), clipped to ``[P_FLOOR, 1 − P_FLOOR]``."""
    from scipy.special import ndtri

    return -ndtri(np.clip(np.asarray(pvalues, dtype=np.float64), P_FLOOR, 1.0 - P_FLOOR))


def combined_pvalues(weighted_z: np.ndarray, weight_sq: np.ndarray) -> np.ndarray:
    """Stouffer's p-values ``1 − Φ(Σ w z / √Σ w²)`` ``(d,)``; 1.0 where ``weight_sq`` is 0.

    Args:
        weighted_z: ``(d,)`` ``Σ_i w_i z_ij`` over the holders of each feature.
        weight_sq: ``(d,)`` ``Σ_i w_i²`` over the same holders (``Σ n_i`` for ``w = √n``).
    """
    from scipy.special import ndtr

    z = np.zeros_like(weighted_z, dtype=np.float64)
    held = weight_sq > 0
    z[held] = weighted_z[held] / np.sqrt(weight_sq[held])
    out = np.ones_like(z)
    out[held] = ndtr(-z[held])
    return out


def benjamini_hochberg(pvalues: np.ndarray, alpha: float, eligible: np.ndarray | None = None) -> np.ndarray:
    """``(d,)`` bool: the features Benjamini-Hochberg keeps at FDR ``alpha``.

    Only ``eligible`` features (default all) are tested, so the correction counts
    only them; the others are never kept. Ties are kept together (step-up rule).
    """
    p = np.asarray(pvalues, dtype=np.float64)
    idx = np.arange(p.size) if eligible is None else np.flatnonzero(eligible)
    keep = np.zeros(p.size, dtype=bool)
    m = idx.size
    if m == 0:
        return keep
    sub = p[idx]
    order = np.argsort(sub, kind="stable")
    passed = sub[order] <= alpha * np.arange(1, m + 1) / m
    if passed.any():
        cutoff = sub[order][np.flatnonzero(passed).max()]
        keep[idx[sub <= cutoff]] = True
    return keep
