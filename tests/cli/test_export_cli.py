"""A gbdt model file: trees as arrays (no pickle), load_model predicts as the trained model,
to_xgboost() and ``fedtab export MODEL --format xgboost OUT.json`` give XGBoost the same trees."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fedtab.cli import app
from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.training import run_training
from fedtab.job.model_file import ModelFileError, load_model, write_model
from tests.builders import classification_parts, make_sites

PARAMS = {"n_trees": 5, "max_depth": 3, "max_bins": 32}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    _, parts = classification_parts(900, 5, 3, 1, seed=21)
    rng = np.random.default_rng(0)
    parts = [p.mask(rng.random(p.shape) < 0.05).assign(target=p["target"]) for p in parts]
    sites = make_sites(parts, policy={"allow_server_row_sets": True})  # a plain run: the sites opt in
    tr = run_training(LocalFederation(sites), None, model={"name": "gbdt", "params": PARAMS})
    cols = [c for c in parts[0].columns if c != "target"]
    section = {"schema": {"columns": cols}, "encoded_columns": cols, "imputer": None, "features": tr.features,
               "classes": tr.classes, "mean": tr.mean.tolist(), "std": tr.std.tolist(),
               "model": {"name": "gbdt", "params": PARAMS},
               "params": {k: np.asarray(v).tolist() for k, v in tr.params.items()}}  # as the job writes them
    path = write_model(tmp_path_factory.mktemp("gbdt") / "model.fedtab", section, {"fedtab": "test"})
    return tr, path, pd.concat(parts)[cols]


def test_the_model_file_holds_arrays_only_and_predicts_as_the_trained_trees(trained):
    tr, path, table = trained
    with zipfile.ZipFile(path) as zf:
        assert all(n == "manifest.json" or n.endswith(".npy") for n in zf.namelist())
    m = load_model(path)
    from fedtab.learn.models import make_model

    expected = make_model({"name": "gbdt", "params": PARAMS}).predict_proba(tr.params, table[tr.features].to_numpy())
    np.testing.assert_allclose(m.predict_proba(table), expected, rtol=0, atol=1e-12)
    assert np.isnan(table.to_numpy()).any()  # missing cells follow the default directions, no imputation


def test_to_xgboost_predicts_as_fedtab_predict(trained):
    xgb = pytest.importorskip("xgboost")
    _, path, table = trained
    m = load_model(path)
    booster = m.to_xgboost()
    got = booster.predict(xgb.DMatrix(table[m.features].to_numpy(), missing=np.nan, feature_names=m.features))
    np.testing.assert_allclose(got, m.predict_proba(table)[:, 1], rtol=0, atol=1e-5)


def test_fedtab_export_writes_xgboosts_json(trained, tmp_path):
    xgb = pytest.importorskip("xgboost")
    _, path, table = trained
    out = tmp_path / "trees.json"
    res = CliRunner().invoke(app, ["export", str(path), "--format", "xgboost", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["learner"]["objective"]["name"] == "binary:logistic"
    booster = xgb.Booster(model_file=str(out))
    m = load_model(path)
    got = booster.predict(xgb.DMatrix(table[m.features].to_numpy(), missing=np.nan, feature_names=m.features))
    np.testing.assert_allclose(got, m.predict_proba(table)[:, 1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("args, match", [
    (["export", "missing.fedtab", "out.json"], "no such model file"),
    (["export", "{model}", "--format", "onnx", "out.json"], "unknown export format"),
])
def test_export_errors_are_one_line_with_exit_2(trained, tmp_path, args, match):
    _, path, _ = trained
    res = CliRunner().invoke(app, [a.format(model=path) for a in args], catch_exceptions=False)
    assert res.exit_code == 2
    assert match in res.output and "Traceback" not in res.output


def test_a_tampered_tree_array_is_rejected_on_load(trained, tmp_path):
    _, path, _ = trained
    bad = tmp_path / "bad.fedtab"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "arrays/model/left.npy":
                import io
                a = np.load(io.BytesIO(data))
                a[0] = 0  # the root its own child: not a tree
                buf = io.BytesIO()
                np.save(buf, a)
                data = buf.getvalue()
            dst.writestr(item, data)
    with pytest.raises(ModelFileError, match="children|parent"):
        load_model(bad)


def test_a_gbdt_job_writes_a_model_file_that_predict_and_export_read(tmp_path):
    xgb = pytest.importorskip("xgboost")
    from fedtab.data.example_sites import HEART_SITES, write_heart_sites
    from fedtab.job.run import run_job

    write_heart_sites(tmp_path, rows=150)
    doc = {"target": "disease", "na_values": ["?"],
           "sites": {n.split(".")[0]: {"path": str(tmp_path / n), "min_rows": 4, "allow_server_row_sets": True}
                     for n in HEART_SITES},
           "training": {"model": {"name": "gbdt", "params": PARAMS}}, "run": {"out": str(tmp_path / "out")}}
    run_job(doc, out=tmp_path / "out")
    model_path = tmp_path / "out" / "model.fedtab"
    table = pd.read_csv(tmp_path / next(iter(HEART_SITES)), na_values=["?"]).drop(columns=["disease"])
    res = CliRunner().invoke(app, ["predict", str(model_path), str(tmp_path / next(iter(HEART_SITES))),
                                   "--out", str(tmp_path / "p.csv")])
    assert res.exit_code == 0, res.output
    m = load_model(model_path)
    preds = pd.read_csv(tmp_path / "p.csv")
    np.testing.assert_allclose(preds["probability_1"], m.predict_proba(table)[:, 1], atol=1e-9)
    res = CliRunner().invoke(app, ["export", str(model_path), str(tmp_path / "m.json")])
    assert res.exit_code == 0, res.output
    X = m.transform(table)[m.features].to_numpy(float)
    got = xgb.Booster(model_file=str(tmp_path / "m.json")).predict(xgb.DMatrix(X, missing=np.nan,
                                                                              feature_names=m.features))
    np.testing.assert_allclose(got, preds["probability_1"], atol=1e-5)
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    imp = result["training"]["importance"]  # feature importance by gain, pooled and per site
    assert imp["pooled"] == pytest.approx(xgb.Booster(model_file=str(tmp_path / "m.json")).get_score(
        importance_type="total_gain"), rel=1e-5)
    assert set(imp["per_site"]) == {n.split(".")[0] for n in HEART_SITES} and imp["per_site_skipped"] is None
    assert all(set(g) == set(imp["pooled"]) for g in imp["per_site"].values())
    report = (tmp_path / "out" / "report.html").read_text()
    assert '<section id="importance">' in report and "Site " + next(iter(imp["per_site"])) in report
