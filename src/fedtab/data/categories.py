"""One-hot encoding with a category list agreed across sites — pure functions.

Rows never move: each site reports, per categorical column, the *set* of category
strings it observes (:func:`category_sets`); the server takes the sorted union
(:func:`union_categories`) and every site encodes with that same list
(:func:`one_hot`), so all sites get identical columns in the same order, including
indicators for categories only other sites have. What a site reveals is which
categories occur in its rows — not how often, nor in which rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping

import numpy as np

if TYPE_CHECKING:  # pandas is imported where a frame is encoded: the server names columns without it
    import pandas as pd

__all__ = ["category_key", "category_sets", "union_categories", "one_hot", "onehot_name"]


def category_key(value: object) -> str:
    """The category string of a cell: a whole number as an integer (``7.0`` and ``7`` are ``"7"``,
    as a column declared categorical is encoded at the sites), anything else as its text."""
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    if isinstance(value, (np.integer, np.bool_)):
        return str(value.item())
    return str(value)


def onehot_name(column: str, category: str) -> str:
    """Name of the indicator column of ``category`` in ``column`` (``"column=category"``)."""
    return f"{column}={category}"


def category_sets(frame: pd.DataFrame, columns: Iterable[str]) -> dict[str, list[str]]:
    """``{column: sorted distinct non-missing values as strings}`` over ``frame``.

    Raises:
        ValueError: a column is not in ``frame``.
    """
    out = {}
    for c in columns:
        if c not in frame.columns:
            raise ValueError(f"categorical column {c!r} is not in the table")
        out[c] = sorted({str(v) for v in frame[c].dropna().unique()})
    return out


def union_categories(per_site: Iterable[Mapping[str, list[str]]]) -> dict[str, list[str]]:
    """Sorted union per column of several sites' :func:`category_sets` (columns in first-seen order)."""
    merged: dict[str, set[str]] = {}
    for sets in per_site:
        for c, cats in sets.items():
            merged.setdefault(str(c), set()).update(str(x) for x in cats)
    return {c: sorted(v) for c, v in merged.items()}


def one_hot(frame: pd.DataFrame, categories: Mapping[str, list[str]], other: str | None = None,
            missing: float = 0.0) -> pd.DataFrame:
    """Replace each column in ``categories`` by 0/1 float indicators ``column=category``.

    The indicators are inserted where the column was, in the order of the agreed
    list. A missing cell gets ``missing`` in every indicator (0: all zeros; NaN: a cell
    for the imputer to fill with one category); a value not in the list raises, unless
    ``other`` is given and in that column's list: then it is encoded as ``other``
    (the merged bucket of categories too rare for a site to report).

    Raises:
        ValueError: a value outside the agreed list (the site did not report it).
    """
    import pandas as pd

    parts = []
    for c in frame.columns:
        if c not in categories:
            parts.append(frame[[c]])
            continue
        cats = list(categories[c])
        values = frame[c]
        observed = values.notna()
        strings = values[observed].astype(str)
        if other is not None and other in cats:
            strings = strings.where(strings.isin(cats), other)
        unknown = sorted(set(strings) - set(cats))
        if unknown:
            raise ValueError(f"column {c!r} has categories {unknown[:5]} outside the agreed list")
        index = {v: i for i, v in enumerate(cats)}
        block = np.zeros((len(frame), len(cats)))
        block[~observed.to_numpy()] = missing
        rows = np.flatnonzero(observed.to_numpy())
        block[rows, [index[v] for v in strings]] = 1.0
        parts.append(pd.DataFrame(block, index=frame.index, columns=[onehot_name(c, v) for v in cats]))
    return pd.concat(parts, axis=1)
