"""The vectorised small-bin merging (release.smooth_bins) equals the loop it replaced.

The reference below is the implementation fedtab shipped before the merging was vectorised
(a loop over slot positions, vectorised over sequences), kept verbatim as the oracle: the
new code must release the same numbers on any histogram, so the trees do not change.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedtab.learn.gbdt.bins import BinLayout
from fedtab.learn.gbdt.release import smooth_bins


def loop_smooth_bins(hist: np.ndarray, counts: np.ndarray, layout: BinLayout, min_rows: int) -> np.ndarray:
    """``hist`` ``(m, n_slots, 2)`` with every feature's small bins merged into runs (module docstring).

    Per node and feature, in slot order: a slot of at least ``min_rows`` rows is released as it
    is, an empty slot stays 0 (no row is behind it, as the gate's suppression keeps empty cells),
    and consecutive *small* slots (1 to ``min_rows − 1`` rows, empty slots between them included)
    are merged into a run until it holds ``min_rows`` rows — taking in the next large slot when
    the small ones alone do not reach it; a short last run joins the group before it. A run of
    small slots only spreads its sums evenly over its slots; a group that holds a large slot puts
    all its sums on that slot and releases its small slots as 0 (their few rows are counted in
    the large neighbour: the least distortion of the split gains). ``min_rows <= 1`` returns a copy.
    """
    h = np.asarray(hist, dtype=np.float64)
    out = h.copy()
    if min_rows <= 1 or h.shape[0] == 0:
        return out
    width = layout.n_bins + 1
    j = np.arange(int(width.max()))
    real = j[None, :] < width[:, None]  # (d, B)
    flat = np.where(real, layout.offsets[:-1, None] + j[None, :], 0)
    cnt = np.asarray(counts, dtype=np.float64)
    small_slot = (cnt > 0) & (cnt < min_rows)
    needy = np.add.reduceat(small_slot, layout.offsets[:-1], axis=1) > 0  # (m, d): sequences with a small slot
    if not needy.any():
        return out
    node, feat = np.nonzero(needy)  # only these sequences change
    w = width[feat]
    B = int(w.max())
    parts: list[tuple[np.ndarray, ...]] = []
    lo = 0
    for hi in sorted({4, 16, 64, B}):  # sequences of similar length together: a short one needs few steps
        sub = np.flatnonzero((w > lo) & (w <= hi))
        lo = hi
        if not sub.size:
            continue
        top = int(w[sub].max())
        slot = flat[feat[sub], :top].T  # (top, n) flat slot of each position
        ok = real[feat[sub], :top].T
        c = np.where(ok, cnt[node[sub][None, :], slot], 0.0)
        gid = loop_groups(c, min_rows)
        sel = ok & (gid >= 0)
        seq = np.broadcast_to(sub[None, :], sel.shape)[sel]
        parts.append((seq * (B + 1) + gid[sel], node[seq], slot[sel], c[sel],
                      np.broadcast_to(np.arange(top)[:, None], sel.shape)[sel]))
        if hi >= B:
            break
    key, rows, slots, cs, order = (np.concatenate(a) for a in zip(*parts))
    n_groups = node.size * (B + 1)
    length = np.bincount(key, minlength=n_groups).astype(np.float64)
    # a group with a large slot puts its sums on that slot (its largest), the others release 0;
    # a group of small slots only spreads them evenly
    gmax = np.zeros(n_groups)
    np.maximum.at(gmax, key, cs)
    first = np.full(n_groups, np.iinfo(np.int64).max)
    at_max = cs == gmax[key]
    np.minimum.at(first, key[at_max], order[at_max])
    share = np.where(gmax[key] >= min_rows, (order == first[key]).astype(np.float64), 1.0 / length[key])
    for i in (0, 1):
        total = np.bincount(key, weights=h[rows, slots, i], minlength=n_groups)
        out[rows, slots, i] = total[key] * share
    return out


def loop_groups(c: np.ndarray, min_rows: int) -> np.ndarray:
    """``(B, S)`` group id of each slot of ``S`` count sequences (along axis 0), −1 for a slot left
    as 0 (see :func:`smooth_bins`); ids are per sequence."""
    B, S = c.shape
    gid = np.full((B, S), -1, dtype=np.int64)
    is_open = np.zeros(S, dtype=bool)
    acc = np.zeros(S)
    next_id = np.zeros(S, dtype=np.int64)
    cur = np.full(S, -1, dtype=np.int64)  # the open run's id
    last = np.full(S, -1, dtype=np.int64)  # the last closed group's id
    small_at, big_at = (c > 0) & (c < min_rows), c >= min_rows
    for b in range(B):  # in place: this loop is the site's hot path
        opening = small_at[b] & ~is_open
        np.copyto(cur, next_id, where=opening)
        next_id += opening
        is_open |= opening
        np.copyto(acc, 0.0, where=opening)
        alone = big_at[b] & ~is_open  # a large slot on its own: its own group
        g = gid[b]
        np.copyto(g, cur, where=is_open)
        np.copyto(g, next_id, where=alone)
        np.copyto(last, next_id, where=alone)
        next_id += alone
        np.add(acc, c[b], out=acc, where=is_open)
        closing = is_open & (acc >= min_rows)
        np.copyto(last, cur, where=closing)
        is_open &= ~closing
    # a run still open at the end holds fewer than min_rows rows: it joins the group before it;
    # its trailing empty slots go back to 0
    tail = is_open & (last >= 0)
    for b in range(B - 1, -1, -1):
        g = gid[b]
        gid[b] = np.where(tail & (g == cur) & (c[b] == 0), -1, g)
        tail &= ~((g == cur) & (c[b] > 0))
    joins = is_open & (last >= 0)
    return np.where(joins[None, :] & (gid == cur[None, :]), last[None, :], gid)



@st.composite
def levels(draw):
    """A layout of 1–5 features (0–40 edges), 1–4 nodes, counts skewed towards small and empty
    slots (every feature of a node need not count the same rows: the merging must not rely on it),
    a floor of 1–25 rows and float sums."""
    widths = draw(st.lists(st.integers(0, 40), min_size=1, max_size=5))
    layout = BinLayout([np.arange(k, dtype=np.float32) for k in widths])
    m = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    pool = np.array(draw(st.lists(st.integers(0, 60), min_size=1, max_size=6)) + [0, 1])
    counts = rng.choice(pool, size=(m, layout.n_slots)).astype(np.float64)
    hist = np.stack([counts * rng.normal(size=counts.shape), counts * rng.uniform(0.05, 0.25, counts.shape)], axis=2)
    hist += (counts == 0)[..., None] * rng.choice([0.0, 1e-3], size=hist.shape)  # stray sums on empty slots
    return layout, counts, hist, draw(st.integers(1, 25))


@settings(max_examples=400, deadline=None)
@given(levels())
def test_vectorised_merging_equals_the_loop(level):
    layout, counts, hist, min_rows = level
    ref = loop_smooth_bins(hist, counts, layout, min_rows)
    out = smooth_bins(hist, counts, layout, min_rows)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_vectorised_merging_equals_the_loop_on_wide_features(seed):
    """256-bin features as on Adult, sparse counts in deep nodes: long chains of runs."""
    rng = np.random.default_rng(seed)
    layout = BinLayout([np.arange(k, dtype=np.float32) for k in (255, 1, 100, 255)])
    counts = (rng.random((6, layout.n_slots)) < rng.uniform(0.05, 0.9, (6, 1))) * rng.integers(1, 30, (6, layout.n_slots))
    counts = counts.astype(np.float64)
    hist = np.stack([counts * rng.normal(size=counts.shape), counts * 0.2], axis=2)
    for min_rows in (2, 10, 50, 10_000):
        np.testing.assert_allclose(smooth_bins(hist, counts, layout, min_rows),
                                   loop_smooth_bins(hist, counts, layout, min_rows), rtol=1e-12, atol=1e-12)


def test_a_roots_merging_plan_is_kept_whatever_deeper_nodes_come_after(monkeypatch):
    """The root's counts repeat every round: its plan, made once, is still kept after many deeper
    nodes' plans (which never come back), and serves any sums over the same counts."""
    from fedtab.learn.gbdt import release

    rng = np.random.default_rng(0)
    layout = BinLayout([np.arange(k, dtype=np.float32) for k in (30, 2, 60)])
    root = (rng.integers(0, 14, (1, layout.n_slots))).astype(np.float64)
    smooth_bins(np.stack([root, root], axis=2), root, layout, 10)
    for m in (2, 4, 8, 16) * 5:  # a run's deeper levels: new counts every time
        deep = rng.integers(0, 14, (m, layout.n_slots)).astype(np.float64)
        smooth_bins(np.stack([deep, deep], axis=2), deep, layout, 10)
    hist = np.stack([root * rng.normal(size=root.shape), root * 0.2], axis=2)

    def no_new_plan(*args):
        raise AssertionError("the root's plan was made again")

    monkeypatch.setattr(release, "_make_plan", no_new_plan)
    np.testing.assert_allclose(smooth_bins(hist, root, layout, 10), loop_smooth_bins(hist, root, layout, 10),
                               rtol=1e-12, atol=1e-12)
