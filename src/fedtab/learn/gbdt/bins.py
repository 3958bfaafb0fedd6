"""Bin edges agreed from site summaries, and the binning of a table.

Site side: :func:`site_summary` turns each column's observed values into at most
``sketch_size`` points ``(mean, count)``: the sorted observed values are cut into
consecutive blocks of at least ``min_rows`` rows (at least ``⌈n / sketch_size⌉``; a run of
equal values is never cut), and each block is released as the mean of its values and its
row count. **What one summary discloses**, per column: the number of observed cells (the
sum of the counts) and, for each block, the mean of ≥ ``min_rows`` of the site's values and
how many rows it holds. No released number is one row's value: the smallest and largest
values are averaged with ≥ ``min_rows − 1`` others, and a value is released exactly only
when ≥ ``min_rows`` rows share it (a block made of one run of equal values). A column with
fewer than ``min_rows`` observed cells contributes no point. Missing cells are not counted.

**A release over blocks the site fixed.** A federated site summarises its whole training
part with its own floor and :data:`SUMMARY_POINTS` (never a request's ``sketch_size``,
``min_rows`` or part) and answers every summary request of a period with the summary it
recorded first (``fedtab.federation.gbdt.site``): two summaries with different block
structures, whose block means could be differenced, never leave a site.

Server side: :func:`merge_summaries` pools the points of all sites (weighted by their
counts) and places at most ``max_bins − 1`` edges per column, at the midpoints between
consecutive pooled points, equally spaced in pooled rank. The edges are float32 because
XGBoost compares float32 values: a value ``x`` falls in bin ``b`` = the number of edges
``≤ float32(x)``, so ``bin(x) ≤ b`` ⇔ ``x < edges[b]``, which is the split XGBoost stores.

:class:`BinLayout` holds the edges and the flat histogram layout: feature ``f`` owns
``n_bins[f] + 1`` consecutive slots from ``offsets[f]``, its value bins then its missing
bin (NaN, or a column the site does not have).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

__all__ = ["BinLayout", "SummaryError", "site_summary", "merge_summaries", "check_summary", "SUMMARY_KEYS",
           "SUMMARY_POINTS"]

SUMMARY_KEYS = ("values", "counts", "ptr")
#: the most points per column of a site's summary: fixed here, not by any request (the block
#: size of a column of ``n`` observed cells is ``max(min_rows, ⌈n / SUMMARY_POINTS⌉)``)
SUMMARY_POINTS = 1024
_F32_MAX = np.float32(np.finfo(np.float32).max)


class SummaryError(ValueError):
    """A site's bin summary is malformed (the message names the site)."""


def _finite_or_nan(X: np.ndarray, what: str) -> np.ndarray:
    A = np.asarray(X, dtype=np.float64)
    if A.ndim != 2:
        raise ValueError(f"{what} must be a 2-d array (rows, features), got shape {A.shape}")
    with np.errstate(over="ignore"):
        bad = np.isinf(A) | (np.isfinite(A) & np.isinf(A.astype(np.float32)))
    if bad.any():
        r, c = map(int, np.argwhere(bad)[0])
        raise ValueError(f"{what}: row {r + 1}, column {c + 1} is infinite or outside the float32 range "
                         "(NaN marks a missing cell)")
    return A


def _blocks(sorted_values: np.ndarray, block: int, min_rows: int, sketch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Start indices and sizes of blocks of the sorted values: about ``block`` rows each,
    at least ``min_rows``, at most ``sketch_size`` blocks, never cutting a run of equal values."""
    n = sorted_values.size
    run_end = np.r_[np.flatnonzero(sorted_values[1:] != sorted_values[:-1]) + 1, n]
    # close a block at the first run end that reaches each multiple of the block size
    at = np.minimum(np.searchsorted(run_end, np.arange(1, n // block + 1) * block), run_end.size - 1)
    ends = np.union1d(run_end[at], [n])
    sizes = np.diff(np.r_[0, ends]).tolist()
    merged: list[int] = []
    current = 0
    for c in sizes:  # ≤ n / block + 1 ≤ sketch_size + 1 blocks, so this loop is short
        current += c
        if current >= min_rows:
            merged.append(current)
            current = 0
    if current:
        merged[-1] += current
    while len(merged) > sketch_size:
        merged[-2] += merged.pop()
    counts = np.asarray(merged, dtype=np.int64)
    return np.r_[0, np.cumsum(counts)[:-1]].astype(np.int64), counts


def site_summary(X: np.ndarray, *, sketch_size: int = SUMMARY_POINTS, min_rows: int = 10) -> dict[str, np.ndarray]:
    """A site's bin summary of ``X`` ``(n, d)`` (NaN = missing; see the module docstring).

    Returns:
        ``{"values": (m,) float64 block means (ascending per column), "counts": (m,) int64
        rows per block (each ≥ min_rows), "ptr": (d + 1,) int64}``: column ``j``'s points are
        ``values[ptr[j]:ptr[j + 1]]``, at most ``sketch_size`` of them.

    Raises:
        ValueError: ``X`` is not 2-d, holds ±inf or values outside the float32 range, or
            ``sketch_size < 2`` / ``min_rows < 1``.
    """
    if sketch_size < 2 or min_rows < 1:
        raise ValueError(f"sketch_size must be >= 2 and min_rows >= 1, got {sketch_size}, {min_rows}")
    A = _finite_or_nan(X, "X")
    values, counts, ptr = [], [], [0]
    for j in range(A.shape[1]):
        col = np.sort(A[~np.isnan(A[:, j]), j])
        if col.size < min_rows:  # too few observed cells to release anything about this column
            ptr.append(ptr[-1])
            continue
        starts, sizes = _blocks(col, max(min_rows, math.ceil(col.size / sketch_size)), min_rows, sketch_size)
        values.append(np.add.reduceat(col, starts) / sizes)
        counts.append(sizes)
        ptr.append(ptr[-1] + sizes.size)
    return {"values": np.concatenate(values) if values else np.zeros(0),
            "counts": np.concatenate(counts) if counts else np.zeros(0, np.int64),
            "ptr": np.asarray(ptr, dtype=np.int64)}


def check_summary(summary: Mapping[str, np.ndarray], n_features: int, *, sketch_size: int, min_rows: int,
                  site: str = "a site", n_rows: int | None = None) -> None:
    """Validate one site's summary as the server receives it.

    ``n_rows`` (the site's row count, e.g. from its label sums) bounds each column's counts, so
    a site cannot outweigh the others in the merge by inflating them.

    Raises:
        SummaryError: other keys, wrong shapes or dtypes, non-finite or unsorted values,
            counts below ``min_rows``, more than ``sketch_size`` points in a column, or a
            column counting more than ``n_rows`` rows.
    """
    def fail(msg: str) -> None:
        raise SummaryError(f"{site}: bin summary {msg}")

    if not isinstance(summary, Mapping) or set(summary) != set(SUMMARY_KEYS):
        fail(f"must hold exactly {list(SUMMARY_KEYS)}")
    v, c, p = (np.asarray(summary[k]) for k in SUMMARY_KEYS)
    if v.ndim != 1 or v.dtype.kind != "f" or not np.isfinite(v).all():
        fail("values must be a 1-d array of finite floats")
    if c.shape != v.shape or c.dtype.kind not in "iu":
        fail("counts must be integers, one per value")
    if p.shape != (n_features + 1,) or p.dtype.kind not in "iu":
        fail(f"ptr must be {n_features + 1} integers for {n_features} features, got shape {p.shape}")
    if p[0] != 0 or p[-1] != v.size or (np.diff(p) < 0).any():
        fail("ptr must rise from 0 to the number of values")
    if (np.diff(p) > sketch_size).any():
        fail(f"has a column with more than sketch_size={sketch_size} points")
    if c.size and c.min() < min_rows:
        fail(f"has a point behind fewer than min_rows={min_rows} rows")
    if v.size and (np.abs(v) > float(_F32_MAX)).any():
        fail("has values outside the float32 range")
    col = np.repeat(np.arange(n_features), np.diff(p))
    if v.size > 1 and ((np.diff(v) < 0) & (col[1:] == col[:-1])).any():
        fail("values must ascend within each column")
    if n_rows is not None and (np.bincount(col, weights=c.astype(np.float64), minlength=n_features) > n_rows).any():
        fail(f"counts more rows in a column than the site's {n_rows}")


def _column_edges(values: np.ndarray, weights: np.ndarray, max_bins: int) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    u, inv = np.unique(values[order], return_inverse=True)
    w = np.bincount(inv, weights=weights[order].astype(np.float64))
    if u.size < 2:
        return np.zeros(0, dtype=np.float32)
    gaps = np.arange(u.size - 1)
    if u.size > max_bins:
        cum = np.cumsum(w)[:-1]  # pooled weight at or below u[i], the rank of gap i
        targets = np.arange(1, max_bins) * (w.sum() / max_bins)
        hi = np.minimum(np.searchsorted(cum, targets), cum.size - 1)
        lo = np.maximum(hi - 1, 0)
        gaps = np.unique(np.where(np.abs(cum[lo] - targets) <= np.abs(cum[hi] - targets), lo, hi))
    a = u[gaps].astype(np.float32)
    b = u[gaps + 1].astype(np.float32)
    e = ((u[gaps] + u[gaps + 1]) / 2).astype(np.float32)
    e = np.where(e <= a, np.nextafter(a, np.float32(np.inf)), e)
    return np.unique(e[(e > a) & (e <= b)])


def merge_summaries(summaries: Sequence[Mapping[str, np.ndarray]], n_features: int, *, max_bins: int = 256,
                    sketch_size: int = 1024, min_rows: int = 10, sites: Sequence[str] | None = None,
                    n_rows: Sequence[int] | None = None) -> "BinLayout":
    """The agreed :class:`BinLayout` from the sites' :func:`site_summary` replies.

    Each summary is checked first (:func:`check_summary`, against the sites' ``n_rows`` when
    given); points are pooled with their counts as weights and each column gets at most
    ``max_bins − 1`` edges.

    Raises:
        SummaryError: a malformed summary (naming its site).
        ValueError: no summaries, or ``max_bins`` outside 2..65535.
    """
    if not summaries:
        raise ValueError("merge_summaries needs at least one summary")
    if not 2 <= max_bins <= 65535:
        raise ValueError(f"max_bins must be in 2..65535, got {max_bins}")
    names = list(sites) if sites is not None else [f"site {i}" for i in range(len(summaries))]
    rows = list(n_rows) if n_rows is not None else [None] * len(summaries)
    for s, name, n in zip(summaries, names, rows):
        check_summary(s, n_features, sketch_size=sketch_size, min_rows=min_rows, site=name, n_rows=n)
    edges = []
    for j in range(n_features):
        vals = [np.asarray(s["values"])[s["ptr"][j]:s["ptr"][j + 1]] for s in summaries]
        cnts = [np.asarray(s["counts"])[s["ptr"][j]:s["ptr"][j + 1]] for s in summaries]
        edges.append(_column_edges(np.concatenate(vals).astype(np.float64), np.concatenate(cnts), max_bins))
    return BinLayout(edges)


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
            block = A[:, cols].astype(np.float32)
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
