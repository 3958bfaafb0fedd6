"""A boosted tree ensemble as flat arrays (no pickle): prediction, importance, (de)serialisation.

All trees' nodes live in one set of arrays; tree ``t`` owns nodes ``tree_ptr[t] …
tree_ptr[t+1]−1`` and its children indices are local to the tree (−1 at a leaf). Node ``i``
goes left iff ``x < threshold[i]`` (float32, as XGBoost) or, for a missing ``x`` (NaN),
iff ``default_left[i]``. Tree ``t`` adds ``value`` of its leaf to the margin of class
``tree_class[t]`` (``t mod K``); the margins start at ``base_margin``.

:meth:`GBDTModel.to_arrays` / :meth:`GBDTModel.manifest` give what fedtab's model file
stores (named numeric arrays + JSON); :meth:`GBDTModel.from_arrays` rebuilds the model
and rejects arrays that do not form valid trees (a model file may come from anyone).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .bins import BinLayout
from .objectives import transform
from .params import GBDTParams

__all__ = ["GBDTModel", "NODE_ARRAYS", "IMPORTANCE_TYPES", "FORMAT"]

FORMAT = "fedtab-gbdt"
VERSION = 1
#: per-node arrays and their dtypes.
NODE_ARRAYS = {"left": np.int32, "right": np.int32, "feature": np.int32, "bin": np.int32, "threshold": np.float32,
               "default_left": np.bool_, "value": np.float32, "base_weight": np.float32, "gain": np.float32,
               "cover": np.float32}
#: :meth:`GBDTModel.feature_importance` kinds (XGBoost's ``get_score`` importance types).
IMPORTANCE_TYPES = ("weight", "gain", "total_gain", "cover", "total_cover")
_ROWS_PER_CHUNK = 8192


class GBDTModel:
    """A trained ensemble. Build it with :meth:`from_trees` or :meth:`from_arrays`.

    Attributes:
        params: the training settings (objective, classes, …).
        base_margin: ``(K,)`` float32 starting margins.
        feature_names: the ``d`` input columns, in the order ``X``'s columns must have.
        best_iteration: the round early stopping kept (None without validation).
        layout: the agreed bin edges (None if the model was built without them).
    """

    def __init__(self, params: GBDTParams, base_margin: np.ndarray, nodes: Mapping[str, np.ndarray],
                 tree_ptr: np.ndarray, feature_names: Sequence[str], *, best_iteration: int | None = None,
                 layout: BinLayout | None = None):
        self.params = params
        self.base_margin = np.asarray(base_margin, dtype=np.float32)
        self.nodes = {k: np.asarray(nodes[k], dtype=dt) for k, dt in NODE_ARRAYS.items()}
        self.tree_ptr = np.asarray(tree_ptr, dtype=np.int64)
        self.feature_names = list(feature_names)
        self.best_iteration = best_iteration
        self.layout = layout
        self._validate()
        n_nodes = np.diff(self.tree_ptr)
        base = np.repeat(self.tree_ptr[:-1], n_nodes)
        own = np.arange(self.tree_ptr[-1])
        leaf = self.nodes["left"] < 0
        self._go_left = np.where(leaf, own, self.nodes["left"] + base)
        self._go_right = np.where(leaf, own, self.nodes["right"] + base)
        self._feature = np.where(leaf, 0, self.nodes["feature"])

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_trees(cls, params: GBDTParams, layout: BinLayout, base_margin: np.ndarray,
                   trees: Sequence[Mapping[str, np.ndarray]], feature_names: Sequence[str], *,
                   best_iteration: int | None = None) -> "GBDTModel":
        """From per-tree arrays (:meth:`~.grow.GrowingTree.arrays`, trees in round-major order);
        raw thresholds come from ``layout``."""
        keys = [k for k in NODE_ARRAYS if k != "threshold"]
        flat = {k: np.concatenate([np.asarray(t[k]) for t in trees]) if trees else np.zeros(0, NODE_ARRAYS[k])
                for k in keys}
        internal = flat["left"] >= 0
        thr = np.zeros(flat["left"].size, dtype=np.float32)
        if internal.any():
            thr[internal] = layout.threshold(flat["feature"][internal], flat["bin"][internal])
        flat["threshold"] = thr
        ptr = np.r_[0, np.cumsum([len(t["left"]) for t in trees])].astype(np.int64)
        return cls(params, base_margin, flat, ptr, feature_names, best_iteration=best_iteration, layout=layout)

    def _validate(self) -> None:
        def fail(msg: str) -> None:
            raise ValueError(f"invalid GBDT model: {msg}")

        K, d = self.params.n_outputs, len(self.feature_names)
        if d < 1 or len(set(self.feature_names)) != d or not all(isinstance(f, str) for f in self.feature_names):
            fail("feature_names must be unique strings")
        if self.base_margin.shape != (K,) or not np.isfinite(self.base_margin).all():
            fail(f"base_margin must be {K} finite numbers")
        p = self.tree_ptr
        if p.ndim != 1 or p.size < 1 or p[0] != 0 or (p.size > 1 and (np.diff(p) < 1).any()):
            fail("tree_ptr must start at 0 and rise by at least one node per tree")
        if (p.size - 1) % K:
            fail(f"{p.size - 1} trees is not a whole number of rounds of {K} trees")
        N = int(p[-1])
        for k, a in self.nodes.items():
            if a.shape != (N,):
                fail(f"node array {k!r} has shape {a.shape}, expected ({N},)")
        for k in ("threshold", "value", "base_weight", "gain", "cover"):
            if not np.isfinite(self.nodes[k]).all():
                fail(f"node array {k!r} holds non-finite values")
        left, right, feat = self.nodes["left"], self.nodes["right"], self.nodes["feature"]
        size = np.repeat(np.diff(p), np.diff(p))
        local = np.arange(N) - np.repeat(p[:-1], np.diff(p))
        leaf = left < 0
        if ((left < 0) != (right < 0)).any() or (leaf & ((left != -1) | (right != -1))).any():
            fail("a node must have two children or be a leaf (-1, -1)")
        inner = ~leaf
        if (inner & ((left <= local) | (right <= local) | (left >= size) | (right >= size) | (left == right))).any():
            fail("children must be later nodes of the same tree")
        if (inner & ((feat < 0) | (feat >= d))).any():
            fail(f"split features must be in 0..{d - 1}")
        base = np.repeat(p[:-1], np.diff(p))
        kids = np.concatenate([(left + base)[inner], (right + base)[inner]])
        roots = p[:-1]
        if np.intersect1d(kids, roots).size or np.unique(kids).size != kids.size or kids.size != N - roots.size:
            fail("every non-root node must have exactly one parent")
        depth = np.zeros(N, dtype=np.int64)
        order = np.flatnonzero(inner)  # parents come before their children, so one pass sets depths
        for i in order.tolist():
            depth[left[i] + base[i]] = depth[right[i] + base[i]] = depth[i] + 1
        self._depth = int(depth.max()) if N else 0
        if self._depth > 30:
            fail("trees deeper than 30 levels")

    # ----------------------------------------------------------------- properties
    @property
    def n_features(self) -> int:
        return len(self.feature_names)

    @property
    def n_trees(self) -> int:
        return int(self.tree_ptr.size - 1)

    @property
    def n_rounds(self) -> int:
        return self.n_trees // self.params.n_outputs

    @property
    def tree_class(self) -> np.ndarray:
        """``(n_trees,)`` int32 class (output) index of each tree."""
        return (np.arange(self.n_trees) % self.params.n_outputs).astype(np.int32)

    def tree(self, t: int) -> dict[str, np.ndarray]:
        """Node arrays of tree ``t`` (local child indices)."""
        a, b = self.tree_ptr[t], self.tree_ptr[t + 1]
        return {k: v[a:b] for k, v in self.nodes.items()}

    # ----------------------------------------------------------------- prediction
    def _check_X(self, X: np.ndarray) -> np.ndarray:
        A = np.asarray(X, dtype=np.float64)
        if A.ndim != 2 or A.shape[1] != self.n_features:
            raise ValueError(f"X must be (n, {self.n_features}) with columns {self.feature_names[:5]}…, "
                             f"got shape {A.shape}")
        if np.isinf(A).any():
            r, c = map(int, np.argwhere(np.isinf(A))[0])
            raise ValueError(f"X: row {r + 1}, column {self.feature_names[c]!r} is infinite (NaN marks missing)")
        return A.astype(np.float32)

    def leaves(self, X: np.ndarray) -> np.ndarray:
        """``(n, n_trees)`` int64 global node index of the leaf each row reaches in each tree."""
        A = self._check_X(X)
        thr, dl = self.nodes["threshold"], self.nodes["default_left"]
        # node i's children at 2i (left) and 2i + 1 (right); a leaf's are itself
        child = np.stack([self._go_left, self._go_right], axis=1).reshape(-1)
        out = np.empty((A.shape[0], self.n_trees), dtype=np.int64)
        d = A.shape[1]
        for s in range(0, A.shape[0], _ROWS_PER_CHUNK):
            chunk = np.ascontiguousarray(A[s:s + _ROWS_PER_CHUNK]).reshape(-1)
            c = chunk.size // d  # a layout has at least one feature
            idx = np.broadcast_to(self.tree_ptr[:-1], (c, self.n_trees)).copy()
            row_start = (np.arange(c) * d)[:, None]
            for _ in range(self._depth):
                x = chunk.take(row_start + self._feature.take(idx))  # (c, n_trees) the nodes' feature values
                # x < t is False for NaN: a missing value goes left iff its node's default is left
                right = ~((x < thr.take(idx)) | (np.isnan(x) & dl.take(idx)))
                idx = child.take(2 * idx + right)
            out[s:s + c] = idx
        return out

    def predict_margin(self, X: np.ndarray) -> np.ndarray:
        """Raw margins: ``(n,)`` for binary/regression, ``(n, n_classes)`` for multiclass (float64).

        Raises:
            ValueError: ``X`` is not ``(n, n_features)`` or holds ±inf (NaN = missing).
        """
        margins = self._margins(X)
        return margins[:, 0] if self.params.n_outputs == 1 else margins

    def _margins(self, X: np.ndarray) -> np.ndarray:
        leaf_values = self.nodes["value"].astype(np.float64)[self.leaves(X)]
        K = self.params.n_outputs
        margins = np.tile(self.base_margin.astype(np.float64), (leaf_values.shape[0], 1))
        for k in range(K):
            margins[:, k] += leaf_values[:, k::K].sum(axis=1)
        return margins

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """``(n, n_classes)`` class probabilities. Raises ``ValueError`` for regression."""
        if self.params.objective == "regression":
            raise ValueError("predict_proba needs a classification objective; use predict")
        return transform(self.params, self._margins(X))

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Class indices ``(n,)`` (int64), or predicted values for regression (float64)."""
        out = transform(self.params, self._margins(X))
        return out if self.params.objective == "regression" else np.argmax(out, axis=1).astype(np.int64)

    # ----------------------------------------------------------------- importance
    def importance_array(self, kind: str = "gain") -> np.ndarray:
        """``(d,)`` importance of every feature (0 where never split on); kinds as XGBoost's
        ``get_score``: ``weight`` (splits), ``gain``/``cover`` (mean loss change / hessian per
        split), ``total_gain``/``total_cover``.

        Raises:
            ValueError: unknown kind.
        """
        if kind not in IMPORTANCE_TYPES:
            raise ValueError(f"importance kind must be one of {IMPORTANCE_TYPES}, got {kind!r}")
        inner = self.nodes["left"] >= 0
        f = self.nodes["feature"][inner]
        weight = np.bincount(f, minlength=self.n_features).astype(np.float64)
        if kind == "weight":
            return weight
        src = self.nodes["gain" if "gain" in kind else "cover"][inner].astype(np.float64)
        total = np.bincount(f, weights=src, minlength=self.n_features)
        if kind.startswith("total_"):
            return total
        return np.divide(total, weight, out=np.zeros_like(total), where=weight > 0)

    def feature_importance(self, kind: str = "gain") -> dict[str, float]:
        """``{feature name: importance}`` for the features used in a split (XGBoost's ``get_score``)."""
        imp = self.importance_array(kind)
        used = np.bincount(self.nodes["feature"][self.nodes["left"] >= 0], minlength=self.n_features) > 0
        return {n: float(v) for n, v, u in zip(self.feature_names, imp, used) if u}

    # ----------------------------------------------------------------- serialisation
    def to_arrays(self) -> dict[str, np.ndarray]:
        """Named numeric arrays for the model file: the node arrays, ``tree_ptr``,
        ``base_margin`` and (when known) the bin ``edges``/``edge_ptr``."""
        out = {k: v.copy() for k, v in self.nodes.items()}
        out["tree_ptr"] = self.tree_ptr.copy()
        out["base_margin"] = self.base_margin.copy()
        if self.layout is not None:
            out.update(self.layout.to_arrays())
        return out

    def manifest(self) -> dict[str, Any]:
        """The JSON part: format, parameters, feature names, best iteration."""
        return {"format": FORMAT, "version": VERSION, "params": self.params.to_dict(),
                "feature_names": list(self.feature_names), "best_iteration": self.best_iteration}

    @classmethod
    def from_arrays(cls, manifest: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> "GBDTModel":
        """Rebuild a model from :meth:`manifest` and :meth:`to_arrays`.

        Raises:
            ValueError: another format or version, missing arrays, wrong dtypes, or arrays that
                do not form valid trees (children before parents, shared children, features
                out of range, non-finite numbers, …).
        """
        if not isinstance(manifest, Mapping) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
            raise ValueError(f"not a {FORMAT} version {VERSION} manifest")
        need = set(NODE_ARRAYS) | {"tree_ptr", "base_margin"}
        missing = sorted(need - set(arrays))
        if missing:
            raise ValueError(f"invalid GBDT model: arrays {missing} are missing")
        for k, dt in NODE_ARRAYS.items():
            a = np.asarray(arrays[k])
            if a.dtype.kind != np.dtype(dt).kind:
                raise ValueError(f"invalid GBDT model: array {k!r} has dtype {a.dtype}, expected {np.dtype(dt)}")
        if np.asarray(arrays["tree_ptr"]).dtype.kind not in "iu":
            raise ValueError("invalid GBDT model: tree_ptr must be integers")
        params = GBDTParams.from_dict(manifest.get("params") or {})
        names = manifest.get("feature_names")
        if not isinstance(names, list):
            raise ValueError("invalid GBDT model: feature_names must be a list")
        best = manifest.get("best_iteration")
        if best is not None and (isinstance(best, bool) or not isinstance(best, int) or best < 0):
            raise ValueError("invalid GBDT model: best_iteration must be a non-negative integer or null")
        layout = BinLayout.from_arrays(arrays) if "edges" in arrays else None
        if layout is not None and layout.n_features != len(names):
            raise ValueError("invalid GBDT model: bin edges do not match the features")
        return cls(params, arrays["base_margin"], {k: arrays[k] for k in NODE_ARRAYS}, arrays["tree_ptr"], names,
                   best_iteration=best, layout=layout)

    # ----------------------------------------------------------------- export
    def to_xgboost(self, *, keep_cover: bool = False):
        """An ``xgboost.Booster`` with the same trees (needs the ``xgboost`` extra; each node's
        cover masked to 1.0 unless ``keep_cover``); see :func:`~.xgboost_export.to_xgboost`."""
        from .xgboost_export import to_xgboost

        return to_xgboost(self, keep_cover=keep_cover)

    def to_xgboost_json(self, *, keep_cover: bool = False) -> dict[str, Any]:
        """XGBoost's JSON model document (no xgboost needed; cover masked unless ``keep_cover``);
        see :mod:`.xgboost_export`."""
        from .xgboost_export import xgboost_json

        return xgboost_json(self, keep_cover=keep_cover)
