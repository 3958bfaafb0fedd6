"""Shared fixtures, and the ``requires`` marker."""

import numpy as np
import pytest

from fedtab.data import classification_table, split_rows


def write_classification_sites(root, n: int, d: int, informative: int, redundant: int, *, table_seed: int,
                               split_seed: int, selector: str = "lasso") -> list[dict]:
    """Three sites' CSVs (a 50/30/20 stratified split of one classification table) under
    ``root`` and their engine site configs."""
    table = classification_table(n, d, informative, redundant, seed=table_seed)
    parts = split_rows(table, [0.5, 0.3, 0.2], stratify="target", seed=split_seed)
    configs = []
    for i, part in enumerate(parts):
        path = root / f"site{i + 1}.csv"
        part.to_csv(path, index=False)
        configs.append({"name": f"site-{i + 1}", "data-path": str(path), "target": "target", "selector": selector})
    return configs


@pytest.fixture(scope="session")
def classification_sites():
    """:func:`write_classification_sites`, for module-scoped fixtures."""
    return write_classification_sites


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


def pytest_configure(config):
    config.addinivalue_line("markers", "requires(*modules): skip unless each module imports (checked at setup)")


def pytest_runtest_setup(item):
    """``@pytest.mark.requires("torch", ...)``: ``pytest.importorskip`` each module when the test runs,
    not when its file is collected (collection stays fast; a missing or broken install still skips)."""
    for mark in item.iter_markers("requires"):
        for name in mark.args:
            pytest.importorskip(name)
