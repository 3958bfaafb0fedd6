"""Local feature selectors: each turns a site's ``(X, y)`` into a mask and scores.

Every selector is a scikit-learn selector (``SelectorMixin`` + ``BaseEstimator``):
``get_params(deep)``, ``set_params``, ``clone``, ``fit(X, y)`` (sets ``support_``,
``scores_``, ``n_features_in_`` and, for a DataFrame, ``feature_names_in_``),
``get_support()``, ``transform``, ``get_feature_names_out``, usable in a ``Pipeline``.
``select(X, y) -> Selection`` is the same computation without fitted state; it is
what a site's ballot runs (``fit`` calls it). ``X`` is ``(n, d)`` numeric (no NaN),
``y`` is ``(n,)``. ``Selection.mask`` is ``(d,)`` bool and ``Selection.scores`` is
``(d,)`` float (larger = more important; fedtab's rule takes absolute values, the peer
profiles do not). Build one by name with :func:`make_selector`; each site may use a
different one, including any scikit-learn selector (see :class:`SklearnSelector`).

Defaults (documented per class):

* ranking selectors (random forest, mutual information, ANOVA F, chi2) keep the
  top ``k`` features, ``k = ceil(d / 2)`` unless given, as the peer implementations do;
* ``lasso`` fits an L1-penalised model on standardised ``X`` (L1-logistic regression
  for class labels, Lasso for a continuous target) and keeps the non-zero
  coefficients; ``elastic_net`` likewise with an L1/L2 mix.

``task`` is ``"auto"`` (classification unless ``y`` is float with many distinct
values), ``"classification"`` or ``"regression"``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from ..learn.models import STEP_OVERHEAD, Cost, count_param, driver
from .lasso_cv import LassoCVSelector
from .markov_blanket import MarkovBlanketSelector
from .selector_table import resolve_selector
from .selector_base import Selection, Selector, check_xy, is_regression, is_regression_target
from .sequential_attention import SequentialAttentionSelector

# The models are imported inside the methods that use them, and ``fedtab`` imports this
# module only on first use (``fedtab.election.make_selector`` etc. are lazy): importing
# ``fedtab`` stays cheap, which matters where every message starts a new process
# (a Flower SuperNode's ClientApp) and most messages never run a selector.

__all__ = [
    "Selection",
    "Selector",
    "LassoSelector",
    "ElasticNetSelector",
    "RandomForestSelector",
    "MutualInfoSelector",
    "AnovaSelector",
    "Chi2Selector",
    "SklearnSelector",
    "CallableSelector",
    "SELECTORS",
    "is_regression_target",
    "make_selector",
    "selector_cost",
    "selector_spec",
]


def _top_k(scores: np.ndarray, k: int | float | None) -> np.ndarray:
    d = scores.size
    if k is None:
        kk = math.ceil(d / 2)
    elif isinstance(k, float) and 0 < k < 1:
        kk = math.ceil(k * d)
    else:
        kk = int(k)
    if not 0 < kk <= d:
        raise ValueError(f"k must be in 1..{d} (or a fraction in (0, 1)), got {k!r}")
    order = np.lexsort((np.arange(d), -scores))  # highest first, lower index on ties
    mask = np.zeros(d, dtype=bool)
    mask[order[:kk]] = True
    return mask


class LassoSelector(Selector):
    """L1-penalised linear model on standardised X; keeps the non-zero coefficients.

    Args:
        C: inverse L1 strength of the logistic regression (classification).
        alpha: L1 strength of :class:`sklearn.linear_model.Lasso` (regression).
        task: ``"auto"``, ``"classification"`` or ``"regression"``.
        tol: coefficients with ``|coef| <= tol`` count as zero.
        seed: random state of the solver.

    Scores are ``|coef|`` (for multiclass, the L2 norm over classes).
    """

    name = "lasso"

    def __init__(self, C: float = 0.1, alpha: float = 0.01, task: str = "auto", tol: float = 1e-10, seed: int = 0):
        self.C = C
        self.alpha = alpha
        self.task = task
        self.tol = tol
        self.seed = seed

    def _model(self, regression: bool) -> Any:
        from sklearn.linear_model import Lasso, LogisticRegression

        if regression:
            return Lasso(alpha=self.alpha, max_iter=5000, random_state=self.seed)
        return LogisticRegression(l1_ratio=1.0, solver="saga", C=self.C, max_iter=2000, random_state=self.seed, tol=1e-3)

    def cost(self, n_rows: int, n_features: int) -> Cost:
        """At most 2,000 SAGA passes over the standardised table (5,000 coordinate-descent
        passes for a regression task)."""
        passes = 5000.0 if self.task == "regression" else 2000.0
        return Cost(passes * n_rows * n_features + STEP_OVERHEAD, float(n_rows * n_features), "rows × features")

    def select(self, X: Any, y: Any) -> Selection:
        from sklearn.preprocessing import StandardScaler

        X, y = check_xy(X, y)
        Z = StandardScaler().fit_transform(X)
        regression = is_regression(y, self.task)
        coef = np.atleast_2d(self._model(regression).fit(Z, y).coef_)
        scores = np.linalg.norm(coef, axis=0)
        return Selection(scores > self.tol, scores)


class ElasticNetSelector(LassoSelector):
    """Elastic net (L1 + L2) on standardised X; keeps the non-zero coefficients.

    Args:
        l1_ratio: share of the L1 penalty (1 = lasso).
        C, alpha, task, tol, seed: as :class:`LassoSelector`.
    """

    name = "elastic_net"

    def __init__(self, C: float = 0.1, alpha: float = 0.01, l1_ratio: float = 0.5, task: str = "auto",
                 tol: float = 1e-10, seed: int = 0):
        super().__init__(C=C, alpha=alpha, task=task, tol=tol, seed=seed)
        self.l1_ratio = l1_ratio

    def _model(self, regression: bool) -> Any:
        from sklearn.linear_model import ElasticNet, LogisticRegression

        if regression:
            return ElasticNet(alpha=self.alpha, l1_ratio=self.l1_ratio, max_iter=5000, random_state=self.seed)
        return LogisticRegression(l1_ratio=self.l1_ratio, solver="saga", C=self.C, max_iter=2000,
                                  random_state=self.seed, tol=1e-3)


class _RankingSelector(Selector):
    def __init__(self, k: int | float | None = None, task: str = "auto", seed: int = 0):
        self.k = k
        self.task = task
        self.seed = seed

    #: passes over the table one selection makes (the univariate tests: a few)
    _passes = 3.0

    def _scores(self, X: np.ndarray, y: np.ndarray, regression: bool) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def cost(self, n_rows: int, n_features: int) -> Cost:
        return Cost(self._passes * n_rows * n_features + STEP_OVERHEAD, float(n_rows * n_features),
                    "rows × features")

    def _test(self, X: np.ndarray, y: np.ndarray, regression: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(scores, p-values or ``None``); selectors built on a test override this."""
        return self._scores(X, y, regression), None

    def select(self, X: Any, y: Any) -> Selection:
        X, y = check_xy(X, y)
        raw, pvalues = self._test(X, y, is_regression(y, self.task))
        scores = np.nan_to_num(np.asarray(raw, dtype=np.float64))
        return Selection(_top_k(scores, self.k), scores, _clean_pvalues(pvalues, scores.size))


class RandomForestSelector(_RankingSelector):
    """Impurity importance of a random forest; keeps the top ``k`` (default half).

    Args:
        k: features to keep (int, or a fraction in (0, 1); default ``ceil(d/2)``).
        n_estimators: trees in the forest.
        task, seed: as :class:`LassoSelector`.
    """

    name = "random_forest"

    def __init__(self, k: int | float | None = None, n_estimators: int = 100, task: str = "auto", seed: int = 0):
        super().__init__(k=k, task=task, seed=seed)
        self.n_estimators = n_estimators

    def cost(self, n_rows: int, n_features: int) -> Cost:
        """Per tree about ``n·log₂n`` split evaluations per feature; a fully grown tree holds up to ``2n`` nodes."""
        trees = count_param(self.n_estimators, "n_estimators")
        per_tree = n_rows * math.log2(n_rows + 1) * n_features + STEP_OVERHEAD
        return Cost(trees * per_tree, trees * 2.0 * n_rows, driver({"n_estimators": (trees, 100)}))

    def _scores(self, X: np.ndarray, y: np.ndarray, regression: bool) -> np.ndarray:
        from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

        cls = RandomForestRegressor if regression else RandomForestClassifier
        return cls(n_estimators=self.n_estimators, random_state=self.seed, n_jobs=-1).fit(X, y).feature_importances_


class MutualInfoSelector(_RankingSelector):
    """Mutual information with the target (k-NN estimator); keeps the top ``k`` (default half)."""

    name = "mutual_info"

    def cost(self, n_rows: int, n_features: int) -> Cost:
        """Per feature a k-NN search over the rows: ~250 · rows · log₂ rows operations and two
        :data:`STEP_OVERHEAD` (its trees' set-up), as ``python -m benchmarks.cost_model`` measured."""
        per_feature = 250.0 * n_rows * math.log2(max(n_rows, 1) + 1) + 2.0 * STEP_OVERHEAD
        return Cost(n_features * per_feature + STEP_OVERHEAD, float(n_rows * n_features), "rows × features")

    def _scores(self, X: np.ndarray, y: np.ndarray, regression: bool) -> np.ndarray:
        from sklearn.feature_selection import mutual_info_classif, mutual_info_regression

        fn = mutual_info_regression if regression else mutual_info_classif
        return fn(X, y, random_state=self.seed)


class AnovaSelector(_RankingSelector):
    """ANOVA F statistic (classification) or univariate regression F; keeps the top ``k``."""

    name = "anova"

    def _test(self, X: np.ndarray, y: np.ndarray, regression: bool) -> tuple[np.ndarray, np.ndarray]:
        from sklearn.feature_selection import f_classif, f_regression

        with np.errstate(divide="ignore", invalid="ignore"):
            return (f_regression if regression else f_classif)(X, y)

    def _scores(self, X: np.ndarray, y: np.ndarray, regression: bool) -> np.ndarray:
        return self._test(X, y, regression)[0]


class Chi2Selector(_RankingSelector):
    """Chi-squared statistic on min-max scaled (non-negative) X; classification only."""

    name = "chi2"

    def _test(self, X: np.ndarray, y: np.ndarray, regression: bool) -> tuple[np.ndarray, np.ndarray]:
        if regression:
            raise ValueError("chi2 needs class labels, the target looks continuous")
        from sklearn.feature_selection import chi2
        from sklearn.preprocessing import MinMaxScaler

        with np.errstate(divide="ignore", invalid="ignore"):
            return chi2(MinMaxScaler().fit_transform(X), y)

    def _scores(self, X: np.ndarray, y: np.ndarray, regression: bool) -> np.ndarray:
        return self._test(X, y, regression)[0]


class SklearnSelector(Selector):
    """Wrap any scikit-learn selector (``SelectKBest``, ``SelectFromModel``, ``RFE`` ...).

    The mask is ``get_support()``; scores come from the first of ``scores_``,
    ``feature_importances_``, ``coef_`` (norm over classes), ``ranking_`` (inverted),
    looked up on the selector and then on its fitted ``estimator_``; failing those,
    the mask itself (1.0 / 0.0). P-values come from ``pvalues_`` when the selector has
    them (``SelectKBest``/``SelectFdr``/... over ``f_classif``, ``chi2``...).
    """

    name = "sklearn"

    def __init__(self, estimator: Any):
        if not hasattr(estimator, "fit") or not hasattr(estimator, "get_support"):
            raise ValueError("SklearnSelector needs an estimator with fit() and get_support()")
        self.estimator = estimator

    def select(self, X: Any, y: Any) -> Selection:
        from sklearn.base import clone

        X, y = check_xy(X, y)
        est = clone(self.estimator).fit(X, y)
        mask = np.asarray(est.get_support(), dtype=bool)
        scores = _scores_of(est, X.shape[1])
        if scores is None:
            scores = mask.astype(np.float64)
        return Selection(mask, np.nan_to_num(scores), _clean_pvalues(getattr(est, "pvalues_", None), X.shape[1]))


def _clean_pvalues(pvalues: Any, d: int) -> np.ndarray | None:
    """A test's ``(d,)`` p-values with NaN (a constant feature: no evidence) read as 1.0;
    ``None`` when there are none or they do not cover the ``d`` features."""
    if pvalues is None:
        return None
    p = np.asarray(pvalues, dtype=np.float64).ravel()
    if p.size != d:
        return None
    return np.clip(np.nan_to_num(p, nan=1.0, posinf=1.0, neginf=1.0), 0.0, 1.0)


def _scores_of(est: Any, d: int) -> np.ndarray | None:
    for obj in (est, getattr(est, "estimator_", None)):
        if obj is None:
            continue
        for attr in ("scores_", "feature_importances_", "coef_"):
            val = getattr(obj, attr, None)
            if val is not None:
                arr = np.atleast_2d(np.asarray(val, dtype=np.float64))
                if arr.shape[-1] == d:
                    return np.linalg.norm(arr, axis=0) if attr == "coef_" else arr.ravel()
        ranking = getattr(obj, "ranking_", None)
        if ranking is not None and len(ranking) == d:
            r = np.asarray(ranking, dtype=np.float64)
            return r.max() + 1 - r
    return None


class CallableSelector(Selector):
    """Wrap ``fn(X, y) -> (mask, scores)``."""

    name = "callable"

    def __init__(self, fn: Callable[[np.ndarray, np.ndarray], tuple[Any, Any]]):
        if not callable(fn):
            raise ValueError("CallableSelector needs a callable")
        self.fn = fn

    def select(self, X: Any, y: Any) -> Selection:
        X, y = check_xy(X, y)
        out = self.fn(X, y)
        try:
            mask, scores = out
        except (TypeError, ValueError):
            raise ValueError("a selector callable must return (mask, scores)") from None
        mask, scores = np.asarray(mask), np.asarray(scores, dtype=np.float64)
        if mask.shape != (X.shape[1],) or scores.shape != (X.shape[1],):
            raise ValueError(f"selector callable returned shapes {mask.shape} and {scores.shape}, expected ({X.shape[1]},)")
        return Selection(mask.astype(bool), scores)


#: name -> selector class: the built-in ones of this module and those living in their own modules
#: (which build on :mod:`fedtab.election.selector_base` and never import this table)
SELECTORS: dict[str, type[Selector]] = {
    cls.name: cls
    for cls in (LassoSelector, ElasticNetSelector, RandomForestSelector, MutualInfoSelector, AnovaSelector, Chi2Selector,
                LassoCVSelector, MarkovBlanketSelector, SequentialAttentionSelector)
}


def selector_cost(spec: Any, n_rows: int, n_features: int) -> Cost:
    """The :class:`~fedtab.learn.models.Cost` of running ``spec`` (as :func:`make_selector`
    takes it) on a site's ``(n_rows, n_features)`` table, before anything runs.

    Pure: only the selector's constructor runs (it stores its arguments).

    Raises:
        ValueError: an unknown selector, bad parameters, or a count parameter that is not a
            finite non-negative number.
    """
    sel = make_selector(spec)
    try:
        return sel.cost(int(n_rows), int(n_features))
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"selector {sel.name!r}: {exc}") from None


def make_selector(spec: Any) -> Selector:
    """Build a selector from a name (``"lasso"``), a ``{"name": ..., "params": {...}}`` dict,
    a :class:`Selector`, a scikit-learn selector, or a callable ``(X, y) -> (mask, scores)``.

    Raises:
        ValueError: unknown name or bad parameters (the message lists the known names).
    """
    if isinstance(spec, Selector):
        return spec
    params: Mapping[str, Any] = {}
    if isinstance(spec, Mapping):
        params = spec.get("params", {}) or {}
        spec = spec.get("name")
    if isinstance(spec, str):
        name, given = resolve_selector(spec, params)  # the check the server makes without building it
        return SELECTORS[name](**given)
    if hasattr(spec, "get_support") and hasattr(spec, "fit"):
        return SklearnSelector(spec)
    if callable(spec):
        return CallableSelector(spec)
    raise ValueError(f"cannot build a selector from {spec!r}")


def selector_spec(selector: Any) -> dict[str, Any]:
    """JSON-able ``{"name", "params"}`` of a built-in selector (what travels to a site).

    Raises:
        ValueError: the selector is not a registered built-in one (a custom selector
            object cannot be sent; give it to the :class:`~fedtab.federation.site.core.Site`).
    """
    sel = make_selector(selector)
    if SELECTORS.get(sel.name) is not type(sel):
        raise ValueError(f"selector {sel!r} is not a registered built-in and cannot be sent over the wire")
    return {"name": sel.name, "params": sel.get_params()}

