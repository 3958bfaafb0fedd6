"""Issue 31 item 4: the election without K·d names — ballots are bits + scores, names go only in the
first exchange, later messages refer to the agreed schema by hash, and exchange() validates each reply
as the engine yields it."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedtab import LocalFederation, run_election
from fedtab.federation import Message, SiteError
from fedtab.election.tally import normalise_scores
from fedtab.federation.workflows.election.site import SCORE_TOLERANCE, pack_mask, unpack_mask, wire_scores
from fedtab.federation.protocol import exchange
from fedtab.federation.protocol.schema import AGREED, DECLARED, SCHEMA_HASH, columns_hash
from tests.builders import assert_hostile_ballot_refused, classification_parts, make_sites, trio_sites






class Curious(LocalFederation):
    """A server that rewrites its requests of one kind (``edit(request) -> request``)."""

    def __init__(self, sites, kind, edit):
        super().__init__(sites)
        self.kind, self.edit = kind, edit

    def ask(self, requests):
        return super().ask({s: (self.edit(r) if r.kind == self.kind else r) for s, r in requests.items()})


def _names_in(message: Message) -> int:
    """How many strings ``message`` carries in its meta lists and string arrays."""
    text = json.dumps(message.meta)
    strings = sum(isinstance(x, str) for v in message.meta.values() if isinstance(v, list) for x in v)
    return strings + sum(a.size for a in message.arrays.values() if a.dtype.kind == "U") + text.count('"f0"')


def test_pack_and_unpack_round_trip_and_refuse_bad_lengths_and_padding():
    rng = np.random.default_rng(0)
    for n in (1, 7, 8, 9, 1000):
        m = rng.random(n) < 0.5
        assert np.array_equal(unpack_mask(pack_mask(m), n), m)
        assert pack_mask(m).nbytes == (n + 7) // 8
    with pytest.raises(ValueError, match="2 packed bytes"):
        unpack_mask(np.zeros(3, np.uint8), 9)
    with pytest.raises(ValueError, match="beyond its 9 columns"):
        unpack_mask(np.array([0, 1], np.uint8), 9)  # a padding bit set
    with pytest.raises(ValueError, match="packed bytes"):
        unpack_mask(np.zeros(2, np.int64), 9)


def _own_ballots(sites):
    """Each site's float64 ANOVA ballot over its training rows, computed off the wire."""
    from fedtab.election.ballot import Ballot
    from fedtab.election.selectors import make_selector
    from fedtab.federation.site.data import fill_with_column_means, numeric_matrix

    own = []
    for s in sites:
        frame, y = s.xy("train")
        sel = make_selector("anova").select(fill_with_column_means(numeric_matrix(frame, s.name)), y)
        own.append(Ballot.build(sel.mask, sel.scores, len(y), list(frame.columns), site=s.name))
    return own


def test_ballots_and_masks_carry_no_names_and_the_result_matches_the_rule_on_the_sites_own_ballots():
    sites = trio_sites()
    fed = LocalFederation(sites)
    sent: list[tuple[Message, Message]] = []
    declared: list[int] = []  # names in each reply's declaration, as it arrived (exchange strips it)
    orig = fed._replies

    def spy(requests):
        for name, reply in orig(requests):
            sent.append((requests[name], reply))
            declared.append(len(reply.meta[DECLARED]["columns"]) if DECLARED in reply.meta else 0)
            yield name, reply

    fed._replies = spy
    out = run_election(fed, 0.5, describe="train")
    ballot_replies = [r for q, r in sent if q.kind == "ballot"]
    assert len(ballot_replies) == 3
    for reply in ballot_replies:
        assert "feature_names" not in reply.meta and reply.arrays["mask"].dtype == np.uint8
        assert reply.arrays["mask"].nbytes == (12 + 7) // 8
        assert reply.meta[SCHEMA_HASH] == columns_hash(fed.schema.columns)
    assert declared == [12, 12, 12, 0, 0, 0]  # names once: the declaration of the first exchange
    for request, _ in sent:
        if request.kind == "set_mask":
            assert "features" not in request.meta and request.meta[SCHEMA_HASH] == fed.schema.hash
            assert request.meta[AGREED]["columns"] == "declared"  # not echoed: every site declared these
            assert _names_in(request) == 0
    # the server decoded the same ballots the sites computed: re-elect from the sites' own selections
    from fedtab.federation.workflows.election.server import elect_from_ballots

    ref = elect_from_ballots(_own_ballots(sites), 0.5)
    assert np.array_equal(out.result.mask, ref.mask)
    assert out.result.selected_names == ref.selected_names
    assert all(s.state["features"] == ref.selected_names for s in sites)


def test_a_ballot_over_a_subset_names_its_columns_by_position():
    sites = trio_sites()
    fed = LocalFederation(sites)
    run_election(fed, 0.5)  # agrees the schema
    keep = fed.schema.columns[::3]
    replies = exchange(fed, Message("ballot", meta={"features": keep}))
    for reply in replies.values():
        idx = reply.arrays["column_index"]
        assert [fed.schema.columns[i] for i in idx.tolist()] == keep and reply.meta["n_features"] == len(keep)


def test_a_site_refuses_a_curious_servers_schema_hash_naming_itself():
    wrong = lambda r: Message(r.kind, r.arrays, {**r.meta, SCHEMA_HASH: "0" * 32})  # noqa: E731
    fed = Curious(trio_sites(), "set_mask", wrong)
    with pytest.raises(SiteError, match=r"set_mask step failed at 3 site\(s\): site 'h0': .*schema hash") as exc:
        run_election(fed, 0.5)
    assert set(exc.value.sites) == {"h0", "h1", "h2"}
    assert all("features" not in fed.site(s).state for s in fed.sites)  # nobody applied the mask


def test_a_site_refuses_an_agreed_schema_that_does_not_hash_to_its_columns():
    def swap(r):  # the server sends other names under the honest hash
        agreed = r.meta.get(AGREED)
        if not isinstance(agreed, dict):
            return r
        return Message(r.kind, r.arrays, {**r.meta, AGREED: {**agreed, "columns": [f"x{i}" for i in range(12)]}})

    fed = Curious(trio_sites(), "set_mask", swap)
    with pytest.raises(SiteError, match="site 'h0'.*does not match its columns") as exc:
        run_election(fed, 0.5)
    assert set(exc.value.sites) == {"h0", "h1", "h2"}


@pytest.mark.parametrize("tamper, match", [
    (lambda r: Message(r.kind, {**r.arrays, "mask": r.arrays["mask"][:1]}, r.meta), "2 packed bytes"),
    (lambda r: Message(r.kind, r.arrays, {**r.meta, SCHEMA_HASH: columns_hash(["a"])}), "schema hash"),
    (lambda r: Message(r.kind, r.arrays, {**r.meta, "feature_names": [f"f{i}" for i in range(12)]}),
     "carries column names"),
    (lambda r: Message(r.kind, {**r.arrays, "scores": np.ones(2_000_000)}, r.meta), "scores have 2000000"),
])
def test_a_hostile_ballot_is_refused_in_one_line_naming_only_the_sender(tamper, match):
    assert_hostile_ballot_refused(tamper, match)


def test_names_sent_again_in_a_later_message_are_refused():
    def redeclare(r):
        return Message(r.kind, r.arrays, {**r.meta, DECLARED: {"columns": ["f0"], "rows": {}}})

    fed = LocalFederation(trio_sites(hostile=redeclare, kind="set_mask"))
    with pytest.raises(SiteError, match="site 'evil'.*schema declaration in a later message") as exc:
        run_election(fed, 0.5)
    assert set(exc.value.sites) == {"evil"}


def test_exchange_validates_each_reply_before_the_engine_yields_the_next():
    fed = LocalFederation(trio_sites())
    events: list[str] = []
    orig = fed._replies

    def spy(requests):
        for name, reply in orig(requests):
            events.append(f"yield {name}")
            yield name, reply

    fed._replies = spy
    run_election(fed, 0.5)  # the schema is agreed; the next exchange is a later one
    events.clear()
    exchange(fed, Message("ballot"), lambda site, reply: events.append(f"check {site}"))
    assert events == ["yield h0", "check h0", "yield h1", "check h1", "yield h2", "check h2"]
    assert fed.exchange_count == 3  # ballot, set_mask, this one: a streamed exchange counts once


def test_a_schema_sent_as_declared_resolves_to_the_declaration_with_its_hash_after_a_re_declaration():
    """A job re-declares after a table step; a schema agreed on the earlier declaration and sent as
    ``"declared"`` still resolves to those columns (by their hash), and a hash the site never
    declared is refused, not silently filled with its current columns."""
    from fedtab.federation.site.schema import received_schema, remember_declaration

    site = make_sites(classification_parts(200, 4, 2, 0, (1.0,), seed=3)[1][:1])[0]
    first, later = ["f0", "f1", "f2", "f3"], ["f0", "f1", "f2", "f3", "f0_x"]
    site.state[DECLARED] = remember_declaration(remember_declaration(None, first), later)
    got = received_schema(site, {"columns": "declared", "holders_all": 2, "hash": columns_hash(first)})
    assert got["columns"] == first and got["holders"] == [2] * 4
    assert received_schema(site, {"columns": "declared", "holders_all": 2, "hash": columns_hash(later)})["columns"] \
        == later
    with pytest.raises(ValueError, match="does not match its columns"):
        received_schema(site, {"columns": "declared", "holders_all": 2, "hash": columns_hash(["zz"])})


# ---------------------------------------------------------------- float32 scores on the wire


def test_selector_scores_travel_as_float32_and_elect_what_the_float64_ballots_elect():
    from fedtab.federation.workflows.election.server import elect_from_ballots

    sites = trio_sites()
    fed = LocalFederation(sites)
    sent = []
    orig = fed._replies

    def spy(requests):
        for name, reply in orig(requests):
            if "scores" in reply.arrays:
                sent.append(reply)
            yield name, reply

    fed._replies = spy
    outcome = run_election(fed, 0.5)
    assert len(sent) == 3 and all(r.arrays["scores"].dtype == np.float32 for r in sent)
    exact = _own_ballots(sites)
    assert any(not np.array_equal(b.scores, b.scores.astype(np.float32)) for b in exact)  # float32 did round
    ref = elect_from_ballots(exact, 0.5)
    assert ref.selected_names == outcome.result.selected_names
    assert np.abs(ref.votes - outcome.result.votes).max() <= SCORE_TOLERANCE  # a weighted mean of normalised scores


@pytest.mark.parametrize("scores, why", [
    (np.array([1e300, 1.0, 2.0, 3.0]), "beyond float32's range"),
    (np.array([1e8, 1e8 + 1, 1e8 + 2, 1e8 + 3]), "float32 merges them (spacing 8 at 1e8)"),
    (np.array([1e-50, 2e-50, 3e-50]), "float32 flushes them to zero"),
])
def test_scores_float32_cannot_carry_travel_as_float64_unchanged(scores, why):
    out = wire_scores(scores, np.array([True, False, True, False][: scores.size]))
    assert out.dtype == np.float64, why
    assert np.array_equal(out, scores)


def test_scores_of_a_subnormal_range_normalise_to_finite_votes_and_travel_as_float64():
    # found by the property below: 1 / 2.2e-309 overflows, so the reciprocal gave inf and NaN (0 · inf)
    scores = np.array([2.2250738585072014e-309, 0.0, 1e-309])
    mask = np.array([True, False, True])
    assert normalise_scores(mask, scores, "all").tolist() == pytest.approx([1.0, 0.0, 0.4494], abs=1e-4)
    assert wire_scores(scores, mask).dtype == np.float64  # float32 flushes them to zero


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.integers(1, 40), elements=st.floats(-1e40, 1e40, allow_nan=False)),
       st.data())
def test_wire_scores_never_move_a_normalised_score_by_more_than_the_tolerance(scores, data):
    mask = data.draw(arrays(np.bool_, scores.size))
    out = wire_scores(scores, mask)
    assert out.dtype in (np.float32, np.float64)
    wide = out.astype(np.float64)
    for how in ("all", "selected"):
        assert np.abs(normalise_scores(mask, wide, how) - normalise_scores(mask, scores, how)).max() <= SCORE_TOLERANCE
