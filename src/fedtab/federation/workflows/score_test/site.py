"""The score test's site side: the Rao score sums (gradient and information) of a logistic model over the site's part."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fedtab.election.score_test import (site_sums)
from fedtab.errors import SiteFault
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.core import Site
from fedtab.federation.site.registry import handler
from fedtab.federation.site.matrices import class_indices, site_matrix




__all__ = []

_SETUP = "setup:"


# ----------------------------------------------------------------------------- site side
def _site_design(site: Site, setup: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(Z, labels)``: the site's rows of the setup's part standardised with the pooled mean/std,
    missing cells and columns observed in fewer than ``min_rows`` rows at 0; ``labels`` the
    positions of the rows' classes in the agreed class list."""
    X, y_raw = site_matrix(site, list(setup["features"]), str(setup["part"]))
    observed = (~np.isnan(X)).sum(axis=0)
    Z = (X - setup["mean"]) / setup["std"]  # a new array (site_matrix's may be a read-only view)
    Z[:, (observed > 0) & (observed < site.policy.min_rows)] = np.nan  # suppressed as in "describe"
    Z[np.isnan(Z)] = 0.0
    return Z, class_indices(y_raw, list(setup["classes"]))


def _score_part(site: Site, request: Message) -> str:
    carried = request.meta.get("setup")
    if isinstance(carried, dict):
        return str(carried.get("part", "train"))
    return str((site.state.get("score_setup") or {}).get("part", "train"))


@handler("score_sums")
def _score_sums(site: Site, request: Message) -> Message:
    carried = request.meta.get("setup")
    if carried is not None:  # the first request carries the setup (no separate exchange)
        if not isinstance(carried, dict) or not isinstance(carried.get("features"), list) \
                or not isinstance(carried.get("classes"), list) or len(carried["classes"]) < 2:
            raise SiteFault("score_sums: 'setup' must hold the features and the classes")
        d = len(carried["features"])
        mean, std = (np.asarray(request.arrays.get(_SETUP + k), dtype=np.float64) for k in ("mean", "std"))
        if mean.shape != (d,) or std.shape != (d,) or not (np.isfinite(mean).all() and (std > 0).all()):
            raise SiteFault(f"score_sums: setup mean/std must be ({d},) finite with std > 0")
        site.state["score_setup"] = {"features": list(carried["features"]), "classes": list(carried["classes"]),
                                     "part": str(carried.get("part", "train")), "mean": mean, "std": std}
    setup = site.state.get("score_setup")
    if setup is None:
        raise SiteFault("the score test is not set up on this site (its first request carries the setup)")
    cache = setup.setdefault("_cache", {})
    if "Z" not in cache:
        cache["Z"], cache["labels"] = _site_design(site, setup)
    selected, positive = request.meta.get("selected"), request.meta.get("positive", 1)
    if not isinstance(selected, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in selected):
        raise SiteFault("score_sums: 'selected' must be a list of column indices")
    if not isinstance(positive, int) or isinstance(positive, bool) or not 0 <= positive < len(setup["classes"]):
        raise SiteFault("score_sums: 'positive' must be the index of one of the agreed classes")
    y = (cache["labels"] == positive).astype(np.float64)
    sums = site_sums(cache["Z"], y, selected, np.asarray(request.arrays.get("coef")),
                     bool(request.meta.get("with_score", False)))
    return Message("score_sums", sums, {"n": int(len(y))})
