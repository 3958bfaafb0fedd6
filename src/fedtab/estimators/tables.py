"""The estimators' one table-input contract: what ``fit`` accepts as "one table per site".

* one table — a DataFrame, a 2-D array or anything with ``__array__`` — is one site, ``site0``;
* a list or tuple of tables: sites ``site0``, ``site1``... in that order;
* a dict ``{name: table}``: the named sites.

A 2-D array becomes a DataFrame with columns ``x0``, ``x1``...; a site's columns are matched
by name across sites. Complex values, sparse matrices and arrays that are not 2-D are refused,
naming the site.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

__all__ = ["as_table", "is_single", "site_tables"]


def is_single(tables: Any) -> bool:
    """One table (one site) rather than a list/dict of them."""
    return isinstance(tables, pd.DataFrame) or (hasattr(tables, "__array__") and not isinstance(tables, list)) \
        or hasattr(tables, "tocsr")


def site_tables(tables: Any) -> dict[str, pd.DataFrame]:
    """``{site: DataFrame}`` of ``tables`` (see the module docstring), in the given order.

    Raises:
        ValueError: no table, a type that is none of the above, a table that is not 2-D
            or holds complex values (naming the site).
        TypeError: sparse input (naming the site).
    """
    if is_single(tables):
        out = {"site0": as_table(tables, "site0")}
    elif isinstance(tables, Mapping):
        out = {str(k): as_table(v, str(k)) for k, v in tables.items()}
    elif isinstance(tables, Sequence) and not isinstance(tables, (str, bytes)):
        out = {f"site{i}": as_table(t, f"site{i}") for i, t in enumerate(tables)}
    else:
        raise ValueError(f"tables must be a DataFrame, a 2-D array, a list of them or a dict name -> table, "
                         f"got {type(tables).__name__}")
    if not out:
        raise ValueError("fit needs at least one site table")
    return out


def as_table(table: Any, name: str) -> pd.DataFrame:
    """A site's table as a DataFrame (a 2-D array gets columns ``x0 …``).

    Raises:
        TypeError: sparse input. ValueError: not 2-D, or complex values (naming the site).
    """
    if hasattr(table, "tocsr"):
        raise TypeError(f"site {name!r}: sparse input is not supported; pass a dense table")
    if not isinstance(table, pd.DataFrame):
        arr = np.asarray(table)
        if arr.ndim != 2:
            raise ValueError(f"site {name!r}: expected a 2D table (rows × columns), got shape {arr.shape}")
        if arr.shape[1] == 0:
            raise ValueError(f"site {name!r}: found array with 0 feature(s) (shape={arr.shape}) while a minimum "
                             "of 1 is required.")
        if arr.dtype == object:
            arr = arr.astype(np.float64)  # TypeError/ValueError for values that are not numbers
        table = pd.DataFrame(arr, columns=[f"x{j}" for j in range(arr.shape[1])])
    if any(pd.api.types.is_complex_dtype(t) for t in table.dtypes):
        raise ValueError(f"site {name!r}: Complex data not supported")
    return table
