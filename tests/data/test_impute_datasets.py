"""Dataset loaders check their files; the split gives every column to some site."""

import gzip

import numpy as np
import pytest

from fedtab.data.impute_datasets import (DatasetError, default_root, heterogeneous_split, load_airquality,
                                         load_physionet2012, load_secom)

HAVE_DATA = (default_root() / "impute" / "AirQualityUCI.csv.gz").is_file()


@pytest.mark.skipif(not HAVE_DATA, reason="shared datasets not present")
def test_airquality_and_secom_shapes():
    aq = load_airquality()
    assert aq.shape == (9357, 13)
    assert (aq != -200).all().all() and aq.isna().any().any()
    secom = load_secom()
    assert secom.shape[0] == 1567 and 400 < secom.shape[1] < 590
    assert (secom.nunique() >= 2).all()
    phys = load_physionet2012()
    assert phys.shape == (4000, 40) and "RecordID" not in phys and "MechVent" not in phys
    assert (phys != -1).all().all() and phys["Age"].notna().all()


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="missing"):
        load_airquality(tmp_path)


@pytest.mark.skipif(not HAVE_DATA, reason="shared datasets not present")
def test_altered_file_is_detected(tmp_path):
    (tmp_path / "impute").mkdir()
    src = default_root() / "impute" / "AirQualityUCI.csv.gz"
    with gzip.open(src, "rt") as f:
        lines = f.readlines()
    with gzip.open(tmp_path / "impute" / "AirQualityUCI.csv.gz", "wt") as f:
        f.writelines(lines[:1000])  # truncated
    with pytest.raises(DatasetError, match="altered"):
        load_airquality(tmp_path)


def test_heterogeneous_split_covers_every_column():
    cols = [f"c{i}" for i in range(13)]
    for seed in range(20):
        sp = heterogeneous_split(cols, 103, n_sites=4, keep_fraction=0.6, seed=seed)
        assert all(len(c) == round(0.6 * 13) for c in sp.columns)
        assert set().union(*map(set, sp.columns)) == set(cols)
        rows = np.concatenate(sp.rows)
        assert sorted(rows) == list(range(103)) and max(map(len, sp.rows)) - min(map(len, sp.rows)) <= 1
    with pytest.raises(ValueError):
        heterogeneous_split(cols, 100, n_sites=2, keep_fraction=0.3)
