"""The linear (factor-model) prior of the GNN: fit, Gaussian conditional, and its use."""


import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.imputation import ImputeConfig, run_imputation
from fedtab.federation.site.core import Site
from fedtab.imputer import FederatedImputer
from fedtab.impute.graph import build_feature_graph
from fedtab.impute.baselines import LowRankGaussian
from fedtab.impute.prior import FactorPrior, choose_rank, fit_factor_prior, gaussian_conditional, noise_edge

# torch (and fedtab.impute.model, which imports it) inside the tests: collection stays fast
pytestmark = pytest.mark.requires("torch")


def known_factor_corr(f=20, k=3, seed=0, unknown=0.15):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(f, k))
    w *= np.sqrt(rng.uniform(0.5, 0.9, size=f) / (w * w).sum(1))[:, None]  # communalities 0.5-0.9
    corr = w @ w.T
    np.fill_diagonal(corr, 1.0)
    hide = np.triu(rng.random((f, f)) < unknown, 1)
    hide |= hide.T
    observed = corr.copy()
    observed[hide] = np.nan
    return w, corr, observed, hide


def test_factor_fit_recovers_a_rank_k_correlation_with_unknown_pairs():
    w, corr, observed, hide = known_factor_corr()
    assert hide.sum() > 20
    prior = fit_factor_prior(observed, rank=3)
    assert prior.W.shape == (20, 3) and prior.psi.shape == (20,)
    fit = prior.covariance()
    assert np.abs(fit - corr).max() < 1e-3  # including the diagonal and the never co-observed pairs
    assert np.allclose(prior.psi, 1 - (w * w).sum(1), atol=1e-3)
    assert choose_rank(observed) == 3
    assert fit_factor_prior(observed).rank == 3  # automatic rank


def test_rank_rule_ignores_sampling_noise_when_told_the_row_count():
    rng = np.random.default_rng(3)
    n, f = 300, 40
    w = np.zeros((f, 3))
    for j in range(3):  # three factors, each behind its own block of columns
        w[j * 8:(j + 1) * 8, j] = 0.7
    x = rng.normal(size=(n, 3)) @ w.T + rng.normal(size=(n, f)) * np.sqrt(1 - (w * w).sum(1))
    corr = np.corrcoef(x, rowvar=False)
    corr[0, 39] = corr[39, 0] = np.nan  # one pair never observed together
    counts = np.full((f, f), float(n))
    assert noise_edge(f, n) == pytest.approx((1 + np.sqrt(f / n)) ** 2)
    assert noise_edge(f, None) == 1.0 and noise_edge(4, 1e9) == pytest.approx(1.0, abs=1e-3)
    assert choose_rank(corr, pair_count=counts) == 3
    assert choose_rank(corr) > 6  # Kaiser alone counts noise eigenvalues (> 1) as factors
    noise = np.corrcoef(rng.normal(size=(n, f)), rowvar=False)
    assert choose_rank(noise, pair_count=counts) == 2  # the floor; Kaiser would keep ~15
    with pytest.raises(ValueError, match="pair_count"):
        choose_rank(corr, pair_count=np.ones((3, 3)))
    with pytest.raises(ValueError, match="n_rows"):
        noise_edge(f, 0)


def test_factor_fit_errors():
    _, _, observed, _ = known_factor_corr()
    with pytest.raises(ValueError, match="rank"):
        fit_factor_prior(observed, rank=20)
    with pytest.raises(ValueError, match="shape"):
        fit_factor_prior(observed[:3])
    with pytest.raises(ValueError, match="pair_count"):
        fit_factor_prior(observed, np.ones((3, 3)), rank=2)


def test_conditional_mean_and_std_are_the_closed_form_gaussian():
    import torch

    w, corr, _, _ = known_factor_corr(f=7, k=2, seed=1)
    prior = FactorPrior(W=w, psi=1 - (w * w).sum(1))
    sigma = prior.covariance()
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 7))
    given = rng.random((5, 7)) < 0.5
    given[0] = False  # nothing given: the prior mean is 0 and the std 1
    mean, std = gaussian_conditional(torch.as_tensor(w), torch.as_tensor(prior.psi), torch.as_tensor(x),
                                     torch.as_tensor(given), clip=None)
    mean, std = mean.numpy(), std.numpy()
    for r in range(5):
        o, m = given[r], ~given[r]
        if o.any():
            gain = sigma[np.ix_(m, o)] @ np.linalg.inv(sigma[np.ix_(o, o)])
            expect = gain @ x[r, o]
            var = np.diag(sigma[np.ix_(m, m)] - gain @ sigma[np.ix_(o, m)])
        else:
            expect, var = np.zeros(m.sum()), np.ones(m.sum())
        assert np.allclose(mean[r, m], expect, atol=1e-8), r
        assert np.allclose(std[r, m], np.sqrt(var), atol=1e-8), r
    # the same factor model's numpy E-step (the EM baseline's), for every node, given ones included
    em = LowRankGaussian(rank=2)
    em.W_, em.psi_, em.mu_ = w, prior.psi, np.zeros(7)
    _, ez, minv = em._posterior(np.where(given, x, np.nan))
    ref_mean, ref_std = ez @ w.T, np.sqrt(np.einsum("fa,rab,fb->rf", w, minv, w) + prior.psi)
    assert np.allclose(mean, ref_mean) and np.allclose(std, ref_std)
    with pytest.raises(ValueError, match="shapes"):
        gaussian_conditional(torch.as_tensor(w), torch.as_tensor(prior.psi), torch.as_tensor(x[:, :3]),
                             torch.as_tensor(given[:, :3]))


def test_untrained_prior_model_is_the_linear_model_and_prior_is_not_a_weight():
    import torch

    from fedtab.impute.model import GNNConfig, GNNImputer, graph_tensors, state_to_numpy

    w, corr, _, _ = known_factor_corr(f=6, k=2, seed=3)
    psi = 1 - (w * w).sum(1)
    adj = graph_tensors(build_feature_graph(corr, list("abcdef"), k=3))
    torch.manual_seed(0)
    model = GNNImputer(GNNConfig(6, hidden_dim=8, n_layers=2, prior_rank=2))
    with pytest.raises(RuntimeError, match="set_prior"):
        model(torch.zeros(1, 6), torch.ones(1, 6, dtype=torch.bool), torch.ones(6, dtype=torch.bool), adj)
    model.set_prior(w, psi)
    assert not any(k.startswith("prior") for k in state_to_numpy(model))  # never averaged / sent as weights
    x = torch.as_tensor(np.random.default_rng(4).normal(size=(3, 6)), dtype=torch.float32)
    obs = torch.tensor([[1, 1, 0, 0, 1, 0]] * 3, dtype=torch.bool)
    avail = torch.tensor([1, 1, 1, 1, 1, 0], dtype=torch.bool)
    mean, _ = gaussian_conditional(model.prior_w, model.prior_psi, x, obs & avail)
    # the prior's float32 mean plus a correction head that starts at 0: the same float32 ops, so equal to
    # a few ulps of the largest value (a trained head or a wrong prior moves them by > 1e-2)
    tol = 4 * torch.finfo(torch.float32).eps * float(mean.abs().max())
    assert torch.allclose(model(x, obs, avail, adj), mean, rtol=0, atol=tol)
    blocked = GNNImputer(GNNConfig(6, hidden_dim=8, n_layers=2, prior_rank=2, block_unavailable=True))
    blocked.set_prior(w, psi)
    out = blocked(x, obs, avail, adj)
    assert torch.allclose(out[:, 5], torch.zeros(3)) and torch.allclose(out[:, :5], mean[:, :5], rtol=0, atol=tol)
    with pytest.raises(ValueError, match="shapes"):
        model.set_prior(w[:, :1], psi)
    with pytest.raises(ValueError, match="without a prior"):
        GNNImputer(GNNConfig(6, hidden_dim=8)).set_prior(w, psi)


def rank4_sites(n=1200, f=12, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)) @ rng.normal(size=(4, f))
    x = (x - x.mean(0)) / x.std(0) * np.sqrt(0.96) + 0.2 * rng.normal(size=(n, f))
    full = pd.DataFrame(x, columns=[f"x{i}" for i in range(f)])
    noisy = full.mask(rng.random(full.shape) < 0.1)
    schemas = [sorted(rng.choice(f, size=8, replace=False)) for _ in range(4)]
    parts = np.array_split(np.arange(n), 4)
    return ([noisy.iloc[r, s].reset_index(drop=True) for r, s in zip(parts, schemas)],
            [full.iloc[r].reset_index(drop=True) for r in parts], list(full.columns))


def test_prior_gnn_beats_the_plain_gnn_on_a_rank4_table():
    # 600 rows (150 a site) keep the margins of 1200 at half the training (imputer seeds 0-3: RMSE
    # 0.648-0.658 with the prior, 0.68-0.79x the plain GNN's; 1200 rows, seed 0: 0.649, 0.79x)
    sites, truth, cols = rank4_sites(n=600)
    rng = np.random.default_rng(1)
    queries = [s.mask(rng.random(s.shape) < 0.5) for s in sites]
    scores = {}
    for use_prior in (True, False):
        imp = FederatedImputer(rounds=4, local_epochs=1, hidden_dim=16, n_layers=2, use_prior=use_prior,
                               seed=0).fit(sites)
        assert (imp.result_.prior_W is not None) is use_prior
        se = n = 0.0
        for q, s, tr in zip(queries, sites, truth):
            out = imp.transform(q)[cols]
            gap = np.zeros(out.shape, dtype=bool)
            cidx = [cols.index(c) for c in s.columns]
            gap[:, cidx] = q.isna().to_numpy() & s.notna().to_numpy()  # hidden observed cells
            gap[:, [i for i in range(len(cols)) if i not in cidx]] = True  # structural cells
            d = (out.to_numpy() - tr.to_numpy())[gap]
            se, n = se + (d * d).sum(), n + d.size
        scores[use_prior] = np.sqrt(se / n)
    assert scores[True] < 0.85 * scores[False] and scores[True] < 0.7, scores


def test_prior_travels_in_the_setup_message_only():
    sites, _, _ = rank4_sites(n=200)
    fed = LocalFederation([Site(f"s{i}", t, test_size=0.1, seed=0) for i, t in enumerate(sites)])
    res = run_imputation(fed, ImputeConfig(rounds=1, hidden_dim=8, n_layers=1, prior_rank=3))
    assert res.prior_W.shape == (12, 3) and res.model_config["prior_rank"] == 3
    for name in fed.sites:  # every site got the server's prior through the (wire-serialised) setup message
        model = fed.site(name).state["impute_live"]["model"]
        # float32 buffers of the float64 prior: the cast is within half a float32 ulp of each value
        eps32 = np.finfo(np.float32).eps
        assert model.has_prior and np.allclose(model.prior_w.numpy(), res.prior_W, rtol=eps32, atol=0)
        assert np.allclose(model.prior_psi.numpy(), res.prior_psi, rtol=eps32, atol=0)
    with pytest.raises(ValueError, match="prior_rank"):
        ImputeConfig(prior_rank=-1).validate()
