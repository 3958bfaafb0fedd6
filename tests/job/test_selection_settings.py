"""The job's ``[election]`` reaches the election's consensus rules and the pooled score test
(``method = "score-test"``; so a Flower or FLARE run can ask for them through the plan), and
refuses combinations that cannot work."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation import run_election, run_pooled_score_test
from fedtab.federation.site.core import Site
from fedtab.job.spec import JobError, spec_from_plan
from fedtab.job.workflow import run_workflow


def _table(n=1200, seed=0):
    """``x2`` has no marginal effect, only a conditional one given ``x1`` (see test_pooled_score_test)."""
    rng = np.random.default_rng(seed)
    x1 = rng.normal(size=n)
    x2 = 0.5 * x1 + np.sqrt(0.75) * rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(3 * x1 - 1.5 * x2)))).astype(int)
    t = pd.DataFrame({"x1": x1, "x2": x2, **{f"n{i}": rng.normal(size=n) for i in range(6)}})
    t["target"] = y
    return t


def _fed(selector="anova"):
    t = _table()
    parts = np.array_split(np.arange(len(t)), 3)
    return LocalFederation([Site(f"s{i}", t.iloc[p].reset_index(drop=True), "target", selector=selector, seed=i)
                            for i, p in enumerate(parts)])


def _run(plan, jobs):
    return run_workflow(_fed(), spec_from_plan(jobs.plan(**plan))).result


def test_score_test_step_selects_for_training_and_equals_the_flow(jobs):
    out = _run({"election": {"method": "score-test", "score_test_alpha": 0.05},
                "training": {"rounds": 2, "local_epochs": 1}}, jobs)
    direct = run_pooled_score_test(_fed(), alpha=0.05)
    assert out["election"]["method"] == "score-test"
    assert out["election"]["selected"] == list(direct.selected_names)
    assert {"x1", "x2"} <= set(out["election"]["selected"])  # x2: found only conditionally
    assert out["training"]["features"] == out["election"]["selected"]
    assert out["election"]["exchanges"] == direct.exchanges


def test_consensus_settings_reach_the_election(jobs):
    masks = {}
    for alpha in (0.5, 0.9):
        out = _run({"election": {"consensus": "stouffer", "consensus_alpha": alpha, "freedom_degree": 0.0},
                    "training": None}, jobs)
        direct = run_election(_fed(), 0.0, consensus="stouffer", consensus_alpha=alpha).result
        assert out["election"]["mask"] == [bool(m) for m in direct.mask]
        masks[alpha] = out["election"]["mask"]
    plain = _run({"election": {"freedom_degree": 0.0}, "training": None}, jobs)["election"]["mask"]
    assert plain == [bool(m) for m in run_election(_fed(), 0.0).result.mask]
    assert len({tuple(m) for m in (masks[0.5], masks[0.9], plain)}) == 3  # each setting changed the mask


@pytest.mark.parametrize("election, fragment", [
    ({"method": "elect"}, "[election] method must be one of ['vote', 'score-test']"),
    ({"consensus": "majority"}, "unknown consensus"),
    ({"consensus_alpha": 1.5}, "consensus_alpha must be a number in (0, 1)"),
    ({"score_test_alpha": 0}, "[election] score_test_alpha must be a number in (0, 1)"),
    ({"method": "score-test", "tune": "grid"}, "[election] tune applies to method = \"vote\""),
    ({"metod": "vote"}, "unknown key [election] 'metod' (did you mean 'method'?)"),
])
def test_bad_selection_settings_are_refused(election, fragment, jobs):
    import re

    with pytest.raises(JobError, match=re.escape(fragment)):
        jobs.plan(election=election)


def test_score_test_refuses_dp_and_robust_jobs(jobs):
    for extra in ({"trust": {"robust": True}}, {"privacy": {"dp": {"epsilon": 8, "delta": 1e-5, "bounds": [-10, 10]}}}):
        with pytest.raises(JobError, match="no DP or robust mode"):
            jobs.plan(election={"method": "score-test"}, **extra)
