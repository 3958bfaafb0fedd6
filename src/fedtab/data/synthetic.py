"""Synthetic tables and row partitions for demos, tests and benchmarks."""

from __future__ import annotations

import inspect
from dataclasses import KW_ONLY, dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

__all__ = ["ClassificationSpec", "classification_table", "split_rows"]


@dataclass(frozen=True)
class ClassificationSpec:
    """The recipe of a synthetic classification table (:func:`classification_table`).

    The fields are :func:`sklearn.datasets.make_classification`'s (``seed`` is its
    ``random_state``); ``target`` names the label column. With ``shuffle=False`` the signal
    (informative, redundant, repeated) columns are the first
    ``n_informative + n_redundant + n_repeated``.
    """

    n_samples: int = 3000
    n_features: int = 100
    n_informative: int = 12
    n_redundant: int = 8
    n_repeated: int = 0
    _: KW_ONLY
    n_classes: int = 2
    class_sep: float = 1.0
    flip_y: float = 0.01
    shuffle: bool = False
    seed: int = 0
    target: str = "target"

    def table(self) -> pd.DataFrame:
        """The table: ``n_samples`` rows, columns ``f00…`` (zero-padded to ``n_features - 1``'s
        width) and ``target`` (labels ``0…n_classes-1``).

        Raises:
            ValueError: as ``make_classification`` (e.g. more signal columns than features).
        """
        from sklearn.datasets import make_classification  # lazy: keeps `import fedtab` cheap

        X, y = make_classification(
            n_samples=self.n_samples,
            n_features=self.n_features,
            n_informative=self.n_informative,
            n_redundant=self.n_redundant,
            n_repeated=self.n_repeated,
            n_classes=self.n_classes,
            class_sep=self.class_sep,
            flip_y=self.flip_y,
            shuffle=self.shuffle,
            random_state=self.seed,
        )
        width = len(str(self.n_features - 1))
        frame = pd.DataFrame(X, columns=[f"f{i:0{width}d}" for i in range(self.n_features)])
        frame[self.target] = y
        return frame


def classification_table(*args: Any, **kwargs: Any) -> pd.DataFrame:
    """``make_classification`` as a DataFrame with columns ``f00…`` and ``target``:
    ``ClassificationSpec(*args, **kwargs).table()`` (the arguments, positional and keyword, are
    :class:`ClassificationSpec`'s fields, whose signature this function shows).

    With ``shuffle=False`` the signal (informative, redundant, repeated) columns are
    the first ``n_informative + n_redundant + n_repeated``.

    Raises:
        TypeError: an argument that is not a field of :class:`ClassificationSpec`.
    """
    return ClassificationSpec(*args, **kwargs).table()


classification_table.__signature__ = inspect.signature(ClassificationSpec).replace(  # type: ignore[attr-defined]
    return_annotation=pd.DataFrame)


def split_rows(
    table: pd.DataFrame,
    fractions: Sequence[float],
    *,
    stratify: str | None = None,
    seed: int = 0,
) -> list[pd.DataFrame]:
    """Split rows into ``len(fractions)`` parts of those shares (stratified by a column if given).

    Raises:
        ValueError: fractions not positive or not summing to 1.
    """
    fr = np.asarray(fractions, dtype=np.float64)
    if fr.size == 0 or (fr <= 0).any() or not np.isclose(fr.sum(), 1.0):
        raise ValueError(f"fractions must be positive and sum to 1, got {list(fractions)}")
    rng = np.random.default_rng(seed)
    groups = [np.arange(len(table))] if stratify is None else [
        np.flatnonzero(table[stratify].to_numpy() == v) for v in pd.unique(table[stratify])
    ]
    parts: list[list[np.ndarray]] = [[] for _ in fr]
    for g in groups:
        g = rng.permutation(g)
        cuts = np.round(np.cumsum(fr)[:-1] * len(g)).astype(int)
        for i, chunk in enumerate(np.split(g, cuts)):
            parts[i].append(chunk)
    return [table.iloc[np.sort(np.concatenate(p))].reset_index(drop=True) for p in parts]
