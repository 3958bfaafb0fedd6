"""`fedtab impute` on small CSVs: outputs, and clean errors for bad input."""

import json

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from fedtab.cli.impute import impute_command

app = typer.Typer()
app.command()(impute_command)
runner = CliRunner()
FAST = ["--rounds", "3", "--local-epochs", "1", "--hidden-dim", "8", "--n-layers", "1", "--quiet"]


def _write_sites(tmp_path):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(240, 2))
    x = pd.DataFrame(z @ rng.normal(size=(2, 5)), columns=list("abcde"))
    x = x.mask(rng.random(x.shape) < 0.1)
    paths = []
    for i, cols in enumerate([list("abc"), list("bcd"), list("cde")]):
        p = tmp_path / f"site{i}.csv"
        x.iloc[i * 80 : (i + 1) * 80][cols].to_csv(p, index=False)
        paths.append(str(p))
    return paths


def test_cli_writes_tables_report_and_plots(tmp_path):
    paths = _write_sites(tmp_path)
    out = tmp_path / "out"
    res = runner.invoke(app, [*paths, "--out", str(out), *FAST])
    assert res.exit_code == 0, res.output
    for i in range(3):
        t = pd.read_csv(out / f"site{i}.imputed.csv")
        assert list(t.columns) == list("abcde") and len(t) == 80 and not t.isna().any().any()
    rep = json.loads((out / "report.json").read_text())
    assert set(rep["validation_rmse_z"]["per_site"]) == {"site0", "site1", "site2"}
    assert set(rep["validation_rmse_z"]["per_column"]) == set("abcde")
    assert len(rep["training_curve"]) == 3
    assert rep["sites"]["site0"]["unavailable_columns"] == ["d", "e"]
    assert rep["feature_graph"]["unobserved_pairs"] == 3  # a-d, a-e, b-e are never held together
    assert (out / "training_curve.png").stat().st_size > 0 and (out / "feature_graph.png").stat().st_size > 0
    assert rep["linear_prior"]["rank"] >= 1 and set(rep["linear_prior"]["noise_variance"]) == set("abcde")


def test_cli_prior_flags(tmp_path):
    paths = _write_sites(tmp_path)
    res = runner.invoke(app, [*paths, "--out", str(tmp_path / "plain"), "--no-prior", *FAST])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "plain" / "report.json").read_text())["linear_prior"] is None
    res = runner.invoke(app, [*paths, "--out", str(tmp_path / "r1"), "--prior-rank", "1", *FAST])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "r1" / "report.json").read_text())["linear_prior"]["rank"] == 1


@pytest.mark.parametrize("make, match", [
    (lambda d: [d / "nope.csv"], "not found"),
    (lambda d: [_file(d, "a.csv", "a,b\n" + "1,2\n3,4\n" * 6), _file(d, "b.csv", "c,d\n" + "1,2\n3,4\n" * 6)],
     "no column is shared"),
    (lambda d: [_file(d, "a.csv", "a,b\n1,x\n3,y\n")], "non-numeric"),
    (lambda d: [_file(d, "a.csv", "a,b\n")], "no rows"),
    (lambda d: [_file(d, "a.csv", "")], "empty"),
    (lambda d: [_file(d, "a.csv", "a,b\n1,\n3,\n")], "no observed value"),
    (lambda d: [_file(d, "a.csv", "a,b\n1,2\n"), _file(d, "a.csv.bak", "x")], None),
])
def test_cli_bad_input_exits_cleanly(tmp_path, make, match):
    res = runner.invoke(app, [*map(str, make(tmp_path)), "--out", str(tmp_path / "o"), *FAST])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)
    if match:
        assert match in res.output.replace("\n", " ")


def _file(d, name, text):
    p = d / name
    p.write_text(text)
    return p
