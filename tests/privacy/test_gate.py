"""The release gate's meta checks are a table (fedtab.privacy.gate._META_CHECKS): one check per
declared kind; a hostile or careless handler's meta value that does not fit its kind never leaves."""

from __future__ import annotations

import math
import re

import pytest

from fedtab.privacy.gate import (CATEGORIES, COUNT, FLAG, LABELS, NAMES, NUMBER, STRUCT, TEXT, GateError, Vocabulary,
                                 _check_meta, _META_CHECKS)
from fedtab.privacy.policy import OTHER_CATEGORY

COUNTS = {("color", "red"): 50, ("color", "mauve"): 2}


def _vocab() -> Vocabulary:
    return Vocabulary(columns=lambda: ["age", "color"], labels=lambda: ["0", "1"],
                      category_count=lambda c, v: COUNTS.get((c, v), 0), extra=frozenset({"site-a"}))


@pytest.mark.parametrize("kind, value", [
    (COUNT, 0), (COUNT, 7), (FLAG, False), (NUMBER, 1.5), (NUMBER, None), (TEXT, "ok"), (NAMES, ["age", "site-a"]),
    (LABELS, ["1"]), (CATEGORIES, {"color": ["red", OTHER_CATEGORY]}), (STRUCT, {"anything": [1, 2]}),
    ({"n": COUNT, "ok": FLAG}, {"n": 3}),
])
def test_values_of_their_kind_pass(kind, value):
    _check_meta("m", kind, value, _vocab(), min_rows=10)


@pytest.mark.parametrize("kind, value, why", [
    (COUNT, -1, "is not a count"), (COUNT, True, "is not a count"), (COUNT, 2.0, "is not a count"),
    (FLAG, 1, "is not true/false"),
    (NUMBER, math.inf, "is not a finite number"), (NUMBER, "3", "is not a finite number"),
    (TEXT, "x" * 301, "is not a text of at most 300 characters"),
    (NAMES, ["age", "salary"], "holds 1 name(s) that are not columns"), (NAMES, "age", "is not a list of names"),
    (LABELS, ["2"], "is not one of the site's class labels"), (LABELS, [1], "is not a list of class labels"),
    (CATEGORIES, {"color": "red"}, "is not {column: [categories]}"),
    (CATEGORIES, {"secret": ["red"]}, "names a column that is not one of the site's"),
    (CATEGORIES, {"color": [3]}, "holds a category that is not a string"),
    (CATEGORIES, {"color": ["mauve"]}, "seen in fewer than min_rows=10 rows"),  # a rare cell never leaves
    ({"n": COUNT}, {"n": 1, "leak": "row 7"}, "is not an object of the declared keys"),
    ({"n": COUNT}, {"n": -3}, "meta 'm.n' is not a count"),
])
def test_values_that_do_not_fit_their_kind_are_refused_naming_the_key(kind, value, why):
    with pytest.raises(GateError, match=re.escape(why)) as err:
        _check_meta("m", kind, value, _vocab(), min_rows=10)
    assert str(err.value).startswith("release gate: meta 'm")


def test_every_kind_has_a_check():
    assert set(_META_CHECKS) == {COUNT, NAMES, LABELS, FLAG, NUMBER, TEXT, CATEGORIES, STRUCT}
