"""A curious server against the GBDT messages (issue 28): split and bin-edge differencing,
dummy classes, threshold sweeps, replays, a hostile site's poison and DP regression labels.

Each test asserts that nothing computed over fewer than ``min_rows`` of a site's rows comes
back: a default site refuses plain answers over the server's tree nodes (nothing released),
answers them inside a secure sum (only pooled sums), and keeps its grid, class and threshold
rules whatever the server sends."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.engines.local import LocalFederation
from fedtab.federation.workflows.gbdt import run_gbdt
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import FederationError, SiteRefused, set_options
from fedtab.federation.site.core import Site
from fedtab.learn.gbdt import BinLayout, GBDTParams
from fedtab.learn.gbdt.grid import public_grid
from tests.builders import classification_parts, gbdt_parts, make_sites

FAST = {"n_trees": 3, "max_depth": 3, "max_bins": 32}
FEATS = ["f0", "f1", "f2"]


def _table() -> pd.DataFrame:
    _, parts = classification_parts(300, 3, 2, 0, (1.0,), seed=11)
    return parts[0]


def _start(site: Site, edges: list, classes=("0", "1"), params=None, **meta) -> Message:
    return site.handle(Message("gbdt_start", BinLayout(edges).to_arrays(),
                               {"features": FEATS, "part": "train", "classes": list(classes),
                                "params": params or GBDTParams().to_dict(), **meta}))


def _level(site: Site, nodes, round_=0, level=0, **arrays) -> Message:
    return site.handle(Message("gbdt_level", {"nodes": np.asarray(nodes, np.int32).reshape(-1, 2), **arrays},
                               {"round": round_, "level": level}))


def _around(x: float) -> np.ndarray:
    """Two float32 edges bracketing one value: a bin that holds that row alone."""
    v = np.float32(x)
    return np.array([np.nextafter(v, np.float32(-np.inf)), np.nextafter(v, np.float32(np.inf))], np.float32)


# ----------------------------------------------------------------------------- split / bin-edge differencing
#: the policy of a site that opted in to plain answers over server-chosen row sets
OPT_IN = {"allow_server_row_sets": True}


def _secure_start_check(site: Site, edges: list, policy=None, **meta) -> str | None:
    """The policy check (``policy``, default the site's) of a ``gbdt_start`` of a secure run at
    ``site``: the request's secure-aggregation meta is what the check sees (the gate verifies
    its peers before it, tested elsewhere). A default site refuses a plain start outright."""
    from fedtab.privacy.policy import _gbdt_start
    from fedtab.privacy.secagg import SECAGG_META

    request = Message("gbdt_start", BinLayout(edges).to_arrays(),
                      {"features": FEATS, "part": "train", "classes": ["0", "1"], "params": GBDTParams().to_dict(),
                       SECAGG_META: {}, **meta})
    return _gbdt_start(policy or site.policy, site, request)


def test_split_and_bin_edge_differencing_against_a_default_site_is_refused():
    """The probe: a crafted grid isolating one row, then the root's histogram. A default site
    (min_rows 10, no opt-in) refuses the plain start already (it would refuse every level of the
    run), the level too: no histogram, no count, nothing to difference; in a secure run it
    refuses the crafted grid (an edge from no public bounds and no sketch grid)."""
    table = _table()
    site = Site("s", table, "target")
    x0 = np.sort(site.rows("train")["f0"].to_numpy())
    crafted = [_around(x0[150]), np.array([0.0], np.float32), np.array([0.0], np.float32)]
    start = _start(site, crafted)
    assert start.is_refusal and "allow_server_row_sets" in start.meta["reason"] and not start.arrays
    assert "gbdt" not in site.state
    assert "no public bounds and no sketch grid" in _secure_start_check(site, crafted)
    for nodes in ([[0, 0]], [[0, 1]]):
        reply = _level(site, nodes)
        assert reply.is_refusal and "allow_server_row_sets" in reply.meta["reason"]
        assert not reply.arrays
    # the validation loss of the server's trees is a release over its row sets too
    reply = site.handle(Message("gbdt_level", {"nodes": np.zeros((0, 2), np.int32)},
                                {"round": 0, "level": 0, "validate": True}))
    assert reply.is_refusal and not reply.arrays


class _Counting(LocalFederation):
    """The kinds of the requests the server sent (in order)."""

    def __init__(self, sites) -> None:
        super().__init__(sites)
        self.kinds: list[str] = []

    def ask(self, requests):
        self.kinds += [q.kind for q in requests.values()]
        return super().ask(requests)


@pytest.mark.parametrize("bounds", [None, {f: [-6.0, 6.0] for f in FEATS}], ids=["sketch", "public_bounds"])
def test_a_plain_run_on_sites_that_did_not_opt_in_fails_in_one_line_naming_the_setting(bounds):
    """A plain run under the default policy fails at its first summed exchange (the sketch, or the
    start when public bounds bin every column), before any histogram work: no site binned its rows,
    no level was sent, and the one line names the setting and the ways out."""
    fed = _Counting(make_sites(gbdt_parts(4)))
    with pytest.raises(SiteRefused) as info:
        run_gbdt(fed, FEATS, params=FAST, bounds=bounds)
    text = str(info.value)
    assert "\n" not in text and "allow_server_row_sets" in text and "secure aggregation" in text
    assert set(info.value.refusals) == {"s0", "s1", "s2"}
    assert all("allow_server_row_sets" in r for r in info.value.refusals.values())
    gbdt = list(dict.fromkeys(k for k in fed.kinds if k.startswith("gbdt_")))
    assert gbdt == (["gbdt_summary", "gbdt_sketch"] if bounds is None else ["gbdt_summary", "gbdt_start"])
    assert fed.kinds.count(gbdt[-1]) == 3  # the first stage of the sketch, or the start: once per site
    assert all("gbdt" not in fed.site(s).state for s in ("s0", "s1", "s2"))


def test_opted_in_and_secure_runs_still_grow_their_trees_past_the_start():
    """The early refusal is the plain run's only: a site that opted in, and a default site in a
    secure run, answer the sketch, the start and every level (the same trees both ways)."""
    parts = gbdt_parts(4)
    opted = _Counting(make_sites(parts, policy={"allow_server_row_sets": True}))
    plain = run_gbdt(opted, FEATS, params=FAST)
    secure = _Counting(make_sites(parts))
    set_options(secure, secure_aggregation=True)
    masked = run_gbdt(secure, FEATS, params=FAST)
    for fed in (opted, secure):
        assert {"gbdt_sketch", "gbdt_start", "gbdt_level", "gbdt_evaluate"} <= set(fed.kinds)
    A, B = plain.model.to_arrays(), masked.model.to_arrays()
    for k in A:
        np.testing.assert_array_equal(A[k], B[k], err_msg=k)


def test_the_same_probe_under_secure_aggregation_gives_only_pooled_sums_and_the_same_trees():
    """Default sites answer inside a secure sum: the server sees each level only summed over
    the three sites (no per-site count either), and the trees are those of a plain run whose
    sites opted in, bit for bit."""
    parts = gbdt_parts(4)
    seen: list[Message] = []

    class Recording(LocalFederation):
        def ask(self, requests, *args, **kwargs):
            replies = super().ask(requests, *args, **kwargs)
            seen.extend(r for r in replies.values() if r.kind == "gbdt_level")
            return replies

    secure_fed = Recording(make_sites(parts))
    set_options(secure_fed, secure_aggregation=True)
    secure = run_gbdt(secure_fed, None, params=FAST)
    plain = run_gbdt(LocalFederation(make_sites(parts, policy={"allow_server_row_sets": True})), None, params=FAST)
    A, B = secure.model.to_arrays(), plain.model.to_arrays()
    for k in A:
        np.testing.assert_array_equal(A[k], B[k], err_msg=k)
    assert seen and all("hist" not in r.arrays and "withheld" not in r.meta for r in seen)
    assert all(set(r.arrays) <= {"secagg:y", "secagg:shares", "secagg:share_hashes"} for r in seen)


# ----------------------------------------------------------------------------- the grid
@pytest.mark.parametrize("edges, match", [
    ([np.array([1.0, 0.0], np.float32)], "increase strictly"),
    ([np.array([0.0, np.inf], np.float32)], "non-finite"),
    ([np.arange(600, dtype=np.float32)], "more than the site's cap"),
])
def test_a_crafted_grid_is_refused(edges, match):
    site = Site("s", _table(), "target", policy={"allow_server_row_sets": True})
    arrays = {"edges": np.concatenate(edges + [np.zeros(1, np.float32)] * 2),
              "edge_ptr": np.array([0, edges[0].size, edges[0].size + 1, edges[0].size + 2])}
    reply = site.handle(Message("gbdt_start", arrays, {"features": FEATS, "part": "train", "classes": ["0", "1"],
                                                       "params": GBDTParams().to_dict()}))
    assert reply.is_refusal and match in reply.meta["reason"]
    assert "gbdt" not in site.state  # refused before the site binned anything


def test_a_threshold_sweep_over_many_runs_is_capped_per_feature_per_period():
    """Bin-edge differencing: the same row bracketed by edges moved a little in every run. The
    ledger counts the distinct edges each feature was binned at; past max_split_thresholds
    the site refuses the grid, and repeating an accepted grid costs nothing."""
    cap = 40
    site = Site("s", _table(), "target", policy={"allow_server_row_sets": True, "max_split_thresholds": cap})
    x0 = np.sort(site.rows("train")["f0"].to_numpy())
    other = [np.array([0.0], np.float32)] * 2
    accepted = set()
    for i in range(60):
        edges = _around(x0[100 + i])
        reply = _start(site, [edges, *other])
        if reply.is_refusal:
            assert "max_split_thresholds" in reply.meta["reason"]
            continue
        accepted.update(edges.tolist())
    assert len(accepted) <= cap  # at most cap distinct thresholds of f0 in the period
    assert 30 <= len(accepted)  # honest-looking runs went through until the cap
    assert _start(site, [_around(x0[100]), *other]).kind == "gbdt_start"  # a grid already counted: free


def test_under_dp_the_grid_must_be_the_public_equal_width_grid():
    site = Site("s", _table(), "target")
    params = GBDTParams(max_bins=8).to_dict()
    dp = {"z": 50.0, "bounds": [-5.0, 5.0], "clip": 1.0}
    crafted = _start(site, [_around(0.3), np.array([0.0], np.float32), np.array([0.0], np.float32)], params=params,
                     dp=dp)
    assert crafted.is_refusal and "public bounds" in crafted.meta["reason"]
    outside = _start(site, [np.array([7.0], np.float32)] * 3, params=params, dp={**dp, "bounds": None})
    assert outside.is_refusal
    public = public_grid([-5.0] * 3, [5.0] * 3, 8)
    ok = _start(site, public, params=params, dp=dp)
    assert ok.kind == "gbdt_start", ok.meta


# ----------------------------------------------------------------------------- dummy classes
@pytest.mark.parametrize("classes", [["0", "0"], ["a", "b", "c"], [0, 1]])
def test_class_lists_that_are_not_distinct_labels_or_hold_none_of_the_sites_are_refused(classes):
    site = Site("s", _table(), "target", policy={"allow_server_row_sets": True})
    params = GBDTParams(objective="multiclass", n_classes=len(classes)).to_dict()
    reply = _start(site, [np.array([0.0], np.float32)] * 3, classes=classes, params=params)
    assert reply.is_refusal and "class" in reply.meta["reason"]
    assert "gbdt" not in site.state


def test_dummy_classes_grow_no_more_trees_than_max_rounds():
    """K dummy classes would grow K trees per charged round, each splitting where the server
    likes; every tree is charged as a round, so a binary site answers at most max_rounds
    trees whatever the class list (a class it does not hold is label skew, accepted)."""
    cap = 7
    classes = ["0", "1", *[f"dummy{i}" for i in range(4)]]  # 6 trees a round
    site = Site("s", _table(), "target", policy={"allow_server_row_sets": True, "max_rounds": cap})
    params = GBDTParams(objective="multiclass", n_classes=len(classes)).to_dict()
    assert _start(site, [np.array([0.0], np.float32)] * 3, classes=classes, params=params).kind == "gbdt_start"
    first = _level(site, [[k, 0] for k in range(len(classes))])
    assert not first.is_refusal
    second = _level(site, [[k, 0] for k in range(len(classes))], round_=1)
    assert second.is_refusal and "max_rounds" in second.meta["reason"]  # 6 + 6 trees > 7


# ----------------------------------------------------------------------------- replay
def test_a_replayed_closing_level_is_refused_before_it_applies_the_leaf_values():
    site = Site("s", _table(), "target", policy={"allow_server_row_sets": True})
    assert _start(site, [np.array([0.0], np.float32)] * 3).kind == "gbdt_start"
    assert _level(site, [[0, 0]]).kind == "gbdt_level"
    split = {"split:tree": np.array([0]), "split:node": np.array([0]), "split:feature": np.array([0]),
             "split:bin": np.array([0]), "split:default_left": np.array([False]),
             "split:left": np.array([1]), "split:right": np.array([2])}
    leaves = {"leaf:values": np.array([0.0, 0.3, -0.1], np.float32), "leaf:ptr": np.array([0, 3])}
    closing = Message("gbdt_level", {"nodes": np.zeros((0, 2), np.int32), **split, **leaves}, {"round": 1, "level": 0})
    assert site.handle(closing).kind == "gbdt_level"
    before = {k: np.array(v, copy=True) for k, v in site.state["gbdt"]["booster"].items() if isinstance(v, np.ndarray)}
    record = np.array(site.state["gbdt"]["grown"], copy=True)
    again = site.handle(closing)
    assert again.is_error and "another round" in again.meta["error"]
    after = site.state["gbdt"]["booster"]
    for k, v in before.items():
        np.testing.assert_array_equal(after[k], v, err_msg=k)  # margins, positions: unchanged
    np.testing.assert_array_equal(site.state["gbdt"]["grown"], record)
    assert int(site.state["gbdt"]["booster"]["round"]) == 1


# ----------------------------------------------------------------------------- poison
class _Poison(Site):
    """Adds 2**40 to every entry of its masked level vector (a hostile site inside a secure sum)."""

    kind = "gbdt_level"

    def handle(self, request: Message) -> Message:
        reply = super().handle(request)
        if request.kind == self.kind and "secagg:y" in reply.arrays:
            y = np.asarray(reply.arrays["secagg:y"], dtype=np.uint64) + np.uint64(2**40)
            return Message(reply.kind, {**reply.arrays, "secagg:y": y}, reply.meta)
        return reply


class _PoisonedSketch(_Poison):
    kind = "gbdt_sketch"


@pytest.mark.parametrize("poison", [_Poison, _PoisonedSketch], ids=["level", "sketch"])
def test_a_poisoned_secure_sum_is_a_federation_error_naming_the_summing_step(poison):
    parts = gbdt_parts(4)
    fed = LocalFederation([*make_sites(parts[:2]), poison("evil", parts[2], "target")])
    set_options(fed, secure_aggregation=True)
    with pytest.raises(FederationError, match=f"{poison.kind} step: the summed values are implausible"):
        run_gbdt(fed, None, params=FAST)


# ----------------------------------------------------------------------------- DP regression
def test_dp_regression_clips_the_labels_at_the_site():
    """With clip = 1e-9 the released Σy holds at most n·1e-9 of the labels (before: Σy exactly)."""
    table = _table().assign(target=lambda t: 1000.0 + t["f0"])
    site = Site("s", table, "target")
    n = site.n_rows("train")
    params = GBDTParams(objective="regression", max_bins=8).to_dict()
    dp = {"z": 1.0, "bounds": [-5.0, 5.0], "clip": 1e-9}
    reply = site.handle(Message("gbdt_start", BinLayout(public_grid([-5.0] * 3, [5.0] * 3, 8)).to_arrays(),
                                {"features": FEATS, "part": "train", "params": params, "dp": dp}))
    assert reply.kind == "gbdt_start", reply.meta
    s = reply.arrays["label_sums"]
    true_sum = float(site.rows("train")["target"].sum())
    assert true_sum > 1000 * n * 0.9
    assert abs(s[0]) < 50  # the noise (z ≥ 1 at sensitivity ~1), never ~1000 per row


# ----------------------------------------------------------------------------- the bin sketch
def _sketch(site: Site, stage: str = "fine", **meta) -> Message:
    return site.handle(Message("gbdt_sketch", meta={"features": FEATS, "stage": stage, **meta}))


def _grid(lo: float, hi: float) -> dict:
    return {"lo": [lo] * len(FEATS), "hi": [hi] * len(FEATS)}


def test_a_second_fine_grid_in_the_period_is_refused_also_after_a_restart(tmp_path):
    """The probe: counts of one column over two fine grids whose edges interleave (8/1024 and
    12/1024 steps): the rows below an edge of one grid minus those below a nearby edge of the
    other would count a row or two. The site answers the first grid, the same grid again (the
    same counts), and refuses any other grid for that column in the period, also after a
    restart on its state folder (a site that opted in: a default one answers the sketch of a secure
    run only, under the same rule)."""
    table = _table()
    site = Site("s", table, "target", state_dir=tmp_path, policy=OPT_IN)
    assert _sketch(site, "range").kind == "gbdt_sketch"
    first = _sketch(site, **_grid(-4.0, 4.0))
    assert first.kind == "gbdt_sketch", first.meta
    again = _sketch(site, **_grid(-4.0, 4.0))
    np.testing.assert_array_equal(again.arrays["counts"], first.arrays["counts"])
    for lo, hi in ((-4.0, 8.0), (-8.0, 4.0), (0.0, 4.0)):
        other = _sketch(site, **_grid(lo, hi))
        assert other.is_refusal and "another fine grid" in other.meta["reason"] and not other.arrays
    restarted = Site("s", table, "target", state_dir=tmp_path, policy=OPT_IN)
    assert _sketch(restarted, **_grid(-4.0, 8.0)).is_refusal
    # an end that is not a point of the public range grid (between two rows) is refused outright
    fresh = Site("t", table, "target", policy=OPT_IN)
    x0 = np.sort(fresh.rows("train")["f0"].to_numpy())
    off = _sketch(fresh, lo=[float((x0[100] + x0[101]) / 2)] * 3, hi=[4.0] * 3)
    assert off.is_refusal and "public range grid" in off.meta["reason"]


def test_a_fine_grid_count_release_in_plain_mode_has_no_bin_under_min_rows():
    """Whatever the request says (a floor of 1, the fit part): the site counts its training
    part in runs of >= its own min_rows (25) rows; the runs tile the line."""
    table = _table()
    site = Site("s", table, "target", policy={"min_rows": 25, **OPT_IN})
    reply = _sketch(site, min_rows=1, part="fit", **_grid(-4.0, 4.0))
    assert reply.kind == "gbdt_sketch", reply.meta
    counts = reply.arrays["counts"]
    n_train = site.n_rows("train")
    assert counts[counts > 0].min() >= 25
    np.testing.assert_allclose(counts.sum(axis=1), n_train)
    # what the server can difference: the rows below two released cuts differ by 0 or >= 25
    for row in counts:
        cum = np.unique(np.r_[0.0, np.cumsum(row)])
        assert np.diff(cum).min() >= 25


def test_start_edges_between_two_rows_are_refused_after_the_sketch():
    """The grid of the sketch is the only one a site bins at once it answered one (a site that
    opted in, and a default site in a secure run): edges that are points of it are accepted, an
    edge placed between two of the site's rows (the probe's grid, from an earlier release) is
    refused before anything is binned or charged."""
    from fedtab.privacy.policy import DisclosurePolicy

    table = _table()
    site = Site("s", table, "target", policy=OPT_IN)
    assert _sketch(site, "range").kind == "gbdt_sketch"
    assert _sketch(site, **_grid(-4.0, 4.0)).kind == "gbdt_sketch"
    from fedtab.learn.gbdt.sketch import fine_grid
    grid = fine_grid(-4.0, 4.0)
    x0 = np.sort(site.rows("train")["f0"].to_numpy())
    between = np.float32((x0[150] + x0[151]) / 2)
    assert between not in grid
    bad = _start(site, [np.array([between], np.float32), grid[500:501], grid[500:501]])
    assert bad.is_refusal and "not a point of the public grid" in bad.meta["reason"]
    assert "gbdt" not in site.state
    assert "not a point of the public grid" in _secure_start_check(
        site, [np.array([between], np.float32), grid[500:501], grid[500:501]], DisclosurePolicy())
    good = _start(site, [grid[[100, 500, 900]], grid[500:501], grid[500:501]])
    assert good.kind == "gbdt_start", good.meta


def test_public_bounds_bin_every_column_without_a_sketch():
    """With public bounds for every column, no sketch is asked: the edges are the equal-width
    grid of the bounds (no site data), and a default site checks they lie inside them."""
    parts = gbdt_parts(4)
    bounds = {f: [-6.0, 6.0] for f in ("f0", "f1", "f2", "f3", "f4", "f5")}
    fed = LocalFederation(make_sites(parts))
    set_options(fed, secure_aggregation=True)
    out = run_gbdt(fed, None, params=FAST, bounds=bounds)
    assert "gbdt_sketch" not in [e["step"] for e in out.exchanges]
    for f, e in zip(out.features, out.model.layout.edges):
        np.testing.assert_array_equal(e, public_grid([-6.0], [6.0], FAST["max_bins"])[0], err_msg=f)
    site = Site("s", _table(), "target")  # a default site, in a secure run
    outside = _secure_start_check(site, [np.array([7.0], np.float32)] * 3, bounds={f: [-6.0, 6.0] for f in FEATS})
    assert "outside the public bounds" in outside
