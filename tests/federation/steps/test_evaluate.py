"""AUROC / PR-AUC / Brier / confusion from federated sums, and the baselines."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, brier_score_loss, confusion_matrix, roc_auc_score

from fedtab import LocalFederation, Site, run_training
from fedtab.data import classification_table
from fedtab.federation import HANDLERS, FederationError, Message, run_baselines
from fedtab.learn import make_model
from fedtab.privacy import DisclosurePolicy
from fedtab.learn.metrics import brier_sum, evaluation_scores, ranking_scores, score_histogram
from fedtab.learn.newton import NEWTON_MAX_ITER, NEWTON_TOL
from tests.builders import classification_parts, federation

FEDAVG = {"name": "logistic", "params": {"solver": "fedavg"}}


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 400), st.sampled_from([2, 7, 50, 1000]))
def test_ranking_scores_are_sklearn_on_binned_scores_and_within_bound_of_raw(seed, n, bins):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    y[:2] = [0, 1]
    p = np.clip(rng.normal(0.5 + rng.uniform(-0.3, 0.3) * (y - 0.5), rng.uniform(0.01, 0.4)), 0, 1)
    if seed % 3 == 0:
        p = np.round(p, 2)  # ties in the raw scores too
    r = ranking_scores(score_histogram(y, p, bins))
    binned = np.minimum((p * bins).astype(int), bins - 1)
    assert r["auroc"] == pytest.approx(roc_auc_score(y, binned), abs=1e-12)
    assert r["pr_auc"] == pytest.approx(average_precision_score(y, binned), abs=1e-12)
    assert abs(r["auroc"] - roc_auc_score(y, p)) <= r["auroc_error_bound"] + 1e-12
    assert abs(r["pr_auc"] - average_precision_score(y, p)) <= r["pr_auc_error_bound"] + 1e-12


def test_histograms_pool_exactly_and_one_class_gives_none():
    rng = np.random.default_rng(1)
    parts = [(rng.integers(0, 2, 80), rng.random(80)) for _ in range(3)]
    pooled = sum(score_histogram(y, p) for y, p in parts)
    y = np.concatenate([y for y, _ in parts])
    p = np.concatenate([p for _, p in parts])
    assert np.array_equal(pooled, score_histogram(y, p))
    assert ranking_scores(score_histogram(np.zeros(5), np.full(5, 0.3)))["auroc"] is None
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        score_histogram([0, 1], [0.2, 1.5])
    with pytest.raises(ValueError, match="non-negative"):
        ranking_scores(-np.ones((2, 4)))


def _make_fed(n_classes=2, seed=0, n=600, policy=None):
    table, parts = classification_parts(n, 12, 4, 2, [0.6, 0.3, 0.1], seed=seed, n_classes=n_classes, class_sep=0.8)
    parts[1] = parts[1].drop(columns=["f0"]) if "f0" in parts[1] else parts[1].drop(columns=[parts[1].columns[0]])
    fed = federation(parts, policy=policy)
    return fed, [c for c in table.columns if c != "target"]


def _central_predictions(fed, out):
    """What the sites compute, recomputed with access to every row (test oracle only)."""
    model = make_model(out.model_spec)
    per_site = {}
    for name in fed.sites:
        rows = fed.site(name).rows("test")
        X = rows.reindex(columns=out.features).to_numpy(dtype=float)
        Z = (X - out.mean) / out.std
        Z[np.isnan(Z)] = 0.0
        y = np.array([out.classes.index(str(v)) for v in rows["target"]])
        per_site[name] = (y, model.predict_proba(out.params, Z))
    return per_site


@pytest.mark.parametrize("n_classes", [2, 3])
def test_federated_evaluation_matches_sklearn_on_pooled_predictions(n_classes):
    # min_rows=1: the sites' release gates leave the score histograms exact (no smoothing)
    fed, feats = _make_fed(n_classes, policy=DisclosurePolicy.permissive())
    out = run_training(fed, feats, rounds=4)
    preds = _central_predictions(fed, out)
    y = np.concatenate([v[0] for v in preds.values()])
    proba = np.concatenate([v[1] for v in preds.values()])
    m = out.metrics["pooled"]
    assert m["confusion"] == confusion_matrix(y, proba.argmax(axis=1), labels=range(n_classes)).tolist()
    if n_classes == 2:
        assert m["brier"] == pytest.approx(brier_score_loss(y, proba[:, 1]), abs=1e-12)
        assert abs(m["auroc"] - roc_auc_score(y, proba[:, 1])) <= m["auroc_error_bound"] + 1e-12
        assert abs(m["pr_auc"] - average_precision_score(y, proba[:, 1])) <= m["pr_auc_error_bound"] + 1e-12
        assert m["auroc_error_bound"] < 0.005  # 1000 bins, ~120 test rows
        ys, ps = preds["s1"]  # a site's own AUROC comes from its exact rank pairs
        assert out.metrics["per_site"]["s1"]["auroc"] == pytest.approx(roc_auc_score(ys, ps[:, 1]), abs=1e-12)
        assert out.metrics["per_site"]["s1"]["auroc_error_bound"] == 0.0
    else:
        assert m["brier"] == pytest.approx(brier_score_loss(y, proba, labels=range(3)), abs=1e-12)
        assert "auroc" not in m
    # the historic results are untouched
    assert out.pooled == {k: m[k] for k in ("weighted_f1", "macro_f1", "accuracy", "n")}
    assert set(out.per_site) == set(out.metrics["per_site"]) == set(fed.sites)


def _tamper(monkeypatch, kind, site_name, edit):
    original = HANDLERS[kind]

    def hostile(site, request):
        reply = original(site, request)
        if site.name == site_name:
            arrays = dict(reply.arrays)
            edit(arrays)
            reply = Message(reply.kind, arrays, reply.meta)
        return reply

    monkeypatch.setitem(HANDLERS, kind, hostile)


@pytest.mark.parametrize("edit, match", [
    (lambda a: a.update(score_hist=a["score_hist"] * 2), "s1.*score histogram"),
    (lambda a: a.update(score_hist=a["score_hist"][:, :10]), "s1.*score histogram"),
    (lambda a: a.update(brier_sum=np.array([np.nan])), "s1.*Brier"),
    (lambda a: a.update(brier_sum=np.array([1e9])), "s1.*Brier"),
    (lambda a: a.update(confusion=a["confusion"] - 100), "s1.*confusion"),
    (lambda a: a.update(confusion=a["confusion"] + 0.5), "s1.*confusion"),
])
def test_hostile_evaluation_sums_are_rejected_naming_the_site(monkeypatch, edit, match):
    fed, feats = _make_fed()
    _tamper(monkeypatch, "evaluate", "s1", edit)
    with pytest.raises(FederationError, match=match):
        run_training(fed, feats, rounds=1)


def test_baselines_majority_and_local_only():
    fed, feats = _make_fed(seed=3)
    out = run_training(fed, feats, rounds=5)
    base = run_baselines(fed, out)
    train = pd.concat([fed.site(s).rows("train") for s in fed.sites])["target"].astype(str)
    test = pd.concat([fed.site(s).rows("test") for s in fed.sites])["target"].astype(str)
    majority = train.value_counts().idxmax()
    maj = base["majority"]
    assert maj["class"] == majority
    assert maj["pooled"]["accuracy"] == pytest.approx((test == majority).mean())
    assert maj["pooled"]["auroc"] == 0.5
    assert maj["pooled"]["pr_auc"] == pytest.approx((test == out.classes[1]).mean())
    prior = (train == out.classes[1]).mean()
    assert maj["pooled"]["brier"] == pytest.approx(brier_score_loss(test == out.classes[1], np.full(len(test), prior)))
    local = base["local_only"]
    assert set(local["per_site"]) == set(fed.sites)
    pooled_cm = sum(np.array(m["confusion"]) for m in local["per_site"].values())
    assert local["pooled"]["confusion"] == pooled_cm.tolist()
    # Newton: the local budget is the federated run's solver — to the local MLE when the run converged
    converged = out.steps[-1] < NEWTON_TOL
    assert local["newton_iterations"] == (NEWTON_MAX_ITER if converged else out.rounds)
    fedavg = run_training(fed, feats, model=FEDAVG, rounds=5)
    assert run_baselines(fed, fedavg)["local_only"]["epochs"] == 5 * fedavg.local_epochs
    # federating helps on this table (12 features, 36 training rows at s2)
    assert out.metrics["pooled"]["auroc"] > local["pooled"]["auroc"]


def test_local_only_of_a_single_site_is_the_federated_model():
    table = classification_table(300, 8, 3, 2, 0, seed=4, class_sep=0.8)
    fed = LocalFederation([Site("only", table, "target")])
    feats = [c for c in table.columns if c != "target"]
    # Newton stopped at its cap (1 iteration) and run to convergence, FedAvg, and an exact model: the
    # baseline trains the federated run's solver with its budget, so one site alone is the federated model
    for model, rounds in (("logistic", 1), ("logistic", 25), (FEDAVG, 1), ("gnb", 1)):
        out = run_training(fed, feats, model=model, rounds=rounds, local_epochs=7)
        local = run_baselines(fed, out)["local_only"]["per_site"]["only"]
        fed_m = out.metrics["per_site"]["only"]
        assert local.pop("confusion") == fed_m.pop("confusion")
        for key in ("auroc_bounds", "pr_auc_bounds"):
            assert local.pop(key) == pytest.approx(fed_m.pop(key))
        assert local == pytest.approx(fed_m)


def test_hostile_training_counts_are_rejected(monkeypatch):
    fed, feats = _make_fed()
    out = run_training(fed, feats, rounds=1)
    _tamper(monkeypatch, "local_baseline", "s2", lambda a: a.update(train_counts=a["train_counts"] + 1000))
    with pytest.raises(FederationError, match="s2.*class counts"):
        run_baselines(fed, out)


def test_evaluation_scores_brier_and_confusion_from_sums():
    y = np.array([0, 1, 2, 1])
    proba = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4], [0.5, 0.4, 0.1]])
    cm = confusion_matrix(y, proba.argmax(axis=1), labels=range(3))
    s = evaluation_scores(cm, None, brier_sum(y, proba))
    assert s["brier"] == pytest.approx(brier_score_loss(y, proba, labels=range(3)))
    assert s["confusion"] == cm.tolist() and "auroc" not in s


def test_under_the_default_floor_histograms_are_smoothed_and_site_aucs_stay_exact():
    """min_rows=10: no histogram count of fewer than 10 rows leaves a site; each site's AUROC is
    still exact (its rank pairs), the pooled one is an interval that holds the exact AUROC."""
    fed, feats = _make_fed(2)
    out = run_training(fed, feats, rounds=4)
    preds = _central_predictions(fed, out)
    evaluated = [s for s in fed.sites if len(preds[s][0])]
    for s in evaluated:
        ys, ps = preds[s]
        assert out.metrics["per_site"][s]["auroc"] == pytest.approx(roc_auc_score(ys, ps[:, 1]), abs=1e-12)
    y = np.concatenate([preds[s][0] for s in evaluated])
    p = np.concatenate([preds[s][1] for s in evaluated])
    pooled = out.metrics["pooled"]
    lo, hi = pooled["auroc_bounds"]
    assert lo - 1e-12 <= roc_auc_score(y, p[:, 1]) <= hi + 1e-12 and lo <= pooled["auroc"] <= hi
    assert pooled["auroc_error_bound"] == pytest.approx(max(pooled["auroc"] - lo, hi - pooled["auroc"]))
    lo, hi = pooled["pr_auc_bounds"]
    assert lo - 1e-12 <= average_precision_score(y, p[:, 1]) <= hi + 1e-12


# ----------------------------------------------------------------------------- pooled AUROC bounds (issue 30)
def _unlike_sites(sizes, seed=0):
    """Small sites that differ in size, base rate and score location (the pooled AUROC is not any
    site's): numeric ``f0..f3`` and ``target``."""
    rng = np.random.default_rng(seed)
    parts = []
    for k, n in enumerate(sizes):
        X = rng.normal(size=(n, 4)) + 0.4 * k
        p = 1 / (1 + np.exp(-(1.5 * X[:, 0] - X[:, 1] + X[:, 2] * 0.5 - 0.4 * k + rng.normal(0, 0.5))))
        frame = pd.DataFrame(X, columns=[f"f{j}" for j in range(4)])
        frame["target"] = (rng.random(n) < p).astype(int)
        parts.append(frame)
    return parts


def _auc(y, p):
    return roc_auc_score(y, p) if len(set(y)) == 2 else float("nan")


def _pooled_exact(fed, out):
    preds = _central_predictions(fed, out)
    y = np.concatenate([v[0] for v in preds.values()])
    p = np.concatenate([v[1][:, 1] for v in preds.values()])
    return preds, roc_auc_score(y, p), average_precision_score(y, p)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 100_000), st.integers(1, 5), st.booleans(), st.sampled_from([1, 5, 10]))
def test_pooled_ranking_bounds_hold_for_any_sites(seed, n_sites, with_pairs, min_rows):
    """Random sites (sizes, base rates, score shifts, tied scores), histograms smoothed by the
    release gate's own function or exact, with or without each site's rank pairs: the exact
    AUROC / PR-AUC of the pooled predictions lie inside the bounds, and so do the points."""
    from fedtab.learn.metrics import pooled_ranking, rank_pairs
    from fedtab.privacy.gate import smooth_histogram

    rng = np.random.default_rng(seed)
    ys, ps, hists, pairs, smoothed = [], [], [], [], []
    for _ in range(n_sites):
        n = int(rng.integers(2 * min_rows, 150))
        y = rng.integers(0, 2, n)
        y[:min_rows], y[min_rows:2 * min_rows] = 0, 1
        p = np.clip(rng.normal(0.5 + rng.uniform(-0.3, 0.3) + rng.uniform(0, 0.4) * (y - 0.5), rng.uniform(0.01, 0.3)),
                    0, 1)
        if rng.random() < 0.3:
            p = np.round(p, 2)  # ties in the raw scores
        h = score_histogram(y, p).astype(float)
        smooth = bool(rng.random() < 0.7)
        hists.append(smooth_histogram(h, min_rows) if smooth else h)
        smoothed.append(smooth)
        pairs.append(rank_pairs(y, p) if with_pairs and rng.random() < 0.8 else None)
        ys.append(y)
        ps.append(p)
    r = pooled_ranking(hists, pairs, smoothed)
    y, p = np.concatenate(ys), np.concatenate(ps)
    for key, exact in (("auroc", roc_auc_score(y, p)), ("pr_auc", average_precision_score(y, p))):
        lo, hi = r[f"{key}_bounds"]
        assert lo - 1e-12 <= exact <= hi + 1e-12, key
        assert lo <= r[key] <= hi and abs(r[key] - exact) <= r[f"{key}_error_bound"] + 1e-12, key


@pytest.mark.parametrize("model", ["logistic", "gbdt"])
@pytest.mark.parametrize("secure", [False, True])
def test_the_pooled_auroc_holds_the_exact_auroc_of_the_same_predictions(secure, model):
    """Four small, unlike sites under the default floor (min_rows=10): plain, the sites' smoothed
    histograms leave cross-site pairs unordered and the reported bounds hold the exact AUROC and
    PR-AUC of the same predictions; secure, the summed histograms are exact (the 1,000-bin grid's
    bound only). Each site's own AUROC equals the exact one on its rows."""
    from fedtab.federation.protocol import set_options

    # plain GBDT answers over the server's tree nodes only where the sites opted in (issue 28)
    opt_in = {"policy": {"allow_server_row_sets": True}} if model == "gbdt" and not secure else {}
    fed = federation(_unlike_sites([90, 130, 160, 220], seed=3), **opt_in)
    if secure:
        set_options(fed, secure_aggregation=True)
    feats = [f"f{j}" for j in range(4)]
    if model == "gbdt":
        from fedtab.federation.workflows.gbdt import run_gbdt

        out = run_gbdt(fed, feats, params={"n_trees": 5, "max_depth": 3, "learning_rate": 0.3})
        m = out.metrics
        proba = {s: out.model.predict_proba(fed.site(s).rows("test")[feats].to_numpy(float)) for s in fed.sites}
        ys = {s: np.array([int(v) for v in fed.site(s).rows("test")["target"]]) for s in fed.sites}
        y, p = np.concatenate(list(ys.values())), np.concatenate([proba[s][:, 1] for s in fed.sites])
        exact, exact_pr = roc_auc_score(y, p), average_precision_score(y, p)
        site_auc = {s: _auc(ys[s], proba[s][:, 1]) for s in fed.sites}
    else:
        out = run_training(fed, feats, rounds=3)
        m = out.metrics
        preds, exact, exact_pr = _pooled_exact(fed, out)
        site_auc = {s: _auc(preds[s][0], preds[s][1][:, 1]) for s in fed.sites}
    pooled = m["pooled"]
    lo, hi = pooled["auroc_bounds"]
    assert lo - 1e-9 <= exact <= hi + 1e-9
    assert abs(pooled["auroc"] - exact) <= pooled["auroc_error_bound"] + 1e-9
    plo, phi = pooled["pr_auc_bounds"]
    assert plo - 1e-9 <= exact_pr <= phi + 1e-9
    if secure:
        # exact histograms: only pairs inside one of the 1,000 bins are unordered (a few trees' scores cluster)
        assert m["per_site"] == {} and hi - lo < (0.01 if model == "logistic" else 0.05)
    else:
        assert hi - lo > 0.05  # smoothed runs of >= 10 of ~20-40 test rows: wide, and said so (never a bare point)
        assert sum(not np.isnan(a) for a in site_auc.values()) >= 3
        for s, auc in site_auc.items():
            if np.isnan(auc):  # a one-class test part: no AUROC
                assert m["per_site"][s]["auroc"] is None
                continue
            assert m["per_site"][s]["auroc"] == pytest.approx(auc, abs=1e-9)
            assert m["per_site"][s]["auroc_bounds"] == pytest.approx([auc, auc], abs=1e-9)


def test_the_pooled_auroc_bound_is_narrow_on_sites_of_realistic_size():
    """Four sites of 1,000–2,500 rows (200–500 test rows) under min_rows=10: the interval is under 0.1 wide and holds
    the exact AUROC (a point estimate alone could not be trusted to this width)."""
    fed = federation(_unlike_sites([1000, 1500, 2000, 2500], seed=5))
    out = run_training(fed, [f"f{j}" for j in range(4)], rounds=3)
    _, exact, _ = _pooled_exact(fed, out)
    lo, hi = out.metrics["pooled"]["auroc_bounds"]
    assert lo <= exact <= hi and hi - lo < 0.1  # measured: [0.785, 0.874] around 0.839


def test_bounds_from_smoothed_runs_hold_for_any_order_inside_a_run():
    """The bounds hold whatever the scores inside the gate's runs; an adversarial placement (every
    positive at the bottom / top of its run) reaches them, so they cannot be narrowed from runs."""
    from fedtab.learn.metrics import pooled_ranking, rank_pairs
    from fedtab.privacy.gate import smooth_histogram

    rng = np.random.default_rng(11)
    ys, ps = [], []
    for k in range(3):
        y = np.r_[np.zeros(25, int), np.ones(15, int)]
        ys.append(y)
        ps.append(np.clip(rng.normal(0.35 + 0.1 * k + 0.3 * y, 0.15), 0, 1))
    hists = [smooth_histogram(score_histogram(y, p).astype(float), 10) for y, p in zip(ys, ps)]
    r = pooled_ranking(hists, [rank_pairs(y, p) for y, p in zip(ys, ps)], True)
    y, p = np.concatenate(ys), np.concatenate(ps)
    lo, hi = r["auroc_bounds"]
    assert lo <= roc_auc_score(y, p) <= hi
    within = sum(rank_pairs(y, p) for y, p in zip(ys, ps)) / (3 * 25 * 15)  # the sites' own AUROC, pooled
    assert r["auroc"] == pytest.approx(lo + within * (hi - lo))  # an unordered pair counts as the sites' own do
    # an exact histogram (no smoothing) is known by bins: the bound is the old same-bin one
    exact = [score_histogram(y, p) for y, p in zip(ys, ps)]
    r2 = pooled_ranking(exact, [None] * 3, False)
    assert r2["auroc_error_bound"] == pytest.approx(ranking_scores(sum(exact))["auroc_error_bound"], abs=1e-12)
    assert r2["auroc"] == pytest.approx(ranking_scores(sum(exact))["auroc"], abs=1e-12)
    with pytest.raises(ValueError, match="rank pairs"):
        pooled_ranking(exact, [None], False)


def test_robust_pooled_scores_carry_the_medians_of_the_sites_bounds():
    """Robust mode: the pooled AUROC is the median of the sites' (exact) ones, and the pooled
    PR-AUC's bounds, medians of the sites' bounds, hold the median of the sites' exact PR-AUCs."""
    from fedtab.federation.protocol import set_options

    fed = federation(_unlike_sites([300, 300, 400], seed=8))
    set_options(fed, robust=True)
    out = run_training(fed, [f"f{j}" for j in range(4)], rounds=2)
    preds = _central_predictions(fed, out)
    pooled = out.metrics["pooled"]
    med = float(np.median([roc_auc_score(y, p[:, 1]) for y, p in preds.values()]))
    assert pooled["auroc"] == pytest.approx(med, abs=1e-9)
    assert pooled["auroc_bounds"] == pytest.approx([med, med], abs=1e-9)
    lo, hi = pooled["pr_auc_bounds"]
    assert lo <= float(np.median([average_precision_score(y, p[:, 1]) for y, p in preds.values()])) <= hi


def _trained_site():
    table, parts = classification_parts(450, 6, 3, 2, seed=1, class_sep=1.5)
    fed = federation(parts)
    out = run_training(fed, [c for c in table.columns if c != "target"], rounds=1, seed=0, eval_every=0)
    from fedtab.federation.steps.params import params_to

    return fed._sites["s0"], params_to(out.params)


def test_the_evaluate_handler_computes_exact_sums_and_the_site_noises_them_at_the_declared_sensitivities(monkeypatch):
    import fedtab.privacy.dp as dp
    from fedtab.federation.protocol.kinds import declared

    site, params = _trained_site()
    z = 3.0
    meta = {"part": "test"}  # under DP an evaluation is its confusion matrix only
    spec = {"z": z, "bounds": [-6, 6], "clip": 1.0}
    exact = HANDLERS["evaluate"](site, Message("evaluate", params, {**meta, "dp": spec}))
    plain = HANDLERS["evaluate"](site, Message("evaluate", params, meta))
    for k in plain.arrays:  # the handler has no DP branch: its sums are the exact ones
        np.testing.assert_array_equal(exact.arrays[k], plain.arrays[k])
    monkeypatch.setattr(dp, "noise_rng", lambda: np.random.default_rng(7))
    reply = site.handle(Message("evaluate", params, {**meta, "dp": spec}))
    assert not (reply.is_error or reply.is_refusal), reply.meta
    z_site = max(z, dp.site_noise_floor(site.policy.max_epsilon_per_release, site.policy.delta))
    sens = declared("evaluate").releases.dp_noise
    rng = np.random.default_rng(7)
    assert list(reply.arrays) == list(exact.arrays)
    for k, v in exact.arrays.items():  # noise drawn in the reply's order, N(0, (z Δ)²) with Δ as declared
        expected = np.asarray(v, np.float64) + rng.normal(0.0, z_site * sens[k], size=np.shape(v))
        np.testing.assert_allclose(reply.arrays[k], expected, rtol=0, atol=1e-12)
    assert set(sens) == {"confusion"} and sens["confusion"] == pytest.approx(np.sqrt(2.0))


def test_score_sums_asked_under_dp_never_leave():
    """A curious server asks a DP evaluation for score sums too: a rank-pair count moves by up to the other
    class's size when one row is replaced, so no noise at Δ = √2 covers it — the site answers an error and
    none of the score sums leaves (the declaration says: under DP, the confusion matrix only)."""
    site, params = _trained_site()
    reply = site.handle(Message("evaluate", params, {"part": "test", "score_bins": 8,
                                                     "dp": {"z": 3.0, "bounds": [-6, 6], "clip": 1.0}}))
    assert reply.is_error and not {"rank_pairs", "score_hist", "brier_sum", "confusion"} & set(reply.arrays)


def test_an_array_without_a_declared_sensitivity_never_leaves_under_dp(monkeypatch):
    from fedtab.federation.site import registry

    site, params = _trained_site()
    real = registry.HANDLERS["evaluate"]

    def leaky(s, request):
        r = real(s, request)
        return Message(r.kind, {**r.arrays, "leak": np.array([42.0])}, r.meta)

    monkeypatch.setitem(registry.HANDLERS, "evaluate", leaky)
    reply = site.handle(Message("evaluate", params, {"part": "test", "dp": {"z": 3.0, "bounds": [-6, 6], "clip": 1.0}}))
    assert reply.is_error and "leak" not in reply.arrays and "no declared sensitivity" in str(reply.meta)
