"""``class_moments`` over parts that include the test rows (issue 28 item 8 follow-up): the test
rows keep the model file's categories, so an indicator of a category this site holds in fewer
than ``min_rows`` rows can have 1..min_rows-1 ones there. A curious server asks the moments on
``test`` and ``all`` and differences them against ``train``; no class's sum of an indicator
may count fewer than ``min_rows`` rows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedtab.federation import Message, Site
from fedtab.federation.workflows.pooled_anova.site import class_moments, suppress_rare_ones_per_class
from fedtab.privacy import DisclosurePolicy

MIN_ROWS = 10


def _table(n: int = 400) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 2))
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "rare": 0.0, "common": 0.0, "y": (x[:, 0] > 0).astype(int)})


def _site(table: pd.DataFrame) -> Site:
    return Site("s", table, "y", policy=DisclosurePolicy(min_rows=MIN_ROWS), seed=3)


def _sites_with_indicators():
    """A site whose ``rare`` indicator is 1 on 3 test rows of class 1 (and nowhere else) and whose
    ``common`` indicator is 1 on 15 test rows of class 1 (above the floor: released exactly)."""
    table = _table()
    base = _site(table)
    test = base.parts.indices("test")
    positives = [i for i in test if table["y"].iloc[i] == 1]
    assert len(positives) >= 15
    table.loc[table.index[positives[:3]], "rare"] = 1.0
    table.loc[table.index[positives[:15]], "common"] = 1.0
    site = _site(table)
    assert np.array_equal(site.parts.indices("test"), test)  # the parts do not depend on the columns
    return site, table


def _ask(site: Site, part: str) -> Message:
    reply = site.handle(Message("class_moments", meta={"part": part}))
    assert not reply.is_refusal, reply.meta
    return reply


def _cell(reply: Message, array: str, column: str, label: str) -> float:
    row = reply.meta["classes"].index(label)
    return float(reply.arrays[array][row, reply.meta["feature_names"].index(column)])


def test_a_rare_indicator_on_the_test_rows_is_not_counted_by_any_part_or_difference():
    site, _ = _sites_with_indicators()
    replies = {p: _ask(site, p) for p in ("train", "test", "all")}
    labels = replies["all"].meta["classes"]
    for label in labels:
        seen = {p: _cell(r, "sum", "rare", label) for p, r in replies.items()}
        # each release, and the curious server's difference all - train (= the test rows), counts
        # 0 or at least min_rows rows holding the rare category
        for value in (*seen.values(), seen["all"] - seen["train"]):
            assert value == 0 or value >= MIN_ROWS, (label, seen)
    for p in ("test", "all"):  # class 1's cell is withheld whole: its observed count goes with the sum
        assert _cell(replies[p], "count", "rare", "1") == 0 and _cell(replies[p], "sumsq", "rare", "1") == 0


def test_a_frequent_indicator_and_the_numeric_columns_are_released_exactly():
    site, table = _sites_with_indicators()
    test = _ask(site, "test")
    # 15 ones among the test rows of class 1: above the floor, so released exactly (the suppression
    # is not a blanket zeroing that would also pass the test above)
    assert _cell(test, "sum", "common", "1") == 15
    rows = table.iloc[site.parts.indices("test")]
    ones = rows[rows["y"] == 1]
    assert np.isclose(_cell(test, "sum", "a", "1"), ones["a"].sum())
    assert _cell(test, "count", "a", "1") == len(ones)


def test_the_training_part_is_released_as_before():
    # the training rows merge categories below the floor at encoding, so only parts with test rows
    # are filtered: a 0/1 column with few ones on the training rows is a column of the site's own table
    table = _table()
    site = _site(table)
    train = site.parts.indices("train")
    table.loc[table.index[train[:2]], "rare"] = 1.0
    site = _site(table)
    reply = _ask(site, "train")
    assert sum(_cell(reply, "sum", "rare", c) for c in reply.meta["classes"]) == 2


def test_suppression_per_class_zeroes_only_small_indicator_cells():
    X = np.array([[1, 0.5], [1, 1.5], [0, 2.0], [1, 0.1], [0, np.nan]], dtype=float)
    labels = ["a", "a", "a", "b", "b"]
    moments = class_moments(X, labels)
    out = suppress_rare_ones_per_class(moments, X, labels, min_rows=2)
    # column 0 is 0/1: class a holds 2 ones (kept), class b 1 (zeroed); column 1 is not 0/1 (kept)
    assert out["sum"][0, 0] == 2 and out["count"][0, 0] == 3
    assert out["sum"][1, 0] == 0 and out["count"][1, 0] == 0 and out["sumsq"][1, 0] == 0
    assert np.array_equal(out["sum"][:, 1], moments["sum"][:, 1])
    assert moments["sum"][1, 0] == 1  # the input is not modified
