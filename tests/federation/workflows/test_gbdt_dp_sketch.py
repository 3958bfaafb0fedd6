"""The GBDT quantile sketch under differential privacy (issue 28, item 2): a DP run without
public bounds agrees its bin edges from the sites' noisy counts over the public grids, spends
ε for them (the run's accountant and each site's ledger), and a curious server pays for every
sketch it asks."""

from __future__ import annotations

import numpy as np

from fedtab.engines.local import LocalFederation
from fedtab.federation.protocol import set_options
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.core import Site
from fedtab.federation.workflows.gbdt import run_gbdt
from fedtab.learn.gbdt import BinLayout, GBDTParams
from fedtab.learn.gbdt.grid import public_grid
from fedtab.learn.gbdt.sketch import RANGE_EDGES, RANGE_WIDTH, fine_grid, grid_counts
from tests.builders import gbdt_parts, make_sites

FAST = {"n_trees": 3, "max_depth": 3, "max_bins": 32}
FEATS = ["f0", "f1", "f2", "f3", "f4", "f5"]
#: sites that allow a large ε per release (so that a large-ε run is barely noised) and opt in to plain
#: tree-node answers (the reference plain run)
LOOSE = {"min_rows": 10, "allow_server_row_sets": True, "max_epsilon_per_release": 1e4, "epsilon_budget": 1e7}


def _fed(policy=None, seed: int = 9) -> LocalFederation:
    return LocalFederation(make_sites(gbdt_parts(seed, missing=0.0, drop=None), policy=policy or LOOSE))


def _ranks(fed: LocalFederation, feature: str, edges: np.ndarray) -> np.ndarray:
    """The pooled training rows' fraction below each edge (the edge's quantile)."""
    x = np.concatenate([fed.site(s).rows("train")[feature].to_numpy(float) for s in fed.sites])
    x = np.sort(x[~np.isnan(x)]).astype(np.float32)
    return np.searchsorted(x, np.asarray(edges, np.float32), side="left") / x.size


def test_a_dp_run_without_bounds_trains_on_noisy_sketch_edges_near_the_exact_ones():
    exact = run_gbdt(_fed(), None, params=FAST, importance=False)
    fed = _fed()
    set_options(fed, dp={"epsilon": 1e5, "delta": 1e-5})  # no bounds anywhere: the sketch under DP
    out = run_gbdt(fed, None, params=FAST)
    steps = [e["step"] for e in out.exchanges]
    assert steps.count("gbdt_sketch") == 2
    assert out.privacy["releases"]["gbdt.sketch"] == 2 and out.privacy["steps"]["gbdt.sketch"] > 0
    assert out.model.n_trees == FAST["n_trees"] and out.metrics["pooled"]["accuracy"] > 0.6
    for j, f in enumerate(out.features):
        dp_edges, ex_edges = out.model.layout.edges[j], exact.model.layout.edges[j]
        assert 0.6 * ex_edges.size <= dp_edges.size <= FAST["max_bins"] - 1
        r_dp, r_ex = _ranks(fed, f, dp_edges), _ranks(fed, f, ex_edges)
        # every exact cut has a DP cut at nearly the same quantile, and vice versa (the equal-width grid
        # of [-6, 6] misses by 0.043-0.077 here; the bin width is 1/32)
        assert np.abs(r_ex[:, None] - r_dp[None, :]).min(axis=1).max() < 0.025, f
        assert np.abs(r_dp[:, None] - r_ex[None, :]).min(axis=1).max() < 0.025, f


def test_dp_bounds_for_some_columns_and_the_sketch_for_the_rest():
    fed = _fed()
    set_options(fed, dp={"epsilon": 1e5, "delta": 1e-5, "bounds": {"f0": [-6.0, 6.0]}})
    out = run_gbdt(fed, None, params=FAST, importance=False)
    np.testing.assert_array_equal(out.model.layout.edges[0], public_grid([-6.0], [6.0], FAST["max_bins"])[0])
    assert out.privacy["releases"]["gbdt.sketch"] == 2
    # with DP bounds for every column no sketch is asked and none is planned
    fed2 = _fed()
    set_options(fed2, dp={"epsilon": 50.0, "delta": 1e-5, "bounds": [-6.0, 6.0]})
    out2 = run_gbdt(fed2, None, params=FAST, importance=False)
    assert "gbdt_sketch" not in [e["step"] for e in out2.exchanges] and "gbdt.sketch" not in out2.privacy["releases"]


def _sketch(site: Site, z: float, stage: str = "range", **meta) -> Message:
    return site.handle(Message("gbdt_sketch", meta={"features": FEATS, "stage": stage, **meta,
                                                    "dp": {"z": z, "bounds": None, "clip": 1.0}}))


def test_the_site_noises_raw_counts_at_root_d_and_charges_every_request():
    """A curious server asks the same DP sketch twice: both are answered with fresh noise and
    each is charged to the site's ε ledger; once the budget is spent the site refuses."""
    table = gbdt_parts(9, missing=0.0, drop=None)[0]
    site = Site("s", table, "target", policy={"min_rows": 10, "epsilon_budget": 12.0})
    X = site.rows("train")[FEATS].to_numpy(float)
    exact = grid_counts(X, [RANGE_EDGES] * len(FEATS), RANGE_WIDTH)
    spent = [site.ledger.epsilon_spent(site.policy.delta)]
    replies = []
    for _ in range(2):
        r = _sketch(site, z=1.0)
        assert r.kind == "gbdt_sketch", r.meta
        replies.append(np.asarray(r.arrays["counts"]).reshape(exact.shape))
        spent.append(site.ledger.epsilon_spent(site.policy.delta))
    assert spent[0] == 0.0 < spent[1] < spent[2]  # charged twice, the second no cheaper
    assert not np.array_equal(replies[0], replies[1])  # fresh noise, not a cached answer
    noise = np.concatenate([r - exact for r in replies]).ravel()
    # z at least the site's floor (max_epsilon_per_release = 4: z ≈ 1.1), times sqrt(6 features)
    assert 1.0 * np.sqrt(6) < noise.std() < 2.0 * np.sqrt(6)
    for _ in range(40):
        r = _sketch(site, z=1.0)
        if r.is_refusal:
            break
    assert r.is_refusal and "budget" in r.meta["reason"].lower()


def test_a_dp_start_takes_edges_only_on_the_sites_dp_sketch_grid():
    table = gbdt_parts(9, missing=0.0, drop=None)[0]
    site = Site("s", table, "target", policy={"min_rows": 10})
    params = GBDTParams(max_bins=8).to_dict()
    dp = {"z": 5.0, "bounds": None, "clip": 1.0}

    def start(edges):
        return site.handle(Message("gbdt_start", BinLayout(edges).to_arrays(),
                                   {"features": FEATS, "part": "train", "classes": ["0", "1"], "params": params,
                                    "dp": dp}))

    grid = fine_grid(-8.0, 8.0)
    on_grid = [grid[[300, 500, 700]].astype(np.float32)] * len(FEATS)
    refused = start(on_grid)  # no DP sketch answered yet: no grid for these columns
    assert refused.is_refusal and "DP sketch" in refused.meta["reason"]
    lo, hi = [-8.0] * len(FEATS), [8.0] * len(FEATS)
    assert _sketch(site, z=5.0, stage="fine", lo=lo, hi=hi).kind == "gbdt_sketch"
    crafted = start([np.array([0.123456], np.float32)] + on_grid[1:])  # off the grid: between two rows
    assert crafted.is_refusal and "not a point of the public grid" in crafted.meta["reason"]
    assert start(on_grid).kind == "gbdt_start"
