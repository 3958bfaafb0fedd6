"""The election and FedAvg cost grows linearly (issue 15) — checked by counting, never timing.

Each test counts operations (Python function calls, pandas column-index walks,
serialisations) at two sizes and checks they grow like the size, not its square.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from fedtab.data.synthetic import classification_table, split_rows
from fedtab.election import ElectionTally
from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.election.server import run_election
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.core import Site
from fedtab.federation.workflows.training import run_training


def _federation(k: int, d: int, rows: int = 400) -> LocalFederation:
    table = classification_table(n_samples=rows, n_features=d, n_informative=4, n_redundant=0, seed=0)
    parts = split_rows(table, [1 / k] * k, seed=0)
    return LocalFederation([Site(f"s{i}", p, "target", selector="anova") for i, p in enumerate(parts)])


def _count_calls(fn) -> int:
    """Python-level calls (incl. generator resumptions) made while ``fn`` runs."""
    n = 0

    def prof(frame, event, arg):
        nonlocal n
        if event == "call":
            n += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def test_election_calls_grow_linearly_in_features():
    small, large = _federation(2, 250, rows=200), _federation(2, 1000, rows=200)
    run_election(small, 0.5, describe="train")  # warm imports and caches outside the count
    calls_small = _count_calls(lambda: run_election(small, 0.5, describe="train"))
    calls_large = _count_calls(lambda: run_election(large, 0.5, describe="train"))
    # 4x the features: linear cost gives <= 4x the calls; the old per-name list rebuild gave ~16x
    assert calls_large < 4.5 * calls_small, (calls_small, calls_large)


def test_training_round_calls_grow_linearly_in_sites():
    counts = []
    for k in (4, 16):
        fed = _federation(k, 50, rows=800)
        feats = fed.site(fed.sites[0]).feature_names
        run_training(fed, feats, rounds=1, local_epochs=1)
        counts.append(_count_calls(lambda: run_training(fed, feats, rounds=3, local_epochs=1)))
    assert counts[1] < 4.5 * counts[0], counts


def test_set_mask_walks_the_column_index_a_constant_number_of_times(monkeypatch):
    fed = _federation(2, 3000)
    walks = {"n": 0}
    iter0, tolist0 = pd.Index.__iter__, pd.Index.tolist

    def counting_iter(self):
        walks["n"] += 1
        return iter0(self)

    def counting_tolist(self):
        walks["n"] += 1
        return tolist0(self)

    monkeypatch.setattr(pd.Index, "__iter__", counting_iter)
    monkeypatch.setattr(pd.Index, "tolist", counting_tolist)
    names = fed.site("s0").feature_names
    walks["n"] = 0
    out = run_election(fed, 0.5, describe="train")
    assert len(out.result.selected_names) > 1000
    assert fed.site("s0").state["features"] == out.result.selected_names
    # per site a handful of walks (ballot, set_mask, describe), not one per elected name
    assert walks["n"] <= 40, walks["n"]
    assert set(fed.site("s0").feature_set) == set(names)


def test_feature_names_follow_a_replaced_table():
    site = Site("a", pd.DataFrame({"x": [1.0, 2.0], "y": [0, 1]}), "y", test_size=0)
    assert site.feature_names == ["x"] and site.feature_set == {"x"}
    site.table = pd.DataFrame({"x": [1.0, 2.0], "z": [3.0, 4.0], "y": [0, 1]})
    assert site.feature_names == ["x", "z"] and "z" in site.feature_set


def test_broadcast_request_is_serialised_once(monkeypatch):
    fed = _federation(6, 20)
    calls = {"n": 0}
    to_bytes0 = Message.to_bytes

    def counting(self):
        if self.kind == "set_mask" and "elected" in self.arrays:  # the elected bits over the agreed columns
            calls["n"] += 1
        return to_bytes0(self)

    monkeypatch.setattr(Message, "to_bytes", counting)
    run_election(fed, 0.5)
    assert calls["n"] == 1
    # every site still got (and logged) its own copy
    assert sum(r.kind == "set_mask" for r in fed.traffic.records) == 6
    assert set(fed.site_seconds) == set(fed.sites) and all(v > 0 for v in fed.site_seconds.values())


def test_meta_name_lists_are_checked_without_per_name_calls():
    names = [f"f{i}" for i in range(5000)]
    calls = _count_calls(lambda: Message("m", meta={"features": names}).to_bytes())
    assert calls < 200, calls
    with pytest.raises(ValueError, match="not finite"):
        Message("m", meta={"features": [*names[:3], float("nan")]})
    with pytest.raises(ValueError, match="type"):
        Message("m", meta={"features": [*names[:3], object()]})


def test_tally_reuses_positions_of_repeated_names_but_not_after_growth():
    rng = np.random.default_rng(0)
    t = ElectionTally()
    a, b = ["x", "y", "z"], ["z", "w"]
    t.add(rng.random(3) < 0.5, rng.random(3), 10, feature_names=a, site="s1")
    t.add(rng.random(2) < 0.5, rng.random(2), 10, feature_names=b, site="s2")  # grows the schema
    t.add([True, True, False], [3.0, 2.0, 1.0], 5, feature_names=a, site="s3")
    t.add([True, False, True], [1.0, 2.0, 3.0], 5, feature_names=a, site="s4")
    assert t.feature_names == ["x", "y", "z", "w"]
    assert t.held_by.tolist() == [3, 3, 4, 1]


def test_meta_integer_lists_are_range_checked_without_per_item_calls():
    counts = list(range(5000))
    calls = _count_calls(lambda: Message("m", meta={"holders": counts}).to_bytes())
    assert calls < 200, calls
    with pytest.raises(ValueError, match="beyond 128 bits"):
        Message("m", meta={"holders": [*counts[:3], -(2**200)]})


def test_name_lists_are_validated_once_not_once_per_site(monkeypatch):
    """Identical declarations/ballots/descriptions: the list checks run a constant number of
    times, whatever K (they ran 2 per site + 1 per declaration, ~6 s at 300 sites × 10,000)."""
    from fedtab.federation.protocol import schema as schema_mod

    real = schema_mod._names
    counts = {}
    for k in (3, 9):
        calls = {"n": 0}

        def counting(value, *args, calls=calls, **kwargs):
            calls["n"] += isinstance(value, list) and len(value) >= 20  # feature name lists, not class labels
            return real(value, *args, **kwargs)

        monkeypatch.setattr(schema_mod, "_names", counting)
        fed = _federation(k, 40, rows=60 * k)
        outcome = run_election(fed, 0.5, describe="train")
        counts[k] = calls["n"]
        # sites declaring the same columns share one validated tuple (compared by identity afterwards)
        assert len({id(fed.schema.declaration(s).columns) for s in fed.sites}) == 1
        assert len({id(b.feature_names) for b in outcome.ballots}) == 1
        assert outcome.described is not None and set(outcome.described.sites) == set(fed.sites)
    assert counts[3] == counts[9] <= 3, counts


def test_an_all_numeric_declaration_leaves_out_the_kinds_list():
    from fedtab.federation.protocol.agreement import agree_schema
    from fedtab.federation.protocol.schema import DECLARED

    fed = _federation(3, 30)
    run_election(fed, 0.5)
    assert fed.schema.declaration("s0").kinds == ("numeric",) * 30
    # a site with a categorical column still declares every kind, and the server keeps them
    table = classification_table(n_samples=300, n_features=6, n_informative=3, n_redundant=0, seed=0)
    parts = split_rows(table, [0.5, 0.5], seed=0)
    parts[0] = parts[0].assign(colour=np.where(parts[0]["f0"] > 0, "red", "blue"))
    mixed = LocalFederation([Site(f"m{i}", p, "target", selector="anova") for i, p in enumerate(parts)])
    replies = mixed.ask({n: Message("schema", meta={"schema:declare": True}) for n in mixed.sites})
    assert "kinds" not in replies["m1"].meta[DECLARED] and replies["m0"].meta[DECLARED]["kinds"][-1] == "categorical"
    schema = agree_schema(mixed)
    assert schema.declaration("m0").kinds[-1] == "categorical" and set(schema.declaration("m1").kinds) == {"numeric"}
