"""``fedtab.data.synthetic``: the synthetic classification table and its recipe."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import make_classification

from fedtab.data.synthetic import ClassificationSpec, classification_table


def test_the_table_is_make_classification_with_named_columns():
    table = classification_table(200, 12, 4, 2, 1, n_classes=3, class_sep=2.0, flip_y=0.0, seed=5, target="y")
    X, y = make_classification(n_samples=200, n_features=12, n_informative=4, n_redundant=2, n_repeated=1,
                               n_classes=3, class_sep=2.0, flip_y=0.0, shuffle=False, random_state=5)
    assert list(table.columns) == [f"f{i:02d}" for i in range(12)] + ["y"]
    np.testing.assert_array_equal(table.drop(columns="y").to_numpy(), X)
    np.testing.assert_array_equal(table["y"].to_numpy(), y)


def test_positional_keyword_and_spec_calls_give_the_same_table():
    by_position = classification_table(150, 6, 3, 1, 0, seed=2)
    by_keyword = classification_table(n_samples=150, n_features=6, n_informative=3, n_redundant=1, seed=2)
    pd.testing.assert_frame_equal(by_position, by_keyword)
    pd.testing.assert_frame_equal(by_position, ClassificationSpec(150, 6, 3, 1, seed=2).table())
    assert not by_position.equals(classification_table(150, 6, 3, 1, 0, seed=3))


def test_options_after_the_repeated_columns_are_keyword_only_and_unknown_ones_are_refused():
    with pytest.raises(TypeError):
        classification_table(150, 6, 3, 1, 0, 2)  # n_classes by position
    with pytest.raises(TypeError, match="n_sample"):
        classification_table(n_sample=10)
    with pytest.raises(ValueError):
        classification_table(50, 3, 4, 0, 0)  # more informative columns than features
