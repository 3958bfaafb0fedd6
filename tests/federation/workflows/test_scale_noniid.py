"""Non-IID features of issue 15: abstaining sites, min_site_rows, pooled-selector agreement."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.data.synthetic import classification_table, split_rows
from fedtab.election import elect_ballots
from fedtab.election.agreement import jaccard, pooled_agreement, pooled_mask
from fedtab.election.ballot import Ballot
from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.election.server import ballots_from_replies, run_election
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.core import Site
from fedtab.federation.workflows.training import run_training
from fedtab.federation.workflows.tuning.server import tune_flow


def _table(n=600, d=30, seed=0):
    return classification_table(n_samples=n, n_features=d, n_informative=4, n_redundant=0, seed=seed)


def _label_skewed_sites(selector="anova"):
    """Two mixed sites and one site that only ever saw class 1."""
    t = _table()
    mixed = split_rows(t[t.target == 0].head(200).pipe(lambda a: pd.concat([a, t[t.target == 1].head(200)])),
                       [0.5, 0.5], stratify="target", seed=0)
    one_class = t[t.target == 1].iloc[200:].reset_index(drop=True)
    return [Site("a", mixed[0], "target", selector=selector), Site("b", mixed[1], "target", selector=selector),
            Site("ones", one_class, "target", selector=selector)]


def test_one_class_site_abstains_instead_of_voting_noise():
    fed = LocalFederation(_label_skewed_sites())
    out = run_election(fed, 0.0)
    assert set(out.abstained) == {"ones"} and "single target value" in out.abstained["ones"]
    assert [b.site for b in out.ballots] == ["a", "b"]
    assert out.result.stats["sites"] == 2
    # the abstaining site still learns the mask and trains with the others
    assert fed.site("ones").state["features"] == out.result.selected_names
    trained = run_training(fed, rounds=2, local_epochs=1)
    assert set(trained.per_site) == {"a", "b", "ones"}


def test_one_class_site_voting_would_have_broken_the_intersection():
    """Without abstention the one-class site's arbitrary top-half vote shrinks the consensus."""
    sites = _label_skewed_sites()
    fed = LocalFederation(sites)
    out = run_election(fed, 0.0)
    X = sites[2].rows("train").drop(columns="target").to_numpy()
    noise = Ballot.build(np.arange(X.shape[1]) >= X.shape[1] // 2, np.zeros(X.shape[1]), len(X),
                         sites[2].feature_names, "ones")
    with_noise = elect_ballots([*out.ballots, noise], 0.0)
    assert with_noise.stats["intersection"] < out.result.stats["intersection"]


def test_min_site_rows_is_enforced_by_site_and_server():
    t = _table(400)
    parts = split_rows(t, [0.45, 0.45, 0.1], stratify="target", seed=1)
    sites = [Site(n, p, "target", selector="anova") for n, p in zip("abc", parts)]
    out = run_election(LocalFederation(sites), 0.5, min_site_rows=100)
    assert set(out.abstained) == {"c"} and "min_site_rows=100" in out.abstained["c"]
    # a site that ignores the threshold and votes anyway is still left out by the server
    rogue = {"c": Message("ballot", {"mask": np.ones(3, bool), "scores": np.ones(3)},
                          {"feature_names": ["x", "y", "z"], "n_samples": 5})}
    good = {"a": Message("ballot", {"mask": np.ones(3, bool), "scores": np.ones(3)},
                         {"feature_names": ["x", "y", "z"], "n_samples": 500})}
    left: dict[str, str] = {}
    ballots = ballots_from_replies({**good, **rogue}, min_site_rows=100, abstained=left)
    assert [b.site for b in ballots] == ["a"] and set(left) == {"c"}
    with pytest.raises(ValueError, match="min_site_rows"):
        run_election(LocalFederation(sites), 0.5, min_site_rows=-1)


def test_every_site_abstaining_is_a_clear_error():
    t = _table(300)
    sites = [Site(n, t[t.target == c].reset_index(drop=True), "target", selector="anova")
             for n, c in (("zeros", 0), ("ones", 1))]
    with pytest.raises(Exception, match="no valid ballots.*zeros.*single target value"):
        run_election(LocalFederation(sites), 0.5)


def test_tuning_ballots_skip_abstaining_sites():
    out = tune_flow(LocalFederation(_label_skewed_sites()), grid=[0.0, 1.0], rounds=1, local_epochs=1)
    assert {b.site for b in out.ballots} == {"a", "b"}


def test_jaccard_edges_and_errors():
    assert jaccard([True, False, True], [True, True, False]) == pytest.approx(1 / 3)
    assert jaccard([False, False], [False, False]) == 1.0
    assert jaccard([True], [False]) == 0.0
    with pytest.raises(ValueError, match="same length"):
        jaccard([True, False], [True])


def test_pooled_agreement_per_freedom_degree():
    t = _table(900, 40)
    parts = split_rows(t, [1 / 3] * 3, stratify="target", seed=0)
    top4 = {"name": "anova", "params": {"k": 4}}
    sites = [Site(f"s{i}", p, "target", selector=top4) for i, p in enumerate(parts)]
    fed = LocalFederation(sites)
    out = run_election(fed, 0.5)
    names = sites[0].feature_names
    ref = pooled_mask([s.rows("train") for s in sites], "target", top4, names)
    curve = pooled_agreement(out.ballots, ref, feature_names=names, freedom_degrees=[0.0, 0.5, 1.0])
    assert [c["freedom_degree"] for c in curve] == [0.0, 0.5, 1.0]
    mid = next(c for c in curve if c["freedom_degree"] == 0.5)
    assert mid["jaccard"] == pytest.approx(jaccard(out.result.mask, ref))
    assert mid["kept"] == int(out.result.mask.sum()) and mid["pooled_kept"] == int(ref.sum())
    # IID thirds of one table: the sites and the pooled selector find the same 4 signal columns
    # IID thirds of one table: fd 0.5 agrees with the pooled selector better than the
    # intersection (too few) or the union (too many)
    assert mid["jaccard"] >= 0.75
    assert mid["jaccard"] > curve[0]["jaccard"] and mid["jaccard"] > curve[-1]["jaccard"]
    assert [c["kept"] for c in curve] == sorted(c["kept"] for c in curve)
    with pytest.raises(ValueError, match="pooled mask"):
        pooled_agreement(out.ballots, ref[:-1], feature_names=names)
    with pytest.raises(ValueError, match="freedom_degree"):
        pooled_agreement(out.ballots, ref, feature_names=names, freedom_degrees=[1.5])


def test_pooled_mask_aligns_sites_with_different_columns():
    t = _table(600, 12)
    a, b = split_rows(t, [0.5, 0.5], seed=0)
    names = [c for c in t.columns if c != "target"]
    b = b.drop(columns=names[:2])  # site b lacks two columns: NaN there, filled with the pooled mean
    mask = pooled_mask([a, b], "target", {"name": "anova", "params": {"k": 4}}, names)
    assert mask.shape == (12,) and mask.sum() == 4
    with pytest.raises(ValueError, match="no target"):
        pooled_mask([a.drop(columns="target")], "target", "anova", names)


def test_estimator_reports_pooled_agreement_and_abstentions():
    from fedtab import FederatedFeatureElection

    t = _table(900, 20)
    parts = split_rows(t, [0.4, 0.4, 0.2], stratify="target", seed=0)
    parts[2] = parts[2][parts[2].target == 1]  # this site only saw class 1
    top = {"name": "anova", "params": {"k": 4}}
    fe = FederatedFeatureElection(selector=top, freedom_degree=0.5, pooled_comparison=True).fit(parts, "target")
    assert set(fe.abstained_) == {"site2"}
    curve = fe.pooled_agreement_
    assert list(curve.columns) == ["freedom_degree", "jaccard", "kept", "pooled_kept"]
    here = curve[curve.freedom_degree == 0.5].iloc[0]
    assert here.jaccard == pytest.approx(jaccard(fe.support_, fe.pooled_support_))
    assert fe.pooled_support_.sum() == 4 and here.kept == fe.support_.sum()
    assert fe.explain()["pooled"].tolist() == fe.pooled_support_.tolist()
    # without the option nothing extra is computed or shown
    plain = FederatedFeatureElection(selector=top).fit(parts, "target")
    assert not hasattr(plain, "pooled_agreement_") and "pooled" not in plain.explain()
    with pytest.raises(ValueError, match="one selector shared"):
        FederatedFeatureElection(selector=["anova", "anova", "lasso"], pooled_comparison=True).fit(parts, "target")
