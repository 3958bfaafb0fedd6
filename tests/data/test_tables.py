"""Reading site tables: separator and decimal mark sniffed, huge or infinite cells refused, labels mapped."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedtab.data.tables import TableError, check_finite, map_labels, read_table, sniff_csv


@pytest.mark.parametrize("text, expected", [
    ("a,b,c\n1.5,2,x\n2,3,y\n", (",", ".")),
    ("a;b;c\n1,5;2;x\n2,25;3;y\n", (";", ",")),
    ("a;b\n1.5;2\n", (";", ".")),
    ("a\tb\n1,5\t2\n", ("\t", ",")),
    ("a|b\n1|2\n", ("|", ".")),
    ("single\n1\n2\n", (",", ".")),
    ('a,b\n"1,5",2\n', (",", ".")),  # a quoted comma in a comma file is not a decimal mark
])
def test_sniff_csv(text, expected):
    assert sniff_csv(text) == expected


def test_read_table_sniffs_or_takes_the_given_marks(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("a;b;c\n1,5;2;x\n2,25;3;y\n")
    t = read_table(p)
    assert t["a"].tolist() == [1.5, 2.25] and t["b"].dtype.kind == "i"
    assert read_table(p, sep=";", decimal=".")["a"].tolist() == ["1,5", "2,25"]  # as told
    (tmp_path / "t.tsv").write_text("a\tb\n1,5\t2\n")
    assert read_table(tmp_path / "t.tsv")["a"].tolist() == [1.5]


@pytest.mark.parametrize("value", [np.inf, -np.inf, 1e308, -2e100])
def test_check_finite_names_column_and_row_never_the_value(value):
    frame = pd.DataFrame({"ok": [1.0, 2.0, 3.0], "x": [0.0, np.nan, value]})
    with pytest.raises(TableError) as exc:
        check_finite(frame, "site.csv")
    assert "column x" in str(exc.value) and "row 3" in str(exc.value) and "1e" not in str(exc.value)
    check_finite(pd.DataFrame({"x": [1e99, np.nan], "t": ["a", "b"]}), "site.csv")  # large but fine


@pytest.mark.parametrize("block_cells", [4_000_000, 5, 1])
def test_check_finite_names_the_first_bad_column_in_table_order_whatever_the_blocks(monkeypatch, block_cells):
    import fedtab.data.tables as tables

    monkeypatch.setattr(tables, "CHECK_BLOCK_CELLS", block_cells)  # blocks of 1, 2 or all columns of 3 rows
    frame = pd.DataFrame({"t": ["a", "b", "c"], "flag": [True, False, True], "n": pd.array([1, None, 3], dtype="Int64"),
                          "a": [0.0, 1.0, 2.0], "late": [1.0, np.inf, -np.inf], "later": [np.inf, 0.0, 0.0]})
    with pytest.raises(TableError) as exc:
        check_finite(frame, "s.csv")
    assert "column late" in str(exc.value) and "row 2 (2 such cell(s))" in str(exc.value)
    check_finite(frame.drop(columns=["late", "later"]), "s.csv")  # text, bool, nullable ints: nothing to refuse
    check_finite(frame.iloc[:0], "s.csv")


def test_map_labels_maps_text_and_keeps_the_rest():
    frame = pd.DataFrame({"y": ["yes", "no", None, "yes"], "x": [1, 2, 3, 4]})
    out = map_labels(frame, "y", {"yes": 1, "no": 0})
    assert out["y"].tolist()[:2] == [1, 0] and pd.isna(out["y"][2]) and out["y"].dtype.kind == "f"
    assert map_labels(pd.DataFrame({"y": [1.0, 0.0]}), "y", {"1": "a", "0": "b"})["y"].tolist() == ["a", "b"]
    assert frame["y"].tolist()[0] == "yes"  # the input is not changed
