"""The sparse histogram builder (SparseSlots, the site's hot path) equals the dense one.

Random layouts, rows, trees of a round, node positions, requests (nodes holding no row, trees
not requested) and the round's subsample as count weights (gradients 0 outside it, as a site's): gradient and hessian sums equal
:func:`level_histograms` to float rounding, exactly for integer-valued gradients, and the
counts equal the weighted row counts."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedtab.learn.gbdt import BinLayout, level_histograms
from fedtab.learn.gbdt.site import SparseSlots


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60), K=st.integers(1, 3), n_nodes=st.integers(1, 6),
       widths=st.lists(st.integers(0, 6), min_size=1, max_size=4), integer=st.booleans())
def test_sparse_histograms_equal_the_dense_ones(seed, n, K, n_nodes, widths, integer):
    rng = np.random.default_rng(seed)
    layout = BinLayout([np.arange(w, dtype=np.float32) for w in widths])
    skew = rng.uniform(0, 1, len(widths))  # some features mostly in one bin (the sparse path's case)
    bins = np.column_stack([np.where(rng.random(n) < skew[f], 0, rng.integers(0, w + 2, n))
                            for f, w in enumerate(widths)])
    slots = layout.slots(bins)
    g = (rng.integers(-3, 4, (n, K)) if integer else rng.normal(size=(n, K))).astype(np.float32)
    h = (rng.integers(0, 3, (n, K)) if integer else rng.uniform(0, 0.25, (n, K))).astype(np.float32)
    positions = rng.integers(0, n_nodes, (K, n)).astype(np.int32)
    pairs = [(k, v) for k in range(K) for v in range(n_nodes + 1)]  # node n_nodes holds no row
    pick = rng.permutation(len(pairs))[: rng.integers(1, len(pairs) + 1)]
    nodes = np.array([pairs[i] for i in sorted(pick)], dtype=np.int64)
    weight = (rng.random(n) < 0.7).astype(np.float64)  # the round's subsample: the others' gradients are 0
    g[weight == 0], h[weight == 0] = 0, 0
    sparse = SparseSlots(slots, layout)
    hist, counts = sparse.histograms(g, h, positions, nodes, count_weight=weight, with_counts=True)
    dense = level_histograms(slots, g, h, positions, nodes, layout.n_slots)
    if integer:
        np.testing.assert_array_equal(hist, dense)
    else:
        np.testing.assert_allclose(hist, dense, rtol=1e-12, atol=1e-12)
    ones = np.ones((n, K), np.float32)
    expect = level_histograms(slots, ones * weight[:, None].astype(np.float32), ones, positions, nodes, layout.n_slots)
    np.testing.assert_array_equal(counts, expect[..., 0])
    np.testing.assert_array_equal(sparse.histograms(g, h, positions, nodes), hist)
    _, every = sparse.histograms(g, h, positions, nodes, with_counts=True)  # no weight: every row counts 1
    np.testing.assert_array_equal(every, level_histograms(slots, ones, ones, positions, nodes, layout.n_slots)[..., 0])


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.lists(st.integers(0, 9), min_size=1, max_size=6))
def test_binning_by_comparisons_equals_a_search(seed, n_edges):
    """Features with few edges are binned by counting the edges ≤ x; the bins equal a
    ``searchsorted(side="right")`` per column (values on the edges, NaN, float32 rounding)."""
    rng = np.random.default_rng(seed)
    edges = [np.unique(rng.normal(size=k).astype(np.float32)) for k in n_edges]
    layout = BinLayout(edges)
    X = rng.normal(size=(300, len(edges))) * 1.5
    for j, e in enumerate(edges):  # some cells exactly on an edge, some missing
        if e.size:
            on = rng.random(300) < 0.2
            X[on, j] = rng.choice(e, on.sum())
    X[rng.random(X.shape) < 0.1] = np.nan
    want = np.empty(X.shape, dtype=np.uint16)
    for j, e in enumerate(edges):
        col = X[:, j].astype(np.float32)
        want[:, j] = np.where(np.isnan(col), e.size + 1, np.searchsorted(e, col, side="right"))
    assert np.array_equal(layout.bin(X), want)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 80), widths=st.lists(st.integers(0, 6), min_size=1, max_size=4),
       subsample=st.booleans())
def test_a_root_holding_every_row_equals_the_dense_histogram_every_round(seed, n, widths, subsample):
    """A request for one node holding every row (a round's root) sums every entry without the
    row gather and counts the rows once per booster: each round's result still equals the dense one."""
    rng = np.random.default_rng(seed)
    layout = BinLayout([np.arange(w, dtype=np.float32) for w in widths])
    bins = np.column_stack([np.where(rng.random(n) < 0.6, 0, rng.integers(0, w + 2, n)) for w in widths])
    slots = layout.slots(bins)
    sparse = SparseSlots(slots, layout)
    positions = np.zeros((1, n), np.int32)
    ones = np.ones((n, 1), np.float32)
    for _ in range(2):  # the kept root counts serve the second round
        g = rng.integers(-3, 4, (n, 1)).astype(np.float32)
        h = rng.integers(0, 3, (n, 1)).astype(np.float32)
        weight = (rng.random(n) < 0.7).astype(np.float64) if subsample else np.ones(n)
        g[weight == 0], h[weight == 0] = 0, 0
        hist, counts = sparse.histograms(g, h, positions, np.array([[0, 0]]), count_weight=weight, with_counts=True)
        np.testing.assert_array_equal(hist, level_histograms(slots, g, h, positions, np.array([[0, 0]]), layout.n_slots))
        want = level_histograms(slots, ones * weight[:, None].astype(np.float32), ones, positions, np.array([[0, 0]]),
                                layout.n_slots)[..., 0]
        np.testing.assert_array_equal(counts, want)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60), K=st.integers(1, 3), paired=st.booleans(),
       by_feature=st.booleans())
def test_routing_rows_equals_the_split_rule_row_by_row(seed, n, K, paired, by_feature):
    """apply_splits moves each row of a split node to ``left`` iff its bin ≤ the split's bin, a
    missing value to the default side (bin −1: only missing values left), whether the children
    come in the grower's pairs (``right = left + 1``) or as any ids a message names."""
    from fedtab.learn.gbdt.site import apply_splits

    rng = np.random.default_rng(seed)
    widths = [2, 5, 1]
    layout = BinLayout([np.arange(w - 1, dtype=np.float32) for w in widths])
    bins = np.column_stack([rng.integers(0, w + 1, n) for w in widths]).astype(np.uint16)  # w = missing
    bins = np.asfortranarray(bins) if by_feature else bins
    positions = rng.integers(0, 4, (K, n)).astype(np.int32)
    tree, node = np.divmod(rng.permutation(K * 4)[: rng.integers(1, K * 4 + 1)], 4)
    s = tree.size
    feat = rng.integers(0, len(widths), s)
    split_bin = np.array([rng.integers(-1, widths[f]) for f in feat])
    left = 10 + 2 * np.arange(s) if paired else rng.permutation(50)[:s] + 10
    right = left + 1 if paired else rng.permutation(50)[:s] + 70
    splits = {"tree": tree, "node": node, "feature": feat, "bin": split_bin,
              "default_left": rng.random(s) < 0.5, "left": left, "right": right}
    want = positions.copy()
    for i in range(s):
        for r in np.flatnonzero(positions[tree[i]] == node[i]):
            x = int(bins[r, feat[i]])
            go_left = splits["default_left"][i] if x == widths[feat[i]] else x <= split_bin[i]
            want[tree[i], r] = left[i] if go_left else right[i]
    apply_splits(positions, bins, layout, splits)
    np.testing.assert_array_equal(positions, want)
