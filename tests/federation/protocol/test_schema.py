"""The agreed schema (issue 10, item 2): declared first, every later reply checked against it."""

import numpy as np
import pytest

from fedtab import LocalFederation, Site, run_election, run_training
from fedtab.federation import Message, SiteError, agree_schema, gather_ballots
from tests.builders import Hostile, classification_parts, make_sites




def sites(n=240, seed=0, hostile=None, **hostile_kwargs):
    _, parts = classification_parts(n, 8, 3, 2, [0.4, 0.3, 0.3], seed=seed, class_sep=1.5)
    out = make_sites(parts[:2], names="h{i}", selector="anova")
    if hostile is None:
        out.append(Site("h2", parts[2], "target", selector="anova"))
    else:
        out.append(Hostile("evil", parts[2], "target", selector="anova", tamper=hostile, **hostile_kwargs))
    return out


def _replace(reply, arrays=None, **meta):
    return Message(reply.kind, {**reply.arrays, **(arrays or {})}, {**reply.meta, **meta})


def test_the_schema_rides_on_the_first_exchange_and_reaches_every_site():
    fed = LocalFederation(sites())
    run_election(fed, 0.5)
    kinds = [r.kind for r in fed.traffic.records if r.site == "h0"]
    assert kinds == ["ballot", "set_mask"]  # no extra exchange for the schema
    schema = fed.schema
    assert schema.columns == fed.site("h0").feature_names
    assert schema.holders["f0"] == ["h0", "h1", "h2"]
    assert schema.rows("h1", "train") == len(fed.site("h1").rows("train"))
    assert schema.classes == ["0", "1"]
    for name in fed.sites:  # stored by every site with its next request
        assert fed.site(name).state["schema"]["columns"] == schema.columns
        assert fed.site(name).state["schema"]["holders"] == [3] * len(schema.columns)


def test_stand_alone_schema_exchange_and_the_check_api():
    fed = LocalFederation(sites())
    schema = agree_schema(fed)
    assert [r.kind for r in fed.traffic.records] == ["schema"] * 3
    assert schema.check_features("h0", ["f1", "f0"]) == ["f1", "f0"]
    with pytest.raises(SiteError, match="site 'h0'.*'nope'") as info:
        schema.check_features("h0", ["f0", "nope"])
    assert info.value.sites.keys() == {"h0"}
    with pytest.raises(SiteError, match="duplicate"):
        schema.check_features("h0", ["f0", "f0"])
    with pytest.raises(SiteError, match="more than"):
        schema.check_count("h0", 10**12, "train", "n_samples")
    assert schema.check_count("h0", 3.0, "train") == 3


def _assert_only(exc, site):
    assert set(exc.value.sites) == {site}
    for honest in ("h0", "h1"):
        assert f"'{honest}'" not in str(exc.value)


@pytest.mark.parametrize("tamper, match", [
    # a ballot is packed mask bits + scores over the declared columns, named by the columns' hash
    (lambda r: _replace(r, {"mask": np.append(r.arrays["mask"], np.uint8(255)), "scores": np.append(r.arrays["scores"], 9.0)},
                        n_features=9), "n_features is 9"),
    (lambda r: _replace(r, feature_names=["f0", "secret"]), "carries column names"),
    (lambda r: _replace(r, **{"schema:hash": "0" * 32}), "schema hash"),
    (lambda r: _replace(r, n_samples=10**12), "n_samples"),
    (lambda r: _replace(r, n_samples=10**400 // 10**390), "n_samples"),
    (lambda r: _replace(r, {"mask": np.zeros(2, np.uint8)}), "1 packed bytes"),
    (lambda r: _replace(r, {"scores": np.zeros(10**6)}), "8 entries but scores have 1000000"),
    # a ballot may cover a subset of the declared columns (the ones the site measures, issue 22),
    # named by position, and its count and mask must agree
    (lambda r: _replace(r, {"column_index": np.array([0, 99], np.uint32)}, n_features=2), "increasing positions"),
    (lambda r: _replace(r, {"column_index": np.arange(7, dtype=np.uint32)}), "n_features is 8"),
])
def test_ballots_that_break_the_schema_are_rejected_naming_only_the_sender(tamper, match):
    fed = LocalFederation(sites(hostile=tamper))
    with pytest.raises(SiteError, match=f"site 'evil'.*{match}") as exc:
        gather_ballots(fed)
    _assert_only(exc, "evil")


def test_an_oversized_declaration_is_rejected_before_any_ballot_is_counted():
    from fedtab.federation.protocol.schema import DECLARED

    huge = [f"x{i}" for i in range(200_001)]  # the default limit is 100,000 columns

    def declare_huge(reply):
        return _replace(reply, **{DECLARED: {**reply.meta[DECLARED], "columns": huge, "kinds": ["numeric"] * len(huge)}})

    fed = LocalFederation(sites(hostile=declare_huge))
    with pytest.raises(SiteError, match="site 'evil'.*200001 names") as exc:
        gather_ballots(fed)
    _assert_only(exc, "evil")
    assert fed.schema is not None and "evil" not in fed.schema.sites


def test_with_a_quorum_the_rejected_site_is_dropped_and_named():
    fed = LocalFederation(sites(hostile=lambda r: _replace(r, n_samples=10**12)))
    out = run_election(fed, 0.5, min_sites=2)
    assert [b.site for b in out.ballots] == ["h0", "h1"]
    assert "evil" in fed.dropped and "n_samples" in fed.dropped["evil"]
    assert fed.participation[0] == {"step": "ballot", "sites": ["h0", "h1"]}
    trained = run_training(fed, rounds=2)
    assert set(trained.per_site) == {"h0", "h1"}
    assert all(p["sites"] == ["h0", "h1"] for p in trained.participation)


def _one_holder_sites():
    base = sites()
    # h0 alone holds a column that only it selects (a strong, private feature)
    t = base[0].table.copy()
    t["private"] = t["target"] * 3.0 + np.random.default_rng(0).normal(0, 0.1, len(t))
    base[0] = Site("h0", t, "target", selector="anova")
    return base


def test_one_site_cannot_make_its_own_feature_consensus():
    out = run_election(LocalFederation(_one_holder_sites()), 0.0)
    r = out.result
    j = list(r.feature_names).index("private")
    assert r.held_by[j] == 1 and r.selected_by[j] == 1
    assert not r.mask[j] and r.reasons[j].startswith("lost the vote")
    assert r.min_holders == 2
    # every site holding it is one site: with min_holders=1 (the plain rule) it is consensus
    plain = run_election(LocalFederation(_one_holder_sites()), 0.0, min_holders=1).result
    assert plain.mask[j] and plain.reasons[j] == "consensus"
    # at fd = 1 it can still win through the vote
    assert run_election(LocalFederation(_one_holder_sites()), 1.0).result.mask[j]


def test_min_holders_is_validated():
    with pytest.raises(ValueError, match="min_holders"):
        run_election(LocalFederation(sites()), 0.5, min_holders=0)
