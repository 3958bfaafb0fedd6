"""``elect(..., compat=...)``: the peers' server rules, checked against the peers' code.

* NVIDIA FLARE 2.9: the installed ``FeatureElectionController`` is called directly
  (``_extract_client_data`` then ``aggregate_selections``, its whole server pipeline).
* FLASH (``ServerAggregator.feature_election``, parasecurity/FLASH ``src/server.py`` at
  commit ac3b291) and the Flower example (``FeatureElectionStrategy._aggregate_selections``,
  adap/flower PR #6182, ``examples/feature-election/feature_election/strategy.py`` at
  commit ce44180d99) are not installable, so :func:`flash_reference` and
  :func:`flower_reference` re-state them. Both re-statements were checked against the
  originals (their functions run unmodified on stubbed I/O) on 3,000 ballots of
  :func:`random_ballots` (seed 1) × :data:`FDS` × both aggregations = 102,000 elections
  each: 0 mismatches for FLASH; for Flower 0 mismatches wherever no vote is tied across the
  cut (there the original's choice is numpy's introselect order; both re-statement and
  original kept exactly ``k`` features from the tied set).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fedtab.election import Ballot, ElectionTally, elect, elect_ballots

#: freedom degrees checked against the originals: the cut-offs 0.01/0.99 and points near them
FDS = [0.0, 0.005, 0.01, 0.0100001, 0.05, 0.1, 0.2, 0.3, 1 / 3, 0.5, 0.7, 0.9, 0.98, 0.9899999, 0.99, 0.995, 1.0]
#: the grid of the FLARE test in ``make test`` (fd near 0 and 1, FLARE's ceil at 0.3)
FLARE_FDS = [0.0, 0.005, 0.01, 0.0100001, 0.3, 0.5, 0.9, 0.9899999, 0.99, 1.0]
#: the grid of the FLASH / Flower tests (their cut-offs are exactly 0 and 1)
PEER_FDS = [0.0, 0.05, 0.3, 0.5, 0.98, 1.0]
AGGS = ("weighted", "uniform")


def random_ballots(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """K sites × d features: ties, constant, signed and all-zero scores, all-False/all-True
    sites, 100+ features in a fifth of the cases, equal or unequal sample counts."""
    k = int(rng.integers(1, 7))
    d = int(rng.integers(100, 160)) if rng.random() < 0.2 else int(rng.integers(2, 31))
    masks = rng.random((k, d)) < rng.uniform(0.05, 0.95)
    kind = rng.integers(0, 5)
    if kind == 0:
        scores = rng.normal(size=(k, d))  # signed
    elif kind == 1:
        scores = rng.integers(0, 3, size=(k, d)).astype(float)  # many ties
    elif kind == 2:
        scores = np.abs(rng.normal(size=(k, d)))
    elif kind == 3:
        scores = np.repeat(rng.normal(size=(k, 1)), d, axis=1)  # constant per site
    else:
        scores = rng.choice([-1.0, 0.0, 0.5, 1.0], size=(k, d))
    for i in range(k):
        r = rng.random()
        if r < 0.12:
            masks[i] = False
        elif r < 0.2:
            masks[i] = True
        if rng.random() < 0.1:
            scores[i] = 0.0
    n = rng.integers(1, 1000, size=k) if rng.random() < 0.7 else np.full(k, int(rng.integers(1, 50)))
    return masks, scores, [int(x) for x in n]


def as_ballots(masks, scores, n):
    return [Ballot.build(m, s, c, site=f"site-{i}") for i, (m, s, c) in enumerate(zip(masks, scores, n))]


def _selected_minmax(mask, score, constant):
    out = np.zeros(score.size)
    if mask.any():
        lo, hi = score[mask].min(), score[mask].max()
        out[mask] = (score[mask] - lo) / (hi - lo) if hi - lo > 0 else constant
    return out


def _peer_votes(masks, scores, n, mode):
    """FLASH's and Flower's vote: selected-only min-max (constant -> 1), intersection zeroed,
    times n_i / Σn when weighted, summed over the rows."""
    inter = masks.all(axis=0)
    rows = []
    for m, s, c in zip(masks, scores, n):
        row = _selected_minmax(m, s, 1.0)
        row[inter] = 0.0
        rows.append(row * (c / sum(n)) if mode == "weighted" else row)
    return np.sum(rows, axis=0)


def _peer_reference(masks, scores, n, fd, mode, admit):
    """What FLASH and Flower share: fd == 0 / 1 -> intersection / union, no disputed ->
    intersection; else ``admit(disputed, votes, k)`` with k = ceil(fd·|D|) joins the intersection."""
    inter, union = masks.all(axis=0), masks.any(axis=0)
    if fd in (0, 1):
        return inter if fd == 0 else union
    diff = union & ~inter
    if not diff.any():
        return inter
    return inter | admit(diff, _peer_votes(masks, scores, n, mode), int(np.ceil(diff.sum() * fd)))


def flash_reference(masks, scores, n, fd, mode):
    """FLASH: the disputed features whose vote reaches the k-th highest (ties all admitted)."""
    def admit(diff, votes, k):
        return diff & (votes >= np.sort(votes[diff])[-min(k, diff.sum())])
    return _peer_reference(masks, scores, n, fd, mode, admit)


def flower_reference(masks, scores, n, fd, mode):
    """Flower: exactly k disputed features, picked by ``argpartition``."""
    def admit(diff, votes, k):
        k = min(k, int(diff.sum()))
        idx = np.flatnonzero(diff)
        out = np.zeros_like(diff)
        out[idx[np.argpartition(votes[idx], -k)[-k:]]] = True
        return out
    return _peer_reference(masks, scores, n, fd, mode, admit)


def tied_across_cut(masks, scores, n, fd, mode) -> np.ndarray | None:
    """The disputed features tied with the k-th highest vote when the (k+1)-th ties with it
    too (Flower's choice among them is open), else ``None``."""
    inter, union = masks.all(axis=0), masks.any(axis=0)
    diff = union & ~inter
    if fd in (0, 1) or diff.sum() < 2:
        return None
    k = int(np.ceil(diff.sum() * fd))
    if k >= diff.sum():
        return None
    votes = _peer_votes(masks, scores, n, mode)
    v = np.sort(votes[diff])[::-1]
    return diff & (votes == v[k - 1]) if v[k - 1] == v[k] else None


# ----------------------------------------------------------------------------- FLARE


def test_nvflare_profile_equals_flare_controller_on_random_ballots():
    pytest.importorskip("nvflare")
    from nvflare.apis.shareable import Shareable
    from nvflare.app_opt.feature_election.controller import FeatureElectionController

    rng = np.random.default_rng(0)
    mismatches = compared = selected_only_mismatches = 0
    kinds = {"all_false_site": 0, "100+_features": 0}
    logging.disable(logging.WARNING)  # FLARE logs every all-False client it drops
    try:
        for b in range(1000):
            masks, scores, n = random_ballots(rng)
            ballots = as_ballots(masks, scores, n)
            controller = FeatureElectionController()
            replies = {}
            for i in range(len(n)):
                reply = Shareable()
                reply["selected_features"] = masks[i].tolist()
                reply["feature_scores"] = scores[i].tolist()
                reply["num_samples"] = n[i]
                replies[f"site-{i}"] = reply
            votes = controller._extract_client_data(replies)
            kinds["all_false_site"] += bool((~masks.any(axis=1)).any())
            kinds["100+_features"] += masks.shape[1] >= 100
            for fd in FLARE_FDS:
                for agg in AGGS:
                    controller.freedom_degree, controller.aggregation_mode = fd, agg
                    theirs = controller.aggregate_selections(votes)
                    ours = elect_ballots(ballots, fd, agg, compat="nvflare")
                    compared += 1
                    mismatches += not np.array_equal(theirs, ours.mask)
                    if b < 100:  # fedtab's FLARE normalisation alone is not FLARE's rule
                        plain = elect_ballots(ballots, fd, agg, normalization="selected").mask
                        selected_only_mismatches += not np.array_equal(theirs, plain)
    finally:
        logging.disable(logging.NOTSET)
    assert compared == 1000 * len(FLARE_FDS) * 2
    assert mismatches == 0
    assert selected_only_mismatches > 300  # the differences the profile exists for
    assert min(kinds.values()) >= 50


def flare_fixture_ballots():
    """FLARE's unit-test fixture: make_classification(200, 20, 10 informative, 5 redundant,
    random_state=42), FLARE's 2-client stratified split, the 80 % training part of each
    client (FLARE's ``simulate_election`` split), and fedtab's copy of FLARE's Lasso selector."""
    pytest.importorskip("nvflare")
    import pandas as pd
    from nvflare.app_opt.feature_election import FeatureElection
    from sklearn.datasets import make_classification
    from sklearn.model_selection import train_test_split

    from fedtab.election.selectors import make_selector
    from fedtab.engines.site_config import NVFLARE_LASSO

    X, y = make_classification(n_samples=200, n_features=20, n_informative=10, n_redundant=5, random_state=42)
    df = pd.DataFrame(X, columns=[f"feature_{i}" for i in range(20)])
    df["target"] = y
    fe = FeatureElection(freedom_degree=0.5, fs_method="lasso")
    splits = fe.prepare_data_splits(df, "target", num_clients=2)
    ballots = []
    for i, (Xc, yc) in enumerate(splits):
        Xt, _, yt, _ = train_test_split(Xc.values, yc.values, test_size=0.2, random_state=42 + i, stratify=yc.values)
        sel = make_selector(NVFLARE_LASSO).select(Xt, yt)
        ballots.append(Ballot.build(sel.mask, sel.scores, len(yt), list(df.columns[:20]), site=f"client_{i}"))
    return fe, splits, ballots


def test_flare_unit_test_fixture_keeps_13_and_18():
    fe, splits, ballots = flare_fixture_ballots()
    fe.simulate_election(splits)  # FLARE's own pipeline, executors and controller
    ours = elect_ballots(ballots, 0.5, compat="nvflare")
    np.testing.assert_array_equal(ours.mask, fe.global_mask)
    disputed_kept = {int(j) for j in np.flatnonzero(ours.mask & (ours.rank > 0))}
    assert disputed_kept == {13, 18}
    assert ours.stats["disputed"] == 3
    # 16 and 18 both vote 0 (each is its site's lowest selected score): FLARE breaks the tie
    # toward the higher index, fedtab's rule toward the lower one
    plain = elect_ballots(ballots, 0.5, normalization="selected")
    assert {int(j) for j in np.flatnonzero(plain.mask & (plain.rank > 0))} == {13, 16}


# ----------------------------------------------------------------------------- FLASH, Flower


@pytest.mark.parametrize("compat", ["flash", "flower"])
def test_flash_and_flower_profiles_equal_the_reference_restatements(compat):
    reference = flash_reference if compat == "flash" else flower_reference
    rng = np.random.default_rng(2)
    compared = mismatches = ties = 0
    for _ in range(1000):
        masks, scores, n = random_ballots(rng)
        ballots = as_ballots(masks, scores, n)
        for fd in PEER_FDS:
            for agg in AGGS:
                theirs = reference(masks, scores, n, fd, agg)
                ours = elect_ballots(ballots, fd, agg, compat=compat).mask
                compared += 1
                tied = tied_across_cut(masks, scores, n, fd, agg) if compat == "flower" else None
                if tied is not None:
                    ties += 1  # argpartition's pick among the tied is open: same count, same outside them
                    assert ours.sum() == theirs.sum()
                    np.testing.assert_array_equal(ours & ~tied, theirs & ~tied)
                    continue
                mismatches += not np.array_equal(theirs, ours)
    assert compared == 1000 * len(PEER_FDS) * 2
    assert mismatches == 0
    if compat == "flower":
        assert ties > 100


def test_flash_admits_every_tie_flower_exactly_k_nvflare_higher_index():
    masks = np.array([[1, 1, 1, 0], [1, 0, 0, 1]], dtype=bool)
    scores = np.array([[3.0, 1.0, 1.0, 0.0], [3.0, 0.0, 0.0, 1.0]])
    n = [10, 10]  # disputed 1, 2, 3 all vote 0 -> k = ceil(0.5 · 3) = 2
    assert elect(masks, scores, n, 0.5, compat="flash").mask.tolist() == [True, True, True, True]
    assert elect(masks, scores, n, 0.5, compat="flower").mask.tolist() == [True, True, True, False]
    assert elect(masks, scores, n, 0.5, compat="nvflare").mask.tolist() == [True, False, True, True]
    assert elect(masks, scores, n, 0.5).mask.sum() == 3


def test_nvflare_drops_all_false_sites_flash_does_not():
    masks = np.array([[1, 1, 0], [1, 0, 1], [0, 0, 0]], dtype=bool)
    scores = np.array([[2.0, 1.0, 0.0], [2.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    r = elect(masks, scores, [5, 5, 100], 0.0, compat="nvflare", site_names=["a", "b", "empty"])
    assert r.mask.tolist() == [True, False, False] and r.dropped_sites == ("empty",)
    assert r.stats["sites"] == 2 and r.stats["dropped_sites"] == 1
    assert r.to_dict()["dropped_sites"] == ["empty"]
    assert elect(masks, scores, [5, 5, 100], 0.0, compat="flash").mask.tolist() == [False, False, False]
    everyone_empty = elect(np.zeros((2, 3), bool), np.ones((2, 3)), [1, 1], 0.5, compat="nvflare")
    assert not everyone_empty.mask.any() and everyone_empty.dropped_sites == ("site-1", "site-2")


def test_nvflare_cut_offs_and_its_ceil():
    masks = np.zeros((2, 26), dtype=bool)
    masks[0, 0] = masks[1, 0] = True
    masks[0, 1:26] = True  # 25 disputed
    scores = np.tile(np.arange(26.0), (2, 1))
    for fd, kept in [(0.01, 1), (0.0100001, 2), (0.9899999, 26), (0.99, 26)]:
        assert elect(masks, scores, [1, 1], fd, compat="nvflare").mask.sum() == kept
    # np.ceil(25 · 0.28) = 8 (25 · 0.28 = 7.000000000000001); fedtab's ceil admits 7
    assert elect(masks, scores, [1, 1], 0.28, compat="nvflare").mask.sum() == 1 + 8
    assert elect(masks, scores, [1, 1], 0.28).mask.sum() == 1 + 7
    r = elect(masks, scores, [1, 1], 0.005, compat="nvflare")
    assert r.reasons[1] == "outside the intersection (no vote at this freedom degree)"
    assert elect(masks, scores, [1, 1], 0.995, compat="nvflare").reasons[1] == \
        "in the union (no vote at this freedom degree)"


def test_signed_scores_are_not_made_absolute():
    masks = np.array([[1, 1, 1, 0], [1, 0, 0, 1]], dtype=bool)
    scores = np.array([[0.0, -5.0, 1.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
    # signed: -5 is site 0's lowest selected score -> feature 1 votes 0 and loses (k = 2 of 3);
    # fedtab's rule takes |score|, so feature 1 is site 0's strongest and wins
    for compat in ("nvflare", "flash", "flower"):
        assert elect(masks, scores, [1, 1], 0.34, compat=compat).mask.tolist() == [True, False, True, True]
    assert elect(masks, scores, [1, 1], 0.34).mask.tolist() == [True, True, False, True]


def test_constant_scores_half_for_flare_one_for_the_others():
    masks = np.array([[1, 1, 0], [1, 0, 1]], dtype=bool)
    scores = np.array([[4.0, 4.0, 0.0], [1.0, 0.0, 2.0]])
    assert elect(masks, scores, [1, 1], 0.5, compat="nvflare").votes[1] == 0.25  # 0.5 · 1/2
    assert elect(masks, scores, [1, 1], 0.5, compat="flash").votes[1] == 0.5  # 1.0 · 1/2
    assert elect(masks, scores, [1, 1], 0.5, compat="flower", aggregation="uniform").votes[1] == 1.0


def test_streaming_tally_and_named_ballots_equal_batch():
    rng = np.random.default_rng(5)
    for _ in range(30):
        masks, scores, n = random_ballots(rng)
        d = masks.shape[1]
        names = [f"c{j}" for j in range(d)]
        for compat in ("nvflare", "flash", "flower"):
            batch = elect(masks, scores, n, 0.4, compat=compat)
            tally = ElectionTally(feature_names=names, compat=compat)
            for i in range(len(n)):
                perm = rng.permutation(d)  # each site sends its columns in its own order
                tally.add(masks[i][perm], scores[i][perm], n[i], feature_names=[names[j] for j in perm])
            streamed = tally.result(0.4)
            np.testing.assert_array_equal(batch.mask, streamed.mask)
            np.testing.assert_array_equal(batch.votes, tally.votes())
            assert streamed.compat == compat and list(streamed.feature_names) == names


def test_bad_profile_arguments_raise():
    masks, scores = np.ones((2, 3), bool), np.ones((2, 3))
    with pytest.raises(ValueError, match="unknown compat profile 'flare'"):
        elect(masks, scores, [1, 1], 0.5, compat="flare")
    with pytest.raises(ValueError, match="fixes the normalisation"):
        elect(masks, scores, [1, 1], 0.5, compat="nvflare", normalization="selected")
    a = Ballot.build([1, 0], [1.0, 0.0], 3, ["x", "y"], site="a")
    b = Ballot.build([1], [1.0], 3, ["x"], site="short")
    with pytest.raises(ValueError, match="site 'short'.*every feature.*'y'"):
        elect_ballots([a, b], 0.5, compat="flash")
    assert elect_ballots([a, b], 0.5).mask.tolist() == [True, False]  # fedtab's rule lets sites abstain


def test_default_rule_is_unchanged_by_the_option():
    rng = np.random.default_rng(9)
    for _ in range(50):
        masks, scores, n = random_ballots(rng)
        a = elect(masks, scores, n, 0.5)
        b = elect(masks, scores, n, 0.5, compat=None)
        np.testing.assert_array_equal(a.mask, b.mask)
        np.testing.assert_array_equal(a.votes, b.votes)
        assert a.compat is None and "compat" not in a.to_dict()


# ----------------------------------------------------------------------------- workflow, engines, CLI


def _two_sites():
    from tests.builders import classification_parts

    return classification_parts(300, 12, 3, 2, [0.5, 0.5], seed=4, split_seed=0)[1]


def test_workflow_and_pipeline_elect_with_the_profile():
    from fedtab import LocalFederation, Site, run_election
    from fedtab.engines.pipeline import PipelineConfig, run_pipeline

    parts = _two_sites()
    sites = [Site(f"s{i}", t, "target", selector="anova") for i, t in enumerate(parts)]
    fed = LocalFederation(sites)
    outcome = run_election(fed, 0.28, compat="nvflare")
    assert outcome.result.compat == "nvflare"
    expected = elect_ballots(outcome.ballots, 0.28, compat="nvflare")
    np.testing.assert_array_equal(outcome.result.mask, expected.mask)
    summary = run_pipeline(fed, {"steps": "election", "freedom-degree": 0.28, "compat": "nvflare"})
    assert summary["election"]["compat"] == "nvflare"
    assert summary["election"]["mask"] == expected.mask.tolist()
    assert PipelineConfig.from_mapping({"compat": ""}).compat is None  # a TOML run config cannot hold None
    with pytest.raises(ValueError, match="unknown compat profile"):
        PipelineConfig.from_mapping({"compat": "flare"})


def test_cli_compat_option(tmp_path):
    import json

    from typer.testing import CliRunner

    from fedtab.cli import app

    files = []
    for i, t in enumerate(_two_sites()):
        files.append(tmp_path / f"site{i}.csv")
        t.to_csv(files[-1], index=False)
    args = ["elect", *map(str, files), "--target", "target", "-s", "anova", "--no-train"]
    res = CliRunner().invoke(app, [*args, "--compat", "flash", "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    assert doc["compat"] == "flash" and "compat=flash" in res.output
    bad = CliRunner().invoke(app, [*args, "--compat", "flare"])
    assert bad.exit_code == 2 and "unknown compat profile 'flare'" in bad.output
    both = CliRunner().invoke(app, [*args, "--compat", "nvflare", "--normalization", "selected"])
    assert both.exit_code == 2 and "fixes the normalisation" in both.output
