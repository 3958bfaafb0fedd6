"""`python -m benchmarks.impute --quick` runs and writes its three outputs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_quick_mode(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-m", "benchmarks.impute", "--quick", "--out", str(tmp_path)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads((tmp_path / "impute.json").read_text())
    keys = {"dataset", "method", "seed", "mask_fraction", "observed_rmse", "structural_rmse", "seconds"}
    assert rows and all(keys <= set(r) for r in rows)
    methods = {r["method"] for r in rows}
    assert {"fedhf", "global_mean", "lowrank_em", "mice_central", "knn_central", "fed_dae", "local_mean",
            "local_gnn", "fedhf_no_unavail_msgs", "fedhf_no_prior"} <= methods
    assert {r["mask_fraction"] for r in rows} == {0.6, 0.2}
    # the tiny table is rank 4: the linear reference must beat the mean on both scores
    em = [r for r in rows if r["method"] == "lowrank_em" and r["mask_fraction"] == 0.2][0]
    mean = [r for r in rows if r["method"] == "global_mean" and r["mask_fraction"] == 0.2][0]
    assert em["observed_rmse"] < 0.8 * mean["observed_rmse"] and em["structural_rmse"] < 0.8 * mean["structural_rmse"]
    assert "| fedhf |" in (tmp_path / "impute.md").read_text()
    assert (tmp_path / "impute.png").stat().st_size > 0


def test_params_option_parses_numbers_and_none_and_names_a_bad_item():
    from benchmarks.impute import parse_params

    assert parse_params(["batch_size=64", "lr=0.003", "max_steps_per_round=None"]) == {
        "batch_size": 64, "lr": 0.003, "max_steps_per_round": None}
    assert isinstance(parse_params(["batch_size=64"])["batch_size"], int)
    for bad in (["batch_size"], ["lr=fast"], ["=3"]):
        with pytest.raises(ValueError, match="params"):
            parse_params(bad)
