"""Example consortium: UCI Heart (Cleveland) split into three site files with different columns.

Used by the job's tests, the docs' code blocks and ``benchmarks/job.py``. The rows are the
real Cleveland rows (read from ``FEDTAB_DATASETS``, never copied into the repository),
split 40/30/30 with a fixed seed into ``cleveland.csv``, ``hungarian.parquet`` and
``va.csv``; each site lacks some columns (as the real Hungarian and VA cohorts lack
``ca``/``thal``/``slope``), missing cells are written as ``?`` in the CSVs, integer
columns are written as integers, and ``va.csv`` has rows whose label is missing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .election_datasets import load_heart

__all__ = ["HEART_SITES", "write_heart_sites"]

#: site file -> columns the site does not have
HEART_SITES: dict[str, list[str]] = {
    "cleveland.csv": [],
    "hungarian.parquet": ["ca", "thal"],
    "va.csv": ["slope", "chol"],
}

_INTEGER = ["age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "slope", "ca", "thal",
            "disease"]


def write_heart_sites(directory: str | Path, *, rows: int | None = None, unlabelled: int = 3, seed: int = 0,
                      root: str | Path | None = None) -> list[Path]:
    """Write the three site files into ``directory`` and return their paths.

    Args:
        rows: use only the first ``rows`` rows after shuffling (``None`` = all 303).
        unlabelled: rows of ``va.csv`` whose ``disease`` is blanked to ``?``.

    Raises:
        DatasetError: the shared dataset is missing or altered.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    frame = load_heart(root).table
    frame = frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    if rows is not None:
        frame = frame.iloc[:rows].reset_index(drop=True)
    for c in _INTEGER:
        frame[c] = frame[c].round().astype("Int64")
    cuts = np.cumsum([int(len(frame) * 0.4), int(len(frame) * 0.3)])
    paths = []
    for (name, dropped), part in zip(HEART_SITES.items(), np.split(np.arange(len(frame)), cuts)):
        table = frame.iloc[part].drop(columns=dropped).reset_index(drop=True)
        path = out / name
        if name.endswith(".parquet"):
            table.to_parquet(path, index=False)
        else:
            if name == "va.csv" and unlabelled:
                table["disease"] = table["disease"].astype("Int64")
                table.loc[table.index[:unlabelled], "disease"] = pd.NA
            table.to_csv(path, index=False, na_rep="?")
        paths.append(path)
    return paths
