"""Feature importance by gain of the federated GBDT: pooled equals XGBoost's ``get_score`` on the
exported booster; per-site gains equal a direct numpy computation on each site's rows; the
release rules hold against a curious server (tiny nodes suppressed, no model of its choosing,
no per-site numbers after a secure or DP run) and a hostile site is left out by name."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.gbdt import run_gbdt
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import set_options
from fedtab.federation.site.core import Site
from fedtab.learn.gbdt import BinLayout, GBDTParams
from fedtab.privacy.policy import DisclosurePolicy
from tests.builders import classification_parts, gbdt_parts, make_sites

FAST = {"n_trees": 4, "max_depth": 3, "max_bins": 32}


def _parts(seed: int = 3) -> list[pd.DataFrame]:
    return gbdt_parts(seed, n=900)


def _reference_gains(model, X: np.ndarray, y: np.ndarray, min_rows: int, lam: float) -> tuple[np.ndarray, int]:
    """Direct numpy: route every row down every tree (raw thresholds, NaN by the default
    direction), sum its gradient and hessian (float64 logistic) into every node it visits,
    gain ``GL²/(HL+λ) + GR²/(HR+λ) − G²/(H+λ)`` per split, splits with 1..min_rows−1 rows in
    the node or a child left out."""
    margin = np.full(len(y), float(model.base_margin[0]))
    total, suppressed = np.zeros(model.n_features), 0
    for t in range(model.n_trees):
        tree = model.tree(t)
        p = 1.0 / (1.0 + np.exp(-margin))
        g, h = p - y, p * (1.0 - p)
        n_nodes = tree["left"].size
        G, H, C = np.zeros(n_nodes), np.zeros(n_nodes), np.zeros(n_nodes)
        leaf = np.zeros(len(y), dtype=int)
        for i in range(len(y)):
            node = 0
            while True:
                G[node] += g[i]
                H[node] += h[i]
                C[node] += 1
                if tree["left"][node] < 0:
                    break
                x = np.float32(X[i, tree["feature"][node]])
                go_left = bool(tree["default_left"][node]) if np.isnan(x) else bool(x < tree["threshold"][node])
                node = tree["left"][node] if go_left else tree["right"][node]
            leaf[i] = node
        for node in np.flatnonzero(tree["left"] >= 0):
            a, b = tree["left"][node], tree["right"][node]
            if any(0 < C[j] < min_rows for j in (node, a, b)):
                suppressed += 1
                continue
            total[tree["feature"][node]] += G[a] ** 2 / (H[a] + lam) + G[b] ** 2 / (H[b] + lam) - G[node] ** 2 / (
                H[node] + lam)
        margin = margin + tree["value"][leaf].astype(np.float64)
    return total, suppressed


def _site_rows(site: Site, features: list[str]) -> tuple[np.ndarray, np.ndarray]:
    rows = site.rows("train")
    X = np.column_stack([rows[f].to_numpy(float) if f in rows else np.full(len(rows), np.nan) for f in features])
    return X, rows["target"].to_numpy().astype(float)


def test_pooled_importance_equals_xgboosts_get_score_on_the_exported_booster():
    xgb = pytest.importorskip("xgboost")
    out = run_gbdt(LocalFederation(make_sites(_parts(), policy={"min_rows": 10, "allow_server_row_sets": True})), None, params=FAST)
    booster = out.model.to_xgboost()
    assert isinstance(booster, xgb.Booster)
    for ours, kind in ((out.importance["pooled"], "total_gain"), (out.importance["pooled_mean"], "gain")):
        ref = booster.get_score(importance_type=kind)
        assert set(ours) == set(ref) and ref, kind
        for name, v in ref.items():
            assert ours[name] == pytest.approx(v, rel=1e-5), (kind, name)


def test_per_site_gains_equal_a_direct_numpy_computation_on_each_sites_rows():
    fed = LocalFederation(make_sites(_parts(), policy={"min_rows": 10, "allow_server_row_sets": True}))
    out = run_gbdt(fed, None, params=FAST)
    imp = out.importance
    assert imp["per_site_skipped"] is None and imp["not_released"] == [] and set(imp["per_site"]) == set(fed.sites)
    assert sum(imp["suppressed"].values()) > 0  # the small site has nodes of fewer than 10 rows
    for name in fed.sites:
        X, y = _site_rows(fed.site(name), out.features)
        ref, suppressed = _reference_gains(out.model, X, y, min_rows=10, lam=out.params.reg_lambda)
        assert imp["suppressed"][name] == suppressed, name
        got = imp["per_site"][name]
        assert set(got) == set(imp["pooled"])
        for f, v in got.items():
            assert v == pytest.approx(ref[out.features.index(f)], rel=1e-4, abs=1e-3), (name, f)


def test_one_sites_gains_on_all_its_rows_are_the_pooled_gains():
    _, parts = classification_parts(600, 5, 3, 1, (1.0,), seed=8)
    fed = LocalFederation(make_sites(parts, policy={"min_rows": 1, "allow_server_row_sets": True}))
    out = run_gbdt(fed, None, params={**FAST, "min_rows": 1})
    (site,) = out.importance["per_site"].values()
    assert out.importance["suppressed"] == {"s0": 0}
    for f, v in out.importance["pooled"].items():
        assert site[f] == pytest.approx(v, rel=1e-4), f


def test_no_per_site_gains_after_a_secure_run_and_the_site_refuses_them_too():
    parts = _parts(seed=4)
    fed = LocalFederation(make_sites(parts, policy={"min_rows": 10, "allow_server_row_sets": True}))
    set_options(fed, secure_aggregation=True)
    out = run_gbdt(fed, None, params={**FAST, "n_trees": 2})
    imp = out.importance
    assert imp["per_site"] == {} and "secure aggregation" in imp["per_site_skipped"] and imp["pooled"]
    assert "gbdt_importance" not in [e["step"] for e in out.exchanges]
    reply = fed.site("s0").handle(Message("gbdt_importance", meta={"rounds": 2}))  # a curious server asks anyway
    assert reply.is_error and "only after a plain run" in reply.meta["error"]


# ----------------------------------------------------------------------------- curious server
def _grown_site(min_rows: int) -> Site:
    """A site that grew one server-made tree whose left child holds 3 of its rows."""
    _, parts = classification_parts(300, 3, 2, 0, (1.0,), seed=11)
    site = Site("s", parts[0], "target", policy={"min_rows": min_rows, "allow_server_row_sets": True})
    x0 = np.sort(site.rows("train")["f0"].dropna().to_numpy())
    cut = np.float32((x0[2] + x0[3]) / 2)
    layout = BinLayout([np.array([cut], np.float32)] + [np.array([0.0], np.float32)] * 2)
    assert site.handle(Message("gbdt_start", layout.to_arrays(),
                               {"features": ["f0", "f1", "f2"], "part": "train", "classes": ["0", "1"],
                                "params": GBDTParams(min_rows=1).to_dict()})).kind == "gbdt_start"
    level = {"round": 0, "level": 0}
    assert site.handle(Message("gbdt_level", {"nodes": np.array([[0, 0]], np.int32)}, level)).kind == "gbdt_level"
    split = {"split:tree": np.array([0]), "split:node": np.array([0]), "split:feature": np.array([0]),
             "split:bin": np.array([0]), "split:default_left": np.array([False]),
             "split:left": np.array([1]), "split:right": np.array([2])}
    leaves = {"leaf:values": np.array([0.0, 0.3, -0.1], np.float32), "leaf:ptr": np.array([0, 3])}
    closing = site.handle(Message("gbdt_level", {"nodes": np.zeros((0, 2), np.int32), **split, **leaves},
                                  {"round": 1, "level": 0}))
    assert closing.kind == "gbdt_level", closing.meta
    return site


def test_a_curious_server_asking_for_the_gain_of_a_tiny_node_gets_it_suppressed():
    site = _grown_site(min_rows=10)
    reply = site.handle(Message("gbdt_importance", meta={"rounds": 1}))
    assert reply.kind == "gbdt_importance", reply.meta
    assert reply.meta["suppressed"] == 1 and not reply.arrays["gain"].any()
    exact = _grown_site(min_rows=1).handle(Message("gbdt_importance", meta={"rounds": 1}))
    assert exact.meta["suppressed"] == 0 and exact.arrays["gain"][0] != 0  # the same split, released without a floor


@pytest.mark.parametrize("meta, match", [({"rounds": 2}, "more rounds"), ({"rounds": -1}, "non-negative"),
                                         ({}, "non-negative")])
def test_a_site_answers_only_for_the_rounds_it_grew(meta, match):
    reply = _grown_site(min_rows=1).handle(Message("gbdt_importance", meta=meta))
    assert reply.is_error and match in reply.meta["error"]


def test_the_gains_come_from_the_sites_record_not_from_a_model_the_server_sends():
    honest = _grown_site(min_rows=1).handle(Message("gbdt_importance", meta={"rounds": 1})).arrays["gain"]
    fake = {"param:feature": np.array([1, 0, 0], np.int32), "param:left": np.array([1, -1, -1], np.int32)}
    again = _grown_site(min_rows=1).handle(Message("gbdt_importance", fake, {"rounds": 1})).arrays["gain"]
    np.testing.assert_array_equal(again, honest)


def test_importance_is_released_once_per_run_never_per_round():
    """Gains for ``r`` and ``r + 1`` rounds would difference to one round's gains: the site
    answers one importance request per boosting run, whatever ``rounds`` the next one names."""
    site = _grown_site(min_rows=1)
    assert site.handle(Message("gbdt_importance", meta={"rounds": 1})).kind == "gbdt_importance"
    for rounds in (0, 1):
        again = site.handle(Message("gbdt_importance", meta={"rounds": rounds}))
        assert again.is_error and "once per boosting run" in again.meta["error"]
    # refused before anything is computed on a site that did not opt in to plain answers over the server's splits
    site.policy = DisclosurePolicy(min_rows=1)
    assert site.handle(Message("gbdt_importance", meta={"rounds": 1})).is_refusal


class _Hostile(Site):
    def handle(self, request: Message) -> Message:
        reply = super().handle(request)
        if request.kind == "gbdt_importance" and not reply.is_error:
            return Message(reply.kind, {"gain": np.full(3, np.inf)}, reply.meta)
        return reply


def test_a_hostile_sites_gains_are_rejected_and_the_run_goes_on_without_them():
    parts = _parts(seed=5)
    fed = LocalFederation([*make_sites(parts[:2], policy={"min_rows": 10, "allow_server_row_sets": True}),
                           _Hostile("evil", parts[2], "target", policy={"min_rows": 10, "allow_server_row_sets": True})])
    out = run_gbdt(fed, None, params={**FAST, "n_trees": 2})
    assert out.importance["not_released"] == ["evil"] and set(out.importance["per_site"]) == {"s0", "s1"}
    assert out.metrics["pooled"]["n"] > 0 and "evil" not in out.dropped  # the evaluation still asks every site


def test_the_sites_record_survives_an_engines_state_codec():
    from fedtab.engines.site_state import decode_state, encode_state

    site = _grown_site(min_rows=1)
    msg, _ = encode_state(site.state)
    fresh = Site("s", site.table, "target", policy={"min_rows": 1, "allow_server_row_sets": True})
    fresh.state = decode_state(msg)
    a = site.handle(Message("gbdt_importance", meta={"rounds": 1}))
    b = fresh.handle(Message("gbdt_importance", meta={"rounds": 1}))
    assert b.kind == "gbdt_importance", b.meta
    np.testing.assert_array_equal(a.arrays["gain"], b.arrays["gain"])


def test_a_split_recorded_twice_counts_once():
    from fedtab.learn.gbdt.importance import SiteRecord, site_gains

    site = _grown_site(min_rows=1)
    st = site.state["gbdt"]
    b = site.state["gbdt_live"][1]
    args = (b.bins, b.y, b.layout, b.params, st["base_margin"])
    once = site_gains(*args, SiteRecord(st["grown"], st["grown_leaves"], st["grown_leaf_ptr"]), 1, 1)
    twice = site_gains(*args, SiteRecord(np.vstack([st["grown"], st["grown"]]), st["grown_leaves"],
                                         st["grown_leaf_ptr"]), 1, 1)
    assert once.splits == twice.splits == 1
    np.testing.assert_array_equal(once.total, twice.total)
