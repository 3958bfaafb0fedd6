"""Reading site tables and aligning schemas by column name.

A CSV's field separator and decimal mark are sniffed from its first lines unless given
(:func:`sniff_csv`): ``;`` with decimal commas (``1,5``) reads as numbers. Every numeric
cell must be finite and at most :data:`MAX_ABS` in size (:func:`check_finite`): a value
whose square overflows would turn pooled sums into ``inf`` far from where it was.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

__all__ = ["MAX_ABS", "NA_HINT", "TableError", "check_column_types", "check_finite", "csv_header", "duplicate_names",
           "csv_sample", "map_labels", "read_table", "global_schema", "sniff_csv"]

#: the largest magnitude a numeric cell may hold (its square and sums of many still fit a float64)
MAX_ABS = 1e100
#: how a message tells where extra missing-value strings are set (a command maps it to its flag)
NA_HINT = "na_values = [...] in the job"
_SEPARATORS = (",", ";", "\t", "|")
_DECIMAL_COMMA = re.compile(r"^[-+]?\d*,\d+(?:[eE][-+]?\d+)?$")


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
                             f"row {int(row) + 1}); mark missing values with {NA_HINT} or fix the column")


#: cells per block of :func:`check_finite` (its largest temporary array: 32 MB of float64)
CHECK_BLOCK_CELLS = 4_000_000


def check_finite(frame: pd.DataFrame, source: str) -> None:
    """Refuse a numeric cell that is infinite or larger in size than :data:`MAX_ABS`.

    Raises:
        TableError: naming ``source``, the column, the first such row (1 = the first data
            row) and how many cells of the column are affected; never the value.
    """
    numeric = [col for col, dtype in frame.dtypes.items()
               if pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype)]
    # the numeric columns in blocks of about 4 million cells: one pass per block, not one pandas call per
    # column (a wide table), and never the whole table copied at once (a long one)
    step = max(1, CHECK_BLOCK_CELLS // max(len(frame), 1))
    for start in range(0, len(numeric), step):
        names = numeric[start:start + step]
        x = frame[names].to_numpy(dtype=np.float64, na_value=np.nan)
        with np.errstate(invalid="ignore", over="ignore"):
            bad = np.isinf(x) | (np.abs(np.nan_to_num(x)) > MAX_ABS)
        if bad.any():
            j = int(np.flatnonzero(bad.any(axis=0))[0])
            rows = np.flatnonzero(bad[:, j])
            # the name unquoted: a site that cannot read its table has no column vocabulary for the release gate
            raise TableError(f"{source}: column {names[j]} holds a value that is infinite or beyond ±10^100 in row "
                             f"{int(rows[0]) + 1} ({len(rows)} such cell(s)); fix the cell or blank it (missing)")


def map_labels(frame: pd.DataFrame, target: str, mapping: dict) -> pd.DataFrame:
    """``frame`` with each label of ``target`` that ``mapping`` names (by its text, ``1`` and
    ``1.0`` alike) replaced by the mapped label; other labels and missing ones are kept."""
    if target not in frame.columns or not mapping:
        return frame

    def key(v: object) -> str:
        if isinstance(v, (float, np.floating)) and float(v).is_integer():
            return str(int(v))
        return str(v)

    keys = {str(k): v for k, v in mapping.items()}
    column = frame[target]
    mapped = column.map(lambda v: v if pd.isna(v) or key(v) not in keys else keys[key(v)])
    out = frame.copy()
    try:  # every label a number (0/1 after { yes = 1, no = 0 }): a numeric column as at the other sites
        out[target] = pd.to_numeric(mapped)
    except (TypeError, ValueError):
        out[target] = mapped
    return out


def csv_sample(p: Path, size: int = 65536) -> str:
    """The first ``size`` characters of a CSV file (gzip read through), for :func:`sniff_csv`."""
    opener = gzip.open if p.name.lower().endswith(".gz") else open
    with opener(p, "rt", newline="", encoding="utf-8", errors="replace") as fh:
        return fh.read(size)


def sniff_csv(text: str, default_sep: str = ",", sep: str | None = None) -> tuple[str, str]:
    """``(separator, decimal mark)`` of CSV text (its first lines).

    The separator (unless ``sep`` is given) is the one of ``,`` ``;`` tab ``|`` that splits
    the first lines into the same number (> 1) of fields, the most fields winning
    (``default_sep`` when none does); the decimal mark is ``,`` when the separator is not a
    comma and a field after the header reads like ``1,5``, else ``.``.
    """
    lines = [ln for ln in text.splitlines()[:21] if ln.strip()]
    if len(lines) > 1 and not text.endswith("\n"):
        lines = lines[:-1]  # the sample may cut the last line
    if sep is None:
        sep, widths = default_sep, 1
        for candidate in _SEPARATORS:
            counts = {len(r) for r in csv.reader(io.StringIO("\n".join(lines)), delimiter=candidate)}
            if len(counts) == 1 and (n := counts.pop()) > widths:
                sep, widths = candidate, n
    fields = (f.strip() for r in csv.reader(io.StringIO("\n".join(lines[1:])), delimiter=sep) for f in r)
    decimal = "," if sep != "," and any(_DECIMAL_COMMA.match(f) for f in fields) else "."
    return sep, decimal


def read_table(path: str | Path, na_values: Sequence[str] | None = None, *, check_types: bool = True,
               sep: str | None = None, decimal: str | None = None) -> pd.DataFrame:
    """Read a CSV (``.csv``, ``.csv.gz``, ``.txt``, ``.tsv``) or Parquet (``.parquet``, ``.pq``) file.

    Args:
        na_values: extra strings read as missing (CSV), e.g. ``["?"]``.
        check_types: refuse columns that mix numbers and text (:func:`check_column_types`).
        sep, decimal: the CSV's field separator and decimal mark (``None``: sniffed,
            :func:`sniff_csv`; a ``.tsv`` is tab-separated).

    Raises:
        TableError: the file is missing, unreadable, of an unknown format, has no rows,
            repeats a column name (checked on the raw header, before pandas renames
            ``a``/``a`` to ``a``/``a.1``), mixes numbers and text in a column, or holds an
            infinite or huge number (:func:`check_finite`).
    """
    p = Path(path)
    given_sep = sep
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
        if kind == "csv" and (given_sep is None or decimal is None):
            sep, sniffed = sniff_csv(csv_sample(p), sep, given_sep or (sep if sep == "\t" else None))
            decimal = decimal or sniffed
        elif kind == "csv":
            sep = given_sep
        dups = duplicate_names(_raw_columns(p, kind, sep))
        if dups:
            raise TableError(f"{p}: duplicate column names {dups[:5]}")
        if kind == "parquet":
            frame = pd.read_parquet(p)
        else:
            frame = pd.read_csv(p, sep=sep, decimal=decimal or ".", na_values=list(na_values or []))
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
    check_finite(frame, str(p))
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
