import json

import pytest
from typer.testing import CliRunner

from fedtab.cli import app
from tests.builders import classification_parts

runner = CliRunner()


def test_demo_writes_result_and_shows_the_expected_picture(tmp_path):
    res = runner.invoke(app, ["demo", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "result.json").read_text())
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    assert [s["selector"].split("(")[0] for s in doc["sites"]] == ["lasso", "random_forest", "mutual_info"]
    assert {"name", "selector", "n_samples", "selected", "signal_selected"} <= set(doc["sites"][0])
    assert {"intersection", "union", "all_features_f1", "sweep"} <= set(doc)
    sweep = {r["freedom_degree"]: r for r in doc["sweep"]}
    assert sorted(sweep) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert sweep[0.0]["kept"] == doc["intersection"] and sweep[1.0]["kept"] == doc["union"]
    # fd=0 loses signal to the strictest site's veto; fd=1 floods in noise;
    # fd=0.5 keeps (nearly) all 20 signal features with far less noise than the union.
    assert sweep[0.0]["signal"] < 15
    assert sweep[1.0]["noise"] > 40
    assert sweep[0.5]["signal"] >= 17
    assert sweep[0.5]["noise"] <= 0.5 * sweep[1.0]["noise"]
    kept = [sweep[fd]["kept"] for fd in sorted(sweep)]
    assert kept == sorted(kept)
    assert 0.5 < doc["all_features_f1"] <= 1.0


@pytest.fixture
def site_files(tmp_path):
    _, parts = classification_parts(900, 20, 4, 2, [0.4, 0.35, 0.25], seed=3, split_seed=1, class_sep=1.5)
    paths = []
    for i, part in enumerate(parts):
        p = tmp_path / f"hospital{i}.csv"
        if i == 2:
            p = tmp_path / "hospital2.parquet"
            part.to_parquet(p)
        else:
            part.to_csv(p, index=False)
        paths.append(p)
    return paths


def test_elect_on_files(site_files, tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(app, ["elect", *map(str, site_files), "--target", "target", "-s", "lasso", "-s", "anova",
                              "-s", "random_forest", "--fd", "0.5", "--rounds", "3", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "result.json").read_text())
    elected = (out / "elected_columns.txt").read_text().split()
    assert elected == doc["selected"] and len(elected) == doc["stats"]["kept"] > 0
    assert [s["selector"] for s in doc["sites"]] == ["lasso", "anova", "random_forest"]
    assert doc["training"]["elected"]["n_params"] == len(elected) + 1
    assert doc["training"]["all_features"]["n_params"] == 21


@pytest.mark.parametrize(
    "make_args, fragment",
    [
        (lambda f, t: [str(t / "missing.csv"), "--target", "target"], "no such file"),
        (lambda f, t: [*map(str, f), "--target", "nope"], "target column 'nope' is missing"),
        (lambda f, t: [*map(str, f), "--target", "target", "-s", "nope"], "unknown selector"),
        (lambda f, t: [*map(str, f), "--target", "target", "-s", "lasso", "-s", "anova"], "one --selector"),
        (lambda f, t: [*map(str, f), "--target", "target", "--aggregation", "median"], "unknown aggregation"),
        (lambda f, t: [str(t / "garbage.csv"), "--target", "target"], "garbage.csv"),
    ],
)
def test_elect_errors_are_clean(site_files, tmp_path, make_args, fragment):
    (tmp_path / "garbage.csv").write_bytes(b"\x00\xff\xfe not a table")
    res = runner.invoke(app, ["elect", *make_args(site_files, tmp_path)])
    assert res.exit_code == 2
    assert fragment in res.output
    assert "Traceback" not in res.output


def test_elect_with_sites_missing_the_target(site_files, tmp_path):
    import pandas as pd

    other = tmp_path / "other.csv"
    pd.read_csv(site_files[0]).rename(columns={"target": "label"}).to_csv(other, index=False)
    res = runner.invoke(app, ["elect", str(site_files[0]), str(other), "--target", "target"])
    assert res.exit_code == 2 and "other.csv" in res.output and "common target" in res.output


def test_elect_tunes_and_one_hot_encodes_categorical_columns(site_files, tmp_path):
    import pandas as pd

    files = []
    for i, p in enumerate(site_files[:2]):
        frame = pd.read_csv(p)
        frame["colour"] = [("red", "green", "blue")[(j + i) % 3] for j in range(len(frame))]
        q = tmp_path / f"cat{i}.csv"
        frame.to_csv(q, index=False)
        files.append(q)
    out = tmp_path / "tuned"
    res = runner.invoke(app, ["elect", *map(str, files), "--target", "target", "--tune", "grid", "--model", "gnb",
                              "--rounds", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "result.json").read_text())
    assert doc["categorical_columns"] == ["colour"]
    assert doc["stats"]["features"] == 20 + 3  # colour became three agreed one-hot columns
    assert doc["tuning"]["freedom_degree"] == doc["freedom_degree"]
    assert doc["training"]["model"] == "gnb"


def test_elect_rejects_unknown_tuner_and_model(site_files):
    res = runner.invoke(app, ["elect", str(site_files[0]), "--target", "target", "--tune", "magic"])
    assert res.exit_code == 2 and "--tune" in res.output
    res = runner.invoke(app, ["elect", str(site_files[0]), "--target", "target", "--model", "xgboost"])
    assert res.exit_code == 2 and "unknown model" in res.output
