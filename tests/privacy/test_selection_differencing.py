"""A curious server against model selection and the site's parts (issue 28, items 2 and 5).

One test per attack: rare classes left out of the folds (``Σₖ fit:k − (K−1)·train``), many
crafted models in one request, crafted huge / non-finite parameters and standardisations,
and selectors (the server's or the job's own) beyond the site's work caps. Every test
asserts that nothing below ``min_rows`` rows is recovered: the site refuses before it
computes anything, or every combination of its replies is over 0 or ``>= min_rows`` rows.
"""

import itertools

import numpy as np
import pandas as pd
import pytest

from fedtab import Site
from fedtab.federation import Message
from fedtab.federation.site.parts import RowParts, check_parts, draw_parts, fixed_parts
from fedtab.privacy import DisclosurePolicy

MIN_ROWS = 10
RARE = {"r1": 1, "r2": 2, "r7": 7}


def _rare_table(seed: int = 0) -> pd.DataFrame:
    """Two common classes, a 15-row class (room for one fold only) and 1-, 2-, 7-row classes;
    ``secret`` is a distinct value per row, so any release that isolates a row shows it."""
    rng = np.random.default_rng(seed)
    y = ["a"] * 150 + ["b"] * 100 + ["m"] * 15 + [c for c, n in RARE.items() for _ in range(n)]
    rng.shuffle(y)
    n = len(y)
    return pd.DataFrame({"secret": 1000.0 + rng.permutation(n) * 7.0, "z": rng.normal(size=n), "target": y})


def _site(table: pd.DataFrame, **policy) -> Site:
    return Site("hospital", table, "target", policy=DisclosurePolicy(min_rows=MIN_ROWS, **policy))


# ----------------------------------------------------------------------------- fold exclusion
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rare_classes_are_in_no_part_and_every_combination_of_parts_holds_min_rows_per_class(seed):
    table = _rare_table(seed)
    site = _site(table, max_evaluations=10**6)
    labels = table["target"].astype(str).to_numpy()
    rare_rows = set(np.flatnonzero(np.isin(labels, list(RARE))).tolist())
    assert site.parts.n_folds >= 2
    sizes = site.part_sizes()
    parts = {p: set(site.parts.indices(p).tolist()) for p in sizes}
    for p, rows in parts.items():  # the 1-, 2- and 7-row classes are in no part, "all" included
        assert not rows & rare_rows, p
    # the 15-row class lies wholly in one fold (>= min_rows there, none elsewhere)
    m_per_fold = [int((labels[site.parts.indices(f"fold:{k}")] == "m").sum()) for k in range(site.parts.n_folds)]
    assert sorted(m_per_fold)[-1] == 15 and sum(m_per_fold) == 15
    # every signed combination of parts (differences, Σ fit:k − (K−1)·train, train − Σ folds, all − train − test)
    # is a sum of atoms: per class 0 or >= min_rows rows
    assert check_parts(site.parts, labels, MIN_ROWS) == []
    for a, b in itertools.combinations(parts, 2):
        for cls in np.unique(labels):
            diff = {r for r in parts[a] ^ parts[b] if labels[r] == cls}
            assert len(diff) == 0 or len(diff) >= MIN_ROWS, (a, b, cls, len(diff))


def test_the_folds_reply_isolates_no_row_of_a_rare_class():
    """The issue's probe: ``Σₖ fit:k − (K−1)·train`` of one ``select_prepare`` reply was the
    rows of the classes too small for folds (a 1-row class's full row)."""
    table = _rare_table()
    site = _site(table)
    reply = site.handle(Message("select_prepare"))
    assert not reply.is_refusal and not reply.is_error, reply.meta
    K = reply.meta["n_folds"]
    assert K >= 2
    for name in ("moment_count", "moment_sum", "moment_sumsq"):
        a = np.asarray(reply.arrays[name], dtype=np.float64)  # (K + 1, d): fit:0 … fit:K-1, train
        leftover = a[:K].sum(axis=0) - (K - 1) * a[K]
        np.testing.assert_allclose(leftover, 0.0, atol=1e-6 * max(1.0, np.abs(a).max()))
    # and the describe replies: all − train − test and train − Σ folds are empty too
    d = {p: site.handle(Message("describe", meta={"part": p})) for p in ["all", "train", "test"]
         + [f"fold:{k}" for k in range(K)]}
    assert all(not r.is_refusal for r in d.values()), {p: r.meta for p, r in d.items() if r.is_refusal}
    for key in ("count", "sum", "sumsq"):
        get = {p: np.asarray(r.arrays[key], np.float64) for p, r in d.items()}
        scale = max(1.0, float(np.abs(get["all"]).max()))
        np.testing.assert_allclose(get["all"] - get["train"] - get["test"], 0.0, atol=1e-9 * scale)
        np.testing.assert_allclose(get["train"] - sum(get[f"fold:{k}"] for k in range(K)), 0.0, atol=1e-9 * scale)
    # no rare row's value is in the training part's sums: they were computed without those rows
    labels = table["target"].astype(str).to_numpy()
    kept = ~np.isin(labels, list(RARE))
    assert d["all"].arrays["sum"][0] == pytest.approx(table["secret"].to_numpy()[kept].sum())
    assert d["all"].arrays["count"][0] == kept.sum() < len(table)


@pytest.mark.parametrize("n_rare", [1, 2, 7])
def test_given_splits_leave_a_rare_class_out_of_every_part(n_rare):
    rng = np.random.default_rng(n_rare)
    labels = np.array(["a"] * 120 + ["b"] * 60 + ["r"] * n_rare + ["a"] * 30 + ["b"] * 20 + ["r"] * n_rare)
    parts = fixed_parts(120 + 60 + n_rare, 50 + n_rare, labels, folds=5, min_rows=MIN_ROWS, seed=int(rng.integers(9)))
    rare = set(np.flatnonzero(labels == "r").tolist())
    for p in parts.sizes():
        assert not set(parts.indices(p).tolist()) & rare, p
    assert check_parts(parts, labels, MIN_ROWS) == []
    assert parts.sizes()["all"] == len(labels) - 2 * n_rare


def test_given_unlabelled_parts_below_the_floor_are_left_out():
    few_train = fixed_parts(5, 40, None, folds=5, min_rows=MIN_ROWS, seed=0)
    assert few_train.sizes()["train"] == 0 and few_train.sizes()["all"] == 40
    few_test = fixed_parts(40, 5, None, folds=5, min_rows=MIN_ROWS, seed=0)
    assert few_test.sizes()["test"] == 0 and few_test.sizes()["all"] == 40
    for parts in (few_train, few_test):
        assert check_parts(parts, None, MIN_ROWS) == []


def test_parts_that_break_the_rule_are_reported():
    labels = np.array(["a"] * 40 + ["b"] * 3)
    idx = np.arange(len(labels))
    bad = RowParts(len(labels), idx, idx[:0], (idx[0::2], idx[1::2]))  # the 3 b-rows split 2 + 1 over the folds
    problems = check_parts(bad, labels, MIN_ROWS)
    assert problems and all("below min_rows" in p for p in problems)
    # the site's own draw of the same rows leaves the 3 b-rows out instead
    good = draw_parts(len(labels), labels, test_size=0.0, folds=2, min_rows=MIN_ROWS, seed=0)
    assert check_parts(good, labels, MIN_ROWS) == [] and not set(good.indices("all").tolist()) & {40, 41, 42}


def test_unsupervised_and_above_floor_sites_keep_their_split():
    """Nothing changes for a site whose classes are all above the floors: same test rows, same folds."""
    rng = np.random.default_rng(5)
    labels = rng.choice(["x", "y"], size=300, p=[0.6, 0.4])
    parts = draw_parts(300, labels, test_size=0.2, folds=5, min_rows=MIN_ROWS, seed=3)
    assert len(parts.excluded) == 0 and parts.n_folds == 5 and parts.sizes()["all"] == 300
    free = draw_parts(300, None, test_size=0.2, folds=5, min_rows=MIN_ROWS, seed=3)
    assert free.n_folds == 5 and len(free.test) == 60 and check_parts(free, None, MIN_ROWS) == []


# ----------------------------------------------------------------------------- crafted chains
FEATURES = ["secret", "z"]


def _chains(M: int, *, mean=None, std=None, coef=None, intercept=None, l2=None, folds=None) -> Message:
    """A ``select_fit`` request that sets up ``M`` chains (the server's masks, means, stds, coefficients)."""
    d = len(FEATURES)
    arrays = {"setup:masks": np.ones((1, d), bool), "setup:chain_mask": np.zeros(M, np.int64),
              "setup:chain_fold": np.asarray(folds if folds is not None else np.arange(M) % 2, np.int64),
              "setup:mean": np.zeros((M, d)) if mean is None else mean,
              "setup:std": np.ones((M, d)) if std is None else std,
              "setup:chain_l2": np.full(M, 1e-3) if l2 is None else l2,
              "param:coef": np.zeros((M, 1, d)) if coef is None else coef,
              "param:intercept": np.zeros((M, 1)) if intercept is None else intercept}
    meta = {"setup": {"features": FEATURES, "classes": ["a", "b"], "model": {"name": "logistic", "params": {}},
                      "without": [""] * M}, "epochs": 1}
    return Message("select_fit", arrays, meta)


def _binary_table(n: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    t = pd.DataFrame({"secret": 1000.0 + rng.permutation(n) * 7.0, "z": rng.normal(size=n)})
    t["target"] = np.where(t["z"] + rng.normal(0, 1, n) > 0, "a", "b")
    return t


def _step_models(site: Site, M: int) -> dict[str, np.ndarray]:
    """``M`` step functions on ``secret`` (one threshold each): the probe's crafted models."""
    values = np.sort(site.table["secret"].to_numpy())
    thresholds = np.linspace(values[0], values[-1], M)
    return {"mean": np.column_stack([thresholds, np.zeros(M)]), "std": np.full((M, 2), 1e-3),
            "coef": np.tile(np.array([[[1e6, 0.0]]]), (M, 1, 1))}


def test_many_crafted_models_in_one_request_are_refused_before_any_work():
    site = _site(_binary_table())
    M = 20_005
    crafted = _step_models(site, M)
    reply = site.handle(_chains(M, mean=crafted["mean"], std=crafted["std"], coef=crafted["coef"]))
    assert reply.is_refusal and reply.arrays == {}
    assert "max_models_per_request" in reply.meta["reason"] and "secure sum" in reply.meta["reason"]
    assert "select_setup" not in site.state  # refused before the handler: no setup, no fit
    assert site.ledger.run_count("local", "fit") == 0
    # the same request with secure-aggregation or DP meta is no longer refused by this rule; nor
    # with the operator's opt-in (shown with a small cap, to keep the test fast)
    opted = _site(_binary_table(), max_models_per_request=4, allow_server_row_sets=True)
    small = _step_models(opted, 5)
    reply = opted.handle(_chains(5, mean=small["mean"], std=small["std"], coef=small["coef"]))
    assert not reply.is_refusal and reply.arrays["param:coef"].shape == (5, 1, 2)
    strict = _site(_binary_table(), max_models_per_request=4)
    assert "max_models_per_request=4" in strict.handle(
        _chains(5, mean=small["mean"], std=small["std"], coef=small["coef"])).meta["reason"]


def test_every_model_of_an_evaluation_is_one_evaluation_of_its_fold():
    """The probe sent 20,005 models in one ``select_evaluate``, charged as 1 of 500: now each
    slot is charged to the fold it is scored on, all or nothing, and the cap stops the sweep."""
    site = _site(_binary_table(), max_evaluations=25, max_models_per_request=100)
    M = 20
    crafted = _step_models(site, M)
    assert not site.handle(_chains(M, mean=crafted["mean"], std=crafted["std"], coef=crafted["coef"])).is_refusal
    params = {"param:coef": crafted["coef"], "param:intercept": np.zeros((M, 1))}
    slots = [[m, "none"] for m in range(M)]  # chains alternate folds 0 and 1: 10 models per fold
    reply = site.handle(Message("select_evaluate", params, {"slots": slots, "stage": "cv"}))
    assert not reply.is_refusal, reply.meta
    assert site.ledger.run_count(site.run_id, "evaluate:fold:0") == 10 and site.ledger.run_count(site.run_id, "evaluate:fold:1") == 10
    # 10 more per fold make 20 of the cap of 25; the next 10 per fold would pass it: refused, nothing charged
    assert not site.handle(Message("select_evaluate", params, {"slots": slots, "stage": "cv"})).is_refusal
    before = site.ledger.snapshot()
    reply = site.handle(Message("select_evaluate", params, {"slots": slots, "stage": "cv"}))
    assert reply.is_refusal and "max_evaluations=25" in reply.meta["reason"] and reply.arrays == {}
    assert site.ledger.snapshot() == before


def test_more_slots_than_the_per_request_cap_are_refused():
    site = _site(_binary_table(), max_models_per_request=10)
    assert not site.handle(_chains(4)).is_refusal
    params = {"param:coef": np.zeros((4, 1, 2)), "param:intercept": np.zeros((4, 1))}
    slots = [[m % 4, "none"] for m in range(11)]
    reply = site.handle(Message("select_evaluate", params, {"slots": slots, "stage": "cv"}))
    assert reply.is_refusal and "max_models_per_request=10" in reply.meta["reason"]
    assert site.ledger.run_count(site.run_id, "evaluate:fold:0") == 0


@pytest.mark.parametrize("field, value, words", [
    ("coef", np.full((2, 1, 2), 1e308), "max_model_abs"),
    ("coef", np.array([[[np.nan, 0.0]], [[0.0, 0.0]]]), "max_model_abs"),
    ("intercept", np.array([[np.inf], [0.0]]), "max_model_abs"),
    ("coef", np.zeros((2, 1, 3)), "shape"),
    ("mean", np.array([[np.inf, 0.0], [0.0, 0.0]]), "means"),
    ("mean", np.full((2, 2), 1e300), "means"),
    ("std", np.zeros((2, 2)), "stds"),
    ("std", -np.ones((2, 2)), "stds"),
    ("std", np.full((2, 2), 1e-300), "stds"),
    ("std", np.ones((3, 2)), "shape"),
    ("l2", np.array([np.nan, 1.0]), "L2"),
    ("l2", np.array([1e300, 1.0]), "L2"),
    ("folds", np.array([-5, 0]), "folds"),
])
def test_crafted_parameters_and_standardisations_are_refused(field, value, words):
    site = _site(_binary_table())
    reply = site.handle(_chains(2, **{field: value}))
    assert reply.is_refusal and words in reply.meta["reason"], reply.meta
    assert "select_setup" not in site.state


def test_a_crafted_model_sent_for_evaluation_is_refused():
    site = _site(_binary_table())
    assert not site.handle(_chains(2)).is_refusal
    for coef in (np.full((2, 1, 2), 1e308), np.full((2, 1, 2), np.nan), np.zeros((3, 1, 2))):
        reply = site.handle(Message("select_evaluate", {"param:coef": coef, "param:intercept": np.zeros((2, 1))},
                                    {"slots": [[0, "none"], [1, "none"]], "stage": "cv"}))
        assert reply.is_refusal and ("max_model_abs" in reply.meta["reason"] or "shape" in reply.meta["reason"])
    assert site.ledger.run_count(site.run_id, "evaluate:fold:0") == 0


def test_the_chains_work_is_counted_against_max_work():
    """20 chains of 1 local epoch on 250 rows: each chain's fit is one model's work."""
    from fedtab.learn.models import model_cost

    site = _site(_binary_table())
    one = model_cost({"name": "logistic", "params": {}}, 2, 2, site.n_rows("train"), 1).work
    tight = _site(_binary_table(), max_work=one * 10)
    reply = tight.handle(_chains(20))
    assert reply.is_refusal and "max_work" in reply.meta["reason"]
    assert not _site(_binary_table(), max_work=one * 25).handle(_chains(20)).is_refusal


# ----------------------------------------------------------------------------- selectors' work
def test_the_sites_own_selector_is_held_to_the_work_caps():
    """A job's ``random_forest n_estimators=1e9`` becomes the sites' own selector: it is
    refused like a server's, before it runs (it would run for years)."""
    table = _binary_table()
    huge = {"name": "random_forest", "params": {"n_estimators": 1e9}}
    site = Site("hospital", table, "target", selector=huge, policy=DisclosurePolicy(min_rows=MIN_ROWS))
    for request in (Message("ballot"), Message("select_prepare")):
        reply = site.handle(request)
        reason = reply.meta.get("reason", "")
        assert reply.is_refusal and ("max_work" in reason or "max_size" in reason) and "n_estimators" in reason
    fine = Site("hospital", table, "target", selector="lasso", policy=DisclosurePolicy(min_rows=MIN_ROWS))
    assert not fine.handle(Message("ballot")).is_refusal


def test_fold_ballots_count_one_selector_run_per_fold():
    """``select_prepare`` runs the selector on K fit parts and on train: K + 1 runs of work."""
    from fedtab.election.selectors import selector_cost

    table = _binary_table()
    spec = {"name": "random_forest", "params": {"n_estimators": 50}}
    probe = Site("p", table, "target", policy=DisclosurePolicy(min_rows=MIN_ROWS))
    one = selector_cost(spec, probe.n_rows("train"), 2).work
    K = probe.parts.n_folds
    assert K == 5
    for cap, refused in ((one * 3, True), (one * (K + 1) * 1.01, False)):
        site = Site("s", table, "target", policy=DisclosurePolicy(min_rows=MIN_ROWS, max_work=cap))
        assert site.handle(Message("ballot", meta={"selector": spec})).is_refusal is False
        reply = site.handle(Message("select_prepare", meta={"selector": spec}))
        assert reply.is_refusal is refused, reply.meta
