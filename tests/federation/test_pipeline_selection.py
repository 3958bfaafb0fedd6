"""The engines' pipeline config reaches the election's consensus rules and the pooled score test
(so a Flower or FLARE run can ask for them), and refuses combinations that cannot work."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.engines.pipeline import PipelineConfig, run_pipeline
from fedtab.federation import run_election, run_pooled_score_test
from fedtab.federation.site import Site


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


def test_score_test_step_selects_for_training_and_equals_the_flow():
    out = run_pipeline(_fed(), {"steps": "score-test,training", "rounds": 2, "score-test-alpha": 0.05})
    direct = run_pooled_score_test(_fed(), alpha=0.05)
    assert out["score_test"]["selected"] == list(direct.selected_names)
    assert {"x1", "x2"} <= set(out["score_test"]["selected"])  # x2: found only conditionally
    assert out["training"]["features"] == out["score_test"]["selected"]
    assert "election" not in out and out["score_test"]["exchanges"] == direct.exchanges


def test_consensus_settings_reach_the_election():
    masks = {}
    for alpha in (0.5, 0.9):
        out = run_pipeline(_fed(), {"steps": "election", "consensus": "stouffer", "consensus-alpha": alpha,
                                    "freedom-degree": 0.0})
        direct = run_election(_fed(), 0.0, consensus="stouffer", consensus_alpha=alpha).result
        assert out["election"]["mask"] == [bool(m) for m in direct.mask]
        masks[alpha] = out["election"]["mask"]
    plain = run_pipeline(_fed(), {"steps": "election", "freedom-degree": 0.0})["election"]["mask"]
    assert plain == [bool(m) for m in run_election(_fed(), 0.0).result.mask]
    assert len({tuple(m) for m in (masks[0.5], masks[0.9], plain)}) == 3  # each setting changed the mask


@pytest.mark.parametrize("config, fragment", [
    ({"steps": "election,score-test"}, "give one of them"),
    ({"consensus": "majority"}, "unknown consensus"),
    ({"consensus-alpha": 1.5}, "consensus_alpha must be a number in (0, 1)"),
    ({"score-test-alpha": 0}, "must be a number in (0, 1)"),
])
def test_bad_selection_settings_are_refused(config, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        PipelineConfig.from_mapping(config)


def test_score_test_refuses_dp_and_robust_runs():
    for extra in ({"robust": True}, {"dp": '{"epsilon": 8, "delta": 1e-5, "bounds": [-10, 10]}'}):
        with pytest.raises(ValueError, match="no DP or robust mode"):
            run_pipeline(_fed(), {"steps": "score-test", **extra})
