"""A curious server sweeping step-function models over a site's fixed test part (issue 28 item 2).

The probe: the server sends models of its own (a steep one-feature logistic model, a boosted
stump at another agreed edge), each picking out the test rows on one side of a threshold; two
replies whose positive-prediction counts differ by one give that row's class and place its
value between the two thresholds. A default site answers at most the run's training rounds
+ ``PLAIN_MODELS_EXTRA`` distinct models per part in the clear; past that it answers a new
model only inside a secure sum or with DP (or when its operator opted in with
``allow_server_row_sets``), so the sweep isolates no row beyond those few answers.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.gbdt import run_gbdt
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import set_options
from fedtab.federation.site.core import Site
from fedtab.federation.protocol.kinds import evaluating_kinds
from fedtab.privacy import DisclosurePolicy
from fedtab.privacy.policy import PLAIN_MODELS_EXTRA, plain_model_cap
from tests.builders import gbdt_parts, make_sites

MIN_ROWS = 10


def _table(n: int = 600, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return pd.DataFrame({"x": x, "z": rng.normal(size=n), "target": (x + rng.normal(size=n) > 0).astype(int)})


def _fit(site: Site) -> None:
    setup = {"features": ["x", "z"], "classes": ["0", "1"], "model": {"name": "logistic", "params": {}},
             "part": "train"}
    reply = site.handle(Message("fit", {"setup:mean": np.zeros(2), "setup:std": np.ones(2),
                                        "param:coef": np.zeros((1, 2)), "param:intercept": np.zeros(1)},
                                {"setup": setup, "epochs": 1}))
    assert not reply.is_refusal and not reply.is_error, reply.meta


def _step(site: Site, t: float, **meta) -> Message:
    """A model predicting class 1 exactly when ``x > t`` (a steep logistic model)."""
    w = 1e5
    return site.handle(Message("evaluate", {"param:coef": np.array([[w, 0.0]]), "param:intercept": np.array([-w * t])},
                               {"part": "test", **meta}))


def _sweep(site: Site, thresholds: np.ndarray) -> tuple[list[np.ndarray], list[str]]:
    """The confusion matrices answered and the refusals of a threshold sweep."""
    answered, refused = [], []
    for t in thresholds:
        reply = _step(site, float(t))
        if reply.is_refusal:
            refused.append(reply.meta["reason"])
        else:
            assert not reply.is_error, reply.meta
            answered.append(np.asarray(reply.arrays["confusion"]))
    return answered, refused


def _isolated(confusions: list[np.ndarray]) -> int:
    """Rows the server isolates: consecutive answers whose predicted-positive count of a class moved by one."""
    pos = np.array([c[:, 1] for c in confusions])
    return int((np.abs(np.diff(pos, axis=0)) == 1).sum()) if len(pos) > 1 else 0


def test_a_threshold_sweep_of_crafted_models_stops_at_the_runs_rounds():
    table = _table()
    site = Site("s", table, "target", policy={"min_rows": MIN_ROWS})
    _fit(site)
    x = np.sort(site.rows("test")["x"].to_numpy())
    between = (x[MIN_ROWS:-MIN_ROWS - 1] + x[MIN_ROWS + 1:-MIN_ROWS]) / 2  # one test row between neighbours
    answered, refused = _sweep(site, between)
    cap = 1 + PLAIN_MODELS_EXTRA  # one fit round answered in this run
    assert len(answered) == cap and len(refused) == len(between) - cap
    assert all("allow_server_row_sets" in r and "secure sum" in r for r in refused)
    assert _isolated(answered) <= cap - 1  # at most the few answers' differences, not the sweep's
    # the same model again is answered (an honest server re-evaluating its model loses nothing) ...
    assert not _step(site, float(between[0])).is_refusal
    # ... and a new one with DP (noised at the site's terms) is not refused by the model cap
    dp = _step(site, float(between[-1]), dp={"z": 5.0})
    assert "allow_server_row_sets" not in str(dp.meta.get("reason", ""))
    # the control: a site that opted in answers the whole sweep, which isolates row after row
    open_site = Site("o", table, "target", policy={"min_rows": MIN_ROWS, "allow_server_row_sets": True})
    _fit(open_site)
    every, none = _sweep(open_site, between)
    assert none == [] and _isolated(every) >= len(between) // 2


def test_training_rounds_widen_the_cap_one_model_per_round():
    """An honest run may score one model per round (``eval_every = 1``) plus its last: each
    fit round answered lets one more distinct model through, and the refusal changes no count."""
    site = Site("s", _table(seed=1), "target", policy={"min_rows": MIN_ROWS})
    for _ in range(3):
        _fit(site)
    ts = np.linspace(-0.5, 0.5, 3 + PLAIN_MODELS_EXTRA + 4)
    answered, refused = _sweep(site, ts)
    assert len(answered) == 3 + PLAIN_MODELS_EXTRA and len(refused) == 4
    evals = site.ledger.run_count(site.run_id, "evaluate:test")
    assert evals == len(answered)  # the refused requests charged no evaluation
    _fit(site)
    assert not _step(site, 0.9).is_refusal and _step(site, 0.95).is_refusal


def test_crafted_stumps_at_the_agreed_edges_stop_at_the_boosting_rounds():
    """After a secure boosting run (default sites), the server sends its own trees in the clear:
    the root split moved to every agreed edge of a feature. The site answers the run's trees +
    PLAIN_MODELS_EXTRA distinct models, then refuses new ones (the same sweep inside a secure sum
    would only give pooled counts)."""
    parts = gbdt_parts(5)
    fed = LocalFederation(make_sites(parts))
    set_options(fed, secure_aggregation=True)
    fast = {"n_trees": 2, "max_depth": 2, "max_bins": 32}
    out = run_gbdt(fed, None, params=fast, importance=False)
    arrays = out.model.to_arrays()
    layout = out.model.layout
    f = int(arrays["feature"][0])
    site = fed.site("s0")
    answered = refused = 0
    for b in range(layout.edges[f].size):
        a = {k: v.copy() for k, v in arrays.items()}
        a["bin"][0], a["threshold"][0] = b, layout.edges[f][b]
        reply = site.handle(Message("gbdt_evaluate", {f"param:{k}": v for k, v in a.items()}, {"part": "test"}))
        if reply.is_refusal:
            assert "allow_server_row_sets" in reply.meta["reason"]
            refused += 1
        else:
            assert not reply.is_error, reply.meta
            answered += 1
    assert answered == fast["n_trees"] + PLAIN_MODELS_EXTRA and refused == layout.edges[f].size - answered


def test_a_regression_model_sweep_is_capped_like_the_classification_one():
    """The same sweep through ``regression_evaluate``: a steep one-feature linear model's squared
    error sum changes by one row's term between two thresholds; a default site answers at most
    the run's rounds + PLAIN_MODELS_EXTRA distinct models, then refuses naming the opt-in."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=600)
    table = pd.DataFrame({"x": x, "z": rng.normal(size=600), "target": 2.0 * x + rng.normal(size=600)})
    answered_by = {}
    for opted in (False, True):
        answered_by[opted] = _regression_sweep(table, opted)
    assert answered_by[True] == (20, [])  # the opted-in control answers the whole sweep
    answered, refused = answered_by[False]
    assert answered <= 1 + PLAIN_MODELS_EXTRA  # one fit round answered, then the extra few
    assert refused and all("allow_server_row_sets" in r for r in refused)


def _fitted_linear(table: pd.DataFrame, policy: dict) -> Site:
    """A regression site (``x``, ``z`` -> ``target``) that answered one fit round of a linear model."""
    site = Site("s", table, "target", policy=policy)
    assert site.target_kind == "regression"
    setup = {"features": ["x", "z"], "classes": [], "model": {"name": "linear", "params": {}}, "part": "train",
             "task": "regression"}
    fit = site.handle(Message("fit", {"setup:mean": np.zeros(2), "setup:std": np.ones(2),
                                      "param:coef": np.zeros(2), "param:intercept": np.zeros(1)},
                              {"setup": setup, "epochs": 1}))
    assert not fit.is_refusal and not fit.is_error, fit.meta
    return site


def _regression_sweep(table: pd.DataFrame, opted: bool) -> tuple[int, list[str]]:
    """One fit round of a linear model, then 20 steep one-feature models scored on the test part:
    ``(answered, refusal reasons)``."""
    site = _fitted_linear(table, {"min_rows": MIN_ROWS, "allow_server_row_sets": opted})
    answered, refused = 0, []
    for t in np.linspace(-1.0, 1.0, 20):
        reply = site.handle(Message("regression_evaluate",
                                    {"param:coef": np.array([1e3, 0.0]), "param:intercept": np.array([-1e3 * t])},
                                    {"part": "test"}))
        if reply.is_refusal:
            refused.append(reply.meta["reason"])
        else:
            assert not reply.is_error, reply.meta
            answered += 1
    return answered, refused


# ----------------------------------------------------------------- every declared evaluating kind
def _linear_site(policy: dict) -> tuple[Site, Callable[[int], Message]]:
    rng = np.random.default_rng(2)
    x = rng.normal(size=300)
    table = pd.DataFrame({"x": x, "z": rng.normal(size=300), "target": 2.0 * x + rng.normal(size=300)})
    site = _fitted_linear(table, policy)
    return site, lambda i: Message("regression_evaluate", {"param:coef": np.array([1e3, 0.0]),
                                                          "param:intercept": np.array([-10.0 * i])}, {"part": "test"})


def _logistic_site(policy: dict) -> tuple[Site, Callable[[int], Message]]:
    site = Site("s", _table(300, seed=3), "target", policy=policy)
    _fit(site)
    return site, lambda i: Message("evaluate", {"param:coef": np.array([[1e5, 0.0]]),
                                                "param:intercept": np.array([-1e3 * i])}, {"part": "test"})


def _selection_site(policy: dict, stage: str) -> tuple[Site, Callable[[int], Message]]:
    """Two chains (folds 0 and 1, or two refit chains for the test stage) set up by one
    ``select_fit``; the server then sends chain 0 with new coefficients each time."""
    site = Site("s", _table(300, seed=4), "target", policy=policy)
    d, M = 2, 2
    folds = np.array([-1, -1] if stage == "test" else [0, 1], np.int64)
    arrays = {"setup:masks": np.ones((1, d), bool), "setup:chain_mask": np.zeros(M, np.int64),
              "setup:chain_fold": folds, "setup:mean": np.zeros((M, d)), "setup:std": np.ones((M, d)),
              "setup:chain_l2": np.full(M, 1e-3), "param:coef": np.zeros((M, 1, d)), "param:intercept": np.zeros((M, 1))}
    meta = {"setup": {"features": ["x", "z"], "classes": ["0", "1"], "model": {"name": "logistic", "params": {}},
                      "without": [""] * M}, "epochs": 1}
    fit = site.handle(Message("select_fit", arrays, meta))
    assert not fit.is_refusal and not fit.is_error, fit.meta

    def request(i: int) -> Message:
        coef = np.zeros((M, 1, d))
        coef[0, 0, 0] = 1e3
        intercept = np.zeros((M, 1))
        intercept[0, 0] = -10.0 * i
        return Message("select_evaluate", {"param:coef": coef, "param:intercept": intercept},
                       {"slots": [[0, "none"]], "stage": stage})

    return site, request


_GBDT_MODELS: dict[str, tuple[LocalFederation, dict]] = {}


def _gbdt_site(policy: dict, objective: str) -> tuple[Site, Callable[[int], Message]]:
    """A site of a small plain boosting run (its GBDT state set up), its policy then replaced; the
    server sends the run's model with the first leaf value changed each time."""
    if objective not in _GBDT_MODELS:
        parts = gbdt_parts(3)
        if objective == "regression":
            for p in parts:
                p["target"] = p.iloc[:, 0].astype(float) * 2.0
        fed = LocalFederation(make_sites(parts, policy={"min_rows": MIN_ROWS, "allow_server_row_sets": True}))
        out = run_gbdt(fed, None, params={"n_trees": 2, "max_depth": 2, "max_bins": 16, "objective": objective}
                       if objective == "regression" else {"n_trees": 2, "max_depth": 2, "max_bins": 16},
                       importance=False)
        _GBDT_MODELS[objective] = (fed, out.model.to_arrays())
    fed, arrays = _GBDT_MODELS[objective]
    site = fed.site("s0")
    site.policy = DisclosurePolicy.from_dict(policy)
    site.run_id = f"sweep-{objective}-{policy.get('allow_server_row_sets', False)}"
    kind = "gbdt_score" if objective == "regression" else "gbdt_evaluate"

    def request(i: int) -> Message:
        a = {k: np.array(v, copy=True) for k, v in arrays.items()}
        a["value"] = a["value"].astype(np.float64) + 0.01 * i
        return Message(kind, {f"param:{k}": v for k, v in a.items()}, {"part": "test"})

    return site, request


#: per evaluating kind: its sweeps (site + the i-th distinct model); the test below requires one
#: for every kind the registry declares ``models`` for
SWEEPS: dict[str, list[Callable[[dict], tuple[Site, Callable[[int], Message]]]]] = {
    "evaluate": [_logistic_site],
    "regression_evaluate": [_linear_site],
    "gbdt_evaluate": [lambda p: _gbdt_site(p, "binary")],
    "gbdt_score": [lambda p: _gbdt_site(p, "regression")],
    "select_evaluate": [lambda p: _selection_site(p, "cv"), lambda p: _selection_site(p, "test")],
}


def test_every_evaluating_kind_has_a_sweep():
    assert set(SWEEPS) == evaluating_kinds()
    assert {"evaluate", "regression_evaluate", "gbdt_evaluate", "gbdt_score", "select_evaluate"} <= evaluating_kinds()


@pytest.mark.parametrize("kind, which", [(k, i) for k in sorted(SWEEPS) for i in range(len(SWEEPS[k]))])
def test_the_cap_plus_first_distinct_model_is_refused_unless_opted_in(kind, which):
    """The one count (:func:`fedtab.privacy.policy.charge_models`) for every declared evaluating
    kind: ``cap`` distinct models answered, the next refused naming the opt-in, the same model
    again free; an opted-in site answers the next one."""
    build = SWEEPS[kind][which]
    site, make = build({"min_rows": MIN_ROWS})
    site.run_id = site.run_id + "+strict"
    cap = plain_model_cap(site, kind)
    assert cap >= PLAIN_MODELS_EXTRA
    for i in range(cap):
        reply = site.handle(make(i))
        assert not reply.is_refusal and not reply.is_error, (i, reply.meta)
    before = site.ledger.snapshot()
    refused = site.handle(make(cap))
    assert refused.is_refusal and "allow_server_row_sets" in refused.meta["reason"], refused.meta
    assert site.ledger.snapshot() == before  # the refused model charged nothing
    again = site.handle(make(0))  # a model already answered is free of the distinct count
    assert not again.is_refusal and not again.is_error, again.meta
    part = next(k for k in site.ledger.snapshot()["run_distinct"][site.run_id])
    assert len(site.ledger.run_distinct(site.run_id, part)) == cap
    opened, make_open = build({"min_rows": MIN_ROWS, "allow_server_row_sets": True})
    opened.run_id = opened.run_id + "+open"
    for i in range(plain_model_cap(opened, kind) + 1):
        reply = opened.handle(make_open(i))
        assert not reply.is_refusal and not reply.is_error, (i, reply.meta)


def test_a_dp_gbdt_evaluation_is_its_noised_confusion_matrix_and_score_sums_never_leave(monkeypatch):
    """gbdt_evaluate declares its DP release like evaluate (the confusion matrix only, noised by the
    site at Δ = √2): the handler returns exact sums, a request that also asks for score sums gets an
    error reply (a rank-pair count is not bounded by any Δ = √2), and nothing else leaves."""
    import fedtab.privacy.dp as dp

    site, request = _gbdt_site({"min_rows": MIN_ROWS, "allow_server_row_sets": True}, "binary")
    spec = {"z": 3.0, "bounds": [-6, 6], "clip": 1.0}
    base = request(0)
    asked = site.handle(Message("gbdt_evaluate", base.arrays, {**base.meta, "score_bins": 8, "dp": spec}))
    assert asked.is_error and not {"rank_pairs", "score_hist", "brier_sum", "confusion"} & set(asked.arrays)
    monkeypatch.setattr(dp, "noise_rng", lambda: np.random.default_rng(5))
    exact = site.handle(request(1))
    noisy = site.handle(Message("gbdt_evaluate", request(1).arrays, {**base.meta, "dp": spec}))
    assert not (noisy.is_error or noisy.is_refusal), noisy.meta
    assert set(noisy.arrays) == {"confusion"}
    z_site = max(3.0, dp.site_noise_floor(site.policy.max_epsilon_per_release, site.policy.delta))
    want = exact.arrays["confusion"] + np.random.default_rng(5).normal(0.0, z_site * np.sqrt(2.0),
                                                                       size=exact.arrays["confusion"].shape)
    np.testing.assert_allclose(noisy.arrays["confusion"], want, rtol=0, atol=1e-9)
