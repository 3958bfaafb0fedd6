"""The bin sketch: counts over public grids, runs of >= min_rows, quantile edges on the grid."""

import numpy as np
import pytest

from fedtab.learn.gbdt import BinLayout
from fedtab.learn.gbdt.sketch import (FINE_WIDTH, RANGE_EDGES, RANGE_WIDTH, check_counts, fine_grid,
                                      fine_grid_refusal, grid_counts, merge_counts, quantile_edges, range_from_counts,
                                      sketch_edges, sketch_grids)


def _sites(seed=2):
    rng = np.random.default_rng(seed)
    return [rng.normal(loc, 1, size=(n, 1)) for loc, n in [(0, 6000), (1, 3000), (3, 1000)]]


def test_merged_counts_put_at_least_min_rows_behind_every_released_number():
    rng = np.random.default_rng(0)
    X = np.c_[rng.normal(size=500), rng.exponential(size=500) * 1e4, np.r_[np.zeros(495), np.full(5, 7.0)]]
    c = grid_counts(X, [RANGE_EDGES] * 3)
    assert c.shape == (3, RANGE_WIDTH)
    m = merge_counts(c, 10)
    np.testing.assert_allclose(m.sum(axis=1), 500)  # totals kept
    assert m[m > 0].min() >= 10
    # the runs tile the grid: rows below any released cut differ by 0 or >= 10
    cum = np.cumsum(m, axis=1)
    for j in range(3):
        steps = np.diff(np.unique(np.r_[0.0, cum[j]]))
        assert steps.min() >= 10
    # the 5 rows at 7 are not a number of their own: they joined the run of the zeros
    assert np.count_nonzero(m[2]) == 1
    np.testing.assert_array_equal(merge_counts(c, 1), c)
    assert not merge_counts(np.array([[3.0, 0.0, 4.0]]), 10).any()  # fewer than min_rows in all


def test_range_ends_are_points_of_the_public_range_grid_and_hold_the_rows():
    X = np.c_[np.linspace(17, 90, 300), np.linspace(-3.0, 2.5, 300), np.full(300, np.nan)]
    lo, hi = range_from_counts(grid_counts(X, [RANGE_EDGES] * 3))
    assert lo.tolist() == [16.0, -4.0, 0.0] and hi.tolist() == [128.0, 4.0, 0.0]
    assert fine_grid_refusal(lo, hi, 3) is None


def test_edges_are_fine_grid_points_never_a_rows_value():
    sites = _sites()
    edges = sketch_edges(sites, 32, 10)[0]
    X = np.vstack(sites)
    lo, hi = range_from_counts(sum(merge_counts(grid_counts(s, [RANGE_EDGES]), 10) for s in sites))
    assert np.isin(edges, fine_grid(lo[0], hi[0])).all()
    assert not np.isin(edges, X.astype(np.float32)).any()
    layout = BinLayout([edges])
    assert layout.n_bins[0] <= 32
    counts = np.bincount(layout.bin(X)[:, 0], minlength=33)
    assert counts[-1] == 0 and counts[:-1].min() > 0.5 * 10000 / 32 and counts.max() < 2 * 10000 / 32


def test_few_distinct_values_get_one_bin_each():
    X = np.random.default_rng(3).integers(0, 5, (1000, 1)).astype(float)
    layout = BinLayout(sketch_edges([X[:600], X[600:]], 256, 10))
    bins = layout.bin(np.arange(5.0)[:, None])[:, 0]
    assert np.unique(bins).size == 5
    assert layout.n_bins[0] == 5


def test_quantile_edges_have_rows_on_both_sides_and_respect_max_bins():
    grid = fine_grid(0.0, 8.0)
    counts = np.zeros(FINE_WIDTH)
    counts[1:FINE_WIDTH - 1] = 1.0
    e = quantile_edges(counts, grid, 16)
    assert 0 < e.size <= 15 and np.isin(e, grid).all()
    one = np.zeros(FINE_WIDTH)
    one[500] = 40
    assert quantile_edges(one, grid, 16).size == 0  # one held bin: nothing to split
    with pytest.raises(ValueError, match="max_bins"):
        quantile_edges(counts, grid, 1)


@pytest.mark.parametrize("lo, hi, match", [
    ([0.3], [8.0], "points of the public range grid"),  # an end between two rows, not on the grid
    ([8.0], [4.0], "lo <= hi"),
    ([0.0, 0.0], [8.0, 8.0], "one \\(lo, hi\\) per feature"),
    (["a"], [1.0], "numbers"),
])
def test_fine_grid_ends_off_the_public_grid_are_refused(lo, hi, match):
    assert fine_grid_refusal(lo, hi, 1) is not None
    with pytest.raises(ValueError, match=match):
        sketch_grids("fine", lo, hi, 1)


def test_sketch_stage_must_be_named():
    with pytest.raises(ValueError, match="stage"):
        sketch_grids("exact", None, None, 1)


@pytest.mark.parametrize("tamper, match", [
    (lambda c: -c, "non-negative"),
    (lambda c: c * 1000, "more rows"),
    (lambda c: np.where(c > 0, np.nan, c), "finite"),
    (lambda c: c[:, :-1], "numbers"),
])
def test_hostile_counts_are_rejected(tamper, match):
    c = merge_counts(grid_counts(np.random.default_rng(4).normal(size=(400, 2)), [RANGE_EDGES] * 2), 10)
    check_counts(c, 2, RANGE_WIDTH, 400)
    with pytest.raises(ValueError, match=match):
        check_counts(tamper(c), 2, RANGE_WIDTH, 400)


# ----------------------------------------------------------------------------- the tail, as a curious server
def test_the_tail_above_the_last_cut_is_a_bound_and_nothing_more():
    """A curious server reads one site's merged counts (plain run): it learns at most that
    ``c_last − min_rows`` rows lie above the last cut (exactly, for one row per bin), never
    where: moving those rows anywhere above the cut changes no released number."""
    from fedtab.learn.gbdt.sketch import (FINE_WIDTH, RANGE_EDGES, RANGE_WIDTH, fine_grid, grid_counts,
                                          merge_counts, range_from_counts, tail_bound)

    rng = np.random.default_rng(5)
    min_rows = 10
    for n in (37, 58, 123, 200):
        x = np.sort(rng.uniform(1.0, 1.999, n))  # one range bin; distinct fine bins (sparse)
        X = x[:, None]
        rel = merge_counts(grid_counts(X, [RANGE_EDGES], RANGE_WIDTH), min_rows)
        lo, hi = range_from_counts(rel)
        grid = fine_grid(lo[0], hi[0])
        fine = merge_counts(grid_counts(X, [grid], FINE_WIDTH), min_rows)
        last = np.flatnonzero(fine[0])[-1]
        above = int((x.astype(np.float32) >= grid[last]).sum())  # rows above the last cut
        bound = tail_bound(fine, min_rows)[0]
        assert above < min_rows and above <= bound
        if len(np.unique(np.searchsorted(grid, x.astype(np.float32), side="right"))) == n:
            assert above == bound  # one row per bin: the bound is exact (what docs/privacy.md states)
        # the tail's values moved anywhere above the cut, even far outside the range: the same counts
        moved = x.copy()
        moved[n - above:] = rng.uniform(grid[last] + 1e-3, 1e6, above)
        X2 = moved[:, None]
        rel2 = merge_counts(grid_counts(X2, [RANGE_EDGES], RANGE_WIDTH), min_rows)
        np.testing.assert_array_equal(rel2, rel)
        np.testing.assert_array_equal(merge_counts(grid_counts(X2, [grid], FINE_WIDTH), min_rows), fine)


def test_columns_of_zeros_and_ones_are_counted_as_a_search_per_cell_would():
    """grid_counts counts a column holding only 0, 1 and NaN by two sums: the counts equal a
    ``searchsorted(side="right")`` per cell on grids with an edge exactly at 0 or 1, at −0.0, and
    next to a column with another value (searched)."""
    rng = np.random.default_rng(4)
    X = (rng.random((400, 4)) < 0.3).astype(np.float64)
    X[rng.random(X.shape) < 0.1] = np.nan
    X[:7, 1] = -0.0
    X[0, 3] = 2.0  # not a 0/1 column
    grids = [RANGE_EDGES, np.array([0.0, 1.0], np.float32), np.array([-1.0, 0.5], np.float32),
             np.array([0.0, 0.5, 1.0, 2.0], np.float32)]
    want = np.zeros((4, 6))
    for j, g in enumerate(grids):
        col = X[:, j][~np.isnan(X[:, j])].astype(np.float32)
        c = np.bincount(np.searchsorted(g, col, side="right"), minlength=g.size + 1)
        want[j, :c.size] = c if j else 0
    got = grid_counts(X, grids, RANGE_WIDTH)
    np.testing.assert_array_equal(got[1:, :6], want[1:])
    col0 = X[:, 0][~np.isnan(X[:, 0])].astype(np.float32)
    np.testing.assert_array_equal(got[0], np.bincount(np.searchsorted(RANGE_EDGES, col0, side="right"),
                                                      minlength=RANGE_WIDTH))
    assert got.sum() == (~np.isnan(X)).sum()
