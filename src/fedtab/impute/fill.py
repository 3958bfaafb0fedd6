"""From the imputer's z-space predictions to the values a table receives (pure numpy).

Observed cells are kept exactly; every other cell (missing, or a column the site does
not have) takes the prediction in original units, clipped to the column's pooled
observed range, and rounded when the column holds only integers (binary columns stay
0/1). The same function serves the sites during a job and ``predict`` afterwards, so
both fill a row identically.
"""

from __future__ import annotations

import numpy as np

__all__ = ["fill_from_predictions"]


def fill_from_predictions(given: np.ndarray, pred_z: np.ndarray, mean: np.ndarray, std: np.ndarray,
                          low: np.ndarray, high: np.ndarray, integer: np.ndarray) -> tuple[np.ndarray, int, int]:
    """``(values, imputed, clipped)``.

    Args:
        given: ``(n, F)`` the table over the imputer's columns in original units, NaN where no
            value was given (missing cell or unavailable column).
        pred_z: ``(n, F)`` the imputer's z-space predictions.
        mean, std: ``(F,)`` the z-scoring. low, high: ``(F,)`` pooled observed range.
        integer: ``(F,)`` bool, columns whose observed values are all integers.

    Returns:
        values ``(n, F)`` in original units without NaN, the number of imputed cells and
        how many of them were moved into the observed range.

    Raises:
        ValueError: shapes that do not agree, or ``low > high``.
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
    clipped = int((fill & ((raw < low) | (raw > high))).sum())
    return np.where(fill, bounded, given), int(fill.sum()), clipped
