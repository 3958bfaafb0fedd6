"""A curious server against the site's release path (issue 20): one test per attack family.

The server chooses every parameter it sends — part names, seeds, noise, bin counts, models,
category lists, setups — and sends only message kinds that sites answer by default. Each
test asserts that nothing is recovered: a refusal naming the rule, or a reply with no number
computed over fewer than ``min_rows`` rows. (Secure aggregation's own attacks — substituted
keys, self-only peers, a lie about dropouts — are in ``test_secagg_adversary.py``.)
"""

import math

import numpy as np
import pandas as pd
import pytest

from fedtab import Site
from fedtab.federation import Message
from fedtab.privacy import DisclosurePolicy
from fedtab.privacy.gate import Releases, smooth_histogram

MIN_ROWS = 10




def _site(table, **kw):
    return Site("hospital", table, "target", policy=DisclosurePolicy(min_rows=MIN_ROWS), **kw)


def _values_in(reply: Message) -> set[float]:
    out = set()
    for a in reply.arrays.values():
        if a.dtype.kind in "iuf":
            out.update(float(x) for x in np.ravel(a))
    return out


# ----------------------------------------------------------------------------- parts
def test_the_server_cannot_size_or_seed_a_part(table):
    site = _site(table)
    # the old server-sized split is no request a site answers
    reply = site.handle(Message("split_validation", meta={"validation_size": 1e-6, "seed": 7}))
    assert reply.is_error and "no handler" in reply.meta["error"]
    # made-up row sets are refused; the site's own parts are answered
    for part in ("rows:0-1", "fold:99", "validation[0]"):
        assert site.handle(Message("describe", meta={"part": part})).is_refusal
    sizes = site.part_sizes()
    assert all(n == 0 or n >= MIN_ROWS for n in sizes.values()), sizes


def test_differencing_two_parts_never_isolates_fewer_than_min_rows_rows(table):
    """describe(train) − describe(fit) is the validation fold's sums: over >= min_rows rows."""
    site = _site(table)
    train = site.handle(Message("describe", meta={"part": "train"}))
    fit = site.handle(Message("describe", meta={"part": "fit"}))
    diff = train.arrays["count"] - fit.arrays["count"]
    assert diff.min() >= MIN_ROWS  # the validation fold: every column observed in >= min_rows of its rows
    # every pair of the site's parts differs by 0 or >= min_rows rows
    idx = {p: set(site.parts.indices(p).tolist()) for p in site.part_sizes()}
    for a in idx:
        for b in idx:
            n = len(idx[a] ^ idx[b])
            assert n == 0 or n >= MIN_ROWS, (a, b, n)


def test_class_moments_and_evaluations_refuse_a_class_below_the_floor():
    rng = np.random.default_rng(1)
    t = pd.DataFrame({"x": rng.normal(size=120), "target": [0] * 112 + [1] * 8})  # 8 positives in all
    site = Site("s", t, "target", policy=DisclosurePolicy(min_rows=MIN_ROWS), test_size=0.2)
    assert site.n_rows("test") >= MIN_ROWS and site.class_counts("test") == {"0": site.n_rows("test")}
    # a class below the floor is in no part (issue 28): nothing is computed over its 8 rows
    for part in site.part_sizes():
        assert "1" not in site.class_counts(part), part
    reply = site.handle(Message("class_moments", meta={"part": "train"}))
    assert not reply.is_refusal and reply.meta["classes"] == ["0"]
    # parts that held them (the old draw: all 8 in train) are refused by the gate per class
    from fedtab.federation.site.parts import RowParts

    idx = np.arange(len(t))
    site.parts = RowParts(len(t), np.setdiff1d(idx, site.parts.test), site.parts.test)
    reply = site.handle(Message("class_moments", meta={"part": "train"}))  # 8 positives in train
    assert reply.is_refusal and "class" in reply.meta["reason"]


def test_a_test_part_below_the_floor_is_not_evaluated(table):
    site = Site("tiny", table.iloc[:30], "target", policy=DisclosurePolicy(min_rows=MIN_ROWS))
    assert site.n_rows("test") == 0  # 30 rows: no class can give 10 test rows, so there is no test part
    small = Site("small", table.iloc[:30], "target", policy=DisclosurePolicy(min_rows=2))
    assert 0 < small.n_rows("test") < MIN_ROWS
    # a site that fixed 6 test rows by itself still answers nothing over them under min_rows=10
    fixed = Site("fixed", table.iloc[:30], "target", policy=DisclosurePolicy(min_rows=MIN_ROWS))
    fixed.parts = small.parts
    assert fixed.handle(Message("describe", meta={"part": "test"})).is_refusal


# ----------------------------------------------------------------------------- crafted models, fine bins
def _crafted_evaluation(site, weight: float, bins: int) -> Message:
    """A one-weight logistic model on 'income' with the server's own standardisation."""
    feats = ["income", "age", "bmi"]
    setup = {"features": feats, "classes": ["0", "1"], "model": {"name": "logistic", "params": {}}, "part": "train"}
    site.handle(Message("fit", {"setup:mean": np.array([55_000.0, 0, 0]), "setup:std": np.array([20_000.0, 1, 1]),
                                "param:coef": np.zeros((1, 3)), "param:intercept": np.zeros(1)},
                        {"setup": setup, "epochs": 1}))
    coef = np.array([[weight, 0.0, 0.0]])
    return site.handle(Message("evaluate", {"param:coef": coef, "param:intercept": np.zeros(1)},
                               {"part": "test", "score_bins": bins}))


def test_a_crafted_model_with_fine_bins_recovers_no_value(table):
    site = _site(table)
    assert _crafted_evaluation(site, 1.0, 100_000).is_refusal  # bins beyond the site's cap
    assert _crafted_evaluation(site, 1e9, 1000).is_refusal  # a weight beyond the site's bound
    reply = _crafted_evaluation(site, 50.0, 1000)
    hist = reply.arrays["score_hist"]
    for row in hist:  # every run of equal non-zero bins stands for >= min_rows rows
        nz = np.flatnonzero(row)
        runs = np.split(nz, np.flatnonzero(np.diff(row[nz]) != 0) + 1) if len(nz) else []
        for run in runs:
            assert row[run].sum() >= MIN_ROWS - 1e-9
    # an exact histogram would have put each test row in its own bin: the reply is smoothed
    assert reply.meta.get("smoothed") is True
    assert smooth_histogram(np.array([[1, 1, 1, 0, 9, 0]]), 3).tolist() == [[1, 1, 1, 3, 3, 3]]


# ----------------------------------------------------------------------------- imputation masks
def test_server_seeded_imputation_masks_isolate_no_cell(table):
    pytest.importorskip("torch")
    from fedtab.federation.workflows.imputation import ImputeConfig
    from fedtab.impute.graph import build_feature_graph
    from fedtab.impute.model import GNNConfig, GNNImputer, state_to_numpy

    t = table.drop(columns="target")
    site = Site("s", t, policy=DisclosurePolicy(min_rows=MIN_ROWS), test_size=0.3)
    cols = list(t.columns)
    graph = build_feature_graph(np.eye(3), cols, k=2)
    mcfg = GNNConfig(n_features=3, hidden_dim=4, n_layers=1)
    weights = {f"w/{k}": v for k, v in state_to_numpy(GNNImputer(mcfg)).items()}
    masks = []
    for seed, fraction in ((1, 0.01), (2, 0.02), (99, 0.5)):  # the server picks seeds and fractions
        cfg = ImputeConfig(seed=seed, validation_mask_fraction=fraction, hidden_dim=4, n_layers=1)
        setup = Message("impute_setup", {"edge_index": graph.edge_index, "weight": graph.weight, "sign": graph.sign,
                                         "mean": np.zeros(3), "std": np.ones(3)},
                        {"columns": cols, "config": cfg.__dict__, "model": mcfg.to_dict()})
        assert not site.handle(setup).is_error
        reply = site.handle(Message("impute_eval", weights))
        counts = reply.arrays["val_count"]
        assert all(c == 0 or c >= MIN_ROWS for c in counts), counts  # no error sum over a few cells
        masks.append(site.state["impute_live"]["valid_mask"].copy())
    assert np.array_equal(masks[0], masks[1])  # the server's seed changes nothing: the site draws its cells


# ----------------------------------------------------------------------------- error texts and categories
def test_error_texts_quote_no_cell_value(table):
    site = _site(table)
    incomes = {f"{v:g}" for v in table["income"]} | {str(int(v)) for v in table["income"]}
    replies = [site.handle(Message("one_hot", meta={"categories": {"income": ["1", "2"]}})),
               site.handle(Message("category_sets", meta={"columns": ["income"]})),
               site.handle(Message("describe", meta={"features": ["income"], "part": "no such part"}))]
    for r in replies:
        text = r.meta.get("error") or r.meta.get("reason") or ""
        assert r.is_error or r.is_refusal
        assert not any(v in text for v in incomes), text


def test_a_rare_category_gets_no_indicator_of_its_own():
    t = pd.DataFrame({"job": ["clerk"] * 60 + ["nurse"] * 57 + ["astronaut"] * 3, "target": [0, 1] * 60})
    site = Site("s", t, "target", policy=DisclosurePolicy(min_rows=MIN_ROWS))
    listed = site.handle(Message("category_sets", meta={"columns": ["job"]}))
    assert listed.meta["categories"]["job"] == ["clerk", "nurse", "(other)"]
    # another site made "astronaut" a level of its own: this site still encodes its training rows as (other)
    site.handle(Message("one_hot", meta={"categories": {"job": ["astronaut", "clerk", "nurse", "(other)"]}}))
    # ... and as its (other) bucket holds 3 rows, fewer than the floor, they are encoded as missing
    train = site.rows("train")
    assert train["job=astronaut"].sum() == 0 and train["job=(other)"].sum() == 0
    # its test rows are encoded as the model file encodes them at predict: an astronaut is an astronaut
    test = site.rows("test")
    astronauts = int(t["job"].iloc[site.parts.test].eq("astronaut").sum())
    assert astronauts >= 1 and test["job=astronaut"].sum() == astronauts and test["job=(other)"].sum() == 0
    for part in ("train", "test", "all"):  # no description counts them (fewer than the floor)
        reply = site.handle(Message("describe", meta={"part": part, "features": ["job=astronaut", "job=(other)"]}))
        assert reply.arrays["sum"].tolist() == [0.0, 0.0], part


def test_the_job_profile_sends_no_row_value(table):
    site = _site(table)
    reply = site.handle(Message("job_profile"))
    cols = reply.meta["columns"]
    for c, low, high in zip(cols, reply.arrays["low"], reply.arrays["high"]):
        values = set(table[c].astype(float))
        assert low not in values or float(low) == round(float(low), -int(math.floor(math.log10(abs(low) or 1))) + 1)
        assert low <= np.sort(table[c])[MIN_ROWS - 1] and high >= np.sort(table[c])[-MIN_ROWS]
    assert reply.arrays["low"][cols.index("income")] % 1000 == 0  # two significant digits of 5 digits


# ----------------------------------------------------------------------------- differential privacy
def test_noise_below_the_sites_floor_is_raised_to_it(table):
    site = _site(table)
    z_asked = 1e-300
    sums = [site.handle(Message("describe", meta={"features": ["bmi"],
                                                  "dp": {"z": z_asked, "bounds": [0.0, 60.0]}})).arrays["sum"][0]
            for _ in range(8)]
    from fedtab.privacy.dp import site_noise_floor

    floor = site_noise_floor(site.policy.max_epsilon_per_release, site.policy.delta)
    assert np.std(sums) > 0.2 * floor * 60  # the site's own noise (Δ = 60), not the server's 1e-300


def test_repeated_dp_queries_stop_at_the_sites_budget(table):
    site = Site("s", table, "target", policy=DisclosurePolicy(min_rows=MIN_ROWS, epsilon_budget=20.0))
    req = Message("describe", meta={"features": ["bmi"], "dp": {"z": 2.0, "bounds": [0.0, 60.0]}})
    answered = 0
    for _ in range(4000):
        reply = site.handle(req)
        if reply.is_refusal:
            assert "budget 20" in reply.meta["reason"]
            break
        answered += 1
    assert 0 < answered < 4000  # averaging 4,000 noisy answers is not possible
    assert site.ledger.epsilon_spent(site.policy.delta) <= 20.0
    assert site.handle(req).is_refusal  # and it stays refused


# ----------------------------------------------------------------------------- caps
def test_a_resent_setup_does_not_reset_the_round_cap(table):
    site = Site("s", table, "target", policy=DisclosurePolicy(min_rows=MIN_ROWS, max_rounds=3))
    setup = {"features": ["income", "age", "bmi"], "classes": ["0", "1"],
             "model": {"name": "logistic", "params": {}}, "part": "train"}
    arrays = {"setup:mean": np.zeros(3), "setup:std": np.ones(3), "param:coef": np.zeros((1, 3)),
              "param:intercept": np.zeros(1)}
    answered = sum(not site.handle(Message("fit", arrays, {"setup": setup, "epochs": 1})).is_refusal
                   for _ in range(20))
    assert answered == 3
    scores = 0
    for _ in range(6):  # the score test's setup rides on every request: still capped
        r = site.handle(Message("score_sums", {"setup:mean": np.zeros(3), "setup:std": np.ones(3),
                                               "coef": np.zeros(1)},
                                {"setup": {"features": setup["features"], "classes": ["0", "1"], "part": "train"},
                                 "selected": []}))
        scores += not r.is_refusal
    assert scores == 3


def test_the_ledger_outlives_the_site_object(table, tmp_path):
    policy = DisclosurePolicy(min_rows=MIN_ROWS, max_evaluations=2)
    site = Site("s", table, "target", policy=policy, state_dir=tmp_path)
    setup = {"features": ["income", "age", "bmi"], "classes": ["0", "1"],
             "model": {"name": "logistic", "params": {}}, "part": "train"}
    site.handle(Message("fit", {"setup:mean": np.zeros(3), "setup:std": np.ones(3), "param:coef": np.zeros((1, 3)),
                                "param:intercept": np.zeros(1)}, {"setup": setup, "epochs": 1}))
    ev = Message("evaluate", {"param:coef": np.zeros((1, 3)), "param:intercept": np.zeros(1)}, {"part": "test"})
    assert [site.handle(ev).is_refusal for _ in range(2)] == [False, False]
    restarted = Site("s", table, "target", policy=policy, state_dir=tmp_path)  # a restart: same state folder
    restarted.state["train_setup"] = site.state["train_setup"]
    reply = restarted.handle(ev)
    assert reply.is_refusal and "max_evaluations=2" in reply.meta["reason"]
    assert (tmp_path / "ledger.json").is_file()


# ----------------------------------------------------------------------------- the gate is default-deny
def test_a_handler_without_a_declaration_or_with_an_undeclared_release_is_refused(table, monkeypatch):
    from fedtab.federation.protocol.kinds import MessageKind, declare
    from fedtab.federation.site.core import HANDLERS
    from fedtab.federation.site.registry import handler

    rows = lambda site, request: Message("probe_rows", {"rows": site.table.to_numpy()})  # noqa: E731
    with pytest.raises(ValueError, match="not declared"):  # no handler without a declaration
        handler("probe_rows")(rows)
    assert "probe_rows" not in HANDLERS
    monkeypatch.setitem(HANDLERS, "probe_rows", rows)  # one slipped in past the registry: the gate refuses it
    if "probe_sum" not in HANDLERS:
        declare(MessageKind("probe_sum", __name__, Releases(part="=train", aggregates=("sum",)), "a test's sum"))
        handler("probe_sum")(
            lambda site, request: Message("probe_sum", {"sum": np.zeros(1), "rows": site.table.to_numpy()}))
    site = _site(table)
    undeclared = site.handle(Message("probe_rows"))
    assert undeclared.is_refusal and "no declaration" in undeclared.meta["reason"]
    leaky = site.handle(Message("probe_sum"))
    assert leaky.is_error and "undeclared array" in leaky.meta["error"] and not leaky.arrays
