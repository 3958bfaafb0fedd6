"""``FederatedFeatureElection(fdr=q)``: selection with error control through the scikit-learn front
door (issue 30 item 5). On the known-signal data of ``benchmarks/fdr.py`` (small size) the realised
false discovery rate stays at or below q for Benjamini-Hochberg and Benjamini-Yekutieli with power
above 0, the estimator equals the score-test workflow it wraps, and careless settings are refused
with one line naming the parameter."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sklearn.base import clone

from benchmarks.fdr import known_signal
from fedtab import FederatedFeatureElection, LocalFederation, Site
from fedtab.federation import run_pooled_score_test

Q = 0.1
#: the FDR is an expectation: over 5 seeds the mean false discovery proportion of BH is 0.126 (one
#: null column among ~7 kept in 4 of them), over these 20 it is 0.070 (BY 0.028), as q·34/40 predicts
SEEDS = range(20)


def _tables(seed: int, n: int = 600) -> list:
    """Three sites of ``known_signal(seed)`` (6 signal columns ``s*`` of 40, the rest null ``n*``)."""
    table = known_signal(seed, n=n)
    parts = np.array_split(np.random.default_rng(seed + 1000).permutation(n), 3)
    return [table.iloc[p].reset_index(drop=True) for p in parts]


def _fdp_and_power(kept) -> tuple[float, float]:
    kept = [str(c) for c in kept]
    false = sum(c.startswith("n") for c in kept)
    return false / max(len(kept), 1), sum(c.startswith("s") for c in kept) / 6


@pytest.fixture(scope="module")
def fits():
    """``{(seed, method): fitted estimator}`` at q = 0.1."""
    return {(seed, m): FederatedFeatureElection(fdr=Q, fdr_method=m).fit(_tables(seed), "target")
            for seed in SEEDS for m in ("bh", "by")}


@pytest.mark.parametrize("method", ["bh", "by"])
def test_realised_fdr_at_most_q_with_power_on_known_signal(fits, method):
    fdp, power = zip(*(_fdp_and_power(fits[s, method].rejected_) for s in SEEDS))
    assert np.mean(fdp) <= Q, (method, fdp)
    assert all(p > 0 for p in power), (method, power)  # every seed finds signal
    assert np.mean(power) >= 0.5


def test_by_keeps_a_subset_of_bh_and_the_fitted_state_says_q(fits):
    for seed in SEEDS:
        bh, by = fits[seed, "bh"], fits[seed, "by"]
        assert set(by.rejected_) <= set(bh.rejected_)
        for fe, m in ((bh, "bh"), (by, "by")):
            assert fe.fdr_ == Q and fe.fdr_method_ == m
            assert list(fe.rejected_) == list(fe.feature_names_out_) == list(fe.get_feature_names_out())
            assert fe.p_values_.shape == (fe.n_features_in_,) == (40,)
            assert fe.ballots_ == [] and fe.abstained_ == {}
            assert fe.election_["fdr"] == {"q": Q, "method": m} and fe.election_["method"] == "score-test"


def test_the_estimator_equals_the_score_test_workflow(fits):
    seed = 2
    sites = [Site(f"site{i}", t, "target", test_size=0.0, selector="lasso") for i, t in enumerate(_tables(seed))]
    ref = run_pooled_score_test(LocalFederation(sites), fdr=Q, fdr_method="by", one_vs_rest=True)
    fe = fits[seed, "by"]
    assert list(fe.rejected_) == ref.selected_names and ref.selected_names
    np.testing.assert_array_equal(fe.get_support(), ref.mask)
    np.testing.assert_allclose(fe.p_values_, ref.p, rtol=1e-12, atol=0)
    table = fe.explain()
    assert list(table.columns) == ["feature", "p_value", "kept"]
    assert table.loc[table["kept"], "feature"].tolist() == ref.selected_names
    X = _tables(seed)[0].drop(columns="target")
    assert fe.transform(X).shape == (len(X), len(ref.selected_names))


def test_a_larger_q_keeps_more_null_columns_so_the_fdr_check_can_fail():
    """Not vacuous: at q = 0.9 the realised FDR is far above 0.1 on the same data."""
    fdp = [_fdp_and_power(FederatedFeatureElection(fdr=0.9).fit(_tables(s), "target").rejected_)[0] for s in (0, 1)]
    assert np.mean(fdp) > 0.3


def test_the_report_names_q_the_correction_and_the_p_values(fits, tmp_path):
    fe = fits[0, "by"]
    data = fe.report_data()
    assert data["election"]["fdr"] == {"q": Q, "method": "by"}
    assert sorted(data["sites"]) == ["site0", "site1", "site2"]
    assert sum(s["n_train"] for s in data["sites"].values()) == 600
    page = fe.write_report(tmp_path / "r.html").read_text()
    assert "Benjamini-Yekutieli" in page and "q = 0.100" in page and "Pooled p-value" in page


def test_clone_keeps_fdr_and_the_vote_is_unchanged_without_it(fits):
    fe = FederatedFeatureElection(fdr=0.05, fdr_method="by")
    assert clone(fe).get_params()["fdr"] == 0.05 and clone(fe).get_params()["fdr_method"] == "by"
    vote = FederatedFeatureElection().fit(_tables(0), "target")
    assert vote.fdr_ is None and vote.fdr_method_ is None and vote.rejected_ is None
    assert len(vote.ballots_) == 3  # the vote ran: every site sent a ballot


def test_numpy_floats_are_a_q():
    fe = FederatedFeatureElection(fdr=np.float32(0.1)).fit(_tables(0), "target")
    assert isinstance(fe.fdr_, float) and abs(fe.fdr_ - 0.1) < 1e-7 and len(fe.rejected_) > 0


@pytest.mark.parametrize("params, message", [
    ({"fdr": 0}, "fdr must be a false discovery rate in (0, 1), got 0"),
    ({"fdr": 1}, "fdr must be a false discovery rate in (0, 1), got 1"),
    ({"fdr": -1}, "fdr must be a false discovery rate in (0, 1), got -1"),
    ({"fdr": 1.0}, "fdr must be a false discovery rate in (0, 1), got 1.0"),
    ({"fdr": "abc"}, "fdr must be a false discovery rate in (0, 1), got 'abc'"),
    ({"fdr": "0.1"}, "fdr must be a false discovery rate in (0, 1), got '0.1'"),
    ({"fdr": float("nan")}, "fdr must be a false discovery rate in (0, 1), got nan"),
    ({"fdr": float("inf")}, "fdr must be a false discovery rate in (0, 1), got inf"),
    ({"fdr": True}, "fdr must be a false discovery rate in (0, 1), got True"),
    ({"fdr": 0.1, "fdr_method": "holm"}, "fdr_method must be one of ['bh', 'by'], got 'holm'"),
    ({"fdr_method": "by"}, "fdr_method='by' applies with fdr = q"),
    ({"fdr": 0.1, "compat": "nvflare"}, "compat applies to the vote"),
    ({"fdr": 0.1, "freedom_degree": 0.2, "consensus": "stouffer"}, "freedom_degree, consensus apply to the vote"),
    ({"fdr": 0.1, "selector": "anova"}, "selector applies to the vote"),
    ({"fdr": 0.1, "pooled_comparison": True}, "pooled_comparison applies to the vote"),
])
def test_careless_settings_are_refused_in_one_line(params, message):
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        FederatedFeatureElection(**params).fit(_tables(0, n=90), "target")
    assert "\n" not in str(info.value)


def test_a_one_class_site_counts_its_rows_instead_of_abstaining():
    tables = _tables(3)
    tables[2] = tables[2][tables[2].target == 1].reset_index(drop=True)  # this site only saw class 1
    fe = FederatedFeatureElection(fdr=Q).fit(tables, "target")
    assert fe.abstained_ == {} and fe.sites_["site2"]["n_train"] == len(tables[2]) > 0
    sites = [Site(f"site{i}", t, "target", test_size=0.0, selector="lasso") for i, t in enumerate(tables)]
    ref = run_pooled_score_test(LocalFederation(sites), fdr=Q, one_vs_rest=True)
    assert list(fe.rejected_) == ref.selected_names and ref.selected_names
    vote = FederatedFeatureElection().fit(tables, "target")
    assert "site2" in vote.abstained_  # the vote, by contrast, leaves it out
