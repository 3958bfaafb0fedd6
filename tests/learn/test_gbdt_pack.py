"""Packed level histograms (learn/gbdt/release.py: pack_level / unpack_level) and the
feature-major routing of rows (learn/gbdt/site.py: apply_splits)."""

import numpy as np
import pytest

from fedtab.learn.gbdt.bins import BinLayout
from fedtab.learn.gbdt.release import GRID_BITS, pack_level, quantize, unpack_level
from fedtab.learn.gbdt.site import apply_splits


def _level(seed: int, m: int = 3, slots: int = 37, scale: float = 20.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    empty = rng.random((m, slots, 1)) < 0.6
    h = np.concatenate([rng.normal(size=(m, slots, 1)), rng.uniform(0, 0.25, (m, slots, 1))], axis=2) * scale
    return quantize(np.where(empty, 0.0, h))


@pytest.mark.parametrize("seed", range(4))
def test_a_packed_level_unpacks_to_the_same_numbers_in_fewer_bytes(seed):
    h = _level(seed)
    values, mask = pack_level(h)
    assert values.dtype == np.int32 and mask.dtype == np.uint8
    assert values.nbytes + mask.nbytes < 0.5 * h.nbytes  # 60 % empty slots, 4-byte grid units
    np.testing.assert_array_equal(unpack_level(values, mask, *h.shape[:2]), h)


def test_sums_beyond_int32_grid_units_are_sent_as_int64_and_still_exact():
    h = _level(0, scale=1e4)  # 1e4 * 2**24 > 2**31
    values, mask = pack_level(h)
    assert values.dtype == np.int64
    np.testing.assert_array_equal(unpack_level(values, mask, *h.shape[:2]), h)


def test_a_slot_with_only_a_gradient_or_only_a_hessian_is_kept():
    h = np.zeros((1, 4, 2))
    h[0, 1, 0] = -0.5  # a gradient sum with no hessian
    h[0, 2, 1] = 2.0**-GRID_BITS  # the smallest hessian on the grid
    np.testing.assert_array_equal(unpack_level(*pack_level(h), 1, 4), h)


def test_only_sums_on_the_grid_are_packed():
    with pytest.raises(ValueError, match="grid"):
        pack_level(np.full((1, 3, 2), 0.1))  # 0.1 is not a multiple of 2**-24
    with pytest.raises(ValueError, match="grid"):
        pack_level(np.array([[[np.nan, 0.0]]]))
    with pytest.raises(ValueError, match=r"\(m, n_slots, 2\)"):
        pack_level(np.zeros((2, 3)))


@pytest.mark.parametrize("tamper, match", [
    (lambda v, m: (v, m[:-1]), "uint8 bytes"),
    (lambda v, m: (v, m.astype(np.int16)), "uint8 bytes"),
    (lambda v, m: (v, np.r_[m[:-1], np.uint8(m[-1] | 1)]), "beyond its slots"),  # 3 * 37 = 111 bits: the last is padding
    (lambda v, m: (v[:-1], m), "integers"),
    (lambda v, m: (v.astype(np.float64), m), "integers"),
    (lambda v, m: (v[:, :1], m), "integers"),
])
def test_a_hostile_packed_level_is_refused(tamper, match):
    values, mask = pack_level(_level(5))
    v, m = tamper(values, mask)
    with pytest.raises(ValueError, match=match):
        unpack_level(v, m, 3, 37)


def test_an_empty_level_packs_to_nothing():
    values, mask = pack_level(np.zeros((0, 5, 2)))
    assert values.shape == (0, 2) and mask.size == 0
    assert unpack_level(values, mask, 0, 5).shape == (0, 5, 2)


def test_rows_route_the_same_from_feature_major_bins():
    rng = np.random.default_rng(3)
    layout = BinLayout([np.arange(k, dtype=np.float32) for k in (3, 1, 7)])
    n = 500
    bins = np.column_stack([rng.integers(0, nb + 1, n) for nb in layout.n_bins]).astype(np.uint16)  # n_bins = missing
    positions = rng.integers(0, 2, (2, n)).astype(np.int32) + 1
    splits = {"tree": np.array([0, 0, 1], np.int32), "node": np.array([1, 2, 2], np.int32),
              "feature": np.array([2, 0, 1], np.int32), "bin": np.array([3, -1, 0], np.int32),
              "default_left": np.array([True, True, True]), "left": np.array([3, 5, 3], np.int32),
              "right": np.array([4, 6, 4], np.int32)}
    by_row, by_feature = positions.copy(), positions.copy()
    apply_splits(by_row, bins, layout, splits)
    apply_splits(by_feature, np.asfortranarray(bins), layout, splits)
    np.testing.assert_array_equal(by_row, by_feature)
    assert set(np.unique(by_row[0])) == {3, 4, 5, 6} and set(np.unique(by_row[1])) == {1, 3, 4}
    # the split on bin 3 of feature 2 with missing left: bins 0..3 and missing (7) left
    moved = positions[0] == 1
    x = bins[moved, 2]
    np.testing.assert_array_equal(by_row[0, moved] == 3, (x <= 3) | (x == layout.n_bins[2]))


def test_a_kept_smoothing_plan_smooths_new_sums_as_a_fresh_one():
    from fedtab.learn.gbdt.release import smooth_bins

    rng = np.random.default_rng(8)
    layout = BinLayout([np.arange(k, dtype=np.float32) for k in (1, 5, 12)])
    counts = rng.choice([0, 1, 2, 3, 7, 20], size=(2, layout.n_slots)).astype(float)
    first = smooth_bins(rng.normal(size=(2, layout.n_slots, 2)), counts, layout, 5)  # plan kept on the layout
    hist = rng.normal(size=(2, layout.n_slots, 2))
    again = smooth_bins(hist, counts, layout, 5)
    fresh = smooth_bins(hist, counts, BinLayout(layout.edges), 5)  # a new layout: no plan kept
    np.testing.assert_array_equal(again, fresh)
    assert not np.array_equal(again, first)
    other = counts.copy()
    other[0, 2] = 30.0  # other counts: another plan
    np.testing.assert_array_equal(smooth_bins(hist, other, layout, 5), smooth_bins(hist, other, BinLayout(layout.edges), 5))
    np.testing.assert_array_equal(smooth_bins(hist, counts, layout, 3), smooth_bins(hist, counts, BinLayout(layout.edges), 3))
    assert len(layout.__dict__["_smooth_plans"]) == 3


def test_binning_by_groups_of_equal_edges_is_binning_column_by_column():
    rng = np.random.default_rng(9)
    one_hot = np.array([0.5], np.float32)
    edges = [one_hot, np.array([-1.0, 0.0, 2.0], np.float32), one_hot, np.zeros(0, np.float32), one_hot.copy()]
    layout = BinLayout(edges)
    X = rng.normal(size=(300, 5))
    X[:, [0, 2, 4]] = rng.integers(0, 2, (300, 3))
    X[rng.random(X.shape) < 0.1] = np.nan
    got = layout.bin(X)
    for j, e in enumerate(layout.edges):
        col = X[:, j].astype(np.float32)
        want = np.where(np.isnan(col), e.size + 1, np.searchsorted(e, col, side="right"))
        np.testing.assert_array_equal(got[:, j], want, err_msg=str(j))
    assert len(layout._edge_groups()) == 3  # the three one-hot columns share one call


def test_the_frequent_slot_of_each_feature_is_its_first_most_counted():
    from fedtab.learn.gbdt.site import SparseSlots

    rng = np.random.default_rng(10)
    layout = BinLayout([np.arange(k, dtype=np.float32) for k in (1, 4, 0, 6)])
    bins = np.column_stack([rng.integers(0, nb + 1, 200) for nb in layout.n_bins])
    bins[:, 2] = 0  # a feature with a single value bin: all in it
    bins[:100, 0], bins[100:, 0] = 0, 1  # a tie: the first slot wins
    sparse = SparseSlots(layout.slots(bins), layout)
    for f in range(layout.n_features):
        counts = np.bincount(bins[:, f], minlength=layout.n_bins[f] + 1)
        assert sparse.frequent[f] == layout.offsets[f] + int(np.argmax(counts)), f
    assert sparse.entry_row.size == int((layout.slots(bins) != sparse.frequent[None, :]).sum())
