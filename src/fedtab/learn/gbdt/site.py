"""Site side of boosting: gradients, subsampling, level histograms, routing rows (pure numpy).

A site never sends a row. Per boosting round it computes gradients of its own rows
(:func:`~.objectives.gradients`), draws its subsample, and for each level of the round
returns **one array**, :func:`level_histograms`: for every requested ``[tree, node]`` and
every slot of the agreed :class:`~.bins.BinLayout` the sums of gradients and hessians of
its rows in that node and bin (missing values in each feature's missing slot). It then
routes its rows by the server's splits (:func:`apply_splits`) and, at the end of the
round, adds the leaf values to its margins.

:class:`SiteBooster` keeps that state for one site (binned rows, margins, the node of every
row in every tree of the round) so a federated handler only has to store it between
requests.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .bins import BinLayout
from .objectives import gradients, label_sums, loss_sums
from .params import GBDTParams

__all__ = ["level_histograms", "SparseSlots", "apply_splits", "subsample_rows", "SiteBooster"]


def level_histograms(slots: np.ndarray, grad: np.ndarray, hess: np.ndarray, positions: np.ndarray,
                     nodes: np.ndarray, n_slots: int) -> np.ndarray:
    """The site's histograms of the requested nodes of one level.

    Args:
        slots: ``(n, d)`` int32 flat slot of each cell (:meth:`BinLayout.slots`).
        grad, hess: ``(n, K)`` float32 gradients and hessians (0 for rows not in the subsample).
        positions: ``(K, n)`` int32 node of each row in each of the round's ``K`` trees.
        nodes: ``(m, 2)`` ``[tree, node]`` pairs to build.
        n_slots: the layout's slot count.

    Returns:
        ``(m, n_slots, 2)`` float64: ``[..., 0]`` gradient sums, ``[..., 1]`` hessian sums.
        Every row of a node adds to exactly one slot per feature, so each feature's slots sum
        to the node's totals.

    Raises:
        ValueError: shapes that do not fit together, or a tree index outside ``0..K-1``.
    """
    req = np.asarray(nodes, dtype=np.int64).reshape(-1, 2)
    n, d = slots.shape
    K = positions.shape[0]
    if grad.shape != (n, K) or hess.shape != (n, K) or positions.shape != (K, n):
        raise ValueError(f"grad/hess must be ({n}, {K}) and positions ({K}, {n})")
    if req.size and (req[:, 0].min() < 0 or req[:, 0].max() >= K or req[:, 1].min() < 0):
        raise ValueError(f"requested trees must be in 0..{K - 1} and nodes non-negative")
    m = req.shape[0]
    g_out = np.zeros(m * n_slots)
    h_out = np.zeros(m * n_slots)
    for k in np.unique(req[:, 0]).tolist():
        where = _node_index(req, k, positions[k])
        rows = np.flatnonzero(where >= 0)
        if not rows.size:
            continue
        idx = (where[rows, None] * n_slots + slots[rows]).ravel()
        g_out += np.bincount(idx, weights=np.repeat(grad[rows, k].astype(np.float64), d), minlength=m * n_slots)
        h_out += np.bincount(idx, weights=np.repeat(hess[rows, k].astype(np.float64), d), minlength=m * n_slots)
    return np.stack([g_out.reshape(m, n_slots), h_out.reshape(m, n_slots)], axis=2)


class SparseSlots:
    """A site's binned rows stored without each feature's most frequent slot, for fast histograms.

    Most cells of a one-hot or zero-inflated column sit in one bin; :meth:`histograms` sums
    only the other cells and derives each feature's frequent slot as node total − the
    feature's other slots (set to exactly 0 when no row of the node is in it, counted in
    integers). The result equals :func:`level_histograms` up to float rounding (exactly, for
    integer-valued gradients).

    Args:
        slots: ``(n, d)`` int32 flat slots (:meth:`BinLayout.slots`).
        layout: the agreed bins.
    """

    def __init__(self, slots: np.ndarray, layout: BinLayout):
        self.layout = layout
        n, d = slots.shape
        self.n_rows = n
        # each feature's most frequent slot (the first one on a tie): one count over every flat slot
        count = np.bincount(slots.reshape(-1), minlength=layout.n_slots)
        width = np.diff(layout.offsets)
        top = np.repeat(np.maximum.reduceat(count, layout.offsets[:-1]), width)
        at_top = np.flatnonzero(count == top)
        feature = np.searchsorted(layout.offsets, at_top, side="right") - 1
        self.frequent = at_top[np.unique(feature, return_index=True)[1]].astype(np.int64)
        rare = slots != self.frequent[None, :]
        self.entry_row = np.nonzero(rare)[0].astype(np.int64)
        self.entry_slot = slots[rare].astype(np.int64)
        self._ptr = None

    @property
    def entry_ptr(self) -> np.ndarray:
        """``(n + 1,)`` the entries of row ``i`` are ``entry_ptr[i]:entry_ptr[i + 1]`` (they are in row order)."""
        if getattr(self, "_ptr", None) is None:
            self._ptr = np.r_[0, np.cumsum(np.bincount(self.entry_row, minlength=self.n_rows))].astype(np.int64)
        return self._ptr

    def _root(self, out: np.ndarray, tot: np.ndarray, g: np.ndarray, h: np.ndarray, cw: np.ndarray | None) -> None:
        """Add one node holding every row (``out`` ``(3, n_slots)``, ``tot`` ``(3, 1)``): every entry,
        each weighted by its row's value; the counts of every row (``cw`` None) are the same every
        round, counted once."""
        rows, slots = self.entry_row, self.entry_slot
        for i, w in enumerate((g.astype(np.float64), h.astype(np.float64))):
            tot[i] += np.bincount(np.zeros(w.size, np.intp), weights=w, minlength=1)
            out[i] += np.bincount(slots, weights=w[rows], minlength=out.shape[1])
        if cw is None:
            kept = self.__dict__.get("_root_counts")
            if kept is None:
                kept = self._root_counts = np.bincount(slots, minlength=out.shape[1]).astype(np.float64)
            out[2] += kept
            tot[2] += self.n_rows
        else:
            tot[2] += np.bincount(np.zeros(cw.size, np.intp), weights=cw, minlength=1)
            out[2] += np.bincount(slots, weights=cw[rows], minlength=out.shape[1])

    def histograms(self, grad: np.ndarray, hess: np.ndarray, positions: np.ndarray, nodes: np.ndarray, *,
                   count_weight: np.ndarray | None = None, with_counts: bool = False
                   ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """As :func:`level_histograms` (same arguments but the slots, same ``(m, n_slots, 2)`` result).

        With ``with_counts`` also returns the ``(m, n_slots)`` float64 row counts of every slot,
        each row counted with ``count_weight`` (``(n,)``, e.g. 1 for the rows in the round's
        subsample and 0 for the others; default 1 for every row)."""
        req = np.asarray(nodes, dtype=np.int64).reshape(-1, 2)
        n, K, S = self.n_rows, positions.shape[0], self.layout.n_slots
        if grad.shape != (n, K) or hess.shape != (n, K) or positions.shape != (K, n):
            raise ValueError(f"grad/hess must be ({n}, {K}) and positions ({K}, {n})")
        if req.size and (req[:, 0].min() < 0 or req[:, 0].max() >= K or req[:, 1].min() < 0):
            raise ValueError(f"requested trees must be in 0..{K - 1} and nodes non-negative")
        m = req.shape[0]
        out = np.zeros((3, m * S))
        tot = np.zeros((3, m))
        cw = None if count_weight is None else np.asarray(count_weight, dtype=np.float64)
        if cw is not None and cw.shape == (n,) and (cw == 1.0).all():
            cw = None  # every row counts 1: integer counts, the same numbers
        ptr = self.entry_ptr
        trees = [int(req[0, 0])] if m and (req[:, 0] == req[0, 0]).all() else np.unique(req[:, 0]).tolist()
        for k in trees:
            where = _node_index(req, k, positions[k])
            if m == 1 and where.size and where.min() == 0:  # one node holding every row (a root): every entry, in order
                self._root(out, tot, grad[:, k], hess[:, k], cw)
                continue
            rows = np.flatnonzero(where >= 0)
            if not rows.size:
                continue
            # the entries of those rows, in row order (CSR by row): no pass over the other rows' entries
            if rows.size == n:  # every row in some requested node (a softmax round's roots): every entry
                cnt = np.diff(ptr)
                idx = np.repeat(where * S, cnt) + self.entry_slot
            else:
                cnt = ptr[rows + 1] - ptr[rows]
                ends = np.cumsum(cnt)
                ent = np.arange(int(ends[-1])) + np.repeat(ptr[rows] - (ends - cnt), cnt)
                idx = np.repeat(where[rows] * S, cnt) + self.entry_slot[ent]
            for i, w in enumerate((grad[rows, k].astype(np.float64), hess[rows, k].astype(np.float64),
                                   None if cw is None else cw[rows])):
                tot[i] += np.bincount(where[rows], weights=w, minlength=m)
                out[i] += np.bincount(idx, weights=None if w is None else np.repeat(w, cnt), minlength=m * S)
        out = out.reshape(3, m, S)
        freq = self.frequent
        # the frequent slot of each feature: node total − the feature's other slots (0 there so far)
        block = tot[:, :, None] - np.add.reduceat(out, self.layout.offsets[:-1], axis=2)
        block[:2, block[2] == 0] = 0.0  # no row in it: exactly 0
        out[:, :, freq] = block
        hist = np.stack([out[0], out[1]], axis=2)
        return (hist, out[2]) if with_counts else hist


def _node_index(req: np.ndarray, k: int, positions_k: np.ndarray) -> np.ndarray:
    """``(n,)`` index into ``req`` of each row's node in tree ``k`` (−1 where not requested)."""
    mine = np.flatnonzero(req[:, 0] == k)
    lookup = np.full(max(int(req[mine, 1].max()), int(positions_k.max(initial=0))) + 1, -1, dtype=np.int64)
    lookup[req[mine, 1]] = mine
    return lookup[positions_k]


def apply_splits(positions: np.ndarray, bins: np.ndarray, layout: BinLayout, splits: Mapping[str, np.ndarray]) -> None:
    """Move rows to the children of the split nodes, in place.

    Args:
        positions: ``(K, n)`` int32 node of each row per tree (updated).
        bins: ``(n, d)`` local bins (:meth:`BinLayout.bin`; ``n_bins[f]`` = missing). Stored
            feature by feature (Fortran order, ``np.asfortranarray``) the rows of a split are
            read from one contiguous column: the faster layout for many calls.
        splits: a level's split message (:data:`~.grow.SPLIT_MESSAGE` arrays).

    Raises:
        ValueError: a split names a tree, feature or node that does not exist.
    """
    tree = np.asarray(splits["tree"], dtype=np.int64)
    if not tree.size:
        return
    node = np.asarray(splits["node"], dtype=np.int64)
    feat = np.asarray(splits["feature"], dtype=np.int64)
    b = np.asarray(splits["bin"], dtype=np.int64)
    dleft = np.asarray(splits["default_left"], dtype=bool)
    left = np.asarray(splits["left"], dtype=np.int32)
    right = np.asarray(splits["right"], dtype=np.int32)
    K = positions.shape[0]
    if tree.min() < 0 or tree.max() >= K or feat.min() < 0 or feat.max() >= layout.n_features or node.min() < 0:
        raise ValueError("a split names a tree, node or feature that does not exist")
    by_feature = bins.flags.f_contiguous and not bins.flags.c_contiguous
    flat = bins.T.reshape(-1) if by_feature else np.ascontiguousarray(bins).reshape(-1)
    n, d = bins.shape
    # per split: its missing bin, and the bin a missing value is compared as (−1: left, the missing
    # bin: right, as ``x ≤ bin`` is then false) so that one comparison routes every row
    miss = layout.n_bins[feat].astype(np.int64)
    as_bin = np.where(dleft, -1, miss)
    for k in (np.unique(tree).tolist() if (tree != tree[0]).any() else [int(tree[0])]):
        s = np.flatnonzero(tree == k)
        lookup = np.full(max(int(node[s].max()), int(positions[k].max(initial=0))) + 1, -1, dtype=np.int64)
        lookup[node[s]] = s
        which = lookup[positions[k]]
        rows = np.flatnonzero(which >= 0)
        if not rows.size:
            continue
        sp = which[rows]
        fs = feat[sp]
        x = flat.take(fs * n + rows if by_feature else rows * d + fs).astype(np.int64)  # bins[rows, fs]
        x = np.where(x == miss[sp], as_bin[sp], x)
        go_right = x > b[sp]
        if (right == left + 1).all():  # the children of a split are allocated in pairs (the grower's numbering)
            positions[k, rows] = left[sp] + go_right
        else:
            positions[k, rows] = np.where(go_right, right[sp], left[sp])


def subsample_rows(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """``(n,)`` bool: each row in the round's subsample with probability ``rate`` (all if 1)."""
    if rate >= 1.0:
        return np.ones(n, dtype=bool)
    return rng.random(n) < rate


class SiteBooster:
    """One site's boosting state (binned rows, margins, node positions), numpy only.

    Args:
        X: ``(n, d)`` the site's rows in the agreed feature order (NaN = missing; a column the
            site does not have is all NaN).
        y: ``(n,)`` labels (class indices, or values for regression).
        layout: the agreed bins.
        params: the run's settings.
        base_margin: ``(K,)`` starting margins.
        X_val, y_val: optional validation rows of this site (for early stopping).
        secret: the site's own seed, mixed into the subsampling stream (the server never
            learns which rows were drawn).
    """

    def __init__(self, X: np.ndarray, y: np.ndarray, layout: BinLayout, params: GBDTParams,
                 base_margin: np.ndarray, *, X_val: np.ndarray | None = None, y_val: np.ndarray | None = None,
                 secret: int = 0):
        self.params, self.layout = params, layout
        self.bins = layout.bin(X)
        self.slots = SparseSlots(layout.slots(self.bins), layout)
        self.y = np.asarray(y)
        label_sums(params, self.y)  # validates the labels
        if self.y.shape != (self.bins.shape[0],):
            raise ValueError(f"y must have one label per row ({self.bins.shape[0]}), got shape {self.y.shape}")
        K = params.n_outputs
        base = np.asarray(base_margin, dtype=np.float32).reshape(1, K)
        self.margins = np.repeat(base, self.bins.shape[0], axis=0)
        self.val_bins = None if X_val is None else layout.bin(X_val)
        self.y_val = None if y_val is None else np.asarray(y_val)
        self.val_margins = None if X_val is None else np.repeat(base, self.val_bins.shape[0], axis=0)
        self._rng_seed = [int(params.seed), int(secret)]
        self.round = 0
        self.positions = np.zeros((K, self.bins.shape[0]), dtype=np.int32)
        self.val_positions = None if X_val is None else np.zeros((K, self.val_bins.shape[0]), dtype=np.int32)
        self.grad = self.hess = self.keep = None

    #: attributes :meth:`to_state` keeps (numpy arrays, ints or None)
    _STATE = ("bins", "y", "margins", "val_bins", "y_val", "val_margins", "round", "positions", "val_positions",
              "grad", "hess", "keep")

    def to_state(self) -> dict:
        """The booster as plain data (arrays, ints, lists; no pickle), for a site state that
        an engine stores between requests. :meth:`from_state` rebuilds it without re-binning."""
        out = {k: getattr(self, k) for k in self._STATE}
        fixed = self.__dict__.get("_fixed_state")
        if fixed is None:  # what never changes after binning: built once, not per level
            fixed = self._fixed_state = {
                "params": self.params.to_dict(), "layout": self.layout.to_arrays(), "rng_seed": list(self._rng_seed),
                "frequent": self.slots.frequent, "entry_row": self.slots.entry_row, "entry_slot": self.slots.entry_slot}
        out.update({k: (list(v) if k == "rng_seed" else dict(v) if isinstance(v, dict) else v) for k, v in fixed.items()})
        return out

    @classmethod
    def from_state(cls, state: Mapping) -> "SiteBooster":
        """Inverse of :meth:`to_state` (raises ``KeyError``/``ValueError`` on a state that is not one)."""
        self = cls.__new__(cls)
        self.params = GBDTParams.from_dict(state["params"])
        self.layout = BinLayout.from_arrays(state["layout"])
        for k in cls._STATE:
            setattr(self, k, state[k])
        self.round = int(self.round)
        self._rng_seed = [int(v) for v in state["rng_seed"]]
        slots = SparseSlots.__new__(SparseSlots)
        slots.layout, slots.n_rows = self.layout, int(np.asarray(self.bins).shape[0])
        slots.frequent, slots.entry_row, slots.entry_slot = (np.asarray(state[k], dtype=np.int64)
                                                             for k in ("frequent", "entry_row", "entry_slot"))
        self.slots = slots
        return self

    def start_round(self) -> None:
        """Gradients at the current margins, this round's subsample, every row at the roots."""
        g, h = gradients(self.params, self.margins, self.y)
        rng = np.random.default_rng([*self._rng_seed, self.round])
        keep = subsample_rows(self.bins.shape[0], self.params.subsample, rng)
        g[~keep] = 0
        h[~keep] = 0
        self.grad, self.hess, self.keep = g, h, keep
        self.positions[:] = 0
        if self.val_positions is not None:
            self.val_positions[:] = 0

    def histograms(self, nodes: np.ndarray) -> np.ndarray:
        """:func:`level_histograms` of this site's rows for the requested ``[tree, node]`` pairs."""
        if self.grad is None:
            raise RuntimeError("start_round() first")
        return self.slots.histograms(self.grad, self.hess, self.positions, nodes)

    def histograms_and_counts(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`histograms` and the ``(m, n_slots)`` counts of the round's subsampled rows behind
        every slot (what a site's release rules need, :mod:`.release`)."""
        if self.grad is None:
            raise RuntimeError("start_round() first")
        keep = None if self.keep is None or self.keep.all() else self.keep  # every row drawn: integer counts
        return self.slots.histograms(self.grad, self.hess, self.positions, nodes, count_weight=keep,
                                     with_counts=True)

    def apply(self, splits: Mapping[str, np.ndarray]) -> None:
        """Route the training (and validation) rows by a level's splits."""
        apply_splits(self.positions, self._by_feature("bins"), self.layout, splits)
        if self.val_positions is not None:
            apply_splits(self.val_positions, self._by_feature("val_bins"), self.layout, splits)

    def _by_feature(self, name: str) -> np.ndarray:
        """A feature-major (Fortran order) copy of ``self.<name>``, made once per booster object
        (not part of :meth:`to_state`: rebuilt after :meth:`from_state`)."""
        cache = self.__dict__.setdefault("_columns", {})
        arr = getattr(self, name)
        hit = cache.get(name)
        if hit is None or hit[0] is not arr:
            hit = cache[name] = (arr, np.asfortranarray(arr))
        return hit[1]

    def finish_round(self, leaf_values: Sequence[np.ndarray]) -> None:
        """Add each tree's leaf values (``(n_nodes,)`` per tree) to the margins of its class."""
        for k, values in enumerate(leaf_values):
            v = np.asarray(values, dtype=np.float32)
            if self.positions[k].size and self.positions[k].max() >= v.size:
                raise ValueError(f"leaf values of tree {k} do not cover the rows' nodes")
            self.margins[:, k] += v[self.positions[k]]
            if self.val_positions is not None:
                self.val_margins[:, k] += v[self.val_positions[k]]
        self.round += 1
        self.grad = self.hess = None

    def validation_sums(self) -> np.ndarray:
        """``[loss sum, n]`` of the validation rows at the current margins (:func:`~.objectives.loss_sums`).

        Raises:
            RuntimeError: the site has no validation rows.
        """
        if self.val_margins is None:
            raise RuntimeError("this site has no validation rows")
        return loss_sums(self.params, self.val_margins, self.y_val)
