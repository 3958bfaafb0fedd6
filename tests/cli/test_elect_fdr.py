"""``fedtab elect --fdr Q [--fdr-method bh|by]``: selection with error control from the command line
(issue 30 item 5), on the known-signal data of ``benchmarks/fdr.py`` at a small size."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from benchmarks.fdr import known_signal
from fedtab.cli import app
from fedtab.engines.local import LocalFederation
from fedtab.federation import run_pooled_score_test
from fedtab.federation.site.core import Site

runner = CliRunner()
Q = 0.1
#: the FDR is an expectation: the seeds of tests/estimators/test_fdr_estimator.py (over its first
#: five the mean false discovery proportion of BH is 0.126; over the twenty, below q)
SEEDS = range(20)


def _files(tmp_path, seed: int, n: int = 600) -> list[str]:
    """Three site files of ``known_signal(seed)``: 6 signal columns ``s*`` of 40, the rest null."""
    table = known_signal(seed, n=n)
    parts = np.array_split(np.random.default_rng(seed + 1000).permutation(n), 3)
    paths = []
    for i, p in enumerate(parts):
        path = tmp_path / f"seed{seed}_site{i}.csv"
        table.iloc[p].to_csv(path, index=False)
        paths.append(str(path))
    return paths


def _elect(files, out, *options):
    return runner.invoke(app, ["elect", *files, "--target", "target", "--no-train", "--test-size", "0",
                               "--out", str(out), *options])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{(seed, method): (files, result.json)}`` of ``--fdr 0.1 --fdr-method method``."""
    tmp = tmp_path_factory.mktemp("fdr")
    out = {}
    for seed in SEEDS:
        files = _files(tmp, seed)
        for method in ("bh", "by"):
            res = _elect(files, tmp / f"out{seed}{method}", "--fdr", str(Q), "--fdr-method", method)
            assert res.exit_code == 0, res.output
            out[seed, method] = files, json.loads((tmp / f"out{seed}{method}" / "result.json").read_text())
    return out


@pytest.mark.parametrize("method", ["bh", "by"])
def test_realised_fdr_at_most_q_with_power(runs, method):
    fdp, power = [], []
    for seed in SEEDS:
        kept = runs[seed, method][1]["selected"]
        fdp.append(sum(c.startswith("n") for c in kept) / max(len(kept), 1))
        power.append(sum(c.startswith("s") for c in kept) / 6)
    assert np.mean(fdp) <= Q, (method, fdp)
    assert min(power) > 0, (method, power)


def test_result_json_holds_q_the_correction_and_the_workflow_selection(runs, tmp_path):
    files, doc = runs[1, "by"]
    assert doc["method"] == "score-test" and doc["fdr"] == {"q": Q, "method": "by"}
    assert doc["election"]["fdr"] == doc["fdr"] and doc["election"]["selected"] == doc["selected"]
    assert len(doc["p"]) == len(doc["feature_names"]) == len(doc["mask"]) == 40
    assert [s["n_samples"] for s in doc["sites"]] == [200, 200, 200]
    assert "training" not in doc and "freedom_degree" not in doc
    import pandas as pd

    sites = [Site(f"site{i}", pd.read_csv(f), "target", test_size=0.0, selector="lasso") for i, f in enumerate(files)]
    ref = run_pooled_score_test(LocalFederation(sites), fdr=Q, fdr_method="by", one_vs_rest=True)
    assert doc["selected"] == ref.selected_names and ref.selected_names
    np.testing.assert_allclose(doc["p"], ref.p, rtol=1e-12)
    bh = runs[1, "bh"][1]["selected"]
    assert set(doc["selected"]) <= set(bh)  # BY keeps a subset of what BH keeps


def test_elected_columns_report_and_summary(tmp_path):
    files = _files(tmp_path, 0)
    out = tmp_path / "out"
    res = runner.invoke(app, ["elect", *files, "--target", "target", "--fdr", "0.05", "--rounds", "2",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "result.json").read_text())
    assert (out / "elected_columns.txt").read_text().split() == doc["selected"]
    assert doc["fdr"] == {"q": 0.05, "method": "bh"}
    assert doc["training"]["elected"]["n_params"] == len(doc["selected"]) + 1  # trained on the kept columns
    assert "false discovery rate q = 0.05 (Benjamini-Hochberg)" in res.output
    assert f"{doc['kept']} of 40 columns kept" in res.output
    page = (out / "report.html").read_text()
    assert "Benjamini-Hochberg" in page and "q = 0.050" in page and "Pooled p-value" in page


def test_method_score_test_without_fdr_is_the_forward_selection(tmp_path):
    out = tmp_path / "fw"
    res = _elect(_files(tmp_path, 0), out, "--method", "score-test")
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "result.json").read_text())
    assert doc["method"] == "score-test" and doc["fdr"] is None and doc["selected"]
    assert "forward selection, Benjamini-Hochberg at alpha 0.05 per step" in res.output


@pytest.mark.parametrize("options, message", [
    (["--fdr", "0"], "--fdr must be a false discovery rate in (0, 1), e.g. 0.05, got '0'"),
    (["--fdr", "1"], "--fdr must be a false discovery rate in (0, 1), e.g. 0.05, got '1'"),
    (["--fdr", "-1"], "--fdr must be a false discovery rate in (0, 1), e.g. 0.05, got '-1'"),
    (["--fdr", "abc"], "--fdr must be a false discovery rate in (0, 1), e.g. 0.05, got 'abc'"),
    (["--fdr", "nan"], "--fdr must be a false discovery rate in (0, 1), e.g. 0.05, got 'nan'"),
    (["--fdr", "inf"], "--fdr must be a false discovery rate in (0, 1), e.g. 0.05, got 'inf'"),
    (["--fdr", ""], "--fdr must be a false discovery rate in (0, 1), e.g. 0.05, got ''"),
    (["--fdr", "0.1", "--fdr-method", "holm"], "--fdr-method must be 'bh' or 'by', got 'holm'"),
    (["--fdr", "0.1", "--method", "vote"], "--fdr and --fdr-method select by the pooled score test"),
    (["--fdr-method", "by"], "--fdr and --fdr-method select by the pooled score test"),
    (["--method", "magic"], "--method must be 'vote' or 'score-test', got 'magic'"),
    (["--fdr", "0.1", "--compat", "nvflare"], "--fdr selects by the pooled score test, without a vote: --compat "
                                              "applies to the vote"),
    (["--fdr", "0.1", "--fd", "0.3", "--consensus", "stouffer", "-s", "anova"],
     "--selector, --freedom-degree, --consensus apply to the vote"),
    (["--fdr", "0.1", "--tune", "grid"], "--tune applies to the vote"),
    (["--fdr", "0.1", "--robust"], "--robust applies to the vote"),
    (["--fdr", "0.1", "--pooled-comparison"], "--pooled-comparison applies to the vote"),
    (["--method", "score-test", "--min-holders", "3"], "--method score-test selects by the pooled score test, "
                                                       "without a vote: --min-holders applies to the vote"),
])
def test_careless_options_end_in_one_line_with_exit_2(tmp_path, options, message):
    files = _files(tmp_path, 0, n=90)
    res = _elect(files, tmp_path / "o", *options)
    assert res.exit_code == 2, res.output
    assert res.output.count("\n") == 1 and res.output.startswith("error: ") and message in res.output, res.output
    assert not (tmp_path / "o").exists()


def test_a_q_that_keeps_nothing_before_training_is_one_line(tmp_path):
    res = runner.invoke(app, ["elect", *_files(tmp_path, 0, n=300), "--target", "target", "--fdr", "1e-12",
                              "--rounds", "1", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "the score test at false discovery rate 1e-12 (BH) selected no column" in res.output
    assert "Traceback" not in res.output


def test_help_lists_the_fdr_options():
    res = runner.invoke(app, ["elect", "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert res.exit_code == 0
    lines = res.output.splitlines()
    for option in ("--method", "--fdr Q", "--fdr-method"):
        assert any(line.lstrip().startswith(option) for line in lines), option
    assert "Benjamini-Yekutieli" in res.output and max(map(len, lines)) <= 80
