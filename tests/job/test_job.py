"""The consortium job: job files, the run on three engines, the model file, predict.

Site files: UCI Heart (Cleveland) split into cleveland.csv / hungarian.parquet / va.csv with
different columns per site, `?` for missing cells and three unlabelled rows in va.csv
(fedtab.data.example_sites). Every setting is tiny: Flower and FLARE cost seconds per exchange.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fedtab.cli import app
from fedtab.data.example_sites import HEART_SITES, write_heart_sites
from fedtab.job import JobError, load_job
from fedtab.job.model_file import ModelFileError, PredictionError, load_model
from fedtab.job.run import run_job

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

TINY_IMPUTE = {"rounds": 2, "local_epochs": 1, "hidden_dim": 8, "n_layers": 1}


def _job(d: Path, **sections) -> dict:
    # tiny sites (45-60 rows of 150): a floor of 4 rows lets every one be evaluated
    doc = {"target": "disease", "na_values": ["?"],
           "sites": {n.split(".")[0]: {"path": str(d / n), "min_rows": 4} for n in HEART_SITES},
           "training": {"rounds": 2, "local_epochs": 2}, "run": {"out": str(d / "out")}}
    doc.update(sections)
    return doc


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("heart_sites")
    write_heart_sites(d, rows=150)
    return d


def _engines_job(sites: Path) -> dict:
    return _job(sites, impute=TINY_IMPUTE, election={"freedom_degree": 0.5})


@pytest.fixture(scope="module")
def local_run(sites, tmp_path_factory) -> tuple[dict, Path]:
    """``(result, run directory)`` of the job with imputation and an election on the local engine."""
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("run_local")
    return run_job(_engines_job(sites), engine="local", out=d), d


@pytest.fixture(scope="module")
def engines_run(local_run, sites, tmp_path_factory) -> dict:
    """The same job on Flower's and FLARE's simulators too (one run each), by engine name."""
    out = {"local": local_run}
    for engine, module in (("flower", "flwr"), ("nvflare", "nvflare")):
        pytest.importorskip(module)
        d = tmp_path_factory.mktemp(f"run_{engine}")
        out[engine] = (run_job(_engines_job(sites), engine=engine, out=d), d)
    return out


@pytest.mark.slow
def test_the_job_gives_the_same_columns_and_predictions_on_every_engine(engines_run, sites):
    table = pd.read_csv(sites / "va.csv", na_values=["?"])
    ref_result, ref_dir = engines_run["local"]
    ref = load_model(ref_dir / "model.fedtab").predict_proba(table)
    for engine, (result, d) in engines_run.items():
        assert result["engine"] == engine
        assert result["election"]["selected"] == ref_result["election"]["selected"], engine
        np.testing.assert_allclose(load_model(d / "model.fedtab").predict_proba(table), ref, atol=1e-6, rtol=0)
        pooled, ref_pooled = result["training"]["metrics"]["pooled"], ref_result["training"]["metrics"]["pooled"]
        for key in ("weighted_f1", "accuracy", "auroc", "brier"):
            assert pooled[key] == pytest.approx(ref_pooled[key], abs=1e-9), (engine, key)
        assert result["baselines"]["local_only"]["pooled"]["accuracy"] == pytest.approx(
            ref_result["baselines"]["local_only"]["pooled"]["accuracy"], abs=1e-9)
        # FedHF-Impute on each engine: the same columns, training curve and validation error
        imp, ref_imp = result["imputation"], ref_result["imputation"]
        assert imp["columns"] == ref_imp["columns"], engine
        assert [h["train_loss"] for h in imp["training_curve"]] == pytest.approx(
            [h["train_loss"] for h in ref_imp["training_curve"]], rel=1e-5), engine
        assert imp["validation"]["overall"] == pytest.approx(ref_imp["validation"]["overall"], rel=1e-5), engine


def test_steps_run_in_order_and_the_label_is_neither_imputed_nor_an_input(local_run):
    result, d = local_run
    assert [s["step"] for s in result["steps"]] == ["schema", "imputation", "election", "training", "baselines"]
    assert "disease" not in result["imputation"]["columns"]
    assert "disease" not in result["schema"]["columns"]
    va = result["sites"]["va"]
    assert va["dropped_unlabelled"] == 3 and va["n_rows"] == va["n_train"] + va["n_test"] + 3
    assert va["unavailable_columns"] == ["chol", "slope"]
    assert json.loads((d / "result.json").read_text())["election"] == result["election"]
    # a site ballots on the columns it measures, not on values its imputer derived for a column it lacks
    # (va lacks chol and slope, hungarian ca and thal): imputation gives them values, not votes
    held = {f["feature"]: f["held_by"] for f in result["election"]["features"]}
    lacking = {c: sum(c in s["unavailable_columns"] for s in result["sites"].values()) for c in held}
    assert held == {c: 3 - lacking[c] for c in held} and lacking["chol"] == lacking["slope"] == 1
    imp = result["imputation"]["validation"]
    assert set(imp["per_column_mean_fill"]) == set(imp["per_column"]) == set(result["imputation"]["columns"])


def test_report_html_is_written_with_its_sections(local_run):
    from html.parser import HTMLParser

    from fedtab.report import SECTIONS

    _, d = local_run
    ids, external = [], []

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "section":
                ids.append(a.get("id"))
            for k in ("src", "href"):
                if a.get(k) and not a[k].startswith(("#", "data:")):
                    external.append(a[k])

    Collect().feed((d / "report.html").read_text())
    assert ids == list(SECTIONS) and not external
    text = (d / "report.html").read_text()
    assert "hungarian" in text and "chol" in text


def test_imputed_values_stay_in_range_and_integer_columns_stay_integer(local_run, sites):
    result, d = local_run
    model = load_model(d / "model.fedtab")
    raw = pd.read_csv(sites / "va.csv", na_values=["?"])
    filled = model.transform(raw)
    assert not filled.isna().any().any() and list(filled.index) == list(raw.index)
    for c, (low, high) in result["schema"]["ranges"].items():  # imputed cells, within the coarse pooled range
        imputed = raw[c].isna() if c in raw else pd.Series(True, index=raw.index)
        assert filled.loc[imputed, c].between(low, high).all(), c
    for c in result["schema"]["integer_columns"]:
        assert (filled[c] == filled[c].round()).all(), c
    observed = raw.drop(columns="disease").notna()
    for c in observed.columns:  # observed cells are kept exactly
        assert (filled.loc[observed[c], c] == raw.loc[observed[c], c]).all(), c
    assert set(filled["sex"]) <= {0.0, 1.0}


def test_the_election_consensus_of_a_job_file_reaches_the_election(sites, tmp_path):
    runs = {}
    for consensus, alpha in (("intersection", 0.05), ("stouffer", 0.05), ("stouffer", 0.6)):
        job = _job(sites, election={"selector": "anova", "freedom_degree": 0.0, "consensus": consensus,
                                    "consensus_alpha": alpha}, training={"rounds": 1, "local_epochs": 1},
                   run={"out": str(tmp_path / f"{consensus}{alpha}")})
        runs[consensus, alpha] = run_job(job, engine="local")["election"]["selected"]
    assert len({tuple(v) for v in runs.values()}) == 3, runs  # each setting elected a different mask
    assert set(runs["stouffer", 0.05]) < set(runs["stouffer", 0.6])  # a looser FDR keeps more


def test_the_issues_example_job_file_runs_as_written(sites, tmp_path):
    """docs/job.md's job block is the issue's example, byte for byte; it runs on small site files."""
    text = (ROOT / "docs" / "job.md").read_text()
    block = re.search(r"```toml\n(target = \"disease\".*?)```", text, re.S).group(1)
    assert 'tune = "grid"                     # or freedom_degree = 0.5' in block
    for name in HEART_SITES:
        (tmp_path / name).write_bytes((sites / name).read_bytes())
    (tmp_path / "job.toml").write_text(block)
    doc = tomllib.loads(block)
    doc["impute"].update(TINY_IMPUTE)  # same file, fewer rounds: the test's time budget
    doc["training"]["rounds"] = 2
    fast = tmp_path / "fast.toml"
    fast.write_text(_toml(doc))
    assert load_job(tmp_path / "job.toml").run.out == tmp_path / "run-out"
    result = run_job(fast)
    assert (tmp_path / "run-out" / "model.fedtab").is_file() and (tmp_path / "run-out" / "result.json").is_file()
    assert [s["step"] for s in result["steps"]] == ["schema", "imputation", "tuning", "election", "training",
                                                    "baselines"]
    assert result["election"]["freedom_degree"] == result["tuning"]["freedom_degree"]


def _toml(doc: dict) -> str:
    lines = []
    for k, v in doc.items():
        if not isinstance(v, dict):
            lines.append(f"{k} = {json.dumps(v)}")
    for k, v in doc.items():
        if isinstance(v, dict):
            if k == "sites":
                for name, site in v.items():
                    lines += [f"[sites.{name}]"] + [f"{a} = {json.dumps(b)}" for a, b in site.items()]
            else:
                lines += [f"[{k}]"] + [f"{a} = {json.dumps(b)}" for a, b in v.items() if b is not None]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- predict
def test_predict_keeps_rows_and_fills_missing_columns(local_run, sites, tmp_path):
    _, d = local_run
    table = pd.read_parquet(sites / "hungarian.parquet")
    read = load_model(d / "model.fedtab").reads[0]
    table = table.iloc[::-1].drop(columns=[read, "chol"])  # another order, two schema columns absent
    path = tmp_path / "new.csv"
    table.to_csv(path, index=False)
    res = runner.invoke(app, ["predict", str(d / "model.fedtab"), str(path), "--out", str(tmp_path / "p.csv")])
    assert res.exit_code == 2 and repr(read) in res.output and "--allow-missing" in res.output
    res = runner.invoke(app, ["predict", str(d / "model.fedtab"), str(path), "--out", str(tmp_path / "p.csv"),
                              "--allow-missing"])
    assert res.exit_code == 0, res.output
    assert "with the model's imputer" in res.output and "(absent)" in res.output
    preds = pd.read_csv(tmp_path / "p.csv")
    assert len(preds) == len(table)
    assert list(preds.columns) == [*table.columns, "prediction", "probability_0", "probability_1"]
    np.testing.assert_array_equal(preds["thalach"], table["thalach"])
    np.testing.assert_allclose(preds[["probability_0", "probability_1"]].sum(axis=1), 1.0)
    model = load_model(d / "model.fedtab")
    assert list(preds["prediction"]) == list(model.predict(table))


@pytest.fixture(scope="module")
def plain_model(sites, tmp_path_factory) -> Path:
    """A job without imputation (GaussianNB on elected columns): predict needs the columns."""
    d = tmp_path_factory.mktemp("plain")
    run_job(_job(sites, election={"freedom_degree": 1.0}, training={"model": "gnb"}), out=d)
    return d / "model.fedtab"


def test_predict_without_imputer_lists_missing_columns_and_names_bad_cells(plain_model, sites, tmp_path):
    model = load_model(plain_model)
    table = pd.read_csv(sites / "cleveland.csv", na_values=["?"])
    lacking = table.drop(columns=[model.features[0]])
    lacking.to_csv(tmp_path / "lacking.csv", index=False)
    res = runner.invoke(app, ["predict", str(plain_model), str(tmp_path / "lacking.csv")])
    assert res.exit_code == 2 and model.features[0] in res.output and "no imputer" in res.output
    bad = table.astype(object)
    bad.loc[4, model.features[1]] = "high"
    bad.to_csv(tmp_path / "bad.csv", index=False)
    res = runner.invoke(app, ["predict", str(plain_model), str(tmp_path / "bad.csv")])
    assert res.exit_code == 2, res.output
    assert f"column {model.features[1]!r}" in res.output and "row 5" in res.output and "Traceback" not in res.output
    with pytest.raises(PredictionError, match=re.escape(f"row 5, column {model.features[1]!r}")):
        model.predict(bad)  # rows counted from 1, as the table reader does


def test_to_sklearn_predicts_like_the_model_on_complete_rows(plain_model, local_run, sites):
    table = pd.read_csv(sites / "cleveland.csv", na_values=["?"]).dropna()
    for path in (plain_model, local_run[1] / "model.fedtab"):  # gnb, logistic
        model = load_model(path)
        pipe = model.to_sklearn()  # reads the table itself: encoding (and the imputer) included
        np.testing.assert_allclose(pipe.predict_proba(table), model.predict_proba(table), atol=1e-10)
        assert list(pipe.predict(table)) == list(model.predict(table))
    # the imputer is part of the pipeline: rows with missing cells and an absent column score alike
    gaps = pd.read_csv(sites / "va.csv", na_values=["?"]).drop(columns=["disease"])
    model = load_model(local_run[1] / "model.fedtab")
    assert gaps.isna().any().any()
    np.testing.assert_allclose(model.to_sklearn().predict_proba(gaps), model.predict_proba(gaps), atol=1e-10)


# ----------------------------------------------------------------------------- the model file as an attack surface
def _rewrite(src: Path, dst: Path, edit) -> Path:
    with zipfile.ZipFile(src) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    members = edit(members)
    with zipfile.ZipFile(dst, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return dst


def _npy(a, allow_pickle=False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=allow_pickle)
    return buf.getvalue()


def _manifest_edit(fn):
    def edit(members):
        m = json.loads(members["manifest.json"])
        fn(m, members)
        members["manifest.json"] = json.dumps(m).encode()
        return members
    return edit


@pytest.mark.parametrize("edit, fragment", [
    (lambda m: {**m, "arrays/model/theta.npy": _npy(np.array([{"x": 1}], dtype=object), allow_pickle=True)},
     "without pickle"),
    (lambda m: {**m, "../../etc/evil": b"x"}, "unexpected members"),
    (lambda m: {**m, "arrays/model/theta.npy": _npy(np.zeros((1, 3)))}, "declares"),
    (_manifest_edit(lambda m, a: (m["arrays"]["model/theta"].update(shape=[2, 10**9]),)), "limit"),
    (_manifest_edit(lambda m, a: (m["arrays"]["model/theta"].update(shape=[1, 3]),
                                  a.update({"arrays/model/theta.npy": _npy(np.zeros((1, 3)))}))), "do not match"),
    (_manifest_edit(lambda m, a: m.update(version=99)), "version"),
    (_manifest_edit(lambda m, a: m.update(model={"name": "xgboost"})), "unknown model"),
    (lambda m: {k: v for k, v in m.items() if k != "manifest.json"}, "no manifest"),
])
def test_a_tampered_model_file_is_rejected_with_a_clear_error(plain_model, tmp_path, edit, fragment):
    bad = _rewrite(plain_model, tmp_path / "bad.fedtab", edit)
    with pytest.raises(ModelFileError, match=re.escape(fragment)):
        load_model(bad)
    res = runner.invoke(app, ["predict", str(bad), str(tmp_path / "x.csv")])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_a_model_file_that_is_not_a_zip_or_a_bomb_is_rejected(plain_model, tmp_path):
    (tmp_path / "text.fedtab").write_text("hello")
    with pytest.raises(ModelFileError, match="not a zip"):
        load_model(tmp_path / "text.fedtab")

    # a member far larger than its declared shape (a zip bomb: 8 MiB of zeros compress to ~8 KiB)
    with zipfile.ZipFile(plain_model) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    members["arrays/model/theta.npy"] = _npy(np.zeros(2**20))
    with zipfile.ZipFile(tmp_path / "bomb.fedtab", "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    assert (tmp_path / "bomb.fedtab").stat().st_size < 100_000
    with pytest.raises(ModelFileError, match="limit"):
        load_model(tmp_path / "bomb.fedtab")


def test_model_file_round_trip_holds_provenance_and_no_pickle(plain_model):
    model = load_model(plain_model)
    with zipfile.ZipFile(plain_model) as zf:
        names = zf.namelist()
        for n in names:
            if n.endswith(".npy"):
                np.load(io.BytesIO(zf.read(n)), allow_pickle=False)  # raises on any pickled member
    assert names[0] == "manifest.json" and all(n.startswith("arrays/") for n in names[1:])
    assert model.provenance["fedtab_version"] and model.provenance["engine"] == "local"
    assert [s["name"] for s in model.provenance["sites"]] == ["cleveland", "hungarian", "va"]
    assert model.classes == [0, 1] and model.features == model.manifest["features"]


# ----------------------------------------------------------------------------- job-file errors
@pytest.mark.parametrize("doc, fragment", [
    ({"target": "y", "sites": {"a": {"path": "a.csv"}}, "trainig": {}}, "unknown key 'trainig' (did you mean 'training'?)"),
    ({"target": "y", "sites": {"a": {"path": "a.csv"}}, "training": {"rouds": 3}},
     "unknown key [training] 'rouds' (did you mean 'rounds'?)"),
    ({"target": "y", "sites": {"a": {"pth": "a.csv"}}}, "(did you mean 'path'?)"),
    ({"sites": {"a": {"path": "a.csv"}}}, "needs target"),
    ({"target": "y", "sites": {}}, "at least one [sites.<name>]"),
    ({"target": "y", "sites": {"a": {"path": "a.csv"}}, "training": {"rounds": "ten"}}, "[training] rounds must be an integer"),
    ({"target": "y", "sites": {"a": {"path": "a.csv"}}, "election": {"tune": "grid", "freedom_degree": 0.5}},
     "either tune or freedom_degree"),
    ({"target": "y", "sites": {"a": {"path": "a.csv"}}, "training": {"model": "xgboost"}}, "unknown model"),
    ({"target": "y", "sites": {"a": {"path": "a.csv"}}, "election": {"consensus": "majority"}}, "unknown consensus"),
    ({"target": "y", "sites": {"a": {"path": "a.csv"}}, "election": {"consensus_alpha": 2}}, "consensus_alpha"),
])
def test_job_file_errors_name_the_key(doc, fragment):
    with pytest.raises(JobError, match=re.escape(fragment)):
        load_job(doc)


def test_cli_job_errors_are_one_line(sites, tmp_path):
    res = runner.invoke(app, ["run", str(tmp_path / "nope.toml")])
    assert res.exit_code == 2 and "no such job file" in res.output
    (tmp_path / "job.toml").write_text('target = "disease"\n[sites.a]\npath = "missing.csv"\n')
    res = runner.invoke(app, ["run", str(tmp_path / "job.toml")])
    assert res.exit_code == 2 and "[sites.a] path: no such file" in res.output
    (tmp_path / "job.toml").write_text('target = "disease"\n[sites.a]\npath = "a.csv"\n[electoin]\n')
    res = runner.invoke(app, ["run", str(tmp_path / "job.toml")])
    assert res.exit_code == 2 and "did you mean 'election'" in res.output


def test_a_site_sharing_no_column_is_named(sites, tmp_path):
    pd.DataFrame({"foo": [1.0, 2.0, 3.0, 4.0, 5.0], "disease": [0, 1, 0, 1, 0]}).to_csv(tmp_path / "odd.csv", index=False)
    doc = _job(sites)
    doc["sites"]["odd"] = {"path": str(tmp_path / "odd.csv"), "min_rows": 1}
    with pytest.raises(Exception, match="site 'odd' shares no column with the other sites"):
        run_job(doc, out=tmp_path / "o")


def test_cli_run_prints_a_line_per_step_when_not_a_terminal(sites, tmp_path):
    job = tmp_path / "job.toml"
    doc = _job(sites, election={"freedom_degree": 0.5})
    doc["run"]["out"] = str(tmp_path / "out")
    job.write_text(_toml(doc))
    res = runner.invoke(app, ["run", str(job)])
    assert res.exit_code == 0, res.output
    for step in ("schema", "election", "training"):
        assert re.search(rf"\] {step}$", res.output, re.M), res.output
    assert (tmp_path / "out" / "model.fedtab").is_file()


def test_version_flag():
    from fedtab import __version__

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"fedtab {__version__}"


def test_the_step_loop_imputes_before_it_elects_and_trains(sites):
    """The one step loop (what Flower's ServerApp and FLARE's controller run) imputes first, whatever the
    order of the job's tables; the pipeline it replaced used to impute after training."""
    pytest.importorskip("torch")
    from fedtab.engines.local import LocalFederation
    from fedtab.engines.site_config import build_site
    from fedtab.job.run import site_configs
    from fedtab.job.workflow import run_workflow

    doc = {"training": {"rounds": 1, "local_epochs": 1}, "impute": {"rounds": 1, "hidden_dim": 8, "n_layers": 1},
           "election": {"freedom_degree": 0.5}}
    spec = load_job({**_job(sites), **doc})
    fed = LocalFederation([build_site(c) for c in site_configs(spec)])
    out = run_workflow(fed, spec).result
    assert [s["step"] for s in out["steps"]][:3] == ["schema", "imputation", "election"]
    assert "disease" not in out["imputation"]["columns"]
    assert out["imputation"]["imputed_cells"]["va"] > 0
    for site in fed._sites.values():
        assert not site.table.drop(columns="disease").isna().any().any(), site.name
        assert set(out["imputation"]["columns"]) <= set(site.table.columns)
    assert set(out["training"]["features"]) <= set(out["imputation"]["columns"])


def test_elect_reads_question_marks_and_writes_result_and_report(sites, tmp_path):
    files = [str(sites / n) for n in HEART_SITES]
    res = runner.invoke(app, ["elect", *files, "--target", "disease", "--na-value", "?", "--rounds", "2",
                              "--model", "gnb", "--min-rows", "4", "--out", str(tmp_path / "el")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "el" / "result.json").read_text())
    assert len(doc["election"]["features"]) == doc["stats"]["features"] == 13  # "?" cells did not make text columns
    assert doc["training"]["metrics"]["pooled"]["n"] > 0
    html = (tmp_path / "el" / "report.html").read_text()
    assert 'id="election"' in html and "va" in html


def test_impute_reads_parquet_and_writes_result_and_report(tmp_path):
    pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = pd.DataFrame(rng.normal(size=(120, 2)) @ rng.normal(size=(2, 4)), columns=list("abcd"))
    x.iloc[:60, :3].to_parquet(tmp_path / "north.parquet")
    x.iloc[60:, 1:].to_csv(tmp_path / "south.csv", index=False)
    res = runner.invoke(app, ["impute", str(tmp_path / "north.parquet"), str(tmp_path / "south.csv"), "--rounds", "1",
                              "--hidden-dim", "8", "--n-layers", "1", "--quiet", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "o" / "result.json").read_text())
    assert doc["sites"]["north"]["unavailable_columns"] == ["d"]
    assert set(doc["imputation"]["validation"]["per_column_mean_fill"]) == set("abcd")
    assert 'id="imputation"' in (tmp_path / "o" / "report.html").read_text()
    assert list(pd.read_csv(tmp_path / "o" / "north.imputed.csv").columns) == list("abcd")


# ----------------------------------------------------------------------------- an existing Flower SuperLink
HEART_SITE_NAMES = [n.split(".")[0] for n in HEART_SITES]


def _assert_same_as_local(result: dict, out: Path, local: dict, local_out: Path, sites: Path) -> None:
    """Same elected columns, predictions within 1e-6 and metrics as the local engine; a report."""
    assert result["election"]["selected"] == local["election"]["selected"]
    assert (out / "report.html").is_file()
    table = pd.read_csv(sites / "va.csv", na_values=["?"])
    np.testing.assert_allclose(load_model(out / "model.fedtab").predict_proba(table),
                               load_model(local_out / "model.fedtab").predict_proba(table), atol=1e-6, rtol=0)
    for key in ("weighted_f1", "accuracy", "auroc"):
        assert result["training"]["metrics"]["pooled"][key] == pytest.approx(
            local["training"]["metrics"]["pooled"][key], abs=1e-9)


# ``fedtab run JOB --superlink`` on a consortium's TLS + auth deployment started as the guide says
# (SuperNodes that know only their name and table) gives the local engine's columns and predictions:
# tests/engines/test_flower_guide_loopback.py, on the guide's own deployment.


def test_superlink_run_needs_the_ca_and_site_keys_of_every_job_site(sites, tmp_path):
    """Refused before anything is sent: no CA, no site keys, a key missing for a job site."""
    from fedtab.deploy.keys import write_consortium_keys

    job = _job(sites, election={"freedom_degree": 0.5})
    with pytest.raises(ValueError, match="root_certificates"):
        run_job(job, superlink="127.0.0.1:1", site_keys={})
    keys = write_consortium_keys(tmp_path / "keys", HEART_SITE_NAMES[:2])
    with pytest.raises(JobError, match="site keys"):
        run_job(job, superlink="127.0.0.1:1", root_certificates=keys.ca_cert)
    with pytest.raises(JobError, match=f"no key for site\\(s\\) {HEART_SITE_NAMES[2]}"):
        run_job(job, superlink="127.0.0.1:1", root_certificates=keys.ca_cert, site_keys=keys.site_keys)
    with pytest.raises(JobError, match="insecure"):
        run_job(job, superlink="127.0.0.1:1", insecure=True, site_keys=keys.site_keys)
    res = runner.invoke(app, ["run", "job.toml", "--engine", "nvflare", "--superlink", "127.0.0.1:1"])
    assert res.exit_code == 2 and "--engine flower only" in res.output
    res = runner.invoke(app, ["run", "job.toml", "--insecure"])
    assert res.exit_code == 2 and "--superlink only" in res.output


def test_flare_project_run_needs_an_admin_kit_and_site_paths(sites, tmp_path):
    job = _job(sites, election={"freedom_degree": 0.5})
    with pytest.raises(JobError, match="flare_project applies to engine 'nvflare'"):
        run_job(job, engine="flower", flare_project=tmp_path)
    pathless = {**job, "sites": {**job["sites"], "va": {}}}
    with pytest.raises(JobError, match=r"on a FLARE project every \[sites.<name>\] needs path"):
        run_job(pathless, engine="nvflare", flare_project=tmp_path)
    res = runner.invoke(app, ["run", "job.toml", "--engine", "flower", "--flare-project", str(tmp_path)])
    assert res.exit_code == 2 and "--engine nvflare only" in res.output
    res = runner.invoke(app, ["run", "job.toml", "--deployment", "loopback", "--superlink", "127.0.0.1:1"])
    assert res.exit_code == 2 and "give one of" in res.output


# ----------------------------------------------------------------------------- a provisioned FLARE project
def _nvflare_cli() -> bool:
    return (Path(sys.executable).parent / "nvflare").exists() or shutil.which("nvflare") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _nvflare_cli(), reason="nvflare CLI not installed")
def test_flare_project_job_matches_local_engine(sites, tmp_path):
    """``fedtab run JOB --engine nvflare --flare-project KIT``: a FLARE project provisioned from
    fedtab's project.yml (mutual TLS, a startup kit per participant), server and clients started
    first and separately from their own startup scripts on 127.0.0.1, the job submitted with the
    admin's kit through FLARE's API: the local engine's columns and predictions; then a job
    with a wrong site path fails with the site's reason. Processes:
    setsid, group-killed in the finally, none left over (checked by the environment marker)."""
    pytest.importorskip("nvflare")
    from fedtab.engines.errors import RunError
    from fedtab.engines.nvflare_deploy import LoopbackProject

    elect = {"election": {"freedom_degree": 0.5}, "training": {"rounds": 1, "local_epochs": 2}}  # few exchanges
    local = run_job({**_job(sites, **elect), "run": {"out": str(tmp_path / "local")}}, engine="local")
    doc = {**_job(sites, **elect), "run": {"out": str(tmp_path / "flare")}}
    (tmp_path / "job.toml").write_text(_toml(doc))
    # each kit's local/ holds its site's own file (floor, split seed, table), as a real site keeps it: a
    # job may only tighten it. 'va' keeps no table path of its own, so the job's path reaches it below.
    from fedtab.job.run import site_configs

    own = [{k: v for k, v in c.items() if not (c["name"] == "va" and k == "data-path")}
           for c in site_configs(load_job(doc))]
    project = LoopbackProject(own, tmp_path / "project", start_timeout=180)
    try:
        project.start()
        res = runner.invoke(app, ["run", str(tmp_path / "job.toml"), "--engine", "nvflare",
                                  "--flare-project", str(project.admin_kit), "--timeout", "600"])
        # a path the site does not have: the failed job's reason comes back, naming the site and file
        typo = {**doc, "sites": {**doc["sites"], "va": {"path": str(sites / "no-such.csv")}}}
        with pytest.raises(RunError, match=r"site 'va'.*no-such\.csv: no such file"):
            run_job(typo, engine="nvflare", flare_project=project.admin_kit, timeout=300)
    finally:
        project.stop()
        leftovers = project.stragglers()
    assert not leftovers, f"processes left running: {leftovers}"
    assert res.exit_code == 0, res.output
    out = tmp_path / "flare"
    result = json.loads((out / "result.json").read_text())
    assert result["engine"] == "nvflare" and result["deployment"]["flare_job_id"]
    assert sorted(result["sites"]) == sorted(HEART_SITE_NAMES)
    # the controller's progress lines came back through the server's stats while the job ran
    assert f"submitted as FLARE job {result['deployment']['flare_job_id']}" in res.output
    assert "training round 1/1 (3/3 sites)" in res.output, res.output
    _assert_same_as_local(result, out, local, tmp_path / "local", sites)
