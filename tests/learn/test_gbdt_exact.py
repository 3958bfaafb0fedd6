"""Trees grown from pooled histograms equal XGBoost's ``tree_method="hist"`` trees.

Data are already bin indices ``0..B-1`` (NaN = missing), so both sides use the same bins:
fedtab's layout :meth:`BinLayout.for_bin_indices` (edges at ``b + ½``) and XGBoost's sketch
with ``max_bin = B`` (the test checks its cuts). Same parameters, no subsampling, XGBoost's
own intercept estimate on both sides. Compared per tree and node: children, split feature,
the partition of the bins (which bins go left), default direction, leaf values, base
weights, loss changes and hessian sums; then the predictions.

Where XGBoost differs by design, and how the test handles it:

1. **Bin boundaries.** XGBoost's cut array for a feature holds its minimum − (|min| + 1e-5)
   first, then the next values, then ``max + |max| + 1e-5``, so its bin indices are fedtab's
   plus one (its bin 0 is always empty), and its ``split_conditions`` are the next present
   value (``b + 1``), ``max + |max| + 1e-5`` (all values left) or ``min − (|min| + 1e-5)``
   (only missing left) where fedtab stores the edge ``b + ½`` or ±FLT_MAX. Both give the same
   partition of the data, so the test compares the number of bins that go left.
2. **The gain.** XGBoost's code compares ``G_L²/(H_L+λ) + G_R²/(H_R+λ) − G²/(H+λ)`` (float32,
   no factor ½) with ``gamma`` and needs it ``> 1e-6``; in the documented formula
   ``½[…] − γ`` a split therefore needs ``½[…] ≥ γ/2``. fedtab does what the code does, so
   ``gamma > 0`` cases match node for node.
3. **base_score.** XGBoost ≥ 3.1 estimates it (label mean; centred log class frequencies for
   softmax); fedtab computes the same from pooled label sums — compared, not overridden.
4. **Softmax hessian** is ``2p(1−p)`` in XGBoost; fedtab uses the same.
5. **Summation.** XGBoost builds one child's histogram and subtracts it from the parent,
   in its own row order and threads; fedtab too, with other rows. Sums agree to ~1e-16
   relative, gains are float32 on both sides: values are compared with float32 tolerances.
"""

import json

import numpy as np
import pytest

from fedtab.learn.gbdt import BinLayout, GBDTParams, fit_gbdt_pooled, fit_gbdt_sites, level_histograms
from fedtab.learn.gbdt.site import SparseSlots

@pytest.fixture(scope="module")
def xgb():
    """XGBoost, imported when a test that compares with it runs (not at collection)."""
    return pytest.importorskip("xgboost")

B = 10  # bins per feature


def _binned(seed: int, n: int = 4000, d: int = 6, missing: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.integers(0, B, (n, d)).astype(np.float64)
    X[rng.random((n, d)) < missing] = np.nan
    X[:, 1][rng.random(n) < 0.3] = np.nan  # one column with many missing cells: default directions matter
    Z = np.nan_to_num(X, nan=B / 2)
    return X, Z


def _labels(objective: str, Z: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if objective == "binary":
        z = 0.5 * (Z[:, 0] - 4.5) + 1.0 * (Z[:, 1] > 6) - 0.2 * Z[:, 2]
        return (rng.random(len(Z)) < 1 / (1 + np.exp(-z))).astype(np.int64)
    if objective == "multiclass":
        return np.argmax(Z[:, :3] + 2.0 * rng.normal(size=(len(Z), 3)), axis=1)
    return 0.7 * Z[:, 0] - 0.1 * Z[:, 1] * Z[:, 2] + rng.normal(size=len(Z))


def _xgb_trees(booster) -> tuple[list[dict], dict]:
    doc = json.loads(booster.save_raw("json"))
    return doc["learner"]["gradient_booster"]["model"]["trees"], doc["learner"]["learner_model_param"]


def _bins_left(cond: float) -> int:
    """How many of the values 0..B-1 go left (x < cond) under an XGBoost split condition."""
    return int(np.sum(np.arange(B, dtype=np.float32) < np.float32(cond)))


def assert_same_trees(model, booster, rtol: float = 2e-5) -> dict[str, int]:
    trees, _ = _xgb_trees(booster)
    assert len(trees) == model.n_trees
    seen = {"splits": 0, "default_left": 0, "missing_only_left": 0, "stopped_early": 0}
    for t, xt in enumerate(trees):
        mt = model.tree(t)
        assert xt["left_children"] == mt["left"].tolist(), f"tree {t}: structure differs"
        assert xt["right_children"] == mt["right"].tolist(), f"tree {t}: structure differs"
        inner = mt["left"] >= 0
        np.testing.assert_array_equal(np.asarray(xt["split_indices"])[inner], mt["feature"][inner], f"tree {t}")
        np.testing.assert_array_equal([_bins_left(c) for c, i in zip(xt["split_conditions"], inner) if i],
                                      mt["bin"][inner] + 1, f"tree {t}: partitions differ")
        np.testing.assert_array_equal(np.asarray(xt["default_left"], bool)[inner], mt["default_left"][inner])
        np.testing.assert_allclose(np.asarray(xt["split_conditions"])[~inner], mt["value"][~inner], rtol=rtol, atol=1e-6)
        np.testing.assert_allclose(xt["base_weights"], mt["base_weight"], rtol=rtol, atol=1e-6)
        np.testing.assert_allclose(xt["sum_hessian"], mt["cover"], rtol=rtol)
        np.testing.assert_allclose(np.asarray(xt["loss_changes"])[inner], mt["gain"][inner], rtol=1e-4, atol=1e-5)
        seen["splits"] += int(inner.sum())
        seen["default_left"] += int((mt["default_left"] & inner).sum())
        seen["missing_only_left"] += int(((mt["bin"] == -1) & inner).sum())
        seen["stopped_early"] += int(inner.sum() < 2 ** model.params.max_depth - 1)
    return seen


CASES = {
    "binary": dict(objective="binary", n_trees=12, max_depth=5, learning_rate=0.3),
    "binary_regularised": dict(objective="binary", n_trees=15, max_depth=6, learning_rate=0.2, reg_lambda=0.5,
                               gamma=0.3, min_child_weight=3.0),
    "multiclass": dict(objective="multiclass", n_classes=3, n_trees=8, max_depth=4, learning_rate=0.5),
    "regression": dict(objective="regression", n_trees=10, max_depth=5, reg_lambda=3.0, gamma=2.0,
                       min_child_weight=5.0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pooled_trees_equal_xgboost_hist(xgb, case):
    kw = CASES[case]
    X, Z = _binned(seed=len(case))
    y = _labels(kw["objective"], Z, seed=1)
    params = GBDTParams(max_bins=B, **kw)
    layout = BinLayout.for_bin_indices([B] * X.shape[1])
    model = fit_gbdt_pooled(X, y, params, layout=layout)

    dtrain = xgb.DMatrix(X, label=y)
    booster = xgb.train({**params.xgboost_params(), "nthread": 1}, dtrain, num_boost_round=params.n_trees)
    # XGBoost's cuts separate every bin value: its bins are fedtab's (shifted by its empty bin 0)
    ptr, cuts = xgb.QuantileDMatrix(X, label=y, max_bin=B).get_quantile_cut()
    for f in range(X.shape[1]):
        np.testing.assert_array_equal(cuts[ptr[f] + 1:ptr[f + 1] - 1], np.arange(1, B, dtype=np.float32))

    _, learner = _xgb_trees(booster)
    xgb_base = np.array(json.loads(learner["base_score"]), dtype=np.float32)
    ours = model.base_margin if kw["objective"] != "binary" else 1 / (1 + np.exp(-model.base_margin))
    np.testing.assert_allclose(ours, xgb_base, rtol=1e-6, atol=1e-6)  # float32 log of frequencies

    seen = assert_same_trees(model, booster)
    assert seen["splits"] > 20 * model.n_trees // 10
    assert seen["default_left"] > 0, "the data must exercise learned default directions"
    if "gamma" in kw or "min_child_weight" in kw:
        assert seen["stopped_early"] > 0, "the regularised case must stop some branches early"

    pred_x = booster.predict(xgb.DMatrix(X))
    if kw["objective"] == "binary":
        ours_p = model.predict_proba(X)[:, 1]
    elif kw["objective"] == "multiclass":
        ours_p = model.predict_proba(X)
    else:
        ours_p = model.predict(X)
    np.testing.assert_allclose(ours_p, pred_x, rtol=1e-5, atol=1e-5)


def test_missing_only_split_matches_xgboost(xgb):
    """A feature whose only signal is being missing: both send just the missing rows one way."""
    rng = np.random.default_rng(3)
    n = 3000
    X = rng.integers(0, B, (n, 3)).astype(np.float64)
    miss = rng.random(n) < 0.4
    X[miss, 0] = np.nan
    y = (rng.random(n) < np.where(miss, 0.8, 0.2)).astype(np.int64)
    params = GBDTParams(n_trees=3, max_depth=2, max_bins=B)
    model = fit_gbdt_pooled(X, y, params, layout=BinLayout.for_bin_indices([B] * 3))
    booster = xgb.train({**params.xgboost_params(), "nthread": 1}, xgb.DMatrix(X, label=y), params.n_trees)
    seen = assert_same_trees(model, booster)
    root = model.tree(0)
    assert root["feature"][0] == 0 and root["bin"][0] in (-1, B - 1)  # the root separates missing from the rest
    assert seen["splits"] >= 3


def _integer_gradients(n: int, K: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(-50, 50, (n, K)).astype(np.float32), rng.integers(0, 20, (n, K)).astype(np.float32))


def test_site_histograms_sum_exactly_to_the_pooled_histogram():
    """3 sites' histograms (integer-valued g/h) add up to the pooled rows' histogram bit for bit,
    dense and sparse builders alike, for several trees and nodes of a level."""
    X, _ = _binned(seed=5, n=3000)
    layout = BinLayout.for_bin_indices([B] * X.shape[1])
    slots = layout.slots(layout.bin(X))
    K = 3
    g, h = _integer_gradients(len(X), K, seed=6)
    positions = np.random.default_rng(7).integers(3, 7, (K, len(X))).astype(np.int32)
    nodes = np.array([[0, 3], [0, 5], [1, 4], [2, 6], [2, 3]])
    pooled = level_histograms(slots, g, h, positions, nodes, layout.n_slots)
    parts = np.array_split(np.random.default_rng(8).permutation(len(X)), [1700, 2600])  # unequal sites
    dense = sum(level_histograms(slots[p], g[p], h[p], positions[:, p], nodes, layout.n_slots) for p in parts)
    sparse = sum(SparseSlots(slots[p], layout).histograms(g[p], h[p], positions[:, p], nodes) for p in parts)
    np.testing.assert_array_equal(dense, pooled)
    np.testing.assert_array_equal(sparse, pooled)
    # every feature's slots add up to the node totals (each row is in one slot per feature)
    seg = np.add.reduceat(pooled, layout.offsets[:-1], axis=1)
    np.testing.assert_array_equal(seg, np.repeat(seg[:, :1], X.shape[1], axis=1))
    assert pooled[..., 1].sum() > 0


def test_three_sites_grow_the_pooled_trees():
    """The federated sequence of sums over 3 unequal sites gives the pooled model's trees."""
    X, Z = _binned(seed=9, n=3000)
    y = _labels("binary", Z, seed=2)
    params = GBDTParams(n_trees=6, max_depth=4, max_bins=B)
    layout = BinLayout.for_bin_indices([B] * X.shape[1])
    parts = np.array_split(np.arange(len(X)), [1500, 2400])
    fed = fit_gbdt_sites([(X[p], y[p]) for p in parts], params, layout=layout)
    pooled = fit_gbdt_pooled(X, y, params, layout=layout)
    for k in ("left", "right", "feature", "bin", "default_left"):
        np.testing.assert_array_equal(fed.nodes[k], pooled.nodes[k])
    np.testing.assert_allclose(fed.nodes["value"], pooled.nodes["value"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(fed.predict_margin(X), pooled.predict_margin(X), rtol=1e-6, atol=1e-6)
