"""Issue 24: ``predict`` after a job that imputes fills cells exactly as the job's sites filled theirs.

An integer-coded column (``thal`` in {3, 6, 7}) takes a value of its agreed set, a missing category
(``cp`` declared categorical) exactly one category, and the probabilities equal the model applied to
the site's own filled table (the job's evaluation path). Also: a model file whose value sets or
one-category groups are hostile is refused with :class:`ModelFileError`.
"""

from __future__ import annotations

import json
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedtab.data.example_sites import write_heart_sites
from fedtab.job import load_job
from fedtab.job.model_file import ModelFileError, PredictionWarning, load_model, write_model

SITES = {"cleveland": "cleveland.csv", "hungarian": "hungarian.parquet", "va": "va.csv"}
GAPS = [0, 1, 2, 5, 6]  # cleveland rows whose cp and thal are removed


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """``(model file, cleveland's rows as given, cleveland's filled table after the job)``."""
    pytest.importorskip("torch")
    from fedtab.engines.local import LocalFederation
    from fedtab.engines.site_config import build_site
    from fedtab.job.run import site_configs
    from fedtab.job.workflow import run_workflow

    d = tmp_path_factory.mktemp("heart")
    write_heart_sites(d, rows=150)
    rows = pd.read_csv(d / "cleveland.csv", na_values=["?"])
    rows.loc[GAPS, ["cp", "thal"]] = np.nan
    rows.to_csv(d / "cleveland.csv", index=False, na_rep="?")
    doc = {"target": "disease", "na_values": ["?"], "columns": {"categorical": ["cp"]},
           "sites": {n: {"path": str(d / f), "min_rows": 4} for n, f in SITES.items()},
           "impute": {"rounds": 1, "local_epochs": 1, "hidden_dim": 8, "n_layers": 1},
           "training": {"rounds": 1, "local_epochs": 1}, "run": {"out": str(d / "out")}}
    sites = [build_site(c) for c in site_configs(load_job(doc))]
    out = run_workflow(LocalFederation(sites), load_job(doc))
    path = write_model(d / "model.fedtab", out.result["model"], {"job": {"na_values": ["?"]}})
    return path, rows.drop(columns="disease"), sites[0].table


@pytest.mark.slow  # the module fixture imports torch and runs a job with one imputation round
def test_predict_imputes_codes_and_categories_as_the_job_did(job):
    path, rows, filled = job
    m = load_model(path)
    levels = m.manifest["imputer"]["levels"]
    assert set(levels["thal"]) <= {3.0, 6.0, 7.0} and m.manifest["imputer"]["groups"]
    gaps = rows.loc[GAPS]
    with pytest.warns(PredictionWarning, match=r"filled 10 missing cell\(s\) of 5 row\(s\) with the model's imputer"):
        proba = m.predict_proba(gaps)
    seen = m.transform(gaps)
    assert set(seen["thal"]) <= set(levels["thal"])  # never 4.0 or 5.0
    cp = seen[[c for c in seen.columns if c.startswith("cp=")]]
    assert (cp.sum(axis=1) == 1).all() and set(np.unique(cp)) <= {0.0, 1.0}  # one category, not all zeros
    site = filled.loc[GAPS, seen.columns]
    np.testing.assert_allclose(seen.to_numpy(), site.to_numpy(), rtol=1e-5, atol=1e-6)
    # the job's evaluation path: the federated model on the site's filled table, standardised as in training
    from fedtab.learn.models import make_model

    a = m.arrays
    Z = (filled.loc[GAPS, m.features].to_numpy(np.float64) - a["standardise/mean"]) / a["standardise/std"]
    params = {k[len("model/"):]: v for k, v in a.items() if k.startswith("model/")}
    np.testing.assert_allclose(proba, make_model(m.manifest["model"]).predict_proba(params, Z), atol=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PredictionWarning)
        np.testing.assert_allclose(m.to_sklearn().predict_proba(gaps), proba, atol=1e-9)
    found = m.check(gaps)
    assert found.uncoded == {} and found.filled == {"cp": 5, "thal": 5}


def _rewrite(good: Path, out: Path, edit) -> Path:
    with zipfile.ZipFile(good) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    manifest = json.loads(members["manifest.json"])
    edit(manifest["imputer"])
    members["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile(out, "w") as zf:
        for n, b in members.items():
            zf.writestr(n, b)
    return out


HOSTILE = {
    "levels_unknown_column": (lambda im: im["levels"].update(nowhere=[1.0]), "imputer levels"),
    "levels_empty": (lambda im: im["levels"].update(thal=[]), "imputer levels"),
    "levels_text": (lambda im: im["levels"].update(thal=["3", "7"]), "imputer levels"),
    "levels_bool": (lambda im: im["levels"].update(thal=[True]), "imputer levels"),
    "levels_not_object": (lambda im: im.update(levels=[1, 2]), "imputer levels"),
    "group_of_one": (lambda im: im["groups"].append([im["columns"][0]]), "imputer groups"),
    "group_unknown_column": (lambda im: im["groups"].append(["cp=1", "nowhere"]), "imputer groups"),
    "group_repeated_column": (lambda im: im["groups"].append(["age", "age"]), "imputer groups"),
    "groups_overlap": (lambda im: im["groups"].append(list(im["groups"][0])), "imputer groups overlap"),
    "groups_not_list": (lambda im: im.update(groups={"a": 1}), "imputer groups"),
}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_a_hostile_value_set_or_group_is_a_model_file_error(attack, job, tmp_path):
    edit, message = HOSTILE[attack]
    bad = _rewrite(job[0], tmp_path / f"{attack}.fedtab", edit)
    with pytest.raises(ModelFileError, match=message) as info:
        load_model(bad)
    assert str(bad) in str(info.value) and "\n" not in str(info.value)


def test_a_model_file_without_value_sets_reads_as_before(job, tmp_path):
    """Files written before the value sets were stored: no levels, no groups, still valid."""
    def drop(im: dict) -> None:
        im.pop("levels"), im.pop("groups")
    m = load_model(_rewrite(job[0], tmp_path / "old.fedtab", drop))
    assert m.has_imputer and m.features == load_model(job[0]).features


@pytest.mark.slow  # a fresh interpreter imports torch
def test_predict_in_a_fresh_process_imports_no_torch_and_leaves_no_file(job, tmp_path):
    """``fedtab predict`` with an imputer that fills cells: the same probabilities as in-process,
    neither torch nor torch_geometric imported (the imputer's network runs in numpy; torch's
    import was most of the command's time), and nothing left in the temporary folder
    (torch_geometric wrote a generated module there in every process)."""
    import os
    import subprocess
    import sys

    path, rows, _ = job
    table, out, tmp = tmp_path / "rows.csv", tmp_path / "pred.csv", tmp_path / "tmp"
    rows.loc[GAPS].to_csv(table, index=False, na_rep="?")
    tmp.mkdir()
    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print('torch_geometric loaded:', 'torch_geometric' in sys.modules, "
             "'torch loaded:', 'torch' in sys.modules))\n"
             "from fedtab.cli import app\napp()")
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-c", probe, "predict", str(path), str(table), "-o", str(out)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    assert "torch_geometric loaded: False torch loaded: False" in run.stdout
    assert "filled" in run.stderr  # the imputer did run
    assert sorted(os.listdir(tmp)) == []
    got = pd.read_csv(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PredictionWarning)
        proba = load_model(path).predict_proba(pd.read_csv(table, na_values=["?"]))
    np.testing.assert_allclose(got.filter(like="probability_").to_numpy(), proba, rtol=1e-12, atol=1e-15)
