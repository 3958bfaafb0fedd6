"""Overflow-safe reply checks and reducers that survive noisy counts (issue 20 item 7).

* Sums whose squares overflow float64 (``1e200``-``1e300``) once slipped through the moment
  and correlation checks as ``inf - inf``; honest sums near the float range were pooled into
  NaN correlations. The checks and the pooling now scale before they square.
* Under DP a site's released counts are noisy: negative or below one row. No reducer may
  crash on them or divide by them; every one reads a count below 1 as 0.
"""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest

from fedtab.data import classification_table, split_rows
from fedtab.engines.local import LocalFederation
from fedtab.federation import Site, run_election, run_training
from fedtab.federation.protocol import validate
from fedtab.federation.protocol import set_options
from fedtab.federation.protocol.reduce import cap_weights, moment_summaries, usable_counts
from fedtab.impute.stats import pool_stats, site_stats


def _stats(scale: float = 1.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(60, 3)) @ np.array([[1.0, 0.6, 0.0], [0.0, 0.8, 0.3], [0.0, 0.0, 1.0]]) + 3.0
    x[rng.random(x.shape) < 0.1] = np.nan
    return x, site_stats(x * scale, ["a", "b", "c"])


@pytest.mark.parametrize(("total", "sumsq", "fragment"), [
    (1e250, 1e250, "beyond the range its own counts allow"),  # total² overflows: was inf - inf, accepted
    (1e300, 1e300, "beyond the range sums can be pooled"),
    (0.0, 1e305, "beyond the range sums can be pooled"),  # consistent, but several of them overflow the pool
    (-1e200, 1e150, "beyond the range its own counts allow"),
])
def test_moments_whose_squares_overflow_are_refused(total, sumsq, fragment):
    with pytest.raises(ValueError, match=fragment) as info:
        validate.moments(np.array([100.0, 5.0]), np.array([total, 1.0]), np.array([sumsq, 1.0]))
    assert "1e+" not in str(info.value).split("(")[0]  # the site's numbers are not echoed


def test_forged_products_near_the_float_range_are_refused():
    _, s = _stats()
    for value in (1e200, 1e300, -1e250):
        sxy = s.pair_sxy.copy()
        sxy[0, 1] = sxy[1, 0] = value  # cov² overflowed to inf, and inf > bound + 1e-6·inf was False
        with pytest.raises(ValueError, match="correlation outside|beyond the range"):
            validate.pair_statistics(s.count, s.sum, s.sumsq, s.pair_count, s.pair_sx, s.pair_sxx, sxy)
    sx = s.pair_sx.copy()
    sx[0, 1] = 1e250
    with pytest.raises(ValueError, match="negative variance"):
        validate.pair_statistics(s.count, s.sum, s.sumsq, s.pair_count, sx, s.pair_sxx, s.pair_sxy)


def test_honest_sums_near_the_float_range_pass_and_pool_exactly():
    x, unit = _stats()
    _, big = _stats(1e140)  # sums of squares ~1e282: every product of two sums overflows
    validate.moments(big.count, big.sum, big.sumsq)
    validate.pair_statistics(big.count, big.sum, big.sumsq, big.pair_count, big.pair_sx, big.pair_sxx, big.pair_sxy)
    a, b = pool_stats([unit]), pool_stats([big])
    assert np.isfinite(b.corr).all()
    np.testing.assert_allclose(b.corr, a.corr, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(b.std, 1e140 * a.std, rtol=1e-9)
    mean, std = moment_summaries(big.count, big.sum, big.sumsq)
    np.testing.assert_allclose(std, 1e140 * np.nanstd(x, axis=0), rtol=1e-9)


def test_noisy_counts_below_one_count_as_none():
    count = np.array([-3.0, 0.2, 0.999, 1.0, 250.0, np.nan])
    assert usable_counts(count).tolist() == [0.0, 0.0, 0.0, 1.0, 250.0, 0.0]
    mean, std = moment_summaries(count, np.full(6, 4.0), np.full(6, 20.0))
    assert np.isnan(mean[:3]).all() and np.isnan(std[:3]).all() and np.isnan(mean[5])
    assert mean[3] == 4.0 and std[3] == pytest.approx(2.0)  # a real summary where a row stands behind it
    w = cap_weights(np.stack([usable_counts(c) for c in ([-5.0, 40.0], [30.0, 0.4], [30.0, 60.0])]), 0.5)
    assert np.all(w >= 0) and np.allclose(w.sum(axis=0), 1.0) and w[0, 0] == 0.0 and w[1, 1] == 0.0


@pytest.fixture
def seeded_noise(monkeypatch):
    """The sites' DP noise drawn from fixed seeds (it is OS entropy otherwise), so the run is reproducible."""
    import fedtab.privacy.dp as dp

    seeds = itertools.count(1)
    monkeypatch.setattr(dp, "secrets", types.SimpleNamespace(randbits=lambda bits: next(seeds)))


class _Recording(LocalFederation):
    """Keeps the smallest count any site released in a describe."""

    smallest = np.inf

    def ask(self, requests):
        replies = super().ask(requests)
        for r in replies.values():
            for key in ("count", "describe:count"):
                if key in r.arrays:
                    type(self).smallest = min(type(self).smallest, float(np.min(r.arrays[key])))
        return replies


def test_dp_robust_runs_with_honest_sites_complete(seeded_noise):
    table = classification_table(400, 8, 4, 2, seed=0)
    parts = split_rows(table, [0.2] * 5, stratify="target", seed=0)
    dp = {"epsilon": 0.1, "delta": 1e-5, "bounds": [-10, 10]}
    fed = _Recording([Site(f"h{i}", p, "target") for i, p in enumerate(parts)])
    set_options(fed, dp=dp, robust=True)
    out = run_training(fed, rounds=2)
    assert _Recording.smallest < 1  # the noise did take counts below one row
    assert 0.0 <= out.pooled["weighted_f1"] <= 1.0 and np.isfinite(out.mean).all() and (out.std > 0).all()
    fed = LocalFederation([Site(f"h{i}", p, "target") for i, p in enumerate(parts)])
    set_options(fed, dp=dp, robust=True)
    el = run_election(fed, 0.5, describe="train")
    out = run_training(fed, el.result.selected_names, rounds=2, described=el.described)
    assert np.isfinite(out.mean).all()


def test_dp_imputation_survives_counts_the_noise_took_below_one(seeded_noise):
    pytest.importorskip("torch")
    import pandas as pd

    from fedtab.federation.workflows.imputation import ImputeConfig, run_imputation

    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 5))
    x[rng.random(x.shape) < 0.1] = np.nan
    x[np.arange(500) % 100 != 0, 0] = np.nan  # column c0: one observed value per site
    t = pd.DataFrame(x, columns=[f"c{i}" for i in range(5)])
    for robust in (False, True):
        _Recording.smallest = np.inf
        fed = _Recording([Site(f"h{i}", t.iloc[i * 100:(i + 1) * 100].reset_index(drop=True),
                               policy={"min_rows": 1}) for i in range(5)])
        set_options(fed, robust=robust, dp={"epsilon": 0.5, "bounds": [-5, 5]})
        res = run_imputation(fed, ImputeConfig(rounds=1, hidden_dim=4, n_layers=1))
        assert _Recording.smallest < 1  # some site's noisy count fell below one row
        assert np.isfinite(res.mean).all() and np.all(np.abs(res.mean) <= 5)


def test_noisy_descriptions_are_validated_and_a_forger_is_named(seeded_noise):
    from fedtab.federation import FederationError, Message

    class Forger(Site):
        def handle(self, request):
            reply = super().handle(request)
            if reply.kind == "describe" and not reply.is_error:
                reply = Message("describe", {**reply.arrays, "sum": np.full_like(reply.arrays["sum"], 1e300)},
                                reply.meta)
            return reply

    table = classification_table(400, 8, 4, 2, seed=0)
    parts = split_rows(table, [0.2] * 5, stratify="target", seed=0)
    sites = [Site(f"h{i}", p, "target") for i, p in enumerate(parts[:4])] + [Forger("mallory", parts[4], "target")]
    dp = {"epsilon": 1.0, "delta": 1e-5, "bounds": [-10, 10]}
    with pytest.raises(FederationError, match="site 'mallory': noisy feature sums are beyond the range") as info:
        fed = LocalFederation(sites)
        set_options(fed, dp=dp)
        run_training(fed, rounds=1)
    assert "'h" not in str(info.value)
    fed = LocalFederation(sites)
    set_options(fed, dp=dp)
    run_training(fed, rounds=1, min_sites=3)
    assert list(fed.dropped) == ["mallory"]
