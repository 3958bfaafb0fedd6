"""A Markov-blanket selector in the spirit of PyImpetus, written on scikit-learn.

Idea (PyImpetus' PPIMBC): a feature belongs to the Markov blanket if the model's loss
on held-out rows gets *significantly* worse when that feature's values are permuted,
given the other features the model uses. Here:

1. **Grow** — fit the model on all features in each of ``n_splits`` stratified folds;
   on each held-out fold permute every feature ``n_repeats`` times and record the rise
   in log-loss (MSE for regression). A one-sided t-test over the ``n_splits·n_repeats``
   rises (averaged over repeats within a fold, one sample per fold) gives a p-value per feature; the candidates are the features with
   ``p < alpha``, in order of mean rise.
2. **Shrink** — refit on the candidates only and re-test; while any candidate has
   ``p >= alpha``, drop the less significant half of those (at least one, plus every
   candidate whose mean rise is not positive — clearly useless given the others) and
   refit. PyImpetus drops one at a time; halving keeps the number of refits
   logarithmic, and re-testing after each step still protects one of two redundant
   features (each looks useless only while the other is present).

Scores are the mean permutation importance (loss rise, clipped at 0): from the final
shrink fit for the blanket, from the grow fit for the rest. A blanket of one feature is
returned as one feature (PyImpetus returns an empty set there). If nothing is
significant, the single most important feature is kept so that the ballot is not empty.

Speed: the forest scores all permuted copies of a fold in one batched prediction
(single-threaded trees: thread hand-offs cost more than they save at this size);
with ``model="linear"`` a permutation changes the logits by ``(x_perm − x) · w_j``, so
it costs O(n·C) instead of a full prediction.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats
from sklearn.ensemble import (
    HistGradientBoostingClassifier,
    HistGradientBoostingRegressor,
    ExtraTreesClassifier,
    ExtraTreesRegressor,
)
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import KFold, StratifiedKFold
from sklearn.preprocessing import LabelEncoder, StandardScaler

from .selectors import SELECTORS, Selection, Selector, _check_xy, _is_regression

__all__ = ["MarkovBlanketSelector"]


class MarkovBlanketSelector(Selector):
    """Grow-then-shrink permutation-importance tests (see module docstring).

    Args:
        model: ``"linear"`` (L2 logistic / ridge; fast exact-delta permutations) or
            ``"forest"`` (extremely randomised trees; captures non-linear effects, slower)
            or ``"boosting"`` (histogram gradient boosting; slowest).
        alpha: significance threshold of the one-sided t-test.
        n_splits: CV folds (= samples of the t-test); n_repeats: permutations per
            feature and fold (averaged).
        max_rows: rows used (a seeded random subset above this), to bound the cost.
        C: inverse L2 strength of the logistic model. n_trees: trees of the forest.
        task, seed: as ``LassoSelector``.

    Raises:
        ValueError: unknown ``model`` or a class with fewer than ``n_splits`` rows.
    """

    name = "markov_blanket"

    def __init__(self, model: str = "forest", alpha: float = 0.05, n_splits: int = 5, n_repeats: int = 1,
                 max_rows: int = 5000, C: float = 1.0, n_trees: int = 30, task: str = "auto", seed: int = 0):
        self.model = model
        self.alpha = alpha
        self.n_splits = n_splits
        self.n_repeats = n_repeats
        self.max_rows = max_rows
        self.C = C
        self.n_trees = n_trees
        self.task = task
        self.seed = seed

    def get_params(self) -> dict[str, Any]:
        return {k: v for k, v in super().get_params().items() if not k.endswith("_")}

    # ------------------------------------------------------------------ internals
    def _fit(self, X: np.ndarray, y: np.ndarray, regression: bool) -> Any:
        if self.model == "linear":
            est = Ridge(alpha=1.0) if regression else LogisticRegression(C=self.C, max_iter=300)
        elif self.model == "forest":
            cls = ExtraTreesRegressor if regression else ExtraTreesClassifier
            est = cls(n_estimators=self.n_trees, min_samples_leaf=3, max_features="sqrt", n_jobs=1,
                      random_state=self.seed)
        elif self.model == "boosting":
            cls = HistGradientBoostingRegressor if regression else HistGradientBoostingClassifier
            est = cls(max_iter=100, early_stopping=False, random_state=self.seed)
        else:
            raise ValueError(f"model must be 'linear', 'forest' or 'boosting', got {self.model!r}")
        return est.fit(X, y)

    def _rises(self, est: Any, X: np.ndarray, y: np.ndarray, regression: bool, rng: np.random.Generator) -> np.ndarray:
        """``(n_repeats, d)`` loss rises when each column of X is permuted."""
        n, d = X.shape
        out = np.empty((self.n_repeats, d))
        linear = self.model == "linear"
        if linear:
            W = np.atleast_2d(est.coef_)
            b = np.atleast_1d(est.intercept_)
            Z = X @ W.T + b
        if regression:
            def loss(pred: np.ndarray) -> float:
                return float(np.mean((pred.ravel() - y) ** 2))
            base = loss(Z if linear else est.predict(X))
        else:
            rows = np.arange(len(y))

            def loss_logits(z: np.ndarray) -> float:
                if z.shape[1] == 1:
                    z1 = z[:, 0]
                    return float(np.mean(np.logaddexp(0.0, z1) - y * z1))
                top = z.max(axis=1, keepdims=True)
                lse = np.log(np.exp(z - top).sum(axis=1)) + top[:, 0]
                return float(np.mean(lse - z[rows, y]))

            def loss_proba(p: np.ndarray) -> float:
                return float(-np.log(np.clip(p[np.arange(len(y)), y], 1e-12, 1)).mean())

            base = loss_logits(Z) if linear else loss_proba(est.predict_proba(X))
        for r in range(self.n_repeats):
            perm = rng.permutation(n)
            if linear:
                for j in range(d):
                    zp = Z + np.outer(X[perm, j] - X[:, j], W[:, j])
                    out[r, j] = (loss(zp) if regression else loss_logits(zp)) - base
                continue
            # one batched prediction for many permuted copies (avoids per-call overhead)
            chunk = max(1, int(2_000_000 // max(n * d, 1)))
            for j0 in range(0, d, chunk):
                js = range(j0, min(d, j0 + chunk))
                Xp = np.tile(X, (len(js), 1))
                for i, j in enumerate(js):
                    Xp[i * n : (i + 1) * n, j] = X[perm, j]
                pred = est.predict(Xp) if regression else est.predict_proba(Xp)
                for i, j in enumerate(js):
                    part = pred[i * n : (i + 1) * n]
                    out[r, j] = (loss(part) if regression else loss_proba(part)) - base
        return out

    def _test(self, X: np.ndarray, y: np.ndarray, cols: np.ndarray, regression: bool,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Mean rise and one-sided p-value per column in ``cols`` (CV folds × repeats)."""
        splitter = (KFold(self.n_splits, shuffle=True, random_state=self.seed) if regression
                    else StratifiedKFold(self.n_splits, shuffle=True, random_state=self.seed))
        rises = []
        for tr, te in splitter.split(X, y):
            est = self._fit(X[tr][:, cols], y[tr], regression)
            rises.append(self._rises(est, X[te][:, cols], y[te], regression, rng).mean(axis=0))
        R = np.vstack(rises)  # one sample per fold: repeats within a fold share a model
        mean = R.mean(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            p = stats.ttest_1samp(R, 0.0, axis=0, alternative="greater").pvalue
        p = np.where(np.isfinite(p), p, np.where(mean > 0, 0.0, 1.0))
        return mean, p

    # ------------------------------------------------------------------ API
    def select(self, X: Any, y: Any) -> Selection:
        X, y = _check_xy(X, y)
        regression = _is_regression(y, self.task)
        rng = np.random.default_rng(self.seed)
        if len(y) > self.max_rows:
            keep = np.sort(rng.choice(len(y), self.max_rows, replace=False))
            X, y = X[keep], y[keep]
        X = StandardScaler().fit_transform(X)
        y = y.astype(np.float64) if regression else LabelEncoder().fit_transform(y)
        d = X.shape[1]
        all_cols = np.arange(d)
        mean, p = self._test(X, y, all_cols, regression, rng)
        scores = np.clip(mean, 0.0, None)
        self.grow_pvalues_ = p
        blanket = [int(j) for j in all_cols[np.argsort(-mean, kind="stable")] if p[j] < self.alpha]
        if not blanket:
            blanket = [int(np.argmax(mean))]
        else:
            while len(blanket) > 1:
                cols = np.array(blanket)
                m, pc = self._test(X, y, cols, regression, rng)
                scores[cols] = np.clip(m, 0.0, None)
                worst = int(np.argmax(pc))
                if pc[worst] < self.alpha:
                    break
                weak = [i for i in np.argsort(-pc, kind="stable") if pc[i] >= self.alpha]
                drop = set(weak[: max(1, len(weak) // 2)])  # the less significant half of the weak ones
                drop |= {i for i in weak if m[i] <= 0}
                if len(drop) == len(cols):
                    drop.discard(int(np.argmax(m)))
                blanket = [j for i, j in enumerate(blanket) if i not in drop]
        mask = np.zeros(d, dtype=bool)
        mask[blanket] = True
        return Selection(mask, scores)


SELECTORS[MarkovBlanketSelector.name] = MarkovBlanketSelector
