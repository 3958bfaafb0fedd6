"""Column profiles: the first exchange of a job (names, kinds, integer flags, observed ranges, rows).

``"job_profile"`` — every site replies, for each of its feature columns (never the
label): its kind (``numeric`` or ``categorical``), and for numeric columns whether every
observed value is an integer, a *coarse* observed range and the number of observed
cells; plus its row counts (``rows``, ``train``, ``test``, and ``unlabelled``: rows
dropped because their label was missing), its label keys and its selector. The range is
no row's value: its ends are the ``min_rows``-th smallest and largest observed values
rounded outward to two significant digits (:func:`fedtab.privacy.policy.coarse_range`),
and a column observed in fewer than ``min_rows`` cells sends none. It is what the job
clips imputed values to (``docs/job.md``).

:func:`profile_sites` validates every reply (naming the site) before returning them.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..errors import SiteFault
from ..privacy.gate import COUNT, LABELS, NAMES, STRUCT, TEXT, Releases
from ..privacy.policy import coarse_range
from .messages import Message
from .protocol import Federation, FederationError, collect
from .site import Site, handler
from .training_flow import label_key

__all__ = ["profile_sites", "pooled_ranges"]


@handler("job_profile", Releases(part="=all", cells={"observed": ("low", "high")}, aggregates=("integer",),
                                 meta={"columns": NAMES, "kinds": STRUCT, "classes": LABELS, "rows": COUNT,
                                       "unlabelled": COUNT, "train": COUNT, "test": COUNT, "selector": TEXT}))
def _profile(site: Site, request: Message) -> Message:
    """Column names and kinds, integer flags and coarse ranges of numeric columns, row counts."""
    feats = site.feature_names
    kinds, integer, low, high, observed = [], [], [], [], []
    for c in feats:
        col = site.table[c]
        numeric = pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col)
        kinds.append("numeric" if numeric else "categorical")
        values = col.to_numpy(dtype=np.float64, na_value=np.nan) if numeric else np.zeros(0)
        values = values[~np.isnan(values)]
        if numeric and np.isinf(values).any():
            raise SiteFault(f"column {c!r} holds infinite values")
        span = coarse_range(values, site.policy.min_rows)
        observed.append(len(values) if span is not None else 0)
        low.append(span[0] if span is not None else 0.0)
        high.append(span[1] if span is not None else 0.0)
        integer.append(bool(len(values)) and bool(np.all(values == np.round(values))))
    labels = sorted({label_key(v) for v in site.table[site.target]}) if site.target else []
    return Message(
        "job_profile",
        {"low": np.asarray(low, np.float64), "high": np.asarray(high, np.float64),
         "integer": np.asarray(integer, bool), "observed": np.asarray(observed, np.int64)},
        {"columns": feats, "kinds": kinds, "classes": labels, "rows": int(len(site.table)),
         "unlabelled": int(getattr(site, "unlabelled_rows", 0)), "train": int(len(site.rows("train"))),
         "test": int(len(site.rows("test"))), "selector": str(site.selector) if not isinstance(site.selector, dict)
         else json.dumps(site.selector, sort_keys=True)},
    )


def profile_sites(federation: Federation) -> dict[str, dict[str, Any]]:
    """``{site: profile}`` (one ``job_profile`` exchange), each reply validated.

    Raises:
        FederationError: a site failed, or sent names, kinds, arrays or counts that do not
            fit together (naming the site).
    """
    replies = collect(federation.broadcast(Message("job_profile")), "job_profile")
    out = {}
    for s, r in replies.items():
        cols, kinds = r.meta.get("columns"), r.meta.get("kinds")
        if (not isinstance(cols, list) or not all(isinstance(c, str) for c in cols) or len(set(cols)) != len(cols)
                or not isinstance(kinds, list) or len(kinds) != len(cols)
                or not all(k in ("numeric", "categorical") for k in kinds)):
            raise FederationError(f"site {s!r}: invalid column profile")
        arrays = {}
        for k in ("low", "high", "integer", "observed"):
            a = np.asarray(r.arrays.get(k))
            if a.shape != (len(cols),) or (a.dtype.kind == "f" and not np.isfinite(a).all()):
                raise FederationError(f"site {s!r}: profile array {k!r} has shape {a.shape} or non-finite values")
            arrays[k] = a
        counts = {k: r.meta.get(k) for k in ("rows", "unlabelled", "train", "test")}
        if not all(isinstance(v, int) and v >= 0 for v in counts.values()) or counts["train"] + counts["test"] != counts["rows"]:
            raise FederationError(f"site {s!r}: invalid row counts {counts}")
        classes = r.meta.get("classes")
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise FederationError(f"site {s!r}: invalid class labels")
        out[s] = {"columns": cols, "kinds": kinds, "classes": classes, "selector": str(r.meta.get("selector")),
                  **counts, **arrays}
    return out


def pooled_ranges(profiles: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{column: {"low", "high", "integer", "observed"}}`` over the numeric columns some site observes:
    the pooled observed range, whether every site saw only integers, and the observed cells."""
    out: dict[str, dict[str, Any]] = {}
    for p in profiles.values():
        for i, c in enumerate(p["columns"]):
            if p["kinds"][i] != "numeric" or p["observed"][i] == 0:
                continue
            r = out.setdefault(c, {"low": np.inf, "high": -np.inf, "integer": True, "observed": 0})
            r["low"] = min(r["low"], float(p["low"][i]))
            r["high"] = max(r["high"], float(p["high"][i]))
            r["integer"] = r["integer"] and bool(p["integer"][i])
            r["observed"] += int(p["observed"][i])
    return out
