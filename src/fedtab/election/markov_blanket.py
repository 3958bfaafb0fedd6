"""A Markov-blanket selector in the spirit of PyImpetus, written on scikit-learn.

Idea (PyImpetus' PPIMBC): a feature belongs to the Markov blanket if the model's loss
on held-out rows gets *significantly* worse when that feature's values are permuted,
given the other features the model uses. Here:

1. **Grow** — fit the model on all features in each of ``n_splits`` stratified folds;
   on each held-out fold permute every feature ``n_repeats`` times and record the rise
   in log-loss (MSE for regression). A one-sided t-test over the folds (rises averaged
   over repeats within a fold, one sample per fold) gives a p-value per feature; the
   candidates are the features with ``p < alpha``, in order of mean rise.
2. **Shrink** — refit on the candidates only and re-test them. Sort the *weak* ones
   (``p >= alpha``) least significant first and drop the longest prefix that is *jointly*
   insignificant: its columns permuted together (one shared row permutation) in the same
   fitted folds do not raise the loss significantly (at least the weakest one is dropped;
   so is every weak candidate whose mean rise is not positive). Two redundant features
   each look useless while the other is present but not together, so one of them stays.
   If weak candidates were kept that way, refit and repeat; otherwise stop — each kept
   candidate was significant *in the presence of* the dropped ones, which carried no
   joint information, and removing them can only make it matter more, so a confirming
   refit is skipped. (PyImpetus drops one feature per refit.)

Scores are the mean permutation importance (loss rise, clipped at 0): from the last
shrink fit for the blanket, from the grow fit for the rest. A blanket of one feature is
returned as one feature (PyImpetus returns an empty set there). If nothing is
significant, the single most important feature is kept so that the ballot is not empty.

Speed (≈ 0.01–0.02 s CPU per feature on the election datasets; PyImpetus ≈ 0.4 s):
usually two tests (grow + one shrink), i.e. ``2·n_splits`` fits; the joint tests reuse
fitted models. Permutation importance never refits: a permuted copy is re-predicted with
the fold's model, and only on the rows where the permutation can change the prediction —
for the forest, the rows whose permuted value falls in another interval between the
forest's split thresholds on that feature (every tree routes them as before), for the
other models the rows whose value changes; the other rows keep their base loss, so the
rise is exactly that of a full re-prediction. Those rows of all features go through one
batched prediction (single-threaded trees: thread hand-offs cost more than they save at
this size). With ``model="linear"`` a permutation changes the logits by
``(x_perm − x) · w_j``, so it costs O(n·C) instead of a prediction.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np

from ..learn.models import STEP_OVERHEAD, Cost, count_param, driver

# scipy.stats and scikit-learn are imported inside the methods (keeps `import fedtab` cheap).

from .selector_base import Selection, Selector, check_xy, is_regression

__all__ = ["MarkovBlanketSelector"]


def _one_thread(model: str) -> Any:
    """Histogram boosting on one OpenMP thread, as the forest runs on one job: its threads
    spin on a busy site machine (CPU time 10–20× the single-threaded one for these small
    fits, measured on 2 shared cores), which no work estimate can bound."""
    if model != "boosting":
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="openmp")


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
        n_trees: trees of the forest. (The logistic model's inverse L2 strength is
            :attr:`LOGISTIC_C`, 1.0: the parameter that set it went — nothing set it, and a scikit-learn
            selector keeps at most 9 parameters.)
        task, seed: as ``LassoSelector``.
        max_shrink_rounds: shrink refits (new parameter; default 1). ``None`` repeats
            refit → re-test → joint drop until every kept feature is significant in a refit
            (as this selector did before the parameter existed, with joint drops in place of
            halving). Each round costs ``n_splits`` fits and ratchets borderline features out:
            fewer kept (breast cancer 15 vs 21, mushroom 32 vs 47, adult 18 vs 19 columns at
            seed 0), same downstream F1, about 2–3× the time of the default.

    Attributes (after ``select``): ``grow_pvalues_`` (p-value of every feature in the grow
    test), ``n_shrink_tests_`` (shrink refits of ``n_splits`` models each).

    Raises:
        ValueError: unknown ``model`` or a class with fewer than ``n_splits`` rows.
    """

    name = "markov_blanket"

    #: inverse L2 strength of the logistic model (``model="linear"``)
    LOGISTIC_C = 1.0

    def __init__(self, model: str = "forest", alpha: float = 0.05, n_splits: int = 5, n_repeats: int = 1,
                 max_rows: int = 5000, n_trees: int = 30, task: str = "auto", seed: int = 0,
                 max_shrink_rounds: int | None = 1):
        self.model = model
        self.alpha = alpha
        self.n_splits = n_splits
        self.n_repeats = n_repeats
        self.max_rows = max_rows
        self.n_trees = n_trees
        self.task = task
        self.seed = seed
        self.max_shrink_rounds = max_shrink_rounds

    def cost(self, n_rows: int, n_features: int) -> Cost:
        """Operations of :meth:`select`, counted as it runs them (checked against measured CPU
        time by ``python -m benchmarks.cost_model``, within 3× on the shipped benchmarks' data):

        * fits: ``n_splits`` per test, one grow test and up to ``max_shrink_rounds`` shrink
          tests (``None``: up to one per feature), on at most ``max_rows`` rows — a forest
          ``n_trees · rows · log₂ rows · √d``, histogram boosting 100 iterations of
          ``15 · rows · d``, the logistic model up to 300 L-BFGS passes of ``rows · d · k``;
          each with its fixed cost (per tree, per boosting iteration, ten per scikit-learn fit);
        * permutation predictions: every test re-predicts each column group's permuted
          held-out rows (``n_repeats`` times, all folds: ``rows`` rows per group): ``d`` groups
          in the grow test, up to ``3d`` in a shrink test (its own test, then the joint-drop
          prefixes and one group per weak column);
        * per batched prediction and t-test (``n_splits · n_repeats`` per group test; a shrink
          round up to ``d + 2`` of them): one :data:`STEP_OVERHEAD`.
        """
        ops = self.operation_counts(n_rows, n_features)
        rows, d = ops["rows"], float(n_features)
        trees = count_param(self.n_trees, "n_trees")
        depth = math.log2(rows + 1)
        if self.model == "forest":
            fit, predict = trees * (rows * depth * math.sqrt(d) + STEP_OVERHEAD), trees * depth
        elif self.model == "boosting":  # 100 iterations of histogram trees (single-threaded, see _fit)
            fit, predict = 100.0 * (15.0 * rows * d + STEP_OVERHEAD / 2), 100.0 * 2.0 * depth
        else:  # up to 300 L-BFGS passes; a permuted group copies the held-out rows (d numbers per row)
            fit, predict = 300.0 * rows * d + 10.0 * STEP_OVERHEAD, d
        work = ops["fits"] * fit + ops["predicted_rows"] * predict + ops["tests"] * STEP_OVERHEAD
        size = ops["splits"] * (trees * 2.0 * rows if self.model == "forest" else d) + rows * d
        return Cost(work, size,
                    driver({"n_splits": (ops["splits"], 5), "n_repeats": (ops["repeats"], 1), "n_trees": (trees, 30),
                            "max_rows": (rows, 5000), "max_shrink_rounds": (ops["rounds"], 1)}))

    def operation_counts(self, n_rows: int, n_features: int) -> dict[str, float]:
        """The most operations :meth:`select` runs on ``(n_rows, n_features)`` (what
        :meth:`cost` prices): ``fits`` (model fits), ``predicted_rows`` (rows re-predicted
        under permutations, every fold and repeat), ``tests`` (per-fold batched group tests,
        each a prediction call and part of a t-test), with ``rows`` (used rows), ``splits``,
        ``repeats`` and ``rounds`` (shrink rounds).

        Raises:
            ValueError: a count parameter that is not a finite non-negative number.
        """
        splits, repeats = count_param(self.n_splits, "n_splits"), count_param(self.n_repeats, "n_repeats")
        rows = min(float(n_rows), count_param(self.max_rows, "max_rows"))
        rounds = n_features if self.max_shrink_rounds is None else count_param(self.max_shrink_rounds,
                                                                                 "max_shrink_rounds")
        d = float(n_features)
        shrinks = min(rounds, max(d - 1.0, 0.0))  # a shrink round drops a column, or the loop ends
        return {"fits": splits * (1.0 + shrinks), "predicted_rows": (d + shrinks * 3.0 * d) * repeats * rows,
                "tests": splits * repeats * (1.0 + shrinks * (d + 2.0)), "rows": rows, "splits": splits,
                "repeats": repeats, "rounds": rounds}

    # ------------------------------------------------------------------ internals
    def _fit(self, X: np.ndarray, y: np.ndarray, regression: bool) -> Any:
        from sklearn.ensemble import (
            ExtraTreesClassifier,
            ExtraTreesRegressor,
            HistGradientBoostingClassifier,
            HistGradientBoostingRegressor,
        )
        from sklearn.linear_model import LogisticRegression, Ridge

        if self.model == "linear":
            est = Ridge(alpha=1.0) if regression else LogisticRegression(C=self.LOGISTIC_C, max_iter=300)
        elif self.model == "forest":
            cls = ExtraTreesRegressor if regression else ExtraTreesClassifier
            est = cls(n_estimators=self.n_trees, min_samples_leaf=3, max_features="sqrt", n_jobs=1,
                      random_state=self.seed)
        elif self.model == "boosting":
            cls = HistGradientBoostingRegressor if regression else HistGradientBoostingClassifier
            est = cls(max_iter=100, early_stopping=False, random_state=self.seed)
        else:
            raise ValueError(f"model must be 'linear', 'forest' or 'boosting', got {self.model!r}")
        with _one_thread(self.model):
            return est.fit(X, y)

    def _row_losses(self, est: Any, X: np.ndarray, y: np.ndarray, regression: bool) -> np.ndarray:
        """Per-row loss (squared error / log-loss) of ``est`` on ``X``."""
        if self.model == "linear":
            return _loss_from_logits(X @ np.atleast_2d(est.coef_).T + np.atleast_1d(est.intercept_), y, regression)
        with _one_thread(self.model):
            if regression:
                return (est.predict(X).ravel() - y) ** 2
            p = est.predict_proba(X)
        return -np.log(np.clip(p[np.arange(len(y)), y], 1e-12, 1))

    def _fold(self, est: Any, X: np.ndarray, y: np.ndarray, regression: bool) -> dict[str, Any]:
        """What the permutation tests of one held-out fold need (model, rows, base losses, bins)."""
        fold = {"est": est, "X": X, "y": y, "base": self._row_losses(est, X, y, regression)}
        if self.model == "linear":
            fold["Z"] = X @ np.atleast_2d(est.coef_).T + np.atleast_1d(est.intercept_)
        elif self.model == "forest":
            # A tree sends x left iff float32(x) <= threshold, so two values that have the same
            # number of the forest's thresholds (on that feature) below them are routed
            # identically by every tree: their predictions are equal and need not be recomputed.
            d = X.shape[1]
            feats = np.concatenate([t.tree_.feature for t in est.estimators_])
            thrs = np.concatenate([t.tree_.threshold for t in est.estimators_])
            used = feats >= 0
            feats, thrs = feats[used], thrs[used]
            X32 = X.astype(np.float32).astype(np.float64)
            bins = np.zeros(X.shape, dtype=np.int32)
            for j in range(d):
                t = np.unique(thrs[feats == j])
                if t.size:
                    bins[:, j] = np.searchsorted(t, X32[:, j], side="left")
            fold["bins"] = bins
        return fold

    def _rises(self, fold: dict[str, Any], groups: list[np.ndarray], regression: bool,
               rng: np.random.Generator) -> np.ndarray:
        """``(n_repeats, len(groups))`` mean loss rises when each group of columns is permuted jointly.

        Only the rows whose permuted values can change the prediction are re-predicted (for
        the forest: rows that land in another threshold interval of a permuted feature; else:
        rows whose values change), all groups in one batched call; the other rows keep their
        base loss, so the rise is exactly that of re-predicting every row.
        """
        est, X, y, base = fold["est"], fold["X"], fold["y"], fold["base"]
        n = len(y)
        out = np.zeros((self.n_repeats, len(groups)))
        linear = self.model == "linear"
        for r in range(self.n_repeats):
            perm = rng.permutation(n)
            if linear:
                W = np.atleast_2d(est.coef_)
                for g, cols in enumerate(groups):
                    zp = fold["Z"] + (X[perm][:, cols] - X[:, cols]) @ W[:, cols].T
                    out[r, g] = float(np.mean(_loss_from_logits(zp, y, regression) - base))
                continue
            key = fold.get("bins", X)
            moved = key[perm] != key  # (n, d): does row i's prediction input change under perm?
            pieces = []
            for g, cols in enumerate(groups):
                changed = np.flatnonzero(moved[:, cols].any(axis=1))
                if changed.size:
                    Xp = X[changed]
                    Xp[:, cols] = X[perm[changed][:, None], cols]
                    pieces.append((g, changed, Xp))
            # one batched prediction for many permuted copies (avoids per-call overhead)
            budget = 2_000_000 // max(X.shape[1], 1)
            i = 0
            while i < len(pieces):
                batch, size = [], 0
                while i < len(pieces) and (not batch or size + len(pieces[i][1]) <= budget):
                    batch.append(pieces[i]); size += len(pieces[i][1]); i += 1
                rows = np.concatenate([b[1] for b in batch])
                losses = self._row_losses(est, np.vstack([b[2] for b in batch]), y[rows], regression)
                k = 0
                for g, changed, _ in batch:
                    m = len(changed)
                    out[r, g] = float((losses[k : k + m] - base[changed]).sum() / n)
                    k += m
        return out

    def _test(self, X: np.ndarray, y: np.ndarray, cols: np.ndarray, regression: bool,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Mean rise and one-sided p-value per column in ``cols`` (CV folds × repeats), and the folds."""
        from sklearn.model_selection import KFold, StratifiedKFold

        splitter = (KFold(self.n_splits, shuffle=True, random_state=self.seed) if regression
                    else StratifiedKFold(self.n_splits, shuffle=True, random_state=self.seed))
        folds = []
        for tr, te in splitter.split(X, y):
            est = self._fit(X[tr][:, cols], y[tr], regression)
            folds.append(self._fold(est, X[te][:, cols], y[te], regression))
        mean, p = self._pvalues(folds, [np.array([j]) for j in range(len(cols))], regression, rng)
        return mean, p, folds

    def _pvalues(self, folds: list[dict[str, Any]], groups: list[np.ndarray], regression: bool,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        # one sample per fold: repeats within a fold share a model
        R = np.vstack([self._rises(f, groups, regression, rng).mean(axis=0) for f in folds])
        mean = R.mean(axis=0)
        from scipy import stats

        with np.errstate(invalid="ignore", divide="ignore"):
            p = stats.ttest_1samp(R, 0.0, axis=0, alternative="greater").pvalue
        p = np.where(np.isfinite(p), p, np.where(mean > 0, 0.0, 1.0))
        return mean, p

    def _droppable(self, folds: list[dict[str, Any]], weak: list[int], regression: bool,
                   rng: np.random.Generator) -> list[int]:
        """A jointly insignificant subset of ``weak`` (indices, least significant first):
        permuting its columns together in the models already fitted on the folds does not
        raise the loss significantly. Start from the longest such prefix (all prefixes are
        tested in one batch; ``weak[:1]`` is insignificant on its own), then try to add each
        later weak feature in turn. Redundant features pass one at a time but not together,
        so one of them stays. Costs predictions only, no refits."""
        drop = weak[:1]
        if len(weak) < 2:
            return drop
        sizes = list(range(len(weak), 1, -1))
        _, p = self._pvalues(folds, [np.array(weak[:k]) for k in sizes], regression, rng)
        for k, pk in zip(sizes, p):
            if pk >= self.alpha:
                drop = weak[:k]
                break
        for j in weak[len(drop):]:
            _, pj = self._pvalues(folds, [np.array(drop + [j])], regression, rng)
            if pj[0] >= self.alpha:
                drop = drop + [j]
        return drop

    # ------------------------------------------------------------------ API
    def select(self, X: Any, y: Any) -> Selection:
        from sklearn.preprocessing import LabelEncoder, StandardScaler

        X, y = check_xy(X, y)
        regression = is_regression(y, self.task)
        rng = np.random.default_rng(self.seed)
        if len(y) > self.max_rows:
            keep = np.sort(rng.choice(len(y), self.max_rows, replace=False))
            X, y = X[keep], y[keep]
        X = StandardScaler().fit_transform(X)
        y = y.astype(np.float64) if regression else LabelEncoder().fit_transform(y)
        d = X.shape[1]
        all_cols = np.arange(d)
        mean, p, _ = self._test(X, y, all_cols, regression, rng)
        scores = np.clip(mean, 0.0, None)
        self.grow_pvalues_ = p
        blanket = [int(j) for j in all_cols[np.argsort(-mean, kind="stable")] if p[j] < self.alpha]
        self.n_shrink_tests_ = 0
        if not blanket:
            blanket = [int(np.argmax(mean))]
        else:
            while len(blanket) > 1 and (self.max_shrink_rounds is None
                                        or self.n_shrink_tests_ < self.max_shrink_rounds):
                cols = np.array(blanket)
                m, pc, folds = self._test(X, y, cols, regression, rng)
                self.n_shrink_tests_ += 1
                scores[cols] = np.clip(m, 0.0, None)
                weak = [int(i) for i in np.argsort(-pc, kind="stable") if pc[i] >= self.alpha]
                if not weak:
                    break
                drop = set(self._droppable(folds, weak, regression, rng))
                drop |= {i for i in weak if m[i] <= 0}  # clearly useless given the others
                if len(drop) == len(cols):
                    drop.discard(int(np.argmax(m)))
                blanket = [j for i, j in enumerate(blanket) if i not in drop]
        mask = np.zeros(d, dtype=bool)
        mask[blanket] = True
        return Selection(mask, scores)


def _loss_from_logits(z: np.ndarray, y: np.ndarray, regression: bool) -> np.ndarray:
    """Per-row squared error (regression: ``z`` is the prediction) or log-loss of logits ``z``."""
    if regression:
        return (z.ravel() - y) ** 2
    if z.shape[1] == 1:
        z1 = z[:, 0]
        return np.logaddexp(0.0, z1) - y * z1
    top = z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z - top).sum(axis=1)) + top[:, 0]
    return lse - z[np.arange(len(y)), y]
