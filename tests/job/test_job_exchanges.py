"""The heart job's exchanges on the local engine, counted, and its logistic model against the
pooled maximum-likelihood fit (issue 31 item 1)."""

import numpy as np
from sklearn.linear_model import LogisticRegression

from fedtab.data.example_sites import write_heart_sites
from fedtab.engines.local import LocalFederation
from fedtab.job.exchange_plan import planned_exchanges
from fedtab.engines.site_config import build_site
from fedtab.job import load_job
from fedtab.job.run import site_configs
from fedtab.job.workflow import run_workflow


def _heart_job(tmp_path, impute):
    paths = write_heart_sites(tmp_path / "sites")
    return load_job({"target": "disease", "na_values": ["?"], "sites": {p.stem: {"path": str(p)} for p in paths},
                     "impute": impute, "election": {"selector": "lasso"}, "training": {"model": "logistic"},
                     "run": {"seed": 0, "out": str(tmp_path / "out")}})


def test_the_heart_job_counts_its_exchanges_and_fits_the_pooled_logistic_model(tmp_path):
    spec = _heart_job(tmp_path, {"rounds": 0})  # FedHF-Impute's linear prior: no GNN rounds
    sites = [build_site(c) for c in site_configs(spec)]
    fed = LocalFederation(sites)
    out = run_workflow(fed, spec)
    steps = {s["step"]: s["exchanges"] for s in out.result["steps"]}
    tr = out.outcomes["training"]
    kinds = [p["step"] for p in out.result["participation"]["exchanges"]]
    assert kinds.count("newton") == tr.rounds == 6 and "fit" not in kinds
    # the Newton iteration at zero over every candidate column rode on the ballot, after the imputation's
    # apply (riders are recorded in queue order, before their primary), the one at θ1 on set_mask; the
    # other 4 are the training's exchanges, the evaluation riding on the last
    at = kinds.index("impute_apply")
    assert kinds[at:at + 5] == ["impute_apply", "newton", "ballot", "newton", "set_mask"] and steps["election"] == 2
    assert steps["training"] == tr.rounds - 2 == 4 and "evaluate" in kinds
    ballot_ride = out.newton_ballot
    assert ballot_ride is not None and ballot_ride.sums is not None
    assert set(tr.features) < set(ballot_ride.setup["features"])  # asked over more columns than elected
    assert tr.steps[-1] < 1e-7  # the evaluated iterate is the fit: its own Newton step is below NEWTON_FINAL_TOL
    # the column moments rode on the statistics (taken about the profile ranges' midpoints): one exchange
    assert kinds[kinds.index("impute_schema") + 1] == "impute_stats" and steps["imputation"] == 3
    # the local baselines rode on the first Newton iteration (reused: the run converged)
    assert kinds[kinds.index("local_baseline") + 1] == "newton" and steps["baselines"] == 0
    # 11 with the iteration at zero on set_mask, 12 with the first Newton iteration's own exchange, 13 with
    # the moments' own too, 14 with the baselines' own too, 17 before the riders
    assert sum(steps.values()) == fed.exchange_count == 10
    plan = planned_exchanges(spec)
    assert plan.keys() == steps.keys()
    # the plan is exact but for Newton's convergence: it counts the run stopping at its cap (`rounds`
    # iterations, the evaluation and the baselines each on an exchange of their own)
    newton = ("training", "baselines")
    assert {k: n for k, n in plan.items() if k not in newton} == {k: n for k, n in steps.items() if k not in newton}
    assert plan["training"] - steps["training"] == spec.training.rounds + 1 - tr.rounds
    assert (plan["baselines"], steps["baselines"]) == (1, 0)
    # the ridden baselines are what an exchange of their own gives
    from fedtab.federation.steps.baselines import run_baselines

    alone = run_baselines(fed, tr)
    assert out.result["baselines"]["local_only"]["pooled"] == alone["local_only"]["pooled"]
    assert out.result["baselines"]["majority"] == alone["majority"]
    X, y = zip(*(s.state["train_setup"]["_cache"]["train"] for s in sites))
    X, y = np.vstack(X), np.concatenate(y)
    sk = LogisticRegression(C=1 / (1e-3 * len(y)), tol=1e-12, max_iter=10_000).fit(X, y)
    np.testing.assert_allclose(tr.params["coef"], sk.coef_, atol=1e-6)
    np.testing.assert_allclose(tr.params["intercept"], sk.intercept_, atol=1e-6)


def test_a_robust_heart_job_trains_logistic_by_fedavg_within_its_planned_exchanges(tmp_path):
    """``[trust] robust``: the training step trains the logistic model by FedAvg (Newton serves plain and
    secure sums only), result.json says so, and the plan's exchange count stays an upper bound."""
    paths = write_heart_sites(tmp_path / "sites")
    spec = load_job({"target": "disease", "na_values": ["?"], "sites": {p.stem: {"path": str(p)} for p in paths},
                     "election": {"selector": "lasso"}, "training": {"model": "logistic", "rounds": 3,
                                                                      "local_epochs": 1},
                     "trust": {"robust": True}, "run": {"seed": 0, "out": str(tmp_path / "out")}})
    fed = LocalFederation([build_site(c) for c in site_configs(spec)])
    out = run_workflow(fed, spec)
    kinds = [p["step"] for p in out.result["participation"]["exchanges"]]
    assert kinds.count("fit") == 3 and "newton" not in kinds
    tr = out.result["training"]
    assert tr["solver"] == "fedavg" and "robust mode" in tr["solver_reason"]
    assert out.result["model"]["model"]["params"]["solver"] == "fedavg"
    steps = {s["step"]: s["exchanges"] for s in out.result["steps"]}
    plan = planned_exchanges(spec)
    assert all(steps[k] <= plan[k] for k in steps) and fed.exchange_count <= sum(plan.values())


def test_the_default_heart_job_imputes_in_three_rounds(tmp_path):
    """The job's default ``[impute]`` (issue 31: 3 rounds of 8 local epochs, 20 rounds of one before):
    imputation 5 exchanges (statistics with the moments riding, the 3 rounds with the setup on the first, one
    evaluation), 12 in all (13 before the Newton iteration at zero rode on the ballot) where 20 rounds made 32;
    the plan counts the imputation exactly."""
    spec = _heart_job(tmp_path, {})
    assert (spec.impute.rounds, spec.impute.local_epochs, spec.impute.patience) == (3, 8, 0)
    fed = LocalFederation([build_site(c) for c in site_configs(spec)])
    out = run_workflow(fed, spec)
    steps = {s["step"]: s["exchanges"] for s in out.result["steps"]}
    kinds = [p["step"] for p in out.result["participation"]["exchanges"]]
    assert kinds.count("impute_fit") == 3 and out.result["imputation"]["rounds"] == 3
    assert steps["imputation"] == 5 == planned_exchanges(spec)["imputation"]
    assert fed.exchange_count == sum(steps.values()) == 12
    kinds_at = kinds.index("ballot")
    assert kinds[kinds_at - 2:kinds_at + 3] == ["impute_apply", "newton", "ballot", "newton", "set_mask"]


def test_the_heart_job_with_patience_stops_its_imputation_rounds_on_the_validation_plateau(tmp_path):
    """``[impute] patience = 3`` (off by default) on 20 rounds of one epoch: the rounds stop once the
    median site's validation RMSE plateaus — 13 exchanges in all here (14 before the iteration at zero rode
    on the ballot, 16 before the moments rode on
    the statistics and the first Newton iteration on the election's set_mask; 30 with every round) — and
    the plan, which counts every round, stays an upper bound (issue 31)."""
    assert _heart_job(tmp_path, {}).impute.patience == 0  # every round runs by default
    spec = _heart_job(tmp_path, {"rounds": 20, "local_epochs": 1, "patience": 3})
    assert (spec.impute.rounds, spec.impute.patience) == (20, 3)
    fed = LocalFederation([build_site(c) for c in site_configs(spec)])
    out = run_workflow(fed, spec)
    steps = {s["step"]: s["exchanges"] for s in out.result["steps"]}
    rounds = out.result["imputation"]["rounds"]
    assert 3 < rounds < 20 and steps["imputation"] == rounds + 2
    assert fed.exchange_count == sum(steps.values()) == 13
    plan = planned_exchanges(spec)
    assert plan["imputation"] == 22 and all(steps[k] <= plan[k] for k in steps)
