"""Co-observation statistics that do not hide a complement (issue 28 item 3).

A curious server holds ``sum[i]`` (Σ x_i over the rows where ``i`` is observed) and
``pair_sx[i, j]`` (Σ x_i over the rows where ``i`` and ``j`` are both observed): their
difference is Σ x_i over the rows missing ``j``. Every test plays that server: it takes the
reply, combines the released sums and checks that nothing below ``min_rows`` rows comes out.
"""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedtab.federation.protocol import validate
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.core import Site
from fedtab.impute.stats import pool_stats, release_plan, released_stats, site_stats

MIN_ROWS = 10


def _table(n=100, f=4, seed=0):
    return np.random.default_rng(seed).normal(size=(n, f)) * [1.0, 2.0, 3.0, 4.0][:f] + 5.0


def _exposed_sets(x: np.ndarray, s, i: int) -> list[np.ndarray]:
    """The row sets over which the reply ``s`` gives the server Σ x_i exactly: ``O_i``, every
    ``R_ij`` whose ``pair_sx`` equals the true sum there (and is not what ``count``, ``sum`` and
    ``pair_count`` give anyway, as for a constant column), and for a two-valued partner ``j`` the
    level sets of ``j`` within ``R_ij`` (the product ``Σ x_i x_j`` gives their sums)."""
    obs = ~np.isnan(x)
    sets = []
    if s.count[i] > 0:
        sets.append(obs[:, i])
    for j in range(x.shape[1]):
        if j == i or s.pair_count[i, j] == 0:
            continue
        both = obs[:, i] & obs[:, j]
        derived = s.pair_count[i, j] * s.sum[i] / s.count[i]  # what count, sum and pair_count give anyway
        if np.isclose(s.pair_sx[i, j], x[both, i].sum(), rtol=1e-12, atol=1e-9) \
                and not np.isclose(s.pair_sx[i, j], derived, rtol=1e-12, atol=1e-9):
            sets.append(both)
        levels = np.unique(x[both, j])
        if len(levels) <= 2:
            sets += [both & (x[:, j] == v) for v in levels]
    return sets


def _smallest_atom(x: np.ndarray, s, i: int) -> int:
    """The fewest rows of ``O_i`` that no combination of the exposed sums can split further
    (rows grouped by their membership in every exposed set); large if nothing is exposed."""
    sets = _exposed_sets(x, s, i)
    if not sets:
        return 10 ** 9
    rows = np.flatnonzero(~np.isnan(x[:, i]))
    member = np.stack([m[rows] for m in sets], axis=1)
    _, counts = np.unique(member, axis=0, return_counts=True)
    return int(counts.min())


def _smallest_support(x: np.ndarray, s, i: int) -> int:
    """The fewest rows of ``O_i`` that some non-zero combination of the exposed sums depends on:
    the server's best differencing, found by a mixed-integer program (independent of the plan's
    own search). Per atom ``a`` of the exposed sets: the combination's weight ``v_a`` there and
    ``z_a = 1`` when it is non-zero; for each atom ``a0`` in turn, ``v_a0 = 1`` and every
    ``|v_a| <= z_a`` (any combination, scaled so that its largest weight is 1 at ``a0``);
    minimise the rows ``Σ count_a z_a``. Large if nothing is exposed."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    sets = _exposed_sets(x, s, i)
    if not sets:
        return 10 ** 9
    rows = np.flatnonzero(~np.isnan(x[:, i]))
    member = np.stack([m[rows] for m in sets], axis=1).astype(float)
    atoms, counts = np.unique(member, axis=0, return_counts=True)
    k, g = atoms.shape  # variables: c (g, free), z (k, binary); v = atoms @ c
    best = 10 ** 9
    for a0 in range(k):
        upper = np.hstack([atoms, -np.eye(k)])  # v - z <= 0
        lower = np.hstack([atoms, np.eye(k)])  # v + z >= 0
        pin = np.hstack([atoms[a0], np.zeros(k)])[None, :]  # v_a0 == 1
        cons = [LinearConstraint(upper, -np.inf, 0.0), LinearConstraint(lower, 0.0, np.inf),
                LinearConstraint(pin, 1.0, 1.0)]
        cost = np.concatenate([np.zeros(g), counts.astype(float)])
        res = milp(cost, constraints=cons, integrality=np.concatenate([np.zeros(g), np.ones(k)]),
                   bounds=Bounds(np.concatenate([np.full(g, -1e6), np.zeros(k)]),
                                 np.concatenate([np.full(g, 1e6), np.ones(k)])))
        if res.status == 0:
            best = min(best, int(round(res.fun)))
    return best


def _in_span(x: np.ndarray, s, i: int, target: np.ndarray) -> bool:
    """Whether Σ x_i over ``target`` (a bool row mask) is a linear combination of the sums the
    reply exposes — the server's best differencing attack."""
    sets = _exposed_sets(x, s, i)
    if not sets:
        return False
    a = np.stack(sets, axis=1).astype(float)
    coef, *_ = np.linalg.lstsq(a, target.astype(float), rcond=None)
    return bool(np.allclose(a @ coef, target, atol=1e-8))


@pytest.mark.parametrize("k", [1, 2, 9])
def test_the_rows_missing_a_column_are_not_recovered(k):
    x = _table()
    x[:k, 2] = np.nan
    s = released_stats(x, list("abcd"), MIN_ROWS)
    for i in (0, 1, 3):
        assert not np.isclose(s.sum[i] - s.pair_sx[i, 2], x[:k, i].sum())  # the difference
        assert not _in_span(x, s, i, np.isnan(x[:, 2]))  # nor any other combination
        assert not any(_in_span(x, s, i, np.arange(len(x)) == r) for r in range(k))
        assert _smallest_atom(x, s, i) >= MIN_ROWS
    s.validate()


def test_ten_rows_missing_a_column_are_an_aggregate_and_released_exactly():
    x = _table()
    x[:10, 2] = np.nan
    s = released_stats(x, list("abcd"), MIN_ROWS)
    assert np.isclose(s.sum[0] - s.pair_sx[0, 2], x[:10, 0].sum())  # allowed: 10 rows
    assert np.allclose(s.pair_sx, site_stats(x, list("abcd")).pair_sx)  # nothing replaced
    assert not any(_in_span(x, s, 0, np.arange(len(x)) == r) for r in range(10))


def test_two_large_complements_that_overlap_in_one_row_do_not_give_it():
    """``Σ_{R_ab} + Σ_{R_ac} − Σ_{O_a}``: b and c each miss half the rows and are both observed
    in one row only; every pairwise complement is 50 rows, the combination is that one row."""
    x = _table(f=3)
    x[:49, 1] = np.nan
    x[50:, 2] = np.nan
    s = released_stats(x, list("abc"), MIN_ROWS)
    assert not np.isclose(s.pair_sx[0, 1] + s.pair_sx[0, 2] - s.sum[0], x[49, 0])
    assert not _in_span(x, s, 0, np.arange(100) == 49)
    assert _smallest_atom(x, s, 0) >= MIN_ROWS


def test_a_rare_indicator_does_not_select_its_rows_through_the_product():
    """A one-hot column with 3 ones: Σ x_a·x_ind is Σ x_a over those 3 rows."""
    x = _table(f=3)
    x[:, 2] = 0.0
    x[:3, 2] = 1.0
    s = released_stats(x, list("abc"), MIN_ROWS)
    assert not _in_span(x, s, 0, x[:, 2] == 1.0) and not _in_span(x, s, 1, x[:, 2] == 1.0)
    assert s.pair_sxy[0, 2] == 0 and s.pair_count[0, 2] == 0  # the cell is suppressed
    x[:30, 2] = 1.0  # a common category: its cell is kept, the level sums are aggregates
    s = released_stats(x, list("abc"), MIN_ROWS)
    assert s.pair_count[0, 2] == 100 and _smallest_atom(x, s, 0) >= MIN_ROWS


def test_the_site_handler_releases_under_the_plan():
    x = _table()
    x[:1, 2] = np.nan
    site = Site("a", pd.DataFrame(x, columns=list("abcd")), test_size=0)
    reply = site.handle(Message("impute_stats", {"shift": np.zeros(4)}, {"columns": list("abcd")}))
    a = reply.arrays
    assert not np.isclose(a["sum"][0] - a["pair_sx"][0, 2], x[0, 0])
    assert np.isclose(a["sum"][0] - a["pair_sx"][0, 1], 0.0)  # fully co-observed pairs are exact
    validate.pair_statistics(a["count"], a["sum"], a["sumsq"], a["pair_count"], a["pair_sx"], a["pair_sxx"],
                             a["pair_sxy"])


@st.composite
def _tables(draw):
    n = draw(st.integers(12, 60))
    f = draw(st.integers(2, 5))
    seed = draw(st.integers(0, 2 ** 31 - 1))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, f)) * rng.uniform(0.5, 3.0, f) + rng.normal(0, 5, f)
    for j in range(f):  # per column: complete, a few rows missing, or many
        kind = draw(st.sampled_from(["full", "few", "many", "binary"]))
        if kind == "few":
            x[rng.choice(n, draw(st.integers(1, 9)), replace=False), j] = np.nan
        elif kind == "many":
            x[rng.random(n) < draw(st.floats(0.1, 0.6)), j] = np.nan
        elif kind == "binary":
            x[:, j] = (rng.random(n) < draw(st.floats(0.02, 0.5))).astype(float)
    return x, draw(st.integers(2, 12))


@given(_tables())
@settings(max_examples=150, deadline=None)
def test_no_combination_of_released_sums_isolates_fewer_than_min_rows(case):
    x, min_rows = case
    f = x.shape[1]
    s = released_stats(x, [f"c{j}" for j in range(f)], min_rows)
    for i in range(f):
        # every combination of the exposed sums depends on min_rows rows or more (pieces of the
        # column's rows below min_rows are allowed where no combination separates them)
        assert _smallest_atom(x, s, i) >= min_rows or _smallest_support(x, s, i) >= min_rows
        # the complement of every partner, and every single row, is out of the server's reach
        for j in range(f):
            comp = ~np.isnan(x[:, i]) & np.isnan(x[:, j])
            if 0 < comp.sum() < min_rows:
                assert not _in_span(x, s, i, comp)
    # the server accepts the reply and pools it (variances >= 0, correlations within [-1, 1])
    validate.pair_statistics(s.count, s.sum, s.sumsq, s.pair_count, s.pair_sx, s.pair_sxx, s.pair_sxy)
    s.validate()
    pooled = pool_stats([s])
    assert np.all(np.isnan(pooled.corr) | (np.abs(pooled.corr) <= 1.0))


def test_with_min_rows_one_everything_is_exact():
    x = _table()
    x[:1, 2] = np.nan
    plan = release_plan(x, 1)
    assert plan.exact.all() and plan.kept.all()
    assert np.allclose(released_stats(x, list("abcd"), 1).pair_sx, site_stats(x, list("abcd")).pair_sx)


def _levels_table(cells: dict[tuple[int, int], int], seed: int = 0) -> np.ndarray:
    """Columns (a, s, f): a continuous, s and f two 0/1 columns with ``cells[(s, f)]`` rows each."""
    rng = np.random.default_rng(seed)
    rows = [(s_, f_) for (s_, f_), k in cells.items() for _ in range(k)]
    sf = np.array(rows, dtype=float)
    return np.column_stack([rng.normal(5.0, 2.0, len(sf)), sf])


def test_a_small_cell_of_two_two_valued_partners_is_released_when_no_combination_isolates_it():
    """s and f cross-classify a's rows into four cells, one of 3 rows: Σ_O, Σ_{s=1}, Σ_{f=1}
    (from the products) are three numbers about four cells, so no combination gives the small
    cell (or any other set below min_rows) — the pairs stay in the statistics."""
    x = _levels_table({(1, 1): 3, (1, 0): 57, (0, 1): 20, (0, 0): 20})
    s = released_stats(x, list("asf"), MIN_ROWS)
    assert s.pair_count[0, 1] == 100 and s.pair_count[0, 2] == 100  # both products released
    assert _smallest_atom(x, s, 0) == 3  # a piece below min_rows exists ...
    assert _smallest_support(x, s, 0) >= MIN_ROWS  # ... but no combination separates it
    cell = (x[:, 1] == 1) & (x[:, 2] == 1)
    assert not _in_span(x, s, 0, cell)
    assert not any(_in_span(x, s, 0, np.arange(100) == r) for r in np.flatnonzero(cell))


def test_a_small_cell_the_other_levels_pin_down_is_not_released():
    """f = 1 only where s = 0, and 3 rows have s = 0 and f = 0: Σ_O − Σ_{s=1} − Σ_{f=1} is those
    3 rows. The unprotected statistics give them (the adversary works); the plan does not."""
    x = _levels_table({(1, 0): 60, (0, 1): 37, (0, 0): 3})
    cell = (x[:, 1] == 0) & (x[:, 2] == 0)
    raw = site_stats(x, list("asf"))
    assert _in_span(x, raw, 0, cell) and _smallest_support(x, raw, 0) == 3
    s = released_stats(x, list("asf"), MIN_ROWS)
    assert not _in_span(x, s, 0, cell)
    assert _smallest_support(x, s, 0) >= MIN_ROWS
    assert s.pair_count[0, 1] == 100 and s.pair_count[0, 2] == 0  # the second product is suppressed


def test_the_differencing_adversary_finds_an_overlap_in_unprotected_statistics():
    """The adversary of these tests has teeth: two 50-row complements overlapping in one row."""
    x = _table(f=3)
    x[:49, 1] = np.nan
    x[50:, 2] = np.nan
    raw = site_stats(x, list("abc"))
    assert _smallest_support(x, raw, 0) == 1 and _in_span(x, raw, 0, np.arange(100) == 49)


def test_a_search_too_large_to_finish_counts_as_isolating(monkeypatch):
    """Beyond MAX_SUBSETS the check answers "isolates": the plan gets coarser, never less safe."""
    import fedtab.impute.stats as stats

    # two 6-row cells: Σ_{s=0,f=0} − Σ_{s=1,f=1} is a combination, but of 12 rows (allowed)
    x = _levels_table({(1, 1): 6, (1, 0): 44, (0, 1): 44, (0, 0): 6})
    member = np.column_stack([np.ones(100, bool), x[:, 1] == 1, x[:, 2] == 1])
    assert not stats._isolates(member, MIN_ROWS) and _smallest_support(x, site_stats(x, list("asf")), 0) == 12
    monkeypatch.setattr(stats, "MAX_SUBSETS", 0)
    assert stats._isolates(member, MIN_ROWS)
    assert released_stats(x, list("asf"), MIN_ROWS).pair_count[0, 2] == 0
