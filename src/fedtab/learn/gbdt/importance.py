"""Feature importance by gain: pooled (the model's own split gains) and on one site's rows (numpy).

* **Pooled** — :func:`pooled_importance`: per input feature the total and the mean loss change
  of its splits over all trees, as the server chose them from the pooled histograms; the same
  numbers as XGBoost's ``Booster.get_score(importance_type="total_gain" / "gain")`` on the
  exported booster (:meth:`~.model.GBDTModel.to_xgboost`).
* **On a site's rows** — :func:`site_gains`: the loss change each split achieves on that site's
  training rows alone. The site replays the boosting it took part in from its own record
  (:data:`SPLIT_RECORD` rows of the splits it applied, and the leaf values it received: no
  model of the server's choosing), at each round's margins of its own rows: a split of node
  ``P`` into ``L``/``R`` gains ``score(G_L, H_L) + score(G_R, H_R) − score(G_P, H_P)``
  (XGBoost's loss change, :func:`~.split.node_score`, float32) with the site's gradient and
  hessian sums. Every training row of the site counts in every round (a round's subsample is
  not replayed), so with ``subsample = 1`` and one site these are the pooled gains.

A site's gains are a release: a split whose node or either child holds between 1 and
``min_rows − 1`` of the site's rows adds nothing (it is *suppressed* and counted), so no
released number rests on fewer than ``min_rows`` of its rows. A per-site gain may be negative
(the split, chosen on the pooled rows, fits this site's rows worse than not splitting).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .bins import BinLayout
from .model import GBDTModel
from .objectives import gradients
from .params import GBDTParams
from .site import apply_splits
from .split import node_score

__all__ = ["SPLIT_RECORD", "SiteGains", "SiteRecord", "pooled_importance", "record_splits", "site_gains"]

#: columns of a site's record of the splits it applied (one row per split; int64)
SPLIT_RECORD = ("round", "level", "tree", "node", "feature", "bin", "default_left", "left", "right")


def pooled_importance(model: GBDTModel) -> dict[str, dict[str, float]]:
    """``{"total_gain": {feature: Σ gain}, "gain": {feature: mean gain per split}}`` over all
    trees, for the features used in at least one split (XGBoost's ``get_score``)."""
    return {kind: model.feature_importance(kind) for kind in ("total_gain", "gain")}


def record_splits(record: np.ndarray | None, round_: int, level: int, splits: dict[str, np.ndarray]) -> np.ndarray:
    """``record`` ``(N, 9)`` with one level's split message (``tree``, ``node``, ``feature``,
    ``bin``, ``default_left``, ``left``, ``right`` arrays) appended as :data:`SPLIT_RECORD` rows."""
    old = np.zeros((0, len(SPLIT_RECORD)), np.int64) if record is None else np.asarray(record, np.int64)
    n = int(np.asarray(splits["tree"]).size)
    rows = np.column_stack([np.full(n, round_), np.full(n, level)]
                           + [np.asarray(splits[k]).astype(np.int64).reshape(n) for k in SPLIT_RECORD[2:]])
    return np.vstack([old, rows.astype(np.int64)])


@dataclass
class SiteGains:
    """A site's gains (:func:`site_gains`).

    Attributes:
        total: ``(d,)`` float64 summed loss change of each feature's released splits.
        splits: splits counted; suppressed: splits left out by the ``min_rows`` rule.
    """

    total: np.ndarray
    splits: int
    suppressed: int


@dataclass(frozen=True)
class SiteRecord:
    """What a site took part in: the splits it applied and the leaf values it received.

    Attributes:
        splits: ``(N, 9)`` :data:`SPLIT_RECORD` rows of the splits the site applied, in order
            (:func:`record_splits`).
        leaves / leaf_ptr: the leaf values the site received, tree after tree, round after round
            (tree ``t``'s values are ``leaves[leaf_ptr[t]:leaf_ptr[t+1]]``, by node id).
    """

    splits: np.ndarray
    leaves: np.ndarray
    leaf_ptr: np.ndarray


def _node_sums(positions: np.ndarray, weights: Sequence[np.ndarray], tree_splits: np.ndarray, n_nodes: int
               ) -> np.ndarray:
    """``(len(weights), n_nodes)`` sums per node of one tree: leaves from the rows' final
    positions, each split node the sum of its children (children have the larger ids)."""
    out = np.stack([np.bincount(positions, weights=w, minlength=n_nodes)[:n_nodes] for w in weights])
    for node, left, right in tree_splits[::-1].tolist():  # children before their parents
        out[:, node] = out[:, left] + out[:, right]
    return out


def site_gains(bins: np.ndarray, y: np.ndarray, layout: BinLayout, params: GBDTParams, base_margin: np.ndarray,
               record: SiteRecord, n_rounds: int, min_rows: int) -> SiteGains:
    """Gains of the first ``n_rounds`` rounds' splits on a site's rows (module docstring).

    Args:
        bins: ``(n, d)`` the site's binned training rows (:meth:`BinLayout.bin`); y: ``(n,)`` labels.
        layout / params / base_margin: the run's bins, settings and ``(K,)`` starting margins.
        record: the splits the site applied and the leaf values it received (:class:`SiteRecord`).
        n_rounds: rounds to count (the kept ones); min_rows: the site's floor.

    Raises:
        ValueError: more rounds than the record holds, or a record that does not fit the rows.
    """
    K, n, d = params.n_outputs, bins.shape[0], layout.n_features
    leaves = record.leaves
    rec = np.asarray(record.splits, dtype=np.int64).reshape(-1, len(SPLIT_RECORD))
    _, first = np.unique(rec[:, [0, 2, 3]], axis=0, return_index=True)  # a replayed split counts once
    rec = rec[np.sort(first)]
    ptr = np.asarray(record.leaf_ptr, dtype=np.int64)
    if n_rounds < 0 or ptr.size - 1 < n_rounds * K:
        raise ValueError(f"{n_rounds} rounds asked, the site's record holds {(ptr.size - 1) // max(K, 1)}")
    margins = np.repeat(np.asarray(base_margin, np.float32).reshape(1, K), n, axis=0)
    total = np.zeros(d)
    counted = suppressed = 0
    ones = np.ones(n)
    for r in range(n_rounds):
        g, h = gradients(params, margins, y)
        positions = np.zeros((K, n), dtype=np.int32)
        mine = rec[rec[:, 0] == r]
        for lvl in np.unique(mine[:, 1]).tolist():
            step = mine[mine[:, 1] == lvl]
            apply_splits(positions, bins, layout, {k: step[:, i] for i, k in enumerate(SPLIT_RECORD) if i >= 2})
        for k in range(K):
            values = np.asarray(leaves[ptr[r * K + k]:ptr[r * K + k + 1]], dtype=np.float32)
            sp = mine[mine[:, 2] == k]
            if sp.size:
                c, G, H = _node_sums(positions[k], (ones, g[:, k].astype(np.float64), h[:, k].astype(np.float64)),
                                     sp[:, [3, 7, 8]], values.size)
                trio = sp[:, [3, 7, 8]]  # node, left, right
                cnt = c[trio]
                small = ((cnt > 0) & (cnt < min_rows)).any(axis=1)
                gain = (node_score(G[trio[:, 1]], H[trio[:, 1]], params) + node_score(G[trio[:, 2]], H[trio[:, 2]],
                                                                                    params)).astype(np.float32)
                gain = (gain - node_score(G[trio[:, 0]], H[trio[:, 0]], params)).astype(np.float64)
                total += np.bincount(sp[~small, 4], weights=gain[~small], minlength=d)
                counted += int((~small).sum())
                suppressed += int(small.sum())
            if positions[k].size and positions[k].max() >= values.size:
                raise ValueError(f"the leaf values of round {r} do not cover the site's rows' nodes")
            margins[:, k] += values[positions[k]]
    return SiteGains(total=total, splits=counted, suppressed=suppressed)
