"""Federated GBDT on the protocol path: the same trees as the in-process reference, secure
aggregation bit for bit, exchanges per level, DP/robust modes, early stopping, heterogeneous
schemas, the training hook, and hostile sites / a curious server against the new messages."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.gbdt import run_gbdt
from fedtab.federation.workflows.gbdt.steps import robust_pool
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import FederationError, SiteError, set_options
from fedtab.federation.site.core import Site
from fedtab.learn.gbdt import BinLayout, GBDTParams, fit_gbdt_sites
from tests.builders import classification_parts, gbdt_parts, make_sites

FAST = {"n_trees": 4, "max_depth": 3, "max_bins": 32}
#: the sites of a plain run opt in to plain answers over the server's tree nodes (the default refuses them)
OPT_IN = {"min_rows": 10, "allow_server_row_sets": True}
STRUCTURE = ("left", "right", "feature", "bin", "default_left")


def _parts(seed: int = 3, n: int = 1200, missing: float = 0.05, drop: str | None = "f3") -> list[pd.DataFrame]:
    return gbdt_parts(seed, n, missing, drop)


def _fed(parts, min_rows: int = 10, **site_options) -> LocalFederation:
    return LocalFederation(make_sites(parts, policy={"min_rows": min_rows, "allow_server_row_sets": True}, **site_options))


def _same_trees(a, b) -> None:
    A, B = a.to_arrays(), b.to_arrays()
    assert A.keys() == B.keys()
    for k in A:
        np.testing.assert_array_equal(A[k], B[k], err_msg=k)


def test_federated_trees_equal_the_in_process_reference_on_a_heterogeneous_schema():
    parts = _parts()
    fed = _fed(parts, min_rows=1)  # no release rule changes the sums: only the 2^-24 grid
    out = run_gbdt(fed, None, params={**FAST, "min_rows": 1})  # the floor is the larger of the site's and this
    feats = out.features
    assert "f3" in feats
    ref_sites = []
    for site in (fed.site(n) for n in fed.sites):
        rows = site.rows("train")
        X = np.column_stack([rows[f].to_numpy(float) if f in rows else np.full(len(rows), np.nan) for f in feats])
        ref_sites.append((X, rows["target"].to_numpy().astype(int)))
    ref = fit_gbdt_sites(ref_sites, {**FAST, "min_rows": 1}, feature_names=feats)
    A, B = out.model.to_arrays(), ref.to_arrays()
    for k in ("left", "right", "feature", "tree_ptr", "edges"):
        np.testing.assert_array_equal(A[k], B[k], err_msg=k)
    # the site rounds its sums to 2^-24: a split may differ only where two candidates tie (an empty
    # bin, or no missing value in the node, gives the same partition, hence the same gain)
    differ = (A["bin"] != B["bin"]) | (A["default_left"] != B["default_left"])
    assert differ.sum() <= 2
    np.testing.assert_allclose(A["gain"], B["gain"], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(A["value"], B["value"], rtol=0, atol=1e-6)
    X_all = np.vstack([x for x, _ in ref_sites])
    np.testing.assert_allclose(out.model.predict_proba(X_all), ref.predict_proba(X_all), atol=1e-6)
    assert out.metrics["pooled"]["auroc"] > 0.8


def test_secure_aggregation_grows_the_same_trees_bit_for_bit():
    parts = _parts(seed=4)
    deep = {**FAST, "max_depth": 6}
    plain = run_gbdt(_fed(parts), None, params=deep)
    fed = _fed(parts)
    set_options(fed, secure_aggregation=True)
    secure = run_gbdt(fed, None, params=deep)
    _same_trees(plain.model, secure.model)
    assert secure.withheld == {}  # no per-site count rides next to a secure sum
    assert plain.withheld  # the floor of 10 withheld some small nodes in plain mode too


def test_one_exchange_per_depth_level_and_bytes_reported():
    out = run_gbdt(_fed(_parts()), None, params={**FAST, "n_trees": 3, "max_depth": 4})
    steps = [e["step"] for e in out.exchanges]
    assert steps[:4] == ["gbdt_summary", "gbdt_sketch", "gbdt_sketch", "gbdt_start"] and steps[-1] == "gbdt_evaluate"
    levels = out.level_exchanges
    for r in range(3):
        assert len([e for e in levels if e["round"] == r and e["nodes"]]) <= 4
    assert len(levels) <= 3 * 4 + 1
    assert out.exchanges_per_tree <= 4 + 1 / 3 + 1e-9
    root = levels[0]
    n_slots = out.model.layout.n_slots
    assert root["nodes"] == 1 and root["bytes_up"] == 3 * n_slots * 2 * 8
    # the engine's wire: arrays (losslessly packed where they compress) + framing
    assert 0 < root["wire_up"] < root["bytes_up"] + 3 * 4096


def test_multiclass_and_regression():
    _, parts = classification_parts(900, 6, 4, 1, seed=5, n_classes=3)
    out = run_gbdt(_fed(parts), None, params=FAST)
    assert out.params.objective == "multiclass" and out.params.n_classes == 3
    assert out.model.n_trees == 3 * FAST["n_trees"]
    assert out.metrics["pooled"]["accuracy"] > 0.6
    reg = []
    rng = np.random.default_rng(0)
    for p in parts:
        p = p.copy()
        p["target"] = 2.0 * p["f0"] - p["f1"] + 0.1 * rng.normal(size=len(p))
        reg.append(p)
    # a site stratifies its parts by the label: a continuous label leaves every row in training
    out = run_gbdt(_fed(reg), None, params={**FAST, "objective": "regression", "n_trees": 10}, eval_part="train")
    y = pd.concat(reg)["target"]
    assert out.metrics["pooled"]["rmse"] < 0.6 * float(y.std())


def test_early_stopping_keeps_the_best_round_of_the_pooled_validation_loss():
    parts = _parts(seed=6, missing=0.0, drop=None)
    out = run_gbdt(_fed(parts), None, params={**FAST, "n_trees": 30, "max_depth": 6, "learning_rate": 1.0,
                                              "max_bins": 64, "early_stopping_rounds": 2})
    best = int(np.argmin(out.history))
    assert out.model.n_rounds == best + 1 < 30
    assert len(out.history) == best + 3  # two rounds without improvement, then stop


def test_the_training_hook_returns_a_training_outcome():
    from fedtab.federation.workflows.training import run_training

    tr = run_training(_fed(_parts()), None, model={"name": "gbdt", "params": FAST})
    assert tr.model == "gbdt" and tr.rounds == FAST["n_trees"]
    assert set(tr.params) >= {"left", "right", "threshold", "value", "tree_ptr", "base_margin"}
    assert tr.pooled["accuracy"] > 0.7 and tr.model_spec["params"]["objective"] == "binary"


def test_robust_mode_caps_one_sites_share_of_the_hessian_mass():
    layout = BinLayout([np.array([0.5], np.float32)])
    def reply(scale):  # one node: 2 value bins + missing
        h = np.array([[[scale * -1.0, scale * 1.0], [scale * 1.0, scale * 1.0], [0.0, 0.0]]])
        return Message("gbdt_level", {"hist": h})
    pooled, shares = robust_pool({"a": reply(1.0), "b": reply(1.0), "big": reply(98.0)}, layout, 0.5)
    assert shares["big"] == pytest.approx(0.98)
    mass = pooled[0, :2, 1].sum()
    assert mass == pytest.approx(200.0)  # total mass kept, the big site's share cut to one half
    out = run_gbdt(_robust_fed(), None, params=FAST)
    assert out.model.n_trees == FAST["n_trees"]


def _robust_fed() -> LocalFederation:
    fed = _fed(_parts(seed=8))
    set_options(fed, robust=True, max_site_share=0.4)
    return fed


def test_dp_noises_the_histograms_from_the_runs_accountant():
    parts = _parts(seed=9, missing=0.0, drop=None)
    fed = _fed(parts)
    set_options(fed, dp={"epsilon": 50.0, "delta": 1e-5, "bounds": [-6.0, 6.0]})
    out = run_gbdt(fed, None, params={**FAST, "n_trees": 3})
    assert out.privacy is not None and out.privacy["steps"]["gbdt.level"] > 0
    assert out.importance["per_site"] == {} and "differential privacy" in out.importance["per_site_skipped"]
    reply = fed.site("s0").handle(Message("gbdt_importance", meta={"rounds": 1}))  # no per-site gains after DP
    assert reply.is_error and "only after a plain run" in reply.meta["error"]
    edges = out.model.layout.edges[0]
    np.testing.assert_allclose(edges, np.linspace(-6, 6, FAST["max_bins"] + 1)[1:-1].astype(np.float32))
    # without bounds a DP run agrees its edges by the DP sketch (tests/.../test_gbdt_dp_sketch.py)


# ----------------------------------------------------------------------------- hostile sites
class _Corrupt(Site):
    """A site whose ``tamper_kind`` replies have their array ``tamper_array`` changed by ``corrupt``."""

    corrupt = staticmethod(lambda h: h)
    tamper_kind, tamper_array = "gbdt_level", "hist"

    def handle(self, request: Message) -> Message:
        reply = super().handle(request)
        k, a = self.tamper_kind, self.tamper_array
        if request.kind == k and a in reply.arrays and reply.arrays[a].size:
            return Message(reply.kind, {**reply.arrays, a: self.corrupt(np.array(reply.arrays[a]))}, reply.meta)
        return reply


@pytest.mark.parametrize("kind, name, corrupt, match", [
    ("gbdt_start", "label_sums", lambda s: s + np.array([s[1], 0.0]), "positive count"),
    ("gbdt_start", "label_sums", lambda s: s * 2, "rows, not the"),
    ("gbdt_sketch", "counts", lambda c: c * 1000, "more rows"),
    ("gbdt_sketch", "counts", lambda c: -c, "non-negative"),
])
def test_hostile_label_sums_and_bin_summaries_are_rejected_naming_the_site(kind, name, corrupt, match):
    parts = _parts(seed=15)
    bad = _Corrupt("evil", parts[2], "target", policy={"min_rows": 10, "allow_server_row_sets": True})
    bad.tamper_kind, bad.tamper_array, bad.corrupt = kind, name, staticmethod(corrupt)
    with pytest.raises(SiteError, match=match) as info:
        run_gbdt(LocalFederation([*make_sites(parts[:2], policy=OPT_IN), bad]), None, params=FAST)
    assert "evil" in str(info.value)


def test_a_server_cannot_lower_the_sites_floor_of_the_sketch_counts():
    _, parts = classification_parts(300, 3, 2, 0, (1.0,), seed=11)
    site = Site("s", parts[0], "target", policy={"min_rows": 25, "allow_server_row_sets": True})
    reply = site.handle(Message("gbdt_sketch", meta={"features": ["f0", "f1", "f2"], "stage": "range",
                                                     "min_rows": 1, "sketch_size": 1000}))
    assert reply.kind == "gbdt_sketch", reply.meta
    counts = reply.arrays["counts"]
    assert counts[counts > 0].min() >= 25
    np.testing.assert_allclose(counts.sum(axis=1), site.n_rows("train"))


def test_subsampling_is_drawn_by_the_sites_and_repeats_with_their_seeds():
    parts = _parts(seed=16)
    a = run_gbdt(_fed(parts), None, params={**FAST, "subsample": 0.5})
    b = run_gbdt(_fed(parts), None, params={**FAST, "subsample": 0.5})
    c = run_gbdt(_fed(parts), None, params=FAST)
    _same_trees(a.model, b.model)
    assert not np.array_equal(a.model.nodes["value"], c.model.nodes["value"])
    assert a.model.nodes["cover"][0] < 0.6 * c.model.nodes["cover"][0]  # about half the rows' hessian at the root


@pytest.mark.parametrize("corrupt, match", [
    (lambda h: h[:, :-1], "must be float"),
    (lambda h: np.where(np.arange(h.size).reshape(h.shape) == 3, np.nan, h), "non-finite"),
    (lambda h: h * 1e12, "exceeds|disagree"),
    (lambda h: np.concatenate([h[..., :1], -h[..., 1:]], axis=-1), "negative hessian"),
])
def test_a_hostile_sites_level_histogram_is_rejected_naming_it(corrupt, match):
    parts = _parts(seed=10)
    sites = make_sites(parts[:2], policy={"min_rows": 10, "allow_server_row_sets": True})
    bad = _Corrupt("evil", parts[2], "target", policy={"min_rows": 10, "allow_server_row_sets": True})
    bad.corrupt = staticmethod(corrupt)
    with pytest.raises(SiteError, match=match) as info:
        run_gbdt(LocalFederation([*sites, bad]), None, params=FAST)
    assert "evil" in str(info.value) and "s0" not in str(info.value)


# ----------------------------------------------------------------------------- curious server
def _started_site(min_rows: int = 10, edges: list | None = None) -> Site:
    _, parts = classification_parts(300, 3, 2, 0, (1.0,), seed=11)
    site = Site("s", parts[0], "target", policy={"min_rows": min_rows, "allow_server_row_sets": True})
    layout = BinLayout(edges or [np.array([0.0], np.float32)] * 3)
    start = Message("gbdt_start", layout.to_arrays(), {"features": ["f0", "f1", "f2"], "part": "train",
                                                       "classes": ["0", "1"], "params": GBDTParams().to_dict()})
    reply = site.handle(start)
    assert reply.kind == "gbdt_start", reply.meta
    return site


def _level(site, nodes, round_=0, level=0, **arrays) -> Message:
    return site.handle(Message("gbdt_level", {"nodes": np.asarray(nodes, np.int32).reshape(-1, 2), **arrays},
                               {"round": round_, "level": level}))


def _split(left_bin: int, default_left: bool = False) -> dict:
    return {"split:tree": np.array([0]), "split:node": np.array([0]), "split:feature": np.array([0]),
            "split:bin": np.array([left_bin]), "split:default_left": np.array([default_left]),
            "split:left": np.array([1]), "split:right": np.array([2])}


def test_a_server_asking_for_a_tiny_node_gets_zeros_and_not_its_sibling():
    _, parts = classification_parts(300, 3, 2, 0, (1.0,), seed=11)
    x0 = np.sort(Site("t", parts[0], "target").rows("train")["f0"].dropna().to_numpy())
    cut = np.float32((x0[2] + x0[3]) / 2)  # a server-made split with 3 rows on its left
    site = _started_site(edges=[np.array([cut], np.float32)] + [np.array([0.0], np.float32)] * 2)
    assert _level(site, [[0, 0]]).arrays["hist"][0, :, 1].sum() > 0
    reply = _level(site, [[0, 2]], level=1, **_split(0))  # the large child: it would give the small one away
    assert reply.kind == "gbdt_level", reply.meta
    assert not reply.arrays["hist"].any() and reply.meta["withheld"] == 1
    reply = _level(site, [[0, 1]], level=1)  # and then the small one, in a second request
    assert reply.is_error and "both children" in reply.meta["error"]


def test_a_server_asking_for_both_children_of_a_split_is_refused():
    site = _started_site()
    _level(site, [[0, 0]])
    split = {"split:tree": np.array([0]), "split:node": np.array([0]), "split:feature": np.array([0]),
             "split:bin": np.array([0]), "split:default_left": np.array([True]),
             "split:left": np.array([1]), "split:right": np.array([2])}
    reply = _level(site, [[0, 1], [0, 2]], level=1, **split)
    assert reply.is_error and "both children" in reply.meta["error"]


def test_server_chosen_edges_isolating_one_row_release_no_single_row():
    _, parts = classification_parts(300, 3, 2, 0, (1.0,), seed=11)
    x0 = np.sort(Site("t", parts[0], "target").rows("train")["f0"].to_numpy())
    v = x0[150]
    lo, hi = np.nextafter(np.float32(v), np.float32(-np.inf)), np.nextafter(np.float32(v), np.float32(np.inf))
    site = _started_site(edges=[np.array([lo, hi], np.float32), np.array([0.0], np.float32),
                                np.array([0.0], np.float32)])
    hist = _level(site, [[0, 0]]).arrays["hist"][0]
    g = hist[0:4, 0]  # feature 0: bins (<lo), [lo, hi) = one row, (>= hi), missing
    assert g[1] == pytest.approx(g[0]) or g[1] == pytest.approx(g[2])  # the one-row bin is averaged into a run
    exact = _started_site(min_rows=1, edges=[np.array([lo, hi], np.float32), np.array([0.0], np.float32),
                                             np.array([0.0], np.float32)])
    ex = _level(exact, [[0, 0]]).arrays["hist"][0]
    assert ex[1, 1] == pytest.approx(0.25)  # without the floor the bin holds the one row's hessian p(1-p)


def test_a_replayed_or_out_of_order_level_request_is_refused():
    site = _started_site()
    reply = _level(site, [[0, 0]], round_=3)
    assert reply.is_error and "another round" in reply.meta["error"]
    reply = _level(site, [[0, 1]], level=1)
    assert reply.is_error and "before the round" in reply.meta["error"]


def test_the_site_state_survives_an_engines_state_codec():
    from fedtab.engines.site_state import decode_state, encode_state

    site = _started_site()
    _level(site, [[0, 0]])
    msg, skipped = encode_state(site.state)
    assert skipped == ["gbdt_live"]  # the live object stays in the process; the arrays travel
    fresh = Site("s", site.table, "target", policy={"min_rows": 10, "allow_server_row_sets": True})
    fresh.state = decode_state(msg)
    a = _level(site, [[0, 1]], level=1, **_split(0))
    b = _level(fresh, [[0, 1]], level=1, **_split(0))
    assert a.kind == b.kind == "gbdt_level", (a.meta, b.meta)
    assert a.arrays["hist"].any()
    np.testing.assert_array_equal(a.arrays["hist"], b.arrays["hist"])


def test_a_site_refuses_another_target_and_non_numeric_columns():
    parts = _parts(seed=12)
    with pytest.raises(FederationError, match="target"):
        run_gbdt(_fed(parts), None, target="other", params=FAST)


def test_categorical_columns_through_the_agreed_one_hot_encoding():
    from fedtab.federation.steps.encoding import federated_one_hot

    parts = _parts(seed=13, missing=0.0, drop=None)
    rng = np.random.default_rng(1)
    for p in parts:  # a category that carries the label
        p["colour"] = np.where(p["target"].to_numpy() == 1, rng.choice(["red", "blue"], len(p), p=[0.8, 0.2]),
                               rng.choice(["red", "blue"], len(p), p=[0.2, 0.8]))
    fed = _fed(parts)
    cats = federated_one_hot(fed, ["colour"])
    assert cats == {"colour": ["blue", "red"]}
    fed.schema = None  # the encoded tables declare their new columns
    out = run_gbdt(fed, None, params=FAST)
    assert {"colour=blue", "colour=red"} <= set(out.features)
    used = {out.features[f] for f in out.model.nodes["feature"][out.model.nodes["left"] >= 0]}
    assert used & {"colour=blue", "colour=red"}


def test_a_planned_run_accountant_pays_for_the_boosting_releases():
    from fedtab.federation.protocol import plan_run_ledger
    from fedtab.federation.workflows.training import run_training
    from fedtab.federation.workflows.training.steps import dp_plan
    from fedtab.learn.models import make_model

    fed = _fed(_parts(seed=14, missing=0.0, drop=None))
    set_options(fed, dp={"epsilon": 50.0, "delta": 1e-5, "bounds": [-6.0, 6.0]})
    spec = {"name": "gbdt", "params": {**FAST, "n_trees": 2}}
    ledger = plan_run_ledger(fed, [dp_plan(make_model(spec), 1, 1, 0, False)])
    tr = run_training(fed, None, model=spec)
    assert fed.privacy_ledger is ledger  # the run's one accountant, not a budget of its own
    assert tr.privacy["steps"]["gbdt.level"] > 0 and fed.privacy_spent == []


def test_a_model_to_evaluate_must_split_at_the_agreed_edges_and_rounds_are_capped():
    parts = _parts(seed=17)
    fed = _fed(parts)
    out = run_gbdt(fed, None, params=FAST)
    arrays = out.model.to_arrays()
    inner = np.flatnonzero(arrays["left"] >= 0)
    arrays["threshold"][inner[0]] = np.float32(0.123456)  # a threshold of the server's choosing
    site = fed.site("s0")
    reply = site.handle(Message("gbdt_evaluate", {f"param:{k}": v for k, v in arrays.items()}, {"part": "test"}))
    assert reply.is_error and "agreed bin edges" in reply.meta["error"]
    capped = LocalFederation(make_sites(parts, policy={"min_rows": 10, "allow_server_row_sets": True, "max_rounds": 2}))
    with pytest.raises(FederationError, match="max_rounds"):
        run_gbdt(capped, None, params=FAST)  # 4 rounds asked, the sites answer 2
