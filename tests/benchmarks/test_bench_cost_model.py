"""benchmarks.cost_model's arithmetic (its timings are the script's, never a test's)."""

import pytest

from benchmarks.cost_model import rated


def test_ratios_are_each_estimate_at_the_median_rate_over_the_measured_time():
    runs = [{"work": 2e9, "seconds": 1.0}, {"work": 1e9, "seconds": 1.0}, {"work": 4e9, "seconds": 1.0},
            {"work": 1e6, "seconds": 0.001}]  # the last is below the timer floor
    rate, out = rated(runs, floor=0.05)
    assert rate == pytest.approx(2e9)  # median of the three timed runs' work per second
    assert [round(r["ratio"], 6) for r in out[:3]] == [1.0, 0.5, 2.0]
    assert out[3]["ratio"] == pytest.approx(1.0)  # both below the floor: they agree
    # an estimate far above a short run is not hidden by the floor
    _, out = rated([{"work": 2e9, "seconds": 1.0}, {"work": 2e9, "seconds": 0.01}], floor=0.05)
    assert out[1]["ratio"] == pytest.approx(20.0)
