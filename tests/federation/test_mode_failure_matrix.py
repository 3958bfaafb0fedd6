"""The quorum holds in every mode (issue 21): plain, secure sums, DP, robust reducers × a site
that raises, refuses, hangs, lacks the target, or (secure) drops after masking.

Three sites, ``min_sites=2``: the failing one is dropped and named in ``dropped`` with its
reason, the run completes on the others, and (plain, secure, robust) its model equals the
same run on the two honest sites alone.
"""

import threading

import numpy as np
import pytest

from fedtab import LocalFederation, Site
from fedtab.data import classification_table, split_rows
from fedtab.federation import Message, run_election, run_training
from fedtab.federation.protocol import set_options

MODES = {
    "plain": {},
    "secure": {"secure_aggregation": True},
    "dp": {"dp": {"epsilon": 50.0, "delta": 1e-5, "bounds": [-6.0, 6.0]}},
    "robust": {"robust": True},
}
FAILURES = ("raises", "refuses", "hangs", "no_target", "drops_after_masking")
_RELEASE = threading.Event()


class Faulty(Site):
    """A site that fails in one way on the training steps (after answering the election)."""

    how: str = "raises"

    def handle(self, request: Message) -> Message:
        kind = request.kind
        if self.how == "drops_after_masking":
            return Message.error("connection lost") if kind == "secagg_unmask" else super().handle(request)
        if kind not in ("fit", "describe", "evaluate"):
            return super().handle(request)
        if self.how == "raises":
            return Message.error("RuntimeError: disk on fire")
        if self.how == "refuses":
            return Message.refusal("the site's operator paused it")
        if self.how == "no_target":
            return Message.error("'fit' failed at the site (KeyError); the site's log has the details")
        _RELEASE.wait(60)  # "hangs": never answers within the federation's timeout
        return super().handle(request)


@pytest.fixture(scope="module")
def parts():
    table = classification_table(900, 8, 4, 2, 0, seed=3, class_sep=1.2)
    return split_rows(table, [0.4, 0.35, 0.25], stratify="target", seed=3)


def _federation(parts, how: str | None, mode: str) -> LocalFederation:
    sites = [Site("s0", parts[0], "target"), Site("s1", parts[1], "target")]
    if how is not None:
        bad = Faulty("bad", parts[2], "target")
        bad.how = how
        sites.append(bad)
    fed = LocalFederation(sites, min_sites=2, timeout=5.0 if how == "hangs" else None)
    set_options(fed, **MODES[mode])
    return fed


def _cases():
    for mode in MODES:
        for how in FAILURES:
            if how == "drops_after_masking" and mode != "secure":
                continue
            yield pytest.param(mode, how, id=f"{mode}-{how}")


@pytest.mark.parametrize(("mode", "how"), list(_cases()))
def test_a_failing_site_is_dropped_and_named_in_every_mode(parts, mode, how):
    fed = _federation(parts, how, mode)
    try:
        out = run_training(fed, ["f0", "f1", "f2", "f3"], rounds=2, local_epochs=2)
    finally:
        _RELEASE.set()
    assert "bad" in out.dropped and out.dropped["bad"], out.dropped
    assert set(fed.active) == {"s0", "s1"}
    if how != "drops_after_masking":  # a site dropping after masking is still in that round's sum
        assert all("bad" not in p["sites"] for p in out.participation[-1:])
    if mode in ("plain", "secure", "robust") and how != "drops_after_masking":
        ref = run_training(_federation(parts, None, mode), ["f0", "f1", "f2", "f3"], rounds=2, local_epochs=2)
        for k in ref.params:
            np.testing.assert_allclose(out.params[k], ref.params[k], rtol=1e-5, atol=1e-6)
    _RELEASE.clear()


@pytest.mark.parametrize("mode", list(MODES))
def test_without_a_quorum_the_failing_site_is_named_and_the_run_stops(parts, mode):
    fed = _federation(parts, "raises", mode)
    fed.min_sites = None
    with pytest.raises(Exception, match="bad"):
        run_training(fed, ["f0", "f1"], rounds=1, local_epochs=1)


def test_an_election_then_training_keeps_dropping_the_same_site(parts):
    fed = _federation(parts, "raises", "plain")
    el = run_election(fed, 0.5, describe="train")
    out = run_training(fed, el.result.selected_names, rounds=1, described=el.described)
    assert "bad" in out.dropped or "bad" in fed.dropped
