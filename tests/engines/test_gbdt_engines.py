"""The same boosted trees on the local engine, Flower and the NVIDIA FLARE simulator.

The job's ``training`` step with ``model = {"name": "gbdt", ...}`` runs the GBDT workflow
(one ``gbdt_level`` exchange per depth level) on every engine. Flower runs in process with a
fresh ClientApp state per message (the boosting state survives in Flower's ``Context.state``);
the FLARE simulator runs real client processes. Trees must be equal array for array.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.builders import write_classification_sites

PARAMS = {"n_trees": 3, "max_depth": 3, "max_bins": 16}
JOB = {"training": {"model": {"name": "gbdt", "params": PARAMS}}}  # all columns, no election


@pytest.fixture(scope="module")
def site_configs(tmp_path_factory) -> list[dict]:
    """The sites of a plain run, each opting in to plain answers over the server's tree nodes."""
    configs = write_classification_sites(tmp_path_factory.mktemp("gbdt_sites"), 600, 6, 3, 1, table_seed=7,
                                         split_seed=0)
    return [{**c, "policy": json.dumps({"allow_server_row_sets": True})} for c in configs]


@pytest.fixture(scope="module")
def plan(jobs) -> dict:
    return jobs.plan(**JOB)


@pytest.fixture(scope="module")
def reference(site_configs, jobs, plan) -> dict:
    return jobs.local(site_configs, plan)


def _levels(result: dict) -> int:
    return sum(1 for p in result["participation"]["exchanges"] if p["step"] == "gbdt_level")


def _assert_same_trees(result: dict, ref: dict) -> None:
    assert result["training"]["model"] == "gbdt"
    assert set(result["model"]["params"]) == set(ref["model"]["params"])
    for key, value in ref["model"]["params"].items():
        np.testing.assert_array_equal(np.asarray(result["model"]["params"][key]), np.asarray(value), err_msg=key)
    f1 = result["training"]["metrics"]["pooled"]["weighted_f1"]
    assert f1 == pytest.approx(ref["training"]["metrics"]["pooled"]["weighted_f1"], abs=1e-12)
    assert _levels(result) == _levels(ref)
    imp, ref_imp = result["training"]["importance"], ref["training"]["importance"]  # the sites' records survive
    assert imp["pooled"] == ref_imp["pooled"] and set(imp["per_site"]) == set(ref_imp["per_site"]) != set()
    for site, gains in ref_imp["per_site"].items():
        assert imp["per_site"][site] == pytest.approx(gains, rel=1e-12), site


def test_local_engine_runs_one_exchange_per_level(reference):
    n_trees = len(reference["model"]["params"]["tree_ptr"]) - 1
    assert n_trees == PARAMS["n_trees"]
    assert _levels(reference) <= PARAMS["n_trees"] * PARAMS["max_depth"] + 1
    assert reference["training"]["metrics"]["pooled"]["weighted_f1"] > 0.6


@pytest.mark.requires("flwr")
def test_flower_grows_the_same_trees(site_configs, reference, jobs, plan):
    from fedtab.engines import flower

    result = flower.run_in_process(site_configs, jobs.config(plan), fresh_processes=True)
    assert result["engine"] == "flower"
    _assert_same_trees(result, reference)


@pytest.mark.slow
@pytest.mark.requires("nvflare")
def test_flare_simulator_grows_the_same_trees(site_configs, reference, tmp_path, jobs, plan):
    from fedtab.engines.nvflare import run_simulator

    # FLARE reads a "{...}" string in its client config as a parameter expression: the policy goes as an object
    configs = [{**c, "policy": json.loads(c["policy"])} for c in site_configs]
    result = run_simulator(configs, jobs.config(plan), tmp_path, threads=3)
    assert result["engine"] == "nvflare"
    _assert_same_trees(result, reference)
