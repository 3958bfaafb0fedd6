"""Federated one-hot encoding: agree a category list per column without sharing rows.

1. ``"category_sets"`` — each site replies, per requested column, the sorted set of
   categories it observes (strings only; no counts, no rows).
2. The server validates the replies (a list of strings per requested column) and takes
   the sorted union (:func:`fedtab.data.categories.union_categories`).
3. ``"one_hot"`` — each site replaces its table by the encoding with the agreed list
   (identical columns, in identical order, at every site) and acks with its new width.
"""

from __future__ import annotations

from typing import Any

from ..data.categories import category_sets, one_hot, union_categories
from .messages import Message
from .protocol import Federation, FederationError, collect
from .site import Site, handler

__all__ = ["agree_categories", "encode_categories", "federated_one_hot"]


@handler("category_sets")
def _category_sets(site: Site, request: Message) -> Message:
    columns = request.meta.get("columns")
    if not isinstance(columns, list):
        raise ValueError("category_sets needs a list of column names")
    held = [c for c in columns if c in site.table.columns]
    return Message("category_sets", meta={"categories": category_sets(site.table, held)})


@handler("one_hot")
def _one_hot(site: Site, request: Message) -> Message:
    cats = request.meta.get("categories")
    if not isinstance(cats, dict):
        raise ValueError("one_hot needs {column: [categories]}")
    held = {c: v for c, v in cats.items() if c in site.table.columns and c != site.target}
    site.table = one_hot(site.table, held)
    return Message("one_hot", meta={"n_columns": int(site.table.shape[1])})


def agree_categories(federation: Federation, columns: list[str]) -> dict[str, list[str]]:
    """Ask every site for its category sets of ``columns``; return the validated sorted union.

    Raises:
        FederationError: a site failed or replied something that is not ``{column: [str]}``
            over the requested columns (naming the site).
    """
    replies = collect(federation.broadcast(Message("category_sets", meta={"columns": list(columns)})),
                      "category_sets")
    sets = []
    for name, reply in replies.items():
        cats: Any = reply.meta.get("categories")
        ok = isinstance(cats, dict) and set(cats) <= set(columns) and all(
            isinstance(v, list) and all(isinstance(x, str) for x in v) for v in cats.values())
        if not ok:
            raise FederationError(f"site {name!r}: invalid category sets")
        sets.append(cats)
    return union_categories(sets)


def encode_categories(federation: Federation, categories: dict[str, list[str]]) -> None:
    """Tell every site to one-hot encode with ``categories``.

    Raises:
        FederationError: a site failed (e.g. a category it did not report), or the sites
            ended up with different widths.
    """
    replies = collect(federation.broadcast(Message("one_hot", meta={"categories": categories})), "one_hot")
    widths = {r.meta.get("n_columns") for r in replies.values()}
    if len(widths) != 1:
        raise FederationError(f"sites disagree on the encoded width: {sorted(map(str, widths))}")


def federated_one_hot(federation: Federation, columns: list[str]) -> dict[str, list[str]]:
    """:func:`agree_categories` then :func:`encode_categories`; returns the agreed lists."""
    cats = agree_categories(federation, columns)
    if cats:
        encode_categories(federation, cats)
    return cats
