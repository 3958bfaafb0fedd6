"""Selection with error control (issue 30 item 5): Benjamini-Hochberg / Benjamini-Yekutieli on the
pooled score-test p-values; on data with known signal the realised false discovery rate stays
at or below q, the federated selection equals the one on the pooled rows, and the job records
q and the correction."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from fedtab.election.score_test import fdr_score_selection, fdr_select, site_sums
from fedtab.engines.local import LocalFederation
from fedtab.federation import run_pooled_score_test
from fedtab.federation.site.core import Site
from fedtab.job.spec import JobError, spec_from_plan
from fedtab.job.workflow import run_workflow

#: Benjamini & Hochberg (1995), section 4: 15 p-values, BH at 0.05 rejects the first four
BH_1995 = np.array([0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262,
                    0.5719, 0.6528, 0.7590, 1.0000])


def test_bh_and_by_on_the_published_example():
    rng = np.random.default_rng(0)
    order = rng.permutation(BH_1995.size)  # the position of a p-value does not matter
    p = BH_1995[order]
    assert sorted(BH_1995[order][fdr_select(p, 0.05, "bh")]) == list(BH_1995[:4])
    # BY: thresholds q k / (m Σ_{i≤m} 1/i) = 0.001005 k: 0.0001, 0.0004, 0.0019 pass, 0.0095 > 0.00402
    assert sorted(BH_1995[order][fdr_select(p, 0.05, "by")]) == list(BH_1995[:3])
    eligible = np.ones(p.size, dtype=bool)
    eligible[np.flatnonzero(p == 0.0001)] = False  # an ineligible feature is never kept and not counted
    kept = fdr_select(p, 0.05, "bh", eligible)
    assert not kept[~eligible].any() and kept.sum() == 3
    with pytest.raises(ValueError, match=r"fdr_method must be one of \['bh', 'by'\]"):
        fdr_select(p, 0.05, "holm")


def _known_signal(seed, n=600, d=40, signal=6, effect=0.45):
    """Independent standard-normal columns; the first ``signal`` drive the label (the rest are null
    both marginally and conditionally, so a kept null column is a false discovery)."""
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, d))
    beta = np.zeros(d)
    beta[:signal] = effect * rng.choice([-1.0, 1.0], size=signal)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(Z @ beta)))).astype(np.float64)
    return Z, y, signal


def _select(Z, y, q, method):
    return fdr_score_selection(lambda sel, coef, full: site_sums(Z, y, sel, coef, full), Z.shape[1], q, method)


@pytest.mark.parametrize("q", [0.05, 0.2])
def test_realised_fdr_stays_at_or_below_q_on_known_signal(q):
    fdp, power = {"bh": [], "by": []}, {"bh": [], "by": []}
    for seed in range(40):
        Z, y, k = _known_signal(seed)
        for method in ("bh", "by"):
            run = _select(Z, y, q, method)
            chosen = np.flatnonzero(run.mask)
            false = int((chosen >= k).sum())
            fdp[method].append(false / max(len(chosen), 1))
            power[method].append(float((chosen < k).sum()) / k)
            assert len(run.steps) <= 1 and run.converged
        by, bh = _select(Z, y, q, "by").mask, _select(Z, y, q, "bh").mask
        assert not (by & ~bh).any()  # BY keeps a subset of what BH keeps
    for method in ("bh", "by"):
        assert np.mean(fdp[method]) <= q, (method, np.mean(fdp[method]))
    assert np.mean(power["bh"]) >= 0.8 and np.mean(power["bh"]) >= np.mean(power["by"])


def test_a_larger_q_keeps_more_null_columns_the_check_can_fail():
    """The FDR check above is not vacuous: at q = 0.9 the realised FDR is far above 0.2."""
    fdp = []
    for seed in range(10):
        Z, y, k = _known_signal(seed)
        chosen = np.flatnonzero(_select(Z, y, 0.9, "bh").mask)
        fdp.append(float((chosen >= k).sum()) / max(len(chosen), 1))
    assert np.mean(fdp) > 0.2


def _sites(seed=3):
    Z, y, k = _known_signal(seed, n=900, d=20)
    t = pd.DataFrame(Z, columns=[f"x{j}" for j in range(Z.shape[1])])
    t["target"] = y.astype(int)
    parts = np.array_split(np.arange(len(t)), 3)
    return t, [Site(f"s{i}", t.iloc[p].reset_index(drop=True), "target", test_size=0, seed=i)
               for i, p in enumerate(parts)]


def test_the_federated_selection_equals_the_pooled_rows_and_records_q():
    t, sites = _sites()
    out = run_pooled_score_test(LocalFederation(sites), fdr=0.05, fdr_method="by")
    assert (out.fdr, out.fdr_method) == (0.05, "by")
    pooled = pd.concat([s.rows("train") for s in sites], ignore_index=True)
    X = pooled[out.feature_names].to_numpy(np.float64)
    Z = (X - X.mean(axis=0)) / X.std(axis=0)
    ref = _select(Z, (pooled.target == 1).to_numpy(np.float64), 0.05, "by")
    assert [out.feature_names[i] for i in ref.selected] == out.selected and out.selected
    np.testing.assert_allclose(out.p, ref.p, rtol=1e-6, atol=1e-12)
    assert len(out.steps) == 1  # one correction over every column, no forward steps
    with pytest.raises(ValueError, match=r"fdr must be a false discovery rate in \(0, 1\)"):
        run_pooled_score_test(LocalFederation(_sites()[1]), fdr=1.0)


def test_the_job_runs_fdr_and_records_q_and_the_method(jobs):
    t, sites = _sites()
    spec = spec_from_plan(jobs.plan(election={"method": "score-test", "fdr": 0.1, "fdr_method": "bh"},
                                    training={"rounds": 1, "local_epochs": 1}))
    result = run_workflow(LocalFederation(sites), spec).result
    el = result["election"]
    assert el["fdr"] == {"q": 0.1, "method": "bh"} and el["selected"]
    assert el["selected"] == run_pooled_score_test(LocalFederation(_sites()[1]), fdr=0.1).selected_names
    from fedtab.report.run_sections import election

    html = election(result)
    assert "Benjamini-Hochberg" in html and "q = 0.100" in html and "Pooled p-value" in html


@pytest.mark.parametrize("election, fragment", [
    ({"fdr": 0.05}, "[election] fdr and fdr_method apply to method = \"score-test\""),
    ({"method": "score-test", "fdr": 0}, "[election] fdr must be a false discovery rate in (0, 1), got 0"),
    ({"method": "score-test", "fdr": 1.0}, "[election] fdr must be a false discovery rate in (0, 1)"),
    ({"method": "score-test", "fdr": 0.1, "fdr_method": "holm"}, "[election] fdr_method must be one of ['bh', 'by']"),
    ({"method": "score-test", "fdr_metod": "by"}, "unknown key [election] 'fdr_metod' (did you mean 'fdr_method'?)"),
])
def test_bad_fdr_settings_are_refused(election, fragment, jobs):
    with pytest.raises(JobError, match=re.escape(fragment)):
        jobs.plan(election=election)


def test_an_fdr_level_may_be_a_numpy_number_but_never_a_bool():
    from fedtab.election.score_test import check_fdr

    check_fdr(np.float32(0.1))
    check_fdr(np.float64(0.05), "by")
    for bad in (np.bool_(True), True, np.float64(1.0), np.float32(0.0)):
        with pytest.raises(ValueError, match="fdr must be"):
            check_fdr(bad)
