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


# --------------------------------------------------------------- two-valued partners, plain and secure
LEVEL_COLS = ["a", "b", "s", "f"]


def _level_tables(holder_cells: dict[tuple[int, int], int], seed: int = 0) -> list[pd.DataFrame]:
    """3 sites with a, b continuous and s, f 0/1; site 0 has ``holder_cells[(s, f)]`` rows per
    cell, the others only f = 1 − s (so the pooled cells (0, 0) and (1, 1) are site 0's)."""
    rng = np.random.default_rng(seed)
    out = []
    for cells in (holder_cells, {(1, 0): 20, (0, 1): 20}, {(1, 0): 20, (0, 1): 30}):
        sf = np.array([c for c, k in cells.items() for _ in range(k)], dtype=float)
        z = rng.normal(size=len(sf))
        ab = np.column_stack([z + sf[:, 0], -z + sf[:, 1]]) + rng.normal(0, 0.5, (len(sf), 2)) + 3.0
        out.append(pd.DataFrame(np.column_stack([ab, sf]), columns=LEVEL_COLS))
    return out


def _level_sums(count, total, pc, sx, sxy, shift, scale, cols) -> dict[str, float]:
    """Every sum of ``a`` (in data units about the shift) the server reads off one set of
    statistics: over its rows, over each partner's co-observed rows, and per level of s and f
    (the product with a 0/1 column about its shift is Σ over the 1-level minus shift · Σ over all)."""
    i = cols.index("a")
    out = {"O": total[i] * scale[i]}
    for j, c in enumerate(cols):
        if j == i or pc[i, j] == 0:
            continue
        out[f"R_{c}"] = sx[i, j] * scale[i]
        if c in ("s", "f"):
            one = scale[j] * sxy[i, j] + shift[j] * sx[i, j]  # Σ_{c=1} of a's (scaled) values
            out[f"{c}=1"] = one * scale[i]
            out[f"{c}=0"] = (sx[i, j] - one) * scale[i]
    return out


def _combinations(sums: dict[str, float]) -> list[float]:
    """Every difference of two released sums and every ±1 combination of three."""
    import itertools

    vals = list(sums.values())
    out = [p - q for p, q in itertools.permutations(vals, 2)]
    for trio in itertools.combinations(vals, 3):
        for signs in itertools.product((1, -1), repeat=3):
            out.append(sum(s_ * v for s_, v in zip(signs, trio)))
    return out


def _cell_truth(table: pd.DataFrame, shift_a: float) -> float:
    cell = (table["s"] == 0) & (table["f"] == 0)
    return float((table.loc[cell, "a"] - shift_a).sum())


def _level_attack(tables, secure: bool, monkeypatch) -> tuple[dict[str, float], float]:
    seen, summed, glob, _ = _curious_run(tables, secure, monkeypatch)
    if secure:
        sums = _level_sums(summed["count"], summed["sum"], summed["pair_count"], summed["pair_sx"],
                           summed["pair_sxy"], summed["shift"], summed["scale"], glob)
        return sums, _cell_truth(tables[0], summed["shift"][glob.index("a")])
    r = seen["s0"]
    cols, a = r.meta["columns"], r.arrays
    ones = np.ones(len(cols))
    sums = _level_sums(a["count"], a["sum"], a["pair_count"], a["pair_sx"], a["pair_sxy"], a["shift"], ones, cols)
    return sums, _cell_truth(tables[0], a["shift"][cols.index("a")])


@pytest.mark.parametrize("secure", [False, True])
def test_a_cell_pinned_down_by_two_levels_is_not_recovered(secure, monkeypatch):
    """Site 0: f = 1 only where s = 0, and 3 rows with s = 0 and f = 0: Σ_O − Σ_{s=1} − Σ_{f=1}
    would be those 3 rows (alone in the federation). No difference of two released sums of a,
    and no ±1 combination of three, gives them."""
    tables = _level_tables({(1, 0): 30, (0, 1): 27, (0, 0): 3})
    sums, truth = _level_attack(tables, secure, monkeypatch)
    tol = dict(rtol=1e-5, atol=1e-4) if secure else dict(rtol=1e-9, atol=1e-9)
    assert not any(np.isclose(v, truth, **tol) for v in _combinations(sums)), (sums, truth)


@pytest.mark.parametrize("secure", [False, True])
def test_a_ten_row_pinned_cell_is_an_aggregate_and_released(secure, monkeypatch):
    """The control: with 10 rows in the cell the same attack gives their sum (allowed)."""
    tables = _level_tables({(1, 0): 30, (0, 1): 27, (0, 0): 10})
    sums, truth = _level_attack(tables, secure, monkeypatch)
    tol = dict(rtol=1e-5, atol=1e-4) if secure else dict(rtol=1e-9, atol=1e-9)
    assert any(np.isclose(v, truth, **tol) for v in _combinations(sums)), (sums, truth)


@pytest.mark.parametrize("secure", [False, True])
def test_a_small_cell_no_combination_separates_keeps_both_products(secure, monkeypatch):
    """Four cells, one of 3 rows (s = 0, f = 0), the others pinned by nothing: the site releases
    both products of a (the graph keeps the pairs) and still no combination gives the cell."""
    tables = _level_tables({(1, 1): 20, (1, 0): 20, (0, 1): 17, (0, 0): 3})
    seen, summed, glob, pooled = _curious_run(tables, secure, monkeypatch)
    if not secure:
        r = seen["s0"]
        cols = r.meta["columns"]
        a, s_, f_ = (cols.index(c) for c in ("a", "s", "f"))
        assert r.arrays["pair_count"][a, s_] == 60 and r.arrays["pair_count"][a, f_] == 60
    ia, is_, if_ = (glob.index(c) for c in ("a", "s", "f"))
    assert pooled.pair_count[ia, is_] == 150 and pooled.pair_count[ia, if_] == 150  # every site's rows
    with pytest.MonkeyPatch.context() as mp:
        sums, truth = _level_attack(tables, secure, mp)
    tol = dict(rtol=1e-5, atol=1e-4) if secure else dict(rtol=1e-9, atol=1e-9)
    assert not any(np.isclose(v, truth, **tol) for v in _combinations(sums)), (sums, truth)
