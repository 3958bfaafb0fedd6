"""Pure tuning logic: grid + refine + parsimony, and the peers' hill-climb."""

import numpy as np
import pytest

from fedtab.election.tuning import TuningPoint, choose_parsimonious, grid_tune, hill_climb, tune
from fedtab.report.plots import plot_tuning_curve

D = 40


def mask_of(fd):
    """fd keeps round(fd*D) features (the first ones)."""
    m = np.zeros(D, dtype=bool)
    m[: int(round(fd * D))] = True
    return m


def test_parsimony_prefers_the_smallest_mask_within_tolerance():
    calls = []

    def score(mask):  # rises until 10 features, then flat with tiny wiggles
        calls.append(mask.sum())
        k = mask.sum()
        return min(k, 10) / 10 * 0.8 + (0.004 if k == 32 else 0.0)

    res = grid_tune(mask_of, score, tolerance=0.01)
    assert res.best_score == pytest.approx(0.804)
    assert res.kept == 12 and res.freedom_degree == 0.3  # flat from 10 on: fewest kept among scored fds
    assert res.score >= res.best_score - 0.01
    assert len(calls) == len(set(calls)) == res.evaluations  # each distinct mask scored once
    strict = grid_tune(mask_of, score, tolerance=0.0)
    assert strict.kept == 32 and strict.freedom_degree == 0.8


def test_refinement_scores_around_the_best_grid_point():
    res = grid_tune(mask_of, lambda m: -abs(m.sum() - 13), tolerance=0.0, refine_step=0.025)
    assert res.kept == 13 or res.kept == 14 or res.kept == 12
    stages = {p.stage for p in res.points}
    assert stages == {"grid", "refine"}
    fds = [c["freedom_degree"] for c in res.curve()]
    assert fds == sorted(fds) and 0.325 in fds


def test_hill_climb_follows_the_peer_procedure():
    seen = []

    def score(mask):
        seen.append(int(mask.sum()))
        return -abs(mask.sum() - 12)  # peak at fd 0.3

    res = hill_climb(mask_of, score, start=0.5, step=0.1, bounds=(0.05, 1.0), max_iter=10)
    fds = [p.freedom_degree for p in res.points]
    assert fds[:4] == [0.5, 0.6, 0.45, 0.4]  # up fails → reverse & halve → keep going down
    assert res.freedom_degree == pytest.approx(0.3, abs=0.02)
    assert res.tolerance == 0 and res.method == "hill-climb"
    assert all(0.05 <= f <= 1 for f in fds)


def test_hill_climb_stops_on_a_plateau_where_the_grid_does_not():
    def score(mask):  # plateau around fd 0.5, better region at fd 0.2-0.3
        k = mask.sum()
        return 0.807 if 8 <= k <= 12 else 0.78

    hc = hill_climb(mask_of, score, start=0.5)
    grid = grid_tune(mask_of, score)
    assert hc.freedom_degree == 0.5 and hc.score == pytest.approx(0.78)
    assert grid.score == pytest.approx(0.807) and grid.kept == 8


def test_errors_and_dispatch(tmp_path):
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        grid_tune(mask_of, lambda m: 0.0, grid=(0.5, 1.5))
    with pytest.raises(ValueError, match="unknown tuning method"):
        tune(mask_of, lambda m: 0.0, "random")
    with pytest.raises(ValueError, match="not finite|returned"):
        grid_tune(mask_of, lambda m: float("nan"))
    with pytest.raises(ValueError):
        choose_parsimonious([], 0.01)
    assert choose_parsimonious([TuningPoint(0.2, 0.5, 5, "g"), TuningPoint(0.1, 0.5, 5, "g")], 0).freedom_degree == 0.1
    res = tune(mask_of, lambda m: float(m.sum() > 3), "grid", grid=(0.0, 0.5, 1.0), refine_step=0)
    path = plot_tuning_curve(res, tmp_path / "c.png")
    assert path.stat().st_size > 1000
    assert res.to_dict()["curve"][0]["freedom_degree"] == 0.0
