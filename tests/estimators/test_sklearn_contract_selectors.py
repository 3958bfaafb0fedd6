"""Every selector is a scikit-learn selector; any scikit-learn selector is a site's selector."""

from __future__ import annotations

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
from fedtab.federation.workflows.election.server import gather_ballots

#: fast settings for the built-ins (all of them: the test fails when one is added untested)
SPECS = {
    "lasso": {}, "elastic_net": {}, "random_forest": {"n_estimators": 20}, "mutual_info": {}, "anova": {"k": 5},
    "chi2": {"k": 0.3}, "lasso_cv": {"Cs": 4}, "markov_blanket": {"n_trees": 10, "n_splits": 3},
    "sequential_attention": {"k": 4, "steps_per_phase": 20},
}

#: (selected indices, scores) of ``select`` on :func:`data`, scores to 12 significant digits. Computed on
#: main at 1c5aa66; the selectors as they were before they became scikit-learn estimators (main at 45bc543)
#: give bit-identical masks and scores on the same machine, so these pin the benchmarks' numbers.
GOLDEN = {
    "lasso/c": ([0, 2, 3, 4, 8, 9], [
        0.378804092459, 0, 0.0296955053313, 0.40911069536, 0.0343669091899, 0,
        0, 0, 0.0710224944582, 0.0941481228764, 0, 0,
    ]),
    "lasso/r": ([0, 1, 5, 7, 8, 11], [
        3.00272865889, 1.31808887232, 0, 0, 0, 0.00375196037009,
        0, 0.00192662431013, 0.00700571513559, 0, 0, 0.00102347559005,
    ]),
    "elastic_net/c": ([0, 2, 3, 4, 8, 9], [
        0.444011719095, 0, 0.0851790386372, 0.353593764028, 0.168900305634, 0,
        0, 0, 0.149405131221, 0.181826868187, 0, 0,
    ]),
    "elastic_net/r": ([0, 1, 3, 4, 5, 6, 7, 8, 9, 11], [
        2.95986636745, 1.26742603806, 0, 0.0559276069913, 0.065164502064, 0.0594608204487,
        0.00238505177345, 0.00867163862883, 0.0132185108957, 0.000602597072669, 0, 0.00810506565999,
    ]),
    "random_forest/c": ([0, 1, 2, 3, 4, 5], [
        0.103810404198, 0.0477201337167, 0.0705946118267, 0.13562806361, 0.134824755562, 0.34060552227,
        0.0263917665119, 0.0291473127379, 0.0226775446466, 0.0351162634353, 0.0342550412973, 0.0192285801872,
    ]),
    "random_forest/r": ([0, 1, 2, 4, 5, 8], [
        0.836777843625, 0.1434419995, 0.00469441257254, 0.00151904149704, 0.00192202094813, 0.00308712939069,
        0.00081288026021, 0.000718469203212, 0.00307842725661, 0.000852757680412, 0.00156770130552, 0.00152731676084,
    ]),
    "mutual_info/c": ([0, 1, 2, 3, 5, 7], [
        0.0350727977005, 0.0494347630208, 0, 0.100992925808, 0, 0.301621408,
        0, 0.0198042435073, 0, 0, 0, 0,
    ]),
    "mutual_info/r": ([0, 1, 2, 3, 4, 5], [
        1.39395226954, 0.606613770428, 0.322044122468, 0.162735700324, 0.0978075202091, 0.543557547943,
        0.0321041314101, 0.00282453930152, 0, 0, 0.0743296395739, 0.0873036524007,
    ]),
    "anova/c": ([0, 2, 3, 4, 8], [
        20.2890326337, 0.470154557904, 15.4028886366, 23.9845480055, 12.3728341187, 3.68750331632,
        1.03420962795, 0.418536746878, 3.85276592196, 3.58562133339, 0.00015938814502, 0.0182325219133,
    ]),
    "anova/r": ([0, 1, 2, 4, 5], [
        2276.57579147, 252.541410913, 77.9709745033, 0.413948892371, 32.7353503995, 379.294121302,
        1.96514419173, 1.44326458558, 0.594752956323, 0.0137187074754, 2.35899605386, 3.41731624419,
    ]),
    "chi2/c": ([0, 2, 3, 4], [
        1.20733131766, 0.0431167365414, 1.01829104523, 1.69474917952, 1.19442182848, 0.388237743039,
        0.0768788486007, 0.0308806476247, 0.277805582473, 0.253433128284, 8.5243838413e-06, 0.00157367759038,
    ]),
    "lasso_cv/c": ([0], [
        0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0,
    ]),
    "markov_blanket/c": ([0, 1, 3, 4, 5], [
        0.0390954707187, 0.0311714741993, 0.0330674132912, 0.0785663406758, 0.0558261026139, 0.25841270571,
        0, 0, 0.0043588474752, 0.00387811417983, 0, 0,
    ]),
    "markov_blanket/r": ([0, 1, 5], [
        8.27568511886, 2.94704433856, 0.241598035007, 0.084953307301, 0.169107469158, 2.34624635838,
        0.00554409548807, 0.04353797684, 0, 0, 0.0110377407291, 0,
    ]),
    "sequential_attention/c": ([0, 2, 3, 5], [
        1.75, 0.491715997458, 1.5, 2, 0.101237617433, 1.25,
        0.0397519618273, 0.0502338670194, 0.0985329374671, 0.152861088514, 0.0314521938562, 0.0342143364251,
    ]),
    "sequential_attention/r": ([0, 1, 3, 5], [
        1.5, 1.75, 0.0685534477234, 1.25, 0.176511585712, 2,
        0.123315319419, 0.119117543101, 0.104895539582, 0.176624685526, 0.120809048414, 0.11017280817,
    ]),
}

#: float64 scores (closed forms, and solvers that stop at their own tolerance) move by <= 4e-14 relative
#: between BLAS/SIMD kernels (measured: OPENBLAS_CORETYPE=Sandybridge, NPY_DISABLE_CPU_FEATURES=AVX2...,
#: ATEN_CPU_CAPABILITY=default vs native); one solver iteration more or fewer moves them >= 2e-3.
FLOAT64_RTOL = 1e-9
#: Sequential Attention trains in float32: its unselected features' attention weights (<= 1) moved by
#: <= 1.2e-7 (1 ulp at 1.0, float32 eps) between kernels after 100 Adam steps; 1e-5 is ~80 ulps, far
#: below what a different pick, learning rate or step count changes (> 1e-2).
FLOAT32_ATOL = 1e-5
#: the table is put on this dyadic grid (exact in float64) so that every machine builds the same X:
#: make_classification's np.dot differs in the last bit between BLAS kernels, and a 1e-9 change of X
#: already flips which near-tied noise feature a 20-tree forest ranks 6th.
GRID = 2.0**-20


@pytest.fixture(scope="module")
def data():
    t = classification_table(240, 12, 4, 2, seed=1, target="y")
    X, y = t.drop(columns="y"), t["y"].to_numpy()
    units = X.to_numpy() / GRID
    # no value within 1e-6 grid units (5e-13) of a rounding midpoint: last-bit differences cannot move it
    assert np.abs(np.abs(units - np.floor(units)) - 0.5).min() > 1e-6
    X = pd.DataFrame(np.round(units) * GRID, columns=X.columns)
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
        mask, scores = GOLDEN[key]
        assert np.flatnonzero(sel.mask).tolist() == mask, key
        got = np.asarray(sel.scores, np.float64)
        if name == "sequential_attention":  # picks score 2 - j/k exactly (the order); the rest are float32
            picked = np.asarray(scores) > 1.0
            np.testing.assert_array_equal(got[picked], np.asarray(scores)[picked], err_msg=key)
            np.testing.assert_allclose(got[~picked], np.asarray(scores)[~picked], rtol=0, atol=FLOAT32_ATOL,
                                       err_msg=key)
        else:
            np.testing.assert_allclose(got, scores, rtol=FLOAT64_RTOL, atol=0, err_msg=key)


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
    # the scores travel as float32 (wire_scores): the selector's own scores, rounded once
    np.testing.assert_array_equal(ballot.scores, fitted.scores_.astype(np.float32))


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
