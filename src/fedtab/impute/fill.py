"""From the imputer's z-space predictions to the values a table receives (pure numpy).

Observed cells are kept exactly; every other cell (missing, or a column the site does
not have) takes the prediction in original units, clipped to the column's pooled
observed range, and rounded when the column holds only integers (binary columns stay
0/1). An integer-coded column with an agreed value set (``levels``, e.g. ``thal`` in
{3, 6, 7}) takes the value of the set nearest to the prediction, never one between; the
indicators of one categorical column (``groups``) all imputed in a row take the category
with the largest prediction (one 1, the others 0). The same function serves the sites during a job and ``predict`` afterwards, so
both fill a row identically.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

__all__ = ["fill_from_predictions", "nearest_level"]


def fill_from_predictions(given: np.ndarray, pred_z: np.ndarray, mean: np.ndarray, std: np.ndarray,
                          low: np.ndarray, high: np.ndarray, integer: np.ndarray,
                          levels: Mapping[int, Sequence[float]] | None = None,
                          groups: Sequence[Sequence[int]] | None = None) -> tuple[np.ndarray, int, int]:
    """``(values, imputed, clipped)``.

    Args:
        given: ``(n, F)`` the table over the imputer's columns in original units, NaN where no
            value was given (missing cell or unavailable column).
        pred_z: ``(n, F)`` the imputer's z-space predictions.
        mean, std: ``(F,)`` the z-scoring. low, high: ``(F,)`` pooled observed range.
        integer: ``(F,)`` bool, columns whose observed values are all integers.
        levels: ``{column index: the agreed values}`` of integer-coded columns.
        groups: the column indices of each categorical column's indicators.

    Returns:
        values ``(n, F)`` in original units without NaN, the number of imputed cells and
        how many of them were moved into the observed range.

    Raises:
        ValueError: shapes that do not agree, ``low > high``, an empty value set or an index
            out of range.
    """
    given, pred_z = np.asarray(given, np.float64), np.asarray(pred_z, np.float64)
    f = given.shape[1] if given.ndim == 2 else -1
    if pred_z.shape != given.shape or any(np.shape(a) != (f,) for a in (mean, std, low, high, integer)):
        raise ValueError(f"fill_from_predictions: shapes disagree (given {given.shape}, pred {pred_z.shape})")
    if np.any(np.asarray(low) > np.asarray(high)):
        raise ValueError("fill_from_predictions: a column's low bound is above its high bound")
    fill = np.isnan(given)
    raw = pred_z * std + mean
    bounded = np.clip(raw, low, high)
    integer = np.asarray(integer, dtype=bool)
    bounded[:, integer] = np.clip(np.round(bounded[:, integer]), np.ceil(low[integer]), np.floor(high[integer]))
    for j, values in (levels or {}).items():
        bounded[:, j] = nearest_level(raw[:, j], values)
    for group in groups or ():
        _one_category(bounded, raw, fill, list(group))
    clipped = int((fill & ((raw < low) | (raw > high))).sum())
    return np.where(fill, bounded, given), int(fill.sum()), clipped


def nearest_level(x: np.ndarray, levels: Sequence[float]) -> np.ndarray:
    """Each value of ``x`` replaced by the nearest of ``levels`` (ties: the smaller level).

    Raises:
        ValueError: no level.
    """
    lv = np.unique(np.asarray(levels, np.float64))
    if lv.size == 0:
        raise ValueError("nearest_level: an empty value set")
    x = np.asarray(x, np.float64)
    if lv.size == 1:
        return np.full(x.shape, lv[0])
    right = np.clip(np.searchsorted(lv, x), 1, lv.size - 1)
    left = right - 1
    pick = np.where(np.abs(x - lv[left]) <= np.abs(lv[right] - x), left, right)
    return lv[pick]


def _one_category(values: np.ndarray, raw: np.ndarray, fill: np.ndarray, group: list[int]) -> None:
    """Rows whose indicators in ``group`` are all imputed get one 1, at the largest prediction."""
    rows = np.flatnonzero(fill[:, group].all(axis=1))
    if not rows.size:
        return
    block = np.zeros((rows.size, len(group)))
    block[np.arange(rows.size), np.argmax(raw[np.ix_(rows, group)], axis=1)] = 1.0
    values[np.ix_(rows, group)] = block
