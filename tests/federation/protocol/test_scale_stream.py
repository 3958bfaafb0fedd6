"""Issue 31 item 4, the server side: replies reduced as they arrive. The description riding on
``set_mask`` is a running sum (no site's moments held, no echo of the elected names), declarations
share one column set and one kinds tuple, and every hostile reply is still refused, naming its
sender, before anything of it enters a sum."""

import numpy as np
import pytest

from fedtab import LocalFederation, run_election
from fedtab.federation import Message, SiteError, gather_ballots
from fedtab.federation.protocol import set_options
from fedtab.federation.protocol.schema import DECLARED, parse_declaration
from fedtab.federation.protocol.summing import PLAIN_SUM, PlainSums, SumSpec
from fedtab.federation.steps.describe import DESCRIBE_FIELDS, describe_site
from tests.builders import classification_parts, make_sites, trio_sites



def _own_moments(sites, features):
    """Each site's own description of ``features`` on its training rows, summed (float64)."""
    total = {k: np.zeros(len(features)) for k in DESCRIBE_FIELDS}
    for s in sites:
        reply = describe_site(s, list(features), "train")
        for k in DESCRIBE_FIELDS:
            total[k] += np.asarray(reply.arrays[k], dtype=np.float64)
    return total


def test_the_description_on_set_mask_is_the_sum_of_the_sites_own_and_echoes_no_names():
    sites = trio_sites()
    fed = LocalFederation(sites)
    described: list[dict] = []
    orig = fed._replies

    def spy(requests):
        for name, reply in orig(requests):
            if reply.kind == "set_mask":
                described.append(dict(reply.meta["describe"]))
            yield name, reply

    fed._replies = spy
    out = run_election(fed, 0.5, describe="train")
    feats = out.result.selected_names
    assert len(described) == 3 and all("features" not in d for d in described)  # no echo of the elected names
    d = out.described
    assert d.features == feats and d.sites == ["h0", "h1", "h2"]
    own = _own_moments(sites, feats)
    for k, got in zip(DESCRIBE_FIELDS, (d.count, d.total, d.sumsq)):
        np.testing.assert_allclose(got, own[k], rtol=1e-12, atol=1e-9)
    assert d.per_site == {}  # a running sum: no site's moments kept


def test_a_robust_run_keeps_each_sites_moments():
    fed = LocalFederation(trio_sites())
    set_options(fed, robust=True)
    out = run_election(fed, 0.5, describe="train")
    assert set(out.described.per_site) == {"h0", "h1", "h2"}  # the screening needs them


@pytest.mark.parametrize("tamper, match", [
    # the description of other features than the elected ones (a hostile echo)
    (lambda r: Message(r.kind, r.arrays, {**r.meta, "describe": {**r.meta["describe"], "features": ["f0"]}}),
     "described other features"),
    # moments of the wrong length
    (lambda r: Message(r.kind, {**r.arrays, "count": r.arrays["count"][:1]}, r.meta), "count"),
    # a count beyond the rows the site declared
    (lambda r: Message(r.kind, {**r.arrays, "count": r.arrays["count"].astype(np.int64) + 10**6}, r.meta), "count"),
    # non-finite sums
    (lambda r: Message(r.kind, {**r.arrays, "sum": np.full_like(r.arrays["sum"], np.nan)}, r.meta), ""),
])
def test_a_hostile_description_is_refused_naming_the_sender_and_never_enters_the_sum(tamper, match):
    sites = trio_sites(hostile=tamper, kind="set_mask")
    with pytest.raises(SiteError, match=f"set_mask step failed at 1 site\\(s\\): site 'evil': .*{match}") as exc:
        run_election(LocalFederation(sites), 0.5, describe="train")
    assert set(exc.value.sites) == {"evil"} and "\n" not in str(exc.value)
    # with a quorum the run goes on without it, and the sum holds only the other two sites' moments
    fed = LocalFederation(trio_sites(hostile=tamper, kind="set_mask"))
    out = run_election(fed, 0.5, describe="train", min_sites=2)
    assert "evil" in fed.dropped and out.described.sites == ["h0", "h1"]
    own = _own_moments([fed.site("h0"), fed.site("h1")], out.result.selected_names)
    np.testing.assert_allclose(out.described.count, own["count"])
    np.testing.assert_allclose(out.described.total, own["sum"], rtol=1e-12, atol=1e-9)


def _ballot_hostile(edit):
    return lambda r: Message(r.kind, edit(dict(r.arrays)), r.meta)


@pytest.mark.parametrize("tamper, match", [
    (_ballot_hostile(lambda a: {**a, "scores": np.full(12, np.nan)}), "not finite"),
    (_ballot_hostile(lambda a: {**a, "scores": a["scores"][:11]}), "mask has 12 entries but scores have 11"),
    (_ballot_hostile(lambda a: {**a, "mask": np.zeros(3, np.uint8)}), "2 packed bytes"),
    (_ballot_hostile(lambda a: {**a, "column_index": np.array([0, 40], np.uint32)}), "within the 12 declared"),
    (lambda r: Message(r.kind, r.arrays, {**r.meta, "n_features": 11}), "n_features is 11"),
])
def test_a_hostile_ballot_is_refused_naming_only_the_sender(tamper, match):
    fed = LocalFederation(trio_sites(hostile=tamper))
    with pytest.raises(SiteError, match=f"ballot step failed at 1 site\\(s\\): site 'evil': .*{match}") as exc:
        gather_ballots(fed)
    assert set(exc.value.sites) == {"evil"} and "\n" not in str(exc.value)


@pytest.mark.parametrize("columns", [[["f0"]], [{"a": 1}], [1, 2], "f0"])
def test_a_declaration_whose_columns_are_not_names_is_refused_naming_the_sender(columns):
    def bad_declaration(r):
        return Message(r.kind, r.arrays, {**r.meta, DECLARED: {**r.meta[DECLARED], "columns": columns}})

    fed = LocalFederation(trio_sites(hostile=bad_declaration))
    with pytest.raises(SiteError, match="site 'evil': invalid schema declaration: declared columns") as exc:
        gather_ballots(fed)
    assert set(exc.value.sites) == {"evil"}


def test_equal_declarations_share_one_column_tuple_one_kinds_tuple_and_one_column_set():
    fed = LocalFederation(trio_sites())
    run_election(fed, 0.5)
    decl = [fed.schema.declaration(s) for s in fed.sites]
    assert decl[0].columns is decl[1].columns is decl[2].columns
    assert decl[0].kinds is decl[1].kinds is decl[2].kinds and set(decl[0].kinds) == {"numeric"}
    assert fed.schema.column_set("h0") is fed.schema.column_set("h2") == set(decl[0].columns)
    # sharing never lets a different list through: another list (after the shared one) is validated anew
    validated: dict = {}
    rows = {"all": 10, "train": 8, "test": 2}
    first = parse_declaration({"columns": ["a", "b"], "rows": rows}, validated=validated)
    again = parse_declaration({"columns": ["a", "b"], "rows": rows}, validated=validated)
    assert again.columns is first.columns and again.kinds is first.kinds
    with pytest.raises(ValueError, match="duplicate"):
        parse_declaration({"columns": ["a", "a"], "rows": rows}, validated=validated)
    with pytest.raises(ValueError, match="kinds"):
        parse_declaration({"columns": ["a", "b"], "kinds": ["numeric", "text"], "rows": rows}, validated=validated)
    mixed = parse_declaration({"columns": ["a", "b"], "kinds": ["numeric", "categorical"], "rows": rows},
                              validated=validated)
    assert mixed.kinds == ("numeric", "categorical") and mixed.columns is first.columns


def test_a_streamed_plain_sum_keeps_no_reply_arrays_and_equals_the_held_sum():
    fed = LocalFederation(trio_sites())
    run_election(fed, 0.5)  # agrees the schema
    feats = fed.schema.columns[:5]
    request = Message("describe", meta={"part": "train", "features": list(feats)})
    spec = {k: 0 for k in DESCRIBE_FIELDS}
    held = PlainSums().exchange(fed, {s: request for s in fed.sites}, SumSpec(spec), None, kind="describe",
                                step=None)
    streamed = PlainSums().exchange(fed, {s: request for s in fed.sites}, SumSpec(spec, stream=True), None,
                                    kind="describe", step=None)
    assert streamed.sites == held.sites == ["h0", "h1", "h2"]
    assert all(not set(DESCRIBE_FIELDS) & set(r.arrays) for r in streamed.replies.values())
    assert list(streamed.parts) == [PLAIN_SUM] and not streamed.secure
    for k in DESCRIBE_FIELDS:
        np.testing.assert_array_equal(streamed.sums[k], held.sums[k])
        np.testing.assert_array_equal(streamed.parts[PLAIN_SUM].arrays[k], held.sums[k])


def test_the_description_counts_travel_in_the_smallest_unsigned_dtype():
    from fedtab.federation.workflows.election.site import compact_counts

    fed = LocalFederation(trio_sites())
    counts: list[np.dtype] = []
    orig = fed._replies

    def spy(requests):
        for name, reply in orig(requests):
            if reply.kind == "set_mask":
                counts.append(reply.arrays["count"].dtype)
            yield name, reply

    fed._replies = spy
    run_election(fed, 0.5, describe="train")
    assert counts and all(d == np.uint8 for d in counts)  # ~100 training rows per site
    assert compact_counts(np.array([0, 70_000])).dtype == np.uint32
    noisy = np.array([1.5, 2.0])
    assert compact_counts(noisy) is noisy and compact_counts(np.array([-1, 3])).dtype == np.int64


def test_a_large_header_travels_compressed_and_a_hostile_one_is_refused():
    import struct
    import zlib

    from fedtab.federation.protocol.messages import COMPRESS_AT, Limits, MessageError

    names = [f"f{i:05d}" for i in range(10_000)]
    m = Message("ballot", {"scores": np.arange(4.0)}, {"names": names})
    raw = m.to_bytes()
    assert len(raw) < len(str(names)) / 3  # 10,000 names: ~22 kB instead of ~90 kB
    back = Message.from_bytes(raw)
    assert back.meta == m.meta and np.array_equal(back.arrays["scores"], m.arrays["scores"])
    small = Message("x", meta={"a": 1}).to_bytes()
    assert struct.unpack(">I", small[:4])[0] < COMPRESS_AT  # small headers as they were: no flag
    limits = Limits(max_header=10**5)
    bomb = zlib.compress(b" " * 10**7)  # 10 MB of blanks in ~10 kB
    cases = {
        "inflates beyond": struct.pack(">I", len(bomb) | 0x8000_0000) + bomb,
        "not a valid zlib": struct.pack(">I", 5 | 0x8000_0000) + b"abcde",
        "truncated": struct.pack(">I", 10 | 0x8000_0000) + zlib.compress(b'{"kind": "x"}' * 50)[:10],
        "out of range": struct.pack(">I", 0xFFFF_FFFF),
    }
    for match, data in cases.items():
        with pytest.raises(MessageError, match=match):
            Message.from_bytes(data, limits)


@pytest.mark.parametrize("order", ["reversed", "middle_first"])
def test_streamed_sums_are_the_same_bits_whatever_order_the_replies_arrive_in(order):
    """Running sums add in request order (a reply that overtakes an earlier site's waits), so an
    engine delivering replies out of order gives exactly the sums of the held replies."""
    _, parts = classification_parts(600, 6, 3, 1, [0.2] * 5, seed=4)
    sites = make_sites(parts, names="s{i}")
    fed = LocalFederation(sites)
    run_election(fed, 0.5)
    feats = fed.schema.columns
    request = Message("describe", meta={"part": "train", "features": list(feats)})
    spec = {k: 0 for k in DESCRIBE_FIELDS}
    held = PlainSums().exchange(fed, {s: request for s in fed.sites}, SumSpec(spec), None, kind="describe", step=None)
    orig = fed._replies

    def shuffled(requests):
        got = list(orig(requests))
        yield from (got[::-1] if order == "reversed" else [got[2], got[0], got[4], got[1], got[3]])

    fed._replies = shuffled
    streamed = PlainSums().exchange(fed, {s: request for s in fed.sites}, SumSpec(spec, stream=True), None,
                                    kind="describe", step=None)
    assert streamed.sites == held.sites  # request order
    for k in DESCRIBE_FIELDS:
        assert streamed.sums[k].tobytes() == held.sums[k].tobytes()


def test_a_failing_site_in_the_middle_does_not_hold_back_the_sum_of_the_others():
    _, parts = classification_parts(600, 6, 3, 1, [0.2] * 5, seed=4)
    fed = LocalFederation(make_sites(parts, names="s{i}"), min_sites=3)
    run_election(fed, 0.5)
    request = Message("describe", meta={"part": "train", "features": list(fed.schema.columns)})
    spec = {k: 0 for k in DESCRIBE_FIELDS}

    def check(site, reply):
        if site == "s1":
            raise ValueError("rejected")

    streamed = PlainSums().exchange(fed, {s: request for s in fed.sites}, SumSpec(spec, stream=True), check,
                                    kind="describe", step=None)
    assert streamed.sites == ["s0", "s2", "s3", "s4"] and "s1" in fed.dropped
    own = _own_moments([fed.site(s) for s in streamed.sites], fed.schema.columns)
    np.testing.assert_allclose(streamed.sums["count"], own["count"])
    np.testing.assert_allclose(streamed.sums["sum"], own["sum"], rtol=1e-12, atol=1e-9)
