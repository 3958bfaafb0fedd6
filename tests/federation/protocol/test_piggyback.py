"""Piggy-backing (issue 31 item 1): a request carrying a second kind's request is answered part by
part on the site's one release path -- refused, charged and released exactly as its parts sent
alone -- and one exchange carries both."""

from __future__ import annotations

import numpy as np
import pytest

from fedtab import LocalFederation, Site
from fedtab.federation import Message
from fedtab.federation.protocol import exchange
from fedtab.federation.protocol import piggyback, riders
from tests.builders import classification_parts


@pytest.fixture(scope="module")
def parts():
    return classification_parts(240, 6, 3, 1, [0.5, 0.5], seed=3)[1]


def _site(part, **policy):
    return Site("a", part, "target", seed=7, policy=policy or None)


def _same(a: Message, b: Message) -> None:
    assert (a.kind, sorted(a.arrays)) == (b.kind, sorted(b.arrays))
    for k in a.arrays:
        np.testing.assert_array_equal(a.arrays[k], b.arrays[k])
    assert {k: v for k, v in a.meta.items() if k != piggyback.REPLIES} == b.meta


def test_a_fused_request_is_answered_and_charged_exactly_as_its_parts(parts):
    alone, fused = _site(parts[0]), _site(parts[0])
    first, second = Message("impute_schema"), Message("job_profile")
    r1, r2 = alone.handle(first), alone.handle(second)
    reply = fused.handle(piggyback.fuse(second, [first]))
    primary, riders = piggyback.split_reply(reply, 1)
    _same(primary, r2)
    _same(riders[0], r1)
    assert fused.ledger.snapshot() == alone.ledger.snapshot()
    assert fused.state_digest() == alone.state_digest()


def test_a_refused_part_is_refused_as_alone_and_stops_the_parts_after_it(parts):
    # a cap of one release per part: the second part over the training rows is refused, alone or fused
    alone, fused = _site(parts[0], max_releases_per_part=1), _site(parts[0], max_releases_per_part=1)
    first, second = Message("impute_schema"), Message("impute_schema")
    alone.handle(first)
    refused = alone.handle(second)
    reply = fused.handle(piggyback.fuse(Message("job_profile"), [first, second]))
    primary, riders = piggyback.split_reply(reply, 2)
    assert refused.is_refusal and "max_releases_per_part" in refused.meta["reason"]  # refused before its handler
    _same(riders[1], refused)
    assert primary.is_error and "impute_schema" in primary.meta["error"]  # the primary was never answered
    assert fused.ledger.snapshot() == alone.ledger.snapshot()


def test_riders_cannot_nest_or_smuggle_arrays(parts):
    site = _site(parts[0])
    inner = piggyback.fuse(Message("job_profile"), [Message("impute_schema")])
    assert site.handle(piggyback.fuse(Message("job_profile"), [inner])).is_error
    bad = Message("job_profile", {"ride9:x": np.zeros(2)}, {piggyback.PARTS: [{"kind": "impute_schema", "meta": {}}]})
    assert site.handle(bad).is_error
    too_many = piggyback.fuse(Message("job_profile"), [Message("impute_schema")] * (piggyback.MAX_PARTS + 1))
    assert site.handle(too_many).is_error


def test_a_queued_rider_costs_no_exchange_of_its_own(parts):
    fed = LocalFederation([Site(f"s{i}", p, "target", seed=i) for i, p in enumerate(parts)])
    got = {}
    piggyback.ride(fed, Message("impute_schema"), None, got.update)
    replies = exchange(fed, Message("job_profile"))
    assert fed.exchange_count == 1 and set(got) == set(replies) == {"s0", "s1"}
    assert all(r.kind == "impute_schema" for r in got.values())
    assert all(piggyback.REPLIES not in r.meta for r in replies.values())
    steps = [p["step"] for p in fed.participation]
    assert steps == ["impute_schema", "job_profile"]
    piggyback.ride(fed, Message("impute_schema"), None, got.update)
    riders.flush(fed)  # nothing to ride on: sent alone
    assert fed.exchange_count == 2 and not piggyback.pending(fed)


def test_an_independent_refused_part_stops_nothing_after_it(parts):
    # the same refusal as above, marked independent (a local baseline riding on a Newton iteration):
    # the part is refused exactly as alone, and the primary is still answered as alone
    alone, fused = _site(parts[0], max_releases_per_part=1), _site(parts[0], max_releases_per_part=1)
    first, second = Message("impute_schema"), Message("impute_schema")
    alone.handle(first)
    refused, profile = alone.handle(second), alone.handle(Message("job_profile"))
    reply = fused.handle(piggyback.fuse(Message("job_profile"), [first, second], [False, True]))
    primary, riders = piggyback.split_reply(reply, 2)
    _same(riders[1], refused)
    _same(primary, profile)
    assert fused.ledger.snapshot() == alone.ledger.snapshot()
    bad = piggyback.fuse(Message("job_profile"), [first], [True])
    bad.meta[piggyback.PARTS][0]["independent"] = "yes"
    assert fused.handle(bad).is_error  # a flag is true or false, nothing else
