"""Selection that runs on small, unlike sites (issue 30, item 2): a column unmeasured in a fold's
fit rows, a one-class site, a site too small for folds above its floor — each abstains from what
it cannot answer, is named in the outcome, and the run goes on; only the quorum stops it."""

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import QuorumError, SiteError
from fedtab.federation.workflows.selection import select_model
from fedtab.federation.site.core import Site

FAST = dict(selector="anova", grid=(0.5, 1.0), modes=("none",), contributions=False, rounds=2, local_epochs=2)


def _tables(seed=0, n=200, k=4):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        X = rng.normal(size=(n, 4))
        y = (X[:, 0] + 0.5 * X[:, 1] + rng.normal(0, 0.8, n) > 0).astype(int)
        t = pd.DataFrame(X, columns=["a", "b", "c", "d"])
        t["target"] = y
        out.append(t)
    return out


def _sites(tables, **options):
    return [Site(f"s{i}", t, "target", seed=i, **options) for i, t in enumerate(tables)]


@pytest.mark.parametrize("n_measured", [2, 12])
def test_a_column_measured_only_inside_one_fold_is_not_voted_on_and_the_run_goes_on(n_measured):
    tables = _tables()
    probe = Site("s1", tables[1], "target", seed=1)
    fold0 = probe.parts.indices("fold:0")
    keep = tables[1].index[fold0[:n_measured]]  # d measured in training rows that are all in fold 0: none in fit:0
    tables[1].loc[~tables[1].index.isin(keep), "d"] = np.nan
    sites = _sites(tables)
    np.testing.assert_array_equal(sites[1].parts.indices("fold:0"), fold0)  # the parts ignore the cells
    out = select_model(LocalFederation(sites), **FAST)  # raised "could not broadcast" before
    assert "d" not in out.ballots["s1"].feature_names and "d" in out.ballots["s0"].feature_names
    if n_measured >= sites[1].policy.min_rows:  # a count the server sees: the abstention is named
        assert any("(d)" in n and "fit rows of every fold" in n for n in out.abstentions["s1"])
    else:  # 2 cells: the gate suppresses the count, so d looks unmeasured there (no abstention to name)
        assert out.measured["s1"]["missing_share"]["d"] == 1.0
    assert "s0" not in out.abstentions
    sections = out.result_sections()
    assert sections["selection"]["abstentions"] == out.abstentions
    # every fold ballot of s1 is over the same columns as its training-rows ballot
    reply = sites[1].handle(Message("select_prepare", meta={"selector": "anova"}))
    assert not reply.is_error and list(reply.meta["feature_names"]) == ["a", "b", "c"]
    assert reply.arrays["ballot_mask"].shape == (sites[1].parts.n_folds + 1, 3)


def test_a_one_class_site_abstains_from_ballots_and_site_auroc_but_its_rows_count():
    tables = _tables(seed=1)
    tables[2]["target"] = 0
    out = select_model(LocalFederation(_sites(tables)), **FAST)
    notes = " | ".join(out.abstentions["s2"])
    assert "casts no ballot" in notes and "no within-site CV AUROC" in notes
    assert out.ballots["s2"] is None
    per_site = out.modes["none"]["per_site"]["s2"]
    assert per_site["rows"] > 0 and per_site["auroc"] is None and per_site["logloss"] is not None
    assert out.chosen["auroc"] is not None and 0.5 < out.chosen["auroc"] <= 1.0


def _below_floor(tables):
    """Site s3 with 25 rows, 8 of class 0: with min_rows=10 no folds fit and class 0 is below the floor."""
    t = tables[3]
    tables[3] = pd.concat([t[t.target == 1].iloc[:17], t[t.target == 0].iloc[:8]]).sample(frac=1, random_state=0)
    return tables


def test_a_site_without_folds_above_its_floor_scores_no_fold_and_the_run_goes_on():
    sites = _sites(_below_floor(_tables(seed=2)))
    assert sites[3].parts.n_folds == 0
    out = select_model(LocalFederation(sites), **FAST)  # select_evaluate was refused ("min_rows=10") before
    notes = " | ".join(out.abstentions["s3"])
    assert "scores no cross-validation fold" in notes and "no test rows" in notes
    assert out.modes["none"]["per_site"].get("s3", {"rows": 0})["rows"] == 0
    # it still trained: the chains' weights count its training rows (the model differs without it)
    without = select_model(LocalFederation(_sites(_below_floor(_tables(seed=2)))[:3]), **FAST)
    assert not np.allclose(out.model_all_columns["params"]["coef"], without.model_all_columns["params"]["coef"])


def test_a_curious_server_cannot_use_the_abstention_to_read_a_below_floor_class():
    """The abstaining site releases nothing computed over rows; asking it for a personalised model
    (a release over its training rows) is refused by the per-class floor as before."""
    sites = _sites(_below_floor(_tables(seed=2)))
    fed = LocalFederation(sites)
    select_model(fed, **FAST)  # leaves the chains' setup at every site
    s3 = sites[3]
    M = len(s3.state["select_setup"]["chain_mask"])
    d = len(s3.state["select_setup"]["features"])
    arrays = {"param:coef": np.full((M, 1, d), 0.3), "param:intercept": np.zeros((M, 1))}
    plain = s3.handle(Message("select_evaluate", arrays, {"slots": [[0, "none"]], "stage": "cv", "score_bins": 20}))
    assert not plain.is_error and not plain.is_refusal
    assert not plain.arrays["confusion"].any() and not plain.arrays["logloss_sum"].any()
    assert not plain.arrays["score_hist"].any() and not plain.arrays["rank_pairs"].any()
    ask = s3.handle(Message("select_evaluate", arrays, {"slots": [[0, "none"]], "stage": "cv",
                                                         "send_personal": [0, "intercept"]}))
    assert ask.is_refusal and "min_rows" in ask.meta["reason"]


class _Failing(Site):
    def handle(self, request):
        if request.kind == "select_evaluate":
            return Message.error("broken")
        return super().handle(request)


def test_only_the_quorum_stops_the_selection():
    tables = _tables(seed=3)
    sites = [*_sites(tables[:3]), _Failing("s3", tables[3], "target", seed=3)]
    out = select_model(LocalFederation(sites, min_sites=3), **FAST)
    assert any("dropped" in n and "broken" in n for n in out.abstentions["s3"])
    assert "s3" not in out.test["modes"]["none"]["per_site"]
    sites = [*_sites(tables[:3]), _Failing("s3", tables[3], "target", seed=3)]
    with pytest.raises(QuorumError):
        select_model(LocalFederation(sites, min_sites=4), **FAST)
    sites = [*_sites(tables[:3]), _Failing("s3", tables[3], "target", seed=3)]
    with pytest.raises(SiteError, match="s3"):
        select_model(LocalFederation(sites), **FAST)


# ----------------------------------------------------------------------------- the AUROC guard
from fedtab.election.one_se import Scored, guarded_one_standard_error  # noqa: E402


def _flat():
    """A sparse candidate whose log-loss is within one (paired) SE of all columns."""
    base = np.array([0.44, 0.46, 0.45, 0.47, 0.43])

    def scored(name, kept, shift):
        folds = base + np.asarray(shift)
        return Scored(name, kept, float(folds.mean()), tuple(folds))

    return [scored("3 columns", 3, [0.01, -0.006, 0.008, -0.004, 0.002]),
            scored("20 columns", 20, [0.004, -0.003, 0.003, -0.002, 0.003]),
            scored("all columns", 77, [0.0] * 5)]


def test_the_guard_never_trades_more_than_0_01_auroc_for_sparsity():
    cands = _flat()
    from fedtab.election.one_se import one_standard_error

    assert one_standard_error(cands).chosen.name == "3 columns"  # the plain rule: 3 of 77 columns
    choice, guard = guarded_one_standard_error(cands, [0.794, 0.815, 0.820])
    assert choice.chosen.name == "20 columns" and guard.passed_over == ("3 columns",)
    assert guard.rule_choice == "3 columns" and guard.best == "all columns"
    assert guard.shortfall == pytest.approx(0.005) and not guard.flagged
    # within the tolerance the rule's sparsest choice stands
    choice, guard = guarded_one_standard_error(cands, [0.812, 0.815, 0.820])
    assert choice.chosen.name == "3 columns" and guard.passed_over == ()
    # nothing within one SE ranks well enough: the lowest log-loss among those that do
    choice, guard = guarded_one_standard_error(cands, [0.70, 0.72, 0.80])
    assert choice.chosen.name == "all columns"
    for aucs in ([0.9, 0.5, 0.7], [0.6, 0.61, 0.59], [None, 0.8, 0.81]):
        choice, guard = guarded_one_standard_error(cands, aucs)
        best = max(a for a in aucs if a is not None)
        picked = aucs[[c.name for c in cands].index(choice.chosen.name)]
        assert picked is not None and picked >= best - 0.01 - 1e-12


def test_the_guard_refuses_bad_input():
    cands = _flat()
    with pytest.raises(ValueError, match="AUROCs"):
        guarded_one_standard_error(cands, [0.8, 0.8])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        guarded_one_standard_error(cands, [0.8, 1.8, 0.8])
    with pytest.raises(ValueError, match="tolerance"):
        guarded_one_standard_error(cands, [0.8, 0.8, 0.8], tolerance=float("nan"))
