"""Differential privacy: calibration and composition, noise added at the site, clipping, reports."""

import math

import numpy as np
import pandas as pd
import pytest

from fedtab.federation.protocol import set_options

from fedtab.privacy import DisclosurePolicy
from fedtab.engines.local import LocalFederation
from fedtab.federation import Message, Site, run_election, run_training
from fedtab.privacy.accountant import PrivacyLedger, calibrate, epsilon_of
from fedtab.privacy.dp import clip_update, noise_rng, parse_dp
from tests.builders import classification_parts

pytestmark = pytest.mark.requires("dp_accounting")  # imported when a test runs, not at collection


def test_calibration_spends_the_target_and_composition_is_sublinear():
    z = calibrate(2.0, 1e-5, 12)
    assert 0.99 * 2.0 <= epsilon_of(z, 12, 1e-5) <= 2.0
    assert calibrate(2.0, 1e-5, 24) > z > calibrate(4.0, 1e-5, 12)
    ledger = PrivacyLedger.for_plan({"epsilon": 2.0, "delta": 1e-5}, {"describe": 3, "fit": 9})
    ledger.spend("describe", 3)
    ledger.spend("fit", 9)
    report = ledger.report()
    assert report["total"] == pytest.approx(2.0, rel=0.01)
    assert report["total"] < sum(report["steps"].values())  # composing beats adding
    with pytest.raises(RuntimeError, match="exceeds the 9 planned"):
        ledger.spend("fit")


def test_dp_settings_are_validated():
    assert parse_dp(None) is None and parse_dp({"epsilon": math.inf}) is None
    for bad, match in [({"epsilon": 0}, "epsilon > 0"), ({"epsilon": 1, "delta": 2}, "delta"),
                       ({"epsilon": 1, "clip": -1}, "clip"), ({"epsilon": 1, "sigma": 3}, "unknown")]:
        with pytest.raises(ValueError, match=match):
            parse_dp(bad)


@pytest.fixture(scope="module")
def parts():
    return classification_parts(900, 12, 4, 2, shuffle=False)[1]


def test_site_adds_calibrated_noise_to_clipped_values(parts):
    frame = parts[0].copy()
    a, b = frame.columns[:2]
    frame.loc[frame.index[0], a] = 1e6  # an outlier: clipping bounds its influence
    # a site whose own noise floor (ε ≤ 100 per release) is below the z asked for, and a budget for 300 draws
    site = Site("a", frame, "target", test_size=0,
                policy=DisclosurePolicy(max_epsilon_per_release=100.0, epsilon_budget=1e9))
    z, bounds = 0.5, [-10.0, 10.0]
    req = Message("describe", meta={"features": [a, b], "dp": {"z": z, "bounds": bounds, "clip": 1.0}})
    draws = np.stack([site.handle(req).arrays["sum"] for _ in range(300)])
    clipped = frame[[a, b]].clip(-10, 10).sum().to_numpy()
    assert np.allclose(draws.mean(0), clipped, atol=4 * z * 20 * math.sqrt(2) / math.sqrt(300))
    # Δ(sum) = ‖max(hi - lo, |lo|, |hi|)‖ over the two columns = 20·√2
    assert draws.std(0) == pytest.approx([z * 20 * math.sqrt(2)] * 2, rel=0.15)
    assert not np.array_equal(draws[0], draws[1])  # fresh noise, not a seed the server picks
    reply = site.handle(Message("describe", meta={"dp": {"z": z}}))
    assert reply.is_error and "public value bounds" in reply.meta["error"]


def test_dp_gradient_descent_clips_per_example_gradients():
    from fedtab.privacy.dp import dp_logistic_update

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(200, 3)), rng.integers(0, 2, 200)
    start = {"coef": np.zeros((1, 3)), "intercept": np.zeros(1)}
    quiet = {"z": 1e-15, "clip": 1e3}  # no noise, no clipping (every |grad| < 1e3): plain gradient descent
    out = dp_logistic_update(start, X, y, steps=1, lr=0.5, l2=0.0, spec=quiet, rng=noise_rng())
    grad = ((0.5 - y)[:, None] * np.c_[X, np.ones(200)]).mean(0)
    assert np.allclose(np.r_[out["coef"][0], out["intercept"]], -0.5 * grad)
    # with clip C each row moves the sum by at most C, so one step moves theta by at most lr*C
    X[0] = 1e6
    tight = dp_logistic_update(start, X, y, steps=1, lr=1.0, l2=0.0, spec={"z": 1e-12, "clip": 0.01}, rng=noise_rng())
    assert np.linalg.norm(np.r_[tight["coef"][0], tight["intercept"]]) <= 0.01 + 1e-9


def test_steps_with_more_noise_cost_less_privacy():
    z = 2.0
    assert epsilon_of(z, {4.0: 200, 1.0: 4}, 1e-5) < epsilon_of(z, 204, 1e-5)
    ledger = PrivacyLedger.for_plan({"epsilon": 8.0}, {"describe": 3, "fit": 200}, {"fit": 4.0})
    assert ledger.multiplier("fit") == pytest.approx(4 * ledger.multiplier("describe"))
    ledger.spend("describe", 3)
    ledger.spend("fit", 200)
    assert ledger.report()["total"] == pytest.approx(8.0, rel=0.01)


def test_dp_fedavg_clips_the_update_before_noising():
    old = {"w": np.zeros(50)}
    new = {"w": np.full(50, 100.0)}
    out = clip_update(new, old, {"z": 1e-9, "clip": 2.0}, noise_rng())
    assert np.linalg.norm(out["w"]) == pytest.approx(2.0, rel=1e-6)


def test_dp_training_reports_the_privacy_spent_and_rejects_exact_models(parts):
    fed = LocalFederation([Site(f"s{i}", p, "target") for i, p in enumerate(parts)])
    set_options(fed, dp={"epsilon": 4.0, "delta": 1e-5, "bounds": [-10, 10]})
    out = run_training(fed, list(parts[0].columns[:3]), rounds=3, local_epochs=1)
    assert out.privacy["total"] == pytest.approx(4.0, rel=0.01)
    # under DP logistic regression trains by FedAvg (Newton serves plain and secure sums only): DP
    # gradient descent, 4 steps per local epoch, each step one release, 3 rounds
    assert out.solver == "fedavg" and "DP" in out.solver_reason
    assert out.privacy["releases"] == {"training.describe": 3, "training.fit": 4 * 3, "training.evaluate": 1}
    assert set(out.privacy["steps"]) == {"training.describe", "training.fit", "training.evaluate"}
    set_options(fed, dp={"epsilon": 1.0, "bounds": [-10, 10]})
    with pytest.raises(ValueError, match="exact-aggregation model 'gnb'"):
        run_training(fed, list(parts[0].columns[:1]), model="gnb")


def test_dp_ballots_are_noisy_and_accounted(parts):
    fed = LocalFederation([Site(f"s{i}", p, "target") for i, p in enumerate(parts)])
    req = Message("ballot", meta={"dp": {"z": 1.0, "bounds": None, "clip": 1.0}})
    a, b = (fed.site("s0").handle(req) for _ in range(2))
    assert not np.array_equal(a.arrays["scores"], b.arrays["scores"])
    assert ((a.arrays["scores"] >= 0) & (a.arrays["scores"] <= 1)).all()
    from fedtab.federation.workflows.election.site import unpack_mask

    scores = a.arrays["scores"]  # the mask travels as bits (one per score)
    assert np.array_equal(unpack_mask(a.arrays["mask"], scores.size), scores > 0.5)
    set_options(fed, dp={"epsilon": 2.0, "bounds": [-10, 10]})
    outcome = run_election(fed, 0.5, describe="train")
    assert outcome.privacy["releases"] == {"election.ballot": 1, "election.describe": 3}
    assert outcome.privacy["total"] == pytest.approx(2.0, rel=0.01)


def test_dp_imputation_releases_no_validation_errors():
    pytest.importorskip("torch")
    from fedtab.federation.workflows.imputation import DP_STEPS_PER_ROUND, ImputeConfig, run_imputation

    rng = np.random.default_rng(0)
    full = pd.DataFrame(rng.normal(size=(900, 4)) @ rng.normal(size=(4, 4)), columns=list("abcd"))
    fed = LocalFederation([Site(f"s{i}", full.iloc[i * 300:(i + 1) * 300], test_size=0.1) for i in range(3)])
    dp = {"epsilon": 8.0, "delta": 1e-5, "bounds": [-20, 20]}
    set_options(fed, dp=dp)
    res = run_imputation(fed, ImputeConfig(rounds=1, hidden_dim=4, n_layers=1))
    assert res.privacy["releases"] == {"imputation.schema": 3, "imputation.stats": 7,
                                       "imputation.fit": DP_STEPS_PER_ROUND}
    assert res.validation["overall"] is None and res.validation["per_site"] == {}
    kinds = {r.kind for r in fed.traffic.records}
    assert "impute_eval" not in kinds
    assert np.abs(np.nan_to_num(res.pooled.corr)).max() <= 1.0


def _neighbouring_rows(seed: int, f: int, radius: float, missing: float) -> tuple[np.ndarray, np.ndarray]:
    """A random base table and the same table with row 0 replaced by an adversarial row:
    both rows on the clipping sphere (or inside it), with random missing cells."""
    from fedtab.privacy.dp import clip_rows

    rng = np.random.default_rng(seed)
    base = rng.normal(size=(6, f)) * rng.choice([0.1, 1.0, 30.0], size=(6, 1))
    base[rng.random(base.shape) < missing] = np.nan
    other = base.copy()
    other[0] = rng.normal(size=f) * 100
    other[0, rng.random(f) < missing] = np.nan
    return clip_rows(base, radius), clip_rows(other, radius)


@pytest.mark.parametrize("seed", range(60))
def test_statistics_sensitivities_bound_any_replaced_row(seed):
    from fedtab.impute.stats import STAT_ARRAYS, site_stats
    from fedtab.privacy.dp import row_radius, stats_sensitivity

    f = 1 + seed % 7
    r = row_radius(f)
    cols = [f"c{i}" for i in range(f)]
    a, b = _neighbouring_rows(seed, f, r, missing=(seed % 3) * 0.3)
    sa, sb = site_stats(a, cols), site_stats(b, cols)
    sens = stats_sensitivity(r, f)
    for k in STAT_ARRAYS:
        moved = float(np.linalg.norm(getattr(sa, k) - getattr(sb, k)))
        assert moved <= sens[k] * (1 + 1e-9), (k, moved, sens[k])


@pytest.mark.parametrize("seed", range(40))
def test_moment_sensitivities_bound_any_replaced_row(seed):
    from fedtab.privacy.dp import clip_values, moment_sensitivity

    rng = np.random.default_rng(seed)
    lo, hi = -rng.uniform(0, 5, 3), rng.uniform(0, 5, 3)
    a = rng.normal(size=(5, 3)) * 10
    b = a.copy()
    b[0] = rng.choice([-1e3, 1e3, np.nan], size=3)  # an extreme or missing replacement
    a[0, rng.random(3) < 0.3] = np.nan

    def moments(x):
        x = clip_values(x, lo, hi)
        obs = ~np.isnan(x)
        z = np.where(obs, x, 0.0)
        return {"count": obs.sum(0), "sum": z.sum(0), "sumsq": (z * z).sum(0)}

    ma, mb, sens = moments(a), moments(b), moment_sensitivity(lo, hi)
    for k in ma:
        assert float(np.linalg.norm(ma[k] - mb[k])) <= sens[k] * (1 + 1e-9), k


def test_dp_describe_does_not_suppress_small_cells(parts):
    # cell suppression depends on the data (a replaced row can flip it and release a whole
    # column sum), so under DP the calibrated noise replaces it
    frame = parts[0].copy()
    a, b = frame.columns[:2]
    frame.loc[frame.index[3:], a] = np.nan  # column a observed in 3 rows only
    # a site that accepts nearly no noise (its floor z ≈ 1e-3 at ε ≤ 10⁶ per release)
    site = Site("a", frame, "target", test_size=0, policy=DisclosurePolicy(max_epsilon_per_release=1e6,
                                                                            epsilon_budget=1e9))
    plain = site.handle(Message("describe", meta={"features": [a, b]}))
    assert plain.arrays["count"][0] == 0 and plain.arrays["sum"][0] == 0  # suppressed
    noisy = site.handle(Message("describe", meta={"features": [a, b], "dp": {"z": 1e-9, "bounds": [-10, 10]}}))
    assert noisy.arrays["count"][0] == pytest.approx(3, abs=0.05)  # z 1e-9 raised to the floor 1e-3: Δ = √2
    assert noisy.arrays["sum"][0] == pytest.approx(frame[a].clip(-10, 10).sum(), abs=0.5)  # Δ = 20·√2


def test_noise_release_noises_each_declared_array_and_refuses_an_undeclared_one(monkeypatch):
    import fedtab.privacy.dp as dp

    monkeypatch.setattr(dp, "noise_rng", lambda: np.random.default_rng(3))
    arrays = {"a": np.array([1, 2]), "b": np.zeros((2, 2))}
    out = dp.noise_release(arrays, {"a": 2.0, "b": 0.5}, {"z": 1.5})
    rng = np.random.default_rng(3)
    np.testing.assert_allclose(out["a"], [1, 2] + rng.normal(0, 3.0, 2), atol=1e-12)
    np.testing.assert_allclose(out["b"], rng.normal(0, 0.75, (2, 2)), atol=1e-12)
    assert out["a"].dtype == np.float64
    with pytest.raises(ValueError, match=r"no declared sensitivity for array\(s\) \['b'\]"):
        dp.noise_release(arrays, {"a": 2.0}, {"z": 1.5})
    with pytest.raises(ValueError, match="noise multiplier"):
        dp.noise_release(arrays, {"a": 2.0, "b": 1.0}, {"z": 0})
