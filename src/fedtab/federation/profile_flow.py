"""Column profiles: the first exchange of a job (names, kinds, integer flags, observed ranges, rows).

``"job_profile"`` — every site replies, for each of its feature columns (never the
label): its kind (``numeric`` or ``categorical``), whether it is *unique per row* (a flag
only: every row holds a value, no two the same, text or integers, and at least
:data:`ID_MIN_ROWS` rows -- how a row identifier looks), and for numeric columns whether every
observed value is an integer, a *coarse* observed range and the number of observed
cells; plus its row counts (``rows``, ``train``, ``test``, and ``unlabelled``: rows
dropped because their label was missing), its label keys and its selector. The range is
no row's value: its ends are the ``min_rows``-th smallest and largest observed values
rounded outward to two significant digits (:func:`fedtab.privacy.policy.coarse_range`),
and a column observed in fewer than ``min_rows`` cells sends none. It is what the job
clips imputed values to (``docs/job.md``).

:func:`profile_sites` validates every reply (naming the site) before returning them.

``"column_roles"`` — every site drops the columns the job leaves out (``[columns] ignore``
and the row identifiers the server found) and turns the columns declared categorical into
category strings (``3.0`` becomes ``"3"``), a table step it replays after a restart
(:func:`apply_column_roles`); it acks with its new width.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ..data.categories import category_key
from ..errors import SiteFault
from ..privacy.policy import OTHER_CATEGORY, coarse_range, merged_categories
from .messages import Message
from .protocol import Federation, FederationError, exchange
from .site import Site, handler, table_step
from .training.site import label_key

__all__ = ["ID_MIN_ROWS", "MAX_LEVELS", "apply_column_roles", "profile_sites", "pooled_levels", "pooled_ranges"]

#: rows a site needs before it calls a column unique per row (fewer: a measurement's values
#: are often all different by chance)
ID_MIN_ROWS = 50
#: the most distinct values of an integer-coded column (``thal`` in {3, 6, 7}): its value set is
#: agreed and imputed values are taken from it
MAX_LEVELS = 20


@handler("job_profile")
def _profile(site: Site, request: Message) -> Message:
    """Column names and kinds, integer flags and coarse ranges of numeric columns, row counts."""
    feats = site.feature_names
    kinds, integer, low, high, observed, unique = [], [], [], [], [], []
    levels: dict[str, list[str]] = {}
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
        unique.append(_unique_per_row(col, numeric and not integer[-1]))
        if integer[-1] and len(np.unique(values)) <= MAX_LEVELS:  # the values in min_rows rows or more
            levels[c] = [v for v in merged_categories(col, site.policy.min_rows) if v != OTHER_CATEGORY]
    labels = sorted({label_key(v) for v in site.table[site.target]}) \
        if site.target and getattr(site, "target_kind", "classes") != "regression" else []  # a number: no labels
    return Message(
        "job_profile",
        {"low": np.asarray(low, np.float64), "high": np.asarray(high, np.float64),
         "integer": np.asarray(integer, bool), "observed": np.asarray(observed, np.int64),
         "unique": np.asarray(unique, bool)},
        {"columns": feats, "kinds": kinds, "classes": labels, "rows": int(len(site.table)),
         "unlabelled": int(getattr(site, "unlabelled_rows", 0)), "train": int(len(site.rows("train"))),
         "test": int(len(site.rows("test"))), "selector": str(site.selector) if not isinstance(site.selector, dict)
         else json.dumps(site.selector, sort_keys=True), "levels": levels},
    )


def _unique_per_row(col: pd.Series, fractional: bool) -> bool:
    """Whether ``col`` looks like a row identifier: text or integers, no cell missing, no value
    twice, over at least :data:`ID_MIN_ROWS` rows (a measurement with fractions never does)."""
    return (not fractional and len(col) >= ID_MIN_ROWS and not bool(col.isna().any())
            and int(col.nunique()) == len(col))


@table_step("column_roles")
def _roles_table(site: Site, params: dict[str, Any]) -> pd.DataFrame:
    """The table without the ``drop`` columns and with the ``categorical`` ones as category strings."""
    table = site.table.drop(columns=[c for c in params["drop"] if c in site.table.columns and c != site.target])
    for c in params["categorical"]:
        if c in table.columns and c != site.target:
            col = table[c]
            table[c] = col.map(category_key).where(col.notna(), np.nan).astype(object)
    return table


@handler("column_roles")
def _column_roles(site: Site, request: Message) -> Message:
    params = {k: request.meta.get(k) for k in ("drop", "categorical")}
    if not all(isinstance(v, list) and all(isinstance(c, str) for c in v) for v in params.values()):
        raise SiteFault("column_roles needs lists of column names drop and categorical")
    site.apply_table_step("column_roles", params)
    return Message("column_roles", meta={"n_columns": int(site.table.shape[1])})


def apply_column_roles(federation: Federation, drop: list[str], categorical: list[str]) -> None:
    """Every site drops ``drop`` and makes ``categorical`` category strings (one exchange); the
    schema is declared again with the next exchange.

    Raises:
        SiteError / QuorumError: a site failed, beyond what the quorum allows.
    """
    from . import validate

    exchange(federation, Message("column_roles", meta={"drop": list(drop), "categorical": list(categorical)}),
             lambda s, r: validate.integer(r.meta.get("n_columns"), "table width"))
    federation.schema = None


def profile_sites(federation: Federation) -> dict[str, dict[str, Any]]:
    """``{site: profile}`` (one ``job_profile`` exchange on the protocol path), each reply validated.

    Raises:
        SiteError / QuorumError: a site failed, or sent names, kinds, arrays or counts that do
            not fit together (naming the site), beyond what the federation's quorum allows
            (within it, the site is dropped and left out of the profiles).
    """
    out: dict[str, dict[str, Any]] = {}

    def check(s: str, r: Message) -> None:
        cols, kinds = r.meta.get("columns"), r.meta.get("kinds")
        if (not isinstance(cols, list) or not all(isinstance(c, str) for c in cols) or len(set(cols)) != len(cols)
                or not isinstance(kinds, list) or len(kinds) != len(cols)
                or not all(k in ("numeric", "categorical") for k in kinds)):
            raise FederationError("invalid column profile")
        arrays = {}
        if "unique" not in r.arrays:  # a site of an earlier fedtab: no identifier flags
            r = Message(r.kind, {**r.arrays, "unique": np.zeros(len(cols), bool)}, r.meta)
        for k in ("low", "high", "integer", "observed", "unique"):
            a = np.asarray(r.arrays.get(k))
            if a.shape != (len(cols),) or (a.dtype.kind == "f" and not np.isfinite(a).all()):
                raise FederationError(f"profile array {k!r} has shape {a.shape} or non-finite values")
            arrays[k] = a
        counts = {k: r.meta.get(k) for k in ("rows", "unlabelled", "train", "test")}
        if not all(isinstance(v, int) and v >= 0 for v in counts.values()) or counts["train"] + counts["test"] != counts["rows"]:
            raise FederationError(f"invalid row counts {counts}")
        levels = r.meta.get("levels", {})
        if not isinstance(levels, dict) or not set(levels) <= set(cols) or not all(
                isinstance(v, list) and len(v) <= MAX_LEVELS and all(_finite_text(x) for x in v) for v in levels.values()):
            raise FederationError(f"invalid value sets (at most {MAX_LEVELS} numbers per column of the site)")
        classes = r.meta.get("classes")
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise FederationError("invalid class labels")
        out[s] = {"columns": cols, "kinds": kinds, "classes": classes, "selector": str(r.meta.get("selector")),
                  "levels": {c: sorted(float(x) for x in v) for c, v in levels.items()},
                  **counts, **arrays}

    replies = exchange(federation, Message("job_profile"), check)
    return {s: out[s] for s in replies}


def _finite_text(x: Any) -> bool:
    try:
        return isinstance(x, str) and np.isfinite(float(x))
    except ValueError:
        return False


def pooled_levels(profiles: Mapping[str, dict[str, Any]]) -> dict[str, list[float]]:
    """``{column: sorted values}`` of the integer-coded columns: every site that observes the
    column sent its value set, and their union has at most :data:`MAX_LEVELS` values."""
    ranges = pooled_ranges(profiles)
    out: dict[str, list[float]] = {}
    for c, r in ranges.items():
        if not r["integer"]:
            continue
        sets = [p["levels"].get(c) for p in profiles.values()
                if c in p["columns"] and p["observed"][p["columns"].index(c)] > 0]
        if sets and all(v is not None for v in sets):
            union = sorted({x for v in sets for x in v})
            if 0 < len(union) <= MAX_LEVELS:
                out[c] = union
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
