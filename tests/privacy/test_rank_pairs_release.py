"""The per-site exact AUROC (``rank_pairs``) an evaluation releases, against a curious server (issue 30).

Each site sends, beside its smoothed score histogram, the Mann-Whitney count of its own test
rows (``AUROC · P · N``) so that the pooled AUROC has a bound that holds. It is one number per
evaluation, over the site's own fixed test part (never a row set the server names), under the
part's per-class floor and the site's evaluation cap; under secure aggregation it is not sent.
"""

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from fedtab import Site
from fedtab.federation import HANDLERS, Message
from fedtab.privacy import DisclosurePolicy

MIN_ROWS = 10
FEATS = ["income", "age", "bmi"]


@pytest.fixture
def table():
    rng = np.random.default_rng(4)
    n = 200
    t = pd.DataFrame({"income": rng.normal(50, 10, n), "age": rng.normal(50, 15, n), "bmi": rng.normal(27, 4, n)})
    t["target"] = (t["bmi"] + rng.normal(0, 2, n) > 27).astype(int)
    return t


def _setup(site):
    setup = {"features": FEATS, "classes": ["0", "1"], "model": {"name": "logistic", "params": {}}, "part": "train"}
    site.handle(Message("fit", {"setup:mean": np.array([50.0, 50, 27]), "setup:std": np.array([10.0, 15, 4]),
                                "param:coef": np.zeros((1, 3)), "param:intercept": np.zeros(1)},
                        {"setup": setup, "epochs": 1}))


def _evaluate(site, coef, part="test"):
    return site.handle(Message("evaluate", {"param:coef": np.array([coef], dtype=float),
                                            "param:intercept": np.zeros(1)}, {"part": part, "score_bins": 1000}))


def test_rank_pairs_are_the_exact_auroc_of_the_sites_own_test_part_only(table):
    site = Site("s", table, "target", policy=DisclosurePolicy(min_rows=MIN_ROWS))
    _setup(site)
    reply = _evaluate(site, [0.0, 0.0, 2.0])
    rows = site.rows("test")
    z = 2.0 * (rows["bmi"].to_numpy() - 27) / 4
    y = rows["target"].to_numpy()
    P, N = int(y.sum()), int((1 - y).sum())
    assert reply.arrays["rank_pairs"][0] / (P * N) == pytest.approx(roc_auc_score(y, z), abs=1e-12)
    # a row set the server names is no part: refused, no number leaves
    for part in ("rows:0-5", "test[0]", "fold:99"):
        r = _evaluate(site, [0.0, 0.0, 2.0], part)
        assert r.is_refusal and "rank_pairs" not in r.arrays


def test_no_rank_pairs_over_a_class_below_the_floor():
    rng = np.random.default_rng(1)
    t = pd.DataFrame({"income": rng.normal(size=300), "age": rng.normal(size=300), "bmi": rng.normal(size=300),
                      "target": [0] * 285 + [1] * 15})
    site = Site("s", t, "target", policy=DisclosurePolicy(min_rows=MIN_ROWS), test_size=0.2)
    _setup(site)
    assert site.class_counts("test") == {"0": site.n_rows("test")}  # the site keeps its 3 test positives out
    assert _evaluate(site, [1.0, 0.0, 0.0]).arrays["rank_pairs"].tolist() == [0.0]  # no pair: nothing to rank
    # parts with a class below the floor (as a laxer site drew them) are not evaluated at all
    lax = Site("lax", t, "target", policy=DisclosurePolicy(min_rows=2), test_size=0.2)
    assert 0 < lax.class_counts("test").get("1", 0) < MIN_ROWS
    site.parts = lax.parts
    site.state.get("train_setup", {}).pop("_cache", None)
    reply = _evaluate(site, [1.0, 0.0, 0.0])
    assert reply.is_refusal and "rank_pairs" not in reply.arrays


def test_the_evaluation_cap_bounds_how_many_crafted_models_are_ranked(table):
    """A server sweeping one weight per feature (the per-feature AUROC of the test part) or
    differencing two near-identical models gets at most ``max_evaluations`` rank counts."""
    site = Site("s", table, "target", policy=DisclosurePolicy(min_rows=MIN_ROWS, max_evaluations=3))
    _setup(site)
    replies = [_evaluate(site, w) for w in ([1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [0, 0, 1.0 + 1e-6])]
    assert [r.is_refusal for r in replies] == [False, False, False, True]
    assert "max_evaluations=3" in replies[-1].meta["reason"] and "rank_pairs" not in replies[-1].arrays


def test_under_secure_aggregation_no_site_sends_its_own_auroc(monkeypatch):
    from fedtab import run_training
    from fedtab.federation.protocol import set_options
    from tests.builders import classification_parts, federation

    _, parts = classification_parts(600, 6, 3, 1, [0.4, 0.35, 0.25], seed=0)
    fed = federation(parts)
    set_options(fed, secure_aggregation=True)
    sent = []
    original = HANDLERS["evaluate"]

    def recording(site, request):
        reply = original(site, request)
        sent.append(set(reply.arrays))
        return reply

    monkeypatch.setitem(HANDLERS, "evaluate", recording)
    out = run_training(fed, [c for c in parts[0].columns if c != "target"], rounds=2)
    assert sent and all("rank_pairs" not in a and "score_hist" in a for a in sent)
    assert out.metrics["per_site"] == {} and out.metrics["pooled"]["auroc_bounds"] is not None
