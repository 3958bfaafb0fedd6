"""Global feature graph built from pooled correlations.

Nodes are the columns of the global schema. Each node links to its ``k`` most
correlated neighbours (by ``|r|``, at least ``min_abs_corr``); the edge set is made
symmetric so messages flow both ways. Pairs that no site observes together have an
undefined correlation (NaN) and therefore never get a direct edge.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FeatureGraph", "build_feature_graph"]


@dataclass
class FeatureGraph:
    """A weighted, signed, symmetric feature graph.

    Attributes:
        columns: node names (global schema), length ``F``.
        edge_index: (2, E) int64; row 0 = source node, row 1 = target node.
        weight: (E,) float, ``|r|`` of the pair, in ``(0, 1]``.
        sign: (E,) float, ``+1`` or ``-1`` (sign of ``r``).
    """

    columns: list[str]
    edge_index: np.ndarray
    weight: np.ndarray
    sign: np.ndarray

    @property
    def n_nodes(self) -> int:
        return len(self.columns)

    @property
    def n_edges(self) -> int:
        return int(self.edge_index.shape[1])

    def degree(self) -> np.ndarray:
        """(F,) number of incoming edges per node."""
        return np.bincount(self.edge_index[1], minlength=self.n_nodes)

    def validate(self) -> None:
        """Raise ``ValueError`` on bad shapes, out-of-range nodes or weights."""
        f, e = self.n_nodes, self.edge_index.shape
        if len(e) != 2 or e[0] != 2:
            raise ValueError(f"edge_index has shape {e}, expected (2, E)")
        if self.weight.shape != (e[1],) or self.sign.shape != (e[1],):
            raise ValueError("weight/sign length differs from the number of edges")
        if e[1] and (self.edge_index.min() < 0 or self.edge_index.max() >= f):
            raise ValueError("edge_index refers to a node outside the schema")
        if not (np.all(np.isfinite(self.weight)) and np.all((self.weight > 0) & (self.weight <= 1 + 1e-9))):
            raise ValueError("edge weights must be finite and in (0, 1]")
        if not np.all(np.isin(self.sign, (-1.0, 1.0))):
            raise ValueError("edge signs must be +1 or -1")


def build_feature_graph(corr: np.ndarray, columns: list[str], k: int = 10, min_abs_corr: float = 0.05) -> FeatureGraph:
    """k-nearest-neighbour graph over features by absolute correlation.

    Args:
        corr: (F, F) symmetric correlation matrix, NaN where undefined (never
            co-observed); the diagonal is ignored.
        columns: the F node names.
        k: neighbours kept per node (before symmetrisation), ``k >= 1``.
        min_abs_corr: edges with ``|r|`` below this are dropped.

    Returns:
        A symmetric :class:`FeatureGraph` without self loops, edges sorted by
        (target, source).

    Raises:
        ValueError: non-square ``corr``, name count mismatch, ``k < 1``.
    """
    r = np.asarray(corr, dtype=np.float64)
    f = len(columns)
    if r.shape != (f, f):
        raise ValueError(f"corr has shape {r.shape}, expected ({f}, {f})")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    a = np.abs(r)
    a = np.where(np.isfinite(a), a, 0.0)
    np.fill_diagonal(a, 0.0)
    a = np.where(a >= max(min_abs_corr, 1e-12), a, 0.0)
    keep = np.zeros((f, f), dtype=bool)
    kk = min(k, max(f - 1, 0))
    if kk > 0:
        top = np.argpartition(-a, kk - 1, axis=1)[:, :kk]  # per node i: its kk strongest j
        rows = np.repeat(np.arange(f), kk)
        keep[rows, top.ravel()] = True
    keep &= a > 0
    keep |= keep.T
    tgt, src = np.nonzero(keep)  # row-major: sorted by target then source
    edge_index = np.stack([src, tgt]).astype(np.int64)
    weight = a[src, tgt]
    sign = np.where(r[src, tgt] < 0, -1.0, 1.0)
    g = FeatureGraph([str(c) for c in columns], edge_index, weight, sign)
    g.validate()
    return g
