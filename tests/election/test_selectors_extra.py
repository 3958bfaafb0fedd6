"""Markov blanket, Sequential Attention and CV-tuned Lasso selectors."""

import json

import numpy as np
import pytest
from sklearn.datasets import make_classification

from fedtab.election import SELECTORS, make_selector
from fedtab.election.selectors import selector_spec


def _informative(seed, n=1200, d=40, k=5, **kw):
    X, y = make_classification(n, d, n_informative=k, n_redundant=0, shuffle=False, random_state=seed, **kw)
    return X, y


def test_registered_and_sendable():
    for name in ("markov_blanket", "sequential_attention", "lasso_cv"):
        assert name in SELECTORS
        spec = selector_spec(name)
        json.dumps(spec)
        assert make_selector(spec).name == name


@pytest.mark.parametrize("seed", [0, 1])
def test_markov_blanket_finds_the_informative_features(seed):
    X, y = _informative(seed)
    sel = make_selector("markov_blanket")
    out = sel.select(X, y)
    assert out.mask[:5].sum() >= 4  # informative columns are the first 5
    assert out.mask[5:].sum() <= 2
    assert out.scores[:5].mean() > 5 * max(out.scores[5:].mean(), 1e-6)  # real importance scores
    json.dumps(selector_spec(sel))  # learned state does not leak into the spec


def test_markov_blanket_linear_model_and_single_feature_blanket():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 10))
    y = (X[:, 3] + 0.3 * rng.normal(size=600) > 0).astype(int)
    for model in ("linear", "forest"):
        out = make_selector({"name": "markov_blanket", "params": {"model": model}}).select(X, y)
        assert out.mask[3] and out.mask.sum() <= 2  # a one-feature blanket is returned, not emptied
        assert np.argmax(out.scores) == 3
    with pytest.raises(ValueError, match="model"):
        make_selector({"name": "markov_blanket", "params": {"model": "svm"}}).select(X, y)


@pytest.mark.parametrize("model", ["forest", "boosting", "linear"])
@pytest.mark.parametrize("regression", [False, True])
def test_markov_blanket_fast_rises_equal_full_reprediction(model, regression):
    # only rows whose permuted value can change the prediction are re-predicted: the rise must
    # still be exactly that of re-predicting every row (single columns and a joint group)
    from fedtab.election.markov_blanket import MarkovBlanketSelector

    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(size=(300, 4)), rng.integers(0, 2, size=(300, 2))]).astype(float)
    y = X[:, 0] + X[:, 4] + 0.3 * rng.normal(size=300)
    if not regression:
        y = (y > np.median(y)).astype(int)
    sel = MarkovBlanketSelector(model=model, n_repeats=2)
    fold = sel._fold(sel._fit(X[:200], y[:200], regression), X[200:], y[200:], regression)
    groups = [np.array([j]) for j in range(6)] + [np.array([1, 4, 5])]
    fast = sel._rises(fold, groups, regression, np.random.default_rng(1))
    perm_rng, full = np.random.default_rng(1), np.empty_like(fast)
    for r in range(2):
        perm = perm_rng.permutation(100)
        for g, cols in enumerate(groups):
            Xp = fold["X"].copy()
            Xp[:, cols] = fold["X"][perm][:, cols]
            full[r, g] = np.mean(sel._row_losses(fold["est"], Xp, fold["y"], regression) - fold["base"])
    np.testing.assert_allclose(fast, full, rtol=1e-9, atol=1e-12)
    assert (np.abs(full[:, [0, 4]]) > 0).all()


@pytest.mark.parametrize("rounds", [1, None])
def test_markov_blanket_keeps_one_of_a_redundant_pair(rounds):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(1000, 12))
    X[:, 7] = X[:, 3] + 0.01 * rng.normal(size=1000)  # near copy of x3: the pair must not be dropped together
    y = (X[:, 3] + X[:, 5] + 0.3 * rng.normal(size=1000) > 0).astype(int)
    sel = make_selector({"name": "markov_blanket", "params": {"max_shrink_rounds": rounds}})
    out = sel.select(X, y)
    assert out.mask[5] and (out.mask[3] or out.mask[7])
    assert out.mask[[0, 1, 2, 4, 6, 8, 9, 10, 11]].sum() <= 1
    assert sel.n_shrink_tests_ >= 1 and (rounds is None or sel.n_shrink_tests_ <= rounds)


def test_markov_blanket_joint_drop_spares_one_of_a_redundant_pair():
    # weak features 3 and 7 are redundant: either may go, not both (a stub stands in for the tests)
    from fedtab.election.markov_blanket import MarkovBlanketSelector

    sel = MarkovBlanketSelector()

    def pvalues(folds, groups, regression, rng):
        p = np.array([0.01 if {3, 7} <= set(g.tolist()) else 0.5 for g in groups])
        return np.zeros(len(groups)), p

    sel._pvalues = pvalues
    assert sel._droppable([], [2, 3, 7, 9], False, None) == [2, 3, 9]
    assert sel._droppable([], [7, 3], False, None) == [7]
    assert sel._droppable([], [4, 9, 2], False, None) == [4, 9, 2]


def test_sequential_attention_trains_its_logits_and_recovers_signal():
    X, y = _informative(0, n=1500, d=40, k=5, class_sep=1.5)
    sel = make_selector({"name": "sequential_attention", "params": {"k": 5, "steps_per_phase": 100}})
    out = sel.select(X, y)
    assert out.mask.sum() == 5
    hits = out.mask[:5].sum()
    assert hits >= 4  # chance expectation: 5 * 5 / 40 = 0.625
    assert np.ptp(sel.logits_) > 0.1  # the attention logits moved away from their zero init
    assert len(sel.order_) == 5 and out.scores[sel.order_[0]] == 2.0
    assert (out.scores[~out.mask] < 1).all()


def test_lasso_cv_selects_sparse_signal_and_never_an_empty_ballot():
    X, y = _informative(2, n=800, d=30, k=4)
    sel = make_selector("lasso_cv")
    out = sel.select(X, y)
    # CV optimises prediction, so some noise survives; the signal must dominate the scores
    assert out.mask[:4].all() and out.mask.sum() < 30
    assert np.sort(out.scores[:4])[1:].min() > 5 * out.scores[4:].mean()
    assert np.isclose(np.logspace(-3, 1, 10), sel.strength_).any()  # a strength from the CV grid
    noise = np.random.default_rng(0).normal(size=(100, 5))
    out2 = make_selector("lasso_cv").select(noise, np.arange(100) % 2)
    assert out2.mask.sum() >= 1
