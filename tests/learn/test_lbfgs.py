"""The numpy L-BFGS behind the logistic model's local update (fedtab.learn.lbfgs)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from fedtab.learn.lbfgs import minimize_lbfgs
from fedtab.learn.models import LogisticRegressionModel


def _problem(k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(300, 8)) * rng.uniform(0.1, 10, size=8)  # badly scaled on purpose
    y = rng.integers(0, max(k, 2), size=300)
    return X, y


@pytest.mark.parametrize("k", [2, 4])
def test_the_local_update_converges_to_scipys_minimiser(k, monkeypatch):
    X, y = _problem(k)
    model = LogisticRegressionModel(l2=1e-2, mu=0.1)
    start = {"coef": np.full((1 if k == 2 else k, 8), 0.3), "intercept": np.zeros(1 if k == 2 else k)}
    ours = model.local_update(start, X, y, epochs=500)
    # the same objective (captured from the update), minimised by scipy's L-BFGS-B to high precision
    import fedtab.learn.lbfgs as lb

    calls = []
    monkeypatch.setattr(lb, "minimize_lbfgs", lambda fun, x0, **kw: calls.append((fun, x0)) or x0)
    model.local_update(start, X, y, epochs=1)
    fun, x0 = calls[0]
    ref = minimize(fun, x0, jac=True, method="L-BFGS-B", options={"maxiter": 5000, "gtol": 1e-10, "ftol": 1e-15}).x
    got = np.concatenate([ours["coef"].ravel(), ours["intercept"]])
    np.testing.assert_allclose(got, ref, atol=2e-4)
    assert fun(got)[0] <= fun(ref)[0] * (1 + 1e-7)  # stopped by the same tolerances as scipy's defaults
    assert fun(got)[0] < fun(x0)[0] - 0.01


def test_each_iteration_decreases_the_objective_and_maxiter_bounds_the_work():
    X, y = _problem(2, seed=3)
    A = np.c_[X, np.ones(len(X))]
    evaluations = []

    def fun(theta):
        z = A @ theta
        evaluations.append(1)
        return float(np.logaddexp(0, z).sum() - (y * z).sum()) / len(y), A.T @ (1 / (1 + np.exp(-z)) - y) / len(y)

    x0 = np.zeros(A.shape[1])
    values = [fun(x0)[0]]
    for it in range(1, 8):
        values.append(fun(minimize_lbfgs(fun, x0, maxiter=it))[0])
    assert all(b <= a + 1e-12 for a, b in zip(values, values[1:])) and values[-1] < values[0] - 0.01
    evaluations.clear()
    minimize_lbfgs(fun, x0, maxiter=1)
    assert 2 <= len(evaluations) <= 41  # the start, then one line search


def test_a_stationary_start_is_returned_unchanged_and_bad_input_is_refused():
    fun = lambda x: (float(x @ x), 2 * x)  # noqa: E731
    np.testing.assert_array_equal(minimize_lbfgs(fun, np.zeros(3), maxiter=5), np.zeros(3))
    np.testing.assert_allclose(minimize_lbfgs(fun, np.ones(3), maxiter=20), np.zeros(3), atol=1e-6)
    with pytest.raises(ValueError, match="maxiter"):
        minimize_lbfgs(fun, np.ones(3), maxiter=0)
    with pytest.raises(ValueError, match="finite 1-D"):
        minimize_lbfgs(fun, np.array([1.0, np.nan]), maxiter=3)
    with pytest.raises(ValueError, match="finite 1-D"):
        minimize_lbfgs(fun, np.ones((2, 2)), maxiter=3)


def test_an_objective_that_overflows_far_away_backtracks_instead_of_failing():
    # exp overflows to inf for big steps: the line search must treat inf as "too far"
    fun = lambda x: (float(np.exp(x[0]) - 2 * x[0] + x[1] ** 2), np.array([np.exp(x[0]) - 2, 2 * x[1]]))  # noqa: E731
    with np.errstate(over="ignore"):
        got = minimize_lbfgs(fun, np.array([-800.0, 1.0]), maxiter=200)
    np.testing.assert_allclose(got, [np.log(2), 0.0], atol=1e-5)
