"""Federated one-hot encoding: agree a category list per column without sharing rows.

1. ``"category_sets"`` — each site replies, per requested column, the sorted set of
   categories it observes in at least ``policy.min_rows`` rows, rarer ones merged into
   ``"(other)"`` (strings only; no counts, no rows). A site refuses the request for a
   column it stores as numbers.
2. The server validates the replies (a list of strings per requested column) and takes
   the sorted union (:func:`fedtab.data.categories.union_categories`).
3. ``"one_hot"`` — each site replaces its table by the encoding with the agreed list
   (identical columns, in identical order, at every site) and acks with its new width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from fedtab.data.categories import category_key, one_hot, onehot_name, union_categories
from fedtab.privacy.policy import OTHER_CATEGORY, merged_categories
from fedtab.errors import SiteFault
from fedtab.federation.protocol import validate
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import Federation, FederationError, exchange
from fedtab.federation.protocol.schema import set_schema
from fedtab.federation.site.core import Site
from fedtab.federation.site.registry import handler, table_step

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["agree_categories", "encode_categories", "federated_one_hot", "model_file_codes"]


@handler("category_sets")
def _category_sets(site: Site, request: Message) -> Message:
    columns = request.meta.get("columns")
    if not isinstance(columns, list):
        raise ValueError("category_sets needs a list of column names")
    held = [c for c in columns if c in site.table.columns]
    # the policy already refused numeric columns; categories rarer than min_rows are merged
    return Message("category_sets", meta={"categories": {c: merged_categories(site.table[c], site.policy.min_rows)
                                                         for c in held}})


@table_step("one_hot")
def _one_hot_table(site: Site, params: dict[str, Any]) -> Any:
    """The site's table one-hot encoded with the agreed lists.

    The rows the site trains and is described on keep the site's floor: a category this site
    holds in fewer than ``min_rows`` rows is encoded as :data:`OTHER_CATEGORY` even when
    another site made it a column of its own (its own indicator would single out those rows),
    and when the site's ``(other)`` bucket itself holds fewer than ``min_rows`` rows, those
    cells are encoded as missing (all-zero indicators, or cells for the imputer), so no
    indicator column of these rows has fewer than ``min_rows`` ones.

    The rows of the site's **test part** are encoded exactly as the model file encodes a row
    at ``predict`` (:func:`model_file_codes`): a category in the agreed list is its own
    indicator however rare here, any other one is ``(other)`` when the list has that level and
    no level (all zeros) otherwise; so the site scores its test rows as ``fedtab predict`` scores
    the same rows, and its evaluation (an aggregate over the whole test part) is the model's.
    """
    held = {c: v for c, v in params["categories"].items() if c in site.table.columns and c != site.target}
    table = site.table.copy()
    test = np.zeros(len(table), dtype=bool)
    parts = getattr(site, "parts", None)
    if parts is not None and parts.n_rows == len(table):
        test[parts.test] = True
    no_level: dict[str, np.ndarray] = {}
    for c, cats in held.items():
        frequent = set(merged_categories(site.table[c], site.policy.min_rows)) - {OTHER_CATEGORY}
        values = site.table[c]
        observed = values.notna()
        strings = values[observed].astype(str)
        keep = strings.isin(frequent & set(cats))
        if OTHER_CATEGORY in cats:
            strings = strings.where(keep, OTHER_CATEGORY)
        elif not (keep | test[observed.to_numpy()]).all():  # test rows: no level (below)
            raise SiteFault(f"column {c!r} has {int((~keep).sum())} value(s) outside the agreed list or too rare "
                            f"here, and the list has no {OTHER_CATEGORY!r} level")
        if OTHER_CATEGORY in cats and 0 < int((strings == OTHER_CATEGORY).sum()) < site.policy.min_rows:
            strings = strings.where(strings != OTHER_CATEGORY, None)
        column = values.astype(object)
        column[observed] = strings
        scored = observed.to_numpy() & test  # the test rows: as the model file encodes them
        codes = model_file_codes(values[scored], cats)
        column[scored] = codes.where(codes.notna(), None)
        no_level[c] = scored & column.isna().to_numpy()  # observed, but no level of the list: all zeros
        table[c] = column.where(column.notna(), np.nan)
    out = one_hot(table, held, other=OTHER_CATEGORY, missing=np.nan if params.get("missing") == "nan" else 0.0)
    for c, rows in no_level.items():
        if rows.any():
            names = [onehot_name(c, v) for v in held[c]]
            out.loc[out.index[rows], names] = 0.0
    return out


def model_file_codes(values: "pd.Series", categories: list[str]) -> "pd.Series":
    """The agreed category of each observed cell as the model file encodes it at ``predict``
    (:meth:`fedtab.job.model_file.FedtabModel.predict_proba`): its :func:`category_key` when the
    list holds it, else :data:`OTHER_CATEGORY` when the list has that level, else missing (no
    level: all-zero indicators)."""
    keys = values.map(category_key)
    known = keys.isin(categories)
    if OTHER_CATEGORY in categories:
        return keys.where(known, OTHER_CATEGORY)
    return keys.where(known, None)


@handler("one_hot")
def _one_hot(site: Site, request: Message) -> Message:
    cats = request.meta.get("categories")
    if not isinstance(cats, dict) or not all(isinstance(v, list) and all(isinstance(x, str) for x in v)
                                             for v in cats.values()):
        raise SiteFault("one_hot needs {column: [categories]}")
    site.apply_table_step("one_hot", {"categories": cats, "missing": "nan" if request.meta.get("missing") == "nan"
                                      else "zeros"})
    return Message("one_hot", meta={"n_columns": int(site.table.shape[1])})


def agree_categories(federation: Federation, columns: list[str]) -> dict[str, list[str]]:
    """Ask every site for its category sets of ``columns``; return the validated sorted union.

    Raises:
        FederationError: a site failed or replied something that is not ``{column: [str]}``
            over the requested columns (naming the site).
    """
    sets: dict[str, dict[str, list[str]]] = {}

    def check(site: str, reply: Message) -> None:
        schema = federation.schema
        assert schema is not None
        cats: Any = reply.meta.get("categories")
        if not isinstance(cats, dict):
            raise ValueError("invalid category sets (not an object)")
        schema.check_features(site, list(cats), what="categorical columns")
        extra = sorted(set(cats) - set(columns))
        if extra:
            raise ValueError(f"category sets for columns {extra[:5]} that were not asked for")
        n = schema.rows(site, "all")
        for col, values in cats.items():
            if not (isinstance(values, list) and all(isinstance(x, str) and len(x) <= schema.limits.max_name
                                                     for x in values)):
                raise ValueError(f"invalid category set for column {col!r}")
            if len(values) > n or len(set(values)) != len(values):
                raise ValueError(f"column {col!r}: {len(values)} categories for {n} declared rows (or duplicates)")
        sets[site] = cats

    replies = exchange(federation, Message("category_sets", meta={"columns": list(columns)}), check)
    return union_categories(sets[name] for name in replies)


def encode_categories(federation: Federation, categories: dict[str, list[str]], *, same_width: bool = True,
                      missing: str = "zeros") -> None:
    """Tell every site to one-hot encode with ``categories``.

    Args:
        same_width: check that every site ends with as many columns (off for sites that
            hold different columns).
        missing: what a missing cell's indicators hold: ``"zeros"``, or ``"nan"`` (missing
            cells the imputation fills with one category).

    Raises:
        FederationError: a site failed (e.g. a category it did not report), or (with
            ``same_width``) the sites ended up with different widths.
    """
    replies = exchange(federation, Message("one_hot", meta={"categories": categories, "missing": missing}),
                       lambda site, r: validate.integer(r.meta.get("n_columns"), "encoded width"))
    widths = {r.meta.get("n_columns") for r in replies.values()}
    if same_width and len(widths) != 1:
        raise FederationError(f"sites disagree on the encoded width: {sorted(map(str, widths))}")
    if federation.schema is not None:
        set_schema(federation, federation.schema.encoded(categories))


def federated_one_hot(federation: Federation, columns: list[str]) -> dict[str, list[str]]:
    """:func:`agree_categories` then :func:`encode_categories`; returns the agreed lists."""
    cats = agree_categories(federation, columns)
    if cats:
        encode_categories(federation, cats)
    return cats
