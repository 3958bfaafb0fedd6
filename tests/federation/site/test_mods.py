"""Site-side mods (issue 29, "Done when" item 1): a mode's wrappers around a handler, named by the
kind's declaration and applied once by ``Site.handle``; the parameters they set are the site's alone."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedtab.privacy.dp as dp_module
from fedtab.federation import Message, Site
from fedtab.federation.protocol.kinds import MessageKind, declare, forget
from fedtab.federation.site.mods import (SITE_PARAMS, forget_mode, register_mode, request_modes, site_params,
                                         with_params)
from fedtab.federation.site.registry import HANDLERS, handler
from fedtab.federation.steps.describe import describe_site
from fedtab.privacy import DisclosurePolicy
from fedtab.privacy.dp import DP_META, column_bounds, moment_release, site_noise_floor
from fedtab.privacy.gate import COUNT, Releases
from fedtab.privacy.secagg import SECAGG_META

TOY_META = "toy_scale"


def _scale(site, request, call_next):
    """The toy mode's parameter mod: the algorithm's ``factor`` from the request's toy settings."""
    return call_next(site, with_params(request, factor=float(request.meta[TOY_META])))


def _shift(site, request, call_next):
    """The toy mode's release mod: one added to every released sum."""
    reply = call_next(site, request)
    return Message(reply.kind, {**reply.arrays, "toy_sum": reply.arrays["toy_sum"] + 1.0}, reply.meta)


TRACE: list[str] = []


def _outer(site, request, call_next):
    TRACE.append("outer in")
    reply = call_next(site, request)
    TRACE.append("outer out")
    return reply


def _inner(site, request, call_next):
    TRACE.append("inner in")
    reply = call_next(site, request)
    TRACE.append("inner out")
    return reply


@pytest.fixture
def toy():
    register_mode("toy", TOY_META)
    register_mode("toy_trace", "toy_trace")
    kind = declare(MessageKind(
        "toy_scaled", __name__, Releases(part="=train", cells={"toy_count": ("toy_sum",)}, meta={"n": COUNT}),
        "toy sums over the training rows", mods=(("toy", _shift), ("toy", _scale), ("toy_trace", _outer),
                                                 ("toy_trace", _inner))))
    seen: list[dict] = []

    @handler("toy_scaled")
    def _toy(site: Site, request: Message) -> Message:
        params = site_params(request)
        seen.append(dict(params))
        TRACE.append("handler")
        x = site.table[["a"]].to_numpy(dtype=float) * params.get("factor", 1.0)  # the algorithm's own parameter
        return Message("toy_scaled", {"toy_count": np.array([len(x)]), "toy_sum": x.sum(0)}, {"n": len(x)})

    yield kind, seen
    HANDLERS.pop("toy_scaled", None)
    forget("toy_scaled")
    forget_mode("toy")
    forget_mode("toy_trace")
    TRACE.clear()


def _site(**policy) -> Site:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    return Site("t0", pd.DataFrame(x, columns=["a", "b"]).assign(y=(x[:, 0] > 0).astype(int)), "y",
                policy=DisclosurePolicy(**{"min_rows": 5, **policy}))


def test_a_toy_modes_mods_wrap_the_handler_only_for_a_request_in_that_mode(toy):
    _, seen = toy
    site = _site()
    exact = site.rows("train")["a"].to_numpy().sum()
    plain = site.handle(Message("toy_scaled"))
    assert not plain.is_error and plain.arrays["toy_sum"][0] == pytest.approx(exact)
    scaled = site.handle(Message("toy_scaled", meta={TOY_META: 3}))
    assert not scaled.is_error, scaled.meta
    assert scaled.arrays["toy_sum"][0] == pytest.approx(3 * exact + 1)  # the parameter, then the release mod
    assert seen == [{}, {"factor": 3.0}]


def test_the_first_declared_mod_is_the_outermost(toy):
    site = _site()
    assert not site.handle(Message("toy_scaled", meta={"toy_trace": True})).is_error
    assert TRACE == ["outer in", "inner in", "handler", "inner out", "outer out"]


def test_a_server_cannot_set_the_parameters_a_mod_sets(toy):
    _, seen = toy
    site = _site()
    exact = site.rows("train")["a"].to_numpy().sum()
    reply = site.handle(Message("toy_scaled", meta={SITE_PARAMS: {"factor": 100.0}}))
    assert not reply.is_error and reply.arrays["toy_sum"][0] == pytest.approx(exact)
    assert seen == [{}]
    reply = site.handle(Message("toy_scaled", meta={TOY_META: 2, SITE_PARAMS: {"factor": 100.0}}))
    assert reply.arrays["toy_sum"][0] == pytest.approx(2 * exact + 1) and seen[-1] == {"factor": 2.0}


def test_modes_are_read_from_the_request_meta_and_registered_once():
    assert request_modes({DP_META: {"z": 1.0}}) == ("dp",)
    assert request_modes({SECAGG_META: {}, DP_META: {}}) == ("dp", "secure")
    assert request_modes({"part": "train"}) == ()
    with pytest.raises(ValueError, match="already registered"):
        register_mode("dp", "not_dp")


# ----------------------------------------------------------------------------- fedtab's own mods
def _skewed_site() -> Site:
    """A site whose column ``rare`` is observed in 3 rows only (below min_rows=10: suppressed in the clear)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 2))
    x[3:, 1] = np.nan
    table = pd.DataFrame(x, columns=["a", "rare"]).assign(y=(x[:, 0] > 0).astype(int))
    return Site("s", table, "y", test_size=0.0, policy=DisclosurePolicy(min_rows=10, max_epsilon_per_release=1.0))


def test_a_plain_description_is_suppressed_even_when_the_server_asks_for_exact_moments():
    site = _skewed_site()
    for meta in ({}, {SITE_PARAMS: {"suppress": False, "bounds": [-1, 1]}}):
        reply = site.handle(Message("describe", meta={"part": "train", "features": ["a", "rare"], **meta}))
        assert not reply.is_error, reply.meta
        assert reply.arrays["count"].tolist() == [200, 0]  # 3 rows behind "rare": suppressed
        assert reply.arrays["sum"][0] == pytest.approx(site.table["a"].sum())  # not clipped to [-1, 1]


@pytest.mark.parametrize("kind", ["describe", "set_mask"])
def test_the_dp_mod_noises_the_exact_moments_of_the_clipped_values(monkeypatch, kind):
    site = _skewed_site()
    feats, bounds = ["a", "rare"], [-1.0, 1.0]
    draws = []
    monkeypatch.setattr(dp_module, "noise_rng", lambda: draws.append(1) or np.random.default_rng(7))
    z = 5.0
    dp = {"z": z, "bounds": bounds, "clip": 1.0}
    meta = {"part": "train", "features": feats} if kind == "describe" else {"features": feats, "describe": "train"}
    reply = site.handle(Message(kind, meta={**meta, DP_META: dp}))
    assert not reply.is_error and not reply.is_refusal, reply.meta
    exact = describe_site(site, feats, "train", bounds=bounds, suppress=False)
    assert exact.arrays["count"].tolist() == [200, 3]  # the exact moments of the clipped values
    assert np.abs(exact.arrays["sum"]).max() <= 200
    z_site = max(z, site_noise_floor(site.policy.max_epsilon_per_release, site.policy.delta))
    expected = moment_release(exact.arrays, *column_bounds(dp, feats), {**dp, "z": z_site}, )
    for k in ("count", "sum", "sumsq"):
        np.testing.assert_array_equal(reply.arrays[k], expected[k])
    assert len(draws) == 2  # one generator for the reply, one for the expectation


def test_a_dp_request_of_a_kind_without_a_dp_release_is_refused_before_its_handler():
    from tests.federation.steps.test_evaluation_sweep import _linear_site

    site, request = _linear_site({"min_rows": 10})
    plain = site.handle(request(0))
    assert not plain.is_error and not plain.is_refusal, plain.meta
    before = site.state_digest()
    req = request(1)
    reply = site.handle(Message(req.kind, req.arrays, {**req.meta, DP_META: {"z": 5.0, "bounds": [-5, 5]}}))
    assert reply.is_refusal and "no differentially private release" in reply.meta["reason"]
    assert site.state_digest() == before  # nothing charged, nothing released


@pytest.mark.parametrize("kind", ["ballot", "ballot_fit"])
def test_a_dp_ballot_is_the_noisy_ballot_of_the_selectors_scores(monkeypatch, kind):
    import fedtab.federation.workflows.election.site as election_site
    from fedtab.federation.workflows.election.site import unpack_mask
    from fedtab.privacy.dp import noisy_scores
    from tests.builders import classification_parts, make_sites

    _, parts = classification_parts(600, 6, 3, 1, (1.0,), seed=3)
    site = make_sites(parts, policy={"min_rows": 10})[0]
    plain = site.handle(Message(kind, meta={"selector": "anova"}))
    assert not plain.is_error and not plain.is_refusal, plain.meta
    monkeypatch.setattr(election_site, "noise_rng", lambda: np.random.default_rng(7))
    z = 5.0
    reply = site.handle(Message(kind, meta={"selector": "anova", DP_META: {"z": z, "bounds": [-5, 5], "clip": 1.0}}))
    assert not reply.is_error and not reply.is_refusal, reply.meta
    z_site = max(z, site_noise_floor(site.policy.max_epsilon_per_release, site.policy.delta))
    mask, scores = noisy_scores(plain.arrays["scores"], {"z": z_site}, np.random.default_rng(7))
    np.testing.assert_array_equal(reply.arrays["scores"], election_site.wire_scores(scores, mask))
    assert not np.array_equal(reply.arrays["scores"], plain.arrays["scores"])  # never the exact ballot under DP
    assert unpack_mask(reply.arrays["mask"], len(scores)).tolist() == mask.tolist()
