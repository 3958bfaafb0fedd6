"""federation/site/observed.py: the vectorised measured-cell masks equal the per-column reading.

The reference below is the per-column loop fedtab used before (one pandas call per column),
kept as the oracle.
"""

import numpy as np
import pandas as pd
import pytest

from fedtab.federation.site.observed import MEASURED_KEY, measured_frame, measured_matrix, record_measured
from fedtab.federation.site.parts import canonical_part
from fedtab.federation.site.core import Site


def _loop_measured_matrix(site, columns, part):
    idx = np.arange(len(site.table)) if canonical_part(part) == "all" else site.parts.indices(part)
    record = site.state.get(MEASURED_KEY)
    out = np.zeros((len(idx), len(columns)), dtype=bool)
    if isinstance(record, dict):
        pos = {c: j for j, c in enumerate(record["columns"])}
        mask = np.asarray(record["mask"], dtype=bool)
        for j, c in enumerate(columns):
            if c in pos:
                out[:, j] = mask[idx, pos[c]]
            elif c in site.feature_set:
                out[:, j] = site.table[c].iloc[idx].notna().to_numpy()
        return out
    for j, c in enumerate(columns):
        if c in site.feature_set:
            out[:, j] = site.table[c].iloc[idx].notna().to_numpy()
    return out


def _site(seed: int, n: int = 40, d: int = 12) -> Site:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X[rng.random((n, d)) < rng.uniform(0.0, 0.6, d)] = np.nan  # columns from complete to mostly missing
    X[:, 3] = np.nan  # one column never measured
    table = pd.DataFrame(X, columns=[f"c{j}" for j in range(d)]).assign(y=rng.integers(0, 2, n))
    table.insert(2, "cat", rng.choice(["a", "b", None], size=n))  # a text column
    return Site(f"s{seed}", table, "y", seed=seed)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("part", ["train", "all", "test"])
def test_measured_matrix_equals_the_per_column_reading(seed, part):
    site = _site(seed)
    rng = np.random.default_rng(seed + 10)
    names = site.feature_names + ["absent", "y"]  # a column the site lacks, and the target (not a feature)
    columns = [names[i] for i in rng.permutation(len(names))]
    np.testing.assert_array_equal(measured_matrix(site, columns, part), _loop_measured_matrix(site, columns, part))
    # after imputation: recorded columns come from the record, the others from the table as it is
    before = site.table.drop(columns=["c1"])
    record_measured(site, before, ["c0", "c1", "c4", "cat", "absent"])
    rec = site.state[MEASURED_KEY]["mask"]
    assert rec.shape == (len(before), 5) and not rec[:, 1].any() and not rec[:, 4].any()
    np.testing.assert_array_equal(rec[:, 0], before["c0"].notna().to_numpy())
    site.table.loc[:, "c0"] = 0.0  # imputed: every cell has a value now, the record still says which were measured
    got = measured_matrix(site, columns, part)
    np.testing.assert_array_equal(got, _loop_measured_matrix(site, columns, part))
    assert got[:, columns.index("c1")].sum() == 0 and got[:, columns.index("absent")].sum() == 0


def test_measured_frame_drops_unmeasured_columns_and_masks_imputed_cells():
    site = _site(0)
    before = site.table.copy()
    record_measured(site, before, site.feature_names)
    for c in site.feature_names:  # imputation fills every numeric cell, measured or not
        if c != "cat":
            site.table[c] = site.table[c].fillna(0.5)
    frame, _ = site.xy("train")
    out = measured_frame(site, frame, "train")
    assert "c3" not in out.columns and "c0" in out.columns
    idx = site.parts.indices("train")
    for c in out.columns:
        np.testing.assert_array_equal(out[c].notna().to_numpy(), before[c].iloc[idx].notna().to_numpy())
