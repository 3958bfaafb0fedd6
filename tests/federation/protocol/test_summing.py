"""The quorum holds in every mode (issue 21): plain, secure sums, DP, robust reducers × a site
that raises, refuses, hangs, lacks the target, or (secure) drops after masking.

Four sites, ``min_sites=3``: the failing one is dropped and named in ``dropped`` with its
reason, the run completes on the others, and (plain, secure, robust) its model equals the
same run on the three honest sites alone. (Three honest sites, because a site takes part in
a secure sum only over at least ``min_peers=3`` peers, itself included.)

The imputation has the same matrix: a site that raises, refuses or hangs on its first exchange
(it never takes part: plain, secure and robust equal the honest sites' run) or in the FedAvg
rounds (after the schema, statistics and, with secure sums, the key exchange), and (secure) one
that drops after masking.
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
    kinds: tuple[str, ...] = ("fit", "describe", "evaluate")  # the requests it fails on

    def handle(self, request: Message) -> Message:
        kind = request.kind
        if self.how == "drops_after_masking":
            return Message.error("connection lost") if kind == "secagg_unmask" else super().handle(request)
        if kind not in self.kinds:
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
    table = classification_table(1200, 8, 4, 2, 0, seed=3, class_sep=1.2)
    return split_rows(table, [0.3, 0.25, 0.25, 0.2], stratify="target", seed=3)


def _federation(parts, how: str | None, mode: str, impute_step: str | None = None) -> LocalFederation:
    """Three honest sites and (``how``) a failing one; ``impute_step``: feature tables only (an
    imputation), the failing site fails on that step."""
    target = None if impute_step is not None else "target"
    tables = [p.drop(columns="target") if target is None else p for p in parts]
    sites = [Site(f"s{i}", tables[i], target) for i in range(3)]
    if how is not None:
        bad = Faulty("bad", tables[3], target)
        bad.how = how
        if impute_step is not None:
            bad.kinds = (impute_step,)
        sites.append(bad)
    fed = LocalFederation(sites, min_sites=3, timeout=5.0 if how == "hangs" else None)
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
    assert set(fed.active) == {"s0", "s1", "s2"}
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


# ----------------------------------------------------------------------------- imputation
IMPUTE_FAILURES = ("raises", "refuses", "hangs", "drops_after_masking")
#: where the failing site starts failing: the first exchange (it never takes part) or the FedAvg rounds
IMPUTE_STEPS = ("impute_schema", "impute_fit")


def _impute_cases():
    for mode in MODES:
        for how in IMPUTE_FAILURES:
            if how == "drops_after_masking":
                if mode == "secure":
                    yield pytest.param(mode, how, "impute_fit", id=f"{mode}-{how}")
                continue
            for step in IMPUTE_STEPS:
                yield pytest.param(mode, how, step, id=f"{mode}-{how}-{step}")


_IMPUTE_CFG = {"rounds": 2, "local_epochs": 1, "hidden_dim": 4, "n_layers": 1, "max_steps_per_round": 3,
               "n_threads": 1}


@pytest.mark.parametrize(("mode", "how", "step"), list(_impute_cases()))
def test_a_site_failing_during_imputation_is_dropped_and_named_in_every_mode(parts, mode, how, step):
    pytest.importorskip("torch")
    from fedtab.federation.workflows.imputation import ImputeConfig, run_imputation

    fed = _federation(parts, how, mode, impute_step=step)
    try:
        out = run_imputation(fed, ImputeConfig(**_IMPUTE_CFG))
    finally:
        _RELEASE.set()
    assert "bad" in out.dropped and out.dropped["bad"], out.dropped
    assert set(fed.active) == {"s0", "s1", "s2"}
    assert out.history and all(np.isfinite(w).all() for w in out.weights.values())
    if how != "drops_after_masking":  # a site dropping after masking is still in that sum
        assert all("bad" not in p["sites"] for p in out.participation[-1:])
    if step == "impute_schema" and mode != "dp":  # it never took part: the run on the honest sites alone
        ref = run_imputation(_federation(parts, None, mode, impute_step=step), ImputeConfig(**_IMPUTE_CFG))
        assert out.columns == ref.columns
        np.testing.assert_allclose(out.mean, ref.mean, rtol=1e-9)
        for k in ref.weights:
            np.testing.assert_allclose(out.weights[k], ref.weights[k], rtol=1e-5, atol=1e-6)
    _RELEASE.clear()


@pytest.mark.parametrize("mode", list(MODES))
def test_without_a_quorum_a_site_failing_during_imputation_is_named_and_the_run_stops(parts, mode):
    pytest.importorskip("torch")
    from fedtab.federation.workflows.imputation import ImputeConfig, run_imputation

    fed = _federation(parts, "raises", mode, impute_step="impute_fit")
    fed.min_sites = None
    with pytest.raises(Exception, match="bad"):
        run_imputation(fed, ImputeConfig(**_IMPUTE_CFG))
