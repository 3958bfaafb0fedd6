"""Forward selection by Rao score tests in a logistic model, from sums over rows.

A feature can separate the classes only *jointly* with others (``make_classification``
puts the class clusters on hypercube vertices: a column whose two class means agree
still carries signal once the others are known). A marginal test (ANOVA F, the
sites' ballots, their Stouffer combination) cannot see it. Forward selection with
score tests can, and every quantity it needs is a sum over rows, so a federation
computes it *exactly*: each site replies sums, the server adds them.

For a binary target ``y ∈ {0, 1}`` and standardised features ``Z`` ``(n, d)``, with
``S`` the features selected so far (empty at the start) and ``A = [1, Z_S]``
``(n, m)``, ``m = |S| + 1``:

1. fit ``logit P(y = 1) = A β`` by Newton's method: the step is
   ``(H + ridge·I)⁻¹ g`` with ``g = Σ_i a_i (y_i − p_i)`` and ``H = Σ_i w_i a_i a_iᵀ``,
   ``w_i = p_i (1 − p_i)`` (halved while the log-likelihood drops);
2. at the fit, for every feature ``j`` not in ``S``, the score
   ``U_j = Σ_i z_ij (y_i − p_i)``, its information
   ``v_j = Σ_i w_i z_ij² − I_jS H⁻¹ I_Sj`` with ``I_jS = Σ_i w_i z_ij a_iᵀ``, and
   ``z_j = U_j / √v_j`` (two-sided normal p-value);
3. Benjamini-Hochberg (or Benjamini-Yekutieli, ``fdr_method="by"``) at ``alpha`` over the
   features not in ``S``; every feature that passes joins ``S``; stop when none passes (or
   after ``max_steps``).

Assumptions: the logistic model with the selected features is the reference; the
score test is asymptotic (large pooled ``n``); the correction is applied afresh at every
step, so the FDR control of the whole sequence is approximate. A feature almost collinear
with ``S`` (``v_j`` below ``COLLINEAR`` of its raw information) is never tested (p = 1).

**Selection with error control** (:func:`fdr_score_selection`): one step only — the score
test of every feature against the intercept-only model (``H0_j``: the feature is not
associated with the label) and one correction at level ``q`` over all ``d`` p-values. Its
false discovery rate is at most ``q`` (asymptotically in the pooled ``n``): BH for
independent or positively dependent p-values, BY (``q / Σ 1/k`` in effect) under any
dependence. It cannot find a column whose signal shows only jointly with others.

:func:`site_sums` is a site's reply (pure numpy), :func:`forward_score_selection` is
the server's loop over any source of summed replies — the federated workflow
(:mod:`fedtab.federation.workflows.score_test.server`) and :func:`pooled_score_selection` (the same
procedure on one pooled matrix) run the same code.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..learn.models import sigmoid

__all__ = ["ScoreStep", "ScoreSelection", "site_sums", "newton_step", "score_statistics", "forward_score_selection",
           "fdr_score_selection", "fdr_select", "check_fdr", "pooled_score_selection", "pooled_table_selection",
           "NEWTON_KEYS", "SCORE_KEYS", "COLLINEAR", "MAX_COEF", "FDR_METHODS"]

#: arrays of a Newton reply: ``grad`` (m,), ``hess`` (m, m), ``loglik`` (1,)
NEWTON_KEYS = ("grad", "hess", "loglik")
#: arrays a score reply adds: ``score`` (d,), ``info_diag`` (d,), ``info_cross`` (d, m)
SCORE_KEYS = ("score", "info_diag", "info_cross")
#: a fitted coefficient (standardised units) beyond this means the selected columns separate
#: the classes (no maximum-likelihood estimate): the selection stops there
MAX_COEF = 50.0
#: a feature whose conditional information ``v_j`` is below this fraction of ``Σ w z_j²``
#: is (numerically) a combination of the selected ones and is not tested
COLLINEAR = 1e-8

#: multiple-testing corrections: Benjamini-Hochberg (independent or positively dependent
#: p-values) and Benjamini-Yekutieli (any dependence)
FDR_METHODS = ("bh", "by")

Sums = Mapping[str, np.ndarray]


def check_fdr(q: float, method: str = "bh") -> None:
    """Refuse an FDR level outside (0, 1) or a method not in :data:`FDR_METHODS`.

    Raises:
        ValueError: one line naming the bad value.
    """
    if isinstance(q, (bool, np.bool_)) or not isinstance(q, (int, float, np.integer, np.floating)) or not 0 < q < 1:
        raise ValueError(f"fdr must be a false discovery rate in (0, 1), got {q!r}")
    if method not in FDR_METHODS:
        raise ValueError(f"fdr_method must be one of {list(FDR_METHODS)}, got {method!r}")


def fdr_select(pvalues: np.ndarray, q: float, method: str = "bh", eligible: np.ndarray | None = None) -> np.ndarray:
    """``(d,)`` bool: the features whose p-values pass the step-up correction ``method``
    (``"bh"`` / ``"by"``, :func:`scipy.stats.false_discovery_control`) at FDR ``q``.

    Only ``eligible`` features (default all) are tested, so the correction counts only them;
    the others are never kept. ``q`` may be 1 (the forward selection's edge case: keep all).

    Raises:
        ValueError: ``method`` unknown, ``q`` outside (0, 1], p-values outside [0, 1].
    """
    from scipy.stats import false_discovery_control

    if method not in FDR_METHODS:
        raise ValueError(f"fdr_method must be one of {list(FDR_METHODS)}, got {method!r}")
    if not 0 < q <= 1:
        raise ValueError(f"the FDR level must be in (0, 1], got {q}")
    p = np.asarray(pvalues, dtype=np.float64).reshape(-1)
    idx = np.arange(p.size) if eligible is None else np.flatnonzero(eligible)
    keep = np.zeros(p.size, dtype=bool)
    if idx.size:
        keep[idx] = false_discovery_control(p[idx], method=method) <= q
    return keep
#: ``sums(selected, coef, with_score) -> summed arrays`` (NEWTON_KEYS, plus SCORE_KEYS when asked)
SumSource = Callable[[list[int], np.ndarray, bool], Sums]


def site_sums(Z: np.ndarray, y: np.ndarray, selected: list[int] | np.ndarray, coef: np.ndarray,
              with_score: bool = False) -> dict[str, np.ndarray]:
    """One table's sums at the coefficients ``coef`` of the model on ``[1, Z[:, selected]]``.

    Args:
        Z: ``(n, d)`` float standardised features (no NaN: missing cells already filled).
        y: ``(n,)`` 0/1 target.
        selected: ``m − 1`` column indices into ``Z``; coef: ``(m,)`` intercept first.
        with_score: also the score pieces of every column.

    Returns:
        ``grad`` (m,), ``hess`` (m, m) (exactly symmetric), ``loglik`` (1,) and, with
        ``with_score``, ``score`` (d,), ``info_diag`` (d,), ``info_cross`` (d, m).

    Raises:
        ValueError: shapes disagree, an index is out of range, or ``Z``/``coef`` is not finite.
    """
    Z = np.asarray(Z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    sel = np.asarray(selected, dtype=np.int64).reshape(-1)
    coef = np.asarray(coef, dtype=np.float64).reshape(-1)
    if Z.ndim != 2 or y.shape != (Z.shape[0],):
        raise ValueError(f"Z must be (n, d) and y (n,), got {Z.shape} and {y.shape}")
    if coef.shape != (sel.size + 1,):
        raise ValueError(f"coef must have {sel.size + 1} entries (intercept + selected), got {coef.shape}")
    if sel.size and (sel.min() < 0 or sel.max() >= Z.shape[1] or np.unique(sel).size != sel.size):
        raise ValueError("selected must be distinct column indices of Z")
    if not (np.isfinite(coef).all() and np.isfinite(Z).all()):
        raise ValueError("Z and coef must be finite")
    A = np.empty((Z.shape[0], sel.size + 1))
    A[:, 0] = 1.0
    A[:, 1:] = Z[:, sel]
    eta = A @ coef
    p = sigmoid(eta)
    r = y - p
    w = p * (1.0 - p)
    wa = A * w[:, None]
    hess = wa.T @ A
    hess = 0.5 * (hess + hess.T)
    out = {"grad": A.T @ r, "hess": hess, "loglik": np.array([float(y @ eta - np.logaddexp(0.0, eta).sum())])}
    if with_score:
        out["score"] = Z.T @ r
        out["info_diag"] = (Z * Z).T @ w
        out["info_cross"] = Z.T @ wa
    return out


def newton_step(grad: np.ndarray, hess: np.ndarray, ridge: float = 1e-8) -> np.ndarray:
    """``(H + ridge·I)⁻¹ g`` ``(m,)`` from summed ``grad`` (m,) and ``hess`` (m, m).

    Raises:
        ValueError: shapes disagree; numpy's ``LinAlgError`` if the system is singular.
    """
    g, H = np.asarray(grad, dtype=np.float64), np.asarray(hess, dtype=np.float64)
    if H.shape != (g.size, g.size):
        raise ValueError(f"hess must be ({g.size}, {g.size}), got {H.shape}")
    return np.linalg.solve(H + ridge * np.eye(g.size), g)


def score_statistics(score: np.ndarray, info_diag: np.ndarray, info_cross: np.ndarray, hess: np.ndarray,
                     ridge: float = 1e-8) -> tuple[np.ndarray, np.ndarray]:
    """``(z, p)`` ``(d,)`` of the score test of each column from summed pieces.

    ``v_j = info_diag_j − info_cross_j (hess + ridge·I)⁻¹ info_cross_jᵀ``; ``z = score / √v``,
    ``p = 2 Φ(−|z|)``. Where ``v_j ≤ COLLINEAR · info_diag_j`` (the column adds nothing
    to the selected ones, or is constant) ``z = 0`` and ``p = 1``.

    Raises:
        ValueError: shapes disagree (``score``/``info_diag`` (d,), ``info_cross`` (d, m), ``hess`` (m, m)).
    """
    from scipy.special import ndtr

    U = np.asarray(score, dtype=np.float64)
    D = np.asarray(info_diag, dtype=np.float64)
    C = np.asarray(info_cross, dtype=np.float64)
    H = np.asarray(hess, dtype=np.float64)
    d, m = U.size, H.shape[0]
    if U.shape != (d,) or D.shape != (d,) or C.shape != (d, m) or H.shape != (m, m):
        raise ValueError(f"score pieces disagree: score {U.shape}, info_diag {D.shape}, info_cross {C.shape}, "
                         f"hess {H.shape}")
    solved = np.linalg.solve(H + ridge * np.eye(m), C.T)  # (m, d)
    v = D - np.einsum("jk,kj->j", C, solved)
    ok = v > COLLINEAR * np.maximum(D, 0.0)
    z = np.where(ok, U / np.sqrt(np.where(ok, v, 1.0)), 0.0)
    return z, np.where(ok, 2.0 * ndtr(-np.abs(z)), 1.0)


@dataclass(frozen=True)
class ScoreStep:
    """One forward step: ``added`` column indices (in index order) with their ``z`` and ``p``
    at entry, the ``coef`` ``(m,)`` (intercept first, then the columns selected *before*
    this step, in order of entry) of the model they were tested against, its ``loglik``
    and the Newton iterations it took."""

    added: list[int]
    z: np.ndarray
    p: np.ndarray
    coef: np.ndarray
    loglik: float
    newton_iterations: int


@dataclass(frozen=True)
class ScoreSelection:
    """Result of :func:`forward_score_selection` over ``d`` columns.

    Attributes:
        selected: column indices in order of entry; mask: ``(d,)`` bool.
        z / p: ``(d,)`` statistic at entry for selected columns, at the last test for the others.
        steps: one :class:`ScoreStep` per step that admitted columns.
        coef: ``(|selected| + 1,)`` the model refitted on every selected column (intercept
            first, columns in order of entry); loglik: its log-likelihood.
        converged: every Newton fit converged (``False``: selection stopped at a fit that did not).
        stopped: why it stopped: ``"no feature passes"``, ``"max_steps"``, ``"all selected"``,
            ``"not converged"`` or ``"separation"`` (the selected columns separate the classes
            perfectly; they are kept, and ``coef``/``loglik`` are the last finite iterate's).
        exchanges: how many summed replies were asked for (each a round trip when federated).
    """

    selected: list[int]
    mask: np.ndarray
    z: np.ndarray
    p: np.ndarray
    steps: list[ScoreStep]
    coef: np.ndarray
    loglik: float
    converged: bool
    stopped: str
    exchanges: int


def _fit(sums: SumSource, selected: list[int], coef: np.ndarray, *, ridge: float, tol: float,
         max_iter: int) -> tuple[np.ndarray, float, int, str, int]:
    """Newton's method with step halving; ``(coef, loglik, iterations, status, exchanges)``,
    status ``"converged"``, ``"not converged"`` or ``"separation"`` (a coefficient beyond
    :data:`MAX_COEF`: the selected columns separate the classes, the MLE does not exist)."""
    prev_coef = prev_ll = step = None
    exchanges = 0
    for it in range(1, max_iter + 1):
        s = sums(selected, coef, False)
        exchanges += 1
        ll = float(s["loglik"][0])
        if prev_ll is not None and ll < prev_ll - 1e-9 * (1.0 + abs(prev_ll)):  # overshot: halve the step
            step = step / 2.0
            coef = prev_coef + step
            continue
        step = newton_step(s["grad"], s["hess"], ridge)
        prev_coef, prev_ll = coef, ll
        coef = coef + step
        if not np.all(np.abs(coef) <= MAX_COEF):
            return prev_coef, ll, it, "separation", exchanges
        if float(np.abs(step).max()) < tol:
            return coef, ll, it, "converged", exchanges
    return coef, float(prev_ll if prev_ll is not None else -np.inf), max_iter, "not converged", exchanges


def forward_score_selection(sums: SumSource, d: int, alpha: float = 0.05, *, max_steps: int = 10,
                            ridge: float = 1e-8, tol: float = 1e-8, max_newton: int = 25,
                            fdr_method: str = "bh") -> ScoreSelection:
    """Forward selection by score tests over ``d`` columns, from summed replies (module docstring).

    Args:
        sums: ``sums(selected, coef, with_score)`` — the sums of :func:`site_sums` over
            every row (one table, or a federation's replies added up).
        alpha: FDR level of each step's correction, in (0, 1].
        max_steps: most steps that admit columns; ridge: added to the information matrix
            before it is inverted; tol: Newton stops when no coefficient moves more;
            max_newton: Newton iterations per fit.
        fdr_method: each step's correction, ``"bh"`` (Benjamini-Hochberg) or ``"by"``
            (Benjamini-Yekutieli).

    Raises:
        ValueError: ``alpha`` outside (0, 1], ``d`` < 1, ``max_steps`` < 1, an unknown
            ``fdr_method``, or as ``sums``.
    """
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    if fdr_method not in FDR_METHODS:
        raise ValueError(f"fdr_method must be one of {list(FDR_METHODS)}, got {fdr_method!r}")
    if d < 1 or max_steps < 1 or max_newton < 1:
        raise ValueError(f"d, max_steps and max_newton must be at least 1, got {d}, {max_steps}, {max_newton}")
    selected: list[int] = []
    coef = np.zeros(1)
    z, p = np.zeros(d), np.ones(d)
    steps: list[ScoreStep] = []
    exchanges = 0
    stopped, converged = "max_steps", True
    for _ in range(max_steps + 1):
        coef, ll, iters, status, n = _fit(sums, selected, coef, ridge=ridge, tol=tol, max_iter=max_newton)
        exchanges += n
        if status != "converged":
            converged, stopped = False, status
            break
        if len(steps) == max_steps:
            break
        if len(selected) == d:
            stopped = "all selected"
            break
        s = sums(selected, coef, True)
        exchanges += 1
        zs, ps = score_statistics(s["score"], s["info_diag"], s["info_cross"], s["hess"], ridge)
        eligible = np.ones(d, dtype=bool)
        eligible[selected] = False
        z[eligible], p[eligible] = zs[eligible], ps[eligible]
        new = np.flatnonzero(fdr_select(ps, alpha, fdr_method, eligible)).tolist()
        if not new:
            stopped = "no feature passes"
            break
        steps.append(ScoreStep(new, zs[new], ps[new], coef.copy(), ll, iters))
        selected = selected + new
        coef = np.concatenate([coef, np.zeros(len(new))])  # warm start: new columns at 0
    mask = np.zeros(d, dtype=bool)
    mask[selected] = True
    return ScoreSelection(selected, mask, z, p, steps, coef, ll, converged, stopped, exchanges)


def fdr_score_selection(sums: SumSource, d: int, q: float = 0.05, method: str = "bh", **options: float,
                        ) -> ScoreSelection:
    """Selection with error control (module docstring): the score test of every column against
    the intercept-only model, one ``method`` correction at FDR ``q`` over all ``d`` p-values;
    the selected columns' model is then refitted (``coef``). ``p`` holds every column's
    p-value; ``options``: ``ridge`` / ``tol`` / ``max_newton`` of :func:`forward_score_selection`.

    Raises:
        ValueError: ``q`` outside (0, 1), an unknown ``method``, or as :func:`forward_score_selection`.
    """
    check_fdr(q, method)
    return forward_score_selection(sums, d, q, max_steps=1, fdr_method=method, **options)  # type: ignore[arg-type]


def pooled_score_selection(Z: np.ndarray, y: np.ndarray, alpha: float = 0.05, **options: float) -> ScoreSelection:
    """:func:`forward_score_selection` on one pooled table ``Z`` ``(n, d)`` (finite,
    standardised as the federation does), ``y`` ``(n,)`` 0/1 — the reference the federated
    run equals. ``options``: as :func:`forward_score_selection`."""
    Z = np.asarray(Z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    return forward_score_selection(lambda sel, coef, full: site_sums(Z, y, sel, coef, full), Z.shape[1], alpha,
                                   **options)  # type: ignore[arg-type]


def pooled_table_selection(tables: Sequence[Any], target: str, feature_names: Sequence[str], positive: Any,
                           alpha: float = 0.05, **options: float) -> ScoreSelection:
    """:func:`pooled_score_selection` on the rows of all ``tables`` stacked, prepared as the
    federated workflow prepares each site's rows: columns ``feature_names`` (a column a
    table lacks is missing there), standardised with the pooled mean/std of the observed
    cells, missing cells 0; ``y = (target == positive)``. For simulations: the federated
    mask equals this one's.

    Raises:
        ValueError: no tables, a table without ``target``, or as :func:`forward_score_selection`.
    """
    import pandas as pd

    if not tables or any(target not in t.columns for t in tables):
        raise ValueError(f"pooled_table_selection needs tables that each hold the target {target!r}")
    pooled = pd.concat(list(tables), ignore_index=True)
    X = pooled.reindex(columns=list(feature_names)).to_numpy(dtype=np.float64, na_value=np.nan)
    with warnings.catch_warnings():  # an all-missing column: mean/std NaN, then 0 and 1
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, std = np.nanmean(X, axis=0), np.nanstd(X, axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    Z = np.nan_to_num((X - np.nan_to_num(mean)) / std)
    return pooled_score_selection(Z, (pooled[target] == positive).to_numpy(np.float64), alpha, **options)
