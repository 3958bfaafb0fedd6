"""The pooled ANOVA's site side: per-class counts, sums and sums of squares of the site's part."""

from __future__ import annotations

import numpy as np

from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.parts import canonical_part
from fedtab.federation.site.core import Site
from fedtab.federation.site.registry import handler
from fedtab.federation.site.matrices import label_key, site_matrix




__all__ = ["class_moments", "suppress_rare_ones_per_class"]

def class_moments(X: np.ndarray, labels: list[str]) -> dict[str, np.ndarray]:
    """Per class (rows of the result, in ``sorted(set(labels))`` order) and feature:
    ``count``, ``sum``, ``sumsq`` of the observed (non-NaN) values of ``X`` ``(n, d)``."""
    classes = sorted(set(labels))
    keys = np.asarray(labels, dtype=object)
    obs = ~np.isnan(X)
    Xz = np.where(obs, X, 0.0)
    count = np.stack([obs[keys == c].sum(axis=0) for c in classes]) if classes else np.zeros((0, X.shape[1]))
    total = np.stack([Xz[keys == c].sum(axis=0) for c in classes]) if classes else np.zeros((0, X.shape[1]))
    sumsq = np.stack([(Xz[keys == c] ** 2).sum(axis=0) for c in classes]) if classes else np.zeros((0, X.shape[1]))
    return {"count": count.astype(np.int64), "sum": total, "sumsq": sumsq}


def suppress_rare_ones_per_class(moments: dict[str, np.ndarray], X: np.ndarray, labels: list[str],
                                 min_rows: int) -> dict[str, np.ndarray]:
    """``moments`` (:func:`class_moments` of ``X`` ``(n, d)`` and ``labels``) with the cells
    ``(class, column)`` of every 0/1 column (all observed values 0 or 1 over ``X``) whose ones
    in that class number 1 to ``min_rows - 1`` set to 0 in ``count``, ``sum`` and ``sumsq``:
    the sum of an indicator counts the rows holding its category, and the test rows keep
    categories this site holds in fewer than ``min_rows`` rows. A new dict; the input is
    not modified."""
    classes = sorted(set(labels))
    obs = ~np.isnan(X)
    binary = ~(obs & (X != 0) & (X != 1)).any(axis=0)
    if not classes or not binary.any():
        return dict(moments)
    keys = np.asarray(labels, dtype=object)
    ones = np.stack([(obs & (X == 1))[keys == c].sum(axis=0) for c in classes])  # (C, d)
    small = binary[None, :] & (ones > 0) & (ones < min_rows)
    out = dict(moments)
    for k in ("count", "sum", "sumsq"):
        out[k] = np.where(small, 0, moments[k]).astype(np.asarray(moments[k]).dtype)
    return out


@handler("class_moments")
def _class_moments(site: Site, request: Message) -> Message:
    features = site.feature_names
    part = str(request.meta.get("part") or "train")
    X, y = site_matrix(site, features, part)
    labels = [label_key(v) for v in y]
    moments = class_moments(X, labels)
    if canonical_part(part) in ("test", "all"):  # the test rows keep the model file's rare categories
        moments = suppress_rare_ones_per_class(moments, X, labels, site.policy.min_rows)
    classes = sorted(set(labels))
    keys = np.asarray(labels, dtype=object)
    moments["n_class"] = np.array([int((keys == c).sum()) for c in classes], dtype=np.int64)
    return Message("class_moments", moments, {"classes": classes, "feature_names": features, "n": int(len(labels))})
