"""In-process drivers: the federated flow's sequence of sums, run over site arrays in one process.

:func:`fit_gbdt_sites` runs exactly the exchanges a federation will run — bin summaries →
edges, label sums → intercept, then per round and level the sites' histograms summed →
splits → routing, leaf values, validation sums — but sums the sites' arrays directly. It is
the reference for the federated version (which can differ only by summation order) and,
with one site, :func:`fit_gbdt_pooled` is the centralised model.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .bins import BinLayout
from .grow import Booster
from .model import GBDTModel
from .objectives import base_margin, label_sums
from .params import GBDTParams
from .site import SiteBooster
from .sketch import sketch_edges

__all__ = ["fit_gbdt_sites", "fit_gbdt_pooled", "as_params"]


def as_params(params: GBDTParams | Mapping[str, Any] | None) -> GBDTParams:
    """:class:`GBDTParams` from an instance, a mapping or None (defaults)."""
    if isinstance(params, GBDTParams):
        return params
    return GBDTParams.from_dict(params or {})


def fit_gbdt_sites(sites: Sequence[tuple], params: GBDTParams | Mapping[str, Any] | None = None, *,
                   feature_names: Sequence[str] | None = None, layout: BinLayout | None = None,
                   log: list | None = None) -> GBDTModel:
    """Boost over several sites' arrays by summing their replies.

    Args:
        sites: per site ``(X, y)`` or ``(X, y, X_val, y_val)``; ``X`` ``(n_i, d)`` float with
            NaN for missing cells (a column a site lacks is all NaN), columns in one order.
        params: :class:`GBDTParams` or a mapping of its fields.
        feature_names: the ``d`` column names (default ``f0 …``).
        layout: agreed bins to use instead of merging the sites' summaries (e.g. for data
            already reduced to bin indices, :meth:`BinLayout.for_bin_indices`).
        log: if given, one dict per level exchange is appended: ``round``, ``level``,
            ``nodes`` (histograms built), ``bytes_per_site`` (float64 histogram payload).

    The bins are agreed as a federation's sites agree them without public bounds
    (:func:`~.sketch.sketch_edges`): each site counts its whole training part (``X`` and, when
    given, ``X_val``: a site's fit and validation parts tile its training part) over the
    public range grid, then over the fine grid of the pooled range, in runs of at least
    ``params.min_rows`` rows (the sites' floor); the edges are quantiles of the pooled counts.

    Returns:
        the trained :class:`GBDTModel` (early stopping needs validation rows at every site
        that has any; the pooled validation loss decides).

    Raises:
        ValueError: no sites, widths that differ, bad labels or parameters.
    """
    p = as_params(params)
    if not sites:
        raise ValueError("fit_gbdt_sites needs at least one site")
    widths = {np.asarray(s[0]).shape[1] if np.asarray(s[0]).ndim == 2 else -1 for s in sites}
    if len(widths) != 1 or -1 in widths:
        raise ValueError(f"every site needs a 2-d X with the same columns, got widths {sorted(widths)}")
    d = widths.pop()
    if layout is None:
        layout = BinLayout(sketch_edges([_training_rows(s) for s in sites], p.max_bins, p.min_rows))
    elif layout.n_features != d:
        raise ValueError(f"layout has {layout.n_features} features, X has {d}")
    margin0 = base_margin(p, np.sum([label_sums(p, s[1]) for s in sites], axis=0))
    boosters = [SiteBooster(s[0], s[1], layout, p, margin0, X_val=s[2] if len(s) > 2 else None,
                            y_val=s[3] if len(s) > 3 else None, secret=i) for i, s in enumerate(sites)]
    validating = [b for b in boosters if b.val_margins is not None]
    booster = Booster(p, layout, margin0, feature_names)
    while not booster.finished:
        grower = booster.new_round()
        for b in boosters:
            b.start_round()
        while not grower.done:
            request = grower.request()
            replies = [b.histograms(request) for b in boosters]
            if log is not None:
                log.append({"round": len(booster.rounds), "level": grower.level, "nodes": int(request.shape[0]),
                            "bytes_per_site": int(replies[0].nbytes)})
            splits = grower.submit(np.sum(replies, axis=0))
            for b in boosters:
                b.apply(splits)
        values = grower.leaf_values()
        for b in boosters:
            b.finish_round(values)
        booster.add_round(grower)
        if validating:
            booster.record_validation(np.sum([b.validation_sums() for b in validating], axis=0))
    return booster.model()


def _training_rows(site: tuple) -> np.ndarray:
    """A site's whole training part: ``X``, and ``X_val`` below it when given."""
    if len(site) > 2 and site[2] is not None and np.asarray(site[2]).size:
        return np.vstack([np.asarray(site[0], dtype=np.float64), np.asarray(site[2], dtype=np.float64)])
    return np.asarray(site[0], dtype=np.float64)


def fit_gbdt_pooled(X: np.ndarray, y: np.ndarray, params: GBDTParams | Mapping[str, Any] | None = None, *,
                    X_val: np.ndarray | None = None, y_val: np.ndarray | None = None,
                    feature_names: Sequence[str] | None = None, layout: BinLayout | None = None,
                    log: list | None = None) -> GBDTModel:
    """The centralised reference: :func:`fit_gbdt_sites` on one table (bins from its own sketch).

    Args:
        X: ``(n, d)`` float, NaN = missing. y: ``(n,)`` labels.
        params, layout, log: as :func:`fit_gbdt_sites`. X_val, y_val: validation rows for early stopping.

    Raises:
        ValueError: as :func:`fit_gbdt_sites`.
    """
    site: tuple = (X, y) if X_val is None else (X, y, X_val, y_val)
    return fit_gbdt_sites([site], params, feature_names=feature_names, layout=layout, log=log)
