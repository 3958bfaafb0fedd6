"""``FederatedImputer`` follows scikit-learn's estimator contract.

``check_estimator`` runs every check on the fast settings below. Checks that cannot
apply to a federated estimator, and why:

* ``check_transformer_data_not_an_array`` passes ``X.tolist()``, a list of rows. A
  ``FederatedImputer`` reads a list as *one table per site* (its federated input), so a
  list of rows is a list of 1-D "sites" and is rejected with a ``ValueError`` naming
  the site. Arrays, DataFrames and objects with ``__array__`` are one table (one site).

What ``check_estimator`` cannot see (a single table is a single site) is tested below:
several sites with different columns, ``transform`` of a site's own subset of columns.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from fedtab.imputer import FederatedImputer

pytestmark = pytest.mark.requires("torch")  # imported when a test runs, not at collection

FAST = dict(rounds=1, local_epochs=1, hidden_dim=4, n_layers=1, batch_size=64, max_steps_per_round=2,
            validation_fraction=0.0, use_prior=False, k_neighbors=3, n_threads=1)

NOT_APPLICABLE = {
    "check_transformer_data_not_an_array": "a list is one table per site, not a list of rows",
}


def test_check_estimator_passes_every_applicable_check():
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(FederatedImputer(**FAST), on_fail=None, expected_failed_checks=NOT_APPLICABLE)
    status = {r["check_name"]: r["status"] for r in results}
    failed = {r["check_name"]: repr(r["exception"]) for r in results if r["status"] == "failed"}
    assert failed == {}
    assert status["check_transformer_data_not_an_array"] == "xfail"
    for check in ("check_complex_data", "check_transformers_unfitted", "check_n_features_in_after_fitting",
                  "check_fit_idempotent", "check_estimators_pickle", "check_transformer_general"):
        assert status[check] == "passed"
    assert sum(s == "passed" for s in status.values()) >= 40


def sites():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(160, 2))
    full = pd.DataFrame({"a": z[:, 0], "b": z[:, 0] + 0.1 * z[:, 1], "c": z[:, 1], "d": z[:, 1] - z[:, 0]})
    full = full.mask(rng.random(full.shape) < 0.1)
    return [full.iloc[:80][["a", "b", "c"]], full.iloc[80:][["a", "c", "d"]]]


def test_contract_attributes_on_several_sites():
    tables = sites()
    imp = FederatedImputer(**FAST)
    with pytest.raises(NotFittedError, match="not fitted"):
        imp.transform(tables[0])
    with pytest.raises(RuntimeError):  # what fedtab raised before: callers catching it still do
        imp.get_feature_names_out()
    imp.fit(tables)
    assert imp.n_features_in_ == 4 and list(imp.feature_names_in_) == ["a", "b", "c", "d"]
    assert list(imp.get_feature_names_out()) == ["a", "b", "c", "d"]
    site_view = imp.transform(tables[0])  # a site's own columns: every global column back
    assert isinstance(site_view, pd.DataFrame) and list(site_view.columns) == ["a", "b", "c", "d"]
    assert not site_view.isna().any().any()
    full = np.column_stack([tables[0].to_numpy(), np.full(80, np.nan)])
    with pytest.warns(UserWarning, match="feature names"):  # fitted with names, given an array
        arr = imp.transform(full)
    assert isinstance(arr, np.ndarray) and arr.shape == (80, 4)
    # an array holds every global column: NaN there is a missing cell, not an unavailable column
    # the same float32 network on the same rows: equal up to a few float32 ulps (measured: bit-identical)
    np.testing.assert_allclose(arr, imp.transform(pd.DataFrame(full, columns=["a", "b", "c", "d"])).to_numpy(),
                               rtol=4 * np.finfo(np.float32).eps)
    imp.set_output(transform="pandas")
    framed = imp.transform(tables[1])
    assert list(framed.columns) == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="Complex data not supported"):
        imp.transform(tables[0].astype(complex))
    with pytest.raises(ValueError, match="Complex data not supported"):
        FederatedImputer(**FAST).fit([tables[0].astype(complex), tables[1]])
    with pytest.raises(TypeError, match="sparse"):
        from scipy import sparse

        FederatedImputer(**FAST).fit(sparse.csr_matrix(np.ones((10, 3))))


def test_one_array_is_one_site_and_works_in_a_pipeline():
    X = sites()[0].to_numpy()
    pipe = make_pipeline(FederatedImputer(**FAST), StandardScaler()).fit(X)
    out = pipe.transform(X)
    assert out.shape == X.shape and np.isfinite(out).all()
    imp = pipe[0]
    assert imp.n_features_in_ == 3 and not hasattr(imp, "feature_names_in_")
    assert list(imp.get_feature_names_out()) == ["x0", "x1", "x2"]
    with pytest.raises(ValueError, match="X has 2 features, but FederatedImputer is expecting 3"):
        imp.transform(X[:, :2])
