"""Pooled sufficient statistics must equal the centralised computation exactly."""

import numpy as np
import pandas as pd
import pytest

from fedtab.impute.graph import build_feature_graph
from fedtab.impute.stats import pool_stats, site_stats


def _sites(seed=0):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(300, 3))
    full = pd.DataFrame(z @ rng.normal(size=(3, 6)) + 1000.0, columns=list("abcdef"))  # large offset on purpose
    full = full.mask(rng.random(full.shape) < 0.15)
    schemas = [list("abcd"), list("cdef"), list("abe")]
    parts = [full.iloc[i * 100 : (i + 1) * 100][cols] for i, cols in enumerate(schemas)]
    return full, parts


def test_pooled_equals_centralised_on_concatenated_data():
    _, parts = _sites()
    cols = list("abcdef")
    pooled = pool_stats([site_stats(p.to_numpy(), list(p.columns)) for p in parts], cols)
    concat = pd.concat(parts, ignore_index=True)[cols]  # absent columns become NaN
    expected = concat.corr()  # pairwise-complete Pearson
    assert np.allclose(np.nan_to_num(pooled.corr, nan=9), np.nan_to_num(expected.to_numpy(), nan=9), atol=1e-9)
    assert np.allclose(pooled.mean, concat.mean().to_numpy(), rtol=0, atol=1e-9)
    assert np.allclose(pooled.std, concat.std(ddof=0).to_numpy(), rtol=1e-9)
    assert np.array_equal(pooled.count, concat.notna().sum().to_numpy())


def test_pairs_never_observed_together_are_nan_and_counted():
    _, parts = _sites()
    pooled = pool_stats([site_stats(p.to_numpy(), list(p.columns)) for p in parts])
    i, j = pooled.columns.index("a"), pooled.columns.index("f")
    assert pooled.pair_count[i, j] == 0 and np.isnan(pooled.corr[i, j])
    # a-f and b-f are the only pairs no site holds together
    assert pooled.unobserved_pairs() == 2


def test_shift_does_not_change_correlations_and_improves_nothing_else():
    _, parts = _sites()
    cols = list("abcdef")
    plain = pool_stats([site_stats(p.to_numpy(), list(p.columns)) for p in parts], cols)
    shift = pd.Series(1000.0, index=cols)
    shifted = pool_stats([site_stats(p.to_numpy(), list(p.columns), shift[list(p.columns)].to_numpy()) for p in parts], cols)
    assert np.allclose(np.nan_to_num(plain.corr), np.nan_to_num(shifted.corr), atol=1e-9)
    assert np.allclose(plain.mean, shifted.mean)


def test_inconsistent_shifts_are_rejected():
    _, parts = _sites()
    s0 = site_stats(parts[0].to_numpy(), list(parts[0].columns), np.zeros(4))
    s1 = site_stats(parts[1].to_numpy(), list(parts[1].columns), np.ones(4))
    with pytest.raises(ValueError, match="different shifts"):
        pool_stats([s0, s1])


def test_graph_has_no_edge_for_never_co_observed_pairs():
    _, parts = _sites()
    pooled = pool_stats([site_stats(p.to_numpy(), list(p.columns)) for p in parts])
    g = build_feature_graph(pooled.corr, pooled.columns, k=5, min_abs_corr=0.0)
    pairs = {(pooled.columns[s], pooled.columns[t]) for s, t in g.edge_index.T}
    assert ("a", "f") not in pairs and ("f", "a") not in pairs and ("b", "f") not in pairs
    assert all((t, s) in pairs for s, t in pairs)  # symmetric
    assert not any(s == t for s, t in pairs)
    r = pooled.corr[g.edge_index[0], g.edge_index[1]]
    assert np.allclose(g.weight, np.abs(r)) and np.array_equal(g.sign, np.sign(r))


def test_graph_k_and_threshold():
    rng = np.random.default_rng(1)
    c = np.corrcoef(rng.normal(size=(50, 12)).T)
    g = build_feature_graph(c, [str(i) for i in range(12)], k=2, min_abs_corr=0.0)
    # each node keeps its 2 strongest neighbours (symmetrisation may add more, never fewer)
    assert (g.degree() >= 2).all()
    for i in range(12):
        a = np.abs(c[i]).copy()
        a[i] = 0
        nbrs = set(g.edge_index[0][g.edge_index[1] == i])
        assert set(np.argsort(-a)[:2]) <= nbrs
    strict = build_feature_graph(c, [str(i) for i in range(12)], k=11, min_abs_corr=0.3)
    assert (strict.weight >= 0.3).all()
