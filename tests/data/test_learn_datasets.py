"""Election dataset loaders and the federated one-hot encoding with an agreed category list."""

import gzip

import numpy as np
import pandas as pd
import pytest

from fedtab import LocalFederation, Site
from fedtab.data.categories import one_hot, union_categories
from fedtab.data.election_datasets import DatasetError, load_dataset, load_mat, load_mushroom
from fedtab.federation import FederationError, agree_schema, federated_one_hot
from fedtab.privacy import DisclosurePolicy


@pytest.mark.parametrize("name,shape,cats", [("mushroom", (8124, 23), 22), ("heart", (303, 14), 0),
                                              ("breast_cancer", (569, 31), 0), ("ALLAML", (72, 7130), 0)])
def test_loaders_check_shapes(name, shape, cats):
    ds = load_dataset(name)
    assert ds.table.shape == shape and len(ds.categorical) == cats
    assert set(ds.table[ds.target].unique()) == {0, 1}


def test_adult_strips_the_test_label_dot():
    ds = load_dataset("adult")
    assert ds.table.shape == (48842, 15)
    assert ds.table["income"].sum() == 11687  # >50K in data + test (with the trailing '.')


def test_altered_or_missing_files_raise_clearly(tmp_path):
    with pytest.raises(DatasetError, match="missing"):
        load_mushroom(tmp_path)
    with gzip.open(tmp_path / "mushroom.csv.gz", "wt") as f:
        f.write("a,b\n1,2\n")
    with pytest.raises(DatasetError, match="expected shape"):
        load_mushroom(tmp_path)
    with pytest.raises(DatasetError, match="unknown"):
        load_mat("nope")


def test_federated_one_hot_agrees_columns_without_rows():
    a = pd.DataFrame({"color": ["red", "blue", None], "x": [1.0, 2.0, 3.0], "y": [0, 1, 0]})
    b = pd.DataFrame({"color": ["green", "red", "red"], "x": [4.0, 5.0, 6.0], "y": [1, 0, 1]})
    tiny = DisclosurePolicy(min_rows=1)  # 3-row sites answer only under an explicit policy
    fed = LocalFederation([Site("a", a, "y", test_size=0, policy=tiny), Site("b", b, "y", test_size=0, policy=tiny)])
    agree_schema(fed)  # its own exchange here, so the category replies below carry category names only
    cats = federated_one_hot(fed, ["color"])
    assert cats == {"color": ["blue", "green", "red"]}
    ta, tb = fed.site("a").table, fed.site("b").table
    assert list(ta.columns) == list(tb.columns) == ["color=blue", "color=green", "color=red", "x", "y"]
    np.testing.assert_array_equal(ta.iloc[2, :3].to_numpy(), [0, 0, 0])  # missing cell: no indicator
    assert tb["color=green"].tolist() == [1, 0, 0]
    sent = [r for r in fed.traffic.records if r.kind == "category_sets"]
    assert len(sent) == 2 and all(r.bytes_up < 200 for r in sent)  # category names only
    assert union_categories([{"c": ["b"]}, {"c": ["a", "b"]}]) == {"c": ["a", "b"]}
    with pytest.raises(ValueError, match="outside the agreed list"):
        one_hot(a, {"color": ["red"]})


def test_one_hot_failure_names_the_site():
    a = pd.DataFrame({"c": ["u", "v"], "y": [0, 1]})
    fed = LocalFederation([Site("s1", a, "y", test_size=0)])
    from fedtab.federation.steps.encoding import encode_categories

    with pytest.raises(FederationError, match="s1"):
        encode_categories(fed, {"c": ["u"]})
