"""Every target type end to end (issue 30 item 3): regression and multiclass jobs with linear and
GBDT models, the one-line refusal of a model that cannot serve the task, quantile-stratified parts,
pooled regression scores equal to the pooled rows' scores, and a site without a test part named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation.site.parts import check_parts, draw_parts
from fedtab.federation.site.core import Site
from fedtab.federation.workflows.training import run_training
from fedtab.job.model_file import load_model
from fedtab.job.run import run_job
from fedtab.job.spec import JobError
from fedtab.learn.metrics import regression_scores, regression_sums
from fedtab.learn.tasks import target_kind

OPEN = {"allow_server_row_sets": True}


def _regression_tables(seed: int = 0, sizes=(120, 90, 80)) -> list[pd.DataFrame]:
    rng = np.random.default_rng(seed)
    out = []
    for n, shift in zip(sizes, (0.0, 0.3, -0.3)):
        X = rng.normal(size=(n, 4))
        y = 2 * X[:, 0] - X[:, 1] + 0.5 * X[:, 2] + 3 + shift + rng.normal(scale=0.5, size=n)
        f = pd.DataFrame(X, columns=[f"f{j}" for j in range(4)])
        f["y"] = np.round(y, 3)
        out.append(f)
    return out


def _write(tables, d: Path, target: str, model, **extra) -> dict:
    sites = {}
    for i, t in enumerate(tables):
        t.to_csv(d / f"s{i}.csv", index=False)
        sites[f"s{i}"] = {"path": str(d / f"s{i}.csv"), "allow_server_row_sets": True}
    return {"target": target, "sites": sites, "training": {"model": model, **extra}, "run": {"out": str(d / "out")}}


def test_target_kind_reads_numbers_with_many_values_as_continuous():
    assert target_kind(np.arange(79) % 79 + 1.0) == "regression"  # length of stay: 79 integer values
    assert target_kind(np.array([0.5, 1.25, 3.0, 2.0])) == "regression"
    assert target_kind(np.array([0, 1, 2, 1, 0])) == "classes"
    assert target_kind(np.array(["a", "b"] * 30)) == "classes"


def test_quantile_parts_span_the_target_and_keep_the_floors():
    v = np.random.default_rng(3).gamma(2.0, 3.0, size=200)
    parts = draw_parts(200, None, test_size=0.2, folds=5, min_rows=10, seed=1, values=v)
    assert check_parts(parts, None, 10) == []
    assert 30 <= len(parts.test) <= 50 and parts.n_folds == 5
    q = np.quantile(v, [0.1, 0.9])  # both tails are in the test part and in every fold
    for rows in (parts.test, *parts.folds):
        assert (v[rows] < q[0]).any() and (v[rows] > q[1]).any()
    tiny = draw_parts(15, None, test_size=0.2, folds=5, min_rows=10, seed=1, values=v[:15])
    assert len(tiny.test) == 0 and tiny.n_folds == 0  # no atom below the floor


def test_linear_regression_equals_pooled_least_squares_and_scores_pool_exactly():
    tables = _regression_tables()
    sites = [Site(f"s{i}", t, "y", policy=OPEN, seed=i) for i, t in enumerate(tables)]
    assert all(s.target_kind == "regression" for s in sites)
    tr = run_training(LocalFederation(sites), model="linear")
    assert tr.task == "regression" and tr.classes == []
    # the same model least squares fits on every site's training rows together
    Xtr = np.vstack([s.rows("train")[[f"f{j}" for j in range(4)]].to_numpy() for s in sites])
    ytr = np.concatenate([s.rows("train")["y"].to_numpy() for s in sites])
    A = np.hstack([np.ones((len(ytr), 1)), Xtr])
    w = np.linalg.lstsq(A, ytr, rcond=None)[0]
    Xte = np.vstack([s.rows("test")[[f"f{j}" for j in range(4)]].to_numpy() for s in sites])
    yte = np.concatenate([s.rows("test")["y"].to_numpy() for s in sites])
    pred = np.hstack([np.ones((len(yte), 1)), Xte]) @ w
    s = regression_sums(yte, pred)
    want = regression_scores(s["sse"], s["sae"], s["sum_y"], s["sum_y2"], len(yte))
    got = tr.metrics["pooled"]
    for k in ("rmse", "mae", "r2"):
        assert got[k] == pytest.approx(want[k], rel=1e-6)
    assert got["n"] == len(yte) and set(tr.metrics["per_site"]) == {"s0", "s1", "s2"}
    assert got["r2"] > 0.9


def test_secure_sums_give_the_same_pooled_regression_scores():
    from fedtab.federation.protocol import set_options

    tables = _regression_tables(1)
    plain = run_training(LocalFederation([Site(f"s{i}", t, "y", policy=OPEN, seed=i) for i, t in enumerate(tables)]),
                         model="linear")
    fed = LocalFederation([Site(f"s{i}", t, "y", policy=OPEN, seed=i) for i, t in enumerate(tables)])
    set_options(fed, secure_aggregation=True)
    sec = run_training(fed, model="linear")
    assert sec.metrics["per_site"] == {}
    for k in ("rmse", "mae", "r2"):
        assert sec.metrics["pooled"][k] == pytest.approx(plain.metrics["pooled"][k], rel=1e-5)


def test_a_classifier_on_a_continuous_target_is_refused_in_one_line():
    tables = _regression_tables(2)
    fed = LocalFederation([Site(f"s{i}", t, "y", policy=OPEN, seed=i) for i, t in enumerate(tables)])
    with pytest.raises(ValueError) as err:
        run_training(fed, model="logistic")
    assert "\n" not in str(err.value) and "'logistic' predicts classes" in str(err.value) and "linear" in str(err.value)
    with pytest.raises(ValueError, match="objective = 'binary' predicts classes"):
        run_training(fed, model={"name": "gbdt", "params": {"objective": "binary"}})


def test_the_job_refuses_a_task_its_model_cannot_serve_when_read(tmp_path):
    doc = _write(_regression_tables(), tmp_path, "y", "logistic", task="regression")
    with pytest.raises(JobError, match="predicts classes"):
        run_job(doc, engine="local", out=tmp_path / "out")
    doc = _write(_regression_tables(), tmp_path, "y", "linear", task="binary")
    with pytest.raises(JobError, match="predicts a number"):
        run_job(doc, engine="local", out=tmp_path / "out")


@pytest.mark.parametrize("model", ["linear", {"name": "gbdt", "params": {"n_trees": 15, "max_depth": 3}}])
def test_a_regression_job_runs_end_to_end_and_predict_scores_numbers(tmp_path, model):
    from typer.testing import CliRunner

    from fedtab.cli import app

    tables = _regression_tables()
    res = run_job(_write(tables, tmp_path, "y", model), engine="local", out=tmp_path / "out")
    tr = res["training"]
    assert tr["task"] == "regression" and tr["classes"] == []
    pooled = tr["metrics"]["pooled"]
    assert pooled["rmse"] < 1.2 and pooled["r2"] > 0.7 and pooled["n"] > 0
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    assert saved["training"]["metrics"]["pooled"]["rmse"] == pytest.approx(pooled["rmse"])
    assert "Regression: RMSE" in (tmp_path / "out" / "report.html").read_text()
    m = load_model(tmp_path / "out" / "model.fedtab")
    pred = m.predict(tables[0])
    assert pred.dtype.kind == "f" and np.isfinite(pred).all()
    assert np.sqrt(np.mean((pred - tables[0]["y"]) ** 2)) < 1.5
    out = CliRunner().invoke(app, ["predict", str(tmp_path / "out" / "model.fedtab"), str(tmp_path / "s0.csv"),
                                   "--out", str(tmp_path / "p.csv")])
    assert out.exit_code == 0, out.output
    assert "y: RMSE" in out.output and "R²" in out.output
    written = pd.read_csv(tmp_path / "p.csv")
    np.testing.assert_allclose(written["prediction"], pred, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("model", ["logistic", {"name": "gbdt", "params": {"n_trees": 10, "max_depth": 3}}])
def test_a_multiclass_job_runs_end_to_end(tmp_path, model):
    rng = np.random.default_rng(5)
    tables = []
    for n in (150, 120, 110):
        X = rng.normal(size=(n, 3))
        cls = np.argmax(X @ np.array([[2, -1, 0], [0, 2, -1], [-1, 0, 2]]) + rng.normal(scale=0.3, size=(n, 3)), 1)
        f = pd.DataFrame(X, columns=["a", "b", "c"])
        f["kind"] = np.array(["x", "y", "z"])[cls]
        tables.append(f)
    res = run_job(_write(tables, tmp_path, "kind", model, rounds=2, local_epochs=2), engine="local",
                  out=tmp_path / "out")
    tr = res["training"]
    assert tr["task"] == "multiclass" and tr["classes"] == ["x", "y", "z"]
    assert tr["metrics"]["pooled"]["accuracy"] > 0.6


def test_a_site_without_a_test_part_is_named_with_why(tmp_path):
    tables = _regression_tables(4, sizes=(120, 90, 14))  # 14 rows: no test share of min_rows=10 rows
    res = run_job(_write(tables, tmp_path, "y", "linear"), engine="local", out=tmp_path / "out")
    assert "no test part" in res["sites"]["s2"]["no_test"]
    assert set(res["training"]["metrics"]["per_site"]) == {"s0", "s1"}
    html = (tmp_path / "out" / "report.html").read_text()
    assert "(2 of 3 sites evaluated)" in html and "s2: not evaluated" in html
