"""GaussianNB: federated statistics give exactly the centralised scikit-learn model."""

import numpy as np
import pytest
from sklearn.naive_bayes import GaussianNB

from fedtab import LocalFederation
from fedtab.federation import run_training
from fedtab.learn import GaussianNBModel, gnb_from_statistics, gnb_statistics
from tests.builders import classification_parts, make_sites


def _data(seed=0, n=600, d=8, classes=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 3, d) + y[:, None] * rng.normal(size=d)
    return X, y


@pytest.mark.parametrize("var_smoothing", [1e-9, 1e-2, 0.5])
def test_pooled_statistics_equal_centralised_fit(var_smoothing):
    X, y = _data()
    parts = np.array_split(np.random.default_rng(1).permutation(len(y)), 3)
    model = GaussianNBModel(var_smoothing=var_smoothing)
    params = model.init(X.shape[1], 3)
    updates = [(model.local_update(params, X[p], y[p]), len(p)) for p in parts]
    pooled = model.aggregate(updates)
    ref = GaussianNB(var_smoothing=var_smoothing).fit(X, y)
    np.testing.assert_allclose(pooled["theta"], ref.theta_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(pooled["var"], ref.var_, rtol=1e-8)
    np.testing.assert_allclose(np.exp(pooled["log_prior"]), ref.class_prior_, rtol=1e-12)
    Xq, _ = _data(seed=5, n=300)
    np.testing.assert_array_equal(model.predict(pooled, Xq), ref.predict(Xq))
    np.testing.assert_allclose(model.predict_proba(pooled, Xq), ref.predict_proba(Xq), rtol=1e-6, atol=1e-9)


def test_var_smoothing_uses_the_pooled_variance_of_all_rows():
    X, y = _data(seed=2)
    X[:, 3] *= 100.0  # this feature sets epsilon
    stats = gnb_statistics(X, y, 3)
    p = gnb_from_statistics(stats, var_smoothing=0.1)
    raw = gnb_from_statistics(stats, var_smoothing=0.0)
    np.testing.assert_allclose(p["var"] - raw["var"], 0.1 * X.var(axis=0).max(), rtol=1e-9)


def test_site_missing_a_class_and_statistics_validation():
    X, y = _data(seed=3)
    model = GaussianNBModel()
    params = model.init(X.shape[1], 3)
    only01 = y < 2
    updates = [(model.local_update(params, X[only01], y[only01]), int(only01.sum())),
               (model.local_update(params, X[~only01], y[~only01]), int((~only01).sum()))]
    pooled = model.aggregate(updates)
    ref = GaussianNB().fit(X, y)
    np.testing.assert_allclose(pooled["theta"], ref.theta_, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="shape"):
        bad = dict(updates[0][0], sum=np.zeros((2, 2)))
        model.aggregate([updates[1], (bad, 5)])
    with pytest.raises(ValueError, match="labels"):
        gnb_statistics(X, np.full(len(y), 7), 3)


def test_federated_workflow_equals_centralised_on_standardised_rows():
    _, parts = classification_parts(900, 12, 5, 2, seed=4, split_seed=0, n_classes=3)
    sites = make_sites(parts, seed=range(3))
    fed = LocalFederation(sites)
    out = run_training(fed, model="gnb", rounds=7)
    assert out.rounds == 1  # exact aggregation: one round whatever was asked
    tr = [s.rows("train") for s in sites]
    X = np.vstack([t.drop(columns="target").to_numpy() for t in tr])
    y = np.concatenate([t["target"].to_numpy() for t in tr])
    Z = (X - out.mean) / out.std
    ref = GaussianNB().fit(Z, y)
    np.testing.assert_allclose(out.params["theta"], ref.theta_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(out.params["var"], ref.var_, rtol=1e-7)
    # nothing is sent down for an exact model; statistics go up
    assert all(t["params_down"] == 0 and t["params_up"] == 3 * (2 * 12 + 1) for t in out.traffic)
