"""Secure aggregation and DP through the job plan in the engines' run config: the in-process
engine, Flower's in-process grid and the FLARE simulator give the same pooled result.

The secure run's pooled model must equal the plain local run's (fixed-point error below
1e-6 relative), and the server must have learned no per-site evaluation (only sums
travel masked), so a flag silently dropped on the way fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedtab.engines import LocalFederation
from fedtab.engines.site_config import build_site
from tests.builders import write_classification_sites

JOB = {"election": {"freedom_degree": 0.5}, "training": {"rounds": 2, "local_epochs": 1}}
SECURE = {**JOB, "privacy": {"secure_aggregation": True}}


@pytest.fixture(scope="module")
def site_configs(tmp_path_factory) -> list[dict]:
    return write_classification_sites(tmp_path_factory.mktemp("secure_sites"), 600, 20, 5, 3, table_seed=11, split_seed=2)


@pytest.fixture(scope="module")
def plain(site_configs, jobs) -> dict:
    return jobs.local(site_configs, jobs.plan(**JOB))


def _rel_diff(a: dict, b: dict) -> float:
    """``max |a - b| / max |b|`` over all parameters of the model jointly (an intercept
    near 0 alone would turn a 1e-8 fixed-point difference into a large relative one)."""
    x = np.concatenate([np.ravel(a[k]) for k in sorted(b)]).astype(np.float64)
    y = np.concatenate([np.ravel(b[k]) for k in sorted(b)]).astype(np.float64)
    return float(np.max(np.abs(x - y)) / np.max(np.abs(y)))


def _assert_secure_equals_plain(result: dict, plain: dict) -> None:
    assert plain["training"]["metrics"]["per_site"], "the plain run reports per-site metrics"
    assert result["training"]["metrics"]["per_site"] == {}, "the secure run must not show any site's metrics"
    assert result["privacy"] == {"secure_aggregation": True, "dp": None}
    # every secure sum is in the participation log, with the sites whose masked value it holds
    steps = [p["step"] for p in result["participation"]["exchanges"]]
    plain_steps = [p["step"] for p in plain["participation"]["exchanges"]]
    assert steps.count("fit") == plain_steps.count("fit") and "evaluate" in steps, steps
    assert all(p["sites"] == ["site-1", "site-2", "site-3"] for p in result["participation"]["exchanges"])
    assert result["election"]["selected"] == plain["election"]["selected"]
    assert result["training"]["features"] == plain["training"]["features"]
    assert _rel_diff(result["model"]["params"], plain["model"]["params"]) < 1e-6
    for key in ("weighted_f1", "accuracy"):
        assert result["training"]["metrics"]["pooled"][key] == pytest.approx(
            plain["training"]["metrics"]["pooled"][key], rel=1e-6)


def test_local_engine_secure_run_config_equals_plain(site_configs, plain, jobs):
    result = jobs.local(site_configs, jobs.plan(**SECURE))
    _assert_secure_equals_plain(result, plain)


def test_flower_in_process_secure_run_equals_local(site_configs, plain, jobs):
    flower = pytest.importorskip("fedtab.engines.flower")
    # fresh processes: each site's session keys must survive in Flower's Context.state
    result = flower.run_in_process(site_configs, jobs.config(jobs.plan(**SECURE)), fresh_processes=True)
    assert result["engine"] == "flower"
    _assert_secure_equals_plain(result, plain)


# FLARE: the secure job's model on the simulator equals the local engine's in
# tests/job/test_job_guarantees.py::test_a_guarded_job_gives_the_same_model_on_the_flare_simulator
# (one FLARE simulator run for both: each costs seconds to start)


def test_job_dp_is_checked_and_its_total_budget_is_split_over_the_steps(site_configs, jobs):
    from fedtab.job.spec import JobError

    with pytest.raises(JobError, match="epsilon"):
        jobs.plan(privacy={"dp": {"epsilon": -1}})
    with pytest.raises(JobError, match=r"unknown key \[privacy\] dp.'sigma'"):
        jobs.plan(privacy={"dp": {"epsilon": 1, "sigma": 3}})
    with pytest.raises(JobError, match=r"\[privacy\] dp must be a table"):
        jobs.plan(privacy={"dp": [1, 2]})
    assert jobs.plan(privacy={"dp": {"epsilon": float("inf")}})["privacy"]["dp"] is None  # ε = ∞: no noise
    plan = jobs.plan(**{**JOB, "training": {"rounds": 1, "local_epochs": 1}},
                     privacy={"dp": {"epsilon": 4, "delta": 1e-5, "bounds": [-10, 10]}})
    result = jobs.local(site_configs, plan)
    dp = result["privacy"]["dp"]
    assert dp["epsilon"] == 4 and dp["delta"] == 1e-5
    assert set(dp["steps"]) == {"run"}  # one accountant composes the election's and the training's releases
    share = dp["steps"]["run"]
    assert share["epsilon"] == 4 and share["delta"] == 1e-5 and share["steps"] == ["election", "training"]
    assert 0 < share["epsilon_spent"] <= 4 + 1e-6, share
    for step in ("election", "training"):
        assert result[step]["privacy"]["epsilon"] == 4
    assert dp["epsilon_spent"] == pytest.approx(sum(s["epsilon_spent"] for s in dp["steps"].values()))
    assert 0 < dp["epsilon_spent"] <= 4 + 1e-6


def test_private_job_never_asks_sites_for_their_observed_ranges(site_configs, jobs):
    # job_profile's coarse ranges are released in the clear: a private job must not request them
    pytest.importorskip("torch")
    plan = jobs.plan(schema={}, evaluation={}, election={}, training=None, privacy={"secure_aggregation": True},
                     impute={"rounds": 1, "local_epochs": 1, "hidden_dim": 4, "n_layers": 1, "n_threads": 1})
    fed = LocalFederation([build_site(c) for c in site_configs])
    from fedtab.job.spec import spec_from_plan
    from fedtab.job.workflow import run_workflow

    result = run_workflow(fed, spec_from_plan(plan)).result
    kinds = {r.kind for r in fed.traffic.records}
    steps = {p["step"] for p in fed.participation}  # impute_apply rides on the next exchange (the ballot)
    assert "job_profile" not in kinds | steps and "impute_apply" in kinds | steps
    assert result["election"]["kept"] > 0 and set(result["imputation"]["imputed_cells"]) == set(result["sites"])
