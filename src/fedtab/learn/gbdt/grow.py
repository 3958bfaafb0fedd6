"""Server side of boosting as a small state machine that only ever sees pooled sums.

One boosting round grows ``K`` trees (``K = n_classes`` for softmax, else 1) together,
level by level. :class:`RoundGrower` asks for the histograms of one level at a time:

1. :meth:`RoundGrower.request` — ``(m, 2)`` ``[tree, node]`` pairs whose histograms the sites
   build at this level. At the root these are the ``K`` roots; below it, for each split only
   the child with the smaller pooled hessian: the server derives its sibling as parent −
   built child, so sites send half the nodes of a level.
2. :meth:`RoundGrower.submit` (pooled ``(m, n_slots, 2)`` histogram of the requested nodes) →
   the splits of this level (:data:`SPLIT_MESSAGE` arrays, what every site applies to route
   its rows), and the next request, until :attr:`RoundGrower.done`.
3. :meth:`RoundGrower.leaf_values` — per tree, the value of the leaf each row ended in.

Nodes are numbered as XGBoost numbers them (breadth first; children of the ``i``-th split
node are allocated in split order), so a tree's arrays line up with XGBoost's JSON.

:class:`Booster` keeps the finished rounds, the early-stopping state on the pooled
validation loss, and builds the :class:`~.model.GBDTModel`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .bins import BinLayout
from .model import GBDTModel
from .objectives import metric_from_sums
from .params import GBDTParams
from .split import find_splits, leaf_values, node_totals, node_weight

__all__ = ["RoundGrower", "Booster", "GrowingTree", "SPLIT_MESSAGE", "check_site_histogram", "MAX_HESSIAN"]

#: arrays of a level's split message, one entry per split node.
SPLIT_MESSAGE = ("tree", "node", "feature", "bin", "default_left", "left", "right")


#: the largest hessian one row can contribute, per objective (logistic p(1−p) ≤ ¼, softmax 2p(1−p) ≤ ½).
MAX_HESSIAN = {"binary": 0.25, "multiclass": 0.5, "regression": 1.0}


def check_site_histogram(hist: np.ndarray, layout: BinLayout, n_nodes: int, *, n_rows: int | None = None,
                         objective: str = "binary", noisy: bool = False, site: str = "a site",
                         quantum: float = 0.0) -> None:
    """Validate one site's level histogram before it is summed (a hostile site's reply).

    Checks the shape ``(n_nodes, n_slots, 2)`` and finiteness; unless ``noisy`` (DP noise added
    at the site breaks these identities): hessians ≥ 0, every feature's slots adding up to the
    same node totals (each row is in one slot per feature; relative tolerance 1e-9, plus half a
    ``quantum`` per slot for sums the site rounded to a grid of that step), and — given
    the site's row count — a node's hessian mass at most ``n_rows ·`` :data:`MAX_HESSIAN` and,
    for classification, ``|G| ≤ n_rows``.

    Raises:
        ValueError: naming ``site`` and the first failed check.
    """
    h = np.asarray(hist)
    if h.shape != (n_nodes, layout.n_slots, 2) or h.dtype.kind != "f":
        raise ValueError(f"{site}: level histogram must be float ({n_nodes}, {layout.n_slots}, 2), got "
                         f"{h.dtype} {h.shape}")
    if not np.isfinite(h).all():
        raise ValueError(f"{site}: level histogram holds non-finite sums")
    if noisy or not n_nodes:
        return
    if (h[..., 1] < 0).any():
        raise ValueError(f"{site}: negative hessian sums")
    seg = np.add.reduceat(h, layout.offsets[:-1], axis=1)  # (m, d, 2) per-feature node totals
    scale = np.abs(h).sum(axis=1, keepdims=True) / layout.n_features + 1e-300
    slack = 1e-9 * scale + float(quantum) * float(layout.n_bins.max() + 1)
    if (np.abs(seg - seg[:, :1]) > slack).any():
        raise ValueError(f"{site}: features disagree on the node totals (each row is in one bin per feature)")
    if n_rows is not None:
        if (seg[:, 0, 1] > n_rows * MAX_HESSIAN[objective] * (1 + 1e-6)).any():
            raise ValueError(f"{site}: hessian mass exceeds {n_rows} rows x {MAX_HESSIAN[objective]}")
        if objective != "regression" and (np.abs(seg[:, 0, 0]) > n_rows * (1 + 1e-6)).any():
            raise ValueError(f"{site}: gradient sums exceed {n_rows} rows")


@dataclass
class GrowingTree:
    """One tree's node arrays while it grows (lists; node ``i`` is the ``i``-th entry)."""

    left: list[int] = field(default_factory=lambda: [-1])
    right: list[int] = field(default_factory=lambda: [-1])
    feature: list[int] = field(default_factory=lambda: [-1])
    bin: list[int] = field(default_factory=lambda: [0])
    default_left: list[bool] = field(default_factory=lambda: [False])
    gain: list[float] = field(default_factory=lambda: [0.0])
    sums: list[tuple[float, float]] = field(default_factory=lambda: [(0.0, 0.0)])
    base_weight: list[float] = field(default_factory=lambda: [0.0])
    value: list[float] = field(default_factory=lambda: [0.0])
    depth: list[int] = field(default_factory=lambda: [0])

    def add_child(self, sums: np.ndarray, depth: int, params: GBDTParams, value: float | None = None) -> int:
        """Append a leaf of pooled ``sums`` ``(G, H)``; ``value``: its :func:`~.split.leaf_values`
        when the caller computed it already (for all of a level's children at once)."""
        G, H = float(sums[0]), float(sums[1])
        self.left.append(-1)
        self.right.append(-1)
        self.feature.append(-1)
        self.bin.append(0)
        self.default_left.append(False)
        self.gain.append(0.0)
        self.sums.append((G, H))
        self.value.append(float(leaf_values(G, H, params)) if value is None else float(value))
        self.base_weight.append(self.value[-1])  # as XGBoost: a new leaf's base weight is its value
        self.depth.append(depth)
        return len(self.left) - 1

    def arrays(self) -> dict[str, np.ndarray]:
        """The finished tree as arrays (``value`` is 0 at split nodes)."""
        internal = np.asarray(self.left) >= 0
        return {"left": np.asarray(self.left, np.int32), "right": np.asarray(self.right, np.int32),
                "feature": np.asarray(self.feature, np.int32), "bin": np.asarray(self.bin, np.int32),
                "default_left": np.asarray(self.default_left, bool),
                "gain": np.asarray(self.gain, np.float32),
                "cover": np.asarray([h for _, h in self.sums], np.float32),
                "base_weight": np.asarray(self.base_weight, np.float32),
                "value": np.where(internal, 0, np.asarray(self.value, np.float32)).astype(np.float32)}


class RoundGrower:
    """The ``K`` trees of one boosting round, grown level by level from pooled histograms.

    Args:
        params: the run's settings.
        layout: the agreed bins (the histograms' slot layout).
    """

    def __init__(self, params: GBDTParams, layout: BinLayout):
        self.params, self.layout = params, layout
        self.trees = [GrowingTree() for _ in range(params.n_outputs)]
        self.level = 0
        self._open: list[tuple[int, int]] = [(k, 0) for k in range(params.n_outputs)]
        self._build: list[tuple[int, int]] = list(self._open)
        self._derive: dict[tuple[int, int], tuple[tuple[int, int], tuple[int, int]]] = {}  # node -> (sibling, parent)
        self._parent_hist: dict[tuple[int, int], np.ndarray] = {}

    @property
    def done(self) -> bool:
        """True once no node is open (every tree has reached ``max_depth`` or stopped)."""
        return not self._open

    def request(self) -> np.ndarray:
        """``(m, 2)`` int32 ``[tree, node]`` whose histograms the sites build at this level."""
        return np.asarray(self._build, dtype=np.int32).reshape(-1, 2)

    def submit(self, pooled: np.ndarray) -> dict[str, np.ndarray]:
        """Grow one level from the pooled histograms of :meth:`request`'s nodes (in its order).

        Returns:
            the level's splits, :data:`SPLIT_MESSAGE` arrays (``left``/``right`` are the new
            children's node ids); empty arrays when no node splits.

        Raises:
            RuntimeError: the round is already done.
            ValueError: ``pooled`` is not ``(m, n_slots, 2)`` finite sums.
        """
        if self.done:
            raise RuntimeError("this round is complete; start a new one")
        h = np.asarray(pooled, dtype=np.float64)
        m = len(self._build)
        if h.shape != (m, self.layout.n_slots, 2) or not np.isfinite(h).all():
            raise ValueError(f"pooled level histogram must be finite ({m}, {self.layout.n_slots}, 2), got {h.shape}")
        built = {node: h[i] for i, node in enumerate(self._build)}
        hist = np.stack([built[n] if n in built else self._parent_hist[self._derive[n][1]] - built[self._derive[n][0]]
                         for n in self._open])
        if self.level == 0:
            totals = node_totals(hist, self.layout)
            for (k, node), (G, H) in zip(self._open, totals):
                t = self.trees[k]
                t.sums[node] = (float(G), float(H))
                t.base_weight[node] = float(node_weight(G, H, self.params))
                t.value[node] = float(leaf_values(G, H, self.params))
        else:
            totals = np.array([self.trees[k].sums[node] for k, node in self._open], dtype=np.float64)
            # a site may send a node as zeros (its release rules): the histogram then holds other
            # rows than the parent's split counted; search the node's own histogram's totals
            own = node_totals(hist, self.layout)
            off = np.abs(own - totals) > 1e-6 * (np.abs(totals) + 1.0)
            totals = np.where(off.any(axis=1, keepdims=True), own, totals)
        best = find_splits(hist, totals, self.layout, self.params)
        ls, rs = best["left_sum"], best["right_sum"]
        # the level's new leaves and split nodes, elementwise as one node at a time (float64, then float32)
        left_value = leaf_values(ls[:, 0], ls[:, 1], self.params).tolist()
        right_value = leaf_values(rs[:, 0], rs[:, 1], self.params).tolist()
        parents = ls + rs  # XGBoost re-derives the split node's stats
        parent_weight = node_weight(parents[:, 0], parents[:, 1], self.params).tolist()
        msg: dict[str, list] = {k: [] for k in SPLIT_MESSAGE}
        next_open, next_build, derive, parent_hist = [], [], {}, {}
        grow_on = self.level + 1 < self.params.max_depth
        for i, (k, node) in enumerate(self._open):
            if not best["split"][i]:
                continue
            t = self.trees[k]
            left = t.add_child(ls[i], self.level + 1, self.params, left_value[i])
            right = t.add_child(rs[i], self.level + 1, self.params, right_value[i])
            t.left[node], t.right[node] = left, right
            parent = parents[i]
            t.sums[node] = (float(parent[0]), float(parent[1]))
            t.base_weight[node] = parent_weight[i]
            t.feature[node], t.bin[node] = int(best["feature"][i]), int(best["bin"][i])
            t.default_left[node], t.gain[node] = bool(best["default_left"][i]), float(best["gain"][i])
            for key, v in zip(SPLIT_MESSAGE, (k, node, t.feature[node], t.bin[node], t.default_left[node], left, right)):
                msg[key].append(v)
            if grow_on:
                small, large = (left, right) if ls[i][1] <= rs[i][1] else (right, left)
                next_open += [(k, left), (k, right)]
                next_build.append((k, small))
                derive[(k, large)] = ((k, small), (k, node))
                parent_hist[(k, node)] = hist[i]
        self._open, self._build, self._derive, self._parent_hist = next_open, next_build, derive, parent_hist
        self.level += 1
        dtypes = {"default_left": bool}
        return {k: np.asarray(v, dtype=dtypes.get(k, np.int32)) for k, v in msg.items()}

    def leaf_values(self) -> list[np.ndarray]:
        """Per tree, ``(n_nodes,)`` float32: each leaf's value (0 at split nodes), for the sites'
        margin update ``margin[:, k] += values[k][leaf of the row]``."""
        return [t.arrays()["value"] for t in self.trees]


class Booster:
    """The finished rounds and the early-stopping state (server side).

    Args:
        params: the run's settings.
        layout: the agreed bins (kept in the model for the raw thresholds).
        base_margin: ``(K,)`` float32 starting margins (:func:`~.objectives.base_margin`).
        feature_names: names of the layout's features, in order (default ``f0, f1, …``).
    """

    def __init__(self, params: GBDTParams, layout: BinLayout, base_margin: np.ndarray,
                 feature_names: Sequence[str] | None = None):
        self.params, self.layout = params, layout
        self.base_margin = np.asarray(base_margin, dtype=np.float32).reshape(params.n_outputs)
        self.feature_names = list(feature_names) if feature_names is not None else [
            f"f{i}" for i in range(layout.n_features)]
        if len(self.feature_names) != layout.n_features:
            raise ValueError(f"{len(self.feature_names)} feature names for {layout.n_features} features")
        self.rounds: list[list[dict[str, np.ndarray]]] = []
        self.history: list[float] = []
        self.best_round: int | None = None
        self._since_best = 0

    def new_round(self) -> RoundGrower:
        return RoundGrower(self.params, self.layout)

    def add_round(self, grower: RoundGrower) -> None:
        """Keep a finished round. Raises ``ValueError`` if it is not done."""
        if not grower.done:
            raise ValueError("the round still has open nodes")
        self.rounds.append([t.arrays() for t in grower.trees])

    @property
    def finished(self) -> bool:
        """``n_trees`` rounds done, or early stopping triggered."""
        esr = self.params.early_stopping_rounds
        return len(self.rounds) >= self.params.n_trees or (esr is not None and self._since_best >= esr)

    def record_validation(self, pooled_sums: np.ndarray) -> float:
        """Record the pooled validation :func:`~.objectives.loss_sums` of the model after the
        latest round; returns the metric. A round improves when its metric is strictly lower
        than the best so far (XGBoost's rule)."""
        value = metric_from_sums(self.params, pooled_sums)
        self.history.append(value)
        if self.best_round is None or value < self.history[self.best_round]:
            self.best_round = len(self.history) - 1
            self._since_best = 0
        else:
            self._since_best += 1
        return value

    def model(self) -> GBDTModel:
        """The model of the rounds up to the best validation round (all rounds without validation)."""
        keep = len(self.rounds) if self.best_round is None else self.best_round + 1
        trees = [t for rnd in self.rounds[:keep] for t in rnd]
        return GBDTModel.from_trees(self.params, self.layout, self.base_margin, trees, self.feature_names,
                                    best_iteration=self.best_round)
