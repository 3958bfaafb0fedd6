"""Which cells a site *measured*: the evidence its ballots may use (issue 22, item 2).

After imputation (:mod:`fedtab.federation.workflows.imputation`) a site's table has a value in every
cell, including the columns it never measures and the cells it was missing: those values
were derived from the other columns, so they are no evidence for a column. The imputation's
table step records, before it fills the table, which cells held a measured value
(:func:`record_measured`, ``site.state[MEASURED_KEY]``); a ballot then ranks only the
columns the site measures, with its imputed cells treated as missing again
(:func:`measured_frame`). A site without that record (no imputation) measured exactly its
non-missing cells of the columns it holds.

Site-side helpers over the site's own table: no exchange here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from fedtab.federation.site.core import Site

__all__ = ["MEASURED_KEY", "record_measured", "measured_matrix", "measured_frame", "measured_columns"]

#: ``Site.state`` key: ``{"columns": [...], "mask": (n_rows, F) bool}`` — True where the
#: table held a measured value before imputation filled it (rows in table order).
MEASURED_KEY = "measured_cells"


def record_measured(site: "Site", before: "pd.DataFrame", columns: Sequence[str]) -> None:
    """Record which cells of ``columns`` ``before`` (the table about to be imputed) measured.

    A column absent from ``before`` was never measured at this site. Called by the
    imputation's table step, so a replay after a restart records the same mask again. A
    second imputation keeps the first record (its values are no more measured than before).
    """
    if MEASURED_KEY in site.state:
        return
    names = list(map(str, columns))
    mask = _notna(before, names, np.arange(len(before)))
    site.state[MEASURED_KEY] = {"columns": names, "mask": mask}


def _notna(frame: "pd.DataFrame", columns: Sequence[str], rows: np.ndarray) -> np.ndarray:
    """``(len(rows), len(columns))`` bool: True where ``frame`` holds a value at positional ``rows``
    (a column absent from ``frame``, or ``None``: all False). One pandas call for all the columns
    (a ballot names thousands), not one per column."""
    out = np.zeros((len(rows), len(columns)), dtype=bool)
    pos = {c: j for j, c in enumerate(frame.columns.astype(str).tolist())}
    where = np.array([pos.get(c, -1) if c is not None else -1 for c in columns], dtype=np.int64)
    at = np.flatnonzero(where >= 0)
    if at.size:
        block = frame.iloc[:, where[at]]
        out[:, at] = (block if len(rows) == len(frame) else block.iloc[rows]).notna().to_numpy()
    return out


def measured_matrix(site: "Site", columns: Sequence[str], part: str) -> np.ndarray:
    """``(rows of part, len(columns))`` bool: True where ``site`` measured the cell.

    Raises:
        ValueError: ``part`` is not one of the site's parts.
    """
    from fedtab.federation.site.parts import canonical_part

    idx = np.arange(len(site.table)) if canonical_part(part) == "all" else site.parts.indices(part)
    record = site.state.get(MEASURED_KEY)
    columns = [str(c) for c in columns]
    held = site.feature_set
    if not isinstance(record, dict):
        return _notna(site.table, [c if c in held else None for c in columns], idx)
    pos = {c: j for j, c in enumerate(record["columns"])}
    mask = np.asarray(record["mask"], dtype=bool)
    # a column the imputation did not touch: its cells as they are
    out = _notna(site.table, [c if c not in pos and c in held else None for c in columns], idx)
    at = [j for j, c in enumerate(columns) if c in pos]
    if at:
        out[:, at] = mask[np.ix_(idx, [pos[columns[j]] for j in at])]
    return out


def measured_columns(site: "Site", part: str = "train", columns: Sequence[str] | None = None) -> list[str]:
    """The columns of ``columns`` (default: the site's feature columns) with at least one
    measured cell in ``part``, in that order."""
    cols = list(site.feature_names if columns is None else columns)
    if not cols:
        return []
    seen = measured_matrix(site, cols, part).any(axis=0)
    return [c for c, s in zip(cols, seen) if s]


def measured_frame(site: "Site", frame: "pd.DataFrame", part: str) -> "pd.DataFrame":
    """``frame`` (rows of ``part``) with only the columns the site measures there, and its
    imputed cells set back to missing (NaN): what a ballot may rank."""
    mask = measured_matrix(site, frame.columns.astype(str).tolist(), part)
    keep = mask.any(axis=0)
    out = frame if keep.all() else frame.iloc[:, np.flatnonzero(keep)]
    mask = mask[:, keep]
    if mask.all():
        return out
    return out.where(mask)
