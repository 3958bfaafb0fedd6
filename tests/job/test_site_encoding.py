"""A site scores its test rows as ``fedtab predict`` does (issue 30, item 1): categories it holds
in fewer than ``min_rows`` rows are encoded on its test rows as the model file encodes them.

Two sites on the local engine, no imputation (a second test imputes): ``big`` holds category
``x`` of column ``c`` often, ``small`` in 9 rows (below its floor of 10) plus 3 rows of ``w``,
which no site can list. ``x`` rows are mostly positive, so encoding them as ``(other)`` (or as
missing) at ``small`` moves its scores. The per-site Brier score (a mean over the site's test
rows of squared probability errors) and AUROC must equal those of ``predict`` on the same rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import brier_score_loss, roc_auc_score

from fedtab.engines.site_config import build_site
from fedtab.job import load_job
from fedtab.job.model_file import load_model
from fedtab.job.run import run_job, site_configs

MIN_ROWS = 10


def _table(rng, n, weights, cats):
    c = rng.choice(cats, size=n, p=weights)
    num = rng.normal(size=n)
    logit = num + np.where(c == "x", 2.5, np.where(c == "y", -0.5, 0.0))
    return pd.DataFrame({"c": c, "num": num, "target": (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)})


@pytest.fixture(scope="module")
def site_files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rare_categories")
    rng = np.random.default_rng(7)
    _table(rng, 400, [0.3, 0.4, 0.3], ["x", "y", "z"]).to_csv(d / "big.csv", index=False)
    small = _table(rng, 150, [0.5, 0.5], ["y", "z"])
    small.loc[:8, "c"] = "x"  # 9 rows of x: below the floor here, a category of its own at big
    small.loc[9:11, "c"] = "w"  # 3 rows of w: listed by no site
    small.loc[:8, "target"] = [1, 1, 1, 1, 1, 1, 1, 0, 1]
    small.to_csv(d / "small.csv", index=False)
    return d


def _doc(d: Path, **sections) -> dict:
    doc = {"target": "target", "columns": {"categorical": ["c"]},
           "sites": {n: {"path": str(d / f"{n}.csv"), "min_rows": MIN_ROWS} for n in ("big", "small")},
           "training": {"rounds": 3, "local_epochs": 3}, "run": {"seed": 2}}
    doc.update(sections)
    return doc


def _check_scores_equal_predict(doc: dict, out: Path) -> None:
    run_job(doc, out=out)
    result = json.loads((out / "result.json").read_text())
    model = load_model(out / "model.fedtab")
    ys, ps = [], []
    assert "x" in model.schema["categories"]["c"] and "w" not in model.schema["categories"]["c"]
    for config in site_configs(load_job(doc)):
        site = build_site(config)  # the same site, from its file and its seed: the same test part
        rows = site.rows("test")
        y = rows["target"].astype(int).to_numpy()
        p = model.predict_proba(rows.drop(columns=["target"]))[:, 1]
        scores = result["training"]["metrics"]["per_site"][site.name]
        assert scores["brier"] == pytest.approx(brier_score_loss(y, p), abs=1e-9), site.name
        assert scores["auroc"] == pytest.approx(roc_auc_score(y, p), abs=1e-9), site.name
        if site.name == "small":  # the case this test is about: rare categories in the scored rows
            assert rows["c"].isin(["x", "w"]).sum() >= 2, rows["c"].value_counts()
        ys.append(y)
        ps.append(p)
    # result.json: the pooled AUROC with bounds that hold the exact AUROC of predict over every test row
    pooled = result["training"]["metrics"]["pooled"]
    exact = roc_auc_score(np.concatenate(ys), np.concatenate(ps))
    lo, hi = pooled["auroc_bounds"]
    assert lo - 1e-9 <= exact <= hi + 1e-9 and lo <= pooled["auroc"] <= hi


@pytest.mark.parametrize("model", ["logistic", {"name": "gbdt", "params": {"n_trees": 4, "max_depth": 3}}])
def test_rare_categories_on_the_test_rows_are_scored_as_predict_scores_them(site_files, tmp_path, model):
    doc = _doc(site_files, training={"model": model, "rounds": 3, "local_epochs": 3})
    if isinstance(model, dict):  # plain GBDT: the sites opt in to answering over the server's tree nodes
        for site in doc["sites"].values():
            site["allow_server_row_sets"] = True
    _check_scores_equal_predict(doc, tmp_path / "plain")


@pytest.mark.slow  # imports torch and trains the imputer (one round)
def test_with_the_imputer_too(site_files, tmp_path):
    pytest.importorskip("torch")
    doc = _doc(site_files, impute={"rounds": 1, "local_epochs": 1, "hidden_dim": 8, "n_layers": 1})
    _check_scores_equal_predict(doc, tmp_path / "imputed")
