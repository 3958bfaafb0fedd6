"""Histogram GBDT core (the bin sketch: test_gbdt_sketch.py): binning, site state, growth, model arrays."""

import numpy as np
import pytest

from fedtab.learn.gbdt import (
    BinLayout, Booster, GBDTModel, GBDTParams, SiteBooster, base_margin, find_splits, fit_gbdt_pooled,
    fit_gbdt_sites, gradients, label_sums, loss_sums, metric_from_sums,
)
from fedtab.learn.gbdt.sketch import sketch_edges

F32_MAX = np.finfo(np.float32).max


def _table(seed=0, n=2000):
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.normal(size=n), rng.exponential(size=n) * 100, rng.integers(0, 2, n),
                         rng.integers(1, 17, n), np.where(rng.random(n) < 0.9, 0.0, rng.gamma(2, 1000, n))])
    X[rng.random(X.shape) < 0.05] = np.nan
    z = np.nan_to_num(X[:, 0]) + 0.01 * np.nan_to_num(X[:, 1]) + np.nan_to_num(X[:, 2]) - 1
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.int64)
    return X, y


# ----------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("bad", [dict(objective="poisson"), dict(max_depth=0), dict(max_bins=1), dict(max_bins=70000),
                                 dict(learning_rate=0), dict(subsample=1.5), dict(reg_lambda=-1),
                                 dict(early_stopping_rounds=0), dict(base_score=1.0), dict(n_trees=True),
                                 dict(objective="multiclass", n_classes=1), dict(gamma=float("nan"))])
def test_bad_parameters_raise(bad):
    with pytest.raises(ValueError):
        GBDTParams(**bad)


def test_unknown_parameter_is_named():
    with pytest.raises(ValueError, match="max_leaves"):
        GBDTParams.from_dict({"max_leaves": 3})


# ----------------------------------------------------------------------------- binning
def test_binning_matches_the_float32_split_rule():
    layout = BinLayout([np.float32([0.5, 2.0]), np.zeros(0, np.float32)])
    X = np.array([[0.4999, 1.0], [0.5, np.nan], [2.0, 3.0], [np.nan, 4.0]])
    np.testing.assert_array_equal(layout.bin(X), [[0, 0], [1, 1], [2, 0], [3, 0]])
    assert layout.n_slots == 4 + 2 and layout.missing_slots.tolist() == [3, 5]
    thr = layout.threshold([0, 0, 0, 0], [-1, 0, 1, 2])
    assert thr[0] == -F32_MAX and thr[1] == np.float32(0.5) and thr[2] == np.float32(2.0) and thr[3] == F32_MAX
    with pytest.raises(ValueError, match="infinite"):
        layout.bin(np.array([[np.inf, 0.0]]))
    with pytest.raises(ValueError, match="strictly increasing"):
        BinLayout([np.float32([1.0, 1.0])])


# ----------------------------------------------------------------------------- objectives
def test_intercepts_from_pooled_label_sums():
    p = GBDTParams()
    sums = label_sums(p, np.array([0, 1, 1, 1])) + label_sums(p, np.array([0, 0, 1, 0]))
    np.testing.assert_allclose(1 / (1 + np.exp(-base_margin(p, sums))), [0.5], atol=1e-6)
    m = GBDTParams(objective="multiclass", n_classes=3)
    b = base_margin(m, label_sums(m, np.array([0, 0, 1, 2, 2, 2])))
    np.testing.assert_allclose(np.exp(b) / np.exp(b).sum(), [2 / 6, 1 / 6, 3 / 6], rtol=1e-5)
    with pytest.raises(ValueError):
        label_sums(m, np.array([0, 3]))
    with pytest.raises(ValueError):
        base_margin(p, np.array([0.0, 0.0]))


def test_gradients_are_those_of_the_losses():
    y = np.array([0, 1, 1])
    g, h = gradients(GBDTParams(), np.zeros((3, 1), np.float32), y)
    np.testing.assert_allclose(g[:, 0], [0.5, -0.5, -0.5])
    np.testing.assert_allclose(h[:, 0], 0.25)
    p3 = GBDTParams(objective="multiclass", n_classes=3)
    g, h = gradients(p3, np.zeros((3, 3), np.float32), np.array([0, 1, 2]))
    np.testing.assert_allclose(g, np.full((3, 3), 1 / 3) - np.eye(3), atol=1e-7)
    np.testing.assert_allclose(h, 2 * (1 / 3) * (2 / 3), rtol=1e-6)
    s = loss_sums(GBDTParams(objective="regression"), np.array([[1.0], [3.0]]), np.array([0.0, 1.0]))
    assert metric_from_sums(GBDTParams(objective="regression"), s) == pytest.approx(np.sqrt(2.5))


# ----------------------------------------------------------------------------- splits
def test_find_splits_picks_the_best_gain_and_learns_the_missing_direction():
    layout = BinLayout.for_bin_indices([3, 3])
    hist = np.zeros((1, layout.n_slots, 2))
    # feature 0: bins hold (g, h) = (-5, 5), (0, 5), (5, 5); missing (-5, 5) belongs with bin 0
    hist[0, 0:4] = [[-5, 5], [0, 5], [5, 5], [-5, 5]]
    hist[0, 4:8] = [[-2, 5], [-1, 5], [-2, 5], [0, 5]]  # feature 1: weak
    totals = hist[:, 0:4].sum(axis=1)
    params = GBDTParams(reg_lambda=1.0, min_child_weight=1.0)
    best = find_splits(hist, totals, layout, params)
    assert best["split"][0] and best["feature"][0] == 0 and best["default_left"][0]
    assert best["bin"][0] == 0  # left = bin 0 + missing
    np.testing.assert_allclose(best["left_sum"][0], [-10, 10])
    expected = 100 / 11 + 25 / 11 - 25 / 21
    assert best["gain"][0] == pytest.approx(expected, rel=1e-6)
    # gamma above the gain: no split; min_child_weight above a side's hessian: that side is invalid
    assert not find_splits(hist, totals, layout, GBDTParams(gamma=expected + 1))["split"][0]
    with pytest.raises(ValueError, match="finite"):
        find_splits(np.full_like(hist, np.nan), totals, layout, params)


# ----------------------------------------------------------------------------- training
def test_site_margins_equal_model_margins_on_raw_rows():
    """Routing by bins at the site and by float thresholds in the model agree on every row."""
    X, y = _table()
    params = GBDTParams(n_trees=8, max_depth=4, max_bins=32)
    layout = BinLayout(sketch_edges([X], 32, 10))
    margin0 = base_margin(params, label_sums(params, y))
    site = SiteBooster(X, y, layout, params, margin0)
    booster = Booster(params, layout, margin0)
    while not booster.finished:
        grower = booster.new_round()
        site.start_round()
        while not grower.done:
            site.apply(grower.submit(site.histograms(grower.request())))
        site.finish_round(grower.leaf_values())
        booster.add_round(grower)
    model = booster.model()
    np.testing.assert_allclose(site.margins[:, 0], model.predict_margin(X), rtol=1e-5, atol=1e-5)
    assert model.n_trees == 8


def test_level_exchanges_and_sibling_subtraction():
    X, y = _table(seed=1)
    log = []
    model = fit_gbdt_sites([(X[:1200], y[:1200]), (X[1200:], y[1200:])], GBDTParams(n_trees=3, max_depth=5), log=log)
    assert [e["level"] for e in log if e["round"] == 0] == [0, 1, 2, 3, 4]  # one exchange per level, max_depth per tree
    t = model.tree(0)
    depth = np.zeros(t["left"].size, int)
    for i in np.flatnonzero(t["left"] >= 0):
        depth[t["left"][i]] = depth[t["right"][i]] = depth[i] + 1
    splits_at = np.bincount(depth[t["left"] >= 0], minlength=5)
    # below the root a site builds one child per split (the server derives the sibling as parent − child)
    assert [e["nodes"] for e in log[:5]] == [1, *splits_at[:4].tolist()]
    assert log[0]["bytes_per_site"] == 8 * 2 * (model.layout.n_slots)


def test_subsample_is_site_side_and_seeded():
    X, y = _table(seed=2)
    p = GBDTParams(n_trees=3, max_depth=3, subsample=0.5, seed=7)
    a = fit_gbdt_pooled(X, y, p)
    b = fit_gbdt_pooled(X, y, p)
    c = fit_gbdt_pooled(X, y, GBDTParams(n_trees=3, max_depth=3, subsample=0.5, seed=8))
    full = fit_gbdt_pooled(X, y, GBDTParams(n_trees=3, max_depth=3))
    np.testing.assert_array_equal(a.nodes["value"], b.nodes["value"])
    assert not np.array_equal(a.nodes["cover"][:1], c.nodes["cover"][:1])
    assert 0.4 < a.nodes["cover"][0] / full.nodes["cover"][0] < 0.6  # about half the hessian mass at the root


def test_early_stopping_keeps_the_best_round():
    X, y = _table(seed=3, n=1500)
    rng = np.random.default_rng(0)
    y_noisy = np.where(rng.random(len(y)) < 0.3, 1 - y, y)
    p = GBDTParams(n_trees=200, max_depth=6, learning_rate=0.8, early_stopping_rounds=3, min_child_weight=0)
    model = fit_gbdt_pooled(X[:1000], y_noisy[:1000], p, X_val=X[1000:], y_val=y_noisy[1000:])
    assert model.best_iteration is not None and model.n_rounds == model.best_iteration + 1 < 50


def test_heterogeneous_site_without_a_column_needs_no_imputation():
    X, y = _table(seed=4)
    A, B = X[:1000].copy(), X[1000:].copy()
    B[:, 0] = np.nan  # site B does not have column 0
    model = fit_gbdt_sites([(A, y[:1000]), (B, y[1000:])], GBDTParams(n_trees=10, max_depth=3))
    p = model.predict_proba(B)
    assert p.shape == (1000, 2) and np.isfinite(p).all()
    assert model.importance_array("weight")[0] > 0  # column 0 is still used, with a default direction
    uses_0 = (model.nodes["feature"] == 0) & (model.nodes["left"] >= 0)
    assert uses_0.any()


# ----------------------------------------------------------------------------- model arrays
def test_model_arrays_round_trip_and_importance():
    X, y = _table(seed=5)
    model = fit_gbdt_pooled(X, y, GBDTParams(n_trees=5, max_depth=3), feature_names=list("abcde"))
    again = GBDTModel.from_arrays(model.manifest(), model.to_arrays())
    np.testing.assert_array_equal(again.predict_margin(X), model.predict_margin(X))
    imp = model.feature_importance("total_gain")
    assert set(imp) <= set("abcde") and all(v > 0 for v in imp.values())
    np.testing.assert_allclose(model.importance_array("gain") * model.importance_array("weight"),
                               model.importance_array("total_gain"), rtol=1e-12)
    with pytest.raises(ValueError, match="kind"):
        model.importance_array("shap")
    with pytest.raises(ValueError, match=r"\(n, 5\)"):
        model.predict(X[:, :4])
    with pytest.raises(ValueError, match="infinite"):
        model.predict(np.where(np.isnan(X), np.inf, X))


def _tampered(arrays, key, fn):
    out = {k: v.copy() for k, v in arrays.items()}
    out[key] = fn(out[key])
    return out


@pytest.mark.parametrize("key, fn, message", [
    ("left", lambda a: np.where(np.arange(a.size) == 0, 0, a), "later nodes|two children"),
    ("right", lambda a: np.where(a > 0, 1, a), "later nodes|one parent"),
    ("feature", lambda a: np.where(a >= 0, 99, a), "features"),
    ("value", lambda a: np.where(np.arange(a.size) == 1, np.nan, a).astype(a.dtype), "non-finite"),
    ("threshold", lambda a: a.astype(np.int32), "dtype"),
    ("tree_ptr", lambda a: a[::-1].copy(), "tree_ptr"),
    ("base_margin", lambda a: np.r_[a, a], "base_margin"),
    ("left", lambda a: a[:-1], "shape"),
])
def test_hostile_model_arrays_are_rejected(key, fn, message):
    X, y = _table(seed=6)
    model = fit_gbdt_pooled(X, y, GBDTParams(n_trees=2, max_depth=2))
    with pytest.raises(ValueError, match=message):
        GBDTModel.from_arrays(model.manifest(), _tampered(model.to_arrays(), key, fn))


def test_model_manifest_is_checked():
    X, y = _table(seed=7)
    model = fit_gbdt_pooled(X, y, GBDTParams(n_trees=1, max_depth=1))
    arrays = model.to_arrays()
    with pytest.raises(ValueError, match="manifest"):
        GBDTModel.from_arrays({**model.manifest(), "format": "other"}, arrays)
    with pytest.raises(ValueError, match="missing"):
        GBDTModel.from_arrays(model.manifest(), {k: v for k, v in arrays.items() if k != "gain"})
    with pytest.raises(ValueError, match="unknown GBDT parameters"):
        GBDTModel.from_arrays({**model.manifest(), "params": {"__class__": 1}}, arrays)


def test_grower_rejects_bad_pooled_histograms_and_extra_levels():
    X, y = _table(seed=8)
    params = GBDTParams(n_trees=1, max_depth=1)
    layout = BinLayout(sketch_edges([X], 256, 10))
    grower = Booster(params, layout, np.zeros(1, np.float32)).new_round()
    with pytest.raises(ValueError, match="pooled level histogram"):
        grower.submit(np.zeros((2, layout.n_slots, 2)))
    with pytest.raises(ValueError, match="pooled level histogram"):
        grower.submit(np.full((1, layout.n_slots, 2), np.inf))
    site = SiteBooster(X, y, layout, params, np.zeros(1, np.float32))
    site.start_round()
    grower.submit(site.histograms(grower.request()))
    assert grower.done
    with pytest.raises(RuntimeError, match="complete"):
        grower.submit(np.zeros((0, layout.n_slots, 2)))


def test_gbdt_core_imports_only_numpy_and_itself():
    """Layering: the algorithm imports nothing from federation/engines/job/report/cli, and xgboost
    only inside the export function."""
    import ast
    from pathlib import Path

    import fedtab.learn.gbdt as pkg

    for path in Path(pkg.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 1 or node.module in ("__future__", "typing", "dataclasses", "pathlib"), \
                    (path.name, node.module)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name in ("numpy", "math", "json", "xgboost"), (path.name, alias.name)
        top = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        assert "xgboost" not in top, path.name


def _one_site_level(seed=9):
    X, y = _table(seed=seed)
    params = GBDTParams(n_trees=1, max_depth=2)
    layout = BinLayout(sketch_edges([X], 256, 10))
    site = SiteBooster(X, y, layout, params, base_margin(params, label_sums(params, y)))
    site.start_round()
    return layout, site.histograms(np.array([[0, 0]])), len(y)


def test_honest_site_histogram_passes_the_checks():
    from fedtab.learn.gbdt import check_site_histogram

    layout, hist, n = _one_site_level()
    check_site_histogram(hist, layout, 1, n_rows=n, site="site-1")


@pytest.mark.parametrize("tamper, message", [
    (lambda h: h[..., :1, :], "must be float"),
    (lambda h: np.where(h == h.max(), np.nan, h), "non-finite"),
    (lambda h: h * np.r_[1.0, -1.0], "negative hessian"),
    (lambda h: h + np.eye(h.shape[1])[3][None, :, None], "disagree"),  # one slot inflated
    (lambda h: h * 10, "hessian mass exceeds"),
])
def test_hostile_site_histogram_is_rejected(tamper, message):
    from fedtab.learn.gbdt import check_site_histogram

    layout, hist, n = _one_site_level()
    with pytest.raises(ValueError, match=f"site-2: .*{message}"):
        check_site_histogram(tamper(hist.copy()), layout, 1, n_rows=n, site="site-2")
    if message in ("negative hessian", "disagree", "hessian mass exceeds"):
        check_site_histogram(tamper(hist.copy()), layout, 1, n_rows=n, noisy=True)  # DP noise: only shape/finite
