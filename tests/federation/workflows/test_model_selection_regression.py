"""tune = "cv" on a numeric target (issue 30): linear chains scored by pooled CV squared error,
the guarded one-SE rule, and what a curious server gets from the regression reply."""

import numpy as np
import pandas as pd
import pytest

from fedtab import Site
from fedtab.engines.local import LocalFederation
from fedtab.federation import Message
from fedtab.federation.workflows.selection import select_model
from fedtab.privacy import DisclosurePolicy

SIGNAL = ["x0", "x1", "x2"]


def _table(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 8))
    t = pd.DataFrame(X, columns=[f"x{i}" for i in range(8)])
    t["y"] = 3 * X[:, 0] - 2 * X[:, 1] + 1.5 * X[:, 2] + rng.normal(size=n)
    return t


def _sites(**policy):
    return [Site(f"s{i}", _table(n, i), "y", seed=i, selector="anova", policy=policy or None)
            for i, n in enumerate((160, 120, 90))]


def test_the_selection_keeps_the_signal_within_the_rmse_guard_in_four_exchanges():
    out = select_model(LocalFederation(_sites()), model="linear", grid=(0.0, 0.5, 1.0))
    assert out.task == "regression" and out.personalisation == "none"
    assert set(SIGNAL) <= set(out.features)
    names = {c["name"] for c in out.candidates}
    assert "all columns" in names and len(names) >= 2
    best = min(c["rmse"] for c in out.candidates)
    guard = out.rule["columns"]["rmse_guard"]
    assert out.chosen["rmse"] <= 1.03 * best + 1e-12 and not guard["flagged"]
    assert out.chosen["rmse"] == pytest.approx(np.sqrt(out.chosen["mse"]))
    assert len(out.chosen["fold_mse"]) == out.n_folds >= 2
    # the noise is N(0, 1): a least-squares fit on the signal scores an RMSE near 1 on held-out rows
    assert 0.8 < out.test["modes"]["none"]["pooled"]["rmse"] < 1.3
    assert out.exchanges["total"] == 4 and out.exchanges["steps"]["select.fit"] == 1
    assert out.model["params"]["coef"] and len(out.model["params"]["coef"]) == len(out.features)


def test_the_guard_passes_over_a_sparser_candidate_worse_by_more_than_three_percent():
    from fedtab.election.one_se import Scored, guarded_one_standard_error

    # a sparse mask with a noisy, overlapping fold curve, 10 % worse in RMSE: the plain one-SE rule
    # takes it, the guard (on best RMSE / RMSE, tolerance 0.03 / 1.03) does not
    sparse = Scored("fd=0", 2, 1.21, (0.5, 1.9, 1.23))
    full = Scored("all columns", 8, 1.0, (1.0, 1.0, 1.0))
    ratio = [1.0 / np.sqrt(1.21), 1.0]
    choice, guard = guarded_one_standard_error([sparse, full], ratio, tolerance=0.03 / 1.03)
    assert guard.rule_choice == "fd=0" and choice.chosen.name == "all columns" and guard.passed_over == ("fd=0",)


def test_a_site_refuses_a_regression_slot_with_personalisation():
    site = _sites()[0]
    fed = LocalFederation([site])
    select_model(fed, model="linear", grid=(0.5,))
    reply = site.handle(Message("select_evaluate", {"param:coef": np.zeros((1, 1, 8)),
                                                    "param:intercept": np.zeros((1, 1))},
                                {"slots": [[0, "local"]], "stage": "cv"}))
    assert reply.is_error or reply.is_refusal


def test_a_curious_servers_sweep_of_crafted_models_is_capped_like_classification():
    """Crafted linear models through select_evaluate: each slot is one evaluation of the fold
    it is scored on (the server's operator opt-in or not), and past the site's cap the sweep is refused."""
    M = 20
    for opted in (False, True):
        site = Site("h", _table(300, 7), "y", seed=0, policy=DisclosurePolicy(
            min_rows=10, max_evaluations=25, max_models_per_request=100, allow_server_row_sets=opted))
        d = 8
        rng = np.random.default_rng(1)
        setup = {"setup:masks": np.ones((1, d), bool), "setup:chain_mask": np.zeros(M, np.int64),
                 "setup:chain_fold": np.arange(M) % 2, "setup:mean": np.zeros((M, d)),
                 "setup:std": np.ones((M, d)), "setup:chain_l2": np.zeros(M)}
        params = {"param:coef": rng.normal(size=(M, 1, d)), "param:intercept": np.zeros((M, 1))}
        meta = {"setup": {"features": [f"x{i}" for i in range(d)], "classes": [], "model": {"name": "linear",
                                                                                          "params": {}},
                          "without": [""] * M}, "epochs": 1}
        fit = site.handle(Message("select_fit", {**setup, **params}, meta))
        assert not fit.is_refusal and fit.arrays["param:xtx"].shape == (M, d + 1, d + 1)
        # the statistics are over the site's own fit:k rows (count = its declared rows)
        assert set(fit.arrays["param:count"].tolist()) == {float(site.n_rows("fit:0")), float(site.n_rows("fit:1"))}
        slots = [[m, "none"] for m in range(M)]
        answered, last = [], None
        for _ in range(3):
            params = {"param:coef": rng.normal(size=(M, 1, d)), "param:intercept": np.zeros((M, 1))}
            r = site.handle(Message("select_evaluate", params, {"slots": slots, "stage": "cv"}))
            answered.append(not r.is_refusal)
            last = r
            if not r.is_refusal:
                assert set(r.arrays) == {"sse", "sae", "sum_y", "sum_y2"} and (r.arrays["sse"] > 0).all()
        # 10 models per fold per request against a cap of 25 per fold: the third request is refused
        assert answered == [True, True, False], opted
        assert "max_evaluations" in last.meta["reason"]
        assert site.ledger.run_count(site.run_id, "evaluate:fold:0") == 20  # the refused request charged nothing


def test_the_job_reports_cv_rmse_beside_the_chosen_mask_and_trains_on_it():
    from fedtab.job.spec import parse_job
    from fedtab.job.workflow import run_workflow
    from fedtab.report.selection import selection_section

    spec = parse_job({"target": "y", "training": {"model": "linear"}, "election": {"tune": "cv", "grid": [0.0, 0.5]}},
                     sites_required=False)
    out = run_workflow(LocalFederation(_sites()), spec)
    sel = out.result["selection"]
    assert sel["task"] == "regression" and sel["cv_rmse"] == pytest.approx(sel["chosen"]["rmse"])
    assert out.result["training"]["features"] == sel["features"] and set(SIGNAL) <= set(sel["features"])
    assert [s["step"] for s in out.result["steps"]][-2:] == ["selection", "training"]
    html = selection_section(out.result)
    assert "CV RMSE" in html and "log-loss" not in html
