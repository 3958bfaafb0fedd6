"""FedHF-Impute end to end: the workflow, the imputer and its errors."""

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.imputation import ImputeConfig, run_imputation
from fedtab.federation.protocol import FederationError
from fedtab.federation.site.core import Site
from fedtab.imputer import FederatedImputer
from fedtab.impute.baselines import LowRankGaussian, to_global
from fedtab.impute.graph import build_feature_graph

# torch (and fedtab.impute.model/train, which import it) inside the tests: collection stays fast
pytestmark = pytest.mark.requires("torch")

FAST = dict(rounds=8, local_epochs=2, hidden_dim=16, n_layers=2, seed=0, patience=0)  # every round runs


def correlated_sites(n=800, f=8, seed=0, missing=0.1):
    """4 sites over a rank-2 table; every site lacks some columns."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2)) @ rng.normal(size=(2, f))
    x = (x - x.mean(0)) / x.std(0) + 0.15 * rng.normal(size=(n, f))
    full = pd.DataFrame(x, columns=[f"x{i}" for i in range(f)])
    noisy = full.mask(rng.random(full.shape) < missing)
    schemas = [[0, 1, 2, 3, 4], [2, 3, 4, 5, 6], [4, 5, 6, 7, 0], [6, 7, 0, 1, 2]]
    parts = np.array_split(np.arange(n), 4)
    sites = [noisy.iloc[r, s].reset_index(drop=True) for r, s in zip(parts, schemas)]
    truth = [full.iloc[r].reset_index(drop=True) for r in parts]
    return sites, truth, list(full.columns)


def structural_rmse(imp, sites, truth, cols):
    se = n = 0
    for t, tr in zip(sites, truth):
        out = imp.transform(t)
        absent = [c for c in cols if c not in t.columns]
        d = out[absent].to_numpy() - tr[absent].to_numpy()
        se += (d ** 2).sum()
        n += d.size
    return np.sqrt(se / n)


@pytest.fixture(scope="module")
def fitted():
    sites, truth, cols = correlated_sites()
    imp = FederatedImputer(**FAST).fit(sites)
    return imp, sites, truth, cols


def test_gnn_learns_unavailable_columns_better_than_the_mean(fitted):
    imp, sites, truth, cols = fitted
    ours = structural_rmse(imp, sites, truth, cols)
    absent = [[c for c in cols if c not in t.columns] for t in sites]
    mean = np.sqrt(np.mean([((tr[a] - tr[a].mean()) ** 2).to_numpy().mean() for a, tr in zip(absent, truth)]))
    assert 0.9 < mean < 1.1
    assert ours < 0.7 * mean, (ours, mean)


def test_ablation_without_messages_into_unavailable_nodes_cannot_learn_them():
    sites, truth, cols = correlated_sites()
    imp = FederatedImputer(block_unavailable=True, **FAST).fit(sites)
    assert structural_rmse(imp, sites, truth, cols) > 0.85


def test_transform_fills_every_gap_and_keeps_observed_values(fitted):
    imp, sites, _, cols = fitted
    out = imp.transform(sites[0])
    assert list(out.columns) == cols and len(out) == len(sites[0])
    assert not out.isna().any().any()
    obs = sites[0].notna()
    assert np.allclose(out[sites[0].columns][obs].fillna(0), sites[0][obs].fillna(0))
    assert imp.validation_["overall"] is not None and set(imp.validation_["per_site"]) == {f"site{i}" for i in range(4)}
    assert len(imp.history_) == FAST["rounds"]
    with pytest.raises(ValueError, match="not seen in fit"):
        imp.transform(sites[0].assign(new=1.0))


def test_sklearn_style_params():
    imp = FederatedImputer(rounds=3, lr=0.01)
    assert imp.get_params()["rounds"] == 3 and clone(imp).lr == 0.01
    assert not hasattr(imp, "model_")
    with pytest.raises(RuntimeError, match="not fitted"):
        imp.transform(pd.DataFrame({"a": [1.0]}))


def test_workflow_runs_through_the_federation_interface_and_only_sends_aggregates():
    sites, _, _ = correlated_sites(n=200)
    fed = LocalFederation([Site(f"s{i}", t, test_size=0.1, seed=0) for i, t in enumerate(sites)])
    res = run_imputation(fed, ImputeConfig(rounds=2, hidden_dim=8, n_layers=1))
    kinds = {r.kind for r in fed.traffic.records}
    # the setup rides on the first round's impute_fit exchange (issue 31): answered, with no exchange of its own
    assert kinds == {"impute_schema", "impute_stats", "impute_fit", "impute_eval"}
    assert "impute_setup" in {p["step"] for p in fed.participation}
    assert res.bytes[1] > 0 and res.graph.n_edges > 0
    assert set(res.site_columns) == {"s0", "s1", "s2", "s3"}
    # the mean-fill baseline on the same validation cells (pooled mean = 0 in z-space)
    from fedtab.federation.workflows.imputation.site import _live

    live = [_live(fed.site(s)) for s in fed.sites]
    sq = sum(np.where(lv["valid_mask"], lv["valid"], 0.0).__pow__(2).sum(0) for lv in live)
    cnt = sum(lv["valid_mask"].sum(0) for lv in live)
    for i, col in enumerate(res.columns):
        expected = np.sqrt(sq[i] / cnt[i]) if cnt[i] else None
        assert res.validation["per_column_mean_fill"][col] == pytest.approx(expected)


@pytest.mark.parametrize("tables, match", [
    ([pd.DataFrame({"a": [1.0, 2.0]}), pd.DataFrame({"b": [1.0, 2.0]})], "no column is shared"),
    ([pd.DataFrame({"a": [1.0, 2.0], "s": ["x", "y"]})], "non-numeric"),
    ([pd.DataFrame({"a": [1.0, 2.0]}), pd.DataFrame({"a": []}, dtype=float)], "empty"),
    ([pd.DataFrame({"a": [1.0, 2.0], "b": [np.nan, np.nan]})], "no observed value"),
    ([pd.DataFrame({"a": [1.0, np.inf]})], "infinite"),
])
def test_bad_input_is_a_clear_error(tables, match):
    with pytest.raises((ValueError, FederationError), match=match):  # tiny on purpose: explicit policy
        FederatedImputer(rounds=1, policy={"min_rows": 1}).fit(tables)


def test_a_failing_site_is_named():
    sites, _, _ = correlated_sites(n=200)
    bad = Site("broken", pd.DataFrame({"x0": ["a"] * 10}), test_size=0.0)
    fed = LocalFederation([Site("ok", sites[0], test_size=0.0), bad])
    with pytest.raises(FederationError, match="broken"):
        run_imputation(fed, ImputeConfig(rounds=1))


def test_messages_flow_into_unavailable_nodes_only_without_the_ablation():
    import torch

    from fedtab.impute.model import GNNConfig, GNNImputer, graph_tensors

    torch.manual_seed(0)
    c = np.array([[1, 0.9, 0.1], [0.9, 1, 0.2], [0.1, 0.2, 1.0]])
    g = build_feature_graph(c, ["a", "b", "c"], k=2)
    adj = graph_tensors(g)
    avail = torch.tensor([True, False, True])  # "b" is unavailable at this site
    obs = torch.ones(2, 3, dtype=torch.bool)
    vals = torch.tensor([[-2.0, 0.0, 0.0], [2.0, 0.0, 0.0]])  # only "a" differs between the rows
    for block, differs in [(False, True), (True, False)]:
        m = GNNImputer(GNNConfig(3, hidden_dim=8, n_layers=2, block_unavailable=block))
        out = m(vals, obs, avail, adj)
        assert bool((out[0, 1] - out[1, 1]).abs() > 1e-6) is differs


def test_fedavg_weights_by_rows():
    from fedtab.impute.train import fedavg

    a = {"w": np.zeros(3, np.float32)}
    b = {"w": np.ones(3, np.float32)}
    assert np.allclose(fedavg([a, b], [1, 3])["w"], 0.75)
    with pytest.raises(ValueError):
        fedavg([a, {"v": np.ones(3)}], [1, 1])


def test_low_rank_em_recovers_a_rank_two_table():
    sites, truth, cols = correlated_sites(n=800, missing=0.0)
    arrays = [to_global(s, cols) for s in sites]
    m = LowRankGaussian(rank=2, n_iter=30).fit(arrays)
    pred = m.predict(arrays[0])
    absent = [cols.index(c) for c in cols if c not in sites[0].columns]
    rmse = np.sqrt(((pred[:, absent] - truth[0].to_numpy()[:, absent]) ** 2).mean())
    assert rmse < 0.35


def test_sparse_and_edge_index_paths_agree():
    import torch

    from fedtab.impute.model import GNNConfig, GNNImputer, graph_tensors

    c = np.corrcoef(np.random.default_rng(0).normal(size=(40, 6)).T)
    g = build_feature_graph(c, list("abcdef"), k=3)
    conv = GNNImputer(GNNConfig(6, hidden_dim=4, n_layers=1)).layers[0].conv
    x = torch.randn(6, 5, 4)
    ei, w = torch.as_tensor(g.edge_index), torch.as_tensor((g.sign * g.weight).astype(np.float32))
    sparse, dense = conv(x, *graph_tensors(g)), conv(x, ei, edge_weight=w)
    # float32 sums over <= k=3 neighbours in another order: a few ulps of the largest output
    assert torch.allclose(sparse, dense, rtol=0, atol=8 * torch.finfo(torch.float32).eps * float(dense.abs().max()))


def test_the_kept_best_rounds_evaluation_rides_on_the_last_ones():
    """keep_best with an earlier round better: in a plain run both evaluations travel in one
    impute_eval exchange, and the kept round's evaluation is what an exchange of its own gives
    (issue 31)."""
    from fedtab.federation.workflows.imputation.server import _final_evaluation
    from fedtab.federation.workflows.imputation.steps import evaluate

    sites, _, _ = correlated_sites(n=1200)
    fed = LocalFederation([Site(f"s{i}", t, test_size=0.2, seed=0) for i, t in enumerate(sites)])
    # one epoch: here the trained round beats the untrained model, so res.weights are trained ones
    # (with the default 6 epochs keep_best returns the untrained weights, whose correction is zero
    # and whose halved copy then scores the same)
    cfg = ImputeConfig(rounds=1, local_epochs=1, hidden_dim=8, n_layers=1, seed=0)
    res = run_imputation(fed, cfg)
    assert res.best_round == 1
    f = len(res.columns)
    earlier = {k: 0.5 * v for k, v in res.weights.items()}  # other weights, claimed better (-1 < any RMSE)
    n0, e0 = fed.exchange_count, len(fed.participation)
    kept, ev, rnd = _final_evaluation(fed, cfg, res.weights, (-1.0, 0, earlier), f)
    assert fed.exchange_count == n0 + 1 and rnd == 0 and kept is earlier  # one exchange for both
    assert [p["step"] for p in fed.participation[e0:]] == ["impute_eval", "impute_eval"]
    alone = evaluate(fed, earlier, f)
    assert ev.overall == pytest.approx(alone.overall, rel=1e-12)
    assert ev.overall != pytest.approx(evaluate(fed, res.weights, f).overall, rel=1e-6)


# ----------------------------------------------------------------------------- early stopping (issue 31)
def _scripted_rounds(monkeypatch, medians):
    """``run_imputation``'s rounds return ``medians[rnd - 1]`` as the median site's RMSE (the real
    round runs; only what the server reads of it is scripted). Returns the list of rounds run."""
    from fedtab.federation.workflows.imputation import server

    ran, real = [], server.fit_round

    def fit_round(fed, weights, rnd, *a, **kw):
        new, val, loss, median = real(fed, weights, rnd, *a, **kw)
        ran.append(rnd)
        return new, val, loss, (medians[rnd - 1] if median is not None else None)

    monkeypatch.setattr(server, "fit_round", fit_round)
    return ran


def _small_fed(**options):
    from fedtab.federation.protocol import set_options

    sites, _, _ = correlated_sites(n=400)  # 20 validation rows a site: each site's errors are released
    fed = LocalFederation([Site(f"s{i}", t, test_size=0.2, seed=0) for i, t in enumerate(sites)])
    if options:
        set_options(fed, **options)
    return fed


TINY = dict(hidden_dim=4, n_layers=1, seed=0)
# best at round 3 (0.5), then no round beats it by more than 1 %
PLATEAU = [1.0, 0.8, 0.5, 0.499, 0.5, 0.498, 0.497, 0.499, 0.5, 0.5]


@pytest.mark.parametrize("patience", [1, 2, 4])
def test_the_rounds_stop_patience_rounds_after_the_best_one(monkeypatch, patience):
    ran = _scripted_rounds(monkeypatch, PLATEAU)
    fed = _small_fed()
    res = run_imputation(fed, ImputeConfig(rounds=10, patience=patience, tolerance=0.01, **TINY))
    assert ran == list(range(1, 3 + patience + 1))  # best at round 3, then `patience` rounds without a gain
    assert len(res.history) == 3 + patience and res.best_round <= 3 + patience
    # schema, statistics, the rounds (the setup rode on the first), one evaluation
    assert fed.exchange_count == 3 + patience + 3


def test_a_smaller_tolerance_counts_a_small_gain_as_one():
    from fedtab.federation.workflows.imputation.stopping import Plateau

    # tolerance 1 %: nothing after round 3 beats 0.5 enough; 0: 0.499, 0.498, 0.497 are each a new best
    for tol, stop in [(0.01, 5), (0.0, 9)]:
        p = Plateau(2, tol)
        got = next(r for r, v in enumerate(PLATEAU, 1) if p.update(r, v))
        assert got == stop, tol


def test_patience_zero_runs_every_round(monkeypatch):
    ran = _scripted_rounds(monkeypatch, [1.0] * 6)
    res = run_imputation(_small_fed(), ImputeConfig(rounds=6, patience=0, **TINY))
    assert ran == list(range(1, 7)) and len(res.history) == 6


def test_secure_sums_run_every_round(monkeypatch):
    """Under secure sums the server learns only the summed errors, no median site: the plateau
    (the same flat script that stops a plain run) never stops the rounds."""
    ran = _scripted_rounds(monkeypatch, [1.0] * 5)
    res = run_imputation(_small_fed(secure_aggregation=True), ImputeConfig(rounds=5, patience=1, **TINY))
    assert ran == list(range(1, 6)) and len(res.history) == 5
    assert all(h["val_rmse"] is not None for h in res.history)  # the pooled error is known, the median site's not
    ran.clear()
    run_imputation(_small_fed(), ImputeConfig(rounds=5, patience=1, **TINY))
    assert ran == [1, 2]


def test_a_real_run_stops_on_its_own_plateau():
    """No script: the median site's validation RMSE of a real run, recomputed from a patience-0 run's
    rounds, predicts the round an early-stopping run ends at, and the two agree up to it."""
    from fedtab.federation.workflows.imputation import server
    from fedtab.federation.workflows.imputation.stopping import Plateau

    medians = []
    real = server.fit_round

    def spy(*a, **kw):
        out = real(*a, **kw)
        medians.append(out[3])
        return out

    server.fit_round = spy
    try:
        full = run_imputation(_small_fed(), ImputeConfig(rounds=12, patience=0, **TINY))
    finally:
        server.fit_round = real
    assert len(medians) == 12 and all(m is not None for m in medians) and len(full.history) == 12
    p = Plateau(2, 0.02)
    expected = next((r for r, v in enumerate(medians, 1) if p.update(r, v)), 12)
    early = run_imputation(_small_fed(), ImputeConfig(rounds=12, patience=2, tolerance=0.02, **TINY))
    assert expected < 12 and len(early.history) == expected  # it did stop early
    assert early.history == full.history[:expected]


@pytest.mark.parametrize("settings", [dict(patience=-1), dict(patience=1.5), dict(patience=True),
                                      dict(tolerance=-0.1), dict(tolerance=1.0)])
def test_bad_stopping_settings_are_refused(settings):
    with pytest.raises(ValueError, match=next(iter(settings))):
        ImputeConfig(**settings).validate()
