"""Ballots on evidence (issue 22, item 2): a site votes only on the columns it measures, and
the cells its imputation filled are not evidence."""

import numpy as np
import pandas as pd

from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.election.server import gather_ballots
from fedtab.federation.workflows.election.site import ballot_reply
from fedtab.federation.site.observed import MEASURED_KEY, measured_columns, measured_frame
from fedtab.federation.workflows.selection import select_model
from fedtab.federation.site.core import Site


def _tables(seed=0, n=240):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(3):
        X = rng.normal(size=(n, 4))
        y = (X[:, 0] + 0.5 * X[:, 1] + rng.normal(0, 0.8, n) > 0).astype(int)
        t = pd.DataFrame(X, columns=["a", "b", "c", "d"])
        t["target"] = y
        out.append(t)
    out[1] = out[1].drop(columns=["d"])  # site 1 never measures d
    out[2].loc[out[2].index[::2], "c"] = np.nan  # site 2 misses half of c
    return out


def _impute_leakily(site: Site, columns: list[str]) -> None:
    """Fill every missing or absent cell with the label ×10 (the most misleading evidence),
    through the imputation's own table step (which records the measured cells first)."""
    import fedtab.federation.workflows.imputation  # noqa: F401 - registers the table step

    table = site.table.reindex(columns=columns).to_numpy(dtype=np.float64)
    y = site.table[site.target].to_numpy(dtype=np.float64)
    filled = np.where(np.isnan(table), 10.0 * y[:, None], table)
    site.apply_table_step("impute_fill", {"columns": columns, "values": filled})


def test_imputed_cells_and_columns_are_no_evidence():
    tables = _tables()
    sites = [Site(f"s{i}", t, "target", seed=i) for i, t in enumerate(tables)]
    raw = [s.table.copy() for s in sites]
    for s in sites:
        _impute_leakily(s, ["a", "b", "c", "d"])
    assert MEASURED_KEY in sites[1].state and "d" in sites[1].feature_names
    assert measured_columns(sites[1]) == ["a", "b", "c"]
    ballots = {b.site: b for b in gather_ballots(LocalFederation(sites), "anova")}
    assert list(ballots["s1"].feature_names) == ["a", "b", "c"]  # d is not voted on where it was imputed
    assert list(ballots["s0"].feature_names) == ["a", "b", "c", "d"]
    # site 2's ballot equals its ballot on the table as measured (NaN where it imputed)
    frame = measured_frame(sites[2], sites[2].rows("train")[["a", "b", "c", "d"]], "train")
    assert frame["c"].isna().sum() > 0 and not (frame["c"] == 10).any()
    before = raw[2].iloc[sites[2].parts.indices("train")]
    honest = ballot_reply(sites[2], "ballot", "anova", before[["a", "b", "c", "d"]], before["target"].to_numpy())
    np.testing.assert_allclose(ballots["s2"].scores, honest.arrays["scores"])


def test_selection_reports_measured_shares_and_columns_to_impute():
    tables = _tables(seed=1)
    sites = [Site(f"s{i}", t, "target", seed=i) for i, t in enumerate(tables)]
    for s in sites:
        _impute_leakily(s, ["a", "b", "c", "d"])
    out = select_model(LocalFederation(sites), selector="anova", grid=(1.0,), modes=("none",), contributions=False,
                       rounds=2, local_epochs=2)
    m = out.measured
    assert m["s1"]["missing_share"]["d"] == 1.0 and m["s1"]["imputed_share"]["d"] == 1.0
    assert m["s0"]["missing_share"]["d"] == 0.0
    assert 0.4 < m["s2"]["missing_share"]["c"] < 0.6 and m["s2"]["imputed_share"]["c"] == m["s2"]["missing_share"]["c"]
    if "d" in out.features:
        assert "d" in m["s1"]["must_impute"]
    if "c" in out.features:
        assert "c" in m["s2"]["partly_imputed"]
    assert m["s0"]["must_impute"] == [] and m["s0"]["partly_imputed"] == []
