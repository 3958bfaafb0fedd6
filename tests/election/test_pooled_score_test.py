"""Pooled forward selection by score tests (issue 15): exact from per-site sums, blind to label skew."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.federation.protocol import set_options

from fedtab.election.score_test import pooled_score_selection, score_statistics, site_sums
from fedtab.engines.local import LocalFederation
from fedtab.federation import (FederationError, Message, SiteError, SiteRefused, run_pooled_anova, run_pooled_score_test,
                               run_training)
from fedtab.federation.site.core import Site
from fedtab.privacy import DisclosurePolicy
from tests.builders import write_classification_sites


def _conditional_table(n=1500, noise=8, seed=0):
    """``x1`` and ``x2`` (correlation 0.5) drive ``y`` through ``3·x1 − 1.5·x2``: ``x2`` is
    independent of that combination, so it has no marginal effect at all, only a conditional one."""
    rng = np.random.default_rng(seed)
    x1 = rng.normal(size=n)
    x2 = 0.5 * x1 + np.sqrt(0.75) * rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(3 * x1 - 1.5 * x2)))).astype(int)
    t = pd.DataFrame({"x1": x1, "x2": x2, **{f"n{i}": rng.normal(size=n) for i in range(noise)}})
    t["target"] = y
    return t


def _sites(table, parts, **kw):
    return [Site(f"s{i}", table.iloc[p].reset_index(drop=True), "target", test_size=0, **kw)
            for i, p in enumerate(parts)]


def _label_skewed_parts(y):
    """Five sites: two see only class 0, one only class 1, two a mix."""
    zeros, ones = np.flatnonzero(y == 0), np.flatnonzero(y == 1)
    return [zeros[:300], zeros[300:450], ones[:350], np.r_[zeros[450:], ones[350:500]], ones[500:]]


def _pooled_reference(sites, names, **options):
    """The same procedure on the stacked rows, mean-filled and standardised as the federation does."""
    pooled = pd.concat([s.rows("train") for s in sites], ignore_index=True)
    X = pooled.reindex(columns=names).to_numpy(np.float64)
    mean, std = np.nanmean(X, axis=0), np.nanstd(X, axis=0)
    Z = np.nan_to_num((X - mean) / std)
    y = (pooled.target.astype(str) == sorted(pooled.target.astype(str).unique())[1]).to_numpy(float)
    return pooled_score_selection(Z, y, **options)


def test_federated_run_equals_the_procedure_on_the_pooled_rows():
    t = _conditional_table()
    t.loc[::9, "x2"] = np.nan  # missing cells: filled with the pooled mean, as the training workflow does
    sites = _sites(t, _label_skewed_parts(t.target.to_numpy()))
    sites[0] = Site("s0", sites[0].table.drop(columns=["n3"]), "target", test_size=0)  # a column one site lacks
    out = run_pooled_score_test(LocalFederation(sites), alpha=0.05)
    ref = _pooled_reference(sites, out.feature_names)
    assert [out.feature_names[i] for i in ref.selected] == out.selected
    np.testing.assert_allclose(out.z, ref.z, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(out.p, ref.p, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(out.coef, ref.coef, rtol=1e-8, atol=1e-8)
    assert out.converged and out.stopped == "no feature passes" and out.n_rows == len(t)
    assert set(out.selected) >= {"x1", "x2"} and out.classes == ["0", "1"]
    assert [len(s["added"]) for s in out.steps] == [len(s.added) for s in ref.steps]


def test_finds_a_column_without_marginal_effect_that_the_pooled_anova_misses():
    t = _conditional_table(seed=1)
    fed = LocalFederation(_sites(t, np.array_split(np.arange(len(t)), 3)))
    anova = run_pooled_anova(fed, alpha=0.05)
    assert "x1" in anova.selected_names and "x2" not in anova.selected_names
    out = run_pooled_score_test(fed, alpha=0.05)
    assert out.selected[0] == "x1" and "x2" in out.selected and not any(n.startswith("n") for n in out.selected)
    entered = {n: i for i, s in enumerate(out.steps) for n in s["added"]}
    assert entered["x2"] > entered["x1"]  # found once x1 is in the model
    trained = run_training(fed, out.selected_names, rounds=2, local_epochs=2, eval_part="train")
    assert trained.features == ["x1", "x2"] and trained.pooled["accuracy"] > 0.7


def test_label_skew_changes_nothing_and_one_class_sites_contribute():
    t = _conditional_table(seed=2)
    y = t.target.to_numpy()
    skewed = run_pooled_score_test(LocalFederation(_sites(t, _label_skewed_parts(y))))
    iid = run_pooled_score_test(LocalFederation(_sites(t, np.array_split(np.random.default_rng(0).permutation(len(t)), 5))))
    assert skewed.mask.tolist() == iid.mask.tolist() and skewed.mask.sum() >= 2
    np.testing.assert_allclose(skewed.z, iid.z, rtol=1e-8, atol=1e-8)
    assert {p["step"] for p in skewed.participation} == {"schema", "describe", "score_sums"}
    assert all(len(p["sites"]) == 5 for p in skewed.participation)


def test_wire_format_and_bytes_per_site():
    t = _conditional_table(n=600, seed=3)
    parts = np.array_split(np.arange(len(t)), 3)
    wired = LocalFederation(_sites(t, parts))
    a = run_pooled_score_test(wired)
    b = run_pooled_score_test(LocalFederation(_sites(t, parts), wire=False))
    assert a.selected == b.selected and np.array_equal(a.p, b.p)
    d, m = len(a.feature_names), len(a.selected) + 1
    ups = [r.bytes_up for r in wired.traffic.records if r.kind == "score_sums"]
    assert len(ups) == 3 * (a.exchanges - 1) and max(ups) < 8 * (d * (m + 2) + m * m + m + 1) + 2000


class _Tamper(LocalFederation):
    """Rewrites site ``s1``'s ``score_sums`` replies with ``change(arrays, meta)``."""

    def __init__(self, sites, change):
        super().__init__(sites)
        self.change = change

    def ask(self, requests):
        out = super().ask(requests)
        reply = out.get("s1")
        if reply is not None and reply.kind == "score_sums" and reply.arrays:
            arrays, meta = {k: np.array(v) for k, v in reply.arrays.items()}, dict(reply.meta)
            self.change(arrays, meta)
            out["s1"] = Message("score_sums", arrays, meta)
        return out


def _set(key, fn):
    def change(arrays, meta):
        if key in arrays:
            arrays[key] = fn(arrays[key])
    return change


def _asymmetric(h):
    """From the first step with a selected column on (a 1 × 1 matrix is symmetric)."""
    h = h.copy()
    if h.shape[0] > 1:
        h[0, 1] += 5.0
    return h


@pytest.mark.parametrize("change, reason", [
    (_set("grad", lambda g: g[:-1]), "shape"),
    (_set("hess", lambda h: np.full_like(h, np.nan)), "not finite"),
    (_set("hess", _asymmetric), "'hess' is not symmetric"),
    (_set("hess", lambda h: -h), "'hess' has a diagonal outside"),
    (_set("score", lambda s: s + 1e12), "score 'score' exceeds"),
    (_set("info_diag", lambda v: v * 100), "'info_diag' outside"),
    (_set("info_cross", lambda c: c * 50), "'info_cross' breaks Cauchy-Schwarz"),
    (_set("grad", lambda g: g * 1e6), "gradient 'grad' exceeds"),
    (_set("loglik", lambda ll: -ll), "log-likelihood"),
    (lambda arrays, meta: meta.update(n=meta["n"] + 1), "score rows"),
    (lambda arrays, meta: arrays.update(extra=np.zeros(2)), "exactly"),
])
def test_a_hostile_site_is_refused_by_name(change, reason):
    t = _conditional_table(n=600, seed=4)
    fed = _Tamper(_sites(t, np.array_split(np.arange(len(t)), 3)), change)
    with pytest.raises(SiteError, match=reason) as err:
        run_pooled_score_test(fed)
    assert set(err.value.sites) == {"s1"} and "site 's1'" in str(err.value)


def test_a_lying_site_is_dropped_with_a_quorum():
    t = _conditional_table(n=600, seed=4)
    fed = _Tamper(_sites(t, np.array_split(np.arange(len(t)), 3)), _set("score", lambda s: s + 1e12))
    out = run_pooled_score_test(fed, min_sites=2)
    assert "s1" in fed.dropped and out.participation[-1]["sites"] == ["s0", "s2"]


def test_target_that_is_not_binary_raises():
    t = _conditional_table(n=300, seed=5)
    parts = np.array_split(np.arange(len(t)), 2)
    ones = t[t.target == 1].reset_index(drop=True)
    with pytest.raises(ValueError, match="binary target.*1 class"):
        run_pooled_score_test(LocalFederation(_sites(ones, np.array_split(np.arange(len(ones)), 2))))
    t3 = t.assign(target=t.x1.round(1))  # continuous
    with pytest.raises(ValueError, match="binary target"):
        run_pooled_score_test(LocalFederation(_sites(t3, parts)))
    with pytest.raises(ValueError, match="alpha"):
        run_pooled_score_test(LocalFederation(_sites(t, parts)), alpha=0)


def test_site_policy_min_rows_and_request_cap():
    t = _conditional_table(n=600, seed=6)
    parts = np.array_split(np.arange(len(t)), 3)
    sites = _sites(t, parts)
    sites[2] = Site("s2", sites[2].table, "target", test_size=0, policy={"min_rows": 500})
    with pytest.raises(SiteRefused, match="site 's2' refused.*min_rows=500"):
        run_pooled_score_test(LocalFederation(sites))
    sites[2] = Site("s2", sites[2].table, "target", test_size=0, policy=DisclosurePolicy(max_rounds=3))
    with pytest.raises(SiteRefused, match="site 's2' refused.*max_rounds=3"):
        run_pooled_score_test(LocalFederation(sites))


def test_score_statistics_contract():
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(400, 4))
    Z[:, 3] = Z[:, 0]  # a copy of a selected column: nothing to test
    y = (Z[:, 0] + rng.normal(size=400) > 0).astype(float)
    s = site_sums(Z, y, [0], np.array([0.0, 1.0]), with_score=True)
    z, p = score_statistics(s["score"], s["info_diag"], s["info_cross"], s["hess"])
    assert p[3] == 1.0 and z[3] == 0.0 and p[0] == 1.0 and 0 < p[1] <= 1
    np.testing.assert_array_equal(s["hess"], s["hess"].T)
    with pytest.raises(ValueError, match="coef"):
        site_sums(Z, y, [0], np.zeros(3))
    with pytest.raises(ValueError, match="distinct column indices"):
        site_sums(Z, y, [7], np.zeros(2))
    with pytest.raises(ValueError, match="disagree"):
        score_statistics(s["score"][:2], s["info_diag"], s["info_cross"], s["hess"])
    with pytest.raises(ValueError, match="alpha"):
        pooled_score_selection(Z, y, alpha=1.5)


class _Recorder(LocalFederation):
    """Keeps every ``score_sums`` reply as the server received it; optionally shifts site
    ``s1``'s masked vector (a corrupted contribution to the secure sum)."""

    def __init__(self, sites, shift=0):
        super().__init__(sites)
        self.seen, self.shift = [], shift

    def ask(self, requests):
        out = super().ask(requests)
        for site, reply in out.items():
            if reply.kind == "score_sums":
                if site == "s1" and self.shift:
                    y = np.array(reply.arrays["secagg:y"])
                    y[:1] += np.uint64(self.shift)  # modulo 2**64, as the masked sum is
                    reply = out[site] = Message(reply.kind, {**reply.arrays, "secagg:y": y}, reply.meta)
                self.seen.append(reply)
        return out


def test_secure_aggregation_gives_the_plain_result_from_totals_only():
    t = _conditional_table(n=900, noise=4, seed=7)
    parts = _label_skewed_parts(t.target.to_numpy())[:3]  # two one-class sites and a mixed one
    parts[2] = np.setdiff1d(np.arange(len(t)), np.r_[parts[0], parts[1]])
    plain = run_pooled_score_test(LocalFederation(_sites(t, parts)))
    fed = _Recorder(_sites(t, parts))
    set_options(fed, secure_aggregation=True)
    secure = run_pooled_score_test(fed)
    assert secure.selected == plain.selected and {"x1", "x2"} <= set(secure.selected)
    np.testing.assert_allclose(secure.z, plain.z, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(secure.coef, plain.coef, rtol=1e-5, atol=1e-6)
    assert secure.n_rows == plain.n_rows == len(t)
    # the server received masked vectors only: no site's sums in the clear
    assert fed.seen and all(set(r.arrays) == {"secagg:y", "secagg:shares", "secagg:share_hashes"} for r in fed.seen)
    # a corrupted contribution makes the total implausible: refused (no site can be named)
    with pytest.raises(FederationError, match="secure sum of the sites' score sums is implausible"):
        corrupt = _Recorder(_sites(t, parts), shift=2**60)
        set_options(corrupt, secure_aggregation=True)
        run_pooled_score_test(corrupt)


def test_one_vs_rest_is_the_union_of_each_class_against_the_rest():
    from fedtab.data.synthetic import classification_table
    from fedtab.election.score_test import pooled_table_selection

    t = classification_table(900, 12, 4, 0, n_classes=3, seed=8)
    parts = [np.flatnonzero(t.target == c) for c in (0, 1)] + [np.flatnonzero(t.target == 2)]  # one class per site
    sites = _sites(t, parts)
    with pytest.raises(ValueError, match="one_vs_rest=True"):
        run_pooled_score_test(LocalFederation(sites))
    out = run_pooled_score_test(LocalFederation(sites), one_vs_rest=True)
    assert list(out.by_class) == ["0", "1", "2"] and out.stopped == "one-vs-rest" and out.n_rows == len(t)
    union = np.zeros(len(out.feature_names), dtype=bool)
    for c, run in out.by_class.items():
        ref = pooled_table_selection([s.rows("train") for s in sites], "target", out.feature_names, positive=int(c))
        assert [out.feature_names[i] for i in ref.selected] == run.selected, c
        np.testing.assert_allclose(run.p, ref.p, rtol=1e-8, atol=1e-12)
        union |= ref.mask
    assert out.mask.tolist() == union.tolist() and set(out.selected) == set(out.selected_names)
    assert {s["class"] for s in out.steps} <= {"0", "1", "2"} and out.mask[:4].sum() >= 3


def test_perfect_separation_stops_the_selection_cleanly():
    rng = np.random.default_rng(0)
    t = pd.DataFrame(rng.normal(size=(600, 5)), columns=[f"c{i}" for i in range(5)])
    t["target"] = (t.c0 > 0).astype(int)  # c0 alone separates the classes: no maximum-likelihood fit exists
    out = run_pooled_score_test(LocalFederation(_sites(t, np.array_split(np.arange(600), 3))))
    assert out.stopped == "separation" and not out.converged and out.selected[0] == "c0"
    assert np.isfinite(out.coef).all() and np.abs(out.coef).max() <= 50


def _score_workflow(federation, run_config):
    out = run_pooled_score_test(federation, alpha=0.05)
    return {"selected": out.selected, "p": out.p.tolist(), "stopped": out.stopped}


def test_flower_apps_in_fresh_processes_match_the_local_engine(tmp_path):
    """Every message in a fresh ClientApp process: the setup survives in Flower's Context.state."""
    pytest.importorskip("flwr")
    from fedtab.engines import flower
    from fedtab.engines.site_config import build_site

    configs = write_classification_sites(tmp_path, 600, 12, 4, 0, table_seed=4, split_seed=0)
    local = _score_workflow(LocalFederation([build_site(c) for c in configs]), {})
    result = flower.run_in_process(configs, {}, app=flower.make_server_app(_score_workflow), fresh_processes=True)
    assert result["selected"] == local["selected"] and len(local["selected"]) >= 2
    np.testing.assert_allclose(result["p"], local["p"], rtol=1e-9, atol=1e-15)


def test_a_site_answers_only_a_well_formed_request():
    t = _conditional_table(n=200, noise=2, seed=9)
    site = Site("s", t, "target", test_size=0)
    coef = {"coef": np.zeros(1)}
    assert "not set up" in site.handle(Message("score_sums", coef, {"selected": []})).meta["error"]
    names = site.feature_names
    setup = {"features": names, "classes": ["0", "1"], "part": "train"}
    arrays = {**coef, "setup:mean": np.zeros(len(names)), "setup:std": np.ones(len(names))}
    ok = site.handle(Message("score_sums", arrays, {"selected": [], "setup": setup, "with_score": True}))
    assert set(ok.arrays) == {"grad", "hess", "loglik", "score", "info_diag", "info_cross"} and ok.meta["n"] == 200
    for meta, arr, why in [({"selected": [99]}, {"coef": np.zeros(2)}, "distinct column indices"),
                           ({"selected": []}, {"coef": np.zeros(3)}, "coef must have 1"),
                           ({"selected": [], "positive": 5}, coef, "positive"),
                           ({"selected": "0"}, coef, "list of column indices"),
                           ({"selected": [], "setup": setup}, {**coef, "setup:std": np.zeros(len(names))}, "std > 0")]:
        reply = site.handle(Message("score_sums", arr, meta))
        assert reply.is_error and why in reply.meta["error"], (meta, reply.meta)
    site.state["schema"] = {"columns": names[:2]}  # once a schema is agreed, only its columns
    refused = site.handle(Message("score_sums", arrays, {"selected": [], "setup": setup}))
    assert refused.is_refusal and "not in the agreed schema" in refused.meta["reason"]
