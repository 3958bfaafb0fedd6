"""consensus="stouffer" (issue 15, item 2): combined p-values replace the intersection,
so label-skewed sites neither veto the signal nor hide what only the pooled evidence shows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.federation.protocol import set_options
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.feature_selection import SelectFdr, SelectKBest, f_classif

from fedtab import LocalFederation, Site, run_election
from fedtab.election import FederatedFeatureElection
from fedtab.election.ballot import Ballot
from fedtab.election.evidence import P_FLOOR, benjamini_hochberg, combined_pvalues, z_scores
from fedtab.election.selectors import make_selector
from fedtab.election.tally import ElectionTally
from fedtab.federation import Message, SiteError
from fedtab.privacy import DisclosurePolicy


def skewed_tables(n_sites=10, n=3000, d=60, alpha=0.1, shift=0.25, seed=0):
    """Two Gaussian classes whose means differ by ``shift`` on the first 6 columns (the
    signal), split by Dirichlet(alpha) label skew; every site keeps >= 10 rows (the policy floor) of each class
    (so none abstains, and no class falls below the floor into no part). Returns (tables, signal mask)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    X = rng.normal(size=(n, d))
    X[:, :6] += shift * y[:, None]
    frame = pd.DataFrame(X, columns=[f"f{i:02d}" for i in range(d)]).assign(target=y)
    parts = [[] for _ in range(n_sites)]
    for c in (0, 1):
        idx = rng.permutation(np.flatnonzero(y == c))
        take = 10 * n_sites  # min_rows (10) rows of this class for every site, the rest by Dirichlet shares
        for i in range(n_sites):
            parts[i].extend(idx[10 * i:10 * i + 10].tolist())
        cuts = (np.cumsum(rng.dirichlet(np.full(n_sites, alpha)))[:-1] * (len(idx) - take)).astype(int)
        for i, chunk in enumerate(np.split(idx[take:], cuts)):
            parts[i].extend(chunk.tolist())
    return [frame.iloc[sorted(p)].reset_index(drop=True) for p in parts], np.arange(d) < 6


def fdr_selector():
    return SelectFdr(f_classif, alpha=0.05)


def test_label_skew_plain_rule_loses_the_signal_stouffer_keeps_the_pooled_mask():
    tables, signal = skewed_tables(shift=0.3, seed=4)
    plain = FederatedFeatureElection(fdr_selector(), freedom_degree=0.5, pooled_comparison=True).fit(tables, "target")
    stouffer = FederatedFeatureElection(fdr_selector(), freedom_degree=0.5, pooled_comparison=True,
                                        consensus="stouffer").fit(tables, "target")
    pooled = stouffer.pooled_support_
    assert pooled[signal].sum() == 6  # the pooled test finds the signal ...
    assert plain.support_[signal].sum() <= 3  # ... the intersection + vote does not
    assert stouffer.support_[signal].sum() == 6  # the combined evidence keeps all of it
    assert stouffer.support_[~signal].sum() <= 1
    # a site's Stouffer weight is its effective sample size: below n for unbalanced classes
    assert all(0 < b.n_effective <= b.n_samples for b in stouffer.ballots_)
    assert min(b.n_effective / b.n_samples for b in stouffer.ballots_) < 0.05
    at = dict(zip(stouffer.pooled_agreement_["freedom_degree"], stouffer.pooled_agreement_["jaccard"]))
    plain_at = dict(zip(plain.pooled_agreement_["freedom_degree"], plain.pooled_agreement_["jaccard"]))
    assert at[0.0] >= 0.8 > plain_at[0.5]
    table = stouffer.explain()
    assert "combined_p" in table and table.loc[signal & stouffer.support_, "reason"].str.startswith("consensus").all()
    assert stouffer.result_.to_dict()["consensus"] == "stouffer"


def test_default_election_is_unchanged_and_sends_no_pvalues():
    tables, _ = skewed_tables(n_sites=4, n=600, d=20, alpha=1.0)
    sites = [Site(f"s{i}", t, "target", selector="anova") for i, t in enumerate(tables)]
    fed = LocalFederation(sites)
    out = run_election(fed, 0.5)
    assert out.result.consensus == "intersection" and out.result.evidence is None
    assert all(b.pvalues is None for b in out.ballots)
    assert all(r.consensus_mask.sum() == (r.selected_by == r.held_by).sum() for r in [out.result])
    # the same ballots with their p-values: the plain rule ignores them
    fed2 = LocalFederation([Site(f"s{i}", t, "target", selector="anova") for i, t in enumerate(tables)])
    again = run_election(fed2, 0.5, consensus="stouffer")
    assert all(b.pvalues is not None for b in again.ballots)
    tally = ElectionTally()
    for b in again.ballots:
        tally.add_ballot(b)
    assert np.array_equal(tally.result(0.5, min_holders=2).mask, out.result.mask)


def test_combined_pvalue_is_stouffers_weighted_z():
    rng = np.random.default_rng(3)
    p = rng.uniform(size=(3, 5))
    n = np.array([10, 40, 250])
    tally = ElectionTally(5)
    for i in range(3):
        tally.add_ballot(Ballot.build(np.ones(5, bool), rng.uniform(size=5), int(n[i]), site=f"s{i}", pvalues=p[i]))
    from scipy.stats import norm

    terms = np.sqrt(n)[:, None] * norm.isf(p)
    np.testing.assert_allclose(tally.combined_pvalues(), norm.sf(terms.sum(0) / np.sqrt(n.sum())), rtol=1e-9)
    top = terms.argmax(0)  # robust: the largest positive term of each feature is left out
    out = (terms > 0) & (np.arange(3)[:, None] == top)
    expect = norm.sf(np.where(out, 0, terms).sum(0) / np.sqrt(np.where(out, 0, n[:, None]).sum(0)))
    np.testing.assert_allclose(tally.combined_pvalues(leave_top_out=True), expect, rtol=1e-9)
    # one site alone: its own p-value back; robust, it can never make a feature consensus
    one = ElectionTally(2)
    one.add_ballot(Ballot.build(np.ones(2, bool), np.ones(2), 7, site="a", pvalues=[1e-9, 0.8]))
    np.testing.assert_allclose(one.combined_pvalues(), [1e-9, 0.8], rtol=1e-6)
    np.testing.assert_allclose(one.combined_pvalues(leave_top_out=True), [1.0, 0.8], rtol=1e-9)
    # p = 0 is clipped: one site's push on Z is bounded
    assert np.isfinite(z_scores(np.array([0.0, 1.0]))).all() and z_scores(np.array([0.0]))[0] == -norm.ppf(P_FLOOR)
    assert combined_pvalues(np.array([3.0]), np.array([0.0]))[0] == 1.0  # held by nobody: no evidence


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=40), st.sampled_from([0.01, 0.05, 0.2]))
def test_benjamini_hochberg_matches_scikit_learns_selectfdr(pvalues, alpha):
    p = np.asarray(pvalues)
    sk = SelectFdr(lambda X, y: (np.ones(p.size), p), alpha=alpha).fit(np.zeros((2, p.size)), [0, 1])
    assert np.array_equal(benjamini_hochberg(p, alpha), sk.get_support())
    eligible = np.arange(p.size) % 2 == 0
    only = benjamini_hochberg(p, alpha, eligible)
    assert not only[~eligible].any()
    assert np.array_equal(only[eligible], benjamini_hochberg(p[eligible], alpha))


def test_selectors_report_their_tests_pvalues():
    tables, _ = skewed_tables(n_sites=1, n=80, d=6, alpha=1.0, shift=1.0)
    X, y = tables[0].drop(columns="target").to_numpy(), tables[0]["target"].to_numpy()
    for spec in ("anova", "chi2"):
        sel = make_selector(spec).select(X - X.min(), y)
        assert sel.pvalues is not None and sel.pvalues.shape == (6,) and ((0 <= sel.pvalues) & (sel.pvalues <= 1)).all()
    assert make_selector(SelectKBest(f_classif, k=2)).select(X, y).pvalues is not None
    assert make_selector("lasso").select(X, y).pvalues is None
    assert make_selector("anova").fit(X, y).pvalues_.shape == (6,)


class Tamper(Site):
    def __init__(self, *args, tamper=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.tamper = tamper

    def handle(self, request):
        reply = super().handle(request)
        return self.tamper(reply) if request.kind == "ballot" and not reply.is_error else reply


def _with(reply, **arrays):
    out = {**reply.arrays, **arrays}
    return Message(reply.kind, {k: v for k, v in out.items() if v is not None}, reply.meta)


@pytest.mark.parametrize("bad, match", [
    (np.full(20, 1.5), "p-values must be finite numbers in \\[0, 1\\]"),
    (np.full(20, np.nan), "p-values must be finite"),
    (np.full(19, 0.5), "19 p-values for 20"),
    (None, "carries no p-values and n_effective"),
])
def test_a_hostile_sites_pvalues_are_rejected_naming_it(bad, match):
    tables, _ = skewed_tables(n_sites=3, n=400, d=20, alpha=1.0)
    sites = [Site(f"s{i}", t, "target", selector="anova") for i, t in enumerate(tables[:2])]
    sites.append(Tamper("evil", tables[2], "target", selector="anova", tamper=lambda r: _with(r, pvalues=bad)))
    with pytest.raises(SiteError, match=f"evil.*{match}"):
        run_election(LocalFederation(sites), 0.5, consensus="stouffer")


@pytest.mark.parametrize("bad", [1e9, -1.0, 0, "many", True, None])
def test_a_hostile_sites_effective_size_is_rejected_naming_it(bad):
    tables, _ = skewed_tables(n_sites=3, n=400, d=20, alpha=1.0)
    sites = [Site(f"s{i}", t, "target", selector="anova") for i, t in enumerate(tables[:2])]

    def tamper(reply):  # claims a weight it does not have (or none)
        meta = {k: v for k, v in reply.meta.items() if k != "n_effective"}
        return Message(reply.kind, reply.arrays, meta if bad is None else {**meta, "n_effective": bad})

    sites.append(Tamper("evil", tables[2], "target", selector="anova", tamper=tamper))
    with pytest.raises(SiteError, match="evil.*n_effective"):
        run_election(LocalFederation(sites), 0.5, consensus="stouffer")


def test_a_selector_without_pvalues_and_bad_settings_are_refused():
    tables, _ = skewed_tables(n_sites=3, n=400, d=20, alpha=1.0)
    sites = [Site(f"s{i}", t, "target", selector="anova") for i, t in enumerate(tables)]
    sites[1].selector = "lasso"
    with pytest.raises(SiteError, match="s1.*lasso.*computes no p-values"):
        run_election(LocalFederation(sites), 0.5, consensus="stouffer")
    fed = LocalFederation([Site(f"s{i}", t, "target", selector="anova") for i, t in enumerate(tables)])
    with pytest.raises(ValueError, match="unknown consensus"):
        run_election(fed, 0.5, consensus="median")
    with pytest.raises(ValueError, match="consensus_alpha"):
        run_election(fed, 0.5, consensus="stouffer", consensus_alpha=1.0)
    with pytest.raises(ValueError, match="stouffer"):
        run_election(fed, 0.5, consensus="stouffer", compat="nvflare")
    set_options(fed, dp={"epsilon": 1.0, "delta": 1e-5})
    with pytest.raises(ValueError, match="stouffer"):
        run_election(fed, 0.5, consensus="stouffer")
    assert not fed.traffic.records  # refused before anything was sent


def test_one_class_sites_still_abstain_under_stouffer():
    tables, _ = skewed_tables(n_sites=3, n=400, d=20, alpha=1.0)
    one = tables[0][tables[0]["target"] == 0]
    sites = [Site("mono", one, "target", selector="anova", policy=DisclosurePolicy.permissive())]
    sites += [Site(f"s{i}", t, "target", selector="anova") for i, t in enumerate(tables[1:])]
    out = run_election(LocalFederation(sites), 0.5, consensus="stouffer")
    assert "mono" in out.abstained and [b.site for b in out.ballots] == ["s0", "s1"]


def test_robust_mode_stops_one_hostile_site_claiming_p_0_everywhere():
    tables, signal = skewed_tables(n_sites=6, n=3000, alpha=1.0, shift=0.3, seed=0)

    def liar(reply):  # every feature "significant", with the largest weight it may claim
        return Message(reply.kind, {**reply.arrays, "pvalues": np.zeros(signal.size)},
                       {**reply.meta, "n_effective": float(reply.meta["n_samples"])})

    def sites():
        honest = [Site(f"s{i}", t, "target", selector=fdr_selector()) for i, t in enumerate(tables[1:])]
        return [*honest, Tamper("evil", tables[0], "target", selector=fdr_selector(), tamper=liar)]

    trusting = run_election(LocalFederation(sites()), 0.0, consensus="stouffer")
    assert trusting.result.mask[~signal].mean() > 0.5  # the plain combination believes it
    robust_fed = LocalFederation(sites())
    set_options(robust_fed, robust=True)
    robust = run_election(robust_fed, 0.0, consensus="stouffer")
    assert robust.result.aggregation == "median"
    assert robust.result.mask[signal].sum() >= 5 and robust.result.mask[~signal].sum() <= 1
