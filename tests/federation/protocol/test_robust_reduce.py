"""Robust reducers (fedtab.federation.protocol.reduce) and the robust switches of the workflows."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedtab.election.ballot import Ballot
from fedtab.federation.workflows.election.server import elect_from_ballots
from fedtab.federation.protocol.reduce import (cap_weights, check_max_site_share, robust_params, robust_votes, screen_sites,
                                      site_median, trimmed_mean)

weights_st = st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1e12)), min_size=1, max_size=12).filter(lambda w: sum(w) > 0)


@settings(max_examples=200, deadline=None)
@given(weights_st, st.floats(0.05, 1.0))
def test_cap_weights_sum_to_one_and_respect_the_cap(weights, cap):
    w = cap_weights(weights, cap)
    assert w.shape == (len(weights),)
    assert w.sum() == pytest.approx(1.0)
    assert (w >= 0).all()
    positive = sum(x > 0 for x in weights)
    if positive * cap >= 1:
        assert w.max() <= cap * (1 + 1e-9)
        # capping never reorders the sites (a bigger claim never gets less weight)
        order = np.argsort(weights, kind="stable")
        assert (np.diff(w[order]) >= -1e-12).all()
    else:  # infeasible: the sites with weight share equally
        assert np.allclose(w[np.asarray(weights) > 0], 1.0 / positive)


def test_cap_weights_water_filling():
    # one site claims a million times the rows: it gets the cap, the others share the rest as before
    assert np.allclose(cap_weights([1, 1, 1, 1e6, 1], 0.5), [0.125, 0.125, 0.125, 0.5, 0.125])
    assert np.allclose(cap_weights([5, 3, 2], 0.5), [0.5, 0.3, 0.2])  # already within the cap: unchanged
    assert np.allclose(cap_weights([6, 3, 1], 0.5), [0.5, 0.375, 0.125])
    cols = cap_weights(np.array([[1.0, 0.0], [1.0, 0.0], [8.0, 5.0]]), 0.5)  # column-wise; a lone holder keeps 1
    assert np.allclose(cols, [[0.25, 0], [0.25, 0], [0.5, 1]])


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, float("nan"), "x", None])
def test_max_site_share_is_checked(bad):
    with pytest.raises(ValueError, match="max_site_share"):
        check_max_site_share(bad)


@pytest.mark.parametrize("bad", [[], [-1, 2], [np.inf, 1], [0, 0]])
def test_cap_weights_rejects_bad_weights(bad):
    with pytest.raises(ValueError):
        cap_weights(bad)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_median_stays_within_the_honest_range(f, seed):
    """K = 2f + 1 sites, f of them hostile with arbitrary values: each coordinate of the
    median lies between the smallest and largest honest value."""
    rng = np.random.default_rng(seed)
    k = 2 * f + 1
    honest = [{"w": rng.normal(size=(3, 4)).astype(np.float32)} for _ in range(k - f)]
    hostile = [{"w": (rng.choice([-1, 1]) * 10.0 ** rng.integers(0, 30) * rng.normal(size=(3, 4))).astype(np.float32)}
               for _ in range(f)]
    out = robust_params(honest + hostile)["w"]
    assert out.dtype == np.float32
    stack = np.stack([h["w"] for h in honest])
    assert (out >= stack.min(0) - 1e-6).all() and (out <= stack.max(0) + 1e-6).all()


def test_trimmed_mean_is_scipys_and_robust_params_offers_it():
    values = np.array([[1.0], [2.0], [3.0], [4.0], [1e9]])
    assert trimmed_mean(values, 0.2)[0] == pytest.approx(3.0)
    out = robust_params([{"a": v} for v in values], method="trimmed_mean")
    assert out["a"][0] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="unknown robust method"):
        robust_params([{"a": values[0]}], method="krum")
    with pytest.raises(ValueError, match="different shapes"):
        robust_params([{"a": np.zeros(2)}, {"a": np.zeros(3)}])


def test_site_median_ignores_sites_without_the_value():
    v = np.array([[1.0, np.nan], [3.0, np.nan], [100.0, 4.0]])
    assert np.allclose(site_median(v), [3.0, 4.0])
    assert np.allclose(robust_votes(np.array([[np.nan], [np.nan]])), [0.0])


def test_screen_names_the_outlying_site(caplog):
    rng = np.random.default_rng(0)
    means = {f"s{i}": rng.normal(0, 0.05, 3) for i in range(4)}
    stds = {f"s{i}": np.ones(3) + rng.normal(0, 0.05, 3) for i in range(4)}
    means["evil"], stds["evil"] = np.array([0.0, 5.0, 0.0]), np.ones(3)
    with caplog.at_level(logging.WARNING, logger="fedtab.federation.protocol.reduce"):
        flagged = screen_sites(means, stds, columns=["a", "b", "c"])
    assert list(flagged) == ["evil"] and "'b'" in flagged["evil"]
    assert "evil" in caplog.text
    stds["evil"], means["evil"] = np.array([1.0, 1.0, 40.0]), np.zeros(3)
    assert "spread of column 'c'" in screen_sites(means, stds, columns=["a", "b", "c"])["evil"]
    # two sites cannot outvote each other: nothing is flagged
    assert screen_sites({"a": np.zeros(1), "b": np.ones(1) * 9}, {"a": np.ones(1), "b": np.ones(1)}) == {}


def _ballot(site, scores, mask, n):
    return Ballot.build(np.array(mask), np.array(scores, dtype=float), n, [f"f{i}" for i in range(len(mask))], site=site)


def test_robust_vote_resists_a_big_reversed_ballot():
    honest = [_ballot(f"h{i}", [9, 8, 1, 1, 0.5, 0.1], [1, 1, 1, 0, 0, 0], 100) for i in range(4)]
    evil = _ballot("evil", [0, 0, 0, 9, 9, 9], [0, 0, 0, 1, 1, 1], 10**8)
    plain = elect_from_ballots(honest + [evil], 0.5)
    robust = elect_from_ballots(honest + [evil], 0.5, robust=True)
    assert robust.aggregation == "median"
    # all six features are disputed; the vote admits three of them
    assert plain.selected_names == ["f3", "f4", "f5"]  # the 10^8-row ballot decides the weighted mean
    assert robust.selected_names == ["f0", "f1", "f2"]
    # without a hostile ballot the robust vote keeps the honest choice
    assert elect_from_ballots(honest, 0.5, robust=True).selected_names == elect_from_ballots(honest, 0.5).selected_names


def test_the_job_reads_robust_settings():
    from fedtab.job.spec import JobError, spec_from_plan

    base = {"target": "y", "election": {}}
    spec = spec_from_plan({**base, "trust": {"robust": True, "max_site_share": 0.3}})
    assert spec.trust.robust is True and spec.trust.max_site_share == 0.3
    assert spec_from_plan(base).trust.robust is False
    with pytest.raises(JobError, match=r"\[trust\] robust must be true or false"):
        spec_from_plan({**base, "trust": {"robust": "maybe"}})
    with pytest.raises(JobError, match="max_site_share"):
        spec_from_plan({**base, "trust": {"max_site_share": float("nan")}})
