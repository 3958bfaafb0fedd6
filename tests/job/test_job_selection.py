"""``[election] tune = "cv"`` in the job (issue 22): the selection step in place of tuning,
election and training, its result sections, every step's exchanges, the per-site models in
the model file (validated on load) and ``fedtab predict --site``."""

from __future__ import annotations

import io
import json
import re
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fedtab.cli import app
from fedtab.job import JobError
from fedtab.job.model_file import ModelFileError, PredictionError, load_model
from fedtab.job.run import run_job
from fedtab.job.spec import parse_job
from tests.builders import base_rate_parts, write_csvs

ROOT = Path(__file__).resolve().parents[2]
FAST = {"rounds": 3, "local_epochs": 3}


def _shifted_files(d: Path, seed: int = 0) -> list[Path]:
    """:func:`~tests.builders.base_rate_parts` as CSV files ``s0..s2`` (a per-site intercept helps)."""
    return write_csvs(base_rate_parts(seed), d, stem="s{i}")


def _doc(paths: list[Path], out: Path, **election) -> dict:
    return {"target": "target", "sites": {p.stem: {"path": str(p)} for p in paths},
            "election": {"selector": "lasso", "tune": "cv", "grid": [0.5, 1.0], "modes": ["intercept"], **election},
            "training": dict(FAST), "run": {"out": str(out), "seed": 0}}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    d = tmp_path_factory.mktemp("cv_job")
    paths = _shifted_files(d)
    return d, paths, run_job(_doc(paths, d / "out"))


def test_the_selection_step_replaces_tuning_election_and_training(tuned):
    d, _, result = tuned
    steps = [s["step"] for s in result["steps"]]
    assert "selection" in steps and not {"tuning", "election", "training", "baselines", "all_columns"} & set(steps)
    sel = result["selection"]
    assert sel["personalisation"] == "intercept"  # the sites' base rates differ: the CV finds it
    assert sel["chosen"]["name"] in [c["name"] for c in sel["candidates"]] and sel["all_columns"]["name"] == "all columns"
    for key in ("logloss", "logloss_se", "auroc"):
        assert key in sel["chosen"] and key in sel["all_columns"]
    assert result["metrics_from"] == {"rows": "test", "trained_on": "train"}
    assert set(result["contributions"]) == {"s0", "s1", "s2"}
    for c in result["contributions"].values():
        assert {"auroc_without", "auroc_delta", "logloss_delta", "columns_only_here", "ballot_decided"} <= set(c)
    assert set(result["measured"]) == {"s0", "s1", "s2"}
    assert all("must_impute" in m and "imputed_share" in m for m in result["measured"].values())
    assert set(result["local_only"]["per_site"]) == {"s0", "s1", "s2"}
    # what the report and the commands read after a plain training is there too
    assert result["training"]["features"] == sel["features"]
    assert result["training"]["metrics"]["pooled"]["n"] == sum(m["n"] for m in
                                                                 result["training"]["metrics"]["per_site"].values())
    assert result["baselines"]["local_only"] == result["local_only"]
    if sel["freedom_degree"] is None:  # all columns won: nothing was elected
        assert result["election"] is None
    else:
        assert result["election"]["selected"] == sel["features"] and result["election"]["features"]
    saved = json.loads((d / "out" / "result.json").read_text())
    assert saved["contributions"] == result["contributions"] and saved["selection"]["chosen"] == sel["chosen"]
    html = (d / "out" / "report.html").read_text()
    assert 'id="selection"' in html and "Contribution" in html


def test_every_step_counts_its_exchanges(tuned):
    _, _, result = tuned
    rows = {s["step"]: s["exchanges"] for s in result["steps"]}
    assert rows["selection"] == FAST["rounds"] + 3  # prepare, R fits, the CV and the test evaluations
    assert rows["schema"] == 1


def test_the_model_file_holds_each_sites_model_and_predict_uses_it(tuned):
    d, paths, result = tuned
    model = load_model(d / "out" / "model.fedtab")
    assert model.personalisation == "intercept" and model.sites == ["s0", "s1", "s2"]
    table = pd.read_csv(paths[0]).drop(columns="target").head(20)
    pooled = model.predict_proba(table)
    own = {s: model.predict_proba(table, s) for s in model.sites}
    assert not np.allclose(own["s0"], own["s2"]) and not np.allclose(own["s0"], pooled)
    # site s0 has the highest base rate: its shift raises the positive class's probability
    assert (own["s0"][:, 1] > own["s2"][:, 1]).all()
    np.testing.assert_allclose(own["s1"].sum(axis=1), 1.0, atol=1e-12)
    with pytest.raises(PredictionError, match="unknown site 'elsewhere'.*s0, s1, s2"):
        model.predict_proba(table, "elsewhere")
    runner = CliRunner()
    csv = d / "rows.csv"
    table.to_csv(csv, index=False)
    got = runner.invoke(app, ["predict", str(d / "out" / "model.fedtab"), str(csv), "--site", "s2"])
    assert got.exit_code == 0, got.output
    printed = pd.read_csv(io.StringIO(got.stdout))
    np.testing.assert_allclose(printed["probability_1"], own["s2"][:, 1], rtol=1e-9)
    plain = pd.read_csv(io.StringIO(runner.invoke(app, ["predict", str(d / "out" / "model.fedtab"), str(csv)]).stdout))
    np.testing.assert_allclose(plain["probability_1"], pooled[:, 1], rtol=1e-9)
    bad = runner.invoke(app, ["predict", str(d / "out" / "model.fedtab"), str(csv), "--site", "nowhere"])
    assert bad.exit_code == 2 and "s0, s1, s2" in bad.output


def _rewrite(src: Path, dst: Path, edit) -> Path:
    """Copy a model file, letting ``edit(manifest, arrays)`` change it (a hostile author)."""
    with zipfile.ZipFile(src) as zf:
        manifest = json.loads(zf.read("manifest.json"))
        arrays = {n[len("arrays/"):-len(".npy")]: np.load(io.BytesIO(zf.read(n)), allow_pickle=False)
                  for n in zf.namelist() if n.startswith("arrays/")}
    edit(manifest, arrays)
    manifest["arrays"] = {k: {"shape": list(a.shape), "dtype": a.dtype.str} for k, a in arrays.items()}
    with zipfile.ZipFile(dst, "w") as zf:
        zf.writestr("manifest.json", json.dumps(manifest))
        for k, a in arrays.items():
            buf = io.BytesIO()
            np.save(buf, a, allow_pickle=False)
            zf.writestr(f"arrays/{k}.npy", buf.getvalue())
    return dst


def _drop_site_array(m, a):
    del a["personal/1/shift"]


def _extra_array(m, a):
    a["personal/9/shift"] = np.zeros(1)


def _wrong_shape(m, a):
    a["personal/0/shift"] = np.zeros(3)


def _no_personalisation(m, a):
    del m["personalisation"]


def _unknown_mode(m, a):
    m["personalisation"]["mode"] = "finetune:-1"


def _duplicate_sites(m, a):
    m["personalisation"]["sites"] = ["s0", "s0", "s2"]


def _int_shift(m, a):
    a["personal/0/shift"] = np.zeros(1, dtype=np.int64)


def _mode_needs_coefficients(m, a):
    m["personalisation"]["mode"] = "local"


def _non_finite(m, a):
    a["personal/2/shift"] = np.array([np.inf])


@pytest.mark.parametrize("edit", [_drop_site_array, _extra_array, _wrong_shape, _no_personalisation, _unknown_mode,
                                  _duplicate_sites, _int_shift, _mode_needs_coefficients, _non_finite])
def test_a_hostile_personalisation_fails_to_load(tuned, tmp_path, edit):
    d, _, _ = tuned
    bad = _rewrite(d / "out" / "model.fedtab", tmp_path / "bad.fedtab", edit)
    with pytest.raises(ModelFileError):
        load_model(bad)


def test_a_model_without_per_site_models_refuses_a_site(tuned, tmp_path):
    d, paths, _ = tuned
    doc = _doc(paths, tmp_path / "plain")
    doc["election"] = {"freedom_degree": 1.0}
    run_job(doc)
    model = load_model(tmp_path / "plain" / "model.fedtab")
    assert model.sites == [] and model.personalisation is None
    with pytest.raises(PredictionError, match="no per-site models"):
        model.predict_proba(pd.read_csv(paths[0]).drop(columns="target"), "s0")


@pytest.mark.parametrize("change, message", [
    ({"privacy": {"secure_aggregation": True}, "schema": {"profile": False}, "evaluation": {"baselines": False}},
     r"tune = \"cv\" cannot run with \[privacy\] secure_aggregation"),
    ({"privacy": {"dp": {"epsilon": 8.0, "bounds": [-5.0, 5.0]}}, "schema": {"profile": False},
      "evaluation": {"baselines": False}}, r"cannot run with \[privacy\] dp"),
    ({"trust": {"robust": True}}, r"cannot run with \[trust\] robust"),
    ({"training": {"model": "gnb"}}, "trains logistic regression"),
    ({"training": None}, "needs the training step"),
    ({"election": {"tune": "cv", "modes": ["sometimes"]}}, "modes: unknown personalisation 'sometimes'"),
    ({"election": {"tune": "cv", "modes": "intercept"}}, "modes must be a list of strings"),
    ({"election": {"tune": "cv", "l2_grid": [-1.0]}}, "l2_grid must be non-negative"),
    ({"election": {"tune": "grid", "modes": ["intercept"]}}, "modes and l2_grid apply to tune"),
    ({"election": {"tune": "cv", "freedom_degree": 0.5}}, "either tune or freedom_degree"),
])
def test_impossible_cv_settings_are_refused_when_the_job_is_read(tmp_path, change, message):
    doc = {"target": "y", "sites": {"a": {"path": "a.csv"}, "b": {"path": "b.csv"}},
           "election": {"tune": "cv"}}
    for key, value in change.items():
        doc[key] = value
    with pytest.raises(JobError, match=message):
        parse_job(doc, tmp_path)


def test_grid_tuning_still_runs_through_its_own_steps(tmp_path):
    paths = _shifted_files(tmp_path)
    doc = _doc(paths, tmp_path / "grid")
    doc["election"] = {"selector": "lasso", "tune": "grid", "grid": [0.5, 1.0], "refine_step": 0}
    doc["training"] = {"rounds": 1, "local_epochs": 1}
    result = run_job(doc)
    steps = [s["step"] for s in result["steps"]]
    assert "tuning" in steps and "election" in steps and "training" in steps and "selection" not in steps
    assert result["selection"] is None and all(isinstance(s["exchanges"], int) and s["exchanges"] >= 0
                                               for s in result["steps"])


@pytest.mark.slow
def test_the_docs_tuned_job_takes_at_most_45_exchanges(tmp_path):
    """docs/job.md's job with tune = "cv": 10 imputation rounds and 10 training rounds (a tiny
    network and one local epoch: the exchanges do not depend on them)."""
    pytest.importorskip("torch")
    from fedtab.data.example_sites import HEART_SITES, write_heart_sites

    text = (ROOT / "docs" / "job.md").read_text()
    block = re.search(r"```toml\n(target = \"disease\".*?)```", text, re.S).group(1)
    write_heart_sites(tmp_path, rows=150)
    doc = tomllib.loads(block)
    assert doc["impute"]["rounds"] == 10 and doc["training"]["rounds"] == 10
    doc["election"] = {"selector": "lasso", "tune": "cv", "grid": [0.5, 1.0], "modes": ["intercept"]}
    doc["impute"].update({"local_epochs": 1, "hidden_dim": 8, "n_layers": 1, "max_steps_per_round": 1})
    doc["training"]["local_epochs"] = 1
    doc["sites"] = {n.split(".")[0]: {"path": str(tmp_path / n), "min_rows": 4} for n in HEART_SITES}
    doc["run"]["out"] = str(tmp_path / "out")
    result = run_job(doc)
    per_step = {s["step"]: s["exchanges"] for s in result["steps"]}
    assert per_step["selection"] == 13
    assert sum(per_step.values()) <= 45, per_step


def test_the_report_section_escapes_site_and_column_names(tuned):
    from fedtab.report.selection import selection_section

    _, _, result = tuned
    hostile = json.loads(json.dumps(result).replace('"s1"', '"<script>x</script>"').replace('"f2"', '"<b onmouseover=1>"'))
    html = selection_section(hostile)
    assert "<script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    assert "<b onmouseover" not in html
    assert 'src="data:image/png;base64,' in html  # the contribution plot is inline
    assert "± " in html and "all columns" in html
    assert "No cross-validated model selection" in selection_section({})


def test_fedtab_elect_refuses_tune_cv_with_one_line(tuned):
    _, paths, _ = tuned
    got = CliRunner().invoke(app, ["elect", *map(str, paths), "--target", "target", "--tune", "cv"])
    assert got.exit_code == 2 and "fedtab run" in got.output and "Traceback" not in got.output


@pytest.mark.parametrize("grid", [[1.0], [0.0]])
def test_fedtab_run_of_a_cv_job_prints_its_summary(tmp_path, grid):
    paths = _shifted_files(tmp_path)
    sites = "\n".join(f'[sites.{p.stem}]\npath = "{p.name}"' for p in paths)
    (tmp_path / "job.toml").write_text(f'target = "target"\n{sites}\n[election]\ntune = "cv"\ngrid = {grid}\n'
                                       'modes = ["intercept"]\ncontributions = false\n'
                                       '[training]\nrounds = 1\nlocal_epochs = 1\n')
    got = CliRunner().invoke(app, ["run", str(tmp_path / "job.toml")])
    assert got.exit_code == 0, got.output
    assert "test rows" in got.output and (tmp_path / "run-out" / "model.fedtab").is_file()
    result = json.loads((tmp_path / "run-out" / "result.json").read_text())
    assert result["contributions"] == {} and result["selection"]["features"]


def test_a_one_class_site_abstains_and_the_cv_job_goes_on(tmp_path):
    """Issue 30 item 2: the job names the site in result.json and the report, and finishes."""
    parts = base_rate_parts(1)
    parts.append(parts[0].assign(target=1).iloc[:120])  # a fourth site holding one class
    paths = write_csvs(parts, tmp_path, stem="s{i}")
    result = run_job(_doc(paths, tmp_path / "out", modes=["none"], contributions=False))
    abst = result["selection"]["abstentions"]
    assert "s3" in abst and any("casts no ballot" in n for n in abst["s3"])
    html = (tmp_path / "out" / "report.html").read_text()
    assert "What each site abstained from" in html and "⚠ abstained" in html
    rule = result["selection"]["rule"]["columns"]
    assert rule["auroc_guard"]["tolerance"] == 0.01 and rule["auroc_guard"]["chosen_auroc"] is not None
    assert rule["auroc_guard"]["shortfall"] <= 0.01 + 1e-12


def test_the_verdict_says_when_the_guard_set_the_sparse_choice_aside(tuned):
    from fedtab.report.selection import selection_section
    from fedtab.report.verdict import verdict

    _, _, result = tuned
    edited = json.loads(json.dumps(result))
    guard = edited["selection"]["rule"]["columns"]["auroc_guard"]
    if not guard["passed_over"] and guard["shortfall"] <= 0.01:
        assert "⚠ selection" not in re.sub(r"<[^>]+>", "", verdict(result))
    guard.update({"rule_choice": "fd=0.1", "rule_auroc": 0.794, "best": "all columns", "best_auroc": 0.82,
                  "chosen_auroc": 0.815, "shortfall": 0.005, "passed_over": ["fd=0.1"]})
    text = re.sub(r"<[^>]+>", "", verdict(edited))
    assert "⚠ selection" in text and "fd=0.1" in text and "0.794" in text and "0.820" in text
    assert "one-standard-error rule alone" in selection_section(edited)
    guard.update({"passed_over": [], "shortfall": 0.03, "chosen_auroc": 0.79})  # a choice that trades ranking
    text = re.sub(r"<[^>]+>", "", verdict(edited))
    assert "traded ranking for fewer columns" in text and "0.030" in text
