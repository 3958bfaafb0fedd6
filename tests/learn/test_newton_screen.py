"""Robust mode's screen of Newton steps (fedtab.learn.newton.screen_steps): a site that reverses or
inflates its gradient is left out; honest sites, however many rows they hold, are kept."""

import numpy as np

from fedtab.learn.newton import logistic_sums, screen_steps


def _sites(seed: int = 0, n_sites: int = 5, rows: int = 200):
    rng = np.random.default_rng(seed)
    w = np.array([1.0, -2.0, 0.5])
    out = []
    for _ in range(n_sites):
        X = rng.normal(size=(rows, 3))
        y = (rng.random(rows) < 1 / (1 + np.exp(-X @ w))).astype(np.int64)
        out.append((X, y))
    return out


def test_a_reversed_gradient_is_screened_and_honest_sites_kept():
    theta = np.zeros((1, 4))
    sums = [(*logistic_sums(theta, X, y), float(len(y))) for X, y in _sites()]
    g, H, n = sums[0]
    sums[0] = (-g * 1e6, H * 1e6, n * 1e6)  # claims 10⁶× its rows, gradient reversed
    keep = screen_steps(theta, sums, l2=0.0)
    assert keep.tolist() == [False, True, True, True, True]


def test_honest_sites_are_all_kept_and_two_sites_are_never_screened():
    theta = np.zeros((1, 4))
    sums = [(*logistic_sums(theta, X, y), float(len(y))) for X, y in _sites(seed=1)]
    assert screen_steps(theta, sums, l2=0.1).all()
    g, H, n = sums[0]
    assert screen_steps(theta, [(-g, H, n), sums[1]], l2=0.0).all()  # no majority to screen against
