"""A column renamed at one site (``Age`` / ``age``, ``max_heart_rate`` / ``max_hr``) is a warning with
a did-you-mean when the schema is agreed (issue 30 item 6); distinct columns are not."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation.protocol.schema import ColumnNameWarning, similar_columns
from fedtab.federation.protocol.agreement import agree_schema
from fedtab.federation.site.core import Site


@pytest.mark.parametrize("a, b", [("Age", "age"), ("max_heart_rate", "max_hr"), ("old_peak", "oldpeak"),
                                  ("chol", "cholesterol"), ("slope", "slopes"), ("maxHeartRate", "max_hr")])
def test_close_names_held_apart_are_paired(a, b):
    assert similar_columns({a: ["s1"], b: ["s2", "s3"]}) == [(a, b)]  # the rarer one first


@pytest.mark.parametrize("a, b", [("x1", "x2"), ("sex", "fbs"), ("trestbps", "restecg"), ("feature_3", "feature_12")])
def test_distinct_names_are_not_paired(a, b):
    assert similar_columns({a: ["s1"], b: ["s2"]}) == []


def test_columns_one_site_holds_together_are_not_paired():
    assert similar_columns({"thal": ["s1"], "thalach": ["s1", "s2"]}) == []


def _site(name, columns, seed):
    rng = np.random.default_rng(seed)
    t = pd.DataFrame({c: rng.normal(size=40) for c in columns})
    t["target"] = rng.integers(0, 2, 40)
    return Site(name, t, "target", seed=seed)


def test_schema_agreement_warns_with_a_did_you_mean():
    fed = LocalFederation([_site("a", ["age", "chol", "bp"], 0), _site("b", ["Age", "chol", "bp"], 1),
                           _site("c", ["age", "chol"], 2)])
    with pytest.warns(ColumnNameWarning) as caught:
        schema = agree_schema(fed)
    assert {"age", "Age"} <= set(schema.columns)  # the warning changes nothing: two columns, as given
    texts = [str(w.message) for w in caught if issubclass(w.category, ColumnNameWarning)]
    assert len(texts) == 1
    assert "column 'Age' (at b) and column 'age' (at a, c)" in texts[0] and "(did you mean 'age'?)" in texts[0]
    fed = LocalFederation([_site("a", ["age", "x1"], 0), _site("b", ["age", "x2"], 1)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ColumnNameWarning)
        agree_schema(fed)  # x1 / x2: a series, not a rename
