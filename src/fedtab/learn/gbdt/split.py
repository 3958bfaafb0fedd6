"""Split finding on pooled histograms, with XGBoost's gain and tie rules (server side).

For a node with gradient/hessian sums ``(G, H)`` and children ``(G_L, H_L)``, ``(G_R, H_R)``
the loss change of a split is, exactly as XGBoost's ``hist`` evaluator computes it (float32,
no factor ½ — XGBoost's documentation writes ``½[…] − γ``, its code compares the bracket
without ½ with ``gamma``)::

    loss_chg = f32(score(G_L, H_L) + score(G_R, H_R)) − score(G, H),
    score(G, H) = f32(G²) / f32(H + λ)   (0 when H ≤ 0)

Candidates per feature, in XGBoost's order (the first maximum wins, so ties go to the lower
feature, then to the forward scan): the forward scan ``bin ≤ b`` for ``b = 0 … n_bins−1``
with missing values going right, then — only when the node has missing values of that
feature — the backward scan ``bin ≤ b`` for ``b = n_bins−2 … −1`` with missing values going
left (``b = −1``: only the missing values go left). A candidate needs ``H ≥
min_child_weight`` on both sides; a node splits when its best ``loss_chg > 1e-6``,
``loss_chg ≥ gamma`` and both children have a non-zero hessian.

Leaf weight ``w = −G / (H + λ)`` (0 when ``H < min_child_weight``), leaf value
``f32(w) · f32(learning_rate)``.
"""

from __future__ import annotations

import numpy as np

from .bins import BinLayout
from .params import GBDTParams

__all__ = ["node_score", "node_weight", "leaf_values", "find_splits", "node_totals", "SPLIT_FIELDS"]

_RT_EPS = np.float32(1e-6)
#: arrays :func:`find_splits` returns, one entry per node.
SPLIT_FIELDS = ("split", "gain", "feature", "bin", "default_left", "left_sum", "right_sum")
_NODES_PER_CHUNK = 64


def node_score(G: np.ndarray, H: np.ndarray, params: GBDTParams) -> np.ndarray:
    """float32 ``G² / (H + λ)`` (0 where ``H ≤ 0``)."""
    G = np.asarray(G, dtype=np.float64)
    H = np.asarray(H, dtype=np.float64)
    num = (G * G).astype(np.float32)
    den = (H + params.reg_lambda).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = num / den
    return np.where(H > 0, out, np.float32(0)).astype(np.float32, copy=False)


def node_weight(G: np.ndarray, H: np.ndarray, params: GBDTParams) -> np.ndarray:
    """float32 Newton weight ``−G / (H + λ)`` without shrinkage (0 where ``H < min_child_weight``
    or ``H ≤ 0``)."""
    G = np.asarray(G, dtype=np.float64)
    H = np.asarray(H, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = -G / (H + params.reg_lambda)
    return np.where((H < params.min_child_weight) | (H <= 0), 0.0, w).astype(np.float32)


def leaf_values(G: np.ndarray, H: np.ndarray, params: GBDTParams) -> np.ndarray:
    """float32 leaf values ``node_weight · learning_rate`` of pooled leaf sums ``(G, H)``."""
    return (node_weight(G, H, params) * np.float32(params.learning_rate)).astype(np.float32)


def node_totals(hist: np.ndarray, layout: BinLayout) -> np.ndarray:
    """``(m, 2)`` node sums ``(G, H)``: the sum over feature 0's slots, missing included (every
    row is in exactly one slot of every feature), accumulated in slot order."""
    h = np.asarray(hist, dtype=np.float64)
    return np.cumsum(h[:, layout.offsets[0]:layout.offsets[1], :], axis=1)[:, -1, :]


def _groups(layout: BinLayout) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None]]:
    """Features in blocks scanned together: ``(features (ascending), (len, nb) flat slots of their
    value bins, (len, nb) bool real bins or None)``.

    Features of one bin count form a dense block; the wider ones (more than 2 bins, usually a
    few numeric columns of different widths) are padded to the widest of their block, blocks
    kept at most twice their real size, so the split search makes a few large numpy passes
    instead of one small pass per width. Padded bins hold no rows and are never candidates."""
    nb_all = layout.n_bins
    out: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]] = []
    wide: list[int] = []
    for nb in np.unique(nb_all).tolist():
        feats = np.flatnonzero(nb_all == nb)
        if nb <= 2:
            out.append((feats, layout.offsets[feats, None] + np.arange(nb)[None, :], None))
        else:
            wide.extend(feats.tolist())
    wide.sort(key=lambda f: int(nb_all[f]))
    blocks: list[list[int]] = []
    for f in wide:  # ascending width: a block takes the next feature while padding at most doubles it
        if blocks and (len(blocks[-1]) + 1) * int(nb_all[f]) <= 2 * (sum(int(nb_all[g]) for g in blocks[-1]) + int(nb_all[f])):
            blocks[-1].append(f)
        else:
            blocks.append([f])
    for block in blocks:
        feats = np.sort(np.asarray(block, dtype=np.int64))
        width = nb_all[feats]
        NB = int(width.max())
        valid = np.arange(NB)[None, :] < width[:, None]
        slots = np.where(valid, layout.offsets[feats, None] + np.arange(NB)[None, :], 0)
        out.append((feats, slots, None if valid.all() else valid))
    return out


def _gain(left: np.ndarray, right: np.ndarray, root: np.ndarray, params: GBDTParams) -> np.ndarray:
    s = node_score(left[..., 0], left[..., 1], params) + node_score(right[..., 0], right[..., 1], params)
    return (s.astype(np.float32, copy=False) - root).astype(np.float32, copy=False)


def _best_in_group(hist: np.ndarray, totals: np.ndarray, root: np.ndarray, feats: np.ndarray, slots: np.ndarray,
                   params: GBDTParams, valid: np.ndarray | None = None) -> dict:
    """Best candidate per node among one block of features (first maximum in XGBoost's order:
    feature, forward scan, backward scan).

    ``valid`` ``(g, nb)`` marks the real bins of features padded to ``nb`` (None: all real). A
    padded feature of ``w`` bins scans exactly as unpadded: its padded bins add 0 to the
    forward sums and come first in the backward ones (``x + 0 = x`` in floats), and they are
    no candidate; the backward candidate at padded index ``k`` is bin ``nb − 2 − k`` either way."""
    m, (g, nb) = hist.shape[0], slots.shape
    V = hist[:, slots, :]                                 # (m, g, nb, 2) value bins
    if valid is not None:
        V = np.where(valid[None, :, :, None], V, 0.0)
    P = totals[:, None, None, :]
    r = root[:, None, None]
    mcw = params.min_child_weight

    L = np.cumsum(V, axis=2)                              # forward: bins ≤ b left, missing right
    R = P - L
    ok_f = (L[..., 1] >= mcw) & (R[..., 1] >= mcw)
    if valid is not None:
        ok_f &= valid[None]
    fwd = np.where(ok_f, _gain(L, R, r, params), -np.inf)

    Rb = np.cumsum(V[:, :, ::-1, :], axis=2)              # backward: k ↔ bin i = nb−1−k; bins ≥ i right
    Lb = P - Rb                                           # missing left
    last = L[:, :, -1, :]                                 # sums of the value bins
    has_missing = (last[..., 0] != totals[:, None, 0]) | (last[..., 1] != totals[:, None, 1])
    ok_b = has_missing[:, :, None] & (Lb[..., 1] >= mcw) & (Rb[..., 1] >= mcw)
    if valid is not None:
        ok_b &= valid[None, :, ::-1]  # backward index k is bin nb − 1 − k
    bwd = np.where(ok_b, _gain(Lb, Rb, r, params), -np.inf)

    cand = np.concatenate([fwd, bwd], axis=2).astype(np.float32, copy=False).reshape(m, g * 2 * nb)
    best = np.argmax(cand, axis=1)
    rows = np.arange(m)
    fi, pos = np.divmod(best, 2 * nb)
    backward = pos >= nb
    k = np.where(backward, pos - nb, 0)
    fb = np.where(backward, 0, pos)
    return {"gain": cand[rows, best], "feature": feats[fi], "bin": np.where(backward, nb - 2 - k, pos),
            "default_left": backward,
            "left_sum": np.where(backward[:, None], Lb[rows, fi, k], L[rows, fi, fb]),
            "right_sum": np.where(backward[:, None], Rb[rows, fi, k], R[rows, fi, fb])}


def _chunk(hist: np.ndarray, totals: np.ndarray, groups: list, params: GBDTParams) -> dict:
    root = node_score(totals[:, 0], totals[:, 1], params)
    best = None
    for feats, slots, valid in groups:
        cand = _best_in_group(hist, totals, root, feats, slots, params, valid)
        if best is None:
            best = cand
            continue
        # a larger gain wins; an equal gain goes to the lower feature (XGBoost's SplitEntry rule)
        take = (cand["gain"] > best["gain"]) | ((cand["gain"] == best["gain"]) & (cand["feature"] < best["feature"]))
        for key in best:
            best[key] = np.where(take[:, None] if best[key].ndim == 2 else take, cand[key], best[key])
    gain, left, right = best["gain"], best["left_sum"], best["right_sum"]
    split = (np.isfinite(gain) & (gain > _RT_EPS) & (gain >= np.float32(params.gamma))
             & (left[:, 1] != 0) & (right[:, 1] != 0))
    return {"split": split, "gain": np.where(np.isfinite(gain), gain, np.float32(0)).astype(np.float32),
            "feature": best["feature"].astype(np.int32), "bin": best["bin"].astype(np.int32),
            "default_left": best["default_left"].astype(bool), "left_sum": left, "right_sum": right}


def find_splits(hist: np.ndarray, totals: np.ndarray, layout: BinLayout, params: GBDTParams) -> dict[str, np.ndarray]:
    """The best split of each node from its pooled histogram.

    Args:
        hist: ``(m, n_slots, 2)`` pooled gradient/hessian sums per node and slot (float64).
        totals: ``(m, 2)`` the nodes' own sums ``(G, H)`` (the parent's split sums, or
            :func:`node_totals` at the root).

    Returns:
        :data:`SPLIT_FIELDS` arrays of length ``m``: ``split`` (bool: the node splits),
        ``gain`` (float32 loss change of the best candidate, 0 if none), ``feature``,
        ``bin`` (go left iff ``bin(x) ≤ bin``; −1 = only missing left), ``default_left``,
        ``left_sum``/``right_sum`` ``(m, 2)`` the children's ``(G, H)``. Fields other than
        ``split`` are meaningless where ``split`` is False.

    Raises:
        ValueError: shapes that do not match the layout, or non-finite sums.
    """
    h = np.asarray(hist, dtype=np.float64)
    t = np.asarray(totals, dtype=np.float64)
    if h.ndim != 3 or h.shape[1:] != (layout.n_slots, 2) or t.shape != (h.shape[0], 2):
        raise ValueError(f"hist must be (m, {layout.n_slots}, 2) and totals (m, 2), got {h.shape}, {t.shape}")
    if not (np.isfinite(h).all() and np.isfinite(t).all()):
        raise ValueError("histogram sums must be finite")
    groups = layout.__dict__.get("_split_groups")
    if groups is None:  # a layout's blocks never change: built once per layout, not per level
        groups = layout.__dict__["_split_groups"] = _groups(layout)
    parts = [_chunk(h[i:i + _NODES_PER_CHUNK], t[i:i + _NODES_PER_CHUNK], groups, params)
             for i in range(0, h.shape[0], _NODES_PER_CHUNK)]
    if not parts:
        return {"split": np.zeros(0, bool), "gain": np.zeros(0, np.float32), "feature": np.zeros(0, np.int32),
                "bin": np.zeros(0, np.int32), "default_left": np.zeros(0, bool),
                "left_sum": np.zeros((0, 2)), "right_sum": np.zeros((0, 2))}
    return {k: np.concatenate([p[k] for p in parts]) for k in SPLIT_FIELDS}
