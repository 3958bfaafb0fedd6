"""Secure aggregation and DP through the engines' run config: the in-process engine,
Flower's in-process grid and the FLARE simulator give the same pooled result.

The secure run's pooled model must equal the plain local run's (fixed-point error below
1e-6 relative), and the server must have learned no per-site evaluation (only sums
travel masked), so a flag silently dropped on the way fails.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from fedtab.engines import LocalFederation
from fedtab.engines.pipeline import PipelineConfig, run_pipeline
from fedtab.engines.site_config import build_site
from tests.builders import local_reference, write_classification_sites

RUN = {"steps": "election,training", "freedom-degree": 0.5, "rounds": 2, "local-epochs": 1}
SECURE = {**RUN, "secure-aggregation": True}
FLOWER_APP = Path(__file__).resolve().parents[2] / "src" / "fedtab" / "engines" / "flower_app" / "pyproject.toml"


@pytest.fixture(scope="module")
def site_configs(tmp_path_factory) -> list[dict]:
    return write_classification_sites(tmp_path_factory.mktemp("secure_sites"), 600, 20, 5, 3, table_seed=11,
                                      split_seed=2)


@pytest.fixture(scope="module")
def plain(site_configs) -> dict:
    return local_reference(site_configs, RUN)


def _rel_diff(a: dict, b: dict) -> float:
    """``max |a - b| / max |b|`` over all parameters of the model jointly (an intercept
    near 0 alone would turn a 1e-8 fixed-point difference into a large relative one)."""
    x = np.concatenate([np.ravel(a[k]) for k in sorted(b)]).astype(np.float64)
    y = np.concatenate([np.ravel(b[k]) for k in sorted(b)]).astype(np.float64)
    return float(np.max(np.abs(x - y)) / np.max(np.abs(y)))


def plain_steps(result: dict) -> list[str]:
    return [p["step"] for p in result["participation"]]


def _assert_secure_equals_plain(result: dict, plain: dict) -> None:
    assert plain["training"]["per_site"], "the plain run reports per-site metrics"
    assert result["training"]["per_site"] == {}, "the secure run must not show any site's metrics"
    # every secure sum is in the participation log, with the sites whose masked value it holds
    steps = [p["step"] for p in result["participation"]]
    assert steps.count("fit") == plain_steps(plain).count("fit") and "evaluate" in steps, steps
    assert all(p["sites"] == ["site-1", "site-2", "site-3"] for p in result["participation"])
    assert result["election"]["selected"] == plain["election"]["selected"]
    assert result["training"]["features"] == plain["training"]["features"]
    assert _rel_diff(result["training"]["params"], plain["training"]["params"]) < 1e-6
    for key in ("weighted_f1", "accuracy"):
        assert result["training"]["pooled"][key] == pytest.approx(plain["training"]["pooled"][key], rel=1e-6)


def test_local_engine_secure_run_config_equals_plain(site_configs, plain):
    result = local_reference(site_configs, SECURE)
    _assert_secure_equals_plain(result, plain)


def test_flower_in_process_secure_run_equals_local(site_configs, plain):
    flower = pytest.importorskip("fedtab.engines.flower")
    # fresh processes: each site's session keys must survive in Flower's Context.state
    result = flower.run_in_process(site_configs, SECURE, fresh_processes=True)
    assert result["engine"] == "flower"
    _assert_secure_equals_plain(result, plain)


@pytest.mark.slow
def test_flare_simulator_secure_run_equals_local(site_configs, plain, tmp_path):
    nvflare = pytest.importorskip("fedtab.engines.nvflare")
    result = nvflare.run_simulator(site_configs, SECURE, tmp_path, threads=3)
    assert result["engine"] == "nvflare"
    _assert_secure_equals_plain(result, plain)


def test_flower_app_declares_the_privacy_keys():
    # `flwr run --run-config` rejects keys the app does not declare
    declared = tomllib.loads(FLOWER_APP.read_text())["tool"]["flwr"]["app"]["config"]
    assert declared["secure-aggregation"] is False and declared["dp"] == ""
    cfg = PipelineConfig.from_mapping(declared)
    assert cfg.secure_aggregation is False and cfg.dp is None


def test_run_config_dp_is_checked_and_reported(site_configs):
    with pytest.raises(ValueError, match="epsilon"):
        PipelineConfig.from_mapping({"dp": '{"epsilon": -1}'})
    with pytest.raises(ValueError, match="unknown settings"):
        PipelineConfig.from_mapping({"dp": '{"epsilon": 1, "sigma": 3}'})
    with pytest.raises(ValueError, match="dp"):
        PipelineConfig.from_mapping({"dp": "[1, 2]"})
    assert PipelineConfig.from_mapping({"dp": '{"epsilon": "inf"}'}).dp is None  # ε = ∞: no noise
    run = {**RUN, "rounds": 1, "dp": '{"epsilon": 4, "delta": 1e-5, "bounds": [-10, 10]}'}
    result = local_reference(site_configs, run)
    for step in ("election", "training"):
        privacy = result[step]["privacy"]
        assert privacy["epsilon"] == 4 and 0 < privacy["total"] <= 4 + 1e-6, (step, privacy)


def test_private_pipeline_never_asks_sites_for_their_observed_min_and_max(site_configs):
    # job_profile's per-site min/max are two rows' values: a private run must not request them
    run = {"steps": "imputation,election", "secure-aggregation": True, "impute-rounds": 1,
           "impute-config": '{"hidden_dim": 4, "n_layers": 1, "n_threads": 1}'}
    fed = LocalFederation([build_site(c) for c in site_configs])
    result = run_pipeline(fed, run)
    kinds = {r.kind for r in fed.traffic.records}
    assert "job_profile" not in kinds and "impute_apply" in kinds
    assert result["election"]["kept"] > 0 and set(result["imputation"]["applied"]) == set(result["sites"])
