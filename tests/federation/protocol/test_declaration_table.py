"""A site's schema declaration is checked by a table of checks (fedtab.federation.protocol.schema.DECLARATION_CHECKS),
each refusal one line with the reason; a hostile site chooses every field."""

from __future__ import annotations

import re

import pytest

from fedtab.federation.protocol.schema import DECLARATION_CHECKS, SchemaLimits, parse_declaration

GOOD = {"columns": ["a", "b"], "target": "y", "classes": ["0", "1"],
        "rows": {"train": 8, "test": 2, "all": 10, "fold:0": 4, "fit:0": 4, "fold:1": 4, "fit:1": 4}}


def test_a_good_declaration_parses():
    d = parse_declaration(GOOD)
    assert d.columns == ("a", "b") and d.kinds == ("numeric", "numeric") and d.classes == ("0", "1")
    assert d.rows["fold:1"] == 4 and d.target == "y"
    assert len(DECLARATION_CHECKS) >= 10


@pytest.mark.parametrize("change, reason", [
    ({"columns": ["a", "a"]}, "declared columns has duplicate names ['a']"),
    ({"kinds": ["numeric"]}, "declared kinds must be one of"),
    ({"kinds": ["numeric", "text"]}, "declared kinds must be one of"),
    ({"target": ""}, "declared target must be a column name or null"),
    ({"target": "a"}, "declared target 'a' is also declared as a feature"),
    ({"rows": {"train": 8, "all": 10}}, "declared rows must give ['train', 'test', 'all']"),
    ({"rows": {**GOOD["rows"], "secret": 1}}, "declared rows name parts other than"),
    ({"rows": {"train": 8, "test": 2, "all": 10.5}}, "declared all rows must be a non-negative integer"),
    ({"rows": {"train": 8, "test": 3, "all": 10}}, "declared rows are inconsistent (train 8 + test 3 != all 10"),
    ({"rows": {"train": 0, "test": 0, "all": 0}}, "or no rows"),
    ({"rows": {"train": 8, "test": 2, "all": 10, "fold:1": 4, "fit:1": 4}}, "declared folds are inconsistent"),
    ({"rows": {"train": 8, "test": 2, "all": 10, "fold:0": 9, "fit:0": -1}}, "must be a non-negative integer"),
    ({"rows": {"train": 8, "test": 2, "all": 10, "fold:0": 5, "fit:0": 4}}, "declared folds are inconsistent"),
    ({"classes": [str(i) for i in range(11)]}, "declared classes must be a list no longer than the rows declared"),
    ({"classes": ["0", "0"]}, "declared classes has duplicate names"),
    ({"target": None}, "classes declared without a target"),
])
def test_each_check_of_the_table_refuses_with_its_reason(change, reason):
    with pytest.raises(ValueError, match=re.escape(reason)) as err:
        parse_declaration({**GOOD, **change}, SchemaLimits())
    assert "\n" not in str(err.value)
