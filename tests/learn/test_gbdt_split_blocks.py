"""Split search over padded feature blocks equals the search one bin width at a time.

``split._groups`` pads features of different widths into one block; the reference below
builds one unpadded block per width (the search before padding). Random pooled histograms,
integer-valued sums (many exact ties: the tie rules must pick the same candidate), missing
values or not, min_child_weight and lambda varied: every field of every node is equal."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedtab.learn.gbdt import BinLayout, GBDTParams
from fedtab.learn.gbdt.split import SPLIT_FIELDS, _chunk, _groups, find_splits, node_totals


def _per_width_groups(layout):
    return [(np.flatnonzero(layout.n_bins == nb),
             layout.offsets[np.flatnonzero(layout.n_bins == nb), None] + np.arange(nb)[None, :], None)
            for nb in np.unique(layout.n_bins).tolist()]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), widths=st.lists(st.integers(0, 40), min_size=1, max_size=8),
       m=st.integers(1, 5), integer=st.booleans(), mcw=st.sampled_from([0.0, 1.0, 3.0]),
       lam=st.sampled_from([0.0, 1.0]))
def test_padded_blocks_find_the_same_splits(seed, widths, m, integer, mcw, lam):
    rng = np.random.default_rng(seed)
    layout = BinLayout([np.arange(w, dtype=np.float32) for w in widths])
    n = 40
    bins = np.column_stack([rng.integers(0, w + 2, n) for w in widths])  # w + 1 = missing
    slots = layout.slots(bins)
    g = rng.integers(-2, 3, n).astype(float) if integer else rng.normal(size=n)
    h = rng.integers(1, 3, n).astype(float) if integer else rng.uniform(0.05, 0.25, n)
    node = rng.integers(0, m, n)
    hist = np.zeros((m, layout.n_slots, 2))
    for f in range(len(widths)):
        np.add.at(hist, (node, slots[:, f], 0), g)
        np.add.at(hist, (node, slots[:, f], 1), h)
    params = GBDTParams(min_child_weight=mcw, reg_lambda=lam)
    totals = node_totals(hist, layout)
    got = find_splits(hist, totals, layout, params)
    ref = _chunk(hist, totals, _per_width_groups(layout), params)
    for k in SPLIT_FIELDS:
        np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
    assert sum(f.size for f, _, _ in _groups(layout)) == len(widths)
