"""``--robust`` / ``--max-site-share`` on ``fedtab elect`` and ``fedtab impute``."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from fedtab.cli import app
from tests.builders import classification_parts, write_csvs

runner = CliRunner()


@pytest.fixture
def four_sites(tmp_path):
    _, parts = classification_parts(800, 10, 4, 2, [0.25] * 4, seed=4, split_seed=1, class_sep=1.5)
    return [str(p) for p in write_csvs(parts, tmp_path)]


def test_elect_robust_records_the_mode(four_sites, tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(app, ["elect", *four_sites, "-t", "target", "--robust", "--max-site-share", "0.4",
                              "--rounds", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "result.json").read_text())
    assert doc["aggregation"] == "median" and doc["training"]["robust"] is True
    assert doc["training"]["left_out"] == {}
    assert 0.5 < doc["training"]["elected"]["f1"] <= 1


@pytest.mark.parametrize("share", ["0", "1.5", "nan"])
def test_elect_rejects_a_bad_max_site_share(four_sites, tmp_path, share):
    res = runner.invoke(app, ["elect", *four_sites, "-t", "target", "--robust", "--max-site-share", share,
                              "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "max-site-share" in res.output
    assert not (tmp_path / "o").exists()


def test_impute_robust(four_sites, tmp_path):
    pytest.importorskip("torch")
    files = []
    rng = np.random.default_rng(0)
    for i, path in enumerate(four_sites):
        import pandas as pd

        t = pd.read_csv(path).drop(columns=["target"])
        t = t.mask(rng.random(t.shape) < 0.1)
        p = tmp_path / f"imp{i}.csv"
        t.to_csv(p, index=False)
        files.append(str(p))
    out = tmp_path / "imp"
    res = runner.invoke(app, ["impute", *files, "--robust", "--rounds", "2", "--hidden-dim", "8", "--quiet",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["robust"] is True and report["left_out"] == {}
