"""The ledger is keyed by the engine's run (issue 28 item 6): per-run caps count per run, the
ε budget per period across runs, and no server locks a site out past its own run by spending
cheap requests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.core import Site
from fedtab.privacy import DisclosurePolicy
from fedtab.privacy.ledger import SiteLedger

FEATURES = ["income", "age", "bmi"]




def _fitted(site: Site) -> None:
    """One fit round: the site then holds the training setup an evaluation needs."""
    setup = {"features": FEATURES, "classes": ["0", "1"], "model": {"name": "logistic", "params": {}}, "part": "train"}
    reply = site.handle(Message("fit", {"setup:mean": np.zeros(3), "setup:std": np.ones(3),
                                        "param:coef": np.zeros((1, 3)), "param:intercept": np.zeros(1)},
                                {"setup": setup, "epochs": 1}))
    assert not reply.is_refusal and not reply.is_error, reply.meta


#: a cheap evaluation of a crafted model (the server's choice of coefficients)
EVALUATE = Message("evaluate", {"param:coef": np.array([[0.0, 0.0, 1.0]]), "param:intercept": np.zeros(1)},
                   {"part": "test"})
#: a cheap DP release: noisy sums of one column (the site noises at its own floor or above)
DP_DESCRIBE = Message("describe", meta={"features": ["bmi"], "dp": {"z": 2.0, "bounds": [0.0, 60.0]}})


def _answered(site: Site, request: Message, most: int) -> tuple[int, str]:
    """``(answered, refusal reason)`` of ``request`` sent until refused (at most ``most`` times)."""
    for i in range(most):
        reply = site.handle(request)
        if reply.is_refusal:
            return i, reply.meta["reason"]
        assert not reply.is_error, reply.meta
    return most, ""


def test_cheap_evaluations_of_one_run_leave_the_next_run_able_to_evaluate(table, tmp_path):
    """500 evaluations of crafted models spent in run A (the default cap) lock run A only: the
    same site, restarted on its state folder, answers run B's evaluations."""
    policy = DisclosurePolicy(min_rows=10)
    site = Site("s", table, "target", policy=policy, state_dir=tmp_path)
    LocalFederation([site], run_id="run-A")
    _fitted(site)
    answered, reason = _answered(site, EVALUATE, 600)
    assert answered == policy.max_evaluations == 500
    assert "max_evaluations=500" in reason and "in this run" in reason
    assert site.handle(EVALUATE).is_refusal  # run A stays locked
    restarted = Site("s", table, "target", policy=policy, state_dir=tmp_path)  # a new process, the same ledger
    LocalFederation([restarted], run_id="run-B")
    _fitted(restarted)
    assert not restarted.handle(EVALUATE).is_refusal
    runs = json.loads((tmp_path / "ledger.json").read_text())["runs"]
    assert runs["run-A"]["evaluate:test"] == 500 and runs["run-B"]["evaluate:test"] == 1
    # a restart inside run A does not reopen it: the run's count is in the file
    again = Site("s", table, "target", policy=policy, state_dir=tmp_path)
    again.run_id = "run-A"
    _fitted(again)
    assert again.handle(EVALUATE).is_refusal


def test_a_new_in_process_federation_is_a_new_run(table):
    site = Site("s", table, "target", policy=DisclosurePolicy(min_rows=10, max_evaluations=2))
    first = LocalFederation([site])
    _fitted(site)
    assert _answered(site, EVALUATE, 5)[0] == 2
    second = LocalFederation([site])
    assert first.run_id != second.run_id and site.run_id == second.run_id
    assert _answered(site, EVALUATE, 5)[0] == 2


def test_the_epsilon_budget_composes_over_the_runs_of_the_period(table, tmp_path):
    """DP releases spend one budget per period whatever the run: run B, on the same state
    folder, gets only what run A left, and nothing once A spent it all."""
    policy = DisclosurePolicy(min_rows=10, epsilon_budget=20.0)
    alone = Site("s", table, "target", policy=policy)  # how many releases the budget buys
    full, reason = _answered(alone, DP_DESCRIBE, 4000)
    assert 2 < full < 4000 and "budget 20" in reason

    a = Site("s", table, "target", policy=policy, state_dir=tmp_path)
    LocalFederation([a], run_id="run-A")
    assert _answered(a, DP_DESCRIBE, full // 2)[0] == full // 2
    b = Site("s", table, "target", policy=policy, state_dir=tmp_path)
    LocalFederation([b], run_id="run-B")
    got, reason = _answered(b, DP_DESCRIBE, 4000)
    assert got == full - full // 2 and "budget 20" in reason
    assert b.ledger.epsilon_spent(policy.delta) <= 20.0
    c = Site("s", table, "target", policy=policy, state_dir=tmp_path)
    LocalFederation([c], run_id="run-C")
    assert _answered(c, DP_DESCRIBE, 10)[0] == 0


def test_release_caps_count_per_run(table, tmp_path):
    policy = DisclosurePolicy(min_rows=10, max_releases_per_part=3)
    plain = Message("describe", meta={"features": ["bmi"]})
    site = Site("s", table, "target", policy=policy, state_dir=tmp_path)
    LocalFederation([site], run_id="run-A")
    replies = [site.handle(plain) for _ in range(5)]  # checked before the handler: the 4th is a refusal
    assert [r.kind for r in replies] == ["describe"] * 3 + ["refused"] * 2
    assert "max_releases_per_part=3" in replies[3].meta["reason"] and "in this run" in replies[3].meta["reason"]
    LocalFederation([site], run_id="run-B")
    assert [site.handle(plain).kind for _ in range(4)] == ["describe"] * 3 + ["refused"]


def test_runs_older_than_the_period_are_dropped_from_the_file(tmp_path):
    now = [1_700_000_000.0]
    ledger = SiteLedger(tmp_path / "ledger.json", period_days=30, clock=lambda: now[0])
    assert ledger.charge_run("old", "fit", 5, "fit rounds") is None
    now[0] += 10 * 86400
    assert ledger.charge_run("recent", "fit", 5, "fit rounds") is None
    now[0] += 25 * 86400  # "old" was last charged 35 days ago, "recent" 25
    assert ledger.charge_run("new", "fit", 5, "fit rounds") is None
    doc = json.loads((tmp_path / "ledger.json").read_text())
    assert set(doc["runs"]) == {"recent", "new"} and set(doc["run_days"]) == {"recent", "new"}
    # a run charged again stays: its last charge counts, not its first
    for _ in range(4):
        now[0] += 20 * 86400
        assert ledger.charge_run("new", "fit", 100, "fit rounds") is None
    assert "new" in json.loads((tmp_path / "ledger.json").read_text())["runs"]


def test_a_ledger_file_with_a_malformed_run_record_is_refused(tmp_path):
    from fedtab.privacy.ledger import LedgerError

    (tmp_path / "ledger.json").write_text(json.dumps({"version": 1, "runs": {}, "days": {}, "run_days": []}))
    with pytest.raises(LedgerError, match="not a fedtab site ledger"):
        SiteLedger(tmp_path / "ledger.json").run_count("x", "fit")


@pytest.mark.parametrize("where", ["file", "store", "memory"])
def test_a_pending_block_keeps_only_accepted_charges_and_never_touches_the_stored_ledger_inside(where, tmp_path):
    """Check before apply: the charges of a block go to a copy (nested lists included), written
    only when accepted; a block that never looks at the ledger changes nothing."""
    box: dict = {}
    ledger = (SiteLedger(tmp_path / "ledger.json") if where == "file" else
              SiteLedger(store=lambda: box.setdefault("l", {})) if where == "store" else SiteLedger())
    assert ledger.fixed_release("grid", lambda: [[0.0, 1.0], ["a", "b"]]) == [[0.0, 1.0], ["a", "b"]]
    assert ledger.charge_dp(2.0, 1, 1e-5, 10.0) is None
    assert ledger.charge_distinct({"edges": ["a", "b"]}, 3, "edges") is None
    with ledger.pending():
        assert ledger.charge_run("r", "k", 5, "what") is None
        assert ledger.charge_dp(2.0, 3, 1e-5, 10.0) is None  # changes the day's [z, releases] entry in place
        assert ledger.fixed_release("other", lambda: [1.0]) == [1.0]
        assert ledger.charge_distinct({"edges": ["c"]}, 3, "edges") is None
        assert ledger.charge_distinct({"edges": ["d"]}, 3, "edges") is not None  # a, b, c and now d: over the cap
        assert ledger.run_count("r", "k") == 1 and ledger.dp_releases(1e-5) == {2.0: 4}  # the block sees its own
    assert ledger.run_count("r", "k") == 0  # not accepted: nothing kept, the nested list included
    assert ledger.dp_releases(1e-5) == {2.0: 1} and ledger.fixed_value("other") is None
    assert ledger.charge_distinct({"edges": ["d"]}, 3, "edges") is None  # "c" was not kept: a, b, d
    assert ledger.fixed_value("grid") == [[0.0, 1.0], ["a", "b"]]
    with ledger.pending() as accept:
        accept()  # accepted without a look at the ledger: nothing to write
    assert ledger.run_count("r", "k") == 0
    with ledger.pending() as accept:
        assert ledger.charge_run("r", "k", 5, "what") is None
        accept()
    assert ledger.run_count("r", "k") == 1
    if where == "file":
        assert json.loads((tmp_path / "ledger.json").read_text())["runs"]["r"]["k"] == 1


def test_a_fixed_release_is_recorded_as_its_own_copy_and_read_back_as_a_copy():
    """A pending block's copy shares the recorded fixed releases (they are never changed in place):
    what ``make`` returned, or what a reader got, can change without changing the record."""
    ledger = SiteLedger()
    made = [[0.0, 1.0], ["a", "b"]]
    got = ledger.fixed_release("grid", lambda: made)
    made[1].append("c")
    got[0].append(9.0)
    assert ledger.fixed_value("grid") == [[0.0, 1.0], ["a", "b"]]
    with ledger.pending() as accept:
        ledger.fixed_value("grid")[1].append("d")
        accept()
    assert ledger.fixed_release("grid", lambda: None) == [[0.0, 1.0], ["a", "b"]]
