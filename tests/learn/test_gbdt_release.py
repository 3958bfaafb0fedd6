"""The site's release rules for level histograms (learn/gbdt/release.py)."""

import numpy as np
import pytest

from fedtab.learn.gbdt.bins import BinLayout
from fedtab.learn.gbdt.release import GRID_BITS, quantize, release_level, small_nodes, smooth_bins


def _random_level(seed: int, m: int = 4, min_rows: int = 5):
    rng = np.random.default_rng(seed)
    layout = BinLayout([np.arange(k, dtype=np.float32) for k in (1, 5, 12)])
    counts = rng.choice([0, 0, 1, 2, 3, 7, 20], size=(m, layout.n_slots)).astype(float)
    for f in range(layout.n_features):  # every feature counts the same rows
        a, b = layout.offsets[f], layout.offsets[f + 1]
        counts[:, a:b] *= counts[:, :layout.offsets[1]].sum(1, keepdims=True) / np.maximum(counts[:, a:b].sum(1, keepdims=True), 1)
    counts = np.round(counts)
    hist = np.stack([counts * rng.normal(size=counts.shape), counts * rng.uniform(0.1, 0.25, counts.shape)], axis=2)
    return layout, counts, hist


@pytest.mark.parametrize("seed", range(5))
def test_smoothing_keeps_every_features_totals_and_releases_large_slots_as_they_are(seed):
    layout, counts, hist = _random_level(seed)
    out = smooth_bins(hist, counts, layout, 5)
    seg_in = np.add.reduceat(hist, layout.offsets[:-1], axis=1)
    seg_out = np.add.reduceat(out, layout.offsets[:-1], axis=1)
    np.testing.assert_allclose(seg_out, seg_in, rtol=1e-12, atol=1e-12)
    small = (counts > 0) & (counts < 5)
    # no small slot is released with its own sums (they are only ever part of a run of >= 5 rows)
    own = np.isclose(out[..., 1], hist[..., 1]) & small & (hist[..., 1] > 0)
    assert not own.any()


def test_a_one_row_bin_next_to_a_large_one_is_added_to_it():
    layout = BinLayout([np.array([1.0, 2.0], np.float32)])
    counts = np.array([[40.0, 1.0, 0.0, 0.0]])
    hist = np.stack([counts * 0.5, counts * 0.25], axis=2)
    hist[0, 1] = [0.9, 0.2]  # the one row
    out = smooth_bins(hist, counts, layout, 10)
    assert out[0, 1].tolist() == [0.0, 0.0] and out[0, 0].tolist() == pytest.approx([20.9, 10.2])


def test_small_nodes_and_their_siblings_are_withheld():
    assert small_nodes(np.array([3, 50, 50, 0]), np.array([50, 3, 50, 50]), 10).tolist() == [True, True, False, False]
    layout = BinLayout([np.array([0.0], np.float32)])
    counts = np.array([[2.0, 1.0, 0.0], [30.0, 20.0, 0.0]])
    hist = np.stack([counts, counts], axis=2)
    out, withheld = release_level(hist, counts, np.array([0.0, 0.0]), layout, 10)
    assert withheld == 1 and not out[0].any() and out[1].tolist() == hist[1].tolist()


def test_the_grid_makes_sums_exact_in_any_order():
    rng = np.random.default_rng(0)
    parts = [quantize(rng.normal(size=1000) * 100, GRID_BITS) for _ in range(5)]
    forward = parts[0] + parts[1] + parts[2] + parts[3] + parts[4]
    backward = parts[4] + parts[3] + parts[2] + parts[1] + parts[0]
    np.testing.assert_array_equal(forward, backward)
