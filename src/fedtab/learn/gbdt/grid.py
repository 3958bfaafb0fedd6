"""The bin grid a site accepts from the server (pure numpy).

A bin grid is what a curious server would craft: every released histogram counts the rows
of a node between consecutive edges, so edges placed around one value, moved a little
between runs, isolate it. A site therefore checks the grid of a ``gbdt_start`` before it
bins anything (:func:`grid_refusal`): per feature a finite, strictly increasing float32
array of at most ``max_edges`` edges, inside the public bounds when the run has them, and,
under differential privacy, exactly the equal-width grid of those bounds
(:func:`public_grid`: no site's values are behind it). The distinct edges a site ever
binned a feature at are counted in its ledger (:func:`edge_keys`), so a server cannot sweep
thresholds over many runs (``DisclosurePolicy.max_split_thresholds``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["public_grid", "grid_refusal", "edge_keys", "MAX_EDGES"]

#: most edges of one feature a :class:`~.bins.BinLayout` holds (uint16 bins)
MAX_EDGES = 65534


def public_grid(lo: Sequence[float], hi: Sequence[float], max_bins: int) -> list[np.ndarray]:
    """Equal-width float32 edges inside each feature's public bounds ``[lo, hi]``: the
    ``max_bins − 1`` inner points of ``linspace(lo, hi, max_bins + 1)`` (deduplicated; none
    for ``lo = hi``). Uses no site data."""
    out = []
    for a, b in zip(np.asarray(lo, dtype=np.float64).tolist(), np.asarray(hi, dtype=np.float64).tolist()):
        out.append(np.unique(np.linspace(a, b, int(max_bins) + 1)[1:-1].astype(np.float32)) if b > a
                   else np.zeros(0, np.float32))
    return out


def grid_refusal(arrays: Mapping[str, Any], n_features: int, *, max_edges: int,
                 bounds: tuple[np.ndarray, np.ndarray] | None = None,
                 public: Sequence[np.ndarray] | None = None,
                 allowed: Sequence[np.ndarray | None] | None = None) -> str | None:
    """Why a server-sent grid (``arrays["edges"]`` flat, ``arrays["edge_ptr"]`` ``(d + 1,)``) is
    refused, or ``None``.

    Refused: missing or malformed arrays, a pointer that does not split the edges into
    ``n_features`` runs, non-finite or non-float32 values, edges not strictly increasing
    within a feature, more than ``max_edges`` edges in a feature, an edge outside the
    feature's ``bounds`` (``(lo, hi)`` arrays), (with ``public``) any difference from the
    public grid (``None`` for a feature: no such grid), or (with ``allowed``) an edge of feature ``f`` that is not a point of
    ``allowed[f]`` (``None``: any point).
    """
    e, p = arrays.get("edges"), arrays.get("edge_ptr")
    if e is None or p is None:
        return "the bin grid must come as 'edges' and 'edge_ptr'"
    e, p = np.asarray(e), np.asarray(p)
    if e.ndim != 1 or e.dtype.kind != "f" or p.ndim != 1 or p.dtype.kind not in "iu":
        return "the bin grid must be a flat float array of edges and an integer pointer"
    if p.size != n_features + 1 or p[0] != 0 or p[-1] != e.size or (np.diff(p) < 0).any():
        return f"the bin grid's pointer must rise from 0 to the number of edges over {n_features} features"
    if not np.isfinite(e).all():
        return "the bin grid holds a non-finite edge"
    with np.errstate(over="ignore"):
        e32 = e.astype(np.float32)
    if not np.isfinite(e32).all() or not np.array_equal(e32.astype(e.dtype), e):
        return "the bin grid's edges must be float32 values"
    counts = np.diff(p)
    cap = min(int(max_edges), MAX_EDGES)
    if counts.size and counts.max() > cap:
        return f"the bin grid has {int(counts.max())} edges in a feature, more than the site's cap of {cap}"
    feat = np.repeat(np.arange(n_features), counts)
    if e32.size > 1 and ((np.diff(e32) <= 0) & (feat[1:] == feat[:-1])).any():
        return "the bin grid's edges must increase strictly within each feature"
    if bounds is not None:
        lo, hi = (np.asarray(b, dtype=np.float64) for b in bounds)
        if e32.size and ((e32 < lo[feat].astype(np.float32)) | (e32 > hi[feat].astype(np.float32))).any():
            return "the bin grid has an edge outside the public bounds"
    if allowed is not None:
        for f, points in enumerate(allowed):
            if points is not None and not np.isin(e32[p[f]:p[f + 1]], np.asarray(points, dtype=np.float32)).all():
                return "the bin grid has an edge that is not a point of the public grid this site agreed for the column"
    if public is not None:
        for f, want in enumerate(public):
            if want is not None and not np.array_equal(e32[p[f]:p[f + 1]], np.asarray(want, dtype=np.float32)):
                return "under differential privacy the bin grid must be the equal-width grid of the public bounds"
    return None


def edge_keys(arrays: Mapping[str, Any], features: Sequence[str]) -> dict[str, list[str]]:
    """``{feature: [edge as float32 hex]}`` of a checked grid (what the site's ledger counts)."""
    e = np.asarray(arrays["edges"]).astype(np.float32)
    p = np.asarray(arrays["edge_ptr"], dtype=np.int64)
    return {str(f): [v.tobytes().hex() for v in e[p[i]:p[i + 1]]] for i, f in enumerate(features)}
