"""Selection chains buy no evaluation allowance (issue 28 item 5): a curious server mixing
``select_fit`` chain requests with evaluations of its own crafted models. Every chain a site sets up
is one evaluation of the part it trains on (once) and one model's work per round; its later rounds are
fit rounds (``max_rounds``) of the same chains; the chains it trained widen only
``select_evaluate``'s distinct-model count, never ``evaluate``'s."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedtab.federation import Message, register_all
from fedtab.federation.site.core import Site
from fedtab.privacy.policy import PLAIN_MODELS_EXTRA, plain_model_cap

register_all()
D = 2


def _site(**policy) -> Site:
    rng = np.random.default_rng(7)
    x = rng.normal(size=300)
    table = pd.DataFrame({"x": x, "z": rng.normal(size=300), "target": (x + rng.normal(size=300) > 0).astype(int)})
    site = Site("s", table, "target", policy={"min_rows": 10, **policy})
    site.run_id = "curious-run"
    setup = {"features": ["x", "z"], "classes": ["0", "1"], "model": {"name": "logistic", "params": {}},
             "part": "train"}  # one honest training round: the model setup evaluate scores with
    fit = Message("fit", {"setup:mean": np.zeros(D), "setup:std": np.ones(D), "param:coef": np.zeros((1, D)),
                          "param:intercept": np.zeros(1)}, {"setup": setup, "epochs": 1})
    assert _answered(site.handle(fit))
    return site


def _chains(site: Site, m: int, fold: int | None = None, seed: int = 0) -> Message:
    """``select_fit`` of ``m`` chains of the server's choosing (folds cycled, or all on ``fold``)."""
    rng = np.random.default_rng(seed)
    folds = np.array([fold if fold is not None else i % site.parts.n_folds for i in range(m)], np.int64)
    arrays = {"setup:masks": np.ones((1, D), bool), "setup:chain_mask": np.zeros(m, np.int64),
              "setup:chain_fold": folds, "setup:mean": np.zeros((m, D)), "setup:std": np.ones((m, D)),
              "setup:chain_l2": np.full(m, 1e-3), "param:coef": rng.normal(size=(m, 1, D)),
              "param:intercept": np.zeros((m, 1))}
    setup = {"features": ["x", "z"], "classes": ["0", "1"], "model": {"name": "logistic", "params": {}},
             "without": [""] * m}
    return Message("select_fit", arrays, {"setup": setup, "epochs": 1})


def _crafted(i: int) -> Message:
    """A step-function-like model of the server's: a steep slope at threshold ``i / 10`` on ``x``."""
    return Message("evaluate", {"param:coef": np.array([[50.0, 0.0]]), "param:intercept": np.array([-5.0 * i])},
                   {"part": "test"})


def _answered(reply: Message) -> bool:
    return not reply.is_refusal and not reply.is_error


def test_chains_buy_no_allowance_to_score_crafted_models_in_the_clear():
    site = _site()
    cap = plain_model_cap(site, "evaluate")
    for seed in range(3):  # 3 x 40 chains the server chose: answered, each one a trained model
        assert _answered(site.handle(_chains(site, 40, seed=seed)))
    assert site.ledger.run_count(site.run_id, "select_chains") == 120
    # the chains widen select_evaluate's count (their own scoring), not evaluate's: 1 + 3 fit rounds + extra
    assert plain_model_cap(site, "select_evaluate") == 4 + 120 + PLAIN_MODELS_EXTRA
    assert plain_model_cap(site, "evaluate") == cap + 3 == 4 + PLAIN_MODELS_EXTRA
    answered = 0
    for i in range(40):
        reply = site.handle(_crafted(i))
        if not _answered(reply):
            assert "allow_server_row_sets" in reply.meta["reason"], reply.meta
            break
        answered += 1
    assert answered == 4 + PLAIN_MODELS_EXTRA  # not 120 more


def test_every_chain_is_one_evaluation_of_the_part_it_trains_on():
    site = _site(max_evaluations=20)
    before = site.ledger.snapshot()
    refused = site.handle(_chains(site, 21, fold=0))  # 21 chains on fit:0 in one request: past the cap
    assert refused.is_refusal and "max_evaluations=20" in refused.meta["reason"], refused.meta
    assert site.ledger.snapshot() == before  # nothing charged, not even the round
    trained = 0
    for seed in range(5):  # mixing requests of 8 chains each on fit:0: 2 answered, the 3rd would pass 20
        reply = site.handle(_chains(site, 8, fold=0, seed=seed))
        if _answered(reply):
            trained += 8
        else:
            assert "max_evaluations=20" in reply.meta["reason"], reply.meta
    assert trained == 16
    assert site.ledger.snapshot()["runs"][site.run_id]["evaluate:fit:0"] == 16
    # chains on other folds count against their own parts
    assert _answered(site.handle(_chains(site, 8, fold=1)))
    assert site.ledger.snapshot()["runs"][site.run_id]["evaluate:fit:1"] == 8


def _next_round(m: int, seed: int, scale: float = 1.0) -> Message:
    """A later round of the stored chains: the server's (possibly crafted) coefficients, no setup."""
    rng = np.random.default_rng(seed)
    return Message("select_fit", {"param:coef": scale * rng.normal(size=(m, 1, D)), "param:intercept": np.zeros((m, 1))},
                   {"epochs": 1})


def test_later_rounds_of_the_chains_are_fit_rounds_bounded_by_max_rounds():
    """A curious server re-sending crafted coefficients for the chains it set up: each request is one
    fit round (``max_rounds``), no new evaluation and no new trained model; it cannot grow the chains
    without a setup (then counted again), nor send coefficients beyond ``max_model_abs``."""
    site = _site(max_rounds=4, max_evaluations=20, max_model_abs=100.0)
    assert _answered(site.handle(_chains(site, 8, fold=0)))  # the setup: 8 evaluations of fit:0, round 2
    runs = site.ledger.snapshot()["runs"][site.run_id]
    assert (runs["evaluate:fit:0"], runs["select_chains"]) == (8, 8)
    answered = 0
    for seed in range(6):
        reply = site.handle(_next_round(8, seed))
        if not _answered(reply):
            assert "max_rounds=4" in reply.meta["reason"], reply.meta
            break
        answered += 1
    assert answered == 2  # the honest fit round, the setup's round, then 2 more: max_rounds = 4
    runs = site.ledger.snapshot()["runs"][site.run_id]
    assert (runs["evaluate:fit:0"], runs["select_chains"]) == (8, 8)  # rounds buy no allowance either
    fresh = _site(max_evaluations=20, max_model_abs=100.0)
    assert _answered(fresh.handle(_chains(fresh, 8, fold=0)))
    before = fresh.ledger.snapshot()
    for bad in (_next_round(9, 0), _next_round(8, 0, scale=1e4)):  # more chains than set up; beyond the bound
        reply = fresh.handle(bad)
        assert reply.is_refusal, reply.meta
        assert fresh.ledger.snapshot() == before  # refused before anything is charged
