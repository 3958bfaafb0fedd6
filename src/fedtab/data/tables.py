"""Reading site tables and aligning schemas by column name."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

__all__ = ["TableError", "read_table", "global_schema"]


class TableError(ValueError):
    """A site table cannot be read or does not fit the request (message names the file)."""


def read_table(path: str | Path) -> pd.DataFrame:
    """Read a CSV (``.csv``, ``.csv.gz``, ``.tsv``) or Parquet (``.parquet``, ``.pq``) file.

    Raises:
        TableError: the file is missing, unreadable, of an unknown format, or has no rows.
    """
    p = Path(path)
    if not p.is_file():
        raise TableError(f"{p}: no such file")
    name = p.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            frame = pd.read_parquet(p)
        elif name.endswith((".csv", ".csv.gz", ".txt")):
            frame = pd.read_csv(p)
        elif name.endswith((".tsv", ".tsv.gz")):
            frame = pd.read_csv(p, sep="\t")
        else:
            raise TableError(f"{p}: unknown table format (expected .csv, .csv.gz, .tsv or .parquet)")
    except TableError:
        raise
    except Exception as exc:  # noqa: BLE001 - any reader failure becomes one clear error
        raise TableError(f"{p}: cannot read the table ({type(exc).__name__}: {exc})") from None
    if len(frame) == 0:
        raise TableError(f"{p}: the table has no rows")
    frame.columns = [str(c) for c in frame.columns]
    return frame


def global_schema(columns: Sequence[Sequence[str]]) -> list[str]:
    """The ordered union of the sites' column names (first appearance wins)."""
    seen: dict[str, None] = {}
    for cols in columns:
        for c in cols:
            seen.setdefault(str(c), None)
    return list(seen)
