"""The same boosted trees on the local engine, Flower and the NVIDIA FLARE simulator.

The pipeline's ``training`` step with ``model = {"name": "gbdt", ...}`` runs the GBDT workflow
(one ``gbdt_level`` exchange per depth level) on every engine. Flower runs in process with a
fresh ClientApp state per message (the boosting state survives in Flower's ``Context.state``);
the FLARE simulator runs real client processes. Trees must be equal array for array.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.builders import local_reference, write_classification_sites

PARAMS = {"n_trees": 3, "max_depth": 3, "max_bins": 16}
RUN = {"steps": "training", "model": json.dumps({"name": "gbdt", "params": PARAMS})}


@pytest.fixture(scope="module")
def site_configs(tmp_path_factory) -> list[dict]:
    return write_classification_sites(tmp_path_factory.mktemp("gbdt_sites"), 600, 6, 3, 1, table_seed=7, split_seed=0)


@pytest.fixture(scope="module")
def reference(site_configs) -> dict:
    return local_reference(site_configs, RUN)


def _levels(result: dict) -> int:
    return sum(1 for p in result["participation"] if p["step"] == "gbdt_level")


def _assert_same_trees(result: dict, ref: dict) -> None:
    assert result["training"]["model"] == "gbdt"
    assert set(result["training"]["params"]) == set(ref["training"]["params"])
    for key, value in ref["training"]["params"].items():
        np.testing.assert_array_equal(np.asarray(result["training"]["params"][key]), np.asarray(value), err_msg=key)
    assert result["training"]["weighted_f1"] == pytest.approx(ref["training"]["weighted_f1"], abs=1e-12)
    assert _levels(result) == _levels(ref)


def test_local_engine_runs_one_exchange_per_level(reference):
    n_trees = len(reference["training"]["params"]["tree_ptr"]) - 1
    assert n_trees == PARAMS["n_trees"]
    assert _levels(reference) <= PARAMS["n_trees"] * PARAMS["max_depth"] + 1
    assert reference["training"]["weighted_f1"] > 0.6


@pytest.mark.requires("flwr")
def test_flower_grows_the_same_trees(site_configs, reference):
    from fedtab.engines import flower

    result = flower.run_in_process(site_configs, RUN, fresh_processes=True)
    assert result["engine"] == "flower"
    _assert_same_trees(result, reference)


@pytest.mark.slow
@pytest.mark.requires("nvflare")
def test_flare_simulator_grows_the_same_trees(site_configs, reference, tmp_path):
    from fedtab.engines.nvflare import run_simulator

    result = run_simulator(site_configs, RUN, tmp_path, threads=3)
    assert result["engine"] == "nvflare"
    _assert_same_trees(result, reference)
