"""Loaders for the Feature Election benchmark datasets (``../shared/datasets/election``).

Each loader returns ``(table, target, categorical)``: a DataFrame whose label column is
``target`` (integer class labels), and the names of the categorical (string) columns
that must be one-hot encoded — federatedly, see
:mod:`fedtab.federation.steps.encoding` — before training. Missing cells (``?`` in
the UCI files) are NaN. Every loader checks the file's shape and columns and raises
:class:`DatasetError` with the path and the problem if the file is missing or altered.

The data directory defaults to ``$FEDTAB_DATASETS/election`` (``$FEDTAB_DATA`` is an
alias), ``<project>/../shared/datasets/election``, or the first of
``../shared/datasets/election`` found upward from the working directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

__all__ = ["DatasetError", "Dataset", "data_dir", "load_mushroom", "load_adult", "load_heart",
           "load_breast_cancer", "load_mat", "load_dataset", "DATASETS", "MAT_SHAPES"]


class DatasetError(ValueError):
    """A benchmark dataset is missing or not what the loader expects (message names the file)."""


class Dataset(NamedTuple):
    """``table`` with label column ``target`` (0..C-1) and the ``categorical`` column names."""

    name: str
    table: pd.DataFrame
    target: str
    categorical: list[str]


#: expected ``(rows, features)`` and label values of the ``.mat`` files.
MAT_SHAPES: dict[str, tuple[tuple[int, int], tuple[int, ...]]] = {
    "ALLAML": ((72, 7129), (1, 2)),
    "Prostate_GE": ((102, 5966), (1, 2)),
    "leukemia": ((72, 7070), (-1, 1)),
    "arcene": ((200, 10000), (-1, 1)),
    "colon": ((62, 2000), (-1, 1)),
}


def data_dir(path: str | Path | None = None) -> Path:
    """The election dataset directory (see module docstring).

    Raises:
        DatasetError: no such directory.
    """
    if path is not None:
        p = Path(path)
    elif os.environ.get("FEDTAB_DATASETS") or os.environ.get("FEDTAB_DATA"):
        p = Path(os.environ.get("FEDTAB_DATASETS") or os.environ["FEDTAB_DATA"]) / "election"
    else:
        here = Path.cwd().resolve()
        project = Path(__file__).resolve().parents[3]
        candidates = [project.parent / "shared" / "datasets" / "election"]
        candidates += [d / "shared" / "datasets" / "election" for d in [here, *here.parents]]
        candidates += [d / ".." / "shared" / "datasets" / "election" for d in [here, *here.parents]]
        p = next((c for c in candidates if c.is_dir()), candidates[0])
    if not p.is_dir():
        raise DatasetError(f"{p}: election dataset directory not found (set FEDTAB_DATASETS to the datasets folder or pass data_dir)")
    return p


def _file(name: str, root: str | Path | None) -> Path:
    p = data_dir(root) / name
    if not p.is_file():
        raise DatasetError(f"{p}: missing dataset file")
    return p


def _check(frame: pd.DataFrame, path: Path, shape: tuple[int, int], columns: list[str] | None = None) -> None:
    if frame.shape != shape:
        raise DatasetError(f"{path}: expected shape {shape}, found {frame.shape} (file altered?)")
    if columns is not None and list(frame.columns) != columns:
        raise DatasetError(f"{path}: unexpected columns {list(frame.columns)[:5]}…, expected {columns[:5]}…")


MUSHROOM_COLUMNS = ["Poisonous/Edible", "Cap-shape", "Cap-surface", "Cap-color", "Bruises?", "Odor",
                    "Gill-attachment", "Gill-spacing", "Gill-size", "Gill-color", "Stalk-shape", "Stalk-root",
                    "Stalk-surface-above-ring", "Stalk-surface-below-ring", "Stalk-color-above-ring",
                    "Stalk-color-below-ring", "Veil-type", "Veil-color", "Ring-number", "Ring-type",
                    "Spore-print-color", "Population", "Habitat"]
ADULT_COLUMNS = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
                 "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country", "Y"]
ADULT_CATEGORICAL = ["workclass", "education", "marital-status", "occupation", "relationship", "race", "sex",
                     "native-country"]
HEART_COLUMNS = ["age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak", "slope",
                 "ca", "thal", "num"]


def load_mushroom(root: str | Path | None = None) -> Dataset:
    """UCI Mushroom: 8,124 rows, 22 categorical features; target ``poisonous`` (1 = p, 0 = e).

    ``?`` (stalk-root) is NaN; one-hot encoding gives a missing cell all-zero indicators.
    """
    path = _file("mushroom.csv.gz", root)
    frame = pd.read_csv(path, dtype=str, na_values=["?"], keep_default_na=False)
    _check(frame, path, (8124, 23), MUSHROOM_COLUMNS)
    labels = frame.pop("Poisonous/Edible")
    if set(labels) != {"e", "p"}:
        raise DatasetError(f"{path}: class column must hold e/p, found {sorted(set(labels))[:5]}")
    frame["poisonous"] = (labels == "p").astype(np.int64)
    return Dataset("mushroom", frame, "poisonous", [c for c in frame.columns if c != "poisonous"])


def load_adult(root: str | Path | None = None, *, include_test: bool = True) -> Dataset:
    """UCI Adult (``adult.data`` + ``adult.test`` unless ``include_test=False``): 6 numeric and
    8 categorical features; target ``income`` (1 = >50K; the test file's trailing ``.`` is stripped)."""
    frames = []
    for name, rows in [("adult.data.gz", 32561)] + ([("adult.test.gz", 16281)] if include_test else []):
        path = _file(name, root)
        f = pd.read_csv(path, sep=r",\s*", engine="python", na_values=["?"], keep_default_na=False)
        f.columns = [c.strip() for c in f.columns]
        _check(f, path, (rows, 15), ADULT_COLUMNS)
        y = f.pop("Y").astype(str).str.strip().str.rstrip(".")
        if not set(y) <= {"<=50K", ">50K"}:
            raise DatasetError(f"{path}: labels must be <=50K / >50K, found {sorted(set(y))[:5]}")
        f["income"] = (y == ">50K").astype(np.int64)
        frames.append(f)
    frame = pd.concat(frames, ignore_index=True)
    for c in ADULT_COLUMNS[:-1]:
        if c not in ADULT_CATEGORICAL:
            frame[c] = pd.to_numeric(frame[c], errors="raise").astype(np.float64)
    return Dataset("adult", frame, "income", list(ADULT_CATEGORICAL))


def load_heart(root: str | Path | None = None) -> Dataset:
    """UCI Heart Disease (Cleveland): 303 rows, 13 numeric features (``?`` → NaN in 6 rows);
    target ``disease`` = ``num > 0``."""
    path = _file("heart_cleveland.csv.gz", root)
    frame = pd.read_csv(path, na_values=["?"])
    if frame.shape != (303, 14):
        raise DatasetError(f"{path}: expected shape (303, 14), found {frame.shape} (file altered?)")
    frame.columns = HEART_COLUMNS
    frame = frame.apply(pd.to_numeric, errors="raise").astype(np.float64)
    num = frame.pop("num")
    if num.isna().any() or not set(num.astype(int)) <= set(range(5)):
        raise DatasetError(f"{path}: target 'num' must be 0..4")
    frame["disease"] = (num > 0).astype(np.int64)
    return Dataset("heart", frame, "disease", [])


def load_breast_cancer() -> Dataset:
    """scikit-learn's Breast Cancer Wisconsin copy: 569 × 30 numeric; target ``malignant`` (1 = malignant)."""
    from sklearn.datasets import load_breast_cancer as _load

    bunch = _load(as_frame=True)
    frame = bunch.data.copy()
    if frame.shape != (569, 30):
        raise DatasetError(f"scikit-learn breast cancer: expected (569, 30), found {frame.shape}")
    frame["malignant"] = (bunch.target == 0).astype(np.int64)  # sklearn: 0 = malignant
    return Dataset("breast_cancer", frame, "malignant", [])


def load_mat(name: str, root: str | Path | None = None) -> Dataset:
    """A scikit-feature ``.mat`` file (``X``, ``Y``) as a table with columns ``g00000…`` and ``label``
    (0/1: the lower of the two label values is 0).

    Raises:
        DatasetError: unknown name, missing file, or ``X``/``Y`` of unexpected shape or labels.
    """
    from scipy.io import loadmat

    if name not in MAT_SHAPES:
        raise DatasetError(f"unknown .mat dataset {name!r}; known: {sorted(MAT_SHAPES)}")
    path = _file(f"{name}.mat", root)
    try:
        mat = loadmat(path)
        X, Y = np.asarray(mat["X"], dtype=np.float64), np.asarray(mat["Y"]).ravel()
    except Exception as exc:  # noqa: BLE001 - one clear error for any reader problem
        raise DatasetError(f"{path}: cannot read X/Y ({type(exc).__name__}: {exc})") from None
    shape, labels = MAT_SHAPES[name]
    if X.shape != shape or Y.shape != (shape[0],):
        raise DatasetError(f"{path}: expected X {shape} and Y ({shape[0]},), found {X.shape} and {Y.shape}")
    if tuple(sorted(set(Y.tolist()))) != labels:
        raise DatasetError(f"{path}: expected labels {labels}, found {sorted(set(Y.tolist()))}")
    width = len(str(shape[1] - 1))
    frame = pd.DataFrame(X, columns=[f"g{i:0{width}d}" for i in range(shape[1])])
    frame["label"] = (Y == labels[1]).astype(np.int64)
    return Dataset(name, frame, "label", [])


def load_dataset(name: str, root: str | Path | None = None) -> Dataset:
    """Any dataset by name: ``mushroom``, ``adult``, ``heart``, ``breast_cancer`` or a ``.mat`` name."""
    if name in DATASETS:
        return DATASETS[name](root)
    if name in MAT_SHAPES:
        return load_mat(name, root)
    raise DatasetError(f"unknown dataset {name!r}; known: {sorted(DATASETS) + sorted(MAT_SHAPES)}")


DATASETS = {
    "mushroom": load_mushroom,
    "adult": load_adult,
    "heart": load_heart,
    "breast_cancer": lambda root=None: load_breast_cancer(),
}
