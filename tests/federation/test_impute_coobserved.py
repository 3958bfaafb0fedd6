"""The co-observation probe of issue 28 against whole imputation runs, plain and secure.

The curious server runs the imputation's statistics step honestly and then differences what
it received: ``sum[a] − pair_sx[a, c]`` is Σ x_a over the rows missing ``c``. Plain: per
site; secure: the pooled sums, when those rows are the only ones in the federation missing
``c``. Nothing below ``min_rows`` (10, the default) rows may come out; 10 rows may.
"""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.imputation import steps
from fedtab.federation.protocol import set_options
from fedtab.federation.site.core import Site

COLS = list("abcd")


def _tables(k: int, holder: int = 0, column: str = "c", seed: int = 0) -> list[pd.DataFrame]:
    """3 sites of 60–80 complete rows; ``holder``'s first ``k`` rows miss ``column``."""
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate((60, 70, 80)):
        z = rng.normal(size=(n, 2))
        t = pd.DataFrame(z @ rng.normal(size=(2, 4)) + rng.normal(0, 0.3, (n, 4)) + 3.0, columns=COLS)
        if i == holder:
            t.loc[: k - 1, column] = np.nan
        out.append(t)
    return out


def _curious_run(tables, secure: bool, monkeypatch):
    """The schema and statistics steps of an imputation; returns what the server received:
    ``(per-site impute_stats replies, summed impute_stats arrays, shift, scale)``."""
    seen, summed = {}, {}
    real_exchange, real_sums = steps.exchange, steps.exchange_sums

    def exchange(fed, request, check=None, **kw):
        replies = real_exchange(fed, request, check, **kw)
        if request.kind == "impute_stats":
            seen.update(replies)
        return replies

    def exchange_sums(fed, request, spec, *a, **kw):
        out = real_sums(fed, request, spec, *a, **kw)
        if request.kind == "impute_stats":
            summed.update(out.sums, shift=request.arrays["shift"], scale=request.arrays["scale"])
        return out

    monkeypatch.setattr(steps, "exchange", exchange)
    monkeypatch.setattr(steps, "exchange_sums", exchange_sums)
    fed = LocalFederation([Site(f"s{i}", t, test_size=0, seed=0) for i, t in enumerate(tables)])
    set_options(fed, secure_aggregation=secure)
    columns = steps.schema_step(fed, None)
    pooled, _ = steps.pooled_statistics(fed, columns, steps.centring(fed, columns), None)
    return seen, summed, columns.columns, pooled


def _plain_complements(seen, holder: int, column: str) -> dict[str, float]:
    """Per other column ``a``: ``sum[a] − pair_sx[a, column]`` of the holder's reply."""
    r = seen[f"s{holder}"]
    cols = r.meta["columns"]
    j = cols.index(column)
    return {a: r.arrays["sum"][i] - r.arrays["pair_sx"][i, j] for i, a in enumerate(cols) if a != column}


def _secure_complements(summed, glob, column: str) -> dict[str, float]:
    """Per other column ``a``: the pooled difference, back in data units about the shift."""
    j = glob.index(column)
    return {a: (summed["sum"][i] - summed["pair_sx"][i, j]) * summed["scale"][i]
            for i, a in enumerate(glob) if a != column}


def _truth(tables, holder, column, shift=None, glob=None):
    t = tables[holder]
    miss = t[column].isna()
    out = {}
    for a in COLS:
        if a == column:
            continue
        v = t.loc[miss, a].to_numpy()
        out[a] = (v - (0.0 if shift is None else shift[glob.index(a)])).sum()
    return out


@pytest.mark.parametrize("k", [1, 2, 9])
def test_plain_run_recovers_no_row_missing_a_column(k, monkeypatch):
    tables = _tables(k)
    seen, _, glob, pooled = _curious_run(tables, False, monkeypatch)
    shift = seen["s0"].arrays["shift"]
    got, truth = _plain_complements(seen, 0, "c"), _truth(tables, 0, "c", shift, glob)
    assert all(not np.isclose(got[a], truth[a], rtol=1e-9, atol=1e-9) for a in truth), (got, truth)
    assert np.all(np.isfinite(pooled.corr))  # the pair is still in the graph


def test_plain_run_releases_ten_rows_missing_a_column(monkeypatch):
    tables = _tables(10)
    seen, _, glob, _ = _curious_run(tables, False, monkeypatch)
    got, truth = _plain_complements(seen, 0, "c"), _truth(tables, 0, "c", seen["s0"].arrays["shift"], glob)
    assert all(np.isclose(got[a], truth[a], rtol=1e-9, atol=1e-9) for a in truth)


@pytest.mark.parametrize("k", [1, 2, 9])
def test_secure_run_recovers_no_row_alone_in_missing_a_column(k, monkeypatch):
    tables = _tables(k)
    _, summed, glob, pooled = _curious_run(tables, True, monkeypatch)
    got, truth = _secure_complements(summed, glob, "c"), _truth(tables, 0, "c", summed["shift"], glob)
    assert all(not np.isclose(got[a], truth[a], rtol=1e-6, atol=1e-6) for a in truth), (got, truth)
    assert np.all(np.isfinite(pooled.corr))


def test_secure_run_releases_ten_rows_missing_a_column(monkeypatch):
    tables = _tables(10)
    _, summed, glob, _ = _curious_run(tables, True, monkeypatch)
    got, truth = _secure_complements(summed, glob, "c"), _truth(tables, 0, "c", summed["shift"], glob)
    # the fixed-point sums are exact to ~2**-24 of a z-value per row
    assert all(np.isclose(got[a], truth[a], rtol=1e-5, atol=1e-4) for a in truth), (got, truth)


@given(k=st.integers(1, 9), holder=st.integers(0, 2), column=st.sampled_from(COLS), seed=st.integers(0, 1000))
@settings(max_examples=8, deadline=None)
def test_secure_and_plain_runs_hide_any_small_complement(k, holder, column, seed):
    tables = _tables(k, holder, column, seed)
    with pytest.MonkeyPatch.context() as mp:
        seen, _, glob, _ = _curious_run(tables, False, mp)
    got, truth = _plain_complements(seen, holder, column), _truth(tables, holder, column,
                                                                   seen[f"s{holder}"].arrays["shift"], glob)
    assert all(not np.isclose(got[a], truth[a], rtol=1e-9, atol=1e-9) for a in truth)
    with pytest.MonkeyPatch.context() as mp:
        _, summed, glob, _ = _curious_run(tables, True, mp)
    got, truth = _secure_complements(summed, glob, column), _truth(tables, holder, column, summed["shift"], glob)
    assert all(not np.isclose(got[a], truth[a], rtol=1e-6, atol=1e-6) for a in truth)


def test_apply_counts_clipped_cells_only_in_columns_with_enough_imputed_cells():
    """``impute_apply`` bounds are the server's: with one imputed cell in a column, a bound just
    below or above it would tell the server where that row's prediction lies."""
    from fedtab.federation.workflows.imputation.site import _released_clipped

    given = np.ones((40, 2))
    raw = np.zeros((40, 2))
    given[0, 0] = np.nan  # one imputed cell in column 0
    low, high = np.array([1.0, -1.0]), np.array([2.0, 1.0])  # column 0's bound excludes its prediction
    assert _released_clipped(given, raw, low, high, 10) == 0
    given[:10, 0] = np.nan  # ten imputed cells: an aggregate
    assert _released_clipped(given, raw, low, high, 10) == 10
    given[:3, 1] = np.nan  # three in column 1, within its bounds: counted nowhere either way
    assert _released_clipped(given, raw, low, np.array([2.0, -0.5]), 10) == 10
