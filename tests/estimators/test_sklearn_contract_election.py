"""``FederatedFeatureElection``: one table per site in, a scikit-learn selector out."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.feature_selection import SelectKBest, f_classif
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline

from fedtab import FederatedFeatureElection, LocalFederation, Site, run_election
from fedtab.federation.protocol import FederationError
from tests.builders import classification_parts


@pytest.fixture(scope="module")
def tables():
    return classification_parts(600, 20, 4, 2, [0.6, 0.4], target="outcome")[1]


def test_three_line_study_equals_the_workflow(tables):
    fe = FederatedFeatureElection(selector="lasso", freedom_degree=0.5).fit(tables, "outcome")
    sites = [Site(f"site{i}", t, "outcome", test_size=0.0, selector="lasso") for i, t in enumerate(tables)]
    reference = run_election(LocalFederation(sites), 0.5).result
    np.testing.assert_array_equal(fe.get_support(), reference.mask)
    assert list(fe.feature_names_out_) == reference.selected_names
    assert list(fe.get_feature_names_out()) == reference.selected_names
    assert fe.n_features_in_ == 20 and fe.site_names_ == ["site0", "site1"]
    table = fe.explain()
    assert list(table.columns) == ["feature", "held_by", "selected_by", "vote", "rank", "kept", "reason"]
    assert table["kept"].sum() == len(fe.feature_names_out_)
    X = tables[0].drop(columns="outcome")
    assert list(fe.transform(X).shape) == [len(X), len(fe.feature_names_out_)]


def test_clone_params_and_compat_profile(tables):
    fe = FederatedFeatureElection(selector="anova", freedom_degree=0.3, compat="nvflare")
    copy = clone(fe)
    assert copy.get_params() == fe.get_params() and not hasattr(copy, "support_")
    copy.set_params(freedom_degree=1.0).fit({"a": tables[0], "b": tables[1]}, "outcome")
    assert copy.result_.compat == "nvflare" and copy.site_names_ == ["a", "b"]
    assert copy.get_support().sum() == copy.result_.stats["union"]


def test_per_site_selectors_and_label_arrays(tables):
    features = [t.drop(columns="outcome") for t in tables]
    labels = [t["outcome"].to_numpy() for t in tables]
    user_selector = SelectKBest(f_classif, k=5)
    fe = FederatedFeatureElection(selector=[user_selector, {"name": "anova", "params": {"k": 5}}],
                                  freedom_degree=0.0).fit(features, labels)
    assert not hasattr(user_selector, "scores_")  # each site fitted its own clone
    # SelectKBest and the built-in ANOVA selector rank by the same F statistic
    assert [b.n_selected for b in fe.ballots_] == [5, 5]
    np.testing.assert_array_equal(fe.ballots_[0].mask, SelectKBest(f_classif, k=5).fit(
        features[0], labels[0]).get_support())


def test_fitted_election_is_a_frozen_pipeline_step(tables):
    from sklearn.frozen import FrozenEstimator

    fe = FederatedFeatureElection(freedom_degree=0.5).fit(tables, "outcome").set_output(transform="pandas")
    X, y = tables[0].drop(columns="outcome"), tables[0]["outcome"]
    model = make_pipeline(FrozenEstimator(fe), LogisticRegression(max_iter=500)).fit(X, y)
    assert model[-1].n_features_in_ == len(fe.feature_names_out_)
    assert list(model[-1].feature_names_in_) == list(fe.feature_names_out_)
    assert model.predict(X).shape == (len(X),)


def test_bad_inputs_name_the_problem(tables):
    with pytest.raises(ValueError, match="needs the target"):
        FederatedFeatureElection().fit(tables)
    with pytest.raises(ValueError, match="3 target entries for 2 sites"):
        FederatedFeatureElection().fit([t.drop(columns="outcome") for t in tables], [[0], [1], [0]])
    with pytest.raises(ValueError, match="unknown compat profile"):
        FederatedFeatureElection(compat="flare").fit(tables, "outcome")
    with pytest.raises(ValueError, match="freedom_degree"):
        FederatedFeatureElection(freedom_degree=2).fit(tables, "outcome")
    broken = tables[1].assign(f03="text")
    with pytest.raises(FederationError, match="site1"):
        FederatedFeatureElection().fit([tables[0], broken], "outcome")
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        FederatedFeatureElection().get_support()
