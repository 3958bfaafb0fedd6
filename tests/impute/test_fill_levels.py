"""fill_from_predictions: integer codes take a value of their agreed set, a categorical column one category."""

from __future__ import annotations

import numpy as np
import pytest

from fedtab.impute.fill import fill_from_predictions, nearest_level


def test_nearest_level_never_between_codes():
    x = np.array([-5.0, 3.4, 4.5, 4.6, 6.49, 6.51, 100.0])
    assert nearest_level(x, [7, 3, 6]).tolist() == [3.0, 3.0, 3.0, 6.0, 6.0, 7.0, 7.0]
    assert nearest_level(x, [2]).tolist() == [2.0] * 7
    with pytest.raises(ValueError, match="empty value set"):
        nearest_level(x, [])


def test_levels_and_groups_fill_only_imputed_cells():
    nan = np.nan
    given = np.array([[3.0, 1.0, 0.0, 0.0], [nan, nan, nan, nan], [6.0, 0.0, nan, 1.0]])
    pred_z = np.array([[0.0, 0, 0, 0], [4.6, 0.2, 0.7, 0.4], [0.0, 0.9, 0.8, 0.0]])
    f = given.shape[1]
    unb = np.full(f, np.inf)
    values, imputed, _ = fill_from_predictions(given, pred_z, np.zeros(f), np.ones(f), -unb, unb, np.zeros(f, bool),
                                               levels={0: [3, 6, 7]}, groups=[[1, 2, 3]])
    assert values[0].tolist() == [3.0, 1.0, 0.0, 0.0]  # observed: kept
    assert values[1].tolist() == [6.0, 0.0, 1.0, 0.0]  # one category, at the largest prediction
    assert values[2].tolist() == [6.0, 0.0, 0.8, 1.0]  # a partly given group keeps its prediction
    assert imputed == 5
    plain, _, _ = fill_from_predictions(given, pred_z, np.zeros(f), np.ones(f), -unb, unb, np.zeros(f, bool))
    assert plain[1, 0] == pytest.approx(4.6)  # without levels: the prediction as it is
