"""Loaders for the FedHF-Impute benchmark datasets and the heterogeneous-schema split.

Files live in ``../shared/datasets/impute`` relative to the project root (override with
the ``root`` argument or ``FEDTAB_DATASETS``). Every loader checks the file's shape and
columns and raises :class:`DatasetError` with a clear message if the file is missing
or altered. Each returns a float64 DataFrame of features, NaN = missing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "DatasetError", "default_root", "load_airquality", "load_physionet2012", "load_secom", "load_impute_dataset",
    "SchemaSplit", "heterogeneous_split", "IMPUTE_DATASETS",
]

AIRQUALITY_SENSORS = ["CO(GT)", "PT08.S1(CO)", "NMHC(GT)", "C6H6(GT)", "PT08.S2(NMHC)", "NOx(GT)", "PT08.S3(NOx)",
                      "NO2(GT)", "PT08.S4(NO2)", "PT08.S5(O3)", "T", "RH", "AH"]
PHYSIONET_PARAMETERS = 42  # incl. RecordID


class DatasetError(RuntimeError):
    """A dataset file is missing, unreadable or not what the loader expects."""


def default_root() -> Path:
    """``$FEDTAB_DATASETS`` or ``<project>/../shared/datasets``."""
    env = os.environ.get("FEDTAB_DATASETS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3].parent / "shared" / "datasets"


def _file(root: Path | str | None, name: str) -> Path:
    path = Path(root or default_root()) / "impute" / name
    if not path.is_file():
        raise DatasetError(f"dataset file {path} is missing (see ../shared/datasets/README.md)")
    return path


def _expect(cond: bool, path: Path, what: str) -> None:
    if not cond:
        raise DatasetError(f"{path.name} looks altered: {what}")


def load_airquality(root: Path | str | None = None) -> pd.DataFrame:
    """UCI Air Quality: 9,357 hourly rows x 13 sensors; −200 → NaN; Date/Time dropped."""
    path = _file(root, "AirQualityUCI.csv.gz")
    try:
        raw = pd.read_csv(path, sep=";", decimal=",")
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(f"cannot read {path}: {exc}") from None
    missing = [c for c in ["Date", "Time", *AIRQUALITY_SENSORS] if c not in raw.columns]
    _expect(not missing, path, f"columns {missing} are missing")
    raw = raw.dropna(subset=["Date"])
    _expect(len(raw) == 9357, path, f"{len(raw)} data rows, expected 9357")
    x = raw[AIRQUALITY_SENSORS].apply(pd.to_numeric, errors="coerce").astype(np.float64)
    return x.mask(x == -200).reset_index(drop=True)


def load_physionet2012(root: Path | str | None = None) -> pd.DataFrame:
    """PhysioNet 2012 set A: one row per stay (4,000) = last value of each parameter.

    ``RecordID`` is dropped, −1 → NaN, and parameters with fewer than two distinct
    observed values (``MechVent`` is always 1) are dropped as constant: 40 features remain.
    """
    path = _file(root, "physionet2012_set_a.csv.gz")
    try:
        raw = pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(f"cannot read {path}: {exc}") from None
    _expect(list(raw.columns) == ["RecordID", "Time", "Parameter", "Value"], path, f"columns {list(raw.columns)}")
    _expect(len(raw) == 1_757_980, path, f"{len(raw)} rows, expected 1757980")
    raw = raw.dropna(subset=["Parameter"])
    _expect(raw["Parameter"].nunique() == PHYSIONET_PARAMETERS, path, "unexpected number of parameters")
    # The file lists each stay's measurements in time order (checked once over all
    # 1.76 M rows), so the last row per (stay, parameter) is the last value; sorting by
    # the hh:mm strings would cost more than the rest of the load.
    raw = raw[raw["Parameter"] != "RecordID"]
    last = raw.groupby(["RecordID", "Parameter"], sort=True)["Value"].last().unstack("Parameter")
    _expect(len(last) == 4000, path, f"{len(last)} stays, expected 4000")
    last = last.astype(np.float64).mask(last == -1)
    keep = [c for c in last.columns if last[c].nunique(dropna=True) >= 2]
    return last[keep].reset_index(drop=True).rename_axis(columns=None)


def load_secom(root: Path | str | None = None, max_missing: float = 0.5) -> pd.DataFrame:
    """UCI SECOM: 1,567 rows; keeps non-constant columns with at most ``max_missing`` NaN.

    ``Time`` and ``Pass/Fail`` are dropped. The number kept is ``df.shape[1]``
    (446 of 590 with the default; the published filter keeps 463).
    """
    path = _file(root, "uci-secom.csv.gz")
    try:
        raw = pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(f"cannot read {path}: {exc}") from None
    expected = ["Time", *map(str, range(590)), "Pass/Fail"]
    _expect(list(raw.columns) == expected, path, "columns are not Time, 0..589, Pass/Fail")
    _expect(len(raw) == 1567, path, f"{len(raw)} rows, expected 1567")
    x = raw[expected[1:-1]].astype(np.float64)
    keep = (x.isna().mean() <= max_missing) & (x.nunique(dropna=True) >= 2)
    return x.loc[:, keep].reset_index(drop=True)


IMPUTE_DATASETS = {"airquality": load_airquality, "physionet": load_physionet2012, "secom": load_secom}


def load_impute_dataset(name: str, root: Path | str | None = None) -> pd.DataFrame:
    """Load one of :data:`IMPUTE_DATASETS` by name; ``ValueError`` for an unknown name."""
    try:
        fn = IMPUTE_DATASETS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; choose from {sorted(IMPUTE_DATASETS)}") from None
    return fn(root)


@dataclass
class SchemaSplit:
    """Rows and columns of each simulated site.

    Attributes:
        rows: per site, the row positions (into the source table) it holds.
        columns: per site, the column names it keeps (source order).
    """

    rows: list[np.ndarray]
    columns: list[list[str]]


def heterogeneous_split(
    columns: list[str], n_rows: int, n_sites: int = 4, keep_fraction: float = 0.6, seed: int = 0
) -> SchemaSplit:
    """Equal row shares per site; each site keeps a random ``round(keep_fraction * F)``
    of the columns; every column is held by at least one site.

    Coverage is enforced by giving every column not yet held to a random site in
    place of one of that site's columns that another site also holds.

    Raises:
        ValueError: fewer rows than sites, ``n_sites * round(keep_fraction*F) < F``, or
            ``keep_fraction`` outside (0, 1].
    """
    f = len(columns)
    k = int(round(keep_fraction * f))
    if not 0 < keep_fraction <= 1 or k < 1:
        raise ValueError(f"keep_fraction={keep_fraction} keeps no column of {f}")
    if n_sites * k < f:
        raise ValueError(f"{n_sites} sites x {k} columns cannot cover {f} columns")
    if n_rows < n_sites:
        raise ValueError(f"{n_rows} rows cannot be shared by {n_sites} sites")
    rng = np.random.default_rng(seed)
    rows = [np.sort(r) for r in np.array_split(rng.permutation(n_rows), n_sites)]
    sets = [set(rng.choice(f, size=k, replace=False).tolist()) for _ in range(n_sites)]
    for c in rng.permutation(f):
        held = sum(c in s for s in sets)
        if held:
            continue
        for s in rng.permutation(n_sites):
            swappable = [d for d in sets[s] if sum(d in t for t in sets) > 1]
            if swappable:
                sets[s].remove(int(rng.choice(swappable)))
                sets[s].add(int(c))
                break
    cols = [[columns[i] for i in sorted(s)] for s in sets]
    assert set().union(*map(set, cols)) == set(columns)
    return SchemaSplit(rows=rows, columns=cols)
