"""The imputation's column moments riding on its statistics' exchange (issue 31: fewer exchanges).

In a plain run whose schema is agreed and given a public centre per column (a job's profile
ranges), ``impute_schema`` rides on ``impute_stats`` taken about that centre: one exchange for
both, the same pooled statistics, and — checked as a curious server would — the same quantities
released as the two exchanges taken about the pooled mean.
"""

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation.protocol import FederationError, set_options
from fedtab.federation.site.core import Site
from fedtab.federation.steps.profile import profile_sites
from fedtab.federation.workflows.imputation import ImputeConfig, run_imputation
from fedtab.impute.stats import STAT_ARRAYS

pytestmark = pytest.mark.requires("torch")

CFG = dict(rounds=1, hidden_dim=4, n_layers=1, seed=0)


def _tables(n=600, seed=3):
    """3 sites over 5 correlated columns far from 0 (a shift matters for conditioning), each lacking one."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 2)) @ rng.normal(size=(2, 5)) + 0.3 * rng.normal(size=(n, 5))
    full = pd.DataFrame(1000.0 + 10.0 * z, columns=[f"c{i}" for i in range(5)]).mask(rng.random((n, 5)) < 0.1)
    parts = np.array_split(np.arange(n), 3)
    keep = [["c0", "c1", "c2", "c3"], ["c1", "c2", "c3", "c4"], ["c0", "c2", "c3", "c4"]]
    return [full.iloc[r][k].reset_index(drop=True) for r, k in zip(parts, keep)]


def _fed(min_rows=None, **options):
    policy = None if min_rows is None else {"min_rows": min_rows}
    fed = LocalFederation([Site(f"s{i}", t, test_size=0.2, seed=0, policy=policy) for i, t in enumerate(_tables())])
    if options:
        set_options(fed, **options)
    profile_sites(fed)  # the job's first exchange: it agrees the schema
    return fed


CENTRE = {f"c{i}": 1000.0 + 5.0 * i for i in range(5)}  # public numbers near the data (any would do)


def _released(monkeypatch):
    """Record every part a site answers: ``[(site, kind, request arrays, reply)]``."""
    log = []
    real = Site._answer

    def answer(self, request):
        reply = real(self, request)
        log.append((self.name, request.kind, dict(request.arrays), reply))
        return reply

    monkeypatch.setattr(Site, "_answer", answer)
    return log


def _kinds(fed, n0):
    return [r.kind for r in fed.traffic.records][n0:]


def _loose(fed):
    """(F, F) bool over the global columns: a cell some site releases with substituted pair moments
    (:func:`fedtab.impute.stats.release_plan`: kept, not exact), where the pooled correlation is an
    estimate that depends on the shift the statistics are taken about."""
    from fedtab.federation.workflows.imputation.site import _values
    from fedtab.impute.stats import release_plan

    glob = list(CENTRE)
    out = np.zeros((len(glob), len(glob)), dtype=bool)
    for name in fed.sites:
        site = fed.site(name)
        plan = release_plan(_values(site, "train"), site.policy.min_rows)
        idx = [glob.index(c) for c in site.feature_names]
        loose = plan.kept & ~plan.exact
        out[np.ix_(idx, idx)] |= loose | loose.T
    return out


@pytest.mark.parametrize("min_rows", [1, None])
def test_the_moments_ride_on_the_statistics_exchange_with_the_same_pooled_statistics(min_rows):
    """One exchange fewer; the same columns, rows, means, spreads and co-observed counts, and the same
    correlations wherever every site's cell is exact (all of them with ``min_rows = 1``). A cell a
    site releases with substituted pair moments (``min_rows`` > 1 and a few rows of one column
    missing the other) gets the estimate about the public centre instead of about the pooled mean:
    it differs there (docs/impute.md)."""
    two, one = _fed(min_rows), _fed(min_rows)
    a = run_imputation(two, ImputeConfig(**CFG))
    n0 = one.exchange_count
    b = run_imputation(one, ImputeConfig(**CFG), centre=CENTRE)
    # fused: impute_stats (moments riding) + impute_fit (setup riding) + impute_eval; two-step: one more
    assert one.exchange_count - n0 == 3
    assert two.exchange_count - n0 == 4
    steps = [p["step"] for p in one.participation]
    assert steps[steps.index("impute_schema") + 1] == "impute_stats"
    assert b.columns == a.columns == list(CENTRE) and b.site_columns == a.site_columns
    assert b.site_rows == a.site_rows
    np.testing.assert_allclose(b.mean, a.mean, rtol=1e-12)
    np.testing.assert_allclose(b.std, a.std, rtol=1e-10)
    np.testing.assert_array_equal(b.pooled.pair_count, a.pooled.pair_count)
    loose = _loose(one)
    assert loose.any() == (min_rows is None)  # the data has such cells under the default floor
    np.testing.assert_allclose(b.pooled.corr[~loose], a.pooled.corr[~loose], rtol=0, atol=1e-10)
    if min_rows == 1:
        np.testing.assert_array_equal(b.graph.edge_index, a.graph.edge_index)
        np.testing.assert_allclose(b.graph.weight, a.graph.weight, rtol=0, atol=1e-10)
    else:
        assert not np.allclose(b.pooled.corr[loose], a.pooled.corr[loose], rtol=0, atol=1e-10)


def _raw(reply, shift):
    """A site's statistics about ``shift`` turned into raw sums about 0 (what they disclose)."""
    a = {k: np.asarray(reply.arrays[k], np.float64) for k in STAT_ARRAYS}
    s = np.asarray(shift, np.float64)
    pc = a["pair_count"]
    sx = a["pair_sx"] + pc * s[:, None]  # pair_sx[i, j]: sum of x_i over rows with i and j observed
    return {"count": a["count"], "sum": a["sum"] + a["count"] * s,
            "sumsq": a["sumsq"] + 2 * s * a["sum"] + a["count"] * s ** 2, "pair_count": pc, "pair_sx": sx,
            "pair_sxx": a["pair_sxx"] + 2 * s[:, None] * a["pair_sx"] + pc * (s ** 2)[:, None],
            "pair_sxy": a["pair_sxy"] + s[None, :] * a["pair_sx"] + s[:, None] * a["pair_sx"].T
            + pc * np.outer(s, s)}


def _setup_releases(log, fed, **kw):
    """``{(site, kind): reply}`` of the moments and statistics one imputation run makes the sites release."""
    log.clear()
    run_imputation(fed, ImputeConfig(**CFG), **kw)
    out = {(e[0], e[1]): e[3] for e in log if e[1] in ("impute_schema", "impute_stats")}
    assert len(out) == 6 and not any(r.is_error or r.is_refusal for r in out.values())
    return out


def test_the_fused_exchange_releases_what_todays_protocol_gives_a_server_choosing_that_shift(monkeypatch):
    """The server chose the statistics' shift before too (the site cannot check a pooled mean): the
    fused run's releases are exactly the two exchanges' when the server sends the centre as the shift
    — the same kinds, arrays and meta at every site. Fusing gives a curious server nothing new."""
    from fedtab.federation.workflows.imputation import server

    log = _released(monkeypatch)
    fused = _setup_releases(log, _fed(), centre=CENTRE)
    monkeypatch.setattr(server, "centring", lambda fed, columns: np.array([CENTRE[c] for c in columns.columns]))
    chosen = _setup_releases(log, _fed())
    assert fused.keys() == chosen.keys()
    for k, r in fused.items():
        assert r.meta == chosen[k].meta and set(r.arrays) == set(chosen[k].arrays)
        for name in r.arrays:
            np.testing.assert_array_equal(r.arrays[name], chosen[k].arrays[name], err_msg=f"{k} {name}")


def test_about_any_public_shift_the_statistics_disclose_the_same_sums(monkeypatch):
    """Every cell exact (``min_rows = 1``): the honest two-step run (about the pooled mean) and the
    fused one (about the public centre) release the same moments, and statistics whose raw sums
    about 0 are equal: the shift moves no information."""
    log = _released(monkeypatch)
    before = _setup_releases(log, _fed(1))
    after = _setup_releases(log, _fed(1), centre=CENTRE)
    assert before.keys() == after.keys()
    for k, rb in before.items():
        ra = after[k]
        assert set(rb.arrays) == set(ra.arrays) and rb.meta == ra.meta
        if k[1] == "impute_schema":
            for name in rb.arrays:
                np.testing.assert_array_equal(ra.arrays[name], rb.arrays[name])
            continue
        assert not np.allclose(ra.arrays["shift"], rb.arrays["shift"])  # the shifts differ ...
        raw_b, raw_a = _raw(rb, rb.arrays["shift"]), _raw(ra, ra.arrays["shift"])
        for name in STAT_ARRAYS:  # ... the sums they disclose do not
            np.testing.assert_allclose(raw_a[name], raw_b[name], rtol=1e-9, atol=1e-6, err_msg=f"{k} {name}")


@pytest.mark.parametrize("case", ["no centre", "a column without one", "robust", "secure", "schema not agreed"])
def test_the_two_exchanges_stay_where_the_moments_cannot_ride(case):
    if case == "robust":
        fed = _fed(robust=True)
    elif case == "secure":
        fed = _fed(secure_aggregation=True)
    else:
        fed = _fed()
    centre = {"no centre": None, "a column without one": {c: v for c, v in CENTRE.items() if c != "c4"}}.get(case, CENTRE)
    if case == "schema not agreed":
        fed.schema = None
    n0 = len(fed.participation)
    run_imputation(fed, ImputeConfig(**CFG), centre=centre)
    kinds = [p["step"] for p in fed.participation[n0:]]
    assert kinds[:2] == ["impute_schema", "impute_schema" if case == "secure" else "impute_stats"]


def test_a_site_whose_statistics_disagree_with_its_moments_is_named(monkeypatch):
    """A hostile site answering the statistics over other rows than its moments is rejected by name."""
    from fedtab.federation.workflows.imputation import site as impute_site

    real_values, real_answer = impute_site._values, Site._answer
    asking = {"stats": False}

    def values(site, part):
        v = real_values(site, part)
        return v[: len(v) // 2] if site.name == "s1" and part == "train" and asking["stats"] else v

    def answer(self, request):
        asking["stats"] = request.kind == "impute_stats"
        try:
            return real_answer(self, request)
        finally:
            asking["stats"] = False

    fed = _fed()
    monkeypatch.setattr(impute_site, "_values", values)
    monkeypatch.setattr(Site, "_answer", answer)
    n0 = fed.exchange_count
    with pytest.raises(FederationError, match="s1.*counting step"):
        run_imputation(fed, ImputeConfig(**CFG), centre=CENTRE)
    assert fed.exchange_count == n0 + 1  # refused in the fused exchange itself
