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
