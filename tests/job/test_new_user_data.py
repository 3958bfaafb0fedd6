"""Issue 24, the "new user" inputs of data that must mean what it says (items 1, 2, 4 and the data half of 7).

The UCI Heart sites of ``fedtab.data.example_sites`` (150 rows split 60/45/45), changed as a new
user's files would be: one site codes the label "yes"/"no", one holds a single class, one has a
``patient_id`` and a unique text code, a ``;``-separated file with decimal commas, a 1e308 cell.
Every run is on the local engine with 1-2 rounds; only the imputation test imports torch.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fedtab.cli import app
from fedtab.data.example_sites import write_heart_sites
from fedtab.federation.protocol import FederationError
from fedtab.job import JobError, load_job
from fedtab.job.run import run_job

SITES = {"cleveland": "cleveland.csv", "hungarian": "hungarian.parquet", "va": "va.csv"}
TINY_IMPUTE = {"rounds": 1, "local_epochs": 1, "hidden_dim": 8, "n_layers": 1}


@pytest.fixture(scope="module")
def heart(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("heart")
    write_heart_sites(d, rows=150)
    return d


def _copy(heart: Path, tmp: Path) -> Path:
    for f in SITES.values():
        (tmp / f).write_bytes((heart / f).read_bytes())
    return tmp


def _job(d: Path, **sections) -> dict:
    doc = {"target": "disease", "na_values": ["?"],
           "sites": {n: {"path": str(d / f), "min_rows": 4} for n, f in SITES.items()},
           "training": {"rounds": 1, "local_epochs": 1}, "run": {"out": str(d / "out")}}
    doc.update(sections)
    return doc


def _edit_csv(path: Path, fn) -> None:
    frame = pd.read_csv(path, na_values=["?"])
    fn(frame)
    frame.to_csv(path, index=False, na_rep="?")


def test_mixed_label_encodings_are_an_error_naming_the_sites_unless_mapped(heart, tmp_path):
    d = _copy(heart, tmp_path)
    _edit_csv(d / "va.csv", lambda f: f.__setitem__("disease", f["disease"].map({1: "yes", 0: "no"})))
    with pytest.raises(JobError) as exc:
        run_job(_job(d))  # before the fix: a 4-class model ['0', '1', 'no', 'yes'], exit 0
    text = str(exc.value)
    assert "va ['no', 'yes']" in text and "cleveland ['0', '1']" in text and "[labels] map" in text
    result = run_job(_job(d, labels={"map": {"yes": 1, "no": 0}}))
    assert result["schema"]["classes"] == ["0", "1"]
    assert result["training"]["classes"] == ["0", "1"]


def test_one_class_site_is_named_with_what_it_took_part_in(heart, tmp_path):
    d = _copy(heart, tmp_path)
    hu = pd.read_parquet(d / "hungarian.parquet")
    hu["disease"] = 1
    hu.to_parquet(d / "hungarian.parquet")
    (d / "job.toml").write_text(
        'target = "disease"\nna_values = ["?"]\n[training]\nrounds = 1\nlocal_epochs = 1\n'
        '[election]\nfreedom_degree = 0.5\n'
        + "".join(f'[sites.{n}]\npath = "{f}"\nmin_rows = 4\n' for n, f in SITES.items()))
    res = CliRunner().invoke(app, ["run", str(d / "job.toml"), "--out", str(d / "out")])
    assert res.exit_code == 0, res.output
    assert "site 'hungarian' holds one class only: election abstained" in res.output
    sites = json.loads((d / "out" / "result.json").read_text())["sites"]
    assert sites["hungarian"]["one_class"] is True and not sites["cleveland"]["one_class"]
    took = sites["hungarian"]["participation"]
    assert took["election"].startswith("abstained") and took["training"] is True and took["evaluation"] is True
    report = " ".join((d / "out" / "report.html").read_text().split())  # the verdict and the sites section
    assert report.count("Site <strong>hungarian</strong> holds one class only: it abstained from the feature "
                        "election's vote") == 2 and "took part in training" in report


def test_id_columns_are_left_out_with_a_reason_unless_kept(heart, tmp_path):
    d = _copy(heart, tmp_path)

    def ids(f: pd.DataFrame) -> None:
        f.insert(0, "patient_id", np.arange(1000, 1000 + len(f)))
        f.insert(1, "code", [f"P{i:03d}" for i in range(len(f))])  # unique text per row, not named like an id
        f.insert(2, "record id", 7)  # named like an id, constant
    _edit_csv(d / "cleveland.csv", ids)
    result = run_job(_job(d))
    ignored = result["schema"]["ignored"]
    assert set(ignored) == {"patient_id", "code", "record id"}
    assert "unique per row at site(s) cleveland" in ignored["code"]
    assert ignored["record id"] == "named like a row identifier"
    assert not {"patient_id", "code", "record id"} & set(result["schema"]["columns"] + result["training"]["features"])
    kept = run_job(_job(d, columns={"keep": ["patient_id"], "ignore": ["code"]}))
    assert "patient_id" in kept["schema"]["columns"] and kept["schema"]["ignored"]["code"] == "[columns] ignore"


def test_a_typo_in_columns_is_a_job_error_naming_the_sites_and_the_closest_column(heart, tmp_path):
    with pytest.raises(JobError) as exc:
        run_job(_job(_copy(heart, tmp_path), columns={"ignore": ["cholesterol", "tha"]}))
    assert "[columns] ignore names 'cholesterol'" in str(exc.value)
    assert "cleveland, hungarian, va" in str(exc.value)
    with pytest.raises(JobError, match=r"did you mean 'thal'"):
        run_job(_job(_copy(heart, tmp_path), columns={"categorical": ["tha"]}))
    with pytest.raises(JobError, match=r"\[columns\] ignore names the target"):
        load_job(_job(tmp_path, columns={"ignore": ["disease"]}))


@pytest.mark.slow  # imports torch and trains the imputer (one round)
def test_categorical_codes_and_integer_codes_are_imputed_to_observed_values(heart, tmp_path):
    pytest.importorskip("torch")
    from fedtab.engines.local import LocalFederation
    from fedtab.engines.site_config import build_site
    from fedtab.job.run import site_configs
    from fedtab.job.workflow import run_workflow

    spec = load_job(_job(heart, impute=TINY_IMPUTE, columns={"categorical": ["cp"]}))
    sites = [build_site(c) for c in site_configs(spec)]
    observed = set(pd.read_csv(heart / "cleveland.csv", na_values=["?"])["thal"].dropna())
    out = run_workflow(LocalFederation(sites), spec)
    hungarian = sites[1].table  # it never measured thal nor ca: every value imputed
    levels = out.result["schema"]["levels"]
    assert set(levels["thal"]) <= observed and set(hungarian["thal"].unique()) <= set(levels["thal"])
    assert set(hungarian["ca"].unique()) <= set(levels["ca"])
    assert "cp" not in levels and "cp" in out.result["schema"]["categories"]
    for site in sites:  # every row one category, also where cp was missing or too rare to be told apart
        cp = site.table[[c for c in site.table.columns if c.startswith("cp=")]]
        assert cp.notna().all().all() and (cp.sum(axis=1) == 1).all() and set(np.unique(cp)) <= {0.0, 1.0}
    assert out.imputer["levels"] and all(len(g) > 1 for g in out.imputer["groups"])


def test_semicolon_file_with_decimal_commas_is_read_or_set_per_site(heart, tmp_path):
    d = _copy(heart, tmp_path)
    va = pd.read_csv(d / "va.csv", na_values=["?"])
    va["oldpeak"] = va["oldpeak"] + 0.25  # decimals in every row
    va.to_csv(d / "va.csv", index=False, sep=";", decimal=",", na_rep="?")
    assert ";" in (d / "va.csv").read_text().splitlines()[1] and "," in (d / "va.csv").read_text().splitlines()[1]
    result = run_job(_job(d))  # before: "target column not in the table"
    assert result["sites"]["va"]["n_rows"] == 45 and "oldpeak" in result["sites"]["va"]["columns"]
    doc = _job(d)
    doc["sites"]["va"].update(sep=";", decimal=",")
    assert run_job(doc)["sites"]["va"]["columns"] == result["sites"]["va"]["columns"]
    with pytest.raises(JobError, match=r"\[sites.va\] sep must be one of"):
        load_job({**doc, "sites": {"va": {"path": "va.csv", "sep": ":"}}})


def test_a_huge_cell_names_its_site_column_and_row_only_and_warns_nothing(heart, tmp_path):
    d = _copy(heart, tmp_path)
    _edit_csv(d / "va.csv", lambda f: f.__setitem__("oldpeak", [*f["oldpeak"][:6], 1e308, *f["oldpeak"][7:]]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(FederationError) as exc:
            run_job(_job(d))
    text = str(exc.value)
    assert "site 'va'" in text and "column oldpeak holds a value that is infinite" in text and "row 7" in text
    assert "cleveland" not in text and "hungarian" not in text


def test_a_type_mismatch_names_the_sites_and_the_hint_names_the_job_key(heart, tmp_path):
    d = _copy(heart, tmp_path)
    _edit_csv(d / "va.csv", lambda f: f.__setitem__("sex", f["sex"].map({1: "m", 0: "f"})))
    with pytest.raises(FederationError) as exc:
        run_job(_job(d))
    assert "'sex' is numeric at site(s) cleveland, hungarian and text at site(s) va" in str(exc.value)
    _edit_csv(d / "cleveland.csv", lambda f: f.__setitem__("age", [*f["age"][:2], "unknown", *f["age"][3:]]))
    with pytest.raises(FederationError, match=r"na_values = \[\.\.\.\] in the job"):
        run_job(_job(d))


def _coded_sites(d: Path) -> list[Path]:
    """Two ``;``/decimal-comma site files: ``a``, ``b`` (only the first site), the code ``thal`` in
    {3, 6, 7} with missing cells, and a label ``y``."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(2):
        z = rng.normal(size=60)
        t = pd.DataFrame({"a": z + rng.normal(0, 0.3, 60), "b": 2 * z + rng.normal(0, 0.3, 60),
                          "thal": np.where(z > 0.5, 7, np.where(z < -0.5, 3, 6)).astype(float),
                          "y": (z > 0).astype(int)})
        t.loc[rng.random(60) < 0.3, "thal"] = np.nan
        t.loc[rng.random(60) < 0.2, "a"] = np.nan
        paths.append(d / f"s{i}.csv")
        (t if i == 0 else t.drop(columns=["b"])).to_csv(paths[-1], index=False, sep=";", decimal=",")
    return paths


@pytest.mark.slow  # imports torch and trains the imputer (two rounds)
def test_fedtab_impute_keeps_the_target_out_imputes_codes_and_writes_the_mask(tmp_path):
    pytest.importorskip("torch")
    from fedtab.estimators import FederatedImputer

    paths = _coded_sites(tmp_path)
    res = CliRunner().invoke(app, ["impute", *map(str, paths), "--target", "y", "--rounds", "2", "--hidden-dim", "8",
                                   "--n-layers", "1", "--out", str(tmp_path / "out"), "-q"])
    assert res.exit_code == 0, res.output
    given = pd.read_csv(paths[1], sep=";", decimal=",")
    filled = pd.read_csv(tmp_path / "out" / "s1.imputed.csv")
    mask = pd.read_csv(tmp_path / "out" / "s1.imputed_mask.csv")
    assert list(mask.columns) == ["a", "b", "thal"]  # y is neither imputed nor an input
    assert filled["y"].tolist() == given["y"].tolist()
    assert mask["b"].eq(1).all() and mask["thal"].astype(bool).tolist() == given["thal"].isna().tolist()
    assert set(filled["thal"]) <= {3.0, 6.0, 7.0} and filled["thal"].notna().all()
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["settings"]["integer_codes"] is True
    # the estimator and the command agree: codes, not fractions (before: e.g. 5.37)
    tables = [pd.read_csv(p, sep=";", decimal=",").drop(columns="y") for p in paths]
    imp = FederatedImputer(rounds=2, hidden_dim=8, n_layers=1).fit(tables)
    assert imp.levels_ == {"thal": [3.0, 6.0, 7.0]}
    assert set(imp.transform(tables[1])["thal"]) <= {3.0, 6.0, 7.0}
    raw = imp.predict_z(tables[1])[0][:, imp.columns_.index("thal")] * imp.std_[2] + imp.mean_[2]
    assert not set(np.round(raw, 6)) <= {3.0, 6.0, 7.0}  # the model's own output is fractional


def test_fedtab_impute_names_a_column_no_site_holds(tmp_path):
    paths = _coded_sites(tmp_path)
    res = CliRunner().invoke(app, ["impute", *map(str, paths), "--target", "yy", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "column 'yy' is in none of the site files s0, s1 (did you mean 'y'?)" in res.output


def test_fedtab_elect_takes_the_column_options_and_says_what_it_left_out(heart, tmp_path):
    d = _copy(heart, tmp_path)
    _edit_csv(d / "cleveland.csv", lambda f: f.insert(0, "patient_id", np.arange(len(f))))
    files = [str(d / f) for f in SITES.values()]
    res = CliRunner().invoke(app, ["elect", *files, "--target", "disease", "--na-value", "?", "--min-rows", "4",
                                   "--no-train", "--ignore", "chol", "--categorical", "cp", "--out", str(d / "o")])
    assert res.exit_code == 0, res.output
    why = "unique per row at site(s) cleveland (a row identifier)"
    assert f"column 'patient_id' left out: {why}" in " ".join(res.output.split())
    doc = json.loads((d / "o" / "result.json").read_text())
    assert doc["ignored_columns"] == {"chol": "[columns] ignore", "patient_id": why}
    assert "cp" in doc["categorical_columns"] and "chol" not in [f["feature"] for f in doc["election"]["features"]]
    bad = CliRunner().invoke(app, ["elect", *files, "--target", "disease", "--na-value", "?", "--min-rows", "4",
                                   "--no-train", "--ignore", "cholesterol", "--out", str(d / "o2")])
    assert bad.exit_code == 2 and "--ignore names 'cholesterol'" in " ".join(bad.output.split())


def test_a_coded_column_declared_categorical_is_one_category_per_code_in_training_and_predict(heart, tmp_path):
    from fedtab.job.model_file import load_model

    d = _copy(heart, tmp_path)
    result = run_job(_job(d, columns={"categorical": ["thal"]}))
    cats = result["schema"]["categories"]["thal"]
    assert "3" in cats and "7" in cats and "thal" not in result["schema"]["ranges"]
    assert {"thal=3", "thal=7"} <= set(result["training"]["features"])
    rows = pd.read_csv(d / "cleveland.csv", na_values=["?"])
    rows = rows[rows["thal"].isin([3.0, 7.0])].head(5)  # read back as 3.0 / 7.0: still the codes "3" / "7"
    proba = load_model(d / "out" / "model.fedtab").predict_proba(rows.drop(columns="disease"))
    assert proba.shape == (5, 2) and np.allclose(proba.sum(axis=1), 1)


def test_under_a_quorum_the_site_with_the_huge_cell_is_dropped_and_named_alone(heart, tmp_path):
    d = _copy(heart, tmp_path)
    _edit_csv(d / "va.csv", lambda f: f.__setitem__("oldpeak", [np.inf, *f["oldpeak"][1:]]))
    result = run_job(_job(d, trust={"min_sites": 2}))
    dropped = result["participation"]["dropped"]
    assert list(dropped) == ["va"] and "column oldpeak" in dropped["va"] and "row 1" in dropped["va"]
    assert set(result["training"]["metrics"]["per_site"]) == {"cleveland", "hungarian"}


def test_a_deployed_site_takes_the_jobs_label_map_and_csv_marks(heart, tmp_path):
    from fedtab.engines.site_config import build_site, with_job_settings
    from fedtab.job.run import site_configs, site_settings

    d = _copy(heart, tmp_path)
    va = pd.read_csv(d / "va.csv", na_values=["?"])
    va["disease"] = va["disease"].map({1: "yes", 0: "no"})
    va.to_csv(d / "va.csv", index=False, sep=";", na_rep="?")
    doc = _job(d, labels={"map": {"yes": 1, "no": 0}})
    doc["sites"]["va"].update(sep=";", decimal=".")
    for site in doc["sites"].values():
        del site["min_rows"]  # a deployed site keeps its own disclosure floor
    settings = site_settings(site_configs(load_job(doc)))  # what the run config carries to a SuperNode
    node = {"name": "va", "data-path": str(d / "va.csv")}  # the SuperNode knows only its name and file
    site = build_site(with_job_settings(node, json.dumps(settings)))
    assert site.class_counts("all") and set(site.class_counts("all")) == {"0", "1"}
    assert "oldpeak" in site.feature_names and site.unlabelled_rows == 3


def test_a_private_run_refuses_mixed_label_encodings_too(heart, tmp_path):
    d = _copy(heart, tmp_path)
    _edit_csv(d / "va.csv", lambda f: f.__setitem__("disease", f["disease"].map({1: "yes", 0: "no"})))
    common = ["ca", "thal", "slope", "chol"]  # secure sums need the same columns at every site
    for f in ("cleveland.csv", "va.csv"):
        _edit_csv(d / f, lambda t: t.drop(columns=[c for c in common if c in t.columns], inplace=True))
    hu = pd.read_parquet(d / "hungarian.parquet")
    hu.drop(columns=[c for c in common if c in hu.columns]).to_parquet(d / "hungarian.parquet")
    private = {"privacy": {"secure_aggregation": True}, "evaluation": {"baselines": False}}
    with pytest.raises(JobError, match=r"va \['no', 'yes'\]"):
        run_job(_job(d, **private))  # no column profile: the first step's declarations show it
    assert run_job(_job(d, labels={"map": {"yes": 1, "no": 0}}, **private))["training"]["classes"] == ["0", "1"]
