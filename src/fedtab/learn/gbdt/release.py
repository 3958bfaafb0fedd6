"""What a site releases of a level's histograms: its own rules, whatever the server asks (numpy).

A site's level histograms (:meth:`~.site.SiteBooster.histograms_and_counts`) are sums of its
rows' gradients and hessians per node and bin. Before they leave the site, :func:`release_level`
applies the site's floor ``min_rows`` (its disclosure policy's), so that no released number is
computed from fewer than ``min_rows`` of its rows — whichever nodes the server asks for and
whichever bin edges it sent:

* **small nodes** — a requested node holding between 1 and ``min_rows − 1`` of the site's rows
  in the round's subsample, or whose sibling does (the server knows the parent's sums, so the
  child's sums give the sibling's), is sent as zeros. The server then attributes the site's
  rows of that split to the derived child: the trees stay valid, the site's few rows are only
  ever part of a larger sum. :func:`check_request` refuses a request naming both children of
  one split (an honest server builds one and derives the other), which would otherwise
  separate the withheld rows from the derived child's.
* **small bins** — within every released node, each feature's slots (value bins, then the
  missing slot) holding between 1 and ``min_rows − 1`` rows are merged with their neighbours
  into runs of at least ``min_rows`` rows: a run of small slots is spread evenly over its slots,
  a run that needs a large neighbour is added to it (:func:`smooth_bins`; slots of ``min_rows``
  rows or more are released as they are, empty ones as 0 — the gate's small-cell rule). A bin edge chosen by a hostile server to
  isolate one row therefore gives a bin whose sums are averaged with ≥ ``min_rows − 1`` other
  rows'. Every feature's slots still sum to the node's totals.
* **a fixed grid** — sums are rounded to multiples of ``2**-bits`` (:func:`quantize`; 24 bits, the
  secure aggregator's default resolution), so plain sums (exact in float64 on that grid) and
  secure sums (fixed point with the same bits) are the same numbers: secure aggregation gives
  the same trees bit for bit.

These rules apply in plain and secure mode alike (the site's release does not depend on how it
travels), so both modes grow the same trees; with ``min_rows = 1`` they leave the histograms
exact but for the grid. Under differential privacy the histograms are noised instead
(:func:`noisy_level`) and none of these data-dependent rules is applied (they would void the
guarantee). What they do not stop: a hostile server that chooses different splits in different
rounds can difference two releases over row sets that differ by fewer than ``min_rows`` rows.
Secure aggregation (the server sees sums over sites only) and DP are the answers to that; see
``docs/models.md``.
"""

from __future__ import annotations

import numpy as np

from .bins import BinLayout

__all__ = ["release_level", "smooth_bins", "quantize", "node_counts", "small_nodes", "check_request",
           "noisy_level", "histogram_sensitivity", "GRID_BITS", "MAX_GRADIENT"]

#: fractional bits of the release grid (the secure aggregator's default FRAC_BITS)
GRID_BITS = 24
#: the largest |gradient| one row has, per objective (regression: clipped at the DP clip)
MAX_GRADIENT = {"binary": 1.0, "multiclass": 1.0}


def node_counts(counts: np.ndarray, layout: BinLayout) -> np.ndarray:
    """``(m,)`` rows of each node: the counts of feature 0's slots (every row is in one of them)."""
    return np.asarray(counts, dtype=np.float64)[:, layout.offsets[0]:layout.offsets[1]].sum(axis=1)


def small_nodes(own: np.ndarray, sibling: np.ndarray, min_rows: int) -> np.ndarray:
    """``(m,)`` bool: the node, or its sibling, holds between 1 and ``min_rows − 1`` rows."""
    own, sibling = np.asarray(own), np.asarray(sibling)
    return ((own > 0) & (own < min_rows)) | ((sibling > 0) & (sibling < min_rows))


def check_request(nodes: np.ndarray, splits_left: np.ndarray, splits_right: np.ndarray,
                  splits_tree: np.ndarray) -> None:
    """Refuse a level request that names both children of one split.

    Raises:
        ValueError: some split's left and right child are both requested.
    """
    req = {(int(k), int(n)) for k, n in np.asarray(nodes, dtype=np.int64).reshape(-1, 2)}
    for k, a, b in zip(np.asarray(splits_tree).tolist(), np.asarray(splits_left).tolist(),
                       np.asarray(splits_right).tolist()):
        if (k, a) in req and (k, b) in req:
            raise ValueError("the request names both children of one split (the site sends one; the server "
                             "derives the other)")


def smooth_bins(hist: np.ndarray, counts: np.ndarray, layout: BinLayout, min_rows: int) -> np.ndarray:
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
    m, d = h.shape[0], layout.n_features
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
        gid = _groups(c, min_rows)
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


def _groups(c: np.ndarray, min_rows: int) -> np.ndarray:
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


def quantize(hist: np.ndarray, bits: int = GRID_BITS) -> np.ndarray:
    """``hist`` rounded to multiples of ``2**-bits`` (float64)."""
    scale = float(2**bits)
    return np.round(np.asarray(hist, dtype=np.float64) * scale) / scale


def release_level(hist: np.ndarray, counts: np.ndarray, sibling_counts: np.ndarray, layout: BinLayout,
                  min_rows: int, bits: int = GRID_BITS) -> tuple[np.ndarray, int]:
    """The level histograms a site releases, and how many nodes it withheld (module docstring).

    Args:
        hist: ``(m, n_slots, 2)`` the site's sums; counts: ``(m, n_slots)`` rows behind each slot.
        sibling_counts: ``(m,)`` rows of each requested node's sibling (0 where it has none).
        layout: the agreed bins. min_rows: the site's floor. bits: the grid (:func:`quantize`).
    """
    own = node_counts(counts, layout)
    small = small_nodes(own, sibling_counts, min_rows)
    out = smooth_bins(hist, counts, layout, min_rows)
    out[small] = 0.0
    return quantize(out, bits), int(small.sum())


def histogram_sensitivity(objective: str, n_features: int, n_trees: int, clip: float) -> float:
    """L2 sensitivity of one level's histograms to adding or removing one row.

    A row adds its gradient and hessian to one slot per feature in one node of each of the
    round's ``n_trees`` trees: ``sqrt(n_trees · n_features · (g_max² + h_max²))`` with
    ``g_max`` = 1 for classification and ``clip`` for regression (gradients clipped there), and
    ``h_max`` = ¼ (logistic), ½ (softmax) or 1 (squared error).
    """
    g = MAX_GRADIENT.get(objective, float(clip))
    h = {"binary": 0.25, "multiclass": 0.5, "regression": 1.0}[objective]
    return float(np.sqrt(n_trees * n_features * (g * g + h * h)))


def noisy_level(hist: np.ndarray, sensitivity: float, z: float, rng: np.random.Generator) -> np.ndarray:
    """``hist`` plus Gaussian noise of standard deviation ``z · sensitivity`` in every sum."""
    h = np.asarray(hist, dtype=np.float64)
    return h + rng.normal(0.0, float(z) * float(sensitivity), size=h.shape)
