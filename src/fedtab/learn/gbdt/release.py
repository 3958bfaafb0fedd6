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
           "noisy_level", "histogram_sensitivity", "pack_level", "unpack_level", "PACKED", "GRID_BITS", "MAX_GRADIENT"]

#: fractional bits of the release grid (the secure aggregator's default FRAC_BITS)
GRID_BITS = 24
#: the name a packed level's mask travels under, beside ``hist`` (:func:`pack_level`)
PACKED = "hist_nz"
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

    ``counts`` are row counts (whole numbers). Vectorised over every (node, feature) sequence at
    once, over the occupied slots only: no Python loop over slots (:func:`_runs`).
    """
    h = np.asarray(hist, dtype=np.float64)
    out = h.copy()
    if min_rows <= 1 or h.shape[0] == 0:
        return out
    plan = _plan(np.asarray(counts, dtype=np.float64), layout, int(min_rows))
    if plan is None:
        return out
    flat, gid, share, n_groups = plan
    flat_h = h.reshape(-1, 2)
    flat_out = out.reshape(-1, 2)
    for i in (0, 1):  # bincount sums each group in slot order
        total = np.bincount(gid, weights=flat_h[flat, i], minlength=n_groups)
        flat_out[flat, i] = total[gid] * share
    return out


#: smoothing plans a layout keeps (:func:`_plan`): a root's counts repeat every round
_PLANS_KEPT = 8


def _plan(cnt: np.ndarray, layout: BinLayout, min_rows: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """What :func:`smooth_bins` does for these counts, whatever the sums: ``(flat, gid, share,
    n_groups)`` — the flat ``node · n_slots + slot`` positions that change, each one's group and
    share of its group's sum — or ``None`` when no slot is small. It depends on the counts only
    (a node's counts are the same every round when every row is drawn: the roots'), so the
    first few plans of a layout are kept on it, keyed by the counts' bytes, and never replaced:
    the first round's root plan stays (deeper nodes' counts do not come back), and counts of a
    shape no kept plan has are not even hashed."""
    kept = layout.__dict__.setdefault("_smooth_plans", {})
    shapes = layout.__dict__.setdefault("_smooth_plan_shapes", set())
    key = None
    if cnt.shape in shapes or len(kept) < _PLANS_KEPT:
        key = (min_rows, cnt.shape, cnt.tobytes())
        if key in kept:
            return kept[key]
    plan = _make_plan(cnt, layout, min_rows)
    if key is not None and len(kept) < _PLANS_KEPT:
        kept[key] = plan
        shapes.add(cnt.shape)
    return plan


def _make_plan(cnt: np.ndarray, layout: BinLayout, min_rows: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """:func:`_plan` computed over the occupied slots of the sequences that change only.

    A run's bounds, its closing slot and every group's largest slot are occupied slots (an empty
    slot adds no row), so the runs are found on the ``(count > 0)`` slots laid end to end
    (:func:`_runs`) and only then spread back over the slots they span (empty slots inside a
    run are part of it; the slots after a sequence's last counted one are not, unless the
    sequence's only run is still open at its end). Deep nodes leave most of a wide feature's
    slots empty: the work follows the rows, not the bins."""
    m, S = cnt.shape
    small_slot = (cnt > 0) & (cnt < min_rows)
    needy = np.add.reduceat(small_slot, layout.offsets[:-1], axis=1) > 0  # (m, d): sequences with a small slot
    if not needy.any():
        return None
    slot_feature = layout.__dict__.get("_slot_feature")
    if slot_feature is None:
        slot_feature = layout.__dict__["_slot_feature"] = np.repeat(np.arange(layout.n_features), layout.n_bins + 1)
    node, slot = np.nonzero(needy[:, slot_feature] & (cnt > 0))  # occupied slots of the needy sequences, in order
    at = node * S + slot  # flat position of each
    c = cnt[node, slot]
    seq_key = node * layout.n_features + slot_feature[slot]
    starts = np.flatnonzero(np.concatenate([[True], seq_key[1:] != seq_key[:-1]]))
    ends = np.append(starts[1:], c.size)
    seq_last = node[starts] * S + layout.offsets[slot_feature[slot[starts]] + 1] - 1  # each sequence's last slot
    first, last, label, open_alone = _runs(c, starts, ends, min_rows)
    last_at = np.where(open_alone >= 0, seq_last[np.maximum(open_alone, 0)], at[last])
    first_at = at[first]
    length = last_at - first_at + 1
    total = int(length.sum())
    flat = np.arange(total) + np.repeat(first_at - (np.cumsum(length) - length), length)
    seg_group = np.cumsum(np.concatenate([[True], label[1:] != label[:-1]])) - 1  # a joined tail continues its group
    gid = np.repeat(seg_group, length)
    cs = cnt.reshape(-1)[flat]
    bounds = np.flatnonzero(np.concatenate([[True], gid[1:] != gid[:-1]]))
    glen = np.diff(np.append(bounds, total))
    gmax = np.maximum.reduceat(cs, bounds)
    # a group with a large slot puts its sums on that slot (its first largest), the others release 0;
    # a group of small slots only spreads them evenly
    at_max = np.flatnonzero(cs == gmax[gid])
    first_max = at_max[np.unique(gid[at_max], return_index=True)[1]]
    share = np.where((gmax >= min_rows)[gid], (np.arange(total) == first_max[gid]).astype(np.float64),
                     1.0 / glen[gid])
    return flat, gid, share, int(bounds.size)


def _runs(c: np.ndarray, starts: np.ndarray, ends: np.ndarray, min_rows: int
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The segments of occupied-slot sequences laid end to end (see :func:`smooth_bins`).

    Args:
        c: ``(N,)`` counts (> 0, whole numbers) of sequences ``c[starts[i]:ends[i]]`` (consecutive,
            each holding a small count).
        starts, ends: ``(S,)`` the sequences' bounds.

    Returns:
        ``(first, last, label, open_alone)``, one entry per segment in order: its first and last
        position, its group (named by a position of that group; a run still open at its
        sequence's end has the group before it), and for a run open at its sequence's end with
        no group before it, that sequence's index (it spans to the sequence's last slot), else −1.

    A run opens at a small slot and closes at the first position where its rows reach
    ``min_rows`` (found by a search in the prefix sums); the next run opens at the next small
    slot. The chain of run openings is followed by pointer doubling (``log2`` of the most runs a
    sequence can hold, by its rows and its small slots, steps), so no step loops over positions.
    Every position not in a run holds a large count and is a segment of its own.
    """
    N = c.size
    idx = np.arange(N)
    seq_end = np.repeat(ends, ends - starts)  # (N,) end of each position's sequence
    small = c < min_rows
    csum = np.cumsum(c)
    before = csum - c  # rows before each position
    # the next small slot at or after each position (N where none in the sequence)
    nxt = np.minimum.accumulate(np.where(small, idx, N)[::-1])[::-1]
    nxt = np.where(nxt < seq_end, nxt, N)
    # a run opened at p closes at the first e ≥ p with rows(p..e) ≥ min_rows (or stays open: e ≥ end)
    close = np.searchsorted(csum, before + min_rows, side="left")
    closed = close < seq_end
    after = np.minimum(close + 1, N - 1)
    follow = np.where(closed & (close + 1 < seq_end), nxt[after], N)
    follow = np.where(follow < N, follow, idx)  # the last run of a sequence points at itself
    opened = np.zeros(N, dtype=bool)
    opened[nxt[starts]] = True  # every sequence has a small slot
    jump = follow
    reach = 1
    seq_rows = csum[ends - 1] - before[starts]
    seq_small = np.add.reduceat(small.astype(np.int64), starts)
    longest = int(np.minimum(seq_rows // min_rows + 1, seq_small).max())
    while reach < longest:  # after this step, openings up to 2·reach runs along the chain are marked
        opened[jump[opened]] = True
        jump = jump[jump]
        reach *= 2
    opened[jump[opened]] = True
    run_start = np.flatnonzero(opened)
    run_closed = closed[run_start]
    run_last = np.where(run_closed, close[run_start], seq_end[run_start] - 1)  # inclusive
    depth = np.bincount(run_start, minlength=N + 1) - np.bincount(run_last + 1, minlength=N + 1)
    in_run = np.cumsum(depth[:N]) > 0  # runs never overlap
    alone = np.flatnonzero(~in_run)  # large slots outside every run
    first = np.concatenate([run_start, alone])
    last = np.concatenate([run_last, alone])
    order = np.argsort(first, kind="stable")
    first, last = first[order], last[order]
    label = first.copy()
    open_alone = np.full(first.size, -1, dtype=np.int64)
    # a run still open at its sequence's end holds fewer than min_rows rows: it joins the group
    # before it in its sequence, if any, else it spans to the sequence's last slot on its own
    is_open = np.flatnonzero(np.concatenate([~run_closed, np.zeros(alone.size, bool)])[order])
    if is_open.size:
        seq = np.searchsorted(ends, first[is_open], side="right")
        joins = first[is_open] > starts[seq]  # an occupied slot before it in its sequence: in a group
        j = is_open[joins]
        label[j] = label[j - 1]  # segments are in order, the one before is that group's last
        open_alone[is_open[~joins]] = seq[~joins]
    return first, last, label, open_alone


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
    out = smooth_bins(hist, counts, layout, min_rows)  # a new array: rounded in place (quantize's numbers)
    out[small] = 0.0
    scale = float(2**bits)
    out *= scale
    np.round(out, out=out)
    out /= scale
    return out, int(small.sum())


def pack_level(hist: np.ndarray, bits: int = GRID_BITS) -> tuple[np.ndarray, np.ndarray]:
    """A released level histogram in fewer bytes, the same numbers: ``(values, mask)``.

    ``mask`` is ``np.packbits`` of the ``(m · n_slots,)`` slots whose gradient or hessian sum is
    not 0 (most slots of a deep node or of a one-hot column's missing slot hold no row);
    ``values`` ``(nnz, 2)`` are those slots' sums in grid units (``sum · 2**bits``, whole
    numbers: :func:`quantize`), int32 when every one fits, else int64. :func:`unpack_level`
    gives ``hist`` back exactly.

    Raises:
        ValueError: ``hist`` is not ``(m, n_slots, 2)`` sums on the ``2**-bits`` grid.
    """
    h = np.asarray(hist, dtype=np.float64)
    if h.ndim != 3 or h.shape[2] != 2:
        raise ValueError(f"a level histogram is (m, n_slots, 2), got {h.shape}")
    k = h * float(2**bits)
    if not (np.isfinite(k).all() and (np.abs(k) < 2.0**53).all() and np.array_equal(np.rint(k), k)):
        raise ValueError(f"a packed histogram holds sums on the 2**-{bits} grid only (quantize first)")
    flat = k.reshape(-1, 2)
    nz = (flat != 0).any(axis=1)
    vals = flat[nz]
    wide = vals.size and np.abs(vals).max() >= 2.0**31
    return vals.astype(np.int64 if wide else np.int32), np.packbits(nz)


def unpack_level(values: np.ndarray, mask: np.ndarray, n_nodes: int, n_slots: int,
                 bits: int = GRID_BITS) -> np.ndarray:
    """Inverse of :func:`pack_level`: the ``(n_nodes, n_slots, 2)`` float64 histogram.

    Raises:
        ValueError: a mask that is not ``uint8`` of ``ceil(n_nodes · n_slots / 8)`` bytes (its
            padding bits 0), values that are not ``(set bits, 2)`` integers.
    """
    total = int(n_nodes) * int(n_slots)
    m = np.asarray(mask)
    if m.dtype != np.uint8 or m.shape != ((total + 7) // 8,):
        raise ValueError(f"a packed histogram's mask must be {(total + 7) // 8} uint8 bytes")
    nz = np.unpackbits(m)
    if nz[total:].any():
        raise ValueError("a packed histogram's mask sets bits beyond its slots")
    nz = nz[:total].astype(bool)
    v = np.asarray(values)
    if v.dtype.kind not in "iu" or v.shape != (int(nz.sum()), 2):
        raise ValueError(f"a packed histogram's values must be ({int(nz.sum())}, 2) integers, got {v.dtype} {v.shape}")
    out = np.zeros((total, 2))
    out[nz] = v.astype(np.float64) / float(2**bits)
    return out.reshape(int(n_nodes), int(n_slots), 2)


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
