import numpy as np
import pytest
from sklearn.feature_selection import SelectKBest, f_classif

from fedtab.election.selectors import SELECTORS, make_selector, selector_spec
from fedtab.data import classification_table

TABLE = classification_table(400, 20, 4, 0, 0, shuffle=False, seed=1, class_sep=2.0)
X = TABLE.drop(columns="target").to_numpy()
Y = TABLE["target"].to_numpy()
INFORMATIVE = set(range(4))


@pytest.mark.parametrize("name", ["lasso", "elastic_net", "random_forest", "mutual_info", "anova", "chi2"])
def test_builtin_selectors_find_informative_features(name):
    sel = make_selector(name).select(X, Y)
    assert sel.mask.shape == (20,) and sel.mask.dtype == bool
    assert sel.scores.shape == (20,) and np.isfinite(sel.scores).all()
    top4 = set(np.argsort(-np.abs(sel.scores))[:4])
    assert len(top4 & INFORMATIVE) >= 3, f"{name} ranked {sorted(top4)} on top"
    if name in ("random_forest", "mutual_info", "anova", "chi2"):
        assert sel.mask.sum() == 10  # default top-k = half


def test_lasso_keeps_nonzero_coefficients_only():
    sel = make_selector({"name": "lasso", "params": {"C": 0.02}}).select(X, Y)
    assert (sel.mask == (sel.scores > 1e-10)).all()
    assert 0 < sel.mask.sum() < 20


def test_lasso_regression_target():
    rng = np.random.default_rng(0)
    Xr = rng.normal(size=(300, 8))
    y = 3 * Xr[:, 0] - 2 * Xr[:, 1] + 0.1 * rng.normal(size=300)
    sel = make_selector({"name": "lasso", "params": {"alpha": 0.1}}).select(Xr, y)
    assert set(np.flatnonzero(sel.mask)) == {0, 1}


def test_top_k_parameter_and_fraction():
    assert make_selector({"name": "anova", "params": {"k": 3}}).select(X, Y).mask.sum() == 3
    assert make_selector({"name": "anova", "params": {"k": 0.25}}).select(X, Y).mask.sum() == 5


def test_sklearn_selector_and_callable():
    sel = make_selector(SelectKBest(f_classif, k=4)).select(X, Y)
    assert set(np.flatnonzero(sel.mask)) <= set(range(20)) and sel.mask.sum() == 4
    assert len(set(np.flatnonzero(sel.mask)) & INFORMATIVE) >= 3
    fn = make_selector(lambda X, y: (np.arange(X.shape[1]) < 2, np.arange(X.shape[1], 0, -1)))
    out = fn.select(X, Y)
    assert out.mask.sum() == 2 and out.scores[0] == 20


def test_errors():
    with pytest.raises(ValueError, match="unknown selector 'nope'"):
        make_selector("nope")
    with pytest.raises(ValueError, match="bad parameters"):
        make_selector({"name": "lasso", "params": {"bogus": 1}})
    with pytest.raises(ValueError, match="NaN"):
        make_selector("anova").select(np.array([[np.nan, 1.0], [1.0, 2.0]]), np.array([0, 1]))
    with pytest.raises(ValueError, match="k must be"):
        make_selector({"name": "anova", "params": {"k": 50}}).select(X, Y)
    with pytest.raises(ValueError, match="must return"):
        make_selector(lambda X, y: 1).select(X, Y)
    with pytest.raises(ValueError, match="cannot be sent"):
        selector_spec(lambda X, y: (None, None))


def test_spec_round_trip():
    spec = selector_spec({"name": "random_forest", "params": {"k": 5}})
    assert spec["name"] == "random_forest" and spec["params"]["k"] == 5
    assert type(make_selector(spec)) is SELECTORS["random_forest"]
