"""Site-side helpers that turn a local table slice into model-ready arrays."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["numeric_matrix", "fill_with_column_means"]


def numeric_matrix(frame: pd.DataFrame, site: str) -> np.ndarray:
    """``(n, d)`` float64 copy of ``frame``; NaN kept.

    Raises:
        ValueError: naming the site and the columns that are not numeric.
    """
    import pandas as pd

    # One check per distinct dtype, not per column (a 10,000-column table has one or two).
    dtypes = frame.dtypes
    bad_types = {t for t in set(dtypes) if not (pd.api.types.is_numeric_dtype(t) or pd.api.types.is_bool_dtype(t))}
    bad = [str(c) for c, t in zip(frame.columns, dtypes) if t in bad_types] if bad_types else []
    if bad:
        raise ValueError(f"site {site!r}: non-numeric columns {bad[:5]}{' …' if len(bad) > 5 else ''}; encode them first")
    return frame.to_numpy(dtype=np.float64, na_value=np.nan)


def fill_with_column_means(X: np.ndarray) -> np.ndarray:
    """Replace NaN by the column's mean over its observed rows (0 for an all-NaN column)."""
    if not np.isnan(X).any():
        return X
    X = X.copy()
    with np.errstate(invalid="ignore"):
        means = np.nanmean(np.where(np.isnan(X).all(axis=0), 0.0, X), axis=0) if X.size else np.zeros(X.shape[1])
    rows, cols = np.nonzero(np.isnan(X))
    X[rows, cols] = np.nan_to_num(means)[cols]
    return X
