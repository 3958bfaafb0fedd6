"""Pooled ANOVA from per-class sums equals scikit-learn's f_classif / SelectFdr on the pooled rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.feature_selection import SelectFdr, f_classif

from fedtab.data.synthetic import classification_table
from fedtab.engines.local import LocalFederation
from fedtab.federation import FederationError, Message, run_pooled_anova
from fedtab.federation.workflows.pooled_anova.server import pooled_anova
from fedtab.federation.site.core import Site


def _skewed_sites(seed=0):
    """Five sites under extreme label skew: three hold a single class."""
    t = classification_table(1500, 40, 6, 0, seed=seed)
    zeros, ones = t[t.target == 0], t[t.target == 1]
    tables = [zeros.iloc[:300], ones.iloc[:300], zeros.iloc[300:400], pd.concat([zeros.iloc[400:], ones.iloc[300:340]]),
              ones.iloc[340:]]
    return [Site(f"s{i}", x.reset_index(drop=True), "target", test_size=0) for i, x in enumerate(tables)]


def test_pooled_anova_equals_sklearn_on_the_pooled_rows_under_label_skew():
    sites = _skewed_sites()
    out = run_pooled_anova(LocalFederation(sites), alpha=0.05)
    pooled = pd.concat([s.table for s in sites], ignore_index=True)
    X, y = pooled.drop(columns="target").to_numpy(), pooled.target.to_numpy()
    f_ref, p_ref = f_classif(X, y)
    np.testing.assert_allclose(out.f, f_ref, rtol=1e-8)
    np.testing.assert_allclose(out.p, p_ref, rtol=1e-6, atol=1e-300)
    ref_mask = SelectFdr(f_classif, alpha=0.05).fit(X, y).get_support()
    assert out.mask.tolist() == ref_mask.tolist() and 0 < out.mask.sum() < 40
    assert out.n_rows == len(pooled) and out.classes == ["0", "1"]


def test_sites_with_different_columns_and_missing_cells_align_by_name():
    sites = _skewed_sites(1)
    sites[0] = Site("s0", sites[0].table.drop(columns=["f00", "f05"]), "target", test_size=0)
    t = sites[1].table.copy()
    t.loc[::7, "f01"] = np.nan
    sites[1] = Site("s1", t, "target", test_size=0)
    out = run_pooled_anova(LocalFederation(sites))
    pooled = pd.concat([s.table for s in sites], ignore_index=True)
    for j, name in enumerate(out.feature_names):
        col = pooled[[name, "target"]].dropna()
        f_ref = f_classif(col[[name]].to_numpy(), col.target.to_numpy())[0][0]
        assert out.f[j] == pytest.approx(f_ref, rel=1e-8), name


def test_bad_replies_and_single_class_are_named():
    sites = _skewed_sites()
    with pytest.raises(ValueError, match="at least 2 classes"):
        run_pooled_anova(LocalFederation([sites[0], sites[2]]))

    class Liar(LocalFederation):
        def ask(self, requests):
            out = super().ask(requests)
            out["s1"] = Message("class_moments", {"count": -np.ones((1, 40)), "sum": np.zeros((1, 40)),
                                                  "sumsq": np.zeros((1, 40))},
                                {**out["s1"].meta, "classes": ["1"]})  # its schema declaration kept
            return out

    with pytest.raises(FederationError, match="site 's1': invalid class moments"):
        run_pooled_anova(Liar(sites))
    with pytest.raises(ValueError, match="alpha"):
        pooled_anova(np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 3)), alpha=0)
