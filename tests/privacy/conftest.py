"""Fixtures shared by the privacy tests."""

import numpy as np
import pandas as pd
import pytest


@pytest.fixture
def table() -> pd.DataFrame:
    """160 rows of a small site: income, age, bmi and a binary target driven by bmi (seed 0)."""
    rng = np.random.default_rng(0)
    n = 160
    t = pd.DataFrame({"income": rng.integers(20_000, 90_000, n).astype(float), "age": rng.integers(20, 80, n),
                      "bmi": rng.normal(27, 4, n)})
    t["target"] = (t["bmi"] + rng.normal(0, 2, n) > 27).astype(int)
    return t
