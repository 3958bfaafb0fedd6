"""``restandardise``: Newton sums taken over one standardisation, rewritten for another, equal the
sums taken there (binary and softmax); bad standardisations are refused."""

import numpy as np
import pytest

from fedtab.learn.newton import logistic_sums, restandardise


@pytest.mark.parametrize("k,classes", [(1, 2), (3, 3)])
def test_rewritten_sums_are_the_sums_over_the_other_standardisation(k, classes):
    rng = np.random.default_rng(0)
    X = rng.normal(5.0, 3.0, (300, 4))
    y = rng.integers(0, classes, 300)
    mf, sf = X.mean(0) + 0.7, X.std(0) * 1.5
    mt, st = X.mean(0), X.std(0)
    theta = rng.normal(size=(k, 5))
    g, H = logistic_sums(theta, (X - mf) / sf, y)
    theta_t, g_t, H_t = restandardise(theta, g, H, mf, sf, mt, st)
    g2, H2 = logistic_sums(theta_t, (X - mt) / st, y)
    np.testing.assert_allclose(g_t, g2, atol=1e-9)
    np.testing.assert_allclose(H_t, H2, atol=1e-9)
    # the same model: the same scores on every row
    np.testing.assert_allclose(((X - mf) / sf) @ theta[:, :-1].T + theta[:, -1],
                               ((X - mt) / st) @ theta_t[:, :-1].T + theta_t[:, -1], atol=1e-9)


def test_bad_standardisations_are_refused():
    theta, g, H = np.zeros((1, 3)), np.zeros(3), np.zeros((3, 3))
    with pytest.raises(ValueError, match="stds positive"):
        restandardise(theta, g, H, np.zeros(2), np.array([1.0, 0.0]), np.zeros(2), np.ones(2))
    with pytest.raises(ValueError, match="do not fit"):
        restandardise(theta, g, H, np.zeros(3), np.ones(3), np.zeros(3), np.ones(3))
