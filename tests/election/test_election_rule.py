import math

import numpy as np
import pytest

from fedtab.election import Ballot, ElectionTally, elect, elect_ballots


def worked_example():
    # normalised scores are given; a 5th feature selected by nobody with score 0 pins the min,
    # and f1 (consensus) with score 1 pins the max, so min-max leaves f2..f4 as stated.
    masks = np.array(
        [[1, 1, 0, 0, 0],
         [1, 1, 1, 0, 0],
         [1, 0, 1, 1, 0]], dtype=bool)
    scores = np.array(
        [[1.0, 0.9, 0.2, 0.1, 0.0],
         [1.0, 0.6, 0.8, 0.2, 0.0],
         [1.0, 0.3, 0.6, 0.4, 0.0]])
    return masks, scores, [50, 30, 20]


def test_worked_example():
    masks, scores, n = worked_example()
    r = elect(masks, scores, n, 0.4)
    np.testing.assert_allclose(r.votes[1:4], [0.69, 0.46, 0.19])
    assert r.mask.tolist() == [True, True, True, False, False]
    assert r.stats == {"sites": 3, "features": 5, "intersection": 1, "union": 4, "disputed": 3, "kept": 3}
    assert r.reasons[0] == "consensus"
    assert r.reasons[1] == "won the vote at rank 1"
    assert r.reasons[2] == "won the vote at rank 2"
    assert r.reasons[3] == "lost the vote at rank 3"
    assert r.reasons[4] == "selected by no site"
    table = r.explain()
    assert list(table["kept"]) == r.mask.tolist() and table.loc[2, "rank"] == 2


def test_uniform_aggregation_changes_weights():
    masks, scores, n = worked_example()
    r = elect(masks, scores, n, 0.4, aggregation="uniform")
    np.testing.assert_allclose(r.votes[1:4], [0.6, 1.6 / 3, 0.7 / 3])


def random_ballots(k=5, d=60, seed=0):
    rng = np.random.default_rng(seed)
    masks = rng.random((k, d)) < 0.4
    masks[:, :3] = True  # some consensus
    scores = rng.normal(size=(k, d))
    n = rng.integers(10, 500, size=k)
    return masks, scores, n


def test_boundaries_give_intersection_and_union():
    masks, scores, n = random_ballots()
    r0 = elect(masks, scores, n, 0.0)
    r1 = elect(masks, scores, n, 1.0)
    np.testing.assert_array_equal(r0.mask, masks.all(axis=0))
    np.testing.assert_array_equal(r1.mask, masks.any(axis=0))


def test_masks_nested_as_fd_grows_and_count_is_ceil():
    masks, scores, n = random_ballots(seed=1)
    prev = None
    for fd in np.linspace(0, 1, 21):
        r = elect(masks, scores, n, float(fd))
        disputed = r.stats["disputed"]
        assert r.stats["kept"] == r.stats["intersection"] + math.ceil(round(fd * disputed, 9))
        if prev is not None:
            assert np.all(r.mask >= prev), f"mask at fd={fd} dropped a feature kept before"
        prev = r.mask


def test_fd_float_noise_does_not_add_a_feature():
    # 0.3 * 10 == 3.0000000000000004 must admit 3, not 4
    masks = np.zeros((2, 10), dtype=bool)
    masks[0] = True
    r = elect(masks, np.arange(20.0).reshape(2, 10), [1, 1], 0.3)
    assert r.stats["disputed"] == 10 and r.stats["kept"] == 3


def test_ties_broken_by_lower_index():
    masks = np.array([[1, 1, 1, 1], [0, 0, 0, 0]], dtype=bool)
    scores = np.array([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    r = elect(masks, scores, [1, 1], 0.5)  # disputed = 4, admit 2 of the three tied at the top
    assert r.mask.tolist() == [True, True, False, False]


def test_scores_use_absolute_values():
    masks = np.array([[1, 1, 0], [0, 0, 1]], dtype=bool)
    r_neg = elect(masks, np.array([[-5.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), [1, 1], 1 / 3)
    assert r_neg.mask.tolist() == [True, False, False]


def test_constant_site_contributes_zero():
    masks = np.array([[1, 0, 0], [0, 1, 0]], dtype=bool)
    r = elect(masks, np.array([[2.0, 2.0, 2.0], [0.0, 1.0, 0.5]]), [1, 1], 0.5)
    np.testing.assert_allclose(r.votes, [0.0, 0.5, 0.25])


def test_tally_equals_batch():
    masks, scores, n = random_ballots(k=7, d=200, seed=3)
    tally = ElectionTally(200)
    for m, s, k in zip(masks, scores, n):
        tally.add(m, s, k)
    for fd in (0.0, 0.3, 0.77, 1.0):
        for agg in ("weighted", "uniform"):
            a = elect(masks, scores, n, fd, agg)
            b = tally.result(fd, agg)
            np.testing.assert_array_equal(a.mask, b.mask)
            np.testing.assert_allclose(a.votes, b.votes)


def test_tally_memory_does_not_hold_ballots():
    tally = ElectionTally(50)
    rng = np.random.default_rng(0)
    for _ in range(200):
        tally.add(rng.random(50) < 0.5, rng.random(50), 10)
    arrays = [v for v in vars(tally).values() if isinstance(v, np.ndarray)]
    assert sum(a.size for a in arrays) <= 9 * 50  # nine running sums of length d, whatever K


def test_vote_equals_plain_formula_with_identical_columns():
    masks, scores, n = random_ballots(k=4, d=30, seed=5)
    a = np.abs(scores)
    lo, hi = a.min(axis=1, keepdims=True), a.max(axis=1, keepdims=True)
    norm = (a - lo) / (hi - lo)
    w = n / n.sum()
    np.testing.assert_allclose(elect(masks, scores, n, 0.5).votes, w @ norm)


def test_named_ballots_align_and_abstain():
    # site B lacks feature "c": it abstains there.
    a = Ballot.build([1, 1, 0], [3.0, 2.0, 1.0], 100, ["a", "b", "c"], site="A")
    b = Ballot.build([1, 0], [1.0, 0.0], 300, ["b", "a"], site="B")
    r = elect_ballots([a, b], 1.0)
    assert list(r.feature_names) == ["a", "b", "c"]
    assert r.held_by.tolist() == [2, 2, 1]
    assert r.selected_by.tolist() == [1, 2, 0]
    # intersection test only over holders: "b" selected by both holders → consensus
    assert r.reasons[1] == "consensus"
    # vote of "a": A's norm 1.0 (weight 100), B's norm 0.0 (weight 300) → 0.25
    np.testing.assert_allclose(r.votes[0], 0.25)
    # "c" is held only by A, norm 0, and A did not select it
    assert r.reasons[2] == "selected by no site"


def test_named_ballots_reduce_to_positional_rule():
    masks, scores, n = random_ballots(k=3, d=12, seed=7)
    names = [f"x{i}" for i in range(12)]
    rng = np.random.default_rng(0)
    ballots = []
    for i, (m, s, k) in enumerate(zip(masks, scores, n)):
        perm = rng.permutation(12)  # each site lists its columns in its own order
        ballots.append(Ballot.build(m[perm], s[perm], k, [names[j] for j in perm], site=f"s{i}"))
    r = elect_ballots(ballots, 0.5, feature_names=names)
    ref = elect(masks, scores, n, 0.5)
    np.testing.assert_array_equal(r.mask, ref.mask)
    np.testing.assert_allclose(r.votes, ref.votes)


def test_abstention_renormalises_weights():
    a = Ballot.build([1, 0], [1.0, 0.0], 10, ["x", "y"], site="A")
    b = Ballot.build([1, 1, 0], [0.0, 1.0, 0.5], 30, ["x", "y", "z"], site="B")
    r = elect_ballots([a, b], 0.5)
    # "z" held only by B: its vote is B's norm alone (0.5), not 0.75·0.5
    np.testing.assert_allclose(r.votes[2], 0.5)


def test_selected_normalization_matches_flare_variant():
    masks = np.array([[1, 1, 0, 0], [0, 1, 1, 0]], dtype=bool)
    scores = np.array([[4.0, 2.0, 9.0, 1.0], [3.0, 3.0, 3.0, 0.0]])
    r = elect(masks, scores, [1, 1], 0.5, normalization="selected")
    # site 1: over selected {4, 2} → [1, 0, 0, 0]; site 2: constant selected → 0.5 on them
    np.testing.assert_allclose(r.votes, [0.5, 0.25, 0.25, 0.0])


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"freedom_degree": 1.5}, "freedom_degree"),
        ({"freedom_degree": -0.1}, "freedom_degree"),
        ({"freedom_degree": float("nan")}, "freedom_degree"),
        ({"aggregation": "median"}, "aggregation"),
        ({"normalization": "zscore"}, "normalization"),
        ({"n_samples": [10, 0]}, "site 'site-2': n_samples"),
        ({"n_samples": [10, 2.5]}, "site 'site-2': n_samples"),
        ({"n_samples": [10, True]}, "site 'site-2': n_samples"),
        ({"n_samples": [10]}, "one of each per site"),
        ({"scores": np.array([[1.0, 2.0], [np.nan, 1.0]])}, "site 'site-2': 1 score(s) are not finite"),
        ({"scores": [[1.0, 2.0], [1.0]]}, "site 'site-2': mask has 2 entries but scores have 1"),
        ({"masks": [[True, False], [True, False, True]], "scores": [[1.0, 2.0], [1.0, 2.0, 3.0]]},
         "site 'site-2': ballot covers 3 features"),
        ({"masks": [[2, 0], [1, 0]]}, "site 'site-1': mask must be boolean"),
        ({"masks": np.ones((2, 2, 2))}, "2-D"),
    ],
)
def test_bad_input_raises_value_error_naming_the_problem(kwargs, fragment):
    args = {"masks": [[True, False], [True, True]], "scores": [[1.0, 2.0], [3.0, 4.0]], "n_samples": [10, 20],
            "freedom_degree": 0.5}
    args.update(kwargs)
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        elect(**args)


def test_no_ballots():
    with pytest.raises(ValueError, match="no ballots"):
        elect([], [], [], 0.5)
    with pytest.raises(ValueError, match="no ballots"):
        ElectionTally(3).result(0.5)
    with pytest.raises(ValueError, match="no ballots"):
        elect_ballots([], 0.5)


def test_invalid_ballot_leaves_tally_unchanged():
    tally = ElectionTally(3)
    tally.add([1, 0, 1], [1.0, 2.0, 3.0], 5)
    with pytest.raises(ValueError, match="site 'bad'"):
        tally.add([1, 0, 1], [1.0, np.inf, 3.0], 5, site="bad")
    assert tally.n_sites == 1 and tally.held_by.tolist() == [1, 1, 1]


def test_named_ballot_outside_fixed_schema():
    tally = ElectionTally(feature_names=["a", "b"])
    with pytest.raises(ValueError, match="site 'X': features \\['z'\\] are not in the election's schema"):
        tally.add([1], [1.0], 3, feature_names=["z"], site="X")
