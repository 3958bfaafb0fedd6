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


# ----------------------------------------------------------------------------- late refusals
# A secure request whose field list leaves a summable array of the reply unmasked can only be
# refused after its handler ran (the reply's arrays depend on the model or nodes the server sent):
# the site puts its state back (issue 28 items 4 and 7).
from fedtab.engines.local import LocalFederation  # noqa: E402
from fedtab.federation import register_all  # noqa: E402
from fedtab.federation.protocol import set_options  # noqa: E402
from fedtab.federation.site.registry import HANDLERS  # noqa: E402
from fedtab.federation.workflows.gbdt import run_gbdt  # noqa: E402

register_all()
SUMMABLE = sorted(n for n, k in KINDS.items() if k.summed and k.home.startswith("fedtab."))


class _Recording(LocalFederation):
    """A curious server's log of every request it sent and what came back."""

    def __init__(self, sites) -> None:
        super().__init__(sites)
        self.seen: list[tuple[str, Message, Message]] = []

    def ask(self, requests):
        out = super().ask(requests)
        self.seen += [(name, requests[name], out[name]) for name in out]
        return out


def _secure_run() -> _Recording:
    """Three verified sites after a secure GBDT run: a session set up, boosting state at each site."""
    rng = np.random.default_rng(4)
    sites = []
    for i in range(3):
        x = rng.normal(size=(160, 2))
        t = pd.DataFrame(x, columns=["x", "z"]).assign(target=(x[:, 0] + rng.normal(0, .5, 160) > 0).astype(int))
        sites.append(Site(f"h{i}", t, "target", policy={"min_rows": MIN_ROWS}))
    fed = _Recording(sites)
    set_options(fed, secure_aggregation=True)
    run_gbdt(fed, None, params={"n_trees": 2, "max_depth": 2, "max_bins": 16})
    return fed


def _recaptured(fed: _Recording, kind: str, label: str, fields: list) -> Message:
    """The last secure ``kind`` request h0 answered, with a fresh label and the server's own field list."""
    sent = [q for s, q, r in fed.seen if s == "h0" and q.kind == kind and "secagg" in q.meta and not r.is_refusal]
    q = sent[-1]
    return Message(kind, q.arrays, {**q.meta, "secagg": {**q.meta["secagg"], "label": label, "fields": fields}})


@pytest.fixture(scope="module")
def secure_fed() -> _Recording:
    return _secure_run()


def test_a_secure_gbdt_start_leaving_its_label_sums_unmasked_is_refused_and_rolled_back(secure_fed):
    """The real handler: ``gbdt_start`` replaces the site's boosting state before the reply is seen."""
    site = secure_fed.site("h0")
    before, booster = site.state_digest(), site.state["gbdt"]["booster"]
    reply = site.handle(_recaptured(secure_fed, "gbdt_start", "late-start", []))
    assert reply.is_refusal and "label_sums" in reply.meta["reason"] and "unmasked" in reply.meta["reason"]
    assert not reply.arrays
    assert site.state_digest() == before
    np.testing.assert_array_equal(site.state["gbdt"]["booster"]["margins"], booster["margins"])
    # the control: the same request with its array masked is answered and does change the state
    answered = site.handle(_recaptured(secure_fed, "gbdt_start", "late-start-ok", [["label_sums", 16, False]]))
    assert not answered.is_refusal and not answered.is_error, answered.meta
    assert site.state_digest() != before


def _mutating(kind: str):
    """A stand-in handler that changes the site's state (a new key, a stored array changed in
    place, a nested list grown, a table step counted) and replies every summable array of ``kind``."""
    decl = KINDS[kind]

    def fn(site: Site, request: Message) -> Message:
        site.state["late"] = {"seen": kind}
        site.state["gbdt"]["booster"]["margins"][:] += 1.0
        site.state.setdefault("late_list", []).append(kind)
        site._steps_applied += 1
        names = [*decl.releases.cells, *(a for v in decl.releases.cells.values() for a in v),
                 *decl.releases.histograms, *decl.releases.aggregates]
        if decl.releases.model:
            names.append(decl.releases.model + "coef")
        return Message(kind, {n: np.ones(2) for n in names if decl.summable(n)})
    return fn


@pytest.mark.parametrize("kind", SUMMABLE)
def test_a_late_refusal_of_every_summable_kind_leaves_the_site_as_it_was(secure_fed, kind, monkeypatch):
    """A curious server sends a verified secure request of each summed kind whose fields mask none
    of the reply's summable arrays; the site's handler (here one that changes everything it can)
    runs, the site refuses after it, and nothing it changed is kept — nor the ledger's charges."""
    site = secure_fed.site("h0")
    monkeypatch.setitem(HANDLERS, kind, _mutating(kind))
    good = _good_requests().get(kind)
    base = _recaptured(secure_fed, "gbdt_level", f"late-{kind}", [])
    request = Message(kind, {**base.arrays, **(good.arrays if good else {})},
                      {**(good.meta if good else {}), "secagg": base.meta["secagg"]})
    before, ledger = site.state_digest(), site.ledger.snapshot()
    reply = site.handle(request)
    assert reply.is_refusal, (kind, reply.meta)
    assert "unmasked" in reply.meta["reason"], (kind, reply.meta)  # refused after the handler, not before
    assert site.state_digest() == before, kind
    assert site.ledger.snapshot() == ledger and "late" not in site.state and "late_list" not in site.state


def test_a_field_the_kind_does_not_declare_summable_is_refused_before_the_handler(secure_fed, monkeypatch):
    site = secure_fed.site("h0")
    ran = []
    monkeypatch.setitem(HANDLERS, "gbdt_level", lambda s, r: ran.append(1) or Message("gbdt_level"))
    reply = site.handle(_recaptured(secure_fed, "gbdt_level", "odd-field", [["nodes", 0, False]]))
    assert reply.is_refusal and "does not declare summable" in reply.meta["reason"] and not ran
