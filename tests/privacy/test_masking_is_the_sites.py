"""Masking is the site's decision, and the require flags cover every summed kind (issue 28 items 1
and 4): a secure request whose field list leaves a summable array out is refused, the gate leaves
exact only histograms that are actually masked, and a site that requires secure aggregation or DP
refuses a plain request of every kind the registry declares summed."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation import Federation, FederationError, Message, Site, register_all, run_training
from fedtab.federation.protocol.kinds import KINDS
from fedtab.federation.protocol.secure_aggregator import SecureAggregator
from fedtab.privacy import DisclosurePolicy
from fedtab.privacy.gate import FLAG, SMOOTHED, Releases, Vocabulary, release

register_all()


class Recording(Federation):
    """Every request and reply the server exchanged."""

    def __init__(self, inner: LocalFederation) -> None:
        super().__init__()
        self.inner, self.seen = inner, []

    @property
    def sites(self):
        return self.inner.sites

    def ask(self, requests: Mapping[str, Message]) -> dict[str, Message]:
        out = self.inner.ask(requests)
        self.seen += [(name, requests[name], out[name]) for name in out]
        return out


def _sites(policy: DisclosurePolicy | None = None, n: int = 3, rows: int = 150) -> list[Site]:
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        x = rng.normal(size=(rows, 3))
        t = pd.DataFrame(x, columns=["a", "b", "c"]).assign(y=(x[:, 0] + rng.normal(0, .5, rows) > 0).astype(int))
        out.append(Site(f"h{i}", t, "y", policy=policy))
    return out


# ----------------------------------------------------------------------------- the attack of issue 28
def test_a_secure_request_that_leaves_the_score_histogram_out_is_refused_and_nothing_leaves_in_the_clear():
    """Genuine peers, a curious server: a ``secagg`` field list of only ``confusion`` would have
    had the gate skip smoothing and ``mask_reply`` send the exact histogram (every test value)."""
    fed = Recording(LocalFederation(_sites()))  # default policy: min_rows=10
    run_training(fed, ["a", "b", "c"], rounds=1)
    evaluate = next(q for _, q, _ in fed.seen if q.kind == "evaluate")  # the server's own model, 1000 bins
    assert evaluate.meta.get("score_bins") == 1000
    start = len(fed.seen)
    with pytest.raises(FederationError) as err:
        SecureAggregator(fed).ask({s: evaluate for s in fed.sites}, "evaluate", {"confusion": 0})
    assert "score_hist" in str(err.value) and "unmasked" in str(err.value)
    replies = [r for _, q, r in fed.seen[start:] if q.kind == "evaluate"]
    assert len(replies) == 3 and all(r.is_refusal for r in replies)
    assert all(not r.arrays for r in replies)  # no histogram, no Brier sum, nothing in the clear
    # the same sum with every summable array masked is answered (and the sum is the sites' own)
    fields = {"confusion": 0, "brier_sum": 16, "score_hist": 16}
    summed = SecureAggregator(fed).ask({s: evaluate for s in fed.sites}, "evaluate", fields)
    assert summed.sums["confusion"].sum() == sum(fed.inner.site(s).n_rows("test") for s in fed.sites)


def test_the_gate_smooths_every_histogram_that_is_not_actually_masked():
    decl = Releases(part="=test", aggregates=("confusion",), histograms=("score_hist",), meta={SMOOTHED: FLAG})
    hist = np.zeros((2, 50))
    hist[0, [3, 17, 40]] = 1.0  # three single rows, each a test value
    hist[1, 10:30] = 1.0
    reply = Message("probe", {"confusion": np.eye(2), "score_hist": hist}, {})
    vocab = Vocabulary(lambda: [], lambda: [])

    def out(masked: frozenset[str]) -> np.ndarray:
        return release(decl, reply, min_rows=10, under_dp=False, vocab=vocab, masked=masked).arrays["score_hist"]

    for masked in (frozenset(), frozenset({"confusion"})):  # a request that "is secure" but masks another array
        smoothed = out(masked)
        assert np.all(smoothed[0] == 0)  # 3 rows in all: fewer than min_rows, nothing of them is released
        assert smoothed[1].sum() == pytest.approx(20.0) and not np.array_equal(smoothed[1], hist[1])
        values, starts = np.unique(smoothed[1], return_index=True)  # each run of equal bins holds >= 10 rows
        for v in values[values > 0]:
            assert v * np.count_nonzero(np.isclose(smoothed[1], v)) >= 10 - 1e-9
    assert np.array_equal(out(frozenset({"score_hist"})), hist)  # masked next: the server sees only a sum


# ----------------------------------------------------------------------------- require flags, every kind
def _summed_request(name: str) -> Message:
    """A plain request of ``name`` that asks for its summed numbers (some kinds sum only with a meta key)."""
    kind = KINDS[name]
    for meta in ({}, {"describe": "train", "features": ["a"]}):
        request = Message(name, meta=meta)
        if kind.is_summed(request):
            return request
    raise AssertionError(f"no plain request of {name!r} is summed: extend _summed_request")


OWN = sorted(n for n, k in KINDS.items() if k.home.startswith("fedtab."))
SUMMED = [n for n in OWN if KINDS[n].summed]
PER_SITE = [n for n in OWN if not KINDS[n].summed]


@pytest.mark.parametrize("flag", ["require_secure_aggregation", "require_dp"])
@pytest.mark.parametrize("name", SUMMED)
def test_a_site_with_a_require_flag_refuses_a_plain_request_of_every_summed_kind(name, flag):
    site = _sites(DisclosurePolicy(min_rows=1, **{flag: True}), n=1)[0]
    reply = site.handle(_summed_request(name))
    assert reply.is_refusal and f"({flag})" in reply.meta["reason"], (name, reply.meta)


@pytest.mark.parametrize("name", PER_SITE)
def test_the_require_flags_leave_per_site_kinds_to_their_own_rules(name):
    site = _sites(DisclosurePolicy(min_rows=1, require_secure_aggregation=True, require_dp=True), n=1)[0]
    reply = site.handle(Message(name))
    text = str(reply.meta.get("reason") or reply.meta.get("error") or "")
    assert "require_secure_aggregation" not in text and "require_dp" not in text


def test_the_summed_kinds_include_what_the_old_list_missed():
    assert {"gbdt_level", "gbdt_start", "gbdt_evaluate", "gbdt_score", "gbdt_importance", "select_prepare",
            "select_fit", "select_evaluate"} <= set(SUMMED)
