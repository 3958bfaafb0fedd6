"""Reading site tables and aligning schemas by column name."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

__all__ = ["TableError", "check_column_types", "csv_header", "duplicate_names", "read_table", "global_schema"]


class TableError(ValueError):
    """A site table cannot be read or does not fit the request (message names the file)."""


def csv_header(p: Path, sep: str = ",") -> list[str]:
    """The raw column names of a CSV file's first line (before pandas renames duplicates)."""
    opener = gzip.open if p.name.lower().endswith(".gz") else open
    with opener(p, "rt", newline="", encoding="utf-8", errors="replace") as fh:
        return next(csv.reader(fh, delimiter=sep), [])


def _raw_columns(p: Path, kind: str, sep: str) -> list[str]:
    if kind == "parquet":
        import pyarrow.parquet as pq

        return [str(c) for c in pq.read_schema(p).names if not str(c).startswith("__index_level_")]
    return csv_header(p, sep)


def duplicate_names(names: Sequence[str]) -> list[str]:
    """The names that occur more than once, sorted."""
    seen: dict[str, int] = {}
    for n in names:
        seen[n] = seen.get(n, 0) + 1
    return sorted(n for n, k in seen.items() if k > 1)


def check_column_types(frame: pd.DataFrame, source: str) -> None:
    """Refuse a column that mixes numbers and text (it would be one-hot encoded silently).

    ``na_values``: extra strings read as missing. In a CSV they are parsed as missing
    (so a numeric column with ``?`` stays numeric); in Parquet, string cells equal to one
    of them become missing and a column that is then all numbers becomes numeric.
    Nullable integer columns (``Int64``) become float64 with NaN for missing cells.

    Raises:
        TableError: naming ``source``, the column and one offending text value.
    """
    for col in frame.columns:
        values = frame[col]
        if values.dtype != object and not pd.api.types.is_string_dtype(values.dtype):
            continue
        present = values.dropna()
        if present.empty:
            continue
        as_number = pd.to_numeric(present.astype(str).str.strip(), errors="coerce")
        numeric = as_number.notna()
        if numeric.any() and not numeric.all():
            bad = present[~numeric]
            row = bad.index[0]
            raise TableError(f"{source}: column {col!r} mixes numbers and text (e.g. {str(bad.iloc[0])[:40]!r} in "
                             f"row {int(row) + 1}); mark missing values with --na-value or fix the column")


def read_table(path: str | Path, na_values: Sequence[str] | None = None, *, check_types: bool = True) -> pd.DataFrame:
    """Read a CSV (``.csv``, ``.csv.gz``, ``.tsv``) or Parquet (``.parquet``, ``.pq``) file.

    Args:
        na_values: extra strings read as missing (CSV), e.g. ``["?"]``.
        check_types: refuse columns that mix numbers and text (:func:`check_column_types`).

    Raises:
        TableError: the file is missing, unreadable, of an unknown format, has no rows,
            repeats a column name (checked on the raw header, before pandas renames
            ``a``/``a`` to ``a``/``a.1``) or mixes numbers and text in a column.
    """
    p = Path(path)
    if not p.is_file():
        raise TableError(f"{p}: no such file")
    name = p.name.lower()
    if name.endswith((".parquet", ".pq")):
        kind, sep = "parquet", ","
    elif name.endswith((".csv", ".csv.gz", ".txt")):
        kind, sep = "csv", ","
    elif name.endswith((".tsv", ".tsv.gz")):
        kind, sep = "csv", "\t"
    else:
        raise TableError(f"{p}: unknown table format (expected .csv, .csv.gz, .tsv or .parquet)")
    try:
        dups = duplicate_names(_raw_columns(p, kind, sep))
        if dups:
            raise TableError(f"{p}: duplicate column names {dups[:5]}")
        if kind == "parquet":
            frame = pd.read_parquet(p)
        else:
            frame = pd.read_csv(p, sep=sep, na_values=list(na_values or []))
    except TableError:
        raise
    except Exception as exc:  # noqa: BLE001 - any reader failure becomes one clear error
        raise TableError(f"{p}: cannot read the table ({type(exc).__name__}: {exc})") from None
    if len(frame) == 0:
        raise TableError(f"{p}: the table has no rows")
    frame.columns = [str(c) for c in frame.columns]
    if na_values and kind == "parquet":
        frame = _parquet_na(frame, list(na_values))
    for c, t in zip(frame.columns, frame.dtypes):
        if pd.api.types.is_extension_array_dtype(t) and pd.api.types.is_numeric_dtype(t):
            frame[c] = frame[c].astype("float64")  # pandas' nullable Int64/Float64 -> NaN for missing
    if check_types:
        check_column_types(frame, str(p))
    return frame


def global_schema(columns: Sequence[Sequence[str]]) -> list[str]:
    """The ordered union of the sites' column names (first appearance wins)."""
    seen: dict[str, None] = {}
    for cols in columns:
        for c in cols:
            seen.setdefault(str(c), None)
    return list(seen)


def _parquet_na(frame: pd.DataFrame, na_values: list[str]) -> pd.DataFrame:
    """Text cells equal to one of ``na_values`` become missing; a column then all numbers becomes numeric."""
    for c in frame.columns:
        if frame[c].dtype == object or pd.api.types.is_string_dtype(frame[c]):
            col = frame[c].mask(frame[c].isin(na_values))
            numeric = pd.to_numeric(col, errors="coerce")
            frame[c] = numeric if numeric.notna().sum() == col.notna().sum() else col
    return frame
