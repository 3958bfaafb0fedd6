"""The federated tuning workflow: validation rows only, the whole curve, the mask applied."""

import numpy as np
import pytest

from fedtab import LocalFederation, Site
from fedtab.privacy import DisclosurePolicy
from fedtab.data import classification_table
from fedtab.federation import FederationError, run_training, tune_flow
from fedtab.federation.workflows.tuning.server import gather_fit_ballots, split_validation
from tests.builders import classification_parts, federation


def _fed(seed=0, n=900):
    return federation(classification_parts(n, 30, 5, 3, seed=seed, class_sep=1.5)[1], seed=range(3))


OPTS = dict(rounds=3, local_epochs=3, grid=(0.0, 0.25, 0.5, 0.75, 1.0), refine_step=0.0)


def test_grid_tuning_returns_curve_and_applies_the_mask():
    fed = _fed()
    out = tune_flow(fed, selector="lasso", model="logistic", **OPTS)
    curve = out.tuning.curve()
    assert [c["freedom_degree"] for c in curve] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert all(0 <= c["score"] <= 1 for c in curve)
    kept = [c["kept"] for c in curve]
    assert kept == sorted(kept) and kept[-1] == out.election.stats["union"]
    assert out.tuning.score >= out.tuning.best_score - 0.01
    for name in fed.sites:
        assert fed.site(name).state["features"] == out.features
    total = {n: len(fed.site(n).rows("train")) for n in fed.sites}
    assert all(s["n_fit"] + s["n_validation"] == total[n] for n, s in out.split.items())
    assert [b.n_samples for b in out.ballots] == [out.split[n]["n_fit"] for n in fed.sites]
    final = run_training(fed, model="logistic", rounds=3)
    assert final.features == out.features and final.pooled["weighted_f1"] > 0.7


def test_test_rows_are_never_used_for_the_choice():
    a, b = _fed(), _fed()
    for name in b.sites:  # scramble the test rows of one copy: labels and features
        site = b.site(name)
        test_idx = site.parts.indices("test")
        rng = np.random.default_rng(0)
        cols = site.feature_names
        site.table.loc[test_idx, cols] = rng.normal(size=(len(test_idx), len(cols))) * 50
        site.table.loc[test_idx, "target"] = 1 - site.table.loc[test_idx, "target"]
    ra = tune_flow(a, selector="lasso", **OPTS)
    rb = tune_flow(b, selector="lasso", **OPTS)
    assert ra.tuning.curve() == rb.tuning.curve()
    assert ra.features == rb.features


def test_hill_climb_and_ballot_reuse_with_gnb():
    fed = _fed()
    ballots = gather_fit_ballots(fed, "anova")
    split = split_validation(fed)  # the sites' own parts, from the schema the ballots agreed
    assert all(split[n]["n_validation"] == fed.site(n).n_rows("fold:0") > 0 for n in fed.sites)
    out = tune_flow(fed, ballots=ballots, model="gnb", tune_method="hill-climb", apply=False)
    assert out.tuning.method == "hill-climb" and out.ballots is ballots
    assert all(0.05 <= c["freedom_degree"] <= 1 for c in out.tuning.curve())
    assert "features" not in fed.site("s0").state  # apply=False leaves the sites alone


def test_a_site_too_small_to_split_is_named():
    table = classification_table(60, 5, 3, 0, 0, seed=0)
    fed = LocalFederation([Site("big", table.iloc[:55], "target"), Site("tiny", table.iloc[55:56], "target", test_size=0)])
    with pytest.raises(FederationError, match="tiny"):
        tune_flow(fed, selector="lasso", **OPTS)


def test_a_site_with_one_class_in_its_fit_rows_abstains_by_name():
    # (issue 15) it used to fail the whole run inside its selector; now it abstains from the vote
    table = classification_table(60, 5, 3, 0, 0, seed=0)
    # a 2-row site answers only under an explicit policy (the default min_rows=10 refuses it)
    tiny = Site("tiny", table.iloc[55:57], "target", test_size=0, policy=DisclosurePolicy(min_rows=1))
    fed = LocalFederation([Site("big", table.iloc[:55], "target"), tiny])
    out = tune_flow(fed, selector="lasso", **OPTS)
    assert set(out.abstained) == {"tiny"} and "single target value" in out.abstained["tiny"]
    assert [b.site for b in out.ballots] == ["big"]


def test_tune_and_train_report_is_json_and_complete():
    import json

    from fedtab.federation.workflows.tuning.server import tune_and_train

    rep = tune_and_train(_fed(), selector="lasso", model="sgd", rounds=2, local_epochs=1)
    json.dumps(rep)
    assert rep["selected"] and rep["training"]["elected"]["n_params"] < rep["training"]["all_features"]["n_params"]
    assert rep["training"]["communication"]["param_reduction"] > 0
    assert rep["tuning"]["method"] == "grid" and rep["tuning"]["curve"]


@pytest.mark.parametrize("mode", [dict(secure_aggregation=True), dict(dp={"epsilon": 2.0, "bounds": [-6, 6]}),
                                  dict(robust=True)])
def test_tuning_in_a_mode_it_does_not_support_is_refused_before_any_exchange(mode):
    """Its fit ballots and validation fits are answered per site: a secure, DP or robust run
    is refused by its declared modes, before a request leaves."""
    from fedtab.federation.protocol import set_options

    fed = _fed(n=300)
    set_options(fed, **mode)
    with pytest.raises(ValueError, match="is not available for freedom-degree tuning"):
        tune_flow(fed, selector="lasso", model="logistic", **OPTS)
    assert not fed.traffic.records
