"""The Newton iteration at zero over every candidate column, riding on the ballot (issue 31): its elected
sub-block gives θ1, the iteration at θ1 rides on set_mask, and the fit is still the pooled one. As an
adversary: the rider is answered under the ``"newton"`` kind's own rules (a site whose policy refuses so
wide a model refuses it), a hostile site's sums are rejected naming it, and sums asked for other columns,
classes or sites are not used."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from fedtab.federation.protocol import FederationError
from fedtab.federation.protocol.agreement import agree_schema
from fedtab.federation.workflows.training import run_training
from fedtab.federation.workflows.training.ahead import (elected_start, ride_candidates, ride_first_newton,
                                                        settle)
from fedtab.learn.newton import logistic_sums, sub_block
from fedtab.privacy.policy import DisclosurePolicy
from tests.builders import lie_in_newton_hessians, classification_parts, federation

L2 = 1e-3


def _fed(**options):
    table, parts = classification_parts(600, 6, 4, 1, seed=0)
    feats = [c for c in table.columns if c != "target"]
    fed = federation(parts, **options)
    agree_schema(fed)
    return fed, feats


def _ballot_ride(fed, feats, elected):
    """Ride the candidates' iteration on an exchange (a stand-alone describe), settle it, and ride the
    iteration at θ1 over ``elected``; ``(held at zero, held at θ1, θ1)``."""
    from fedtab.federation.steps.describe import describe

    classes = list(fed.schema.classes)
    mean, std = np.full(len(feats), 0.1), np.full(len(feats), 1.3)
    held = ride_candidates(fed, feats, classes, "logistic", mean=mean, std=std, max_params=500)
    describe(fed, feats, "train")  # the exchange it rides on
    settle(fed, held)
    pos = [feats.index(f) for f in elected]
    theta1 = elected_start(held, elected, classes, mean[pos], std[pos], fed.active)
    ahead = ride_first_newton(fed, elected, classes, "logistic", mean=mean[pos], std=std[pos], theta=theta1)
    return held, ahead, theta1


def test_the_sub_block_at_zero_is_the_sums_over_the_columns_kept():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(200, 5)), rng.integers(0, 3, 200)
    g, H = logistic_sums(np.zeros((3, 6)), X, y)
    theta, g2, H2 = sub_block(np.zeros((3, 6)), g, H, [3, 0])
    g_ref, H_ref = logistic_sums(np.zeros((3, 3)), X[:, [3, 0]], y)
    np.testing.assert_allclose(g2, g_ref, atol=1e-10)
    np.testing.assert_allclose(H2, H_ref, atol=1e-10)
    with pytest.raises(ValueError, match="non-zero coefficient"):
        sub_block(np.ones((3, 6)), g, H, [0])
    with pytest.raises(ValueError, match="distinct"):
        sub_block(np.zeros((3, 6)), g, H, [0, 0])


def test_the_ballot_iteration_saves_a_second_exchange_and_keeps_the_pooled_fit():
    fed0, feats = _fed()
    elected = feats[:4]
    n0 = fed0.exchange_count
    base = run_training(fed0, elected, rounds=25)
    n_base = fed0.exchange_count - n0
    fed, _ = _fed()
    held, ahead, theta1 = _ballot_ride(fed, feats, elected)
    assert held.sums is not None and theta1 is not None and np.abs(theta1).max() > 0
    from fedtab.federation.steps.describe import describe

    describe(fed, elected, "train")  # the exchange the iteration at θ1 rides on (set_mask in a job)
    assert ahead.sums is not None
    n1 = fed.exchange_count
    out = run_training(fed, elected, rounds=25, ahead=ahead)
    assert fed.exchange_count - n1 <= n_base - 2  # two iterations came ahead
    X, y = zip(*(s.state["train_setup"]["_cache"]["train"] for s in fed._sites.values()))
    sk = LogisticRegression(C=1 / (L2 * len(np.concatenate(y))), tol=1e-12, max_iter=10_000).fit(
        np.vstack(X), np.concatenate(y))
    assert np.abs(out.params["coef"] - sk.coef_).max() < 1e-6
    np.testing.assert_allclose(out.params["coef"], base.params["coef"], atol=1e-6)


def test_sums_for_other_classes_columns_or_sites_give_no_start():
    fed, feats = _fed()
    classes = list(fed.schema.classes)
    mean, std = np.zeros(len(feats)), np.ones(len(feats))
    held = ride_candidates(fed, feats, classes, "logistic", mean=mean, std=std, max_params=500)
    from fedtab.federation.steps.describe import describe

    describe(fed, feats, "train")
    settle(fed, held)
    assert elected_start(held, feats[:2], classes, mean[:2], std[:2], fed.active) is not None
    assert elected_start(held, feats[:2], classes[::-1], mean[:2], std[:2], fed.active) is None
    assert elected_start(held, ["not_a_candidate"], classes, np.zeros(1), np.ones(1), fed.active) is None
    assert elected_start(held, feats[:2], classes, mean[:2], std[:2], fed.active[:-1]) is None


def test_a_hostile_sites_sums_on_the_ballot_are_rejected_naming_it():
    fed, feats = _fed()
    lie_in_newton_hessians(fed.site("s1"), -1e6)
    with pytest.raises(FederationError, match="s1"):
        _ballot_ride(fed, feats, feats[:3])


def test_a_site_whose_policy_refuses_so_wide_a_model_still_refuses_and_the_run_starts_at_zero(caplog):
    """The wide request is answered under the kind's own rules: a site whose ``max_size`` is below the
    candidates' width refuses it (nothing computed). The part was only asked ahead, so the run goes on
    without it (no site dropped, no start point) and its training still reaches the same fit."""
    fed, feats = _fed()
    fed.site("s0").policy = DisclosurePolicy(max_size=30)  # the 3 elected columns fit (~20), the 6 candidates do not (~56)
    with caplog.at_level("WARNING", logger="fedtab.federation"):
        held, ahead, theta1 = _ballot_ride(fed, feats, feats[:3])
    assert "site 's0'" in caplog.text and "max_size=30" in caplog.text
    assert "train_setup" not in fed.site("s0").state  # refused before anything was computed
    assert held.replies is None and held.sums is None and theta1 is None
    assert set(fed.active) == {"s0", "s1", "s2"}
    fed0, _ = _fed()
    want = run_training(fed0, feats[:3], rounds=25).params["coef"]
    np.testing.assert_allclose(run_training(fed, feats[:3], rounds=25, ahead=ahead).params["coef"], want, atol=1e-6)


def test_secure_runs_and_too_wide_candidates_ask_nothing_on_the_ballot():
    from fedtab.federation.protocol import set_options

    fed, feats = _fed()
    classes = list(fed.schema.classes)
    wide = [f"c{i}" for i in range(600)]
    assert ride_candidates(fed, wide, classes, "logistic", mean=np.zeros(600), std=np.ones(600), max_params=500) is None
    set_options(fed, secure_aggregation=True)
    assert ride_candidates(fed, feats, classes, "logistic", mean=np.zeros(6), std=np.ones(6), max_params=500) is None


def test_a_curious_server_learns_nothing_new_by_asking_the_elected_columns_again_at_zero():
    """A curious server combines the ballot's answer with a second one at zero over a column subset (the
    same standardisation, as set_mask's would be): the second is exactly the first's sub-block, so their
    difference is zero — no new sum — and both are sums over every training row of each site (at least
    its ``min_rows``), never over a row set the server picked."""
    from fedtab.federation.steps.describe import describe

    fed, feats = _fed()
    classes = list(fed.schema.classes)
    mean, std = np.full(len(feats), 0.1), np.full(len(feats), 1.3)
    held = ride_candidates(fed, feats, classes, "logistic", mean=mean, std=std, max_params=500)
    describe(fed, feats, "train")
    settle(fed, held)
    again = ride_first_newton(fed, feats[:3], classes, "logistic", mean=mean[:3], std=std[:3])
    describe(fed, feats[:3], "train")
    _, grad, hess = sub_block(held.theta, held.sums.grad, held.sums.hess, [0, 1, 2])
    scale = np.abs(held.sums.hess).max()
    np.testing.assert_allclose(again.sums.grad - grad, 0, atol=1e-12 * scale)
    np.testing.assert_allclose(again.sums.hess - hess, 0, atol=1e-12 * scale)
    rows = {name: len(s.state["train_setup"]["_cache"]["train"][1]) for name, s in fed._sites.items()}
    assert held.sums.n == again.sums.n == sum(rows.values())
    assert all(n >= fed.site(name).policy.min_rows for name, n in rows.items())
