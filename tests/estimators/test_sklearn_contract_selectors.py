"""Every selector is a scikit-learn selector; any scikit-learn selector is a site's selector."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.feature_selection import RFE, SelectFromModel, SelectKBest, SelectorMixin, VarianceThreshold, f_classif
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline

from fedtab import LocalFederation, Site
from fedtab.data import classification_table
from fedtab.election.selectors import SELECTORS, SklearnSelector, make_selector
from fedtab.federation.election_flow import gather_ballots

#: fast settings for the built-ins (all of them: the test fails when one is added untested)
SPECS = {
    "lasso": {}, "elastic_net": {}, "random_forest": {"n_estimators": 20}, "mutual_info": {}, "anova": {"k": 5},
    "chi2": {"k": 0.3}, "lasso_cv": {"Cs": 4}, "markov_blanket": {"n_trees": 10, "n_splits": 3},
    "sequential_attention": {"k": 4, "steps_per_phase": 20},
}

#: (selected indices, sha256 of the scores' float64 bytes) of ``select`` on :func:`data`, computed
#: with the selectors as they were before they became scikit-learn estimators (main at 45bc543):
#: the benchmarks' numbers depend on masks and scores staying bit-identical.
GOLDEN = {
    "lasso/c": ([0, 2, 3, 4, 8, 9], "ab3e0e05b98f7b69"),
    "lasso/r": ([0, 1, 5, 7, 8, 11], "e84a55ddf63978bf"),
    "elastic_net/c": ([0, 2, 3, 4, 8, 9], "4642737a76864ffc"),
    "elastic_net/r": ([0, 1, 3, 4, 5, 6, 7, 8, 9, 11], "0674eef3d5b2649a"),
    "random_forest/c": ([0, 1, 2, 3, 4, 5], "7e9b2fa6181877fb"),
    "random_forest/r": ([0, 1, 2, 4, 5, 8], "8e4242a13871422d"),
    "mutual_info/c": ([0, 1, 2, 3, 5, 7], "dc5443093a503eb3"),
    "mutual_info/r": ([0, 1, 2, 3, 4, 5], "f519477936906154"),
    "anova/c": ([0, 2, 3, 4, 8], "14211ee699f984f3"),
    "anova/r": ([0, 1, 2, 4, 5], "e70ba9451382f8f7"),
    "chi2/c": ([0, 2, 3, 4], "4bd816212996bd16"),
    "lasso_cv/c": ([0], "2ea9ab9198d16380"),
    "markov_blanket/c": ([0, 1, 3, 4, 5], "d2f6187ea205c30c"),
    "markov_blanket/r": ([0, 1, 4, 5], "a5524d8e294bb057"),
    "sequential_attention/c": ([0, 2, 3, 5], "ac014296a87466ef"),
    "sequential_attention/r": ([0, 1, 3, 5], "f0a14c00f10baa69")
}


@pytest.fixture(scope="module")
def data():
    t = classification_table(240, 12, 4, 2, seed=1, target="y")
    X, y = t.drop(columns="y"), t["y"].to_numpy()
    y_reg = X.to_numpy()[:, 0] * 2.0 + X.to_numpy()[:, 1] + np.random.default_rng(0).normal(size=len(X)) * 0.1
    return X, y, y_reg


def test_every_builtin_is_tested():
    assert set(SPECS) == set(SELECTORS)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_masks_and_scores_are_unchanged(name, data):
    X, y, y_reg = data
    for task, target in (("c", y), ("r", y_reg)):
        key = f"{name}/{task}"
        if key not in GOLDEN:
            continue
        sel = make_selector({"name": name, "params": SPECS[name]}).select(X.to_numpy(), target)
        digest = hashlib.sha256(np.asarray(sel.scores, np.float64).tobytes()).hexdigest()[:16]
        assert (np.flatnonzero(sel.mask).tolist(), digest) == GOLDEN[key]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_builtin_selector_is_a_sklearn_selector(name, data):
    X, y, _ = data
    sel = SELECTORS[name](**SPECS[name])
    assert isinstance(sel, SelectorMixin)
    params = sel.get_params(deep=True)
    assert params == sel.get_params(deep=False) and set(SPECS[name]) <= set(params)
    twin = clone(sel)
    assert twin.get_params() == params and twin is not sel
    twin.set_params(seed=3)
    assert twin.seed == 3 and sel.seed == 0
    fitted = sel.fit(X, y)
    assert fitted is sel and sel.n_features_in_ == 12 and list(sel.feature_names_in_) == list(X.columns)
    ballot = SELECTORS[name](**SPECS[name]).select(X.to_numpy(), y)
    np.testing.assert_array_equal(sel.get_support(), ballot.mask)
    np.testing.assert_array_equal(sel.scores_, ballot.scores)
    kept = list(X.columns[ballot.mask])
    assert list(sel.get_feature_names_out()) == kept
    assert sel.transform(X).shape == (len(X), len(kept))


@pytest.mark.parametrize("name", ["lasso", "anova", "random_forest"])
def test_builtin_selector_in_a_pipeline(name, data):
    X, y, _ = data
    pipe = Pipeline([("select", make_selector({"name": name, "params": SPECS[name]})),
                     ("model", LogisticRegression(max_iter=500))]).fit(X, y)
    assert pipe.predict(X).shape == (len(X),)
    assert pipe[-1].n_features_in_ == pipe[0].get_support().sum()
    assert list(pipe[:-1].get_feature_names_out()) == list(X.columns[pipe[0].get_support()])


def test_the_ballot_is_the_same_object(data):
    X, y, _ = data
    sel = make_selector({"name": "anova", "params": {"k": 4}})
    assert make_selector(sel) is sel  # a site's selector object is used as given
    site = Site("a", X.assign(y=y), "y", test_size=0.0, selector=sel)
    (ballot,) = gather_ballots(LocalFederation([site]))
    fitted = clone(sel).fit(X, y)
    np.testing.assert_array_equal(ballot.mask, fitted.get_support())
    np.testing.assert_array_equal(ballot.scores, fitted.scores_)


SKLEARN_SELECTORS = {
    "SelectKBest": (SelectKBest(f_classif, k=4), "scores_"),
    "SelectFromModel": (SelectFromModel(LogisticRegression(C=0.05, l1_ratio=1.0, solver="saga", max_iter=500,
                                                           random_state=0)),
                        "estimator_.coef_"),
    "RFE": (RFE(LogisticRegression(max_iter=500), n_features_to_select=4), "ranking_"),
    "VarianceThreshold": (VarianceThreshold(0.5), "mask"),
}


@pytest.mark.parametrize("name", sorted(SKLEARN_SELECTORS))
def test_any_sklearn_selector_votes_unchanged(name, data):
    X, y, _ = data
    est, source = SKLEARN_SELECTORS[name]
    site = Site("a", X.assign(y=y), "y", test_size=0.0, selector=est)
    (ballot,) = gather_ballots(LocalFederation([site]))
    fitted = clone(est).fit(X.to_numpy(), y)
    np.testing.assert_array_equal(ballot.mask, fitted.get_support())
    if source == "scores_":
        expected = fitted.scores_
    elif source == "estimator_.coef_":
        expected = np.linalg.norm(np.atleast_2d(fitted.estimator_.coef_), axis=0)
    elif source == "ranking_":
        expected = fitted.ranking_.max() + 1.0 - fitted.ranking_
    else:
        expected = fitted.get_support().astype(float)
    np.testing.assert_allclose(ballot.scores, expected)
    assert not hasattr(est, "n_features_in_")  # the user's object is cloned, never fitted
    assert isinstance(make_selector(est), SklearnSelector)
