"""XGBoost export: the JSON document loads into xgboost and predicts what fedtab predicts."""

import json

import numpy as np
import pytest

from fedtab.learn.gbdt import GBDTParams, fit_gbdt_pooled, write_xgboost_json, xgboost_json
from fedtab.learn.gbdt.model import IMPORTANCE_TYPES

@pytest.fixture(scope="module")
def xgb():
    """XGBoost, imported when a test that compares with it runs (not at collection)."""
    return pytest.importorskip("xgboost")


def _raw(seed: int, n: int = 1500):
    """Raw (unbinned) columns with missing cells, so edges come from the site summaries."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([rng.normal(size=n), rng.exponential(size=n) * 50, rng.integers(0, 2, n).astype(float),
                         rng.uniform(-3, 3, n)])
    X[rng.random(X.shape) < 0.1] = np.nan
    Z = np.nan_to_num(X)
    return X, Z


MODELS = {
    "binary": lambda Z, r: (r.random(len(Z)) < 1 / (1 + np.exp(-(Z[:, 0] + 0.02 * Z[:, 1] - 1)))).astype(int),
    "multiclass": lambda Z, r: np.argmax(np.c_[Z[:, 0], Z[:, 3], Z[:, 2]] + r.normal(size=(len(Z), 3)), axis=1),
    "regression": lambda Z, r: Z[:, 0] * 3 + np.sin(Z[:, 3]) + r.normal(size=len(Z)),
}


def _model(objective: str, seed: int = 0):
    X, Z = _raw(seed)
    y = MODELS[objective](Z, np.random.default_rng(seed + 1))
    kw = {"n_classes": 3} if objective == "multiclass" else {}
    params = GBDTParams(objective=objective, n_trees=15, max_depth=4, learning_rate=0.3, max_bins=64, **kw)
    return fit_gbdt_pooled(X, y, params, feature_names=["age", "income", "flag", "score"]), X


def _ours(model, X):
    if model.params.objective == "binary":
        return model.predict_proba(X)[:, 1]
    if model.params.objective == "multiclass":
        return model.predict_proba(X)
    return model.predict(X)


@pytest.mark.parametrize("objective", sorted(MODELS))
def test_booster_predicts_what_fedtab_predicts(xgb, objective, tmp_path):
    model, X = _model(objective)
    booster = model.to_xgboost()
    dm = xgb.DMatrix(X, feature_names=model.feature_names)
    np.testing.assert_allclose(booster.predict(dm), _ours(model, X), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(booster.predict(dm, output_margin=True), model.predict_margin(X), rtol=1e-5, atol=1e-5)
    path = write_xgboost_json(model, tmp_path / "model.json")
    from_file = xgb.Booster(model_file=str(path))
    np.testing.assert_allclose(from_file.predict(dm), _ours(model, X), rtol=1e-5, atol=1e-5)
    assert from_file.feature_names == model.feature_names


def test_rows_on_the_thresholds_and_unseen_extremes_go_the_same_way(xgb):
    model, X = _model("binary", seed=3)
    inner = (model.nodes["left"] >= 0) & (np.abs(model.nodes["threshold"]) < np.finfo(np.float32).max)
    thr, feats = model.nodes["threshold"][inner], model.nodes["feature"][inner]
    probe = np.full((len(thr) * 3 + 2, 4), np.nan)
    for i, (f, t) in enumerate(zip(feats, thr)):
        probe[3 * i:3 * i + 3, f] = [t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf)]
    probe[-2] = -1e30
    probe[-1] = 1e30
    booster = model.to_xgboost()
    got = booster.predict(xgb.DMatrix(probe, feature_names=model.feature_names))
    np.testing.assert_allclose(got, model.predict_proba(probe)[:, 1], rtol=1e-5, atol=1e-6)


def test_json_has_xgboosts_layout_and_reads_back_unchanged(xgb):
    model, X = _model("multiclass", seed=4)
    doc = xgboost_json(model)
    own = json.loads(xgb.train({"objective": "multi:softprob", "num_class": 3, "tree_method": "hist", "max_depth": 2},
                               xgb.DMatrix(np.nan_to_num(X), label=np.arange(len(X)) % 3), 2).save_raw("json"))

    def keys(a, b, path="$"):
        if isinstance(b, dict):
            assert set(a) == set(b) - {"cats"}, f"{path}: {sorted(set(a) ^ (set(b) - {'cats'}))}"
            for k in a:
                keys(a[k], b[k], f"{path}.{k}")
        elif isinstance(b, list) and b and isinstance(b[0], dict):
            keys(a[0], b[0], f"{path}[0]")

    keys(doc, own)
    again = json.loads(model.to_xgboost().save_raw("json"))["learner"]["gradient_booster"]["model"]["trees"]
    for t, tree in enumerate(again):
        mine = doc["learner"]["gradient_booster"]["model"]["trees"][t]
        for k in ("left_children", "right_children", "split_indices", "default_left"):
            assert tree[k] == mine[k], (t, k)
        np.testing.assert_array_equal(np.float32(tree["split_conditions"]), np.float32(mine["split_conditions"]))


def test_importance_equals_xgboost_get_score():
    model, _ = _model("binary", seed=5)
    booster = model.to_xgboost(keep_cover=True)  # the cover kinds need the covers the export masks by default
    for kind in IMPORTANCE_TYPES:
        ref = booster.get_score(importance_type=kind)
        ours = model.feature_importance(kind)
        assert set(ours) == set(ref), kind
        for name, v in ref.items():
            assert ours[name] == pytest.approx(v, rel=1e-5), (kind, name)


def test_best_iteration_is_exported():
    X, Z = _raw(6)
    y = MODELS["binary"](Z, np.random.default_rng(0))
    p = GBDTParams(n_trees=40, max_depth=5, learning_rate=0.9, early_stopping_rounds=2, min_child_weight=0)
    model = fit_gbdt_pooled(X[:1000], y[:1000], p, X_val=X[1000:], y_val=y[1000:])
    assert model.to_xgboost().attr("best_iteration") == str(model.best_iteration)


def test_the_export_masks_each_nodes_cover_unless_kept(xgb):
    """TimberStrike reads training rows from the nodes' covers: the export writes 1.0 (as
    NVIDIA FLARE does) unless asked to keep them; predictions are the same either way."""
    model, X = _model("binary", seed=5)
    masked = [t["sum_hessian"] for t in xgboost_json(model)["learner"]["gradient_booster"]["model"]["trees"]]
    kept = [t["sum_hessian"] for t in xgboost_json(model, keep_cover=True)["learner"]["gradient_booster"]["model"]["trees"]]
    assert all(v == 1.0 for tree in masked for v in tree)
    assert any(v != 1.0 for tree in kept for v in tree)
    np.testing.assert_allclose(np.concatenate(kept), np.float32(model.nodes["cover"]), rtol=0)
    Xd = xgb.DMatrix(X, missing=np.nan, feature_names=list(model.feature_names))
    np.testing.assert_array_equal(model.to_xgboost().predict(Xd), model.to_xgboost(keep_cover=True).predict(Xd))
