"""Shared fixtures."""

import numpy as np
import pytest

from fedtab.data import classification_table, split_rows


@pytest.fixture
def imputation_site_configs(tmp_path):
    """Two sites' CSVs (8 numeric columns, 10 % missing cells) and their engine site configs."""
    table = classification_table(400, 8, 4, 2, seed=6).drop(columns=["target"])
    table = table.mask(np.random.default_rng(0).random(table.shape) < 0.1)
    configs = []
    for i, part in enumerate(split_rows(table, [0.5, 0.5], seed=0)):
        part.to_csv(tmp_path / f"imp{i}.csv", index=False)
        configs.append({"name": f"site-{i + 1}", "data-path": str(tmp_path / f"imp{i}.csv"), "target": ""})
    return configs
