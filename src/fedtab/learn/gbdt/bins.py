"""The agreed bin edges of a boosting run and the binning of a table.

The edges come from no site's values: from the public bounds of the data dictionary
(:func:`~.grid.public_grid`), or from a quantile sketch of the sites' pooled counts over
public grids (:mod:`.sketch`), so every edge is a point of a public grid. The edges are
float32 because XGBoost compares float32 values: a value ``x`` falls in bin ``b`` = the
number of edges ``≤ float32(x)``, so ``bin(x) ≤ b`` ⇔ ``x < edges[b]``, which is the split
XGBoost stores.

:class:`BinLayout` holds the edges and the flat histogram layout: feature ``f`` owns
``n_bins[f] + 1`` consecutive slots from ``offsets[f]``, its value bins then its missing
bin (NaN, or a column the site does not have).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

__all__ = ["BinLayout"]

_F32_MAX = np.float32(np.finfo(np.float32).max)


def _finite_or_nan(X: np.ndarray, what: str) -> np.ndarray:
    """``X`` as float32 (NaN kept), checked: 2-d, no ±inf, nothing outside the float32 range."""
    A = np.asarray(X, dtype=np.float64)
    if A.ndim != 2:
        raise ValueError(f"{what} must be a 2-d array (rows, features), got shape {A.shape}")
    with np.errstate(over="ignore"):
        F = A.astype(np.float32)  # ±inf, and a finite value beyond the float32 range, become ±inf
    bad = np.isinf(F)
    if bad.any():
        r, c = map(int, np.argwhere(bad)[0])
        raise ValueError(f"{what}: row {r + 1}, column {c + 1} is infinite or outside the float32 range "
                         "(NaN marks a missing cell)")
    return F


#: features with at most this many edges are binned by comparisons instead of a search
_FEW_EDGES = 4


class BinLayout:
    """Agreed float32 bin edges per feature and the flat histogram layout.

    Attributes:
        edges: per feature a strictly increasing finite float32 array (may be empty).
        n_bins: ``(d,)`` value bins per feature (``len(edges[f]) + 1``).
        offsets: ``(d + 1,)`` first slot of each feature; feature ``f``'s missing slot is
            ``offsets[f] + n_bins[f]`` and ``n_slots = offsets[-1]``.

    Raises:
        ValueError: edges that are not finite, strictly increasing 1-d arrays, or more than
            65534 edges in a feature.
    """

    def __init__(self, edges: Sequence[np.ndarray]):
        self.edges: list[np.ndarray] = []
        for f, e in enumerate(edges):
            a = np.asarray(e, dtype=np.float32)
            if a.ndim != 1 or not np.isfinite(a).all() or (np.diff(a) <= 0).any() or a.size > 65534:
                raise ValueError(f"edges of feature {f} must be a strictly increasing finite 1-d array "
                                 "of at most 65534 values")
            self.edges.append(a)
        if not self.edges:
            raise ValueError("a bin layout needs at least one feature")
        self.n_bins = np.array([e.size + 1 for e in self.edges], dtype=np.int64)
        self.offsets = np.r_[0, np.cumsum(self.n_bins + 1)].astype(np.int64)

    @classmethod
    def for_bin_indices(cls, n_bins: Sequence[int]) -> "BinLayout":
        """A layout for data already reduced to bin indices ``0..n_bins[f]-1`` (edges at ``b + ½``)."""
        return cls([np.arange(int(k) - 1, dtype=np.float32) + np.float32(0.5) for k in n_bins])

    @property
    def n_features(self) -> int:
        return len(self.edges)

    @property
    def n_slots(self) -> int:
        return int(self.offsets[-1])

    @property
    def missing_slots(self) -> np.ndarray:
        """``(d,)`` the flat slot of each feature's missing bin."""
        return self.offsets[:-1] + self.n_bins

    def bin(self, X: np.ndarray) -> np.ndarray:
        """``(n, d)`` uint16 bin of each cell of ``X`` ``(n, d)``; NaN → ``n_bins[f]`` (missing).

        Raises:
            ValueError: wrong width, ±inf or values outside the float32 range.
        """
        A = _finite_or_nan(X, "X")
        if A.shape[1] != self.n_features:
            raise ValueError(f"X has {A.shape[1]} columns, the bin layout {self.n_features}")
        out = np.empty(A.shape, dtype=np.uint16)
        for cols, e in self._edge_groups():  # columns with the same edges (one-hot columns) in one call
            block = A[:, cols]
            if e.size <= _FEW_EDGES:  # the edges ≤ x, counted (a search's answer, side="right")
                b = np.zeros(block.shape, dtype=np.uint8)  # at most _FEW_EDGES + 1: one byte a cell
                for edge in e.tolist():
                    b = b + (block >= np.float32(edge)).view(np.uint8)
                out[:, cols] = np.where(np.isnan(block), np.uint8(e.size + 1), b)
                continue
            b = np.searchsorted(e, block, side="right")
            b[np.isnan(block)] = e.size + 1
            out[:, cols] = b
        return out

    def _edge_groups(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """``[(features, their common edges)]``: features grouped by equal edges, built once."""
        groups = self.__dict__.get("_groups_by_edges")
        if groups is None:
            by: dict[bytes, list[int]] = {}
            for j, e in enumerate(self.edges):
                by.setdefault(e.tobytes(), []).append(j)
            groups = self._groups_by_edges = [(np.asarray(js, dtype=np.int64), self.edges[js[0]]) for js in by.values()]
        return groups

    def slots(self, bins: np.ndarray) -> np.ndarray:
        """``(n, d)`` int32 flat histogram slot of each binned cell."""
        return (np.asarray(bins, dtype=np.int32) + self.offsets[:-1].astype(np.int32)).astype(np.int32)

    def threshold(self, feature: np.ndarray, bin_: np.ndarray) -> np.ndarray:
        """float32 raw thresholds of splits ``bin ≤ bin_`` on ``feature`` (go left iff ``x < t``):
        the bin's upper edge, ``+FLT_MAX`` for the last value bin, ``−FLT_MAX`` for ``bin_ = −1``
        (only missing values go left)."""
        f = np.asarray(feature, dtype=np.int64).ravel()
        b = np.asarray(bin_, dtype=np.int64).ravel()
        out = np.empty(f.size, dtype=np.float32)
        for i, (fi, bi) in enumerate(zip(f.tolist(), b.tolist())):
            e = self.edges[fi]
            out[i] = -_F32_MAX if bi < 0 else (_F32_MAX if bi >= e.size else e[bi])
        return out

    def to_arrays(self) -> dict[str, np.ndarray]:
        """``{"edges": flat float32, "edge_ptr": (d + 1,) int64}``."""
        return {"edges": np.concatenate(self.edges).astype(np.float32),
                "edge_ptr": np.r_[0, np.cumsum([e.size for e in self.edges])].astype(np.int64)}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "BinLayout":
        """Inverse of :meth:`to_arrays`. Raises ``ValueError`` on inconsistent arrays."""
        e, p = np.asarray(arrays["edges"]), np.asarray(arrays["edge_ptr"])
        if p.ndim != 1 or p.size < 2 or p[0] != 0 or p[-1] != e.size or (np.diff(p) < 0).any():
            raise ValueError("edge_ptr must rise from 0 to the number of edges")
        return cls([e[p[i]:p[i + 1]] for i in range(p.size - 1)])
