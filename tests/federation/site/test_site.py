"""Check before apply, everywhere (issue 28 item 7): a request the site refuses changes no site
state — not its ledger, its stored setups and schema, its table or its parts.

For every kind the registry declares (:data:`fedtab.federation.protocol.kinds.KINDS`, not a list kept
here) a hostile server sends requests the site must refuse: a malformed DP spec, the same with an
agreed schema riding along, a secure-aggregation spec for a session the site never set up, and a
part the site does not have; and, for the kinds that charge the ledger, a request the policy
passes (and charges) that is then refused on its DP terms. :meth:`Site.state_digest` must be the
same before and after each.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.federation.protocol.kinds import KINDS
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol.schema import AGREED
from fedtab.federation.site.core import Site

MIN_ROWS = 10


def _site() -> Site:
    """A site part-way through a run: a training setup, one fit round and a selection setup."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=300)
    table = pd.DataFrame({"x": x, "z": rng.normal(size=300), "target": (x + rng.normal(size=300) > 0).astype(int)})
    site = Site("s", table, "target", policy={"min_rows": MIN_ROWS})
    for request in _good_requests().values():
        reply = site.handle(request)
        assert not reply.is_refusal and not reply.is_error, (request.kind, reply.meta)
    return site


def _good_requests() -> dict[str, Message]:
    """Requests a default site answers (and charges to its ledger), in run order."""
    d, M = 2, 2
    setup = {"features": ["x", "z"], "classes": ["0", "1"], "model": {"name": "logistic", "params": {}},
             "part": "train"}
    chains = {"setup:masks": np.ones((1, d), bool), "setup:chain_mask": np.zeros(M, np.int64),
              "setup:chain_fold": np.array([0, 1], np.int64), "setup:mean": np.zeros((M, d)),
              "setup:std": np.ones((M, d)), "setup:chain_l2": np.full(M, 1e-3)}
    model = {"param:coef": np.zeros((M, 1, d)), "param:intercept": np.zeros((M, 1))}
    return {
        "fit": Message("fit", {"setup:mean": np.zeros(2), "setup:std": np.ones(2), "param:coef": np.zeros((1, 2)),
                               "param:intercept": np.zeros(1)}, {"setup": setup, "epochs": 1}),
        "evaluate": Message("evaluate", {"param:coef": np.ones((1, 2)), "param:intercept": np.zeros(1)},
                            {"part": "test"}),
        "describe": Message("describe", meta={"part": "train"}),
        "select_fit": Message("select_fit", {**chains, **model},
                              {"setup": {**{k: v for k, v in setup.items() if k != "part"}, "without": [""] * M},
                               "epochs": 1}),
        "select_evaluate": Message("select_evaluate", model, {"slots": [[0, "none"], [1, "none"]], "stage": "cv"}),
        "ballot": Message("ballot"),
    }


def _hostile(kind: str) -> list[tuple[str, Message]]:
    schema = {"columns": ["x", "z"], "holders": [1, 1]}
    out = [("bad DP spec", Message(kind, meta={"dp": "not an object"})),
           ("bad DP spec with a schema", Message(kind, meta={"dp": [1], AGREED: schema})),
           ("unknown secure session", Message(kind, meta={"secagg": {"session": "nope", "fields": [["x", 1]]}})),
           ("a part the site lacks", Message(kind, meta={"part": "fold:99", "dp": "x"}))]
    good = _good_requests().get(kind)
    if good is not None:  # passes the policy (which charges it), then refused on its DP terms
        out.append(("charged, then refused", Message(kind, good.arrays, {**good.meta, "dp": {"z": -1.0}})))
        out.append(("charged, then refused, with a schema",
                    Message(kind, good.arrays, {**good.meta, "dp": "x", AGREED: schema})))
    return out


@pytest.fixture(scope="module")
def site() -> Site:
    return _site()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_refused_request_of_any_kind_changes_no_site_state(site, kind):
    for what, request in _hostile(kind):
        before = site.state_digest()
        reply = site.handle(request)
        assert reply.is_refusal or reply.is_error, (kind, what, reply.meta)
        assert site.state_digest() == before, (kind, what, reply.meta)
    assert any(site.handle(r).is_refusal for _, r in _hostile(kind)), kind


def test_the_digest_sees_a_charge_and_a_stored_schema():
    """The control: an accepted request changes the digest (the test above can fail)."""
    site = _site()
    before = site.state_digest()
    assert not site.handle(_good_requests()["evaluate"]).is_refusal
    charged = site.state_digest()
    assert charged != before
    reply = site.handle(Message("describe", meta={"part": "train", AGREED: {"columns": ["x", "z"],
                                                                             "holders": [1, 1]}}))
    assert not reply.is_refusal and not reply.is_error, reply.meta
    assert site.state_digest() != charged and site.state["schema"]["columns"] == ["x", "z"]
